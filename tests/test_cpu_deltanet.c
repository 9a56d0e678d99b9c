/* test_cpu_deltanet.c - the linear-attention CPU ops (cpu_deltanet.h) against plain double
 * references written from the definitions, plus the properties the forward pass relies on:
 *  - state carried across calls: running n tokens as one call or as pieces (1, 3, rest) gives the
 *    same outputs and final state (conv window and delta state);
 *  - thread-count invariance: pools of 1 and 3 threads give bit-identical results;
 *  - the tiled V-head -> key-head mapping (value head j uses key head j % n_k). */
#include <math.h>
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
    hm_cpu_gated_delta(p1, q, k, QS, v, VS, g, beta, T, NK, NV, DK, DV, st1, o1);
    CHECKF(maxdiff(o1, out_ref, T * NV * DV) < 1e-4, "delta vs reference: %g", maxdiff(o1, out_ref, T * NV * DV));
    CHECKF(maxdiff(st1, sref, NV * DK * DV) < 1e-4, "delta state vs reference: %g", maxdiff(st1, sref, NV * DK * DV));
    memcpy(st3, s0, sizeof st3);
    const int cuts[] = {0, 1, 4, T};
    for (int i = 0; i + 1 < (int)(sizeof cuts / sizeof cuts[0]); i++)
        hm_cpu_gated_delta(p3, q + cuts[i] * QS, k + cuts[i] * QS, QS, v + cuts[i] * VS, VS, g + cuts[i] * NV,
                           beta + cuts[i] * NV, cuts[i + 1] - cuts[i], NK, NV, DK, DV, st3, o3 + cuts[i] * NV * DV);
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

int main(void) {
    hm_pool *p1 = NULL, *p3 = NULL;
    hm_err err;
    CHECK(hm_pool_open(&p1, 1, &err) == HM_OK);
    CHECK(hm_pool_open(&p3, 3, &err) == HM_OK);
    if (!p1 || !p3) return test_done();
    test_conv(p1, p3);
    test_delta(p1, p3);
    test_l2(p3);
    hm_pool_close(p1);
    hm_pool_close(p3);
    return test_done();
}
