/* test_spec_dist.c - with sampling, speculative decoding's output follows the target's distribution:
 * a chi-square test of the first two tokens it emits after a fixed history, over many seeds, against
 * the exact joint distribution computed independently from plain one-token evaluations of the same
 * model (p(y1) p(y2 | y1), each the sampler's own distribution: temperature 1 over the top 5).
 *
 * Setup: the bundled model (models/tiny-qwen3moe-q8_0.gguf) as target and, opened a second time,
 * as its draft (draft-simple, n_max 1: the draft is the greedy token, so it is accepted with the
 * probability the sampler gives it, and rejected otherwise); each run trims the target back to the
 * history and samples with its own seed until two tokens are out (one step when the draft was kept,
 * two when it was not). Cells with an expected count below 5 are pooled. The bound is the chi-square
 * quantile at p = 1e-6 (Wilson-Hilferty, 72.9 for 24 degrees of freedom): the rule as it is gives
 * 18.1; emitting the draft token in place of the target's pick on a rejection (speculative.c broken
 * on purpose, then restored) gave 2969 and failed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hotmoe.h"
#include "test.h"

#define NRUN 2000
#define TOPK 5

/* The sampler's distribution: softmax at temperature 1 over the TOPK largest logits. */
static void topk_dist(const float *lg, int32_t nv, int32_t *ids, double *p) {
    for (int i = 0; i < TOPK; i++) ids[i] = -1;
    for (int32_t t = 0; t < nv; t++) {
        int j = TOPK;
        while (j > 0 && (ids[j - 1] < 0 || lg[t] > lg[ids[j - 1]])) j--;
        if (j >= TOPK) continue;
        memmove(ids + j + 1, ids + j, (size_t)(TOPK - 1 - j) * sizeof *ids);
        ids[j] = t;
    }
    double s = 0;
    for (int i = 0; i < TOPK; i++) s += (p[i] = exp((double)lg[ids[i]] - (double)lg[ids[0]]));
    for (int i = 0; i < TOPK; i++) p[i] /= s;
}

static hm_session *session(hm_model *m) {
    hm_session_opts so;
    hm_session_opts_default(&so);
    so.n_ctx = 64;
    so.n_threads = 2;
    hm_session *s = NULL;
    hm_err err;
    CHECKF(hm_session_open(&s, m, &so, &err) == HM_OK, "session: %s", err.msg);
    return s;
}

int main(void) {
    hm_model *m = NULL, *d = NULL;
    hm_err err;
    const char *path = test_src_path("models/tiny-qwen3moe-q8_0.gguf");
    if (hm_model_open(&m, path, NULL, &err) != HM_OK || hm_model_open(&d, path, NULL, &err) != HM_OK) {
        CHECKF(0, "open: %s", err.msg);
        return test_done();
    }
    const int32_t nv = hm_model_n_vocab(m);
    const int32_t prompt[6] = {300, 1200, 57, 800, 2048, 99};
    const int32_t P = 6;
    /* the reference: plain one-token evaluations */
    hm_session *r = session(m);
    const float *lg;
    int32_t x0 = 0, id1[TOPK], id2[TOPK][TOPK];
    double p1[TOPK], p2[TOPK][TOPK];
    if (!r || hm_session_eval(r, prompt, P, false, &lg, &err) != HM_OK) {
        CHECKF(0, "%s", err.msg);
        return test_done();
    }
    for (int32_t t = 1; t < nv; t++)
        if (lg[t] > lg[x0]) x0 = t;
    CHECK(hm_session_eval(r, &x0, 1, false, &lg, &err) == HM_OK);
    topk_dist(lg, nv, id1, p1);
    for (int i = 0; i < TOPK; i++) {
        CHECK(hm_session_trim(r, P + 1, &err) == HM_OK);
        CHECK(hm_session_eval(r, &id1[i], 1, false, &lg, &err) == HM_OK);
        topk_dist(lg, nv, id2[i], p2[i]);
    }
    hm_session_close(r);
    /* speculation, NRUN seeds */
    static long cnt[TOPK][TOPK];
    long other = 0;
    hm_session *s = session(m);
    hm_spec_opts so;
    hm_spec_opts_default(&so);
    so.type = HM_SPEC_DRAFT_SIMPLE;
    so.draft = d;
    so.n_max = 1;
    hm_spec *sp = NULL;
    CHECKF(s && hm_spec_open(&sp, s, &so, &err) == HM_OK, "spec: %s", err.msg);
    if (sp && hm_session_eval(s, prompt, P, false, &lg, &err) == HM_OK && hm_spec_add(sp, prompt, P, &err) == HM_OK) {
        uint64_t kept = 0;
        for (int run = 0; run < NRUN; run++) {
            hm_sampler_opts o = {.temp = 1.0f, .top_k = TOPK, .top_p = 1.0f, .min_p = 0.0f, .repeat_penalty = 1.0f,
                                 .seed = 1000u + (uint64_t)run};
            hm_sampler *smp = NULL;
            if (hm_sampler_open(&smp, nv, &o, &err) != HM_OK) break;
            hm_session_trim(s, P, &err);
            hm_spec_trim(sp, P);
            int32_t out[2], got = 0, k = 0;
            if (hm_spec_step(sp, smp, x0, 2, out, &k, &err) != HM_OK) break;
            got = k;
            kept += k == 2;
            if (got == 1 && hm_spec_step(sp, smp, out[0], 1, out + 1, &k, &err) == HM_OK) got += k;
            hm_sampler_close(smp);
            int a = -1, b = -1;
            for (int i = 0; i < TOPK; i++)
                if (id1[i] == out[0]) a = i;
            for (int j = 0; a >= 0 && got == 2 && j < TOPK; j++)
                if (id2[a][j] == out[1]) b = j;
            if (a >= 0 && b >= 0) cnt[a][b]++;
            else other++;
        }
        fprintf(stderr, "%d runs, the draft kept in %llu\n", NRUN, (unsigned long long)kept);
        CHECKF(kept > NRUN / 20 && kept < NRUN - NRUN / 20, "the draft was kept in %llu of %d runs: nothing tested",
               (unsigned long long)kept, NRUN);
    } else {
        CHECKF(0, "%s", err.msg);
    }
    /* chi-square over the cells with an expected count of at least 5, the rest pooled */
    double chi = 0, pool_e = 0;
    long pool_o = other;
    int cells = 0;
    for (int i = 0; i < TOPK; i++)
        for (int j = 0; j < TOPK; j++) {
            const double e = (double)NRUN * p1[i] * p2[i][j];
            if (e < 5) {
                pool_e += e;
                pool_o += cnt[i][j];
                continue;
            }
            chi += ((double)cnt[i][j] - e) * ((double)cnt[i][j] - e) / e;
            cells++;
        }
    if (pool_e > 0) {
        chi += ((double)pool_o - pool_e) * ((double)pool_o - pool_e) / (pool_e > 1e-9 ? pool_e : 1e-9);
        cells++;
    }
    const double df = cells - 1, z = 4.7534; /* one-sided p = 1e-6 */
    const double bound = df * pow(1.0 - 2.0 / (9.0 * df) + z * sqrt(2.0 / (9.0 * df)), 3.0);
    fprintf(stderr, "chi-square %.2f over %d cells (df %.0f), bound %.2f (p = 1e-6); pooled: observed %ld, expected %.2f\n",
            chi, cells, df, bound, pool_o, pool_e);
    CHECKF(cells >= 6 && chi < bound, "chi-square %.2f >= %.2f: the emitted tokens do not follow the target's distribution",
           chi, bound);
    hm_spec_close(sp);
    hm_session_close(s);
    hm_model_close(d);
    hm_model_close(m);
    return test_done();
}
