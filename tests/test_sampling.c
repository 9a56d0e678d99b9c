/* test_sampling.c - the samplers against expectations derived by hand.
 *
 * Logits are chosen as logs of round probabilities, so each filter's surviving set and the
 * renormalised frequencies can be written down without running anything. Frequencies are
 * checked over 40000 draws (std of a frequency <= 0.0025, tolerance 0.015 = 6 sigma). */
#include <math.h>
#include <string.h>

#include "hotmoe.h"
#include "test.h"

#define NV 6
#define DRAWS 40000

static void opts_plain(hm_sampler_opts *o) {
    hm_sampler_opts_default(o);
    o->temp = 1.0f;
    o->top_k = 0;
    o->top_p = 1.0f;
    o->min_p = 0.0f;
    o->repeat_penalty = 1.0f;
    o->seed = 1234;
}

/* Draw DRAWS tokens, histogram into freq[NV]. */
static void histogram(const hm_sampler_opts *o, const float *logits, double *freq) {
    hm_sampler *s = NULL;
    hm_err err;
    CHECK(hm_sampler_open(&s, NV, o, &err) == HM_OK);
    if (!s) return;
    int counts[NV] = {0};
    for (int i = 0; i < DRAWS; i++) {
        int32_t t = hm_sampler_sample(s, logits);
        CHECK(t >= 0 && t < NV);
        if (t >= 0 && t < NV) counts[t]++;
    }
    for (int i = 0; i < NV; i++) freq[i] = (double)counts[i] / DRAWS;
    hm_sampler_close(s);
}

int main(void) {
    /* probabilities 0.4 0.3 0.15 0.1 0.05 0.0 (as -inf-ish) */
    const double P[NV] = {0.4, 0.3, 0.15, 0.1, 0.05, 0.0};
    float logits[NV];
    for (int i = 0; i < NV; i++) logits[i] = P[i] > 0 ? (float)log(P[i]) : -1e30f;
    float copy[NV];
    memcpy(copy, logits, sizeof copy);
    hm_sampler_opts o;
    double f[NV];
    hm_err err;

    /* greedy */
    {
        opts_plain(&o);
        o.temp = 0;
        hm_sampler *s = NULL;
        CHECK(hm_sampler_open(&s, NV, &o, &err) == HM_OK);
        CHECK(hm_sampler_sample(s, logits) == 0);
        float tie[NV] = {1, 3, 3, 0, 0, 0};
        CHECK(hm_sampler_sample(s, tie) == 1); /* tie -> lower id */
        hm_sampler_close(s);
    }
    /* repetition penalty: token 0 seen; 2.0/1.5 = 1.333 < 1.9 -> greedy picks 1.
     * A negative logit is multiplied: -0.5*3 = -1.5 < -1.2, so with 0 and 1 seen (penalty 3):
     * 2/3 = 0.667 and 1.9/3 = 0.633, token 2 at 0.65 -> 0 still wins; with token 3 (-0.5) seen
     * and only 3 and 4 left, 4 (-1.2) wins. */
    {
        opts_plain(&o);
        o.temp = 0;
        o.repeat_penalty = 1.5f;
        hm_sampler *s = NULL;
        CHECK(hm_sampler_open(&s, NV, &o, &err) == HM_OK);
        float l[NV] = {2.0f, 1.9f, 0.0f, -5, -5, -5};
        CHECK(hm_sampler_sample(s, l) == 0);
        hm_sampler_accept(s, 0);
        hm_sampler_accept(s, 0); /* penalised once, not twice: 2/1.5/1.5 = 0.89 would not matter here */
        CHECK(hm_sampler_sample(s, l) == 1);
        CHECK(l[0] == 2.0f); /* input untouched */
        hm_sampler_close(s);

        o.repeat_penalty = 3.0f;
        CHECK(hm_sampler_open(&s, NV, &o, &err) == HM_OK);
        float l2[NV] = {2.0f, 1.9f, 0.65f, -0.5f, -1.2f, -9};
        hm_sampler_accept(s, 0);
        hm_sampler_accept(s, 1);
        CHECK(hm_sampler_sample(s, l2) == 0);
        float l3[NV] = {-9, -9, -9, -0.5f, -1.2f, -9};
        hm_sampler_reset(s);
        hm_sampler_accept(s, 3);
        CHECK(hm_sampler_sample(s, l3) == 4);
        hm_sampler_close(s);

        /* penalty once per distinct token: 2 seen twice with 1.5 -> 1.333 (> 1.3), twice would be 0.889 */
        o.repeat_penalty = 1.5f;
        CHECK(hm_sampler_open(&s, NV, &o, &err) == HM_OK);
        float l4[NV] = {2.0f, 1.3f, -9, -9, -9, -9};
        hm_sampler_accept(s, 0);
        hm_sampler_accept(s, 0);
        CHECK(hm_sampler_sample(s, l4) == 0);
        hm_sampler_close(s);

        /* window: repeat_last_n 2 forgets the oldest */
        o.repeat_last_n = 2;
        CHECK(hm_sampler_open(&s, NV, &o, &err) == HM_OK);
        hm_sampler_accept(s, 0);
        hm_sampler_accept(s, 4);
        hm_sampler_accept(s, 5);
        float l5[NV] = {2.0f, 1.9f, -9, -9, -9, -9};
        CHECK(hm_sampler_sample(s, l5) == 0); /* 0 fell out of the window */
        hm_sampler_close(s);
    }

    /* plain temperature 1: frequencies = P */
    opts_plain(&o);
    histogram(&o, logits, f);
    for (int i = 0; i < NV; i++) CHECK_NEAR(f[i], P[i], 0.015);

    /* top-k 2: {0.4, 0.3} -> 4/7, 3/7 */
    opts_plain(&o);
    o.top_k = 2;
    histogram(&o, logits, f);
    CHECK_NEAR(f[0], 4.0 / 7, 0.015);
    CHECK_NEAR(f[1], 3.0 / 7, 0.015);
    CHECK(f[2] == 0 && f[3] == 0 && f[4] == 0 && f[5] == 0);

    /* top-p 0.8: cumulative 0.4, 0.7, 0.85 >= 0.8 -> {0,1,2}: 0.4/0.85, 0.3/0.85, 0.15/0.85 */
    opts_plain(&o);
    o.top_p = 0.8f;
    histogram(&o, logits, f);
    CHECK_NEAR(f[0], 0.4 / 0.85, 0.015);
    CHECK_NEAR(f[1], 0.3 / 0.85, 0.015);
    CHECK_NEAR(f[2], 0.15 / 0.85, 0.015);
    CHECK(f[3] == 0 && f[4] == 0);

    /* top-k 3 then top-p 0.6 over the renormalised {0.4,0.3,0.15}/0.85 = 0.47, 0.82 -> {0,1} */
    opts_plain(&o);
    o.top_k = 3;
    o.top_p = 0.6f;
    histogram(&o, logits, f);
    CHECK_NEAR(f[0], 4.0 / 7, 0.015);
    CHECK(f[2] == 0);

    /* min-p 0.3: keep p >= 0.12 -> {0,1,2} */
    opts_plain(&o);
    o.min_p = 0.3f;
    histogram(&o, logits, f);
    CHECK_NEAR(f[2], 0.15 / 0.85, 0.015);
    CHECK(f[3] == 0 && f[4] == 0);

    /* temperature 0.5 on top-k 2: p^2 -> 0.16, 0.09 -> 0.64, 0.36 */
    opts_plain(&o);
    o.top_k = 2;
    o.temp = 0.5f;
    histogram(&o, logits, f);
    CHECK_NEAR(f[0], 0.64, 0.015);
    CHECK_NEAR(f[1], 0.36, 0.015);

    /* temperature 2 on all: sqrt(p) normalised */
    opts_plain(&o);
    o.temp = 2.0f;
    histogram(&o, logits, f);
    {
        double z = 0;
        for (int i = 0; i < NV; i++) z += sqrt(P[i]);
        for (int i = 0; i < NV; i++) CHECK_NEAR(f[i], sqrt(P[i]) / z, 0.015);
    }

    /* determinism: same seed, same sequence; reset replays it; another seed differs */
    {
        opts_plain(&o);
        hm_sampler *a = NULL, *b = NULL, *c = NULL;
        CHECK(hm_sampler_open(&a, NV, &o, &err) == HM_OK);
        CHECK(hm_sampler_open(&b, NV, &o, &err) == HM_OK);
        o.seed = 99;
        CHECK(hm_sampler_open(&c, NV, &o, &err) == HM_OK);
        int32_t seq[64];
        int same = 1, diff = 0;
        for (int i = 0; i < 64; i++) {
            seq[i] = hm_sampler_sample(a, logits);
            same &= seq[i] == hm_sampler_sample(b, logits);
            diff |= seq[i] != hm_sampler_sample(c, logits);
        }
        CHECK(same);
        CHECK(diff);
        hm_sampler_reset(a);
        same = 1;
        for (int i = 0; i < 64; i++) same &= seq[i] == hm_sampler_sample(a, logits);
        CHECK(same);
        hm_sampler_close(a);
        hm_sampler_close(b);
        hm_sampler_close(c);
    }
    CHECK(memcmp(copy, logits, sizeof copy) == 0);

    /* bad input */
    {
        hm_sampler *s = (hm_sampler *)&o;
        CHECK(hm_sampler_open(&s, 0, NULL, &err) == HM_ERR_ARG && s == NULL);
        hm_sampler_close(NULL);
    }
    return test_done();
}
