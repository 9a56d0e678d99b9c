/* cpu_mla.c - MLA's CPU pieces (cpu_mla.h). Plain loops over rows; the matmuls are hm_cpu_matmul's. */
#include "cpu_mla.h"

#include <math.h>
#include <string.h>

#include "core/status.h"
#include "cpu_impl.h"
#include "quant/quant.h"

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

/* ---- the compressed cache ---- */

typedef struct {
    const hm_type_traits *tr;
    int type, hd;
    size_t rb;
    char *cache;
    const float *kv;
    const int32_t *pos;
    int64_t n;
} kvw_ctx;

static void kvw_task(void *p, int ith, int nth) {
    const kvw_ctx *c = p;
    int64_t lo, hi;
    hm_split(c->n, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        char *dst = c->cache + (size_t)c->pos[t] * c->rb;
        const float *src = c->kv + (size_t)(t * c->hd);
        if (c->type == HM_TYPE_F32) memcpy(dst, src, (size_t)c->hd * sizeof(float));
        else c->tr->from_float(src, dst, c->hd);
    }
}

void hm_cpu_mla_kv_write(hm_pool *pool, int type, char *cache, int hd, const float *kv, int64_t n, const int32_t *pos) {
    const hm_type_traits *tr = hm_type_get(type);
    HM_ASSERT(tr && (type == HM_TYPE_F32 || tr->from_float) && hd % tr->blck_size == 0);
    kvw_ctx c = {.tr = tr, .type = type, .hd = hd, .rb = hm_row_size(type, hd), .cache = cache, .kv = kv, .pos = pos,
                 .n = n};
    hm_pool_run(pool, kvw_task, &c);
}

typedef struct {
    const hm_type_traits *tr;
    int type, n_head, hd, n_grp;
    size_t rb;
    const float *q;
    const int32_t *pos;
    const char *cache;
    float scale;
    float *out, *scratch;
    size_t per_thread;
    int64_t n_items;
} mla_att_ctx;

/* A dot product the compiler vectorises (16 partial sums; the order is fixed, so results do not
 * depend on the thread split). */
static float dotf(const float *a, const float *b, int n) {
    float s[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) s[j] += a[i + j] * b[i + j];
    float r = 0.0f;
    for (int j = 0; j < 16; j++) r += s[j];
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

static void row_to_float(const mla_att_ctx *c, const char *row, float *dst) {
    if (c->type == HM_TYPE_F32) memcpy(dst, row, (size_t)c->hd * sizeof(float));
    else c->tr->to_float(row, dst, c->hd);
}

static void mla_att_task(void *p, int ith, int nth) {
    const mla_att_ctx *c = p;
    const int hd = c->hd, B = HM_CPU_MLA_BLOCK;
    float *blk = c->scratch + (size_t)ith * c->per_thread;  /* [B][hd] converted rows */
    float *sc = blk + (size_t)B * (size_t)hd;               /* [n_head][B] scores */
    float *mx = sc + (size_t)c->n_head * B, *sum = mx + c->n_head; /* [n_head] each */
    int64_t lo, hi;
    hm_split(c->n_items, ith, nth, &lo, &hi);
    for (int64_t it = lo; it < hi; it++) {
        const int64_t t = it / c->n_grp;
        const int g = (int)(it % c->n_grp);
        const int h0 = c->n_head * g / c->n_grp, h1 = c->n_head * (g + 1) / c->n_grp;
        const int64_t n_kv = (int64_t)c->pos[t] + 1;
        for (int h = h0; h < h1; h++) {
            mx[h] = -INFINITY;
            sum[h] = 0.0f;
            memset(c->out + (size_t)((t * c->n_head + h) * hd), 0, (size_t)hd * sizeof(float));
        }
        for (int64_t p0 = 0; p0 < n_kv; p0 += B) {
            const int nb = (int)(n_kv - p0 < B ? n_kv - p0 : B);
            for (int j = 0; j < nb; j++) row_to_float(c, c->cache + (size_t)(p0 + j) * c->rb, blk + (size_t)j * hd);
            for (int h = h0; h < h1; h++) {
                const float *qv = c->q + (size_t)((t * c->n_head + h) * hd);
                float *s = sc + (size_t)h * B, m = mx[h];
                for (int j = 0; j < nb; j++) {
                    s[j] = dotf(qv, blk + (size_t)j * hd, hd) * c->scale;
                    if (s[j] > m) m = s[j];
                }
                /* rescale what the earlier blocks summed to the new max, then add this block */
                float *o = c->out + (size_t)((t * c->n_head + h) * hd);
                const float f = expf(mx[h] - m);
                if (f != 1.0f) {
                    for (int i = 0; i < hd; i++) o[i] *= f;
                    sum[h] *= f;
                }
                for (int j = 0; j < nb; j++) {
                    const float e = expf(s[j] - m);
                    sum[h] += e;
                    const float *k = blk + (size_t)j * hd;
                    for (int i = 0; i < hd; i++) o[i] += e * k[i];
                }
                mx[h] = m;
            }
        }
        for (int h = h0; h < h1; h++) {
            float *o = c->out + (size_t)((t * c->n_head + h) * hd);
            const float inv = 1.0f / sum[h];
            for (int i = 0; i < hd; i++) o[i] *= inv;
        }
    }
}

size_t hm_cpu_mla_scratch_floats(int n_head, int hd, int n_threads) {
    const size_t per = (size_t)HM_CPU_MLA_BLOCK * (size_t)hd + (size_t)n_head * (HM_CPU_MLA_BLOCK + 2);
    return per * (size_t)n_threads;
}

void hm_cpu_mla_attention(hm_pool *pool, int type, const float *q, int64_t n, const int32_t *pos, const char *cache,
                          int n_head, int hd, float scale, float *out, float *scratch) {
    const hm_type_traits *tr = hm_type_get(type);
    HM_ASSERT(tr && (type == HM_TYPE_F32 || tr->to_float) && hd % tr->blck_size == 0 && scratch);
    const int nth = hm_pool_size(pool);
    /* enough items for the pool: a decode row's heads split over the threads */
    int n_grp = n >= nth ? 1 : (int)((nth + n - 1) / n);
    if (n_grp > n_head) n_grp = n_head;
    mla_att_ctx c = {.tr = tr, .type = type, .n_head = n_head, .hd = hd, .n_grp = n_grp, .rb = hm_row_size(type, hd),
                     .q = q, .pos = pos, .cache = cache, .scale = scale, .out = out, .scratch = scratch,
                     .per_thread = hm_cpu_mla_scratch_floats(n_head, hd, 1), .n_items = n * n_grp};
    hm_pool_run(pool, mla_att_task, &c);
}
