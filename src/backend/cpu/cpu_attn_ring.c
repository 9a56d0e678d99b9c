/* cpu_attn_ring.c - the CPU's general KV cache and attention: rows of f32, f16, bf16 or ggml's
 * q8_0 / q4_0 blocks, position p at row p % cap (a sliding-window layer's ring; cap >= every
 * position: a plain cache), a window or none. Every cache but the plain f16 one goes through here:
 * gemma4's sliding and global layers, the exact f32 cache (--kv-type f32) and the bf16 / quantised
 * caches (-ctk q8_0) of every arch. Plain loops over (token, head) items, each output computed by
 * one thread in a fixed order (thread-count independent); prefill batches of every type but f32 go
 * to the tiled kernel (cpu_attn.c). A bf16 / quantised row is read through its type's to_float:
 * attention over such a cache is exact f32 attention over the dequantised values (q is never
 * quantised). */
#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/fp16.h"
#include "core/status.h"
#include "cpu_ops.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

/* sum a[i] b[i] and o += e b over a dequantised row (the bf16 / quantised caches only: the f16 and
 * f32 rows keep their scalar loops, whose results must not change), 16 lanes at a time where the
 * build has AVX-512 */
static float dot_row(const float *a, const float *b, int n) {
    int i = 0;
    float s = 0.0f;
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    s = _mm512_reduce_add_ps(acc);
#endif
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static void axpy_row(float *o, float e, const float *b, int n) {
    int i = 0;
#if defined(__AVX512F__)
    const __m512 ev = _mm512_set1_ps(e);
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(o + i, _mm512_fmadd_ps(ev, _mm512_loadu_ps(b + i), _mm512_loadu_ps(o + i)));
#endif
    for (; i < n; i++) o[i] += e * b[i];
}

static void split(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi) {
    *lo = n * ith / nth;
    *hi = n * (ith + 1) / nth;
}

typedef struct {
    char *kc, *vc;
    const float *k, *v, *q;
    float *out, *scratch;
    const int32_t *pos;
    size_t es;  /* element bytes of f32 / f16 rows; 0: another type, through the traits */
    size_t rb;  /* row bytes */
    const hm_type_traits *tt;
    int64_t cap, n_tok;
    int32_t window;
    int n_head, n_kv_head, head_dim;
    float scale;
    const float *sinks; /* [n_head] or NULL */
} kv_ctx;

static void store_row(const kv_ctx *c, char *dst, const float *src, int n) {
    if (c->es == 4) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else if (c->es == 2) {
        uint16_t *d = (uint16_t *)(void *)dst;
        for (int i = 0; i < n; i++) d[i] = hm_f32_to_fp16(src[i]);
    } else {
        c->tt->from_float(src, dst, n);
    }
}

bool hm_cpu_kv_row_ok(int type, int head_dim) {
    if (type != HM_TYPE_F32 && type != HM_TYPE_F16 && type != HM_TYPE_BF16 && type != HM_TYPE_Q8_0 &&
        type != HM_TYPE_Q4_0)
        return false;
    return head_dim > 0 && head_dim <= 512 && hm_row_size(type, head_dim) > 0;
}

static kv_ctx kv_ctx_of(int type, int head_dim) {
    kv_ctx c = {.es = type == HM_TYPE_F32 ? 4 : type == HM_TYPE_F16 ? 2 : 0, .rb = hm_row_size(type, head_dim),
                .tt = hm_type_get(type), .head_dim = head_dim};
    return c;
}

static void kv_write_task(void *p, int ith, int nth) {
    const kv_ctx *c = p;
    int64_t lo, hi;
    split(c->n_tok * c->n_kv_head, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        const int64_t t = i / c->n_kv_head, h = i % c->n_kv_head;
        const size_t row = (size_t)h * (size_t)c->cap + (size_t)(c->pos[t] % c->cap);
        const size_t off = row * c->rb, src = (size_t)i * (size_t)c->head_dim;
        store_row(c, c->kc + off, c->k + src, c->head_dim);
        store_row(c, c->vc + off, c->v + src, c->head_dim);
    }
}

void hm_cpu_kv_write_ring(hm_pool *pool, void *k_cache, void *v_cache, int type, int64_t cap,
                          int n_kv_head, int head_dim, const float *k, const float *v, int64_t n_tok,
                          const int32_t *pos) {
    HM_ASSERT(hm_cpu_kv_row_ok(type, head_dim) && cap > 0);
    for (int64_t t = 0; t < n_tok; t++) HM_ASSERT(pos[t] >= 0);
    kv_ctx c = kv_ctx_of(type, head_dim);
    c.kc = k_cache, c.vc = v_cache, c.k = k, c.v = v, c.pos = pos, c.cap = cap, c.n_tok = n_tok;
    c.n_kv_head = n_kv_head;
    hm_pool_run(pool, kv_write_task, &c);
}

size_t hm_cpu_attention_ring_scratch_floats(int64_t cap, int n_threads) {
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
        float deq[512]; /* a dequantised row (head_dim <= 512: hm_cpu_kv_row_ok) */
        for (int64_t s = p0; s <= p1; s++) {
            const size_t row = (base + (size_t)(s % c->cap)) * (size_t)d;
            float acc = 0;
            if (c->es == 0) {
                c->tt->to_float(c->kc + (base + (size_t)(s % c->cap)) * c->rb, deq, d);
                acc = dot_row(qv, deq, d);
            } else if (c->es == 4) {
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
            if (c->es == 0) {
                c->tt->to_float(c->vc + (base + (size_t)(s % c->cap)) * c->rb, deq, d);
                axpy_row(o, e, deq, d);
            } else if (c->es == 4) {
                const float *vr = (const float *)(const void *)c->vc + row;
                for (int j = 0; j < d; j++) o[j] += e * vr[j];
            } else {
                const uint16_t *vr = (const uint16_t *)(const void *)c->vc + row;
                for (int j = 0; j < d; j++) o[j] += e * hm_fp16_to_f32(vr[j]);
            }
        }
        float inv = (float)(1.0 / sum);
        if (c->sinks) { /* the sink joins the softmax's denominator only */
            const float sk = c->sinks[h], mx = sk > m ? sk : m, f = expf(m - mx);
            inv = (float)(f / (sum * f + expf(sk - mx)));
        }
        for (int j = 0; j < d; j++) o[j] *= inv;
    }
}

void hm_cpu_attention_ring(hm_pool *pool, const float *q, int64_t n_tok, const int32_t *pos,
                           const void *k_cache, const void *v_cache, int type, int64_t cap,
                           int32_t window, int n_head, int n_kv_head, int head_dim, float scale,
                           float *out, float *scratch) {
    hm_cpu_attention_ring_sinks(pool, q, n_tok, pos, k_cache, v_cache, type, cap, window, n_head, n_kv_head, head_dim,
                                scale, NULL, out, scratch);
}

void hm_cpu_attention_ring_sinks(hm_pool *pool, const float *q, int64_t n_tok, const int32_t *pos,
                                 const void *k_cache, const void *v_cache, int type, int64_t cap,
                                 int32_t window, int n_head, int n_kv_head, int head_dim, float scale,
                                 const float *sinks, float *out, float *scratch) {
    HM_ASSERT(n_kv_head > 0 && n_head % n_kv_head == 0 && hm_cpu_kv_row_ok(type, head_dim));
    if (type != HM_TYPE_F32 && hm_cpu_attn_tiled_takes(n_tok, n_head, n_kv_head, head_dim)) {
        hm_cpu_attention_tiled_sinks(pool, q, n_tok, pos, k_cache, v_cache, type, cap, window, n_head, n_kv_head,
                                     head_dim, scale, sinks, out, scratch);
        return;
    }
    kv_ctx c = kv_ctx_of(type, head_dim);
    c.kc = (char *)k_cache, c.vc = (char *)v_cache, c.q = q, c.out = out, c.scratch = scratch, c.pos = pos;
    c.cap = cap, c.n_tok = n_tok, c.window = window, c.n_head = n_head, c.n_kv_head = n_kv_head, c.scale = scale;
    c.sinks = sinks;
    hm_pool_run(pool, attn_task, &c);
}

/* ---- GELU-gated experts ---- */
