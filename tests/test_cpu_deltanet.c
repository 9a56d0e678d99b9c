/* test_cpu_deltanet.c - the linear-attention CPU ops (cpu_deltanet.h) against plain double
 * references written from the definitions, plus the properties the forward pass relies on:
 *  - state carried across calls: running n tokens as one call or as pieces (1, 3, rest) gives the
 *    same outputs and final state (conv window and delta state);
 *  - thread-count invariance: pools of 1 and 3 threads give bit-identical results;
 *  - the tiled V-head -> key-head mapping (value head j uses key head j % n_k) and the grouped one
 *    (Qwen3-Next: key head j / (n_v / n_k)), the latter as the former on renumbered heads;
 *  - the chunked delta rule against the token-by-token one (its reference) at the model's head
 *    shapes, over several chunk boundaries, a state carried in and out, and calls cut into pieces:
 *    max |chunked - seq| / max |seq| < 1e-4 for outputs and the final state. f32 gives ~1e-7 per
 *    rounding; the products sum d_k = 128 terms and the chunk's solve ~64 more, and the errors
 *    of both paths compound along the recurrence, so 1e-4 leaves ~100x headroom over what it
 *    measures (printed) while catching any wrong decay, mask or index (errors of order 1). */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_deltanet.h"
#include "test.h"

static uint32_t rng = 1u;
static float frand(void) {
    rng = rng * 1664525u + 1013904223u;
    return (float)((rng >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static double maxdiff(const float *a, const float *b, size_t n) {
    double d = 0;
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - (double)b[i]));
    return d;
}

enum { T = 11, C = 24, K = 4, NK = 2, NV = 6, DK = 8, DV = 5 };

static void test_conv(hm_pool *p1, hm_pool *p3) {
    static float x[T * C], w[C * K], st0[(K - 1) * C], out_ref[T * C];
    for (size_t i = 0; i < T * C; i++) x[i] = frand();
    for (size_t i = 0; i < C * K; i++) w[i] = frand();
    for (size_t i = 0; i < (K - 1) * C; i++) st0[i] = frand();
    /* reference: in(s) = st0 row K-1+s for s < 0 */
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) {
            double acc = 0;
            for (int j = 0; j < K; j++) {
                int s = t - (K - 1) + j;
                acc += (double)w[c * K + j] * (s < 0 ? st0[(K - 1 + s) * C + c] : x[s * C + c]);
            }
            out_ref[t * C + c] = (float)(acc / (1.0 + exp(-acc)));
        }
    float st1[(K - 1) * C], st3[(K - 1) * C], o1[T * C], o3[T * C];
    memcpy(st1, st0, sizeof st1);
    hm_cpu_ssm_conv(p1, x, C, T, C, w, K, st1, o1);
    CHECKF(maxdiff(o1, out_ref, T * C) < 1e-5, "conv vs reference: %g", maxdiff(o1, out_ref, T * C));
    CHECK(memcmp(st1, x + (T - (K - 1)) * C, sizeof st1) == 0); /* the last K-1 inputs */
    /* in pieces of 1, 1, 3, rest on 3 threads: same outputs, same final state */
    memcpy(st3, st0, sizeof st3);
    const int cuts[] = {0, 1, 2, 5, T};
    for (int i = 0; i + 1 < (int)(sizeof cuts / sizeof cuts[0]); i++)
        hm_cpu_ssm_conv(p3, x + cuts[i] * C, C, cuts[i + 1] - cuts[i], C, w, K, st3, o3 + cuts[i] * C);
    CHECK(memcmp(o1, o3, sizeof o1) == 0);
    CHECK(memcmp(st1, st3, sizeof st1) == 0);
}

static void test_delta(hm_pool *p1, hm_pool *p3) {
    /* q/k rows carry padding (stride > n_k d_k) as the conv output does */
    enum { QS = NK * DK + 3, VS = NV * DV + 2 };
    static float q[T * QS], k[T * QS], v[T * VS], g[T * NV], beta[T * NV], s0[NV * DK * DV];
    for (size_t i = 0; i < T * QS; i++) q[i] = frand(), k[i] = frand();
    for (size_t i = 0; i < T * VS; i++) v[i] = frand();
    for (size_t i = 0; i < T * NV; i++) g[i] = -fabsf(frand()), beta[i] = 0.5f + 0.5f * frand();
    for (size_t i = 0; i < NV * DK * DV; i++) s0[i] = 0.1f * frand();
    /* reference in double */
    static double S[NV][DK][DV];
    static float out_ref[T * NV * DV];
    for (int h = 0; h < NV; h++)
        for (int i = 0; i < DK; i++)
            for (int j = 0; j < DV; j++) S[h][i][j] = s0[(h * DK + i) * DV + j];
    for (int t = 0; t < T; t++)
        for (int h = 0; h < NV; h++) {
            const int kh = h % NK;
            const float *qt = q + t * QS + kh * DK, *kt = k + t * QS + kh * DK, *vt = v + t * VS + h * DV;
            const double dec = exp((double)g[t * NV + h]);
            for (int i = 0; i < DK; i++)
                for (int j = 0; j < DV; j++) S[h][i][j] *= dec;
            for (int j = 0; j < DV; j++) {
                double kv = 0;
                for (int i = 0; i < DK; i++) kv += S[h][i][j] * kt[i];
                const double delta = (vt[j] - kv) * beta[t * NV + h];
                for (int i = 0; i < DK; i++) S[h][i][j] += kt[i] * delta;
            }
            for (int j = 0; j < DV; j++) {
                double o = 0;
                for (int i = 0; i < DK; i++) o += S[h][i][j] * qt[i];
                out_ref[(t * NV + h) * DV + j] = (float)o;
            }
        }
    static float st1[NV * DK * DV], st3[NV * DK * DV], o1[T * NV * DV], o3[T * NV * DV], sref[NV * DK * DV];
    for (int h = 0; h < NV; h++)
        for (int i = 0; i < DK; i++)
            for (int j = 0; j < DV; j++) sref[(h * DK + i) * DV + j] = (float)S[h][i][j];
    memcpy(st1, s0, sizeof st1);
    hm_cpu_gated_delta_seq(p1, q, k, QS, v, VS, g, beta, T, NK, NV, false, DK, DV, st1, o1);
    CHECKF(maxdiff(o1, out_ref, T * NV * DV) < 1e-4, "delta vs reference: %g", maxdiff(o1, out_ref, T * NV * DV));
    CHECKF(maxdiff(st1, sref, NV * DK * DV) < 1e-4, "delta state vs reference: %g", maxdiff(st1, sref, NV * DK * DV));
    memcpy(st3, s0, sizeof st3);
    const int cuts[] = {0, 1, 4, T};
    for (int i = 0; i + 1 < (int)(sizeof cuts / sizeof cuts[0]); i++)
        hm_cpu_gated_delta_seq(p3, q + cuts[i] * QS, k + cuts[i] * QS, QS, v + cuts[i] * VS, VS, g + cuts[i] * NV,
                               beta + cuts[i] * NV, cuts[i + 1] - cuts[i], NK, NV, false, DK, DV, st3,
                               o3 + cuts[i] * NV * DV);
    CHECK(memcmp(o1, o3, sizeof o1) == 0);
    CHECK(memcmp(st1, st3, sizeof st1) == 0);
}

static void test_l2(hm_pool *p3) {
    enum { XS = 3 * DK + 1 };
    float x[T * XS], y[T * XS];
    for (size_t i = 0; i < T * XS; i++) x[i] = y[i] = frand();
    hm_cpu_l2norm_heads(p3, y, XS, T, 3, DK, 1e-6f, 0.5f);
    double d = 0;
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < 3; h++) {
            double ss = 0;
            for (int i = 0; i < DK; i++) ss += (double)x[t * XS + h * DK + i] * x[t * XS + h * DK + i];
            for (int i = 0; i < DK; i++)
                d = fmax(d, fabs(y[t * XS + h * DK + i] - 0.5 * x[t * XS + h * DK + i] / sqrt(ss + 1e-6)));
        }
        CHECK(y[t * XS + 3 * DK] == x[t * XS + 3 * DK]); /* padding untouched */
    }
    CHECKF(d < 1e-6, "l2norm: %g", d);
}

/* Rows of n_head * d (stride xs) L2-normalised per head, times scale (as the forward pass does). */
static void l2rows(float *x, int64_t xs, int64_t n, int n_head, int d, float scale) {
    for (int64_t t = 0; t < n; t++)
        for (int h = 0; h < n_head; h++) {
            float *r = x + t * xs + h * d;
            double ss = 0;
            for (int i = 0; i < d; i++) ss += (double)r[i] * r[i];
            for (int i = 0; i < d; i++) r[i] = (float)(r[i] * scale / sqrt(ss + 1e-6));
        }
}

static double relerr(const float *a, const float *ref, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)ref[i]));
    return maxdiff(a, ref, n) / (m > 0 ? m : 1);
}

/* Chunked vs token by token for one head shape: n_tok tokens from a random state, as one call and
 * in the pieces cuts[] (state carried between calls), on 1 and 3 threads. */
static void test_chunked_shape(hm_pool *p1, hm_pool *p3, int nk, int nv, bool gr, int dk, int dv, int n,
                               const int *cuts, int n_cuts) {
    const int64_t qs = (int64_t)nk * dk + 3, vs = (int64_t)nv * dv + 1; /* padded rows, as the conv output */
    const size_t ns = (size_t)nv * (size_t)dk * (size_t)dv, no = (size_t)n * (size_t)nv * (size_t)dv;
    float *q = malloc((size_t)n * (size_t)qs * sizeof(float)), *k = malloc((size_t)n * (size_t)qs * sizeof(float));
    float *v = malloc((size_t)n * (size_t)vs * sizeof(float)), *g = malloc((size_t)n * (size_t)nv * sizeof(float));
    float *beta = malloc((size_t)n * (size_t)nv * sizeof(float)), *s0 = malloc(ns * sizeof(float));
    float *sr = malloc(ns * sizeof(float)), *sc = malloc(ns * sizeof(float)), *sp = malloc(ns * sizeof(float));
    float *orf = malloc(no * sizeof(float)), *oc = malloc(no * sizeof(float)), *op = malloc(no * sizeof(float));
    hm_scratch scr = {NULL, hm_cpu_gated_delta_scratch_size(dk, dv, 3)};
    scr.data = malloc(scr.size); /* unaligned on purpose: the op aligns inside */
    for (int64_t i = 0; i < n * qs; i++) q[i] = frand(), k[i] = frand();
    for (int64_t i = 0; i < n * vs; i++) v[i] = frand();
    l2rows(q, qs, n, nk, dk, 1.0f / sqrtf((float)dk));
    l2rows(k, qs, n, nk, dk, 1.0f);
    for (int64_t i = 0; i < (int64_t)n * nv; i++) {
        /* decays as the model makes them (a * softplus): mostly mild, some strong (down to e^-8) */
        const float x = 0.5f + 0.5f * frand();
        g[i] = i % 17 == 3 ? -8.0f * x : -0.7f * x * x;
        beta[i] = 1.0f / (1.0f + expf(-3.0f * frand()));
    }
    for (size_t i = 0; i < ns; i++) s0[i] = frand();
    memcpy(sr, s0, ns * sizeof(float));
    hm_cpu_gated_delta_seq(p1, q, k, qs, v, vs, g, beta, n, nk, nv, gr, dk, dv, sr, orf);
    /* one chunked call, 1 thread */
    memcpy(sc, s0, ns * sizeof(float));
    hm_cpu_gated_delta_chunked(p1, q, k, qs, v, vs, g, beta, n, nk, nv, gr, dk, dv, sc, oc, &scr);
    const double eo = relerr(oc, orf, no), es = relerr(sc, sr, ns);
    fprintf(stderr, "chunked vs seq: %d/%d heads%s, d_k %d, d_v %d, %d tokens: out %.2g, state %.2g (relative)\n",
            nk, nv, gr ? " grouped" : "", dk, dv, n, eo, es);
    CHECKF(eo < 1e-4, "chunked out vs seq: %g", eo);
    CHECKF(es < 1e-4, "chunked state vs seq: %g", es);
    /* the dispatcher takes the path it says: the same bits (and 3 threads = 1 thread) */
    memcpy(sp, s0, ns * sizeof(float));
    hm_cpu_gated_delta(p3, q, k, qs, v, vs, g, beta, n, nk, nv, gr, dk, dv, sp, op, &scr);
    const bool chunks = hm_cpu_gated_delta_chunks(n);
    CHECK(memcmp(op, chunks ? oc : orf, no * sizeof(float)) == 0);
    CHECK(memcmp(sp, chunks ? sc : sr, ns * sizeof(float)) == 0);
    /* in pieces, chunked throughout, the state carried between calls */
    memcpy(sp, s0, ns * sizeof(float));
    for (int i = 0; i + 1 < n_cuts; i++) {
        const int a = cuts[i], b = cuts[i + 1];
        hm_cpu_gated_delta_chunked(p3, q + a * qs, k + a * qs, qs, v + a * vs, vs, g + a * nv, beta + a * nv, b - a,
                                   nk, nv, gr, dk, dv, sp, op + (size_t)a * (size_t)nv * (size_t)dv, &scr);
    }
    const double po = relerr(op, orf, no), ps = relerr(sp, sr, ns);
    CHECKF(po < 1e-4, "chunked in pieces, out vs seq: %g", po);
    CHECKF(ps < 1e-4, "chunked in pieces, state vs seq: %g", ps);
    free(q), free(k), free(v), free(g), free(beta), free(s0), free(sr), free(sc), free(sp);
    free(orf), free(oc), free(op), free(scr.data);
}

static void test_chunked(hm_pool *p1, hm_pool *p3) {
    /* Qwen3.6-35B-A3B's heads (16 key / 32 value heads of 128), 2.3 chunks, cut across boundaries */
    const int c1[] = {0, 1, 70, 128, 129, 150};
    test_chunked_shape(p1, p3, 16, 32, false, 128, 128, 150, c1, 6);
    test_chunked_shape(p1, p3, 16, 32, true, 128, 128, 150, c1, 6); /* Qwen3-Next-80B-A3B's, grouped */
    /* the transformers fixture's shape (2 / 4 heads of 16), 5 chunks + a tail */
    const int c2[] = {0, 64, 65, 200, 333};
    test_chunked_shape(p1, p3, 2, 4, false, 16, 16, 333, c2, 5);
    /* odd head dims (masked tile edges), d_k != d_v, short calls */
    const int c3[] = {0, 3, 7, 70, 71, 97};
    test_chunked_shape(p1, p3, 2, 6, false, 24, 40, 97, c3, 6);
    test_chunked_shape(p1, p3, 2, 6, true, 24, 40, 97, c3, 6);
    const int c4[] = {0, 5};
    test_chunked_shape(p1, p3, 1, 3, false, 8, 5, 5, c4, 2);
}

/* The grouped layout (Qwen3-Next: value head h reads key head h / r, r = n_v / n_k) is the tiled one
 * (h % n_k) on value heads renumbered: grouped head h = tiled head (h % r) n_k + h / r. Both forms,
 * on inputs permuted so, must give the same bits. */
static void test_grouped(hm_pool *p3) {
    enum { TG = 37, NKG = 2, NVG = 6, R = NVG / NKG, D = 16, DVG = 12 };
    static float q[TG * NKG * D], k[TG * NKG * D], v[TG * NVG * DVG], g[TG * NVG], b[TG * NVG];
    static float vt[TG * NVG * DVG], gt[TG * NVG], bt[TG * NVG], og[TG * NVG * DVG], ot[TG * NVG * DVG];
    static float sg[NVG * D * DVG], st[NVG * D * DVG];
    for (int i = 0; i < TG * NKG * D; i++) q[i] = 0.3f * frand(), k[i] = 0.3f * frand();
    for (int i = 0; i < TG * NVG * DVG; i++) v[i] = frand();
    for (int i = 0; i < TG * NVG; i++) g[i] = -0.1f - 0.1f * frand(), b[i] = 0.5f + 0.4f * frand();
    for (int t = 0; t < TG; t++)
        for (int h = 0; h < NVG; h++) {
            const int ht = (h % R) * NKG + h / R;
            memcpy(vt + (t * NVG + ht) * DVG, v + (t * NVG + h) * DVG, DVG * sizeof(float));
            gt[t * NVG + ht] = g[t * NVG + h], bt[t * NVG + ht] = b[t * NVG + h];
        }
    hm_cpu_gated_delta_seq(p3, q, k, NKG * D, v, NVG * DVG, g, b, TG, NKG, NVG, true, D, DVG, sg, og);
    hm_cpu_gated_delta_seq(p3, q, k, NKG * D, vt, NVG * DVG, gt, bt, TG, NKG, NVG, false, D, DVG, st, ot);
    int bad = 0;
    for (int t = 0; t < TG; t++)
        for (int h = 0; h < NVG; h++)
            bad += memcmp(og + (t * NVG + h) * DVG, ot + (t * NVG + (h % R) * NKG + h / R) * DVG, DVG * 4) != 0;
    CHECKF(bad == 0, "grouped vs tiled on renumbered heads: %d of %d rows differ", bad, TG * NVG);
}

int main(void) {
    hm_pool *p1 = NULL, *p3 = NULL;
    hm_err err;
    CHECK(hm_pool_open(&p1, 1, &err) == HM_OK);
    CHECK(hm_pool_open(&p3, 3, &err) == HM_OK);
    if (!p1 || !p3) return test_done();
    test_conv(p1, p3);
    test_delta(p1, p3);
    test_l2(p3);
    test_chunked(p1, p3);
    test_grouped(p3);
    hm_pool_close(p1);
    hm_pool_close(p3);
    return test_done();
}
