/* cpu_kv_f32.c - f32 KV cache write and attention (see cpu_kv_f32.h). */
#include "cpu_kv_f32.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"

static void split(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi) {
    *lo = n * ith / nth;
    *hi = n * (ith + 1) / nth;
}

typedef struct {
    float *kc, *vc;
    const float *k, *v, *q;
    float *out, *scratch;
    const int32_t *pos;
    int64_t n_ctx, n_tok;
    int n_head, n_kv_head, head_dim;
    float scale;
} kv_ctx;

static void write_task(void *p, int ith, int nth) {
    const kv_ctx *c = p;
    int64_t lo, hi;
    split(c->n_tok * c->n_kv_head, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        int64_t t = i / c->n_kv_head, h = i % c->n_kv_head;
        size_t dst = ((size_t)h * (size_t)c->n_ctx + (size_t)c->pos[t]) * (size_t)c->head_dim;
        size_t src = (size_t)i * (size_t)c->head_dim;
        memcpy(c->kc + dst, c->k + src, (size_t)c->head_dim * sizeof(float));
        memcpy(c->vc + dst, c->v + src, (size_t)c->head_dim * sizeof(float));
    }
}

void hm_kv_f32_write(hm_pool *pool, float *k_cache, float *v_cache, int64_t n_ctx, int n_kv_head,
                     int head_dim, const float *k, const float *v, int64_t n_tok, const int32_t *pos) {
    for (int64_t t = 0; t < n_tok; t++) HM_ASSERT(pos[t] >= 0 && pos[t] < n_ctx);
    kv_ctx c = {.kc = k_cache, .vc = v_cache, .k = k, .v = v, .pos = pos, .n_ctx = n_ctx, .n_tok = n_tok,
                .n_kv_head = n_kv_head, .head_dim = head_dim};
    hm_pool_run(pool, write_task, &c);
}

size_t hm_kv_f32_scratch_floats(int64_t n_ctx, int n_threads) {
    return (size_t)n_threads * hm_align_up((uint64_t)n_ctx, 16);
}

static void attn_task(void *p, int ith, int nth) {
    const kv_ctx *c = p;
    const int d = c->head_dim;
    float *sc = c->scratch + (size_t)ith * hm_align_up((uint64_t)c->n_ctx, 16);
    int64_t lo, hi;
    split(c->n_tok * c->n_head, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        const int64_t t = i / c->n_head;
        const int h = (int)(i % c->n_head), g = h / (c->n_head / c->n_kv_head);
        const float *qv = c->q + (size_t)i * (size_t)d;
        const float *kb = c->kc + (size_t)g * (size_t)c->n_ctx * (size_t)d;
        const float *vb = c->vc + (size_t)g * (size_t)c->n_ctx * (size_t)d;
        const int64_t n_kv = (int64_t)c->pos[t] + 1;
        float m = -INFINITY;
        for (int64_t s = 0; s < n_kv; s++) {
            float acc = 0;
            for (int j = 0; j < d; j++) acc += qv[j] * kb[s * d + j];
            sc[s] = acc * c->scale;
            if (sc[s] > m) m = sc[s];
        }
        float *o = c->out + (size_t)i * (size_t)d;
        memset(o, 0, (size_t)d * sizeof(float));
        double sum = 0;
        for (int64_t s = 0; s < n_kv; s++) {
            float e = expf(sc[s] - m);
            sum += e;
            for (int j = 0; j < d; j++) o[j] += e * vb[s * d + j];
        }
        float inv = (float)(1.0 / sum);
        for (int j = 0; j < d; j++) o[j] *= inv;
    }
}

void hm_kv_f32_attention(hm_pool *pool, const float *q, int64_t n_tok, const int32_t *pos,
                         const float *k_cache, const float *v_cache, int64_t n_ctx, int n_head,
                         int n_kv_head, int head_dim, float scale, float *out, float *scratch) {
    HM_ASSERT(n_kv_head > 0 && n_head % n_kv_head == 0);
    kv_ctx c = {.kc = (float *)k_cache, .vc = (float *)v_cache, .q = q, .out = out, .scratch = scratch, .pos = pos,
                .n_ctx = n_ctx, .n_tok = n_tok, .n_head = n_head, .n_kv_head = n_kv_head, .head_dim = head_dim,
                .scale = scale};
    hm_pool_run(pool, attn_task, &c);
}
