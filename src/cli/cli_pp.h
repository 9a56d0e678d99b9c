/* cli_pp.h - the prompt-processing model flags of `run`, `bench` and `serve` (issue 25; the seed
 * fork's names): parsing, opening the copy with the main model's placement, attaching it to a
 * session, and the line that says which model prefilled. Kept apart from cmd_engine.h: only the
 * commands that take a prompt use them. */
#ifndef HM_CLI_PP_H
#define HM_CLI_PP_H

#include "cmd_engine.h"

typedef struct cli_pp {
    hm_pp_opts o;
    bool init;
    const char *path; /* --prompt-processing-model */
    int32_t gpu_moe;  /* --prompt-processing-gpu-moe: -1 not given */
    hm_model *model;  /* owned, opened by cli_pp_open_model */
} cli_pp;

#define CLI_PP_HELP                                                                                     \
    "prompt-processing model (a cheaper copy prefills long prompts; docs/ENGINE.md):\n"                  \
    "  --prompt-processing-model F    the same model at another quantisation (checked at load)\n"       \
    "  --prompt-processing-min-tokens N  prompts of at least N tokens go through it (default 8192)\n"  \
    "  --prompt-processing-refresh N  the last N prompt tokens are evaluated by the main model (0)\n"    \
    "  --prompt-processing-gpu-moe N  the copy's experts of the first N layers on the CPU, the rest\n"   \
    "                                 under the main model's VRAM budget logic (0: all); default: the\n" \
    "                                 main model's placement flags\n"

/* CLI_ARG_NEXT when argv[*i] was one of the flags (consumed), CLI_ARG_OWN when not, 2 on a bad
 * value (printed). */
static inline int cli_pp_arg(cli_pp *p, const char *cmd, int argc, char **argv, int *i) {
    if (!p->init) {
        hm_pp_opts_default(&p->o);
        p->gpu_moe = -1;
        p->init = true;
    }
    const char *a = argv[*i], *v;
    long n;
    if (!strcmp(a, "--prompt-processing-model")) {
        if (!(p->path = cli_value(cmd, argc, argv, i))) return 2;
    } else if (!strcmp(a, "--prompt-processing-min-tokens")) {
        if (!(v = cli_value(cmd, argc, argv, i)) || cli_long(cmd, a, v, 1, 1L << 30, &n)) return 2;
        p->o.min_tokens = (int32_t)n;
    } else if (!strcmp(a, "--prompt-processing-refresh")) {
        if (!(v = cli_value(cmd, argc, argv, i)) || cli_long(cmd, a, v, 0, 1L << 30, &n)) return 2;
        p->o.refresh = (int32_t)n;
    } else if (!strcmp(a, "--prompt-processing-gpu-moe")) {
        if (!(v = cli_value(cmd, argc, argv, i)) || cli_long(cmd, a, v, 0, 1 << 20, &n)) return 2;
        p->gpu_moe = (int32_t)n;
    } else {
        return CLI_ARG_OWN;
    }
    return CLI_ARG_NEXT;
}

/* Open the copy (no --prompt-processing-model: nothing, 0) with e's placement and RoPE flags,
 * --prompt-processing-gpu-moe as its --n-cpu-moe, sharing main's identical dense tensors (main must
 * outlive it: cli_pp_close first). 0 ok, 1 printed. */
static inline int cli_pp_open_model(cli_pp *p, const cli_engine *e, const hm_model *main) {
    if (!p->init) hm_pp_opts_default(&p->o), p->gpu_moe = -1, p->init = true;
    if (!p->path) return 0;
    hm_placement_opts po;
    if (e->place_init) po = e->place;
    else hm_placement_opts_default(&po);
    if (cli_placement_env(e, &po)) return 1;
    if (p->gpu_moe >= 0) po.n_cpu_moe = p->gpu_moe;
    hm_model_opts mo;
    hm_model_opts_default(&mo);
    mo.verbose = e->verbose;
    mo.placement = &po;
    mo.rope_scaling = e->rope_scaling;
    mo.rope_scale = e->rope_scale;
    mo.yarn_orig_ctx = e->yarn_orig_ctx;
    mo.share_dense = main;
    hm_err err;
    if (hm_model_open(&p->model, p->path, &mo, &err) != HM_OK) {
        fprintf(stderr, "hotmoe %s: prompt-processing model: %s\n", e->cmd, err.msg);
        return 1;
    }
    const hm_model_info *in = hm_model_get_info(p->model);
    fprintf(stderr, "hotmoe %s: prompt-processing model %s: %d tensors (%.2f MiB) identical to the main model's, "
                    "held once; %.2f MiB of its own\n", e->cmd, p->path, in->shared_tensors,
            (double)in->shared_bytes / 1048576.0, (double)(in->file_bytes - in->shared_bytes) / 1048576.0);
    p->o.model = p->model;
    return 0;
}

/* Attach the copy to s (none: 0). 0 ok, 1 printed. */
static inline int cli_pp_attach(cli_pp *p, const char *cmd, hm_session *s) {
    if (!p->model) return 0;
    hm_err err;
    if (hm_session_set_pp(s, &p->o, &err) != HM_OK) {
        fprintf(stderr, "hotmoe %s: %s\n", cmd, err.msg);
        return 1;
    }
    return 0;
}

static inline void cli_pp_close(cli_pp *p) {
    hm_model_close(p->model);
    p->model = NULL;
}

/* The line that says which model prefilled the last prompt of n tokens (nothing without a copy). */
static inline void cli_pp_print(FILE *f, const char *cmd, const cli_pp *p, const hm_session *s, long n) {
    if (!p->model) return;
    hm_pp_stats st;
    hm_session_pp_stats(s, &st);
    if (!st.last_pp) {
        fprintf(f, "hotmoe %s: prefill: main model (%ld prompt tokens, below --prompt-processing-min-tokens %d)\n",
                cmd, n, p->o.min_tokens);
        return;
    }
    fprintf(f, "hotmoe %s: prefill: prompt-processing model %llu tokens in %.2f s (%.2f tok/s), main model refresh "
               "%llu tokens in %.2f s; %llu routed selections handed to the main model's expert store, %llu units "
               "read ahead (%llu into the SSD tier's RAM), %llu VRAM re-plans\n",
            cmd, (unsigned long long)st.tokens_pp, st.t_pp_s, st.t_pp_s > 0 ? (double)st.tokens_pp / st.t_pp_s : 0.0,
            (unsigned long long)st.tokens_refresh, st.t_refresh_s, (unsigned long long)st.routes_warm,
            (unsigned long long)st.units_advised, (unsigned long long)st.units_prefetched,
            (unsigned long long)st.replans);
}

#endif
