/* cmd_logits.c - `hotmoe logits`: evaluate a token sequence as one batch and write the raw
 * little-endian float32 logits of every position (n_tokens x n_vocab), for comparing engines.
 * Needs no tokenizer. The context is the sequence's length unless -c says otherwise; a sequence
 * longer than -c is an error (nothing is written). */
#include "cmd_engine.h"

static void usage(FILE *f) {
    fprintf(f, "usage: hotmoe logits -m MODEL (--tokens ID,ID,... | --tokens-file FILE) -o OUT.f32 [options]\n\n"
               "Writes the logits of every position as raw little-endian float32, n_tokens x n_vocab.\n\n"
               "  --tokens LIST          token ids separated by commas or spaces\n"
               "  --tokens-file FILE     token ids in a file (commas, spaces or newlines)\n"
               "  -o, --output FILE      where to write the logits\n"
               "  -c, --ctx-size N       context positions (default: the number of tokens;\n"
               "                         more tokens than N is an error)\n" CLI_ENGINE_HELP);
}

/* Parse ids separated by anything that is not a digit or '-'. */
static int parse_ids(const char *s, int32_t **out, int32_t *n) {
    size_t cap = 64, k = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    while (ids && *s) {
        if ((*s >= '0' && *s <= '9') || *s == '-') {
            char *end;
            errno = 0;
            long v = strtol(s, &end, 10);
            if (errno || end == s || v < 0 || v > INT32_MAX) {
                fprintf(stderr, "hotmoe logits: bad token id near '%.20s'\n", s);
                free(ids);
                return -1;
            }
            if (k == cap) {
                int32_t *nb = realloc(ids, 2 * cap * sizeof *ids);
                if (!nb) break;
                ids = nb;
                cap *= 2;
            }
            ids[k++] = (int32_t)v;
            s = end;
        } else if (*s == ',' || *s == ' ' || *s == '\n' || *s == '\t' || *s == '\r') {
            s++;
        } else {
            fprintf(stderr, "hotmoe logits: unexpected character '%c' in the token list\n", *s);
            free(ids);
            return -1;
        }
    }
    if (!ids) return -1;
    *out = ids;
    *n = (int32_t)k;
    return 0;
}

int hm_cmd_logits(int argc, char **argv) {
    cli_engine e = {.cmd = "logits"};
    const char *tok_list = NULL, *tok_file = NULL, *out_path = NULL;
    for (int i = 1; i < argc; i++) {
        int r = cli_common_arg(&e, argc, argv, &i, usage);
        if (r == CLI_ARG_NEXT) continue;
        if (r != CLI_ARG_OWN) return r;
        const char *a = argv[i];
        if (!strcmp(a, "--tokens")) {
            if (!(tok_list = cli_value(e.cmd, argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--tokens-file")) {
            if (!(tok_file = cli_value(e.cmd, argc, argv, &i))) return 2;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (!(out_path = cli_value(e.cmd, argc, argv, &i))) return 2;
        } else {
            return cli_unknown_arg(&e, a, usage);
        }
    }
    if (cli_need_model(&e)) return 2;
    if (!tok_list == !tok_file || !out_path) {
        fprintf(stderr, "hotmoe logits: need one of --tokens / --tokens-file, and -o OUT\n");
        return 2;
    }
    char *file_text = NULL;
    if (tok_file && !(file_text = cli_read_file(e.cmd, tok_file, NULL))) return 1;
    int32_t *ids = NULL, n = 0;
    int rc = parse_ids(tok_list ? tok_list : file_text, &ids, &n);
    free(file_text);
    if (rc) return 2;
    if (n == 0) {
        fprintf(stderr, "hotmoe logits: no token ids given\n");
        free(ids);
        return 2;
    }
    if (e.n_ctx && n > e.n_ctx) {
        fprintf(stderr, "hotmoe logits: %d tokens do not fit the context of %d (-c)\n", n, e.n_ctx);
        free(ids);
        return 1;
    }

    hm_model *m = cli_open_model(&e);
    hm_session *s = m ? cli_open_session(&e, m, e.n_ctx ? e.n_ctx : n) : NULL;
    rc = 1;
    if (s) {
        const float *lg = NULL;
        hm_err err;
        if (hm_session_eval(s, ids, n, true, &lg, &err) != HM_OK) {
            fprintf(stderr, "hotmoe logits: %s\n", err.msg);
        } else {
            FILE *f = fopen(out_path, "wb");
            size_t cnt = (size_t)n * (size_t)hm_model_n_vocab(m);
            bool ok = f && fwrite(lg, sizeof(float), cnt, f) == cnt;
            if (f && fclose(f) != 0) ok = false;
            if (!ok) {
                fprintf(stderr, "hotmoe logits: cannot write %s: %s\n", out_path, strerror(errno));
            } else {
                fprintf(stderr, "hotmoe logits: wrote %d x %d float32 to %s\n", n, hm_model_n_vocab(m), out_path);
                rc = 0;
            }
        }
    }
    if (rc == 0 && cli_engine_finish(&e, m)) rc = 1;
    hm_session_close(s);
    hm_model_close(m);
    free(ids);
    return rc;
}
