/* test_batch_eval.c - hm_batch_eval (several sessions, one forward pass) against each session alone.
 *
 * For a model (the transformers tiny qwen3moe fixture, f32 weights; and a tiny synth q4_k_m),
 * three "batched" sessions and three "alone" sessions (the same model opened a second time, so the
 * expert stores are separate) are fed the same tokens: prompts of different lengths (5, 11, 3:
 * different positions from then on), several decode rounds (each session's greedy token), a
 * round where one session is absent and a round mixing a 4-token chunk with single tokens. The
 * batched sessions go through hm_batch_eval (session 0 with n_ubatch 8, so the 19 prompt rows take
 * several passes and sequence 1's 11 tokens are split across passes), the alone sessions through
 * hm_session_eval. Their last-token logits must agree to BOUND (see docs/ENGINE.md: the batched
 * pass quantises and multiplies each row as the single pass does, so differences come only from
 * kernels whose accumulation order depends on the number of rows; measured 0 here).
 * The batched model's expert store must count each pass's routing: per layer, total rows x k
 * (decode: n_seq x k in every layer; prompt passes: all rows in layers < last).
 * Also the argument errors (a session twice, other model, thread counts, context overflow) and
 * that the comparison can fail (the sessions' logits differ from each other). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hotmoe_tools.h"
#include "test.h"

#define NS 3
#define BOUND 1e-4 /* relative to max(1, max |logit|) */

static double max_rel_diff(const float *a, const float *b, int32_t n) {
    double md = 0, mx = 1;
    for (int32_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > md) md = d;
        if (fabs((double)b[i]) > mx) mx = fabs((double)b[i]);
    }
    return md / mx;
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Sum of the store's counts per layer into tot[n_layer]. */
static void layer_totals(const hm_model *m, uint64_t *tot, int32_t n_layer) {
    hm_usage u;
    hm_err err;
    memset(tot, 0, (size_t)n_layer * sizeof *tot);
    if (hm_model_usage(m, &u, &err) != HM_OK) return;
    for (int32_t l = 0; l < u.n_layer && l < n_layer; l++)
        for (int32_t e = 0; e < u.n_expert; e++) tot[l] += u.counts[(size_t)l * (size_t)u.n_expert + (size_t)e];
    hm_usage_free(&u);
}

static double worst;

/* Run one round: sequence i gets toks[i][0..n[i]) (n[i] == 0: absent). Compares logits. */
static void round_(hm_session **bs, hm_session **as, hm_model *mb, int32_t (*toks)[16], const int32_t *n,
                   int32_t n_vocab, int32_t n_layer, int32_t k, const char *what) {
    hm_session *sel[NS];
    const int32_t *tp[NS];
    int32_t nn[NS];
    int map[NS], ns = 0;
    int32_t rows = 0, n_last = 0;
    for (int i = 0; i < NS; i++) {
        if (!n[i]) continue;
        sel[ns] = bs[i];
        tp[ns] = toks[i];
        nn[ns] = n[i];
        map[ns++] = i;
        rows += n[i];
    }
    uint64_t before[64], after[64];
    layer_totals(mb, before, n_layer);
    const float *lb[NS];
    hm_err err = {{0}};
    hm_status st = hm_batch_eval(sel, tp, nn, ns, lb, &err);
    CHECKF(st == HM_OK, "%s: %s", what, err.msg);
    if (st != HM_OK) return;
    layer_totals(mb, after, n_layer);
    for (int j = 0; j < ns; j++) {
        const int i = map[j];
        const float *la;
        st = hm_session_eval(as[i], toks[i], n[i], false, &la, &err);
        CHECKF(st == HM_OK, "%s alone %d: %s", what, i, err.msg);
        if (st != HM_OK) return;
        CHECK(hm_session_n_past(as[i]) == hm_session_n_past(bs[i]));
        double d = max_rel_diff(lb[j], la, n_vocab);
        if (d > worst) worst = d;
        CHECKF(d <= BOUND, "%s: sequence %d (pos %d): max relative logit difference %.3g > %g", what, i,
               hm_session_n_past(bs[i]), d, BOUND);
        n_last++;
        toks[i][0] = argmax(la, n_vocab); /* next round's token */
    }
    /* store: layers < last count every row; the last layer only the rows whose logits are wanted
     * (one per sequence per pass it ends in; with the sequences' pieces all in one pass for
     * decode rounds, n_seq) */
    for (int32_t l = 0; l + 1 < n_layer; l++)
        CHECKF(after[l] - before[l] == (uint64_t)rows * (uint64_t)k, "%s: layer %d counted %llu, want %d x %d", what,
               l, (unsigned long long)(after[l] - before[l]), rows, k);
    CHECKF(after[n_layer - 1] - before[n_layer - 1] == (uint64_t)n_last * (uint64_t)k,
           "%s: last layer counted %llu, want %d x %d", what,
           (unsigned long long)(after[n_layer - 1] - before[n_layer - 1]), n_last, k);
}

static void run_model(const char *path, const char *label) {
    hm_err err = {{0}};
    hm_model *mb = NULL, *ma = NULL, *mo = NULL;
    hm_status st = hm_model_open(&mb, path, NULL, &err);
    CHECKF(st == HM_OK, "%s: %s", path, err.msg);
    if (st != HM_OK) return;
    CHECK(hm_model_open(&ma, path, NULL, &err) == HM_OK);
    CHECK(hm_model_open(&mo, path, NULL, &err) == HM_OK);
    const hm_model_info *inf = hm_model_get_info(mb);
    const int32_t V = inf->n_vocab, L = inf->n_layer, K = inf->n_expert_used;
    hm_session *bs[NS], *as[NS], *other = NULL, *t3 = NULL;
    hm_session_opts so;
    hm_session_opts_default(&so);
    so.n_ctx = 64;
    so.n_threads = 2;
    for (int i = 0; i < NS; i++) {
        so.n_ubatch = i == 0 ? 8 : 0;
        CHECK(hm_session_open(&bs[i], mb, &so, &err) == HM_OK);
        so.n_ubatch = 0;
        CHECK(hm_session_open(&as[i], ma, &so, &err) == HM_OK);
    }
    CHECK(hm_session_open(&other, mo, &so, &err) == HM_OK);
    so.n_threads = 3;
    CHECK(hm_session_open(&t3, mb, &so, &err) == HM_OK);

    /* argument errors: nothing evaluated */
    {
        int32_t t[1] = {1};
        const int32_t *tp[2] = {t, t};
        const int32_t nn[2] = {1, 1};
        hm_session *dup[2] = {bs[0], bs[0]}, *om[2] = {bs[0], other}, *tt[2] = {bs[0], t3};
        CHECK(hm_batch_eval(dup, tp, nn, 2, NULL, &err) == HM_ERR_ARG && strstr(err.msg, "also session"));
        CHECK(hm_batch_eval(om, tp, nn, 2, NULL, &err) == HM_ERR_ARG && strstr(err.msg, "another model"));
        CHECK(hm_batch_eval(tt, tp, nn, 2, NULL, &err) == HM_ERR_ARG && strstr(err.msg, "threads"));
        const int32_t big[2] = {1, 65};
        int32_t many[65] = {0};
        const int32_t *tp2[2] = {t, many};
        hm_session *two[2] = {bs[0], bs[1]};
        CHECK(hm_batch_eval(two, tp2, big, 2, NULL, &err) == HM_ERR_ARG && strstr(err.msg, "do not fit"));
        t[0] = V;
        CHECK(hm_batch_eval(two, tp, nn, 2, NULL, &err) == HM_ERR_ARG && strstr(err.msg, "vocabulary"));
        CHECK(hm_session_n_past(bs[0]) == 0 && hm_session_n_past(bs[1]) == 0);
    }

    worst = 0;
    int32_t toks[NS][16];
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < NS; i++)
        for (int j = 0; j < 16; j++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            toks[i][j] = (int32_t)((rng >> 33) % (uint64_t)V);
        }
    const int32_t prompt[NS] = {5, 11, 3};
    int32_t prompt0[16];
    memcpy(prompt0, toks[0], sizeof prompt0);
    round_(bs, as, mb, toks, prompt, V, L, K, "prompt");
    {
        /* a session with another thread count has its own pool (not the model's shared one) and
         * gives the same logits (-t 2 vs -t 3: equal within rounding) */
        const float *l3, *l2;
        CHECK(hm_session_eval(t3, prompt0, 5, false, &l3, &err) == HM_OK);
        hm_session *t2 = NULL;
        so.n_threads = 2;
        CHECK(hm_session_open(&t2, mb, &so, &err) == HM_OK);
        CHECK(hm_session_eval(t2, prompt0, 5, false, &l2, &err) == HM_OK);
        CHECKF(max_rel_diff(l3, l2, V) <= BOUND, "-t 3 vs -t 2: %.3g", max_rel_diff(l3, l2, V));
        hm_session_close(t2);
    }
    /* sanity: the comparison can fail (different sequences have different logits) */
    {
        const float *l0, *l1;
        int32_t t = 7;
        hm_session_opts s2;
        hm_session_opts_default(&s2);
        s2.n_ctx = 16;
        s2.n_threads = 2;
        hm_session *p0 = NULL, *p1 = NULL;
        CHECK(hm_session_open(&p0, ma, &s2, &err) == HM_OK && hm_session_open(&p1, ma, &s2, &err) == HM_OK);
        CHECK(hm_session_eval(p0, toks[0], 5, false, &l0, &err) == HM_OK);
        CHECK(hm_session_eval(p1, &t, 1, false, &l1, &err) == HM_OK);
        CHECKF(max_rel_diff(l0, l1, V) > 100 * BOUND, "different sequences gave the same logits");
        hm_session_close(p0);
        hm_session_close(p1);
    }
    for (int r = 0; r < 6; r++) {
        const int32_t one[NS] = {1, 1, 1};
        char w[32];
        snprintf(w, sizeof w, "decode %d", r);
        round_(bs, as, mb, toks, one, V, L, K, w);
    }
    {
        const int32_t some[NS] = {1, 0, 1};
        round_(bs, as, mb, toks, some, V, L, K, "decode, sequence 1 absent");
    }
    {
        for (int j = 1; j < 4; j++) toks[2][j] = (toks[2][0] + 31 * j) % V;
        const int32_t mixed[NS] = {1, 1, 4};
        round_(bs, as, mb, toks, mixed, V, L, K, "mixed chunk");
    }
    for (int r = 0; r < 3; r++) {
        const int32_t one[NS] = {1, 1, 1};
        round_(bs, as, mb, toks, one, V, L, K, "decode after mixed");
    }
    fprintf(stderr, "%s: worst relative logit difference batched vs alone: %.3g\n", label, worst);
    for (int i = 0; i < NS; i++) {
        hm_session_close(bs[i]);
        hm_session_close(as[i]);
    }
    hm_session_close(other);
    hm_session_close(t3);
    hm_model_close(mb);
    hm_model_close(ma);
    hm_model_close(mo);
}

/* An arch without forward_multi: n_seq > 1 is HM_ERR_UNSUPPORTED and evaluates nothing (the
 * server then loops over its slots); n_seq == 1 is hm_session_eval. */
static void unsupported(const char *path) {
    hm_err err = {{0}};
    hm_model *m = NULL;
    hm_status st = hm_model_open(&m, path, NULL, &err);
    CHECKF(st == HM_OK, "%s: %s", path, err.msg);
    if (st != HM_OK) return;
    hm_session_opts so;
    hm_session_opts_default(&so);
    so.n_ctx = 32;
    so.n_threads = 2;
    hm_session *a = NULL, *b = NULL;
    CHECK(hm_session_open(&a, m, &so, &err) == HM_OK && hm_session_open(&b, m, &so, &err) == HM_OK);
    int32_t t[2] = {1, 2};
    const int32_t *tp[2] = {t, t + 1};
    const int32_t nn[2] = {2, 1};
    hm_session *ss[2] = {a, b};
    const float *lg[2];
    CHECKF(hm_batch_eval(ss, tp, nn, 2, lg, &err) == HM_ERR_UNSUPPORTED, "%s: %s", path, err.msg);
    CHECK(hm_session_n_past(a) == 0 && hm_session_n_past(b) == 0 && lg[0] == NULL);
    CHECK(hm_batch_eval(ss, tp, nn, 1, lg, &err) == HM_OK && lg[0] && hm_session_n_past(a) == 2);
    hm_session_close(a);
    hm_session_close(b);
    hm_model_close(m);
}

int main(void) {
    run_model(test_src_path("tests/fixtures/qwen3moe_tiny/model.gguf"), "qwen3moe_tiny (f32)");
    unsupported(test_src_path("tests/fixtures/hf_ref/qwen35moe/model.gguf"));
    unsupported(test_src_path("tests/fixtures/hf_ref/gemma4/model.gguf"));
    char path[] = "/tmp/hm_batch_eval_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
    hm_synth_opts o = {.arch = "qwen3moe", .preset = "tiny", .type = "q4_k_m", .seed = 7, .out_path = path,
                       .n_threads = 2};
    hm_err err = {{0}};
    hm_status st = hm_synth(&o, &err);
    CHECKF(st == HM_OK, "synth: %s", err.msg);
    if (st == HM_OK) run_model(path, "synth tiny q4_k_m");
    unlink(path);
    return test_done();
}
