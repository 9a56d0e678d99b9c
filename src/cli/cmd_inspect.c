/* cmd_inspect.c - `hotmoe inspect FILE.gguf [--json] [--budget SIZE] [-c N] [-ctk TYPE]`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *f) {
    fputs("usage: hotmoe inspect FILE.gguf [--json] [--budget SIZE] [-c N] [-ctk TYPE]\n"
          "\n"
          "Show a GGUF model without loading its weights: architecture, every hyper-parameter,\n"
          "tokenizer, tensors by type, and the MoE view: expert units (layer, expert) per layer,\n"
          "bytes of one unit, expert vs dense bytes. A vocab-only GGUF is fine.\n"
          "\n"
          "  --json         print one JSON object (arch, n_layer, n_expert, n_expert_used, n_vocab,\n"
          "                 unit_bytes, expert_bytes, dense_bytes, units_in_budget, ...)\n"
          "  --budget SIZE  how many expert units fit in SIZE bytes (e.g. 12GiB, 512MiB),\n"
          "                 counting slots of the largest unit\n"
          "  -c, --ctx-size N  the KV cache of N positions (as sessions hold it; sliding-window\n"
          "                 layers as their ring), and with --budget the units that fit beside it\n"
          "  -ctk, -ctv, --cache-type-k, --cache-type-v TYPE  that cache's type: f16 (default), f32,\n"
          "                 bf16, q8_0, q4_0 (one type for K and V)\n"
          "  -h, --help     this text\n",
          f);
}

int hm_cmd_inspect(int argc, char **argv) {
    hm_inspect_opts o = {.json = false, .budget = -1};
    const char *path = NULL;
    hm_err err = {{0}};
    hm_kv_type kv_type = HM_KV_F16;
    bool kv_set = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (hm_cli_is_help(a)) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--json") == 0) {
            o.json = true;
        } else if (strcmp(a, "--budget") == 0 || strncmp(a, "--budget=", 9) == 0) {
            const char *v = a[8] == '=' ? a + 9 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v) {
                fprintf(stderr, "inspect: --budget needs a size (e.g. 12GiB)\n");
                return 2;
            }
            if (hm_parse_size(v, &o.budget, &err) != HM_OK || o.budget < 0) {
                fprintf(stderr, "inspect: --budget: %s\n", o.budget < 0 && !err.msg[0] ? "must be a size" : err.msg);
                return 2;
            }
        } else if (strcmp(a, "-c") == 0 || strcmp(a, "--ctx-size") == 0) {
            char *end = NULL;
            const long n = i + 1 < argc ? strtol(argv[++i], &end, 10) : 0;
            if (!end || *end || n < 1 || n > (1L << 30)) {
                fprintf(stderr, "inspect: %s needs a number of positions (1 .. 2^30)\n", a);
                return 2;
            }
            o.kv_ctx = (int32_t)n;
        } else if (!strcmp(a, "-ctk") || !strcmp(a, "-ctv") || !strcmp(a, "--cache-type-k") ||
                   !strcmp(a, "--cache-type-v") || !strcmp(a, "--kv-type")) {
            hm_kv_type t;
            if (i + 1 >= argc || hm_kv_type_parse(argv[i + 1], &t, &err) != HM_OK) {
                fprintf(stderr, "inspect: %s: %s\n", a, i + 1 < argc ? err.msg : "needs a type");
                return 2;
            }
            i++;
            if (kv_set && t != kv_type) {
                fprintf(stderr, "inspect: K and V caches of different types (%s after %s): hotmoe keeps one type "
                                "for both\n", hm_kv_type_name(t), hm_kv_type_name(kv_type));
                return 2;
            }
            kv_type = t;
            kv_set = true;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "inspect: unknown option '%s' (see `hotmoe inspect --help`)\n", a);
            return 2;
        } else if (path) {
            fprintf(stderr, "inspect: one file at a time ('%s' and '%s')\n", path, a);
            return 2;
        } else {
            path = a;
        }
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    if (o.kv_ctx > 0) { /* the layout sessions use: the model's tensors bound, no weight read */
        hm_model *m = NULL;
        hm_status ms = hm_model_open(&m, path, NULL, &err);
        if (ms == HM_OK) ms = hm_model_kv_bytes(m, o.kv_ctx, 0, kv_type, &o.kv_bytes, &err);
        o.kv_type = hm_kv_type_name(kv_type);
        hm_model_close(m);
        if (ms != HM_OK) {
            fprintf(stderr, "inspect: -c: %s\n", err.msg[0] ? err.msg : hm_status_name(ms));
            return 1;
        }
    }
    hm_status st = hm_inspect(path, &o, stdout, &err);
    if (st != HM_OK) {
        fprintf(stderr, "inspect: %s\n", err.msg[0] ? err.msg : hm_status_name(st));
        return 1;
    }
    return 0;
}
