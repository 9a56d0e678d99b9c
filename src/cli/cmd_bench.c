/* cmd_bench.c - `hotmoe bench`: prompt processing and generation speed, measured as
 * llama-bench does: pp = one batch of p random tokens; tg = n single-token decodes; both after a
 * context of d tokens (-d, llama-bench's --n-depth: filled once, untimed, and trimmed back to
 * before each run; a recurrent state (qwen35moe) cannot be trimmed, so there it is rebuilt
 * untimed before each run, its routing left out of the hit rate); one untimed warm-up of each, then r timed repetitions; tok/s reported as mean
 * +/- sample standard deviation over the repetitions. With the GPU, the expert hit rate of the tg
 * runs (routed units found in VRAM) is printed too. Needs no tokenizer, except for -f FILE: a greedy
 * generation of n tokens continuing FILE's text (prompt untimed), plain and, with --spec-type, with
 * speculation, side by side with the acceptance rate and whether the tokens were the same. With
 * --prompt-processing-model the pp test's prompt goes through hm_session_prefill (the copy when it is
 * long enough); --e2e adds the end-to-end test of issue 25: reset, a prompt of -p random tokens, then
 * -n greedy decode steps, timed as time to first token, decode rate (the first 100 steps and all)
 * and total, once per repetition (run it with and without the copy in two processes: each starts
 * its expert store cold). */
#include <math.h>
#include <sys/resource.h>
#include <time.h>

#include "cli_pp.h"
#include "cli_spec.h"

static void usage(FILE *f) {
    fprintf(f, "usage: hotmoe bench -m MODEL [-p N] [-n N] [-d N] [-t T] [-r REPS] [--json]\n\n"
               "  -p, --n-prompt N       prompt tokens, one batch (default 512; 0 = skip)\n"
               "  -n, --n-gen N          generated tokens, one at a time (default 128; 0 = skip)\n"
               "  -d, --n-depth N        context already in the cache before each test (default 0;\n"
               "                         rebuilt untimed before each run where a recurrent state\n"
               "                         cannot be trimmed back)\n"
               "  -r, --repetitions N    timed runs of each test (default 5)\n"
               "  --seed N               seed of the random token ids (default 1)\n"
               "  --json                 print one JSON object (pp_tok_s, tg_tok_s, ...)\n"
               "  -f, --file FILE        also a greedy generation of -n tokens continuing FILE's text\n"
               "                         (plain, and with --spec-type: side by side)\n"
               "  --e2e                  also time prompt + greedy decode end to end (time to first token,\n"
               "                         decode tok/s of the first 100 and of all -n steps, total)\n"
               "  --e2e-only             --e2e without the pp and tg tests (long prompts: each pp run costs)\n" CLI_SPEC_HELP
               CLI_PP_HELP CLI_ENGINE_HELP);
}

static void mean_std(const double *x, int n, double *mean, double *std) {
    double s = 0, ss = 0;
    for (int i = 0; i < n; i++) s += x[i];
    *mean = n ? s / n : 0;
    for (int i = 0; i < n; i++) ss += (x[i] - *mean) * (x[i] - *mean);
    *std = n > 1 ? sqrt(ss / (n - 1)) : 0;
}

/* Routed units of the timed parts only (a rebuilt context is not counted). */
typedef struct tg_count {
    bool on;
    uint64_t hits, misses;
} tg_count;

static bool usage_hm(const hm_model *m, uint64_t *h, uint64_t *mi) {
    hm_usage u;
    if (hm_model_usage(m, &u, NULL) != HM_OK) return false;
    *h = u.hits;
    *mi = u.misses;
    hm_usage_free(&u);
    return true;
}

/* One timed test after `depth` tokens of context ctx[0..depth) (the session holds at least them:
 * trimmed back to depth, or, for a recurrent state that cannot be rewound, rebuilt untimed from
 * ctx); returns tok/s or -1 on failure (printed). cnt (may be NULL) adds the timed part's hits. */
static double run_test(const hm_model *m, hm_session *s, const int32_t *ctx, int32_t depth, const int32_t *ids,
                       int32_t n, bool prompt, tg_count *cnt) {
    hm_err err;
    const float *lg;
    if (depth == 0) hm_session_reset(s);
    else if (hm_session_trim(s, depth, &err) != HM_OK) {
        hm_session_reset(s);
        if (hm_session_eval(s, ctx, depth, false, &lg, &err) != HM_OK) goto fail;
    }
    uint64_t h0 = 0, m0 = 0;
    if (cnt && cnt->on) cnt->on = usage_hm(m, &h0, &m0);
    double t0 = cli_now_s();
    if (prompt) { /* through the prompt-processing copy when one is attached and the prompt is long enough */
        if (hm_session_prefill(s, ids, n, &lg, &err) != HM_OK) goto fail;
    } else {
        for (int32_t i = 0; i < n; i++)
            if (hm_session_eval(s, &ids[i], 1, false, &lg, &err) != HM_OK) goto fail;
    }
    const double dt = cli_now_s() - t0;
    uint64_t h1 = 0, m1 = 0;
    if (cnt && cnt->on && (cnt->on = usage_hm(m, &h1, &m1))) {
        cnt->hits += h1 - h0;
        cnt->misses += m1 - m0;
    }
    return n / dt;
fail:
    fprintf(stderr, "hotmoe bench: %s\n", err.msg);
    return -1;
}

/* Greedy generation of n tokens after prompt[0..np) (evaluated untimed), plain (sp NULL) or with
 * speculation; the ids go to out[n]. Returns tok/s, -1 on failure (printed). */
static double gen_test(hm_model *m, hm_session *s, hm_spec *sp, const int32_t *prompt, int32_t np, int32_t n,
                       int32_t *out) {
    hm_err err;
    hm_sampler *smp = NULL;
    hm_sampler_opts so;
    hm_sampler_opts_default(&so);
    so.temp = 0;
    const float *lg;
    double dt = -1;
    hm_session_reset(s);
    if (sp) hm_spec_trim(sp, 0);
    if (hm_sampler_open(&smp, hm_model_n_vocab(m), &so, &err) != HM_OK ||
        hm_session_eval(s, prompt, np, false, &lg, &err) != HM_OK || (sp && hm_spec_add(sp, prompt, np, &err) != HM_OK))
        goto fail;
    const double t0 = cli_now_s();
    out[0] = hm_sampler_sample(smp, lg);
    for (int32_t got = 1; got < n;) {
        if (sp) {
            int32_t k;
            if (hm_spec_step(sp, smp, out[got - 1], n - got, out + got, &k, &err) != HM_OK) goto fail;
            got += k;
        } else {
            if (hm_session_eval(s, &out[got - 1], 1, false, &lg, &err) != HM_OK) goto fail;
            out[got++] = hm_sampler_sample(smp, lg);
        }
    }
    dt = cli_now_s() - t0;
    hm_sampler_close(smp);
    return n / dt;
fail:
    fprintf(stderr, "hotmoe bench: %s\n", err.msg);
    hm_sampler_close(smp);
    return -1;
}

/* --e2e: reset, prefill ids[0..np) (hm_session_prefill), then n greedy decode steps. Fills the
 * times; -1 on failure (printed). */
typedef struct e2e_times {
    double ttft, dec100, dec, total; /* s to the first token; decode tok/s of the first 100 steps, all */
    double hit100, hit;              /* the decode's VRAM hit rate, first 100 steps and all (-1: no count) */
} e2e_times;

static int argmax(const float *lg, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (lg[i] > lg[b]) b = i;
    return b;
}

static int e2e_test(hm_model *m, hm_session *s, const int32_t *ids, int32_t np, int32_t n, e2e_times *t) {
    hm_err err;
    const float *lg;
    const int32_t nv = hm_model_n_vocab(m);
    hm_session_reset(s);
    const double t0 = cli_now_s();
    if (hm_session_prefill(s, ids, np, &lg, &err) != HM_OK) goto fail;
    int32_t tok = argmax(lg, nv);
    const double t1 = cli_now_s();
    double t100 = t1;
    uint64_t h0 = 0, m0 = 0, h1 = 0, m1 = 0, h2 = 0, m2 = 0;
    hm_usage us0;
    bool cnt = hm_model_usage(m, &us0, NULL) == HM_OK;
    if (cnt) {
        cnt = us0.vram_slots > 0; /* a hit rate only where there is a VRAM tier */
        hm_usage_free(&us0);
    }
    cnt = cnt && usage_hm(m, &h0, &m0);
    h1 = h0, m1 = m0;
    for (int32_t i = 0; i < n; i++) {
        if (hm_session_eval(s, &tok, 1, false, &lg, &err) != HM_OK) goto fail;
        tok = argmax(lg, nv);
        if (i + 1 == 100) {
            t100 = cli_now_s();
            cnt = cnt && usage_hm(m, &h1, &m1);
        }
    }
    const double t2 = cli_now_s();
    cnt = cnt && usage_hm(m, &h2, &m2);
    if (n < 100) h1 = h2, m1 = m2;
    t->hit100 = cnt && h1 + m1 > h0 + m0 ? (double)(h1 - h0) / (double)(h1 + m1 - h0 - m0) : -1;
    t->hit = cnt && h2 + m2 > h0 + m0 ? (double)(h2 - h0) / (double)(h2 + m2 - h0 - m0) : -1;
    t->ttft = t1 - t0;
    t->dec = n > 0 ? n / (t2 - t1) : 0;
    t->dec100 = n >= 100 ? 100 / (t100 - t1) : t->dec;
    t->total = t2 - t0;
    return 0;
fail:
    fprintf(stderr, "hotmoe bench: e2e: %s\n", err.msg);
    return -1;
}

int hm_cmd_bench(int argc, char **argv) {
    cli_engine e = {.cmd = "bench"};
    long n_prompt = 512, n_gen = 128, reps = 5, seed = 1, depth = 0;
    bool json = false;
    cli_spec spc = {0};
    cli_pp ppo = {0};
    bool e2e = false, e2e_only = false;
    hm_spec *gsp = NULL; /* -f with --spec-type */
    const char *gen_file = NULL;
    for (int i = 1; i < argc; i++) {
        int r = cli_common_arg(&e, argc, argv, &i, usage);
        if (r == CLI_ARG_NEXT) continue;
        if (r != CLI_ARG_OWN) return r;
        if ((r = cli_spec_arg(&spc, e.cmd, argc, argv, &i)) == CLI_ARG_NEXT) continue;
        if (r != CLI_ARG_OWN) return r;
        if ((r = cli_pp_arg(&ppo, e.cmd, argc, argv, &i)) == CLI_ARG_NEXT) continue;
        if (r != CLI_ARG_OWN) return r;
        const char *a = argv[i], *v;
        if (!strcmp(a, "-p") || !strcmp(a, "--n-prompt")) {
            if (!(v = cli_value(e.cmd, argc, argv, &i)) || cli_long(e.cmd, a, v, 0, 1 << 20, &n_prompt)) return 2;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-gen")) {
            if (!(v = cli_value(e.cmd, argc, argv, &i)) || cli_long(e.cmd, a, v, 0, 1 << 20, &n_gen)) return 2;
        } else if (!strcmp(a, "-d") || !strcmp(a, "--n-depth")) {
            if (!(v = cli_value(e.cmd, argc, argv, &i)) || cli_long(e.cmd, a, v, 0, 1 << 24, &depth)) return 2;
        } else if (!strcmp(a, "-r") || !strcmp(a, "--repetitions")) {
            if (!(v = cli_value(e.cmd, argc, argv, &i)) || cli_long(e.cmd, a, v, 1, 1000, &reps)) return 2;
        } else if (!strcmp(a, "--seed")) {
            if (!(v = cli_value(e.cmd, argc, argv, &i)) || cli_long(e.cmd, a, v, 0, 0x7fffffff, &seed)) return 2;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--e2e")) {
            e2e = true;
        } else if (!strcmp(a, "--e2e-only")) {
            e2e = e2e_only = true;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if (!(gen_file = cli_value(e.cmd, argc, argv, &i))) return 2;
        } else {
            return cli_unknown_arg(&e, a, usage);
        }
    }
    if (cli_need_model(&e) || cli_spec_check(&spc, e.cmd)) return 2;
    if (spc.o.type != HM_SPEC_NONE && (!gen_file || n_gen < 2)) {
        fprintf(stderr, "hotmoe bench: --spec-type measures a generation that continues a text: give -f FILE and -n >= 2\n");
        return 2;
    }
    if (n_prompt == 0 && n_gen == 0) {
        fprintf(stderr, "hotmoe bench: nothing to do (-p 0 -n 0)\n");
        return 2;
    }
    int32_t *gprompt = NULL, *gen_a = NULL, *gen_b = NULL;
    size_t gnp = 0;
    if (gen_file) { /* the text to continue, tokenised with the model's tokenizer */
        hm_tokenizer *tk = NULL;
        hm_err terr;
        char *txt = cli_read_file(e.cmd, gen_file, NULL);
        if (!txt) return 1;
        hm_status tst = hm_tokenizer_open(&tk, e.model, &terr);
        if (tst == HM_OK) tst = hm_tokenize(tk, txt, strlen(txt), NULL, &gprompt, &gnp, &terr);
        hm_tokenizer_close(tk);
        free(txt);
        if (tst != HM_OK || gnp == 0) {
            fprintf(stderr, "hotmoe bench: %s: %s\n", gen_file, tst != HM_OK ? terr.msg : "no tokens");
            free(gprompt);
            return 1;
        }
    }
    int32_t need = (int32_t)(depth + (n_prompt > n_gen ? n_prompt : n_gen));
    if (gen_file && (int32_t)gnp + (int32_t)n_gen + 1 > need) need = (int32_t)gnp + (int32_t)n_gen + 1;
    if (e2e && (int32_t)(n_prompt + n_gen + 1) > need) need = (int32_t)(n_prompt + n_gen + 1);
    if (e2e && n_prompt == 0) {
        fprintf(stderr, "hotmoe bench: --e2e needs a prompt (-p N > 0)\n");
        free(gprompt);
        return 2;
    }
    if (e.n_ctx && e.n_ctx < need) {
        fprintf(stderr, "hotmoe bench: -c %d is smaller than the test (%d tokens)\n", e.n_ctx, need);
        free(gprompt);
        return 1;
    }
    hm_model *m = cli_open_model(&e);
    hm_session *s = m ? cli_open_session(&e, m, e.n_ctx ? e.n_ctx : need) : NULL;
    if (!s || cli_pp_open_model(&ppo, &e, m) || cli_pp_attach(&ppo, e.cmd, s)) {
        hm_session_close(s);
        cli_pp_close(&ppo);
        hm_model_close(m);
        free(gprompt);
        return 1;
    }
    const hm_model_info *inf = hm_model_get_info(m);
    int32_t *ids = malloc((size_t)need * sizeof *ids);
    double *pp = calloc((size_t)reps, sizeof *pp), *tg = calloc((size_t)reps, sizeof *tg);
    int rc = 1;
    e2e_times *et = NULL; /* --e2e: one per repetition */
    if (!ids || !pp || !tg) goto done;
    uint64_t x = (uint64_t)seed * 0x9e3779b97f4a7c15ull + 1;
    for (int32_t i = 0; i < need; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ids[i] = (int32_t)(x % (uint64_t)inf->n_vocab);
    }
    double pm = 0, psd = 0, tm = 0, tsd = 0;
    const int32_t d = (int32_t)depth, *gen = ids + d;
    if (d > 0) { /* the context every test starts from, filled once in -ub sized batches */
        hm_err err;
        const float *lg;
        hm_session_reset(s);
        double t0 = cli_now_s();
        if (hm_session_eval(s, ids, d, false, &lg, &err) != HM_OK) {
            fprintf(stderr, "hotmoe bench: %s\n", err.msg);
            goto done;
        }
        if (!json) fprintf(stderr, "hotmoe bench: filled %d tokens of context in %.1f s\n", d, cli_now_s() - t0);
    }
    if (n_prompt && !e2e_only) {
        if (run_test(m, s, ids, d, gen, (int32_t)n_prompt, true, NULL) < 0) goto done; /* warm-up */
        for (long r = 0; r < reps; r++)
            if ((pp[r] = run_test(m, s, ids, d, gen, (int32_t)n_prompt, true, NULL)) < 0) goto done;
        mean_std(pp, (int)reps, &pm, &psd);
    }
    cli_tier_snap t0, t1;
    memset(&t1, 0, sizeof t1);
    tg_count cnt = {.on = true};
    if (n_gen && !e2e_only) {
        if (run_test(m, s, ids, d, gen, n_gen < 16 ? (int32_t)n_gen : 16, false, NULL) < 0) goto done; /* warm-up */
        cli_tier_get(m, &t0);
        for (long r = 0; r < reps; r++)
            if ((tg[r] = run_test(m, s, ids, d, gen, (int32_t)n_gen, false, &cnt)) < 0) goto done;
        mean_std(tg, (int)reps, &tm, &tsd);
        cli_tier_get(m, &t1);
    }
    /* --e2e: prompt + decode from a reset session, each repetition (no warm-up: the first is the cold one) */
    if (e2e && !(et = calloc((size_t)reps, sizeof *et))) goto done;
    for (long r = 0; e2e && r < reps; r++) {
        if (e2e_test(m, s, ids, (int32_t)n_prompt, (int32_t)n_gen, &et[r])) goto done;
        fprintf(stderr, "hotmoe bench: e2e run %ld: prompt %ld tokens, time to first token %.3f s, decode %ld tokens: "
                        "%.2f tok/s (first 100: %.2f tok/s), total %.3f s", r + 1, n_prompt, et[r].ttft, n_gen, et[r].dec,
                et[r].dec100, et[r].total);
        if (et[r].hit >= 0)
            fprintf(stderr, "; VRAM hit rate %.1f %% (first 100: %.1f %%)", 100.0 * et[r].hit, 100.0 * et[r].hit100);
        fprintf(stderr, "\n");
        if (ppo.model) cli_pp_print(stderr, "bench", &ppo, s, n_prompt);
    }
    /* -f: greedy generation after the file's text, plain then with speculation */
    double gpm = 0, gpsd = 0, gsm = 0, gssd = 0;
    hm_spec_stats gst0, gst;
    memset(&gst, 0, sizeof gst);
    int gsame = -1;
    if (gen_file) {
        gen_a = malloc((size_t)n_gen * sizeof *gen_a);
        gen_b = malloc((size_t)n_gen * sizeof *gen_b);
        if (!gen_a || !gen_b) goto done;
        if (gen_test(m, s, NULL, gprompt, (int32_t)gnp, (int32_t)n_gen, gen_a) < 0) goto done; /* warm-up */
        for (long r = 0; r < reps; r++)
            if ((tg[r] = gen_test(m, s, NULL, gprompt, (int32_t)gnp, (int32_t)n_gen, gen_a)) < 0) goto done;
        mean_std(tg, (int)reps, &gpm, &gpsd);
        if (spc.o.type != HM_SPEC_NONE) {
            hm_session_reset(s); /* draft-mtp opens on an empty session (its head sees every row) */
            if (cli_spec_open(&spc, e.cmd, s, NULL, &gsp)) goto done;
            if (gen_test(m, s, gsp, gprompt, (int32_t)gnp, (int32_t)n_gen, gen_b) < 0) goto done; /* warm-up */
            hm_spec_get_stats(gsp, &gst0);
            for (long r = 0; r < reps; r++)
                if ((tg[r] = gen_test(m, s, gsp, gprompt, (int32_t)gnp, (int32_t)n_gen, gen_b)) < 0) goto done;
            mean_std(tg, (int)reps, &gsm, &gssd);
            hm_spec_get_stats(gsp, &gst);
            gst.steps -= gst0.steps, gst.steps_drafted -= gst0.steps_drafted, gst.drafted -= gst0.drafted;
            gst.accepted -= gst0.accepted, gst.tokens -= gst0.tokens;
            gst.t_draft_s -= gst0.t_draft_s, gst.t_verify_s -= gst0.t_verify_s;
            gsame = !memcmp(gen_a, gen_b, (size_t)n_gen * sizeof *gen_a);
        }
    }
    double hit = -1; /* tg's share of routed units computed from VRAM */
    hm_usage us;         /* the whole run's usage (a model without experts has none) */
    const bool have_us = hm_model_usage(m, &us, NULL) == HM_OK;
    const int64_t vslots = have_us ? us.vram_slots : 0;
    if (n_gen && !e2e_only && cnt.on && (vslots > 0 || cnt.hits > 0))
        hit = cnt.hits + cnt.misses ? (double)cnt.hits / (double)(cnt.hits + cnt.misses) : 0.0;
    const char *backend = hm_placement_wants_gpu(&e.place) ? "CUDA" : "CPU";
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    const char *name = strrchr(e.model, '/') ? strrchr(e.model, '/') + 1 : e.model;
    double gib = (double)inf->file_bytes / (1024.0 * 1024 * 1024), bparams = (double)inf->n_params / 1e9;
    int th = hm_session_n_threads(s);
    if (json) {
        printf("{\"model\": \"%s\", \"arch\": \"%s\", \"size_bytes\": %llu, \"n_params\": %llu, \"n_threads\": %d, "
               "\"kv_type\": \"%s\", \"backend\": \"%s\", \"n_prompt\": %ld, \"n_gen\": %ld, \"n_depth\": %ld, "
               "\"repetitions\": %ld",
               name, inf->arch, (unsigned long long)inf->file_bytes, (unsigned long long)inf->n_params, th,
               hm_kv_type_name(e.kv_type), backend, n_prompt, n_gen, depth, reps);
        if (hit >= 0) printf(", \"vram_slots\": %lld, \"tg_vram_hit_rate\": %.4f", (long long)vslots, hit);
        if (n_prompt && !e2e_only) printf(", \"pp_tok_s\": %.3f, \"pp_tok_s_std\": %.3f", pm, psd);
        if (n_gen && !e2e_only) printf(", \"tg_tok_s\": %.3f, \"tg_tok_s_std\": %.3f", tm, tsd);
        if (gen_file) printf(", \"gen_tok_s\": %.3f, \"gen_tok_s_std\": %.3f", gpm, gpsd);
        if (gsp)
            printf(", \"spec_type\": \"%s\", \"gen_spec_tok_s\": %.3f, \"gen_spec_tok_s_std\": %.3f, \"spec_drafted\": %llu, "
                   "\"spec_accepted\": %llu, \"spec_steps\": %llu, \"spec_accept_rate\": %.4f, \"spec_same_tokens\": %s",
                   hm_spec_type_name(spc.o.type), gsm, gssd, (unsigned long long)gst.drafted,
                   (unsigned long long)gst.accepted, (unsigned long long)gst.steps,
                   gst.drafted ? (double)gst.accepted / (double)gst.drafted : 0.0, gsame ? "true" : "false");
        printf(", \"peak_rss_bytes\": %lld", (long long)ru.ru_maxrss * 1024);
        if (have_us)
            printf(", \"mlocked_bytes\": %llu, \"prefill_stream_units\": %llu, \"prefill_stream_bytes\": %llu, "
                   "\"prefill_stream_ahead\": %llu, \"prefill_stream_ahead_used\": %llu",
                   (unsigned long long)us.mlocked_bytes, (unsigned long long)us.stream_units,
                   (unsigned long long)us.stream_bytes, (unsigned long long)us.stream_ahead,
                   (unsigned long long)us.stream_ahead_used);
        if (e2e)
            printf(", \"e2e_ttft_s\": %.4f, \"e2e_decode_tok_s\": %.3f, \"e2e_decode100_tok_s\": %.3f, "
                   "\"e2e_total_s\": %.4f, \"e2e_cold_ttft_s\": %.4f, \"e2e_cold_decode100_tok_s\": %.3f, "
                   "\"e2e_cold_hit100\": %.4f, \"e2e_cold_hit\": %.4f, \"prompt_processing_model\": %s",
                   et[reps - 1].ttft, et[reps - 1].dec, et[reps - 1].dec100, et[reps - 1].total, et[0].ttft,
                   et[0].dec100, et[0].hit100, et[0].hit, ppo.model ? "true" : "false");
        if (t1.on) {
            const double ntg = (double)(reps * n_gen), acq = (double)(t1.acq - t0.acq), pred = (double)(t1.pred - t0.pred);
            printf(", \"ram_budget\": %lld, \"tg_ssd_bytes_per_tok\": %.1f, \"tg_ram_hit_rate\": %.4f",
                   (long long)t1.budget, (double)(t1.bytes - t0.bytes) / ntg,
                   acq > 0 ? (double)(t1.hits - t0.hits) / acq : 0.0);
            if (pred > 0)
                printf(", \"tg_prefetch_precision\": %.4f, \"tg_prefetch_recall\": %.4f",
                       (double)(t1.pred_used - t0.pred_used) / pred,
                       t1.acq_pred > t0.acq_pred ? (double)(t1.pred_used - t0.pred_used) / (double)(t1.acq_pred - t0.acq_pred) : 0.0);
        }
        printf("}\n");
    } else {
        printf("| model | size | params | backend | threads | test | t/s |\n");
        printf("| --- | ---: | ---: | --- | ---: | ---: | ---: |\n");
        char dep[32] = "";
        if (depth) snprintf(dep, sizeof dep, " @ d%ld", depth);
        if (n_prompt && !e2e_only)
            printf("| %s %s | %.2f GiB | %.2f B | %s | %d | pp%ld%s | %.2f ± %.2f |\n", inf->arch, name, gib, bparams,
                   backend, th, n_prompt, dep, pm, psd);
        if (n_gen && !e2e_only)
            printf("| %s %s | %.2f GiB | %.2f B | %s | %d | tg%ld%s | %.2f ± %.2f |\n", inf->arch, name, gib, bparams,
                   backend, th, n_gen, dep, tm, tsd);
        if (gen_file)
            printf("| %s %s | %.2f GiB | %.2f B | %s | %d | greedy %ld after %zu-token -f | %.2f ± %.2f |\n", inf->arch,
                   name, gib, bparams, backend, th, n_gen, gnp, gpm, gpsd);
        if (gsp)
            printf("| %s %s | %.2f GiB | %.2f B | %s | %d | greedy %ld + %s | %.2f ± %.2f |\n", inf->arch, name, gib,
                   bparams, backend, th, n_gen, hm_spec_type_name(spc.o.type), gsm, gssd);
    }
    if (!json) {
        if (t1.on) cli_tier_print(stderr, "bench", "tg", &t0, &t1, (uint64_t)(reps * n_gen));
        cli_tier_snap ta;
        cli_tier_get(m, &ta);
        cli_tier_print(stderr, "bench", "whole run", NULL, &ta, 0);
        if (hit >= 0)
            fprintf(stderr, "hotmoe bench: tg expert hit rate %.1f %% (%lld VRAM slots)\n", 100.0 * hit,
                    (long long)vslots);
        if (have_us && us.stream_units)
            fprintf(stderr, "hotmoe bench: prefill streaming (whole run): %llu units (%.2f GiB), %llu of them copied "
                    "a layer ahead, %llu of those routed\n", (unsigned long long)us.stream_units,
                    (double)us.stream_bytes / (1024.0 * 1024.0 * 1024.0), (unsigned long long)us.stream_ahead,
                    (unsigned long long)us.stream_ahead_used);
        if (have_us && us.mlocked_bytes)
            fprintf(stderr, "hotmoe bench: --mlock: %.2f GiB of experts locked in RAM\n",
                    (double)us.mlocked_bytes / (1024.0 * 1024.0 * 1024.0));
        if (have_us && us.gpu_pinned_bytes)
            fprintf(stderr, "hotmoe bench: --mlock: %.2f GiB of experts registered with CUDA, %llu copies to VRAM "
                    "straight from them\n", (double)us.gpu_pinned_bytes / (1024.0 * 1024.0 * 1024.0),
                    (unsigned long long)us.gpu_direct_fills);
        if (gsp) {
            cli_spec_print(stderr, "bench", "timed runs", &gst);
            fprintf(stderr, "hotmoe bench: speculation: %.2fx the plain greedy rate; tokens %s\n", gpm > 0 ? gsm / gpm : 0.0,
                    gsame ? "identical to plain greedy" : "DIFFER from plain greedy");
        }
        fprintf(stderr, "hotmoe bench: peak RSS %.1f MiB\n", (double)ru.ru_maxrss / 1024.0);
    }
    if (have_us) hm_usage_free(&us);
    rc = cli_engine_finish(&e, m);
done:
    free(et);
    cli_spec_close(&spc, gsp);
    free(gprompt);
    free(gen_a);
    free(gen_b);
    free(ids);
    free(pp);
    free(tg);
    hm_session_close(s);
    cli_pp_close(&ppo);
    hm_model_close(m);
    return rc;
}
