/* cmd_engine.h - flag parsing shared by the commands that run a model (logits, run, perplexity,
 * bench): -m, -t, -c, --ubatch, --kv-type, -v, and number parsing with errors that name the flag.
 * Header-only (static functions) so each command stays one file; only uses hotmoe.h. */
#ifndef HM_CLI_CMD_ENGINE_H
#define HM_CLI_CMD_ENGINE_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

typedef struct cli_engine {
    const char *cmd;   /* "logits", for messages */
    const char *model; /* -m */
    int32_t n_threads; /* -t, 0 = all CPUs */
    int32_t n_ctx;     /* -c, 0 = command's default */
    int32_t n_ubatch;  /* -ub, 0 = 512 */
    hm_kv_type kv_type;
    bool verbose;
} cli_engine;

#define CLI_ENGINE_HELP                                                                        \
    "  -m, --model FILE       GGUF model (required)\n"                                           \
    "  -t, --threads N        compute threads (default: all CPUs)\n"                             \
    "  -ub, --ubatch N        tokens per forward micro-batch (default 512)\n"                    \
    "  --kv-type f16|f32      KV cache type (default f16; f32 is exact and slower)\n"            \
    "  -v, --verbose          log model loading\n"

static inline int cli_long(const char *cmd, const char *flag, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "hotmoe %s: %s expects an integer in [%ld, %ld], got '%s'\n", cmd, flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

static inline int cli_float(const char *cmd, const char *flag, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "hotmoe %s: %s expects a number in [%g, %g], got '%s'\n", cmd, flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* The value of flag argv[*i]; NULL (message printed) when it is the last argument. */
static inline const char *cli_value(const char *cmd, int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "hotmoe %s: %s needs a value\n", cmd, argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

/* Try argv[*i] as one of the shared flags: 1 consumed, 0 not ours, -1 bad value (printed). */
static inline int cli_engine_arg(cli_engine *e, int argc, char **argv, int *i) {
    const char *a = argv[*i], *v;
    long n;
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
        if (!(e->model = cli_value(e->cmd, argc, argv, i))) return -1;
    } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
        if (!(v = cli_value(e->cmd, argc, argv, i)) || cli_long(e->cmd, a, v, 1, 512, &n)) return -1;
        e->n_threads = (int32_t)n;
    } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
        if (!(v = cli_value(e->cmd, argc, argv, i)) || cli_long(e->cmd, a, v, 1, 1 << 24, &n)) return -1;
        e->n_ctx = (int32_t)n;
    } else if (!strcmp(a, "-ub") || !strcmp(a, "--ubatch")) {
        if (!(v = cli_value(e->cmd, argc, argv, i)) || cli_long(e->cmd, a, v, 1, 1 << 16, &n)) return -1;
        e->n_ubatch = (int32_t)n;
    } else if (!strcmp(a, "--kv-type") || !strcmp(a, "-ctk")) {
        if (!(v = cli_value(e->cmd, argc, argv, i))) return -1;
        if (!strcmp(v, "f16")) e->kv_type = HM_KV_F16;
        else if (!strcmp(v, "f32")) e->kv_type = HM_KV_F32;
        else {
            fprintf(stderr, "hotmoe %s: --kv-type expects f16 or f32, got '%s'\n", e->cmd, v);
            return -1;
        }
    } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
        e->verbose = true;
    } else {
        return 0;
    }
    return 1;
}

/* Open the model named by -m (error printed, NULL on failure). */
static inline hm_model *cli_open_model(const cli_engine *e) {
    if (!e->model) {
        fprintf(stderr, "hotmoe %s: no model given (-m FILE); see `hotmoe %s --help`\n", e->cmd, e->cmd);
        return NULL;
    }
    hm_model_opts mo;
    hm_model_opts_default(&mo);
    mo.verbose = e->verbose;
    hm_model *m = NULL;
    hm_err err;
    if (hm_model_open(&m, e->model, &mo, &err) != HM_OK) {
        fprintf(stderr, "hotmoe %s: %s\n", e->cmd, err.msg);
        return NULL;
    }
    return m;
}

/* Open a session of n_ctx positions (error printed, NULL on failure). */
static inline hm_session *cli_open_session(const cli_engine *e, hm_model *m, int32_t n_ctx) {
    hm_session_opts so;
    hm_session_opts_default(&so);
    so.n_ctx = n_ctx;
    so.n_threads = e->n_threads;
    so.n_ubatch = e->n_ubatch;
    so.kv_type = e->kv_type;
    hm_session *s = NULL;
    hm_err err;
    if (hm_session_open(&s, m, &so, &err) != HM_OK) {
        fprintf(stderr, "hotmoe %s: %s\n", e->cmd, err.msg);
        return NULL;
    }
    return s;
}

/* Read a whole file (NUL-terminated, malloc'd); NULL with a message on failure. */
static inline char *cli_read_file(const char *cmd, const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "hotmoe %s: cannot open %s: %s\n", cmd, path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (!buf) break;
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        char *nb = realloc(buf, 2 * cap + 1);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    bool bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        fprintf(stderr, "hotmoe %s: cannot read %s\n", cmd, path);
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

#endif
