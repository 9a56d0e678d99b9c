/* cpu_deltanet.c - the linear-attention ops of cpu_deltanet.h: scalar loops split over channels
 * (conv) or heads (delta rule), each output written by exactly one thread. */
#include "cpu_deltanet.h"

#include <math.h>
#include <string.h>

#include "core/status.h"

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
} delta_ctx;

static void delta_run(void *p, int ith, int nth) {
    const delta_ctx *c = p;
    int64_t h0, h1;
    split(c->n_v, ith, nth, &h0, &h1);
    const int dk = c->dk, dv = c->dv;
    float kv[HM_DELTA_MAX_DV];
    for (int64_t h = h0; h < h1; h++) {
        float *S = c->state + h * (int64_t)dk * dv;
        const int64_t kh = h % c->n_k;
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

void hm_cpu_gated_delta(hm_pool *pool, const float *q, const float *k, int64_t qk_stride, const float *v,
                        int64_t v_stride, const float *g, const float *beta, int64_t n_tok, int n_k_head,
                        int n_v_head, int d_k, int d_v, float *state, float *out) {
    HM_ASSERT(d_v > 0 && d_v <= HM_DELTA_MAX_DV && n_k_head > 0 && n_v_head % n_k_head == 0);
    delta_ctx c = {q, k, v, g, beta, qk_stride, v_stride, n_tok, n_k_head, n_v_head, d_k, d_v, state, out};
    hm_pool_run(pool, delta_run, &c);
}
