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

/* ---- KV ring buffer and attention ---- */

typedef struct {
    char *kc, *vc;
    const float *k, *v, *q;
    float *out, *scratch;
    const int32_t *pos;
    size_t es;
    int64_t cap, n_tok;
    int32_t window;
    int n_head, n_kv_head, head_dim;
    float scale;
} kv_ctx;

static void store_row(char *dst, size_t es, const float *src, int n) {
    if (es == 4) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else {
        uint16_t *d = (uint16_t *)(void *)dst;
        for (int i = 0; i < n; i++) d[i] = hm_f32_to_fp16(src[i]);
    }
}

static void kv_write_task(void *p, int ith, int nth) {
    const kv_ctx *c = p;
    int64_t lo, hi;
    split(c->n_tok * c->n_kv_head, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        const int64_t t = i / c->n_kv_head, h = i % c->n_kv_head;
        const size_t row = (size_t)h * (size_t)c->cap + (size_t)(c->pos[t] % c->cap);
        const size_t off = row * (size_t)c->head_dim * c->es, src = (size_t)i * (size_t)c->head_dim;
        store_row(c->kc + off, c->es, c->k + src, c->head_dim);
        store_row(c->vc + off, c->es, c->v + src, c->head_dim);
    }
}

void hm_gemma_kv_write(hm_pool *pool, void *k_cache, void *v_cache, size_t elem_size, int64_t cap,
                       int n_kv_head, int head_dim, const float *k, const float *v, int64_t n_tok,
                       const int32_t *pos) {
    HM_ASSERT((elem_size == 2 || elem_size == 4) && cap > 0);
    for (int64_t t = 0; t < n_tok; t++) HM_ASSERT(pos[t] >= 0);
    kv_ctx c = {.kc = k_cache, .vc = v_cache, .k = k, .v = v, .pos = pos, .es = elem_size, .cap = cap,
                .n_tok = n_tok, .n_kv_head = n_kv_head, .head_dim = head_dim};
    hm_pool_run(pool, kv_write_task, &c);
}

size_t hm_gemma_attention_scratch_floats(int64_t cap, int n_threads) {
    return (size_t)n_threads * hm_align_up((uint64_t)cap, 16);
}

static void attn_task(void *p, int ith, int nth) {
    const kv_ctx *c = p;
    const int d = c->head_dim;
    float *sc = c->scratch + (size_t)ith * hm_align_up((uint64_t)c->cap, 16);
    int64_t lo, hi;
    split(c->n_tok * c->n_head, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        const int64_t t = i / c->n_head;
        const int h = (int)(i % c->n_head), g = h / (c->n_head / c->n_kv_head);
        const float *qv = c->q + (size_t)i * (size_t)d;
        const size_t base = (size_t)g * (size_t)c->cap;
        const int64_t p1 = c->pos[t];
        int64_t p0 = c->window > 0 ? p1 - c->window + 1 : 0;
        if (p0 < 0) p0 = 0;
        HM_ASSERT(p1 - p0 < c->cap);
        float m = -INFINITY;
        for (int64_t s = p0; s <= p1; s++) {
            const size_t row = (base + (size_t)(s % c->cap)) * (size_t)d;
            float acc = 0;
            if (c->es == 4) {
                const float *kr = (const float *)(const void *)c->kc + row;
                for (int j = 0; j < d; j++) acc += qv[j] * kr[j];
            } else {
                const uint16_t *kr = (const uint16_t *)(const void *)c->kc + row;
                for (int j = 0; j < d; j++) acc += qv[j] * hm_fp16_to_f32(kr[j]);
            }
            sc[s - p0] = acc * c->scale;
            if (sc[s - p0] > m) m = sc[s - p0];
        }
        float *o = c->out + (size_t)i * (size_t)d;
        memset(o, 0, (size_t)d * sizeof(float));
        double sum = 0;
        for (int64_t s = p0; s <= p1; s++) {
            const size_t row = (base + (size_t)(s % c->cap)) * (size_t)d;
            const float e = expf(sc[s - p0] - m);
            sum += e;
            if (c->es == 4) {
                const float *vr = (const float *)(const void *)c->vc + row;
                for (int j = 0; j < d; j++) o[j] += e * vr[j];
            } else {
                const uint16_t *vr = (const uint16_t *)(const void *)c->vc + row;
                for (int j = 0; j < d; j++) o[j] += e * hm_fp16_to_f32(vr[j]);
            }
        }
        const float inv = (float)(1.0 / sum);
        for (int j = 0; j < d; j++) o[j] *= inv;
    }
}

void hm_gemma_attention(hm_pool *pool, const float *q, int64_t n_tok, const int32_t *pos,
                        const void *k_cache, const void *v_cache, size_t elem_size, int64_t cap,
                        int32_t window, int n_head, int n_kv_head, int head_dim, float scale,
                        float *out, float *scratch) {
    HM_ASSERT(n_kv_head > 0 && n_head % n_kv_head == 0 && (elem_size == 2 || elem_size == 4));
    if (elem_size == 2 && hm_cpu_attn_tiled_takes(n_tok, n_head, n_kv_head, head_dim)) {
        hm_cpu_attention_tiled(pool, q, n_tok, pos, k_cache, v_cache, cap, window, n_head, n_kv_head, head_dim, scale,
                               out, scratch);
        return;
    }
    kv_ctx c = {.kc = (char *)k_cache, .vc = (char *)v_cache, .q = q, .out = out, .scratch = scratch, .pos = pos,
                .es = elem_size, .cap = cap, .n_tok = n_tok, .window = window, .n_head = n_head,
                .n_kv_head = n_kv_head, .head_dim = head_dim, .scale = scale};
    hm_pool_run(pool, attn_task, &c);
}

/* ---- GELU-gated experts ---- */

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
