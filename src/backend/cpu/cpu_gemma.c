/* cpu_gemma.c - the Gemma ops of cpu_gemma.h. Plain loops split over rows / (token, head) items;
 * the GELU-gated experts reuse the matmul op per expert. Not tuned: correctness first. */
#include "cpu_gemma.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/fp16.h"
#include "core/status.h"

static void split(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi) {
    *lo = n * ith / nth;
    *hi = n * (ith + 1) / nth;
}

/* ---- elementwise ---- */

typedef struct {
    const float *a, *b;
    float *o;
    int64_t n;
    float c;
} ew_ctx;

static inline float gelu_tanh(float x) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

static void gelu_mul_task(void *p, int ith, int nth) {
    const ew_ctx *c = p;
    int64_t lo, hi;
    split(c->n, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) c->o[i] = gelu_tanh(c->a[i]) * c->b[i];
}

void hm_gemma_gelu_mul(hm_pool *pool, const float *g, const float *u, float *out, int64_t n) {
    ew_ctx c = {.a = g, .b = u, .o = out, .n = n};
    hm_pool_run(pool, gelu_mul_task, &c);
}

static void softcap_task(void *p, int ith, int nth) {
    const ew_ctx *c = p;
    int64_t lo, hi;
    split(c->n, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) c->o[i] = c->c * tanhf(c->o[i] / c->c);
}

void hm_gemma_softcap(hm_pool *pool, float *x, int64_t n, float cap) {
    HM_ASSERT(cap > 0);
    ew_ctx c = {.o = x, .n = n, .c = cap};
    hm_pool_run(pool, softcap_task, &c);
}

/* ---- RoPE ---- */

typedef struct {
    float *x;
    const int32_t *pos;
    const float *ff;
    int64_t n_tok;
    int n_head, head_dim, n_rot;
    float theta;
} rope_ctx;

static void rope_task(void *p, int ith, int nth) {
    const rope_ctx *c = p;
    const int half = c->n_rot / 2;
    int64_t lo, hi;
    split(c->n_tok * c->n_head, ith, nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        float *v = c->x + (size_t)r * (size_t)c->head_dim;
        const double ps = (double)c->pos[r / c->n_head];
        for (int i = 0; i < half; i++) {
            double a = ps * pow((double)c->theta, -2.0 * i / c->n_rot);
            if (c->ff) a /= (double)c->ff[i];
            const float cs = (float)cos(a), sn = (float)sin(a);
            const float x0 = v[i], x1 = v[i + half];
            v[i] = x0 * cs - x1 * sn;
            v[i + half] = x0 * sn + x1 * cs;
        }
    }
}

void hm_gemma_rope_neox(hm_pool *pool, float *x, int64_t n_tok, int n_head, int head_dim, int n_rot,
                        const int32_t *pos, float theta_base, const float *ff) {
    HM_ASSERT(n_rot > 0 && n_rot % 2 == 0 && n_rot <= head_dim);
    rope_ctx c = {.x = x, .pos = pos, .ff = ff, .n_tok = n_tok, .n_head = n_head, .head_dim = head_dim,
                  .n_rot = n_rot, .theta = theta_base};
    hm_pool_run(pool, rope_task, &c);
}

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

size_t hm_gemma_moe_scratch_size(int64_t n_batch, int64_t n_embd, int64_t n_ff, int n_threads) {
    const size_t mm = hm_align_up(hm_cpu_matmul_scratch_size(n_embd > n_ff ? n_embd : n_ff, n_batch, n_threads),
                                  HM_ALIGN);
    const size_t xe = hm_align_up((size_t)n_batch * (size_t)n_embd * sizeof(float), HM_ALIGN);
    const size_t xf = hm_align_up((size_t)n_batch * (size_t)n_ff * sizeof(float), HM_ALIGN);
    return max_sz(mm, 64) + 2 * xe + 2 * xf;
}

void hm_gemma_moe(hm_pool *pool, const hm_moe_job *jobs, int n_jobs, const float *x, int64_t n_batch,
                  int64_t n_embd, int64_t n_ff, float *out, hm_scratch *scratch) {
    const int nth = hm_pool_size(pool) > 0 ? hm_pool_size(pool) : 1;
    HM_ASSERT(scratch->size >= hm_gemma_moe_scratch_size(n_batch, n_embd, n_ff, nth));
    const size_t mm = max_sz(hm_align_up(hm_cpu_matmul_scratch_size(n_embd > n_ff ? n_embd : n_ff, n_batch, nth),
                                         HM_ALIGN), 64);
    const size_t xe = hm_align_up((size_t)n_batch * (size_t)n_embd * sizeof(float), HM_ALIGN);
    const size_t xf = hm_align_up((size_t)n_batch * (size_t)n_ff * sizeof(float), HM_ALIGN);
    char *base = scratch->data;
    hm_scratch ms = {base, mm};
    float *xj = (float *)(void *)(base + mm), *yj = (float *)(void *)(base + mm + xe);
    float *gj = (float *)(void *)(base + mm + 2 * xe), *uj = (float *)(void *)(base + mm + 2 * xe + xf);
    for (int j = 0; j < n_jobs; j++) {
        const hm_moe_job *jb = &jobs[j];
        const int64_t nt = jb->n_tok;
        if (nt <= 0) continue;
        HM_ASSERT(nt <= n_batch && jb->gate.ne0 == n_embd && jb->gate.ne1 == n_ff && jb->down.ne1 == n_embd);
        for (int64_t i = 0; i < nt; i++)
            memcpy(xj + i * n_embd, x + (size_t)jb->tok[i] * (size_t)n_embd, (size_t)n_embd * sizeof(float));
        const hm_mat *ws[2] = {&jb->gate, &jb->up};
        float *const ys[2] = {gj, uj};
        hm_cpu_matmul_n(pool, ws, 2, xj, nt, ys, &ms);
        hm_gemma_gelu_mul(pool, gj, uj, gj, nt * n_ff);
        hm_cpu_matmul(pool, &jb->down, gj, nt, yj, &ms);
        for (int64_t i = 0; i < nt; i++) {
            float *o = out + (size_t)jb->tok[i] * (size_t)n_embd;
            const float *y = yj + i * n_embd;
            const float w = jb->w[i];
            for (int64_t e = 0; e < n_embd; e++) o[e] += w * y[e];
        }
    }
}
