/* cpu_deltanet.c - the linear-attention ops of cpu_deltanet.h: loops split over channels (conv)
 * or heads (delta rule), each output written by exactly one thread in a fixed order.
 *
 * The chunked delta rule is built from one small f32 product (mm: AVX-512 4 x 64 register tiles,
 * a plain loop otherwise) reading keys and queries in place, with a per-thread work area for the
 * transposed keys, the chunk's C x C matrices and U; the token-by-token form is its reference
 * (tests/test_cpu_deltanet.c). */
#include "cpu_deltanet.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "core/status.h"
#include "cpu_impl.h"

static void split(int64_t n, int ith, int nth, int64_t *a, int64_t *b) {
    const int64_t per = (n + nth - 1) / nth;
    *a = per * ith < n ? per * ith : n;
    *b = *a + per < n ? *a + per : n;
}

/* ---- causal conv ---- */

typedef struct conv_ctx {
    const float *x;
    int64_t xs, n, C;
    const float *w;
    int K;
    float *state, *out;
} conv_ctx;

static void conv_run(void *p, int ith, int nth) {
    const conv_ctx *c = p;
    int64_t c0, c1;
    split(c->C, ith, nth, &c0, &c1);
    const int K = c->K;
    for (int64_t ch = c0; ch < c1; ch++) {
        const float *w = c->w + ch * K;
        for (int64_t t = 0; t < c->n; t++) {
            float acc = 0.0f;
            for (int j = 0; j < K; j++) {
                const int64_t s = t - (K - 1) + j; /* input row, < 0: from the state */
                const float xv = s < 0 ? c->state[(K - 1 + s) * c->C + ch] : c->x[s * c->xs + ch];
                acc += w[j] * xv;
            }
            c->out[t * c->C + ch] = acc / (1.0f + expf(-acc));
        }
        /* new state: the last K-1 rows of (state ++ x) */
        for (int j = 0; j < K - 1; j++) {
            const int64_t s = c->n - (K - 1) + j;
            c->state[j * c->C + ch] = s < 0 ? c->state[(K - 1 + s) * c->C + ch] : c->x[s * c->xs + ch];
        }
    }
}

void hm_cpu_ssm_conv(hm_pool *pool, const float *x, int64_t x_stride, int64_t n_tok, int64_t C,
                     const float *w, int K, float *state, float *out) {
    HM_ASSERT(K >= 1 && n_tok >= 0 && x_stride >= C);
    conv_ctx c = {x, x_stride, n_tok, C, w, K, state, out};
    hm_pool_run(pool, conv_run, &c);
}

/* ---- L2 norm per head ---- */

typedef struct l2_ctx {
    float *x;
    int64_t xs, n;
    int n_head, d;
    float eps, scale;
} l2_ctx;

static void l2_run(void *p, int ith, int nth) {
    const l2_ctx *c = p;
    int64_t r0, r1;
    split(c->n * c->n_head, ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        float *v = c->x + (r / c->n_head) * c->xs + (r % c->n_head) * c->d;
        float ss = 0.0f;
        for (int i = 0; i < c->d; i++) ss += v[i] * v[i];
        const float f = c->scale / sqrtf(ss + c->eps);
        for (int i = 0; i < c->d; i++) v[i] *= f;
    }
}

void hm_cpu_l2norm_heads(hm_pool *pool, float *x, int64_t x_stride, int64_t n_tok, int n_head, int d,
                         float eps, float scale) {
    l2_ctx c = {x, x_stride, n_tok, n_head, d, eps, scale};
    hm_pool_run(pool, l2_run, &c);
}

/* ---- gated delta rule ---- */

typedef struct delta_ctx {
    const float *q, *k, *v, *g, *beta;
    int64_t qks, vs, n;
    int n_k, n_v, dk, dv;
    float *state, *out;
    int rep; /* value head h reads key head (h / rep) % n_k: 1 tiled, n_v / n_k grouped */
} delta_ctx;

static void delta_seq_run(void *p, int ith, int nth) {
    const delta_ctx *c = p;
    int64_t h0, h1;
    split(c->n_v, ith, nth, &h0, &h1);
    const int dk = c->dk, dv = c->dv;
    float kv[HM_DELTA_MAX_DV];
    for (int64_t h = h0; h < h1; h++) {
        float *S = c->state + h * (int64_t)dk * dv;
        const int64_t kh = (h / c->rep) % c->n_k;
        for (int64_t t = 0; t < c->n; t++) {
            const float *q = c->q + t * c->qks + kh * dk;
            const float *k = c->k + t * c->qks + kh * dk;
            const float *v = c->v + t * c->vs + h * dv;
            const float decay = expf(c->g[t * c->n_v + h]), beta = c->beta[t * c->n_v + h];
            float *o = c->out + (t * c->n_v + h) * dv;
            /* kv = S^T k of the decayed state; delta = beta (v - kv) */
            for (int j = 0; j < dv; j++) kv[j] = 0.0f;
            for (int i = 0; i < dk; i++) {
                const float ki = k[i];
                const float *row = S + (int64_t)i * dv;
                for (int j = 0; j < dv; j++) kv[j] += row[j] * ki;
            }
            for (int j = 0; j < dv; j++) kv[j] = beta * (v[j] - decay * kv[j]);
            /* S = decay S + k delta^T;  o = S^T q */
            for (int j = 0; j < dv; j++) o[j] = 0.0f;
            for (int i = 0; i < dk; i++) {
                const float ki = k[i], qi = q[i];
                float *row = S + (int64_t)i * dv;
                for (int j = 0; j < dv; j++) {
                    const float s = decay * row[j] + ki * kv[j];
                    row[j] = s;
                    o[j] += s * qi;
                }
            }
        }
    }
}

void hm_cpu_gated_delta_seq(hm_pool *pool, const float *q, const float *k, int64_t qk_stride, const float *v,
                            int64_t v_stride, const float *g, const float *beta, int64_t n_tok, int n_k_head,
                            int n_v_head, bool grouped, int d_k, int d_v, float *state, float *out) {
    HM_ASSERT(d_v > 0 && d_v <= HM_DELTA_MAX_DV && n_k_head > 0 && n_v_head % n_k_head == 0);
    delta_ctx c = {q, k, v, g, beta, qk_stride, v_stride, n_tok, n_k_head, n_v_head, d_k, d_v, state, out,
                   grouped ? n_v_head / n_k_head : 1};
    hm_pool_run(pool, delta_seq_run, &c);
}

/* ---- chunked delta rule ---- */

enum { CH = HM_DELTA_CHUNK };

/* c[m][n] = cs * c[m][n] + sum_p a[m][p] b[p][n] for m < M, n < N, p < P (row strides lda, ldb,
 * ldc); cs == 0 writes c without reading it. tri: row m sums p <= m only (a is lower triangular,
 * zero above the diagonal). c must not overlap a or b. */
#ifdef HM_CPU_AVX512
/* One tile: `rows` (1..4) rows x up to 64 columns (masked past nc), in 16 accumulators. */
static inline __attribute__((always_inline)) void mm_tile(int rows, int64_t nc, int64_t P, const float *a,
                                                          int64_t lda, const float *b, int64_t ldb, float *c,
                                                          int64_t ldc, float cs) {
    __mmask16 mk[4];
    for (int u = 0; u < 4; u++) {
        const int64_t rem = nc - 16 * u;
        mk[u] = rem >= 16 ? (__mmask16)0xffff : rem > 0 ? (__mmask16)((1u << rem) - 1) : 0;
    }
    __m512 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int u = 0; u < 4; u++) acc[r][u] = _mm512_setzero_ps();
    for (int64_t p = 0; p < P; p++) {
        const float *bp = b + p * ldb;
        __m512 bv[4];
        for (int u = 0; u < 4; u++) bv[u] = _mm512_maskz_loadu_ps(mk[u], bp + 16 * u);
        for (int r = 0; r < rows; r++) {
            const __m512 av = _mm512_set1_ps(a[r * lda + p]);
            for (int u = 0; u < 4; u++) acc[r][u] = _mm512_fmadd_ps(av, bv[u], acc[r][u]);
        }
    }
    const __m512 csv = _mm512_set1_ps(cs);
    for (int r = 0; r < rows; r++)
        for (int u = 0; u < 4; u++) {
            if (!mk[u]) continue;
            float *cp = c + r * ldc + 16 * u;
            __m512 x = acc[r][u];
            if (cs != 0.0f) x = _mm512_fmadd_ps(csv, _mm512_maskz_loadu_ps(mk[u], cp), x);
            _mm512_mask_storeu_ps(cp, mk[u], x);
        }
}

static void mm(int64_t M, int64_t N, int64_t P, const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
               int64_t ldc, float cs, bool tri) {
    for (int64_t m = 0; m < M; m += 4) {
        const int rows = M - m < 4 ? (int)(M - m) : 4;
        const int64_t pe = tri && m + rows < P ? m + rows : P;
        for (int64_t n = 0; n < N; n += 64) {
            const int64_t nc = N - n < 64 ? N - n : 64;
            const float *am = a + m * lda;
            float *cm = c + m * ldc + n;
            switch (rows) { /* literal row counts: each case keeps its tile in registers */
            case 4: mm_tile(4, nc, pe, am, lda, b + n, ldb, cm, ldc, cs); break;
            case 3: mm_tile(3, nc, pe, am, lda, b + n, ldb, cm, ldc, cs); break;
            case 2: mm_tile(2, nc, pe, am, lda, b + n, ldb, cm, ldc, cs); break;
            default: mm_tile(1, nc, pe, am, lda, b + n, ldb, cm, ldc, cs); break;
            }
        }
    }
}
#else
static void mm(int64_t M, int64_t N, int64_t P, const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
               int64_t ldc, float cs, bool tri) {
    for (int64_t m = 0; m < M; m++) {
        float *cm = c + m * ldc;
        if (cs == 0.0f)
            for (int64_t n = 0; n < N; n++) cm[n] = 0.0f;
        else if (cs != 1.0f)
            for (int64_t n = 0; n < N; n++) cm[n] *= cs;
        const int64_t pe = tri && m + 1 < P ? m + 1 : P;
        for (int64_t p = 0; p < pe; p++) {
            const float ap = a[m * lda + p];
            const float *bp = b + p * ldb;
            for (int64_t n = 0; n < N; n++) cm[n] += ap * bp[n];
        }
    }
}
#endif

/* e[j] = exp(x - gam[j]) for j < n (every argument <= 0 here). */
static void exp_from(float x, const float *gam, int64_t n, float *e) {
    int64_t j = 0;
#ifdef HM_CPU_AVX512
    const __m512 xv = _mm512_set1_ps(x);
    for (; j + 16 <= n; j += 16) _mm512_storeu_ps(e + j, hm_exp_ps(_mm512_sub_ps(xv, _mm512_loadu_ps(gam + j))));
#endif
    for (; j < n; j++) e[j] = expf(x - gam[j]);
}

/* Floats of one thread's work area: kt [d_k][C] (the chunk's keys transposed), gp [2C][C] (A's
 * strict lower triangle negated, then the decayed Q K^T), u [C][d_v]. Keys and queries are read
 * in place (any row stride). */
static size_t chunk_floats(int d_k, int d_v) {
    const size_t a = HM_ALIGN / sizeof(float);
    return hm_align_up((size_t)d_k * CH, a) + hm_align_up(2 * CH * CH, a) + hm_align_up(CH * (size_t)d_v, a);
}

size_t hm_cpu_gated_delta_scratch_size(int d_k, int d_v, int n_threads) {
    return (size_t)n_threads * chunk_floats(d_k, d_v) * sizeof(float) + HM_ALIGN;
}

typedef struct chunk_ctx {
    delta_ctx d;
    float *work;     /* 64-byte aligned, n threads x chunk_floats */
    size_t work_per; /* floats per thread */
} chunk_ctx;

/* One chunk [c0, c0 + nc) of value head h: out rows written, S advanced (see the header's math). */
static void chunk_head(const delta_ctx *c, float *w, int64_t h, int64_t c0, int64_t nc) {
    const int64_t dk = c->dk, dv = c->dv, nv = c->n_v, ldo = nv * dv, qks = c->qks;
    const size_t al = HM_ALIGN / sizeof(float);
    float *kt = w, *gp = kt + hm_align_up((size_t)dk * CH, al), *u = gp + hm_align_up(2 * CH * CH, al);
    float *pm = gp + CH * CH, *S = c->state + h * dk * dv, *o = c->out + (c0 * nv + h) * dv;
    const int64_t kh = (h / c->rep) % c->n_k;
    const float *kc = c->k + c0 * qks + kh * dk, *qc = c->q + c0 * qks + kh * dk;
    float gam[CH], bt[CH], eg[CH], e[CH];

    float acc = 0.0f;
    for (int64_t t = 0; t < nc; t++) {
        const int64_t r = (c0 + t) * nv + h;
        acc += c->g[r];
        gam[t] = acc;
        eg[t] = expf(acc);
        bt[t] = c->beta[r];
        for (int64_t i = 0; i < dk; i++) kt[i * CH + t] = kc[t * qks + i];
    }
    /* K K^T and Q K^T, then the decay e^(G_t - G_j): A negated below the diagonal, P on and below */
    mm(nc, nc, dk, kc, qks, kt, CH, gp, CH, 0.0f, false);
    mm(nc, nc, dk, qc, qks, kt, CH, pm, CH, 0.0f, false);
    for (int64_t t = 0; t < nc; t++) {
        exp_from(gam[t], gam, t + 1, e);
        float *ar = gp + t * CH, *pr = pm + t * CH;
        for (int64_t j = 0; j < t; j++) ar[j] *= -bt[t] * e[j];
        for (int64_t j = 0; j <= t; j++) pr[j] *= e[j];
        for (int64_t j = t + 1; j < nc; j++) pr[j] = 0.0f;
    }
    /* reads of S0: K S0 into u, e^G Q S0 into the output rows */
    mm(nc, dv, dk, kc, qks, S, dv, u, dv, 0.0f, false);
    mm(nc, dv, dk, qc, qks, S, dv, o, ldo, 0.0f, false);
    for (int64_t t = 0; t < nc; t++) {
        const float *vr = c->v + (c0 + t) * c->vs + h * dv;
        float *ur = u + t * dv, *orow = o + t * ldo;
        for (int64_t j = 0; j < dv; j++) {
            orow[j] *= eg[t];
            ur[j] = bt[t] * (vr[j] - eg[t] * ur[j]); /* right-hand side beta (v - e^G K S0) */
        }
    }
    /* forward substitution through I + A, 4 rows at a time: the rows above a block in one
     * product, the block's own triangle row by row */
    for (int64_t t0 = 0; t0 < nc; t0 += 4) {
        const int64_t t1 = t0 + 4 < nc ? t0 + 4 : nc;
        if (t0 > 0) mm(t1 - t0, dv, t0, gp + t0 * CH, CH, u, dv, u + t0 * dv, dv, 1.0f, false);
        for (int64_t t = t0 + 1; t < t1; t++) {
            float *ur = u + t * dv;
            for (int64_t j = t0; j < t; j++) {
                const float a = gp[t * CH + j];
                const float *uj = u + j * dv;
                for (int64_t x = 0; x < dv; x++) ur[x] += a * uj[x];
            }
        }
    }
    /* O += P U (lower triangular); S = e^G_last S0 + (K e^(G_last - G))^T U */
    mm(nc, dv, nc, pm, CH, u, dv, o, ldo, 1.0f, true);
    exp_from(gam[nc - 1], gam, nc, e);
    for (int64_t i = 0; i < dk; i++)
        for (int64_t t = 0; t < nc; t++) kt[i * CH + t] *= e[t];
    mm(dk, dv, nc, kt, CH, u, dv, S, dv, eg[nc - 1], false);
}

static void delta_chunk_run(void *p, int ith, int nth) {
    const chunk_ctx *c = p;
    int64_t h0, h1;
    split(c->d.n_v, ith, nth, &h0, &h1);
    float *w = c->work + (size_t)ith * c->work_per;
    for (int64_t h = h0; h < h1; h++)
        for (int64_t c0 = 0; c0 < c->d.n; c0 += CH) chunk_head(&c->d, w, h, c0, c->d.n - c0 < CH ? c->d.n - c0 : CH);
}

void hm_cpu_gated_delta_chunked(hm_pool *pool, const float *q, const float *k, int64_t qk_stride, const float *v,
                                int64_t v_stride, const float *g, const float *beta, int64_t n_tok, int n_k_head,
                                int n_v_head, bool grouped, int d_k, int d_v, float *state, float *out,
                                hm_scratch *scratch) {
    HM_ASSERT(d_k > 0 && d_v > 0 && n_k_head > 0 && n_v_head % n_k_head == 0 && n_tok >= 0);
    HM_ASSERT(scratch && scratch->size >= hm_cpu_gated_delta_scratch_size(d_k, d_v, hm_pool_size(pool)));
    hm_bump bump = hm_bump_init(scratch);
    const size_t per = chunk_floats(d_k, d_v);
    chunk_ctx c = {{q, k, v, g, beta, qk_stride, v_stride, n_tok, n_k_head, n_v_head, d_k, d_v, state, out,
                    grouped ? n_v_head / n_k_head : 1},
                   hm_bump_take(&bump, (size_t)hm_pool_size(pool) * per * sizeof(float)), per};
    hm_pool_run(pool, delta_chunk_run, &c);
}

bool hm_cpu_gated_delta_chunks(int64_t n_tok) {
#ifdef HM_CPU_AVX512
    return n_tok >= HM_DELTA_CHUNK_MIN;
#else
    (void)n_tok; /* the plain-loop mm makes the chunked form ~2x slower than the recurrence */
    return false;
#endif
}

void hm_cpu_gated_delta(hm_pool *pool, const float *q, const float *k, int64_t qk_stride, const float *v,
                        int64_t v_stride, const float *g, const float *beta, int64_t n_tok, int n_k_head,
                        int n_v_head, bool grouped, int d_k, int d_v, float *state, float *out, hm_scratch *scratch) {
    if (scratch && hm_cpu_gated_delta_chunks(n_tok))
        hm_cpu_gated_delta_chunked(pool, q, k, qk_stride, v, v_stride, g, beta, n_tok, n_k_head, n_v_head, grouped,
                                   d_k, d_v, state, out, scratch);
    else
        hm_cpu_gated_delta_seq(pool, q, k, qk_stride, v, v_stride, g, beta, n_tok, n_k_head, n_v_head, grouped, d_k,
                               d_v, state, out);
}
