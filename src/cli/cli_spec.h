/* cli_spec.h - the speculative decoding flags of `run` and `bench` (llama.cpp's names): parsing,
 * opening the drafter (and the draft model for draft-simple) on a session, and the stats line.
 * Kept apart from cmd_engine.h: only the commands that generate use them. */
#ifndef HM_CLI_SPEC_H
#define HM_CLI_SPEC_H

#include "cli_dspark.h"
#include "cmd_engine.h"

typedef struct cli_spec {
    hm_spec_opts o;
    bool init;
    bool dspark;            /* --spec-type draft-dspark: see cli_dspark.h (type stays none) */
    const char *draft_path; /* -md */
    hm_model *draft;        /* owned, opened by cli_spec_open */
} cli_spec;

#define CLI_SPEC_HELP                                                                           \
    "speculative decoding (greedy output is the same as without it):\n"                          \
    "  --spec-type T          none (default), ngram-simple or ngram-cache (drafts from the prompt\n" \
    "                         and output so far), draft-simple (a draft model, -md) or draft-mtp\n" \
    "                         (the model's own MTP layer: qwen35moe files with nextn tensors)\n" \
    "  -md, --model-draft F   draft model (same vocabulary; alias --spec-draft-model); implies\n"  \
    "                         draft-simple when --spec-type is not given\n"                     \
    "  --spec-draft-n-max N   draft-simple, draft-mtp: most tokens drafted per step (default 3;\n" \
    "                         the length adapts to the acceptance below it)\n"                \
    "  --spec-draft-n-min N   draft-simple, draft-mtp: a shorter draft is not used (default 0)\n" \
    "  --spec-draft-p-min P   draft-simple, draft-mtp: stop drafting below this probability\n" \
    "                         (default 0)\n"                                                   \
    "  --spec-ngram-simple-size-n N  ngram-simple: lookup length (default 12)\n"              \
    "  --spec-ngram-simple-size-m N  ngram-simple: longest draft (default 48)\n"

/* llama.cpp's names we do not run yet: refused by name, never replaced by another */
static const char *const cli_spec_later[] = {"draft-eagle3", "draft-dflash", "ngram-map-k", "ngram-map-k4v",
                                              "ngram-mod"};

/* CLI_ARG_NEXT when argv[*i] was a speculation flag (consumed), CLI_ARG_OWN when it is not one, 2 on
 * a bad value (printed). */
static inline int cli_spec_arg(cli_spec *sp, const char *cmd, int argc, char **argv, int *i) {
    if (!sp->init) {
        hm_spec_opts_default(&sp->o);
        sp->init = true;
    }
    const char *a = argv[*i], *v;
    long n;
    double d;
    if (!strcmp(a, "--spec-type")) {
        if (!(v = cli_value(cmd, argc, argv, i))) return 2;
        int t = hm_spec_type_from_name(v);
        sp->dspark = !strcmp(v, CLI_DSPARK_NAME);
        if (sp->dspark) t = HM_SPEC_NONE; /* without -md: no drafter, loudly (cli_spec_check) */
        if (t < 0) {
            for (size_t k = 0; k < sizeof cli_spec_later / sizeof cli_spec_later[0]; k++)
                if (!strcmp(v, cli_spec_later[k])) {
                    fprintf(stderr, "hotmoe %s: --spec-type %s is llama.cpp's, not implemented in hotmoe yet "
                                    "(have: ngram-simple, ngram-cache, draft-simple, draft-mtp)\n", cmd, v);
                    return 2;
                }
            fprintf(stderr, "hotmoe %s: --spec-type '%s' is unknown (none, ngram-simple, ngram-cache, draft-simple, "
                            "draft-mtp; one type, not a list)\n", cmd, v);
            return 2;
        }
        sp->o.type = (hm_spec_type)t;
    } else if (!strcmp(a, "-md") || !strcmp(a, "--model-draft") || !strcmp(a, "--spec-draft-model")) {
        if (!(sp->draft_path = cli_value(cmd, argc, argv, i))) return 2;
    } else if (!strcmp(a, "--spec-draft-n-max")) {
        if (!(v = cli_value(cmd, argc, argv, i)) || cli_long(cmd, a, v, 1, 1024, &n)) return 2;
        sp->o.n_max = (int32_t)n;
    } else if (!strcmp(a, "--spec-draft-n-min")) {
        if (!(v = cli_value(cmd, argc, argv, i)) || cli_long(cmd, a, v, 0, 1024, &n)) return 2;
        sp->o.n_min = (int32_t)n;
    } else if (!strcmp(a, "--spec-draft-p-min") || !strcmp(a, "--draft-p-min")) {
        if (!(v = cli_value(cmd, argc, argv, i)) || cli_float(cmd, a, v, 0, 1, &d)) return 2;
        sp->o.p_min = (float)d;
    } else if (!strcmp(a, "--spec-ngram-simple-size-n")) {
        if (!(v = cli_value(cmd, argc, argv, i)) || cli_long(cmd, a, v, 1, 1024, &n)) return 2;
        sp->o.size_n = (int32_t)n;
    } else if (!strcmp(a, "--spec-ngram-simple-size-m")) {
        if (!(v = cli_value(cmd, argc, argv, i)) || cli_long(cmd, a, v, 1, 1024, &n)) return 2;
        sp->o.size_m = (int32_t)n;
    } else {
        return CLI_ARG_OWN;
    }
    return CLI_ARG_NEXT;
}

/* After parsing: -md without --spec-type is draft-simple; draft-simple without -md and -md with
 * another type are errors. 0 ok, 2 printed. */
static inline int cli_spec_check(cli_spec *sp, const char *cmd) {
    if (!sp->init) hm_spec_opts_default(&sp->o), sp->init = true;
    if (sp->dspark) {
        if (sp->draft_path) {
            cli_dspark_refuse(cmd, sp->draft_path);
            return 2;
        }
        cli_dspark_warn_none(cmd);
        return 0;
    }
    if (sp->draft_path && sp->o.type == HM_SPEC_NONE) sp->o.type = HM_SPEC_DRAFT_SIMPLE;
    if (sp->o.type == HM_SPEC_DRAFT_SIMPLE && !sp->draft_path) {
        fprintf(stderr, "hotmoe %s: --spec-type draft-simple needs a draft model (-md FILE)\n", cmd);
        return 2;
    }
    if (sp->draft_path && sp->o.type != HM_SPEC_DRAFT_SIMPLE) {
        fprintf(stderr, "hotmoe %s: -md is for --spec-type draft-simple, not %s\n", cmd, hm_spec_type_name(sp->o.type));
        return 2;
    }
    if (sp->o.n_min > sp->o.n_max) {
        fprintf(stderr, "hotmoe %s: --spec-draft-n-min %d is above --spec-draft-n-max %d\n", cmd, sp->o.n_min,
                sp->o.n_max);
        return 2;
    }
    return 0;
}

/* Open speculation on s (type none: *out NULL, 0). stop: the end-of-generation ids of tk (may be
 * NULL). 0 ok, 1 printed. The draft model is opened on the CPU, without the target's placement. */
static inline int cli_spec_open(cli_spec *sp, const char *cmd, hm_session *s, const hm_tokenizer *tk, hm_spec **out) {
    *out = NULL;
    if (sp->o.type == HM_SPEC_NONE) return 0;
    hm_err err;
    int32_t *stop = NULL, n_stop = 0;
    if (tk) {
        const int32_t nv = hm_tokenizer_n_vocab(tk);
        for (int32_t t = 0; t < nv; t++) n_stop += hm_tokenizer_is_eog(tk, t);
        if (n_stop && !(stop = malloc((size_t)n_stop * sizeof *stop))) return 1;
        n_stop = 0;
        for (int32_t t = 0; t < nv && stop; t++)
            if (hm_tokenizer_is_eog(tk, t)) stop[n_stop++] = t;
    }
    if (sp->draft_path && !sp->draft && hm_model_open(&sp->draft, sp->draft_path, NULL, &err) != HM_OK) {
        fprintf(stderr, "hotmoe %s: draft model: %s\n", cmd, err.msg);
        free(stop);
        return 1;
    }
    hm_spec_opts o = sp->o;
    o.draft = sp->draft;
    o.stop_ids = stop;
    o.n_stop_ids = n_stop;
    hm_status st = hm_spec_open(out, s, &o, &err);
    free(stop);
    if (st != HM_OK) {
        fprintf(stderr, "hotmoe %s: %s\n", cmd, err.msg);
        return 1;
    }
    return 0;
}

static inline void cli_spec_close(cli_spec *sp, hm_spec *h) {
    hm_spec_close(h);
    hm_model_close(sp->draft);
    sp->draft = NULL;
}

/* "drafted D, accepted A (R %), S steps, T tokens (T/S per step)" */
static inline void cli_spec_print(FILE *f, const char *cmd, const char *what, const hm_spec_stats *st) {
    fprintf(f, "hotmoe %s: speculation (%s): %llu drafted, %llu accepted (%.1f %%), %llu verify steps (%llu with a "
               "draft), %llu tokens (%.2f per step); draft %.2f s, verify %.2f s\n",
            cmd, what, (unsigned long long)st->drafted, (unsigned long long)st->accepted,
            st->drafted ? 100.0 * (double)st->accepted / (double)st->drafted : 0.0, (unsigned long long)st->steps,
            (unsigned long long)st->steps_drafted, (unsigned long long)st->tokens,
            st->steps ? (double)st->tokens / (double)st->steps : 0.0, st->t_draft_s, st->t_verify_s);
}

#endif
