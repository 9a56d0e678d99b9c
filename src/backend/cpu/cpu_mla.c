/* cpu_mla.c - MLA's CPU pieces (cpu_mla.h). Plain loops over rows; the matmuls are hm_cpu_matmul's. */
#include "cpu_mla.h"

#include <math.h>
#include <string.h>

#include "core/status.h"

typedef struct {
    const float *q, *ff, *kv_norm;
    float *qa, *kv;
    const int32_t *pos;
    int64_t n;
    int n_head, nope, kv_lora, n_rot;
    float theta, eps;
} mla_in_ctx;

/* Interleaved RoPE of n_rot values from src into dst (may alias) at position ps. */
static void rope_pairs(const float *src, float *dst, int n_rot, double ps, float theta, const float *ff) {
    for (int i = 0; i < n_rot / 2; i++) {
        double a = ps * pow((double)theta, -2.0 * i / n_rot);
        if (ff) a /= (double)ff[i];
        const float cs = (float)cos(a), sn = (float)sin(a);
        const float x0 = src[2 * i], x1 = src[2 * i + 1];
        dst[2 * i] = x0 * cs - x1 * sn;
        dst[2 * i + 1] = x0 * sn + x1 * cs;
    }
}

static void mla_in_task(void *p, int ith, int nth) {
    const mla_in_ctx *c = p;
    const int64_t lo = c->n * ith / nth, hi = c->n * (ith + 1) / nth;
    const int64_t qw = (int64_t)c->nope + c->n_rot, aw = (int64_t)c->kv_lora + c->n_rot;
    for (int64_t t = lo; t < hi; t++) {
        const double ps = (double)c->pos[t];
        for (int h = 0; h < c->n_head; h++)
            rope_pairs(c->q + (size_t)((t * c->n_head + h) * qw + c->nope),
                       c->qa + (size_t)((t * c->n_head + h) * aw + c->kv_lora), c->n_rot, ps, c->theta, c->ff);
        float *kv = c->kv + (size_t)(t * aw);
        double ss = 0.0;
        for (int i = 0; i < c->kv_lora; i++) ss += (double)kv[i] * kv[i];
        const float r = (float)(1.0 / sqrt(ss / c->kv_lora + (double)c->eps));
        for (int i = 0; i < c->kv_lora; i++) kv[i] = kv[i] * r * c->kv_norm[i];
        rope_pairs(kv + c->kv_lora, kv + c->kv_lora, c->n_rot, ps, c->theta, c->ff);
    }
}

void hm_cpu_mla_in(hm_pool *pool, const float *q, float *qa, float *kv, int64_t n, int n_head, int nope, int kv_lora,
                   int n_rot, const int32_t *pos, float theta, const float *ff, const float *kv_norm, float eps) {
    HM_ASSERT(n_rot > 0 && n_rot % 2 == 0 && kv_lora > 0);
    mla_in_ctx c = {.q = q, .ff = ff, .kv_norm = kv_norm, .qa = qa, .kv = kv, .pos = pos, .n = n, .n_head = n_head,
                    .nope = nope, .kv_lora = kv_lora, .n_rot = n_rot, .theta = theta, .eps = eps};
    hm_pool_run(pool, mla_in_task, &c);
}

void hm_cpu_matmul_heads(hm_pool *pool, const hm_mat *w, size_t nb2, int n_head, const float *in, int64_t in_stride,
                         int64_t n, float *out, int64_t out_stride, float *tin, float *tout, hm_scratch *scratch) {
    const int64_t k = w->ne0, m = w->ne1;
    for (int h = 0; h < n_head; h++) {
        hm_mat wh = *w;
        wh.data = (const char *)w->data + (size_t)h * nb2;
        for (int64_t t = 0; t < n; t++)
            memcpy(tin + (size_t)(t * k), in + (size_t)(t * in_stride * n_head + h * in_stride),
                   (size_t)k * sizeof(float));
        hm_cpu_matmul(pool, &wh, tin, n, tout, scratch);
        for (int64_t t = 0; t < n; t++)
            memcpy(out + (size_t)(t * out_stride * n_head + h * out_stride), tout + (size_t)(t * m),
                   (size_t)m * sizeof(float));
    }
}
