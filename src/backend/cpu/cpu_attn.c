/* cpu_attn.c - causal GQA attention over the plain f16 KV cache (the fast path), its cache write,
 * and the tiled prefill kernel.
 *
 * The tiled kernel at the end of this file (blocks of queries share every K/V conversion, online
 * softmax, ring caches and windows) runs the f16 prefill batches of the general cache
 * (hm_cpu_attention_ring, cpu_attn_ring.c, whose own per-query kernel is scalar). The plain cache
 * keeps the per-query kernels below for every batch: on the dev box both run pp512 after 4096
 * positions of qwen3-30b-a3b's attention at the same rate (`bench_cpu_ops -t 2`: 113 and 112
 * GFLOP/s), since the grouped path already shares each conversion over a GQA group's heads and
 * both are bound by their FMAs' loads.
 *
 * The same kernels read a plain bf16 / q8_0 / q4_0 cache (hm_cpu_attention_kv: decode over -ctk
 * q8_0): the grouped path's 16-row blocks come through the type's to_float instead of the f16
 * conversion, once per block for the GQA group's q heads.
 *
 * Work items are (query, kv head, KV split) on AVX-512 builds with head_dim % 16 == 0 (the
 * grouped path: the q heads of one kv head share each f16 -> f32 conversion of a 16-key K or V
 * block, and scores come 16 keys at a time), else (query, q head, KV split). With few items
 * (decode on many threads) the KV range is cut into n_split parts computed independently
 * (flash-decoding): each part keeps its max m, sum l and unnormalised output o, and after a
 * barrier the parts are merged in split order. Each part is two-pass: scores into a per-thread
 * buffer, then softmax and the weighted sum of V rows. */
#include "cpu_impl.h"
#include "core/fp16.h"

/* ---- f16 row helpers ---- */

static float dot_f32_f16(const float *q, const uint16_t *k, int n) {
    int i = 0;
#ifdef HM_CPU_AVX512
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        __m512 kv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(k + i)));
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), kv, acc);
    }
    float s = _mm512_reduce_add_ps(acc);
#else
    float s = 0.0f;
#endif
    for (; i < n; i++) s += q[i] * hm_fp16_to_f32(k[i]);
    return s;
}

/* o += a * v */
static void axpy_f16(float *o, float a, const uint16_t *v, int n) {
    int i = 0;
#ifdef HM_CPU_AVX512
    __m512 av = _mm512_set1_ps(a);
    for (; i + 16 <= n; i += 16) {
        __m512 vv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(v + i)));
        _mm512_storeu_ps(o + i, _mm512_fmadd_ps(av, vv, _mm512_loadu_ps(o + i)));
    }
#endif
    for (; i < n; i++) o[i] += a * hm_fp16_to_f32(v[i]);
}

static void f32_to_f16_row(const float *x, uint16_t *y, int n) {
    int i = 0;
#ifdef HM_CPU_AVX512
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(y + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
    for (; i < n; i++) y[i] = hm_f32_to_fp16(x[i]);
}

/* ---- cache write ---- */

typedef struct {
    uint16_t *kc, *vc;
    int64_t n_ctx, n_tok;
    int n_kv_head, head_dim;
    const float *k, *v;
    const int32_t *pos;
} kvw_ctx;

static void kvw_task(void *vctx, int ith, int nth) {
    const kvw_ctx *c = vctx;
    int64_t lo, hi;
    hm_split(c->n_tok * c->n_kv_head, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        int64_t t = i / c->n_kv_head, h = i % c->n_kv_head;
        HM_ASSERT(c->pos[t] >= 0 && c->pos[t] < c->n_ctx);
        size_t dst = ((size_t)h * (size_t)c->n_ctx + (size_t)c->pos[t]) * (size_t)c->head_dim;
        size_t src = ((size_t)t * (size_t)c->n_kv_head + (size_t)h) * (size_t)c->head_dim;
        f32_to_f16_row(c->k + src, c->kc + dst, c->head_dim);
        f32_to_f16_row(c->v + src, c->vc + dst, c->head_dim);
    }
}

void hm_cpu_kv_write(hm_pool *pool, uint16_t *k_cache, uint16_t *v_cache, int64_t n_ctx,
                     int n_kv_head, int head_dim, const float *k, const float *v, int64_t n_tok,
                     const int32_t *pos) {
    kvw_ctx c = {k_cache, v_cache, n_ctx, n_tok, n_kv_head, head_dim, k, v, pos};
    if (n_tok * n_kv_head * head_dim < 16384) kvw_task(&c, 0, 1);
    else hm_pool_run(pool, kvw_task, &c);
}

/* ---- attention ---- */

typedef struct {
    hm_pool *pool;
    const float *q;
    const int32_t *pos;
    const uint16_t *kc, *vc;  /* f16 rows, or (quant) the bytes of bf16 / q8_0 / q4_0 rows */
    const hm_type_traits *tt; /* quant: the rows' type (the grouped path only) */
    int quant;
    size_t rb;                /* bytes of a row */
    float *out;
    int64_t n_tok, n_ctx;
    int n_head, n_kv_head, head_dim, n_split;
    float scale;
    int grouped;     /* items are (query, kv head, split) over n_head / n_kv_head q heads */
    size_t sc_stride; /* floats per thread in scores */
    float *scores;   /* per thread: [n_head][n_ctx rounded up + 16] */
    float *tiles;    /* per thread: [16][head_dim] f32 K or V block */
    float *partials; /* [n_tok * n_head * n_split, head_dim + 2] when n_split > 1 */
    _Alignas(64) _Atomic int64_t next;
} attn_ctx;

static int attn_splits(int64_t n_tok, int n_head, int nth) {
    int64_t pairs = n_tok * n_head;
    if (pairs >= 4 * (int64_t)nth) return 1;
    return (int)((4 * (int64_t)nth + pairs - 1) / pairs);
}

static size_t sc_stride(int64_t n_ctx, int n_head) {
    return (size_t)n_head * (size_t)(hm_align_up((uint64_t)n_ctx, 16) + 16);
}

size_t hm_cpu_attention_scratch_size(int64_t n_tok, int64_t n_ctx, int n_head, int head_dim,
                                     int n_threads) {
    size_t s = 4 * HM_ALIGN;
    s += (size_t)n_threads * sc_stride(n_ctx, n_head) * sizeof(float);
    s += (size_t)n_threads * 16 * (size_t)head_dim * sizeof(float);
    /* partials: a call with n <= n_tok queries splits only when n * heads < 4 * nth, into
     * ceil(4 * nth / (n * heads)) parts, so n * n_split <= 4 * nth + n < 8 * nth per head */
    (void)n_tok;
    s += (size_t)n_head * 8 * (size_t)n_threads * ((size_t)head_dim + 2) * sizeof(float);
    return s;
}

/* One (t, h, split) item: unnormalised o over its KV range, with its max and sum. */
static void attn_item(const attn_ctx *c, int64_t item, float *sc, float *o, float *m_out, float *l_out) {
    const int64_t s = item % c->n_split;
    const int64_t th = item / c->n_split;
    const int64_t t = th / c->n_head;
    const int h = (int)(th % c->n_head);
    const int d = c->head_dim;
    const int kvh = h / (c->n_head / c->n_kv_head);
    const int64_t n_kv = (int64_t)c->pos[t] + 1;
    const int64_t p0 = n_kv * s / c->n_split, p1 = n_kv * (s + 1) / c->n_split;
    const float *qv = c->q + (t * c->n_head + h) * d;
    const uint16_t *kb = c->kc + (size_t)kvh * (size_t)c->n_ctx * (size_t)d;
    const uint16_t *vb = c->vc + (size_t)kvh * (size_t)c->n_ctx * (size_t)d;
    float m = -INFINITY;
    for (int64_t p = p0; p < p1; p++) {
        float v = c->scale * dot_f32_f16(qv, kb + p * d, d);
        sc[p - p0] = v;
        m = v > m ? v : m;
    }
    float l = p1 > p0 ? hm_exp_sub_sum(sc, p1 - p0, m) : 0.0f;
    memset(o, 0, (size_t)d * sizeof(float));
    for (int64_t p = p0; p < p1; p++) axpy_f16(o, sc[p - p0], vb + p * d, d);
    *m_out = m;
    *l_out = l;
}

#ifdef HM_CPU_AVX512
/* 16 vectors -> one vector of their 16 horizontal sums, lane j = sum of v[j]. */
static inline __m512 reduce16(__m512 *v) {
    __m512 a[8], b[4];
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44), _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xee));
    for (int i = 0; i < 4; i++)
        b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x88), _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xdd));
    /* b[i] chunk k: 4 partial lanes of v[4i + k] */
    __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(b[0], b[1]), _mm512_unpackhi_ps(b[0], b[1]));
    __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(b[2], b[3]), _mm512_unpackhi_ps(b[2], b[3]));
    __m512 r = _mm512_add_ps(_mm512_shuffle_ps(t0, t1, 0x44), _mm512_shuffle_ps(t0, t1, 0xee));
    /* lane 4k + i holds v[4i + k] */
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(idx, r);
}

/* rows [p, p + nk) of an f16 [.., d] block -> tile [16][d] f32, rows >= nk zeroed */
static void f16_block(const uint16_t *src, int nk, int d, float *tile) {
    for (int j = 0; j < 16; j++)
        for (int i = 0; i < d; i += 16)
            _mm512_storeu_ps(tile + j * d + i, j < nk ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + (size_t)j * d + i)))
                                                      : _mm512_setzero_ps());
}

/* rows [0, nk) of a bf16 / quantised block (rows rb bytes apart) -> tile [16][d] f32, rows >= nk zeroed */
static void quant_block(const hm_type_traits *tt, const char *src, size_t rb, int nk, int d, float *tile) {
    const bool q8 = tt == hm_type_get(HM_TYPE_Q8_0);
    for (int j = 0; j < 16; j++) {
        if (j >= nk) {
            memset(tile + j * d, 0, (size_t)d * sizeof(float));
        } else if (q8) { /* inline: code * scale, 16 at a time (the values to_float gives) */
            const char *row = src + (size_t)j * rb;
            for (int b = 0; b < d / 32; b++) {
                const char *blk = row + (size_t)b * 34;
                uint16_t dh;
                memcpy(&dh, blk, 2);
                const __m512 sc = _mm512_set1_ps(hm_fp16_to_f32(dh));
                for (int h = 0; h < 2; h++) {
                    const __m128i c8 = _mm_loadu_si128((const __m128i *)(const void *)(blk + 2 + 16 * h));
                    _mm512_storeu_ps(tile + j * d + 32 * b + 16 * h,
                                     _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c8)), sc));
                }
            }
        } else {
            tt->to_float(src + (size_t)j * rb, tile + j * d, d);
        }
    }
}

/* Grouped item (t, kv head g, split s): the n_rep q heads of g share every K/V block conversion.
 * Per head: scores of 16 keys per step (one reduce16), softmax, then o += p V over 16-key tiles. */
static void attn_group_item(const attn_ctx *c, int64_t item, float *sc, float *tile) {
    const int d = c->head_dim, nd = d / 16;
    const int n_rep = c->n_head / c->n_kv_head;
    const int64_t s = item % c->n_split;
    const int64_t tg = item / c->n_split;
    const int64_t t = tg / c->n_kv_head;
    const int g = (int)(tg % c->n_kv_head);
    const int64_t n_kv = (int64_t)c->pos[t] + 1;
    const int64_t p0 = n_kv * s / c->n_split, p1 = n_kv * (s + 1) / c->n_split, len = p1 - p0;
    const size_t scs = (size_t)(hm_align_up((uint64_t)c->n_ctx, 16) + 16);
    const uint16_t *kb = c->kc + (size_t)g * (size_t)c->n_ctx * (size_t)d;
    const uint16_t *vb = c->vc + (size_t)g * (size_t)c->n_ctx * (size_t)d;
    const char *kq = (const char *)c->kc + (size_t)g * (size_t)c->n_ctx * c->rb;
    const char *vq = (const char *)c->vc + (size_t)g * (size_t)c->n_ctx * c->rb;
    const __m512 scale = _mm512_set1_ps(c->scale);
    for (int64_t p = p0; p < p1; p += 16) {
        const int nk = (int)(p1 - p < 16 ? p1 - p : 16);
        if (c->quant) quant_block(c->tt, kq + (size_t)p * c->rb, c->rb, nk, d, tile);
        else f16_block(kb + p * d, nk, d, tile);
        for (int r = 0; r < n_rep; r++) {
            const float *qv = c->q + (t * c->n_head + g * n_rep + r) * d;
            __m512 acc[16];
            for (int j = 0; j < 16; j++) acc[j] = _mm512_setzero_ps();
            for (int i = 0; i < nd; i++) {
                const __m512 qi = _mm512_loadu_ps(qv + 16 * i);
                for (int j = 0; j < 16; j++) acc[j] = _mm512_fmadd_ps(qi, _mm512_loadu_ps(tile + j * d + 16 * i), acc[j]);
            }
            _mm512_mask_storeu_ps(sc + r * scs + (p - p0), (__mmask16)((1u << nk) - 1), _mm512_mul_ps(reduce16(acc), scale));
        }
    }
    float m[64], l[64];
    HM_ASSERT(n_rep <= 64);
    for (int r = 0; r < n_rep; r++) {
        const float *sr = sc + r * scs;
        const float mx = hm_max_f32(sr, len);
        m[r] = mx;
        l[r] = len > 0 ? hm_exp_sub_sum(sc + r * scs, len, mx) : 0.0f;
    }
    float *dst[64];
    for (int r = 0; r < n_rep; r++) {
        const int64_t th = t * c->n_head + g * n_rep + r;
        dst[r] = c->n_split == 1 ? c->out + th * d : c->partials + (th * c->n_split + s) * (d + 2) + 2;
        memset(dst[r], 0, (size_t)d * sizeof(float));
    }
    for (int64_t p = p0; p < p1; p += 16) {
        const int nk = (int)(p1 - p < 16 ? p1 - p : 16);
        if (c->quant) quant_block(c->tt, vq + (size_t)p * c->rb, c->rb, nk, d, tile);
        else f16_block(vb + p * d, nk, d, tile);
        for (int r = 0; r < n_rep; r++) {
            const float *pr = sc + r * scs + (p - p0);
            float *o = dst[r];
            if (nd <= 16) { /* o in registers, one broadcast per key */
                __m512 ov[16];
                for (int i = 0; i < nd; i++) ov[i] = _mm512_loadu_ps(o + 16 * i);
                for (int j = 0; j < nk; j++) {
                    const __m512 pj = _mm512_set1_ps(pr[j]);
                    for (int i = 0; i < nd; i++) ov[i] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(tile + j * d + 16 * i), ov[i]);
                }
                for (int i = 0; i < nd; i++) _mm512_storeu_ps(o + 16 * i, ov[i]);
            } else {
                for (int i = 0; i < nd; i++) {
                    __m512 ov = _mm512_loadu_ps(o + 16 * i);
                    for (int j = 0; j < nk; j++) ov = _mm512_fmadd_ps(_mm512_set1_ps(pr[j]), _mm512_loadu_ps(tile + j * d + 16 * i), ov);
                    _mm512_storeu_ps(o + 16 * i, ov);
                }
            }
        }
    }
    for (int r = 0; r < n_rep; r++) {
        if (c->n_split == 1) {
            const float inv = 1.0f / l[r];
            for (int i = 0; i < d; i++) dst[r][i] *= inv;
        } else {
            dst[r][-2] = m[r];
            dst[r][-1] = l[r];
        }
    }
}
#endif

static void attn_task(void *vctx, int ith, int nth) {
    attn_ctx *c = vctx;
    float *sc = c->scores + (size_t)ith * c->sc_stride;
    const int d = c->head_dim;
    const int64_t n_items = c->n_tok * (c->grouped ? c->n_kv_head : c->n_head) * c->n_split;
    for (int64_t k = ith; k < n_items;) {
#ifdef HM_CPU_AVX512
        if (c->grouped) {
            attn_group_item(c, k, sc, c->tiles + (size_t)ith * 16 * (size_t)d);
            k = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed);
            continue;
        }
#endif
        if (c->n_split == 1) {
            float *o = c->out + k * d; /* item k = (t, h): out row t, head h */
            float m, l;
            attn_item(c, k, sc, o, &m, &l);
            float inv = 1.0f / l;
            for (int i = 0; i < d; i++) o[i] *= inv;
        } else {
            float *pp = c->partials + k * (d + 2);
            attn_item(c, k, sc, pp + 2, &pp[0], &pp[1]);
        }
        k = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed);
    }
    if (c->n_split == 1) return;
    hm_pool_barrier(c->pool);
    int64_t lo, hi;
    hm_split(c->n_tok * c->n_head, ith, nth, &lo, &hi);
    for (int64_t th = lo; th < hi; th++) {
        const float *pp = c->partials + th * c->n_split * (d + 2);
        float m = -INFINITY;
        for (int s = 0; s < c->n_split; s++) m = pp[s * (d + 2)] > m ? pp[s * (d + 2)] : m;
        float *o = c->out + th * d;
        memset(o, 0, (size_t)d * sizeof(float));
        float l = 0.0f;
        for (int s = 0; s < c->n_split; s++) {
            const float *ps = pp + s * (d + 2);
            if (ps[1] == 0.0f) continue; /* empty range */
            float f = expf(ps[0] - m);
            l += f * ps[1];
            for (int i = 0; i < d; i++) o[i] += f * ps[2 + i];
        }
        float inv = 1.0f / l;
        for (int i = 0; i < d; i++) o[i] *= inv;
    }
}

static void attention(hm_pool *pool, int type, const float *q, int64_t n_tok, const int32_t *pos, const void *k_cache,
                      const void *v_cache, int64_t n_ctx, int n_head, int n_kv_head, int head_dim, float scale,
                      float *out, hm_scratch *scratch);

void hm_cpu_attention(hm_pool *pool, const float *q, int64_t n_tok, const int32_t *pos,
                      const uint16_t *k_cache, const uint16_t *v_cache, int64_t n_ctx, int n_head,
                      int n_kv_head, int head_dim, float scale, float *out, hm_scratch *scratch) {
    attention(pool, HM_TYPE_F16, q, n_tok, pos, k_cache, v_cache, n_ctx, n_head, n_kv_head, head_dim, scale, out,
              scratch);
}

bool hm_cpu_attention_kv_takes(int type, int head_dim) {
#ifdef HM_CPU_AVX512
    return (type == HM_TYPE_BF16 || type == HM_TYPE_Q8_0 || type == HM_TYPE_Q4_0) && head_dim % 16 == 0 &&
           head_dim <= 512 && hm_cpu_kv_row_ok(type, head_dim);
#else
    (void)type, (void)head_dim;
    return false;
#endif
}

void hm_cpu_attention_kv(hm_pool *pool, int type, const float *q, int64_t n_tok, const int32_t *pos,
                         const void *k_cache, const void *v_cache, int64_t n_ctx, int n_head, int n_kv_head,
                         int head_dim, float scale, float *out, hm_scratch *scratch) {
    HM_ASSERT(hm_cpu_attention_kv_takes(type, head_dim));
    attention(pool, type, q, n_tok, pos, k_cache, v_cache, n_ctx, n_head, n_kv_head, head_dim, scale, out, scratch);
}

static void attention(hm_pool *pool, int type, const float *q, int64_t n_tok, const int32_t *pos, const void *k_cache,
                      const void *v_cache, int64_t n_ctx, int n_head, int n_kv_head, int head_dim, float scale,
                      float *out, hm_scratch *scratch) {
    HM_ASSERT(n_kv_head > 0 && n_head % n_kv_head == 0);
    const int nth = hm_pool_size(pool);
    attn_ctx c;
    memset(&c, 0, sizeof c);
    c.pool = pool;
    c.q = q;
    c.pos = pos;
    c.kc = k_cache;
    c.vc = v_cache;
    c.quant = type != HM_TYPE_F16;
    c.tt = hm_type_get(type);
    c.rb = hm_row_size(type, head_dim);
    c.out = out;
    c.n_tok = n_tok;
    c.n_ctx = n_ctx;
    c.n_head = n_head;
    c.n_kv_head = n_kv_head;
    c.head_dim = head_dim;
    c.scale = scale;
#ifdef HM_CPU_AVX512
    c.grouped = head_dim % 16 == 0 && head_dim <= 512;
#endif
    HM_ASSERT(!c.quant || c.grouped); /* bf16 / quantised rows: the grouped path only */
    c.n_split = attn_splits(n_tok, c.grouped ? n_kv_head : n_head, nth);
    for (int64_t t = 0; t < n_tok; t++) HM_ASSERT(pos[t] >= 0 && pos[t] < n_ctx);
    hm_bump b = hm_bump_init(scratch);
    c.sc_stride = sc_stride(n_ctx, n_head);
    c.scores = hm_bump_take(&b, (size_t)nth * c.sc_stride * sizeof(float));
    c.tiles = hm_bump_take(&b, (size_t)nth * 16 * (size_t)head_dim * sizeof(float));
    if (c.n_split > 1)
        c.partials = hm_bump_take(&b, (size_t)(n_tok * n_head * c.n_split) * ((size_t)head_dim + 2) * sizeof(float));
    atomic_init(&c.next, nth);
    hm_pool_run(pool, attn_task, &c);
}

/* ---- tiled prefill attention (online softmax) ----
 *
 * Any cache row type but f32: f16 blocks are converted in registers, bf16 and quantised (q8_0,
 * q4_0) rows go through their type's to_float into the same f32 tile, once per block of queries.
 *
 * An item is (block of up to TQ consecutive queries, kv head g). It walks the keys its queries can
 * see in blocks of 16: each K and V block is converted to f32 once and used by every (query, q
 * head of g) row of the item, TQ * n_rep rows, instead of once per query; each row keeps a running
 * max m, sum l and unnormalised output o (online softmax), so there is no score buffer over the
 * context. Per row and block: 16 scores (one reduce16), masked to the row's visible keys, then
 * o = o * e^(m_old - m) + sum_j e^(s_j - m) v_j. Every output row has one writer and a fixed
 * order of operations: deterministic for any thread count. */
#define TQ 8

bool hm_cpu_attn_tiled_takes(int64_t n_tok, int n_head, int n_kv_head, int head_dim) {
#ifdef HM_CPU_AVX512
    return n_tok >= HM_CPU_ATTN_TILED_MIN && head_dim % 16 == 0 && head_dim <= 512 && n_kv_head > 0 &&
           n_head % n_kv_head == 0 && n_head / n_kv_head <= 64;
#else
    (void)n_tok, (void)n_head, (void)n_kv_head, (void)head_dim;
    return false;
#endif
}

/* floats of one thread's workspace: the K and V tiles, then per row o [d], m, l */
static size_t tiled_ws_floats(int n_head, int n_kv_head, int head_dim) {
    const size_t rows = (size_t)TQ * (size_t)(n_head / (n_kv_head > 0 ? n_kv_head : 1));
    return hm_align_up(2 * 16 * (size_t)head_dim + rows * ((size_t)head_dim + 2), 16);
}

size_t hm_cpu_attn_tiled_scratch_floats(int n_head, int n_kv_head, int head_dim, int n_threads) {
    return (size_t)n_threads * tiled_ws_floats(n_head, n_kv_head, head_dim);
}

#ifdef HM_CPU_AVX512
typedef struct {
    const float *q;
    const int32_t *pos;
    const char *kc, *vc;
    const hm_type_traits *tt; /* the cache's row type: f16 (converted here) or another, through to_float */
    int f16;
    size_t rb;                /* row bytes */
    float *out, *ws;
    int64_t n_tok, cap;
    int32_t window;
    int n_head, n_kv_head, head_dim;
    float scale;
    const float *sinks;       /* [n_head] or NULL */
    size_t ws_floats;
    _Alignas(64) _Atomic int64_t next;
} tiled_ctx;

/* rows p .. p + nk - 1 of a ring cache (row p % cap) -> tile [16][d] f32, rows >= nk zeroed */
static void ring_block(const tiled_ctx *c, const char *kvb, int64_t p, int nk, float *tile) {
    const int64_t cap = c->cap;
    const int d = c->head_dim;
    if (!c->f16) { /* bf16 / quantised rows: the type's dequantisation, row by row */
        for (int j = 0; j < 16; j++) {
            if (j < nk) c->tt->to_float(kvb + (size_t)((p + j) % cap) * c->rb, tile + j * d, d);
            else memset(tile + j * d, 0, (size_t)d * sizeof(float));
        }
        return;
    }
    const uint16_t *base = (const uint16_t *)(const void *)kvb;
    for (int j = 0; j < 16; j++) {
        const uint16_t *src = j < nk ? base + (size_t)((p + j) % cap) * (size_t)d : NULL;
        for (int i = 0; i < d; i += 16)
            _mm512_storeu_ps(tile + j * d + i, src ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i)))
                                                   : _mm512_setzero_ps());
    }
}

static void tiled_item(const tiled_ctx *c, int64_t item, float *ws) {
    const int d = c->head_dim, nd = d / 16, n_rep = c->n_head / c->n_kv_head;
    const int64_t t0 = item / c->n_kv_head * TQ;
    const int g = (int)(item % c->n_kv_head);
    const int nq = (int)(c->n_tok - t0 < TQ ? c->n_tok - t0 : TQ), rows = nq * n_rep;
    float *kt = ws, *vt = kt + 16 * d, *o = vt + 16 * d, *m = o + (size_t)TQ * n_rep * d, *l = m + TQ * n_rep;
    int64_t lo = INT64_MAX, hi = -1, qlo[TQ], qhi[TQ];
    for (int i = 0; i < nq; i++) {
        qhi[i] = c->pos[t0 + i];
        qlo[i] = c->window > 0 ? qhi[i] - c->window + 1 : 0;
        if (qlo[i] < 0) qlo[i] = 0;
        lo = qlo[i] < lo ? qlo[i] : lo;
        hi = qhi[i] > hi ? qhi[i] : hi;
    }
    for (int r = 0; r < rows; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    memset(o, 0, (size_t)rows * (size_t)d * sizeof(float));
    const char *kb = c->kc + (size_t)g * (size_t)c->cap * c->rb;
    const char *vb = c->vc + (size_t)g * (size_t)c->cap * c->rb;
    const __m512 scale = _mm512_set1_ps(c->scale), ninf = _mm512_set1_ps(-INFINITY);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int64_t p = lo; p <= hi; p += 16) {
        const int nk = (int)(hi + 1 - p < 16 ? hi + 1 - p : 16);
        ring_block(c, kb, p, nk, kt);
        ring_block(c, vb, p, nk, vt);
        for (int i = 0; i < nq; i++) {
            if (p > qhi[i] || p + nk <= qlo[i]) continue; /* no visible key in this block */
            /* lanes j with qlo <= p + j <= qhi */
            const __m512i key = _mm512_add_epi32(_mm512_set1_epi32((int)(p - lo)), lane);
            const __mmask16 vis = _mm512_cmple_epi32_mask(_mm512_set1_epi32((int)(qlo[i] - lo)), key) &
                                  _mm512_cmple_epi32_mask(key, _mm512_set1_epi32((int)(qhi[i] - lo)));
            for (int r = 0; r < n_rep; r++) {
                const int row = i * n_rep + r;
                const float *qv = c->q + ((t0 + i) * c->n_head + g * n_rep + r) * d;
                __m512 acc[16];
                for (int j = 0; j < 16; j++) acc[j] = _mm512_setzero_ps();
                for (int k = 0; k < nd; k++) {
                    const __m512 qk = _mm512_loadu_ps(qv + 16 * k);
                    for (int j = 0; j < 16; j++) acc[j] = _mm512_fmadd_ps(qk, _mm512_loadu_ps(kt + j * d + 16 * k), acc[j]);
                }
                const __m512 s = _mm512_mask_blend_ps(vis, ninf, _mm512_mul_ps(reduce16(acc), scale));
                const float bm = _mm512_reduce_max_ps(s), mn = bm > m[row] ? bm : m[row];
                const float corr = expf(m[row] - mn); /* 0 while m was -inf */
                const __m512 e = _mm512_maskz_mov_ps(vis, hm_exp_ps(_mm512_sub_ps(s, _mm512_set1_ps(mn))));
                l[row] = l[row] * corr + _mm512_reduce_add_ps(e);
                m[row] = mn;
                float ej[16];
                _mm512_storeu_ps(ej, e);
                float *orow = o + (size_t)row * d;
                const __m512 cv = _mm512_set1_ps(corr);
                if (nd <= 16) {
                    __m512 ov[16];
                    for (int k = 0; k < nd; k++) ov[k] = _mm512_mul_ps(_mm512_loadu_ps(orow + 16 * k), cv);
                    for (int j = 0; j < nk; j++) {
                        const __m512 pj = _mm512_set1_ps(ej[j]);
                        for (int k = 0; k < nd; k++) ov[k] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vt + j * d + 16 * k), ov[k]);
                    }
                    for (int k = 0; k < nd; k++) _mm512_storeu_ps(orow + 16 * k, ov[k]);
                } else {
                    for (int k = 0; k < nd; k++) {
                        __m512 ov = _mm512_mul_ps(_mm512_loadu_ps(orow + 16 * k), cv);
                        for (int j = 0; j < nk; j++)
                            ov = _mm512_fmadd_ps(_mm512_set1_ps(ej[j]), _mm512_loadu_ps(vt + j * d + 16 * k), ov);
                        _mm512_storeu_ps(orow + 16 * k, ov);
                    }
                }
            }
        }
    }
    for (int i = 0; i < nq; i++)
        for (int r = 0; r < n_rep; r++) {
            const int row = i * n_rep + r;
            float iv = 1.0f / l[row];
            if (c->sinks) { /* the sink joins the softmax's denominator only */
                const float sk = c->sinks[g * n_rep + r], mx = sk > m[row] ? sk : m[row], f = expf(m[row] - mx);
                iv = f / (l[row] * f + expf(sk - mx));
            }
            const __m512 inv = _mm512_set1_ps(iv);
            float *dst = c->out + ((t0 + i) * c->n_head + g * n_rep + r) * d;
            for (int k = 0; k < nd; k++)
                _mm512_storeu_ps(dst + 16 * k, _mm512_mul_ps(_mm512_loadu_ps(o + (size_t)row * d + 16 * k), inv));
        }
}

static void tiled_task(void *vctx, int ith, int nth) {
    tiled_ctx *c = vctx;
    (void)nth;
    float *ws = c->ws + (size_t)ith * c->ws_floats;
    const int64_t n_items = (c->n_tok + TQ - 1) / TQ * c->n_kv_head;
    for (int64_t k = ith; k < n_items; k = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed))
        tiled_item(c, k, ws);
}
#endif

void hm_cpu_attention_tiled(hm_pool *pool, const float *q, int64_t n_tok, const int32_t *pos,
                            const void *k_cache, const void *v_cache, int type, int64_t cap, int32_t window,
                            int n_head, int n_kv_head, int head_dim, float scale, float *out, float *ws) {
    hm_cpu_attention_tiled_sinks(pool, q, n_tok, pos, k_cache, v_cache, type, cap, window, n_head, n_kv_head, head_dim,
                                 scale, NULL, out, ws);
}

void hm_cpu_attention_tiled_sinks(hm_pool *pool, const float *q, int64_t n_tok, const int32_t *pos,
                                  const void *k_cache, const void *v_cache, int type, int64_t cap, int32_t window,
                                  int n_head, int n_kv_head, int head_dim, float scale, const float *sinks,
                                  float *out, float *ws) {
    HM_ASSERT(hm_cpu_attn_tiled_takes(n_tok, n_head, n_kv_head, head_dim) && cap > 0 && window >= 0);
    HM_ASSERT(type != HM_TYPE_F32 && hm_cpu_kv_row_ok(type, head_dim));
#ifdef HM_CPU_AVX512
    for (int64_t t = 0; t < n_tok; t++) HM_ASSERT(pos[t] >= 0 && (window > 0 ? window <= cap : pos[t] < cap));
    const int nth = hm_pool_size(pool);
    tiled_ctx c = {.q = q, .pos = pos, .kc = k_cache, .vc = v_cache, .tt = hm_type_get(type), .f16 = type == HM_TYPE_F16,
                   .rb = hm_row_size(type, head_dim), .out = out, .ws = ws, .n_tok = n_tok, .cap = cap,
                   .window = window, .n_head = n_head, .n_kv_head = n_kv_head, .head_dim = head_dim, .scale = scale,
                   .sinks = sinks, .ws_floats = tiled_ws_floats(n_head, n_kv_head, head_dim)};
    atomic_init(&c.next, nth);
    hm_pool_run(pool, tiled_task, &c);
#else
    (void)pool, (void)q, (void)pos, (void)k_cache, (void)v_cache, (void)type, (void)scale, (void)sinks, (void)out,
        (void)ws;
#endif
}
