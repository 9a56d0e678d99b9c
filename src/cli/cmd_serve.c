/* cmd_serve.c - `hotmoe serve`: the OpenAI-compatible HTTP server and the web page (server/). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_pp.h"
#include "cli_dspark.h"
#include "cmd_engine.h"

static hm_server *g_server; /* for the signal handler only */

static void on_signal(int sig) {
    if (g_server) hm_server_stop(g_server);
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: hotmoe serve -m FILE [--host ADDR] [--port N] [--parallel N] [--api-key KEY] [--api-key-file F]\n"
            "                    [-c CTX] [-t T] [limits]\n"
            "\n"
            "Serve the model over HTTP: OpenAI's /v1/chat/completions, /v1/completions and /v1/models (SSE\n"
            "streaming), llama-server's /health, /props, /slots and /metrics (Prometheus), hotmoe's /experts,\n"
            "POST /experts/policy and POST /profile/save, and a web page at / (chat + experts heatmap).\n"
            "\n"
            "  -m, --model FILE       GGUF model\n"
            "      --host ADDR        address to bind (default 127.0.0.1; 0.0.0.0 = every interface)\n"
            "      --port N           TCP port (default 8080)\n"
            "  -np, --parallel N      slots: requests decoded at the same time, each with its own KV cache (1)\n"
            "      --api-key KEY      require \"Authorization: Bearer KEY\" on every endpoint but /health and the\n"
            "                         page (also read from HOTMOE_API_KEY); an empty key is an error\n"
            "      --api-key-file F   accepted keys, one per line ('#' starts a comment line); with --api-key\n"
            "                         any of them is accepted\n"
            "  -c, --ctx-size N       context positions per slot (default min(training context, 4096))\n"
            "  -t, --threads N        compute threads (default: online CPUs)\n"
            "  -ub, --ubatch-size N   tokens per forward micro-batch of a prompt (default 512; up to\n"
            "                         4096 and more, as llama.cpp's -ub)\n"
            "  -b, --batch-size N     llama.cpp's logical batch: accepted, and caps -ub as there\n"
            "  -ctk, -ctv TYPE        KV cache type of every slot: f16 (default), f32, bf16, q8_0, q4_0\n"
            "                         (--cache-type-k/-v, --kv-type; one type for K and V)\n"
            "      --alias NAME       model id in the API (default: the file name)\n"
            "      --chat-template T  \"chatml\" or a template text (default: the model's own)\n"
            "      --max-body BYTES   request body cap (default 8MiB)\n"
            "  -v, --verbose          log loading and every request to stderr\n"
            "speculative decoding in every slot (llama.cpp's flags; greedy output unchanged):\n"
            "      --spec-type T      none (default), ngram-simple, ngram-cache or draft-mtp (the model's\n"
            "                         own MTP layer); a request's speculative.n_max / .n_min / .p_min\n"
            "                         override the three below for it\n"
            "      --spec-draft-n-max N  most tokens drafted per step (3; adapts below it)\n"
            "      --spec-draft-n-min N  a shorter draft is not used (0)\n"
            "      --spec-draft-p-min P  stop drafting below this probability (0)\n"
            "      --spec-ngram-simple-size-n N, --spec-ngram-simple-size-m N  ngram-simple (12, 48)\n"
            "limits (a client cannot lock others out; docs/SERVER.md \"Running it safely\"):\n"
            "      --max-conns N      open connections at once (default 256); past it, requests answer 503\n"
            "      --max-conns-per-ip N  open connections from one client address (default 32; behind a\n"
            "                         proxy every client has the proxy's address: raise it)\n"
            "      --health-conns N   more connections only /health may use when the others are taken (4)\n"
            "      --header-timeout S a request's headers must arrive within S seconds of the connection's\n"
            "                         start or of its previous answer (default 10; also the keep-alive idle)\n"
            "      --body-timeout S   its body within S seconds of its headers (default 60)\n"
            "      --idle-timeout S   no byte either way for S seconds while an answer is sent closes the\n"
            "                         connection (default 120)\n"
            CLI_PP_HELP
            "  (serve: per request, by the length of its prompt after the cached prefix)\n"
            CLI_PLACEMENT_HELP
            "  (serve: --profile-out is also where POST /profile/save writes; without it that is\n"
            "  hotmoe-profile.json and nothing is written at exit)\n");
}

static int int_arg(const char *flag, const char *v, long lo, long hi, int32_t *out) {
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || *end || end == v || x < lo || x > hi) {
        fprintf(stderr, "serve: %s needs an integer in [%ld, %ld]\n", flag, lo, hi);
        return 0;
    }
    *out = (int32_t)x;
    return 1;
}

int hm_cmd_serve(int argc, char **argv) {
    hm_server_opts o;
    hm_server_opts_default(&o);
    hm_spec_opts spec;
    hm_spec_opts_default(&spec);
    cli_engine e = {.cmd = "serve", .place_init = true};
    hm_placement_opts_default(&e.place);
    int32_t n_batch = 0; /* -b: llama.cpp's logical batch; it caps the micro-batch as there */
    bool kv_set = false; /* a -ctk / -ctv was given (they must agree) */
    cli_pp pp = {0};
    bool dspark = false; /* --spec-type draft-dspark (cli_dspark.h) */
    const char *draft_path = NULL; /* -md: only ever refused here */
    for (int i = 1; i < argc; i++) {
        int pr = cli_placement_arg(&e, argc, argv, &i); /* --profile-out, --policy, ... */
        if (pr < 0) return 2;
        if (pr > 0) continue;
        if ((pr = cli_pp_arg(&pp, e.cmd, argc, argv, &i)) == CLI_ARG_NEXT) continue;
        if (pr != CLI_ARG_OWN) return pr;
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int32_t n;
        if (hm_cli_is_help(a)) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            o.verbose = true;
            continue;
        }
        if (!v) {
            fprintf(stderr, "serve: unknown option or missing value: %s\n", a);
            usage(stderr);
            return 2;
        }
        i++;
        if (!strcmp(a, "--spec-type") && !strcmp(v, CLI_DSPARK_NAME)) { /* the seed-2 line's: cli_dspark.h */
            dspark = true;
            spec.type = HM_SPEC_NONE;
            continue;
        }
        if (!strcmp(a, "-md") || !strcmp(a, "--model-draft") || !strcmp(a, "--spec-draft-model")) {
            draft_path = v; /* refused below: draft-dspark's message, or no draft model in serve */
            continue;
        }
        if (!strcmp(a, "--spec-type")) {
            const int t = hm_spec_type_from_name(v);
            if (t < 0 || t == HM_SPEC_DRAFT_SIMPLE) {
                fprintf(stderr, "serve: --spec-type %s is not served (have: none, ngram-simple, ngram-cache, draft-mtp%s)\n",
                        v, t == HM_SPEC_DRAFT_SIMPLE ? "; a draft model in serve is not done yet" : "");
                return 2;
            }
            spec.type = (hm_spec_type)t;
            dspark = false; /* the last --spec-type wins */
            continue;
        }
        if (!strcmp(a, "--spec-draft-n-max") || !strcmp(a, "--spec-draft-n-min") || !strcmp(a, "--spec-ngram-simple-size-n") ||
            !strcmp(a, "--spec-ngram-simple-size-m")) {
            int32_t x;
            if (!int_arg(a, v, strcmp(a, "--spec-draft-n-min") ? 1 : 0, 1024, &x)) return 2;
            if (!strcmp(a, "--spec-draft-n-max")) spec.n_max = x;
            else if (!strcmp(a, "--spec-draft-n-min")) spec.n_min = x;
            else if (!strcmp(a, "--spec-ngram-simple-size-n")) spec.size_n = x;
            else spec.size_m = x;
            continue;
        }
        if (!strcmp(a, "--spec-draft-p-min") || !strcmp(a, "--draft-p-min")) {
            char *end;
            const double x = strtod(v, &end);
            if (*end || end == v || !(x >= 0 && x <= 1)) {
                fprintf(stderr, "serve: %s needs a number in [0, 1]\n", a);
                return 2;
            }
            spec.p_min = (float)x;
            continue;
        }
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) o.model_path = v;
        else if (!strcmp(a, "--host")) o.host = v;
        else if (!strcmp(a, "--port")) {
            if (!int_arg(a, v, 1, 65535, &n)) return 2;
            o.port = n;
        } else if (!strcmp(a, "-np") || !strcmp(a, "--parallel")) {
            if (!int_arg(a, v, 1, 256, &n)) return 2;
            o.n_parallel = n;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            if (!int_arg(a, v, 0, 1 << 24, &o.n_ctx)) return 2;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!int_arg(a, v, 0, 512, &o.n_threads)) return 2;
        } else if (!strcmp(a, "-ub") || !strcmp(a, "--ubatch") || !strcmp(a, "--ubatch-size")) {
            if (!int_arg(a, v, 1, 1 << 16, &o.n_ubatch)) return 2;
        } else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) {
            if (!int_arg(a, v, 1, 1 << 16, &n_batch)) return 2;
        } else if (!strcmp(a, "-ctk") || !strcmp(a, "-ctv") || !strcmp(a, "--cache-type-k") ||
                   !strcmp(a, "--cache-type-v") || !strcmp(a, "--kv-type")) {
            hm_kv_type t;
            hm_err perr = {{0}};
            if (hm_kv_type_parse(v, &t, &perr) != HM_OK) {
                fprintf(stderr, "serve: %s: %s\n", a, perr.msg);
                return 2;
            }
            if (kv_set && t != o.kv_type) {
                fprintf(stderr, "serve: K and V caches of different types (%s after %s): hotmoe keeps one type for "
                                "both (give -ctk and -ctv the same type)\n", v, hm_kv_type_name(o.kv_type));
                return 2;
            }
            o.kv_type = t;
            kv_set = true;
        } else if (!strcmp(a, "--api-key")) {
            if (!*v) {
                fprintf(stderr, "serve: --api-key '' is empty; give a key, or leave --api-key out to serve "
                                "without one\n");
                return 2;
            }
            o.api_key = v;
        } else if (!strcmp(a, "--api-key-file")) o.api_key_file = v;
        else if (!strcmp(a, "--alias")) o.alias = v;
        else if (!strcmp(a, "--max-conns")) {
            if (!int_arg(a, v, 1, 16384, &o.max_conns)) return 2;
        } else if (!strcmp(a, "--max-conns-per-ip")) {
            if (!int_arg(a, v, 1, 16384, &o.max_conns_per_ip)) return 2;
        } else if (!strcmp(a, "--health-conns")) {
            if (!int_arg(a, v, 0, 1024, &n)) return 2;
            o.health_conns = n ? n : -1; /* 0 in the options is the default */
        } else if (!strcmp(a, "--header-timeout")) {
            if (!int_arg(a, v, 1, 86400, &o.header_timeout_s)) return 2;
        } else if (!strcmp(a, "--body-timeout")) {
            if (!int_arg(a, v, 1, 86400, &o.body_timeout_s)) return 2;
        } else if (!strcmp(a, "--idle-timeout")) {
            if (!int_arg(a, v, 1, 86400, &o.idle_timeout_s)) return 2;
        }
        else if (!strcmp(a, "--chat-template")) o.chat_template = v;
        else if (!strcmp(a, "--max-body")) {
            int64_t b;
            hm_err err = {{0}};
            if (hm_parse_size(v, &b, &err) != HM_OK || b < 1024) {
                fprintf(stderr, "serve: --max-body needs a size of at least 1KiB\n");
                return 2;
            }
            o.max_body = (size_t)b;
        } else {
            fprintf(stderr, "serve: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (dspark && draft_path) {
        cli_dspark_refuse("serve", draft_path);
        return 2;
    }
    if (draft_path) {
        fprintf(stderr, "serve: -md %s: a draft model in serve is not done yet (served: ngram-simple, ngram-cache, "
                        "draft-mtp)\n", draft_path);
        return 2;
    }
    o.n_ubatch = cli_ubatch_capped(o.n_ubatch, n_batch);
    const char *env_key = getenv("HOTMOE_API_KEY");
    if (!o.api_key && env_key) {
        if (!*env_key) { /* set but empty: the user meant a key; never serve open by mistake */
            fprintf(stderr, "serve: HOTMOE_API_KEY is set but empty; set a key, or unset it to serve without one\n");
            return 2;
        }
        o.api_key = env_key;
    }
    if (!o.model_path) {
        fprintf(stderr, "serve: -m FILE is required\n");
        usage(stderr);
        return 2;
    }
    if (dspark) cli_dspark_warn_none("serve");
    if (e.profile_out) {
        o.profile_out = e.profile_out;
        o.profile_on_exit = true;
    }
    o.profile_format = e.profile_format;
    o.trace_out = e.trace_out;
    if (cli_placement_env(&e, &e.place) || cli_split_check(&e, &e.place)) return 2;
    o.placement = &e.place;
    if (spec.n_min > spec.n_max) {
        fprintf(stderr, "serve: --spec-draft-n-min %d is above --spec-draft-n-max %d\n", spec.n_min, spec.n_max);
        return 2;
    }
    o.spec = &spec;
    if (pp.init) { /* --prompt-processing-* (cli_pp.h) */
        o.pp_model_path = pp.path;
        o.pp_min_tokens = pp.o.min_tokens;
        o.pp_refresh = pp.o.refresh;
        o.pp_gpu_moe = pp.gpu_moe;
    }
    if (!e.place.n_ctx && o.n_ctx > 0) e.place.n_ctx = o.n_ctx * (o.n_parallel > 0 ? o.n_parallel : 1); /* every slot's KV */
    if (e.place.policy && strcmp(e.place.policy, "none") && !hm_placement_wants_gpu(&e.place))
        fprintf(stderr, "serve: note: --policy %s has no fast tier to place units in (no VRAM budget); expert use is "
                        "counted, every unit runs from RAM\n", e.place.policy);
    hm_err err = {{0}};
    hm_server *s;
    if (hm_server_open(&s, &o, &err) != HM_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    g_server = s;
    hm_cli_on_stop_signals(on_signal);
    signal(SIGPIPE, SIG_IGN);
    bool loopback = !strcmp(o.host, "localhost") || !strncmp(o.host, "127.", 4) || !strcmp(o.host, "::1");
    if (!loopback && !o.api_key && !o.api_key_file)
        fprintf(stderr, "serve: warning: listening on %s without --api-key: anyone who can reach this port can use "
                        "the model\n", o.host);
    fprintf(stderr, "serve: listening on http://%s:%d (%d slot%s)\n", o.host, hm_server_port(s), o.n_parallel,
            o.n_parallel == 1 ? "" : "s");
    hm_server_wait(s);
    fprintf(stderr, "serve: stopping\n");
    g_server = NULL;
    hm_server_close(s);
    return 0;
}
