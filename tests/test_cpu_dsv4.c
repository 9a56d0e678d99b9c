/* test_cpu_dsv4.c - DeepSeek-V4's hyper-connection kernels (backend/cpu/cpu_dsv4.h) against a
 * double-precision reference written here from llama.cpp's graph (src/models/deepseek4.cpp:
 * build_hc_pre, build_hc_sinkhorn, build_hc_post): pre / post / Sinkhorn comb from random mixes,
 * the reduction and the post mixing, the clamped SwiGLU; and the comb's row and column sums after
 * 20 iterations (a doubly stochastic matrix up to eps). The attention kernel is checked end to end
 * against llama.cpp (tests/cli_llama_ref_deepseek4.sh). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_dsv4.h"
#include "core/threadpool.h"
#include "test.h"

#define HC 4
#define NT 5
#define E 48
#define W ((2 + HC) * HC)

static double sig(double v) { return 1.0 / (1.0 + exp(-v)); }

/* llama.cpp's order: softmax over dst, + eps, columns (over src), then (iters - 1) x rows, columns */
static void ref_mix(const float *m, const float *scale, const float *base, int iters, double eps, double *out) {
    for (int i = 0; i < HC; i++) out[i] = sig((double)m[i] * scale[0] + base[i]) + eps;
    for (int i = 0; i < HC; i++) out[HC + i] = 2.0 * sig((double)m[HC + i] * scale[1] + base[HC + i]);
    double c[HC][HC]; /* c[src][dst] */
    for (int s = 0; s < HC; s++) {
        double mx = -1e300, sum = 0;
        for (int d = 0; d < HC; d++) {
            c[s][d] = (double)m[2 * HC + d + HC * s] * scale[2] + base[2 * HC + d + HC * s];
            if (c[s][d] > mx) mx = c[s][d];
        }
        for (int d = 0; d < HC; d++) sum += (c[s][d] = exp(c[s][d] - mx));
        for (int d = 0; d < HC; d++) c[s][d] = c[s][d] / sum + eps;
    }
    for (int it = 0; it < iters; it++) {
        if (it) for (int s = 0; s < HC; s++) {
            double sum = 0;
            for (int d = 0; d < HC; d++) sum += c[s][d];
            for (int d = 0; d < HC; d++) c[s][d] /= sum + eps;
        }
        for (int d = 0; d < HC; d++) {
            double sum = 0;
            for (int s = 0; s < HC; s++) sum += c[s][d];
            for (int s = 0; s < HC; s++) c[s][d] /= sum + eps;
        }
    }
    for (int s = 0; s < HC; s++)
        for (int d = 0; d < HC; d++) out[2 * HC + d + HC * s] = c[s][d];
}

static float frand(unsigned *st) {
    *st = *st * 1103515245u + 12345u;
    return (float)((*st >> 8) & 0xffff) / 32768.0f - 1.0f;
}

int main(void) {
    hm_pool *pool = NULL;
    hm_err err = {{0}};
    CHECK(hm_pool_open(&pool, 2, &err) == HM_OK);
    unsigned st = 7;
    float mix[NT * W], scale[3] = {0.6f, 0.4f, 0.9f}, base[W];
    for (int i = 0; i < W; i++) base[i] = frand(&st);
    for (int i = 0; i < NT * W; i++) mix[i] = 3.0f * frand(&st);
    double ref[NT][W];
    for (int t = 0; t < NT; t++) ref_mix(mix + t * W, scale, base, 20, 1e-6, ref[t]);
    hm_dsv4_hc_mix(mix, NT, HC, false, scale, base, 20, 1e-6f);
    double worst = 0;
    for (int t = 0; t < NT; t++)
        for (int i = 0; i < W; i++) worst = fmax(worst, fabs(mix[t * W + i] - ref[t][i]));
    CHECKF(worst < 1e-5, "hc mix: max |diff| %.3g against the reference", worst);
    for (int t = 0; t < NT; t++) /* doubly stochastic up to eps */
        for (int k = 0; k < HC; k++) {
            double rs = 0, cs = 0;
            for (int j = 0; j < HC; j++) rs += mix[t * W + 2 * HC + j + HC * k], cs += mix[t * W + 2 * HC + k + HC * j];
            CHECKF(fabs(cs - 1) < 1e-4 && fabs(rs - 1) < 1e-3, "row %d: src %d sums %g, dst %d sums %g", t, k, rs, k, cs);
        }

    /* reduce and post against the plain sums */
    float x[NT * HC * E], f[NT * E], y[NT * E], out[NT * HC * E];
    for (int i = 0; i < NT * HC * E; i++) x[i] = frand(&st);
    for (int i = 0; i < NT * E; i++) f[i] = frand(&st);
    hm_dsv4_hc_reduce(pool, x, mix, W, NT, E, HC, y);
    hm_dsv4_hc_post(pool, f, x, mix, NT, E, HC, out);
    double wr = 0, wp = 0;
    for (int t = 0; t < NT; t++)
        for (int e = 0; e < E; e++) {
            double r = 0;
            for (int h = 0; h < HC; h++) r += (double)mix[t * W + h] * x[(t * HC + h) * E + e];
            wr = fmax(wr, fabs(r - y[t * E + e]));
            for (int d = 0; d < HC; d++) {
                double p = (double)mix[t * W + HC + d] * f[t * E + e];
                for (int s = 0; s < HC; s++) p += (double)mix[t * W + 2 * HC + d + HC * s] * x[(t * HC + s) * E + e];
                wp = fmax(wp, fabs(p - out[(t * HC + d) * E + e]));
            }
        }
    CHECKF(wr < 1e-5 && wp < 1e-5, "hc reduce %.3g, post %.3g", wr, wp);

    /* expand: row t's E values become HC copies */
    float ex[NT * HC * E];
    for (int i = 0; i < NT * E; i++) ex[i] = f[i];
    hm_dsv4_hc_expand(ex, NT, E, HC);
    int bad = 0;
    for (int t = 0; t < NT; t++)
        for (int h = 0; h < HC; h++) bad += memcmp(ex + (t * HC + h) * E, f + t * E, E * sizeof(float)) != 0;
    CHECK(bad == 0);

    /* clamped SwiGLU: silu(min(g, L)) * clamp(u, -L, L) */
    float g[64], u[64], o[64], u0[64];
    for (int i = 0; i < 64; i++) g[i] = 4 * frand(&st), u0[i] = u[i] = 4 * frand(&st);
    hm_dsv4_swiglu_clamp(pool, g, u, o, 64, 1.5f);
    double ws = 0;
    for (int i = 0; i < 64; i++) {
        const double gi = fmin(g[i], 1.5), ui = fmax(-1.5, fmin(u0[i], 1.5));
        ws = fmax(ws, fabs(gi / (1 + exp(-gi)) * ui - o[i]));
    }
    CHECKF(ws < 1e-6, "swiglu clamp: %.3g", ws);
    hm_pool_close(pool);
    return test_done();
}
