/* quant_q8_0_avx2.c - AVX2 (+FMA, F16C) variants of the Q8_0 family: Q4_0/Q5_0/Q8_0/MXFP4 x Q8_0
 * dot products, dequantisation and the Q8_0 activation quantiser, for CPUs without AVX-512.
 *
 * Dot products: one block per 256-bit register; signed weights q and activations y are
 * multiplied as |q| * (y with q's sign) by vpmaddubsw (exact while y avoids -128, which the
 * quantiser never writes), pairs summed by vpmaddwd, the block sum scaled by dx*dy and
 * accumulated in float. Conversions are bit-exact with the scalar reference. */
#include "quant_impl.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <string.h>

#include "core/fp16.h"

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Eight int32 lanes whose total is sum(x*y) over 32 signed bytes, as floats. */
static inline __m256 dot_s8s8(__m256i x, __m256i y) {
    __m256i ax = _mm256_sign_epi8(x, x);
    __m256i sy = _mm256_sign_epi8(y, x);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1)));
}

/* 32 nibbles of a 16-byte block in element order: low nibbles then high, values 0..15. */
static inline __m256i nibbles(const uint8_t *q) {
    __m128i b = _mm_loadu_si128((const __m128i *)q);
    const __m128i m4 = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m4), _mm_and_si128(b, m4));
}

/* The 32 codes of a q5_0 block minus 16 (-16..15), in element order: the nibble, with 0xf0
 * or'ed in where the fifth bit is clear (nibble - 16 as a signed byte). */
static inline __m256i q5_0_codes(const hm_block_q5_0 *b) {
    uint32_t qh;
    memcpy(&qh, b->qh, 4);
    /* byte k = qh byte k/8, then keep bit k%8 */
    const __m256i spread = _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
    const __m256i bitsel = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i h = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread), bitsel);
    __m256i clear = _mm256_andnot_si256(_mm256_cmpeq_epi8(h, bitsel), _mm256_set1_epi8((char)0xf0));
    return _mm256_or_si256(nibbles(b->qs), clear);
}

static void vec_dot_q8_0_q8_0_avx2(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q8_0 *x = vx;
    const hm_block_q8_0 *y = vy;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    const int64_t nb = n / HM_QK8_0;
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        __m256 p0 = dot_s8s8(_mm256_loadu_si256((const __m256i *)x[i].qs), _mm256_loadu_si256((const __m256i *)y[i].qs));
        __m256 p1 = dot_s8s8(_mm256_loadu_si256((const __m256i *)x[i + 1].qs),
                             _mm256_loadu_si256((const __m256i *)y[i + 1].qs));
        acc0 = _mm256_fmadd_ps(p0, _mm256_set1_ps(_cvtsh_ss(x[i].d) * _cvtsh_ss(y[i].d)), acc0);
        acc1 = _mm256_fmadd_ps(p1, _mm256_set1_ps(_cvtsh_ss(x[i + 1].d) * _cvtsh_ss(y[i + 1].d)), acc1);
    }
    if (i < nb) {
        __m256 p0 = dot_s8s8(_mm256_loadu_si256((const __m256i *)x[i].qs), _mm256_loadu_si256((const __m256i *)y[i].qs));
        acc0 = _mm256_fmadd_ps(p0, _mm256_set1_ps(_cvtsh_ss(x[i].d) * _cvtsh_ss(y[i].d)), acc0);
    }
    *out = hsum8(_mm256_add_ps(acc0, acc1));
}

static void vec_dot_q4_0_q8_0_avx2(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q4_0 *x = vx;
    const hm_block_q8_0 *y = vy;
    const __m256i eight = _mm256_set1_epi8(8);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    const int64_t nb = n / HM_QK4_0;
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        __m256 p0 = dot_s8s8(_mm256_sub_epi8(nibbles(x[i].qs), eight), _mm256_loadu_si256((const __m256i *)y[i].qs));
        __m256 p1 = dot_s8s8(_mm256_sub_epi8(nibbles(x[i + 1].qs), eight),
                             _mm256_loadu_si256((const __m256i *)y[i + 1].qs));
        acc0 = _mm256_fmadd_ps(p0, _mm256_set1_ps(_cvtsh_ss(x[i].d) * _cvtsh_ss(y[i].d)), acc0);
        acc1 = _mm256_fmadd_ps(p1, _mm256_set1_ps(_cvtsh_ss(x[i + 1].d) * _cvtsh_ss(y[i + 1].d)), acc1);
    }
    if (i < nb) {
        __m256 p0 = dot_s8s8(_mm256_sub_epi8(nibbles(x[i].qs), eight), _mm256_loadu_si256((const __m256i *)y[i].qs));
        acc0 = _mm256_fmadd_ps(p0, _mm256_set1_ps(_cvtsh_ss(x[i].d) * _cvtsh_ss(y[i].d)), acc0);
    }
    *out = hsum8(_mm256_add_ps(acc0, acc1));
}

static void vec_dot_q5_0_q8_0_avx2(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q5_0 *x = vx;
    const hm_block_q8_0 *y = vy;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    const int64_t nb = n / HM_QK5_0;
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        __m256 p0 = dot_s8s8(q5_0_codes(&x[i]), _mm256_loadu_si256((const __m256i *)y[i].qs));
        __m256 p1 = dot_s8s8(q5_0_codes(&x[i + 1]), _mm256_loadu_si256((const __m256i *)y[i + 1].qs));
        acc0 = _mm256_fmadd_ps(p0, _mm256_set1_ps(_cvtsh_ss(x[i].d) * _cvtsh_ss(y[i].d)), acc0);
        acc1 = _mm256_fmadd_ps(p1, _mm256_set1_ps(_cvtsh_ss(x[i + 1].d) * _cvtsh_ss(y[i + 1].d)), acc1);
    }
    if (i < nb) {
        __m256 p0 = dot_s8s8(q5_0_codes(&x[i]), _mm256_loadu_si256((const __m256i *)y[i].qs));
        acc0 = _mm256_fmadd_ps(p0, _mm256_set1_ps(_cvtsh_ss(x[i].d) * _cvtsh_ss(y[i].d)), acc0);
    }
    *out = hsum8(_mm256_add_ps(acc0, acc1));
}

static void vec_dot_mxfp4_q8_0_avx2(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_mxfp4 *x = vx;
    const hm_block_q8_0 *y = vy;
    const __m256i tab = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)hm_kvalues_mxfp4));
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    const int64_t nb = n / HM_QK_MXFP4;
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        __m256 p0 = dot_s8s8(_mm256_shuffle_epi8(tab, nibbles(x[i].qs)), _mm256_loadu_si256((const __m256i *)y[i].qs));
        __m256 p1 = dot_s8s8(_mm256_shuffle_epi8(tab, nibbles(x[i + 1].qs)),
                             _mm256_loadu_si256((const __m256i *)y[i + 1].qs));
        acc0 = _mm256_fmadd_ps(p0, _mm256_set1_ps(hm_e8m0_to_f32_half(x[i].e) * _cvtsh_ss(y[i].d)), acc0);
        acc1 = _mm256_fmadd_ps(p1, _mm256_set1_ps(hm_e8m0_to_f32_half(x[i + 1].e) * _cvtsh_ss(y[i + 1].d)), acc1);
    }
    if (i < nb) {
        __m256 p0 = dot_s8s8(_mm256_shuffle_epi8(tab, nibbles(x[i].qs)), _mm256_loadu_si256((const __m256i *)y[i].qs));
        acc0 = _mm256_fmadd_ps(p0, _mm256_set1_ps(hm_e8m0_to_f32_half(x[i].e) * _cvtsh_ss(y[i].d)), acc0);
    }
    *out = hsum8(_mm256_add_ps(acc0, acc1));
}

/* ---- dequantisation: 32 signed bytes times the block scale ---- */

static inline void store_scaled_i8x32(float *dst, __m256i q, float d) {
    const __m256 vd = _mm256_set1_ps(d);
    for (int k = 0; k < 4; k++) {
        __m128i part = k < 2 ? _mm256_castsi256_si128(q) : _mm256_extracti128_si256(q, 1);
        if (k & 1) part = _mm_srli_si128(part, 8);
        __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part));
        _mm256_storeu_ps(dst + 8 * k, _mm256_mul_ps(f, vd));
    }
}

static void to_float_q8_0_avx2(const void *src, float *dst, int64_t n) {
    const hm_block_q8_0 *x = src;
    for (int64_t i = 0; i < n / HM_QK8_0; i++)
        store_scaled_i8x32(dst + i * HM_QK8_0, _mm256_loadu_si256((const __m256i *)x[i].qs), _cvtsh_ss(x[i].d));
}

static void to_float_q4_0_avx2(const void *src, float *dst, int64_t n) {
    const hm_block_q4_0 *x = src;
    const __m256i eight = _mm256_set1_epi8(8);
    for (int64_t i = 0; i < n / HM_QK4_0; i++)
        store_scaled_i8x32(dst + i * HM_QK4_0, _mm256_sub_epi8(nibbles(x[i].qs), eight), _cvtsh_ss(x[i].d));
}

static void to_float_q5_0_avx2(const void *src, float *dst, int64_t n) {
    const hm_block_q5_0 *x = src;
    for (int64_t i = 0; i < n / HM_QK5_0; i++)
        store_scaled_i8x32(dst + i * HM_QK5_0, q5_0_codes(&x[i]), _cvtsh_ss(x[i].d));
}

static void to_float_mxfp4_avx2(const void *src, float *dst, int64_t n) {
    const hm_block_mxfp4 *x = src;
    const __m256i tab = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)hm_kvalues_mxfp4));
    for (int64_t i = 0; i < n / HM_QK_MXFP4; i++)
        store_scaled_i8x32(dst + i * HM_QK_MXFP4, _mm256_shuffle_epi8(tab, nibbles(x[i].qs)),
                           hm_e8m0_to_f32_half(x[i].e));
}

/* ---- Q8_0 activation quantiser (bit-exact with the reference) ---- */

/* roundf of each lane: trunc, then one step away from zero when the dropped fraction >= 1/2. */
static inline __m256 round_away(__m256 v) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
    __m256 up = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    __m256 step = _mm256_and_ps(up, _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f)));
    return _mm256_add_ps(t, step);
}

static void from_float_q8_0_avx2(const float *src, void *dst, int64_t n) {
    hm_block_q8_0 *y = dst;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < n / HM_QK8_0; i++) {
        const float *x = src + i * HM_QK8_0;
        __m256 v[4];
        __m256 m = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(x + 8 * k);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[k]));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = (uint16_t)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        const __m256 s = _mm256_set1_ps(id);
        __m256i q[4];
        for (int k = 0; k < 4; k++) q[k] = _mm256_cvttps_epi32(round_away(_mm256_mul_ps(v[k], s)));
        /* packs work per 128-bit lane: the permute restores element order */
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)y[i].qs, p);
    }
}

void hm_quant_register_q8_0_avx2(hm_type_traits *table) {
    table[HM_TYPE_Q8_0].vec_dot_isa[HM_ISA_AVX2] = vec_dot_q8_0_q8_0_avx2;
    table[HM_TYPE_Q8_0].to_float_isa[HM_ISA_AVX2] = to_float_q8_0_avx2;
    table[HM_TYPE_Q8_0].from_float_isa[HM_ISA_AVX2] = from_float_q8_0_avx2;
    table[HM_TYPE_Q4_0].vec_dot_isa[HM_ISA_AVX2] = vec_dot_q4_0_q8_0_avx2;
    table[HM_TYPE_Q4_0].to_float_isa[HM_ISA_AVX2] = to_float_q4_0_avx2;
    table[HM_TYPE_Q5_0].vec_dot_isa[HM_ISA_AVX2] = vec_dot_q5_0_q8_0_avx2;
    table[HM_TYPE_Q5_0].to_float_isa[HM_ISA_AVX2] = to_float_q5_0_avx2;
    table[HM_TYPE_MXFP4].vec_dot_isa[HM_ISA_AVX2] = vec_dot_mxfp4_q8_0_avx2;
    table[HM_TYPE_MXFP4].to_float_isa[HM_ISA_AVX2] = to_float_mxfp4_avx2;
}

#endif
