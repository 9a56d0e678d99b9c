/* quant_q8_0_avx512.c - AVX-512 (F/BW/VL, VNNI when present) variants of the Q8_0 family:
 * Q4_0/Q5_0/Q8_0/MXFP4 x Q8_0 dot products, dequantisation, and the Q8_0 activation quantiser.
 *
 * Dot products take two blocks per 512-bit register and four blocks per iteration. Weights are
 * made unsigned by an offset (q4_0: the raw nibble n = q+8;
 * q5_0: nibble | fifth bit << 4 = q+16; mxfp4: table value + 12; q8_0:
 * q ^ 0x80 = q+128), so one u8 x s8 dot (vpdpbusd, or vpmaddubsw+vpmaddwd without VNNI)
 * gives sum((q+off)*y); subtracting off*sum(y) restores sum(q*y) exactly in int32. Each block's
 * int sum is scaled by dx*dy and accumulated in float, as the scalar reference does, so the
 * results differ from it only by float summation order.
 *
 * The quantiser and dequantisers are bit-exact with the scalar reference (same float
 * operations; roundf's half-away-from-zero done explicitly). */
#include "quant_impl.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "core/fp16.h"

/* ---- helpers ---- */

/* Per-int32-lane sum of four u8*s8 products. Without VNNI the int16 pair sums must not
 * saturate: callers keep u <= 127 there (q4_0, mxfp4) or use dot_s8s8. */
static inline __m512i dot_u8s8(__m512i u, __m512i s) {
#ifdef __AVX512VNNI__
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
#else
    return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
#endif
}

/* Per-int32-lane sum of four s8*s8 products. */
static inline __m512i dot_s8s8(__m512i x, __m512i y) {
#ifdef __AVX512VNNI__
    const __m512i off = _mm512_set1_epi8((char)0x80);
    return _mm512_sub_epi32(dot_u8s8(_mm512_xor_si512(x, off), y), dot_u8s8(off, y));
#else
    /* |x| * (y with x's sign); exact while y avoids -128 (from_float never writes it). */
    __m512i sy = _mm512_mask_sub_epi8(y, _mm512_movepi8_mask(x), _mm512_setzero_si512(), y);
    return dot_u8s8(_mm512_abs_epi8(x), sy);
#endif
}

/* Four fp16 scales as floats. Packed in a general register first: one vmovq instead of four
 * vpinsrw keeps them off the shuffle port, which the dot loop saturates. */
static inline __m128 f16x4(uint16_t a, uint16_t b, uint16_t c, uint16_t d) {
    uint64_t h = (uint64_t)a | (uint64_t)b << 16 | (uint64_t)c << 32 | (uint64_t)d << 48;
    return _mm_cvtph_ps(_mm_cvtsi64_si128((long long)h));
}

/* 2^(e-128) for four E8M0 bytes, as hm_e8m0_to_f32_half (vscalefps is exact, subnormals too). */
static inline __m128 e8m0_half_x4(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
    uint32_t packed = (uint32_t)a | (uint32_t)b << 8 | (uint32_t)c << 16 | (uint32_t)d << 24;
    __m128i e = _mm_cvtepu8_epi32(_mm_cvtsi32_si128((int)packed));
    __m128 p = _mm_cvtepi32_ps(_mm_sub_epi32(e, _mm_set1_epi32(128)));
    return _mm_scalef_ps(_mm_set1_ps(1.0f), p);
}

/* Lanes 0-7 = d[2h], lanes 8-15 = d[2h+1]: the scales of the two blocks in one register. */
static inline __m512 spread_pair(__m128 d, int h) {
    const __m512i idx = h ? _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2)
                          : _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(d));
}

static inline __m512i load_q8_pair(const hm_block_q8_0 *b) {
    __m256i lo = _mm256_loadu_si256((const __m256i *)b[0].qs);
    __m256i hi = _mm256_loadu_si256((const __m256i *)b[1].qs);
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* Nibbles of two 16-byte blocks in element order: [lo(a) hi(a) lo(b) hi(b)], values 0..15. */
static inline __m512i nibbles_pair(const uint8_t *qa, const uint8_t *qb) {
    __m256i t = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)qa)),
                                        _mm_loadu_si128((const __m128i *)qb), 1);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m512i lo = _mm512_castsi256_si512(_mm256_and_si256(t, m4));
    __m512i hi = _mm512_castsi256_si512(_mm256_and_si256(_mm256_srli_epi16(t, 4), m4));
    return _mm512_permutex2var_epi64(lo, _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0), hi);
}

/* Two q5_0 blocks' codes + 16 (0..31) in element order: nibbles_pair with 16 added where the
 * fifth bit is set (the two qh words form the 64-bit byte mask). */
static inline __m512i q5_0_pair_u8(const hm_block_q5_0 *b) {
    uint32_t ha, hb;
    memcpy(&ha, b[0].qh, 4);
    memcpy(&hb, b[1].qh, 4);
    __m512i nib = nibbles_pair(b[0].qs, b[1].qs);
    return _mm512_mask_add_epi8(nib, _cvtu64_mask64((uint64_t)ha | (uint64_t)hb << 32), nib, _mm512_set1_epi8(16));
}

/* sum((u - off) * y) per lane, u unsigned. */
static inline __m512i dot_offset(__m512i u, __m512i y, char off) {
    return _mm512_sub_epi32(dot_u8s8(u, y), dot_u8s8(_mm512_set1_epi8(off), y));
}

/* The 16 table values + 12 (0..24): mxfp4 codes made unsigned for dot_offset. */
static inline __m512i mxfp4_table_u8(void) {
    const __m128i t = _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
    return _mm512_broadcast_i32x4(t);
}

/* Scalar integer sums for the tail blocks. */
static inline int32_t blk_q8_0(const hm_block_q8_0 *x, const hm_block_q8_0 *y) {
    int32_t s = 0;
    for (int j = 0; j < HM_QK8_0; j++) s += x->qs[j] * y->qs[j];
    return s;
}
static inline int32_t blk_q4_0(const hm_block_q4_0 *x, const hm_block_q8_0 *y) {
    int32_t s = 0;
    for (int j = 0; j < 16; j++) s += ((x->qs[j] & 0x0f) - 8) * y->qs[j] + ((x->qs[j] >> 4) - 8) * y->qs[j + 16];
    return s;
}
static inline int32_t blk_q5_0(const hm_block_q5_0 *x, const hm_block_q8_0 *y) {
    uint32_t qh;
    memcpy(&qh, x->qh, 4);
    int32_t s = 0;
    for (int j = 0; j < 16; j++)
        s += ((int)((x->qs[j] & 0x0f) | ((qh >> j & 1) << 4)) - 16) * y->qs[j] +
             ((int)((x->qs[j] >> 4) | ((qh >> (j + 16) & 1) << 4)) - 16) * y->qs[j + 16];
    return s;
}
static inline int32_t blk_mxfp4(const hm_block_mxfp4 *x, const hm_block_q8_0 *y) {
    int32_t s = 0;
    for (int j = 0; j < 16; j++)
        s += hm_kvalues_mxfp4[x->qs[j] & 0x0f] * y->qs[j] + hm_kvalues_mxfp4[x->qs[j] >> 4] * y->qs[j + 16];
    return s;
}

/* ---- dot products ---- */

static void vec_dot_q8_0_q8_0_avx512(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q8_0 *x = vx;
    const hm_block_q8_0 *y = vy;
    const int64_t nb = n / HM_QK8_0;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 4 <= nb; i += 4) {
        __m128 d = _mm_mul_ps(f16x4(x[i].d, x[i + 1].d, x[i + 2].d, x[i + 3].d),
                              f16x4(y[i].d, y[i + 1].d, y[i + 2].d, y[i + 3].d));
        __m512i s0 = dot_s8s8(load_q8_pair(x + i), load_q8_pair(y + i));
        __m512i s1 = dot_s8s8(load_q8_pair(x + i + 2), load_q8_pair(y + i + 2));
        acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), spread_pair(d, 0), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), spread_pair(d, 1), acc1);
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    for (; i < nb; i++) s += (float)blk_q8_0(x + i, y + i) * (hm_fp16_to_f32(x[i].d) * hm_fp16_to_f32(y[i].d));
    *out = s;
}

static void vec_dot_q4_0_q8_0_avx512(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q4_0 *x = vx;
    const hm_block_q8_0 *y = vy;
    const int64_t nb = n / HM_QK4_0;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 4 <= nb; i += 4) {
        __m128 d = _mm_mul_ps(f16x4(x[i].d, x[i + 1].d, x[i + 2].d, x[i + 3].d),
                              f16x4(y[i].d, y[i + 1].d, y[i + 2].d, y[i + 3].d));
        __m512i s0 = dot_offset(nibbles_pair(x[i].qs, x[i + 1].qs), load_q8_pair(y + i), 8);
        __m512i s1 = dot_offset(nibbles_pair(x[i + 2].qs, x[i + 3].qs), load_q8_pair(y + i + 2), 8);
        acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), spread_pair(d, 0), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), spread_pair(d, 1), acc1);
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    for (; i < nb; i++) s += (float)blk_q4_0(x + i, y + i) * (hm_fp16_to_f32(x[i].d) * hm_fp16_to_f32(y[i].d));
    *out = s;
}

static void vec_dot_q5_0_q8_0_avx512(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q5_0 *x = vx;
    const hm_block_q8_0 *y = vy;
    const int64_t nb = n / HM_QK5_0;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 4 <= nb; i += 4) {
        __m128 d = _mm_mul_ps(f16x4(x[i].d, x[i + 1].d, x[i + 2].d, x[i + 3].d),
                              f16x4(y[i].d, y[i + 1].d, y[i + 2].d, y[i + 3].d));
        __m512i s0 = dot_offset(q5_0_pair_u8(x + i), load_q8_pair(y + i), 16);
        __m512i s1 = dot_offset(q5_0_pair_u8(x + i + 2), load_q8_pair(y + i + 2), 16);
        acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), spread_pair(d, 0), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), spread_pair(d, 1), acc1);
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    for (; i < nb; i++) s += (float)blk_q5_0(x + i, y + i) * (hm_fp16_to_f32(x[i].d) * hm_fp16_to_f32(y[i].d));
    *out = s;
}

static void vec_dot_mxfp4_q8_0_avx512(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_mxfp4 *x = vx;
    const hm_block_q8_0 *y = vy;
    const int64_t nb = n / HM_QK_MXFP4;
    const __m512i tab = mxfp4_table_u8();
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 4 <= nb; i += 4) {
        __m128 d = _mm_mul_ps(e8m0_half_x4(x[i].e, x[i + 1].e, x[i + 2].e, x[i + 3].e),
                              f16x4(y[i].d, y[i + 1].d, y[i + 2].d, y[i + 3].d));
        __m512i u0 = _mm512_shuffle_epi8(tab, nibbles_pair(x[i].qs, x[i + 1].qs));
        __m512i u1 = _mm512_shuffle_epi8(tab, nibbles_pair(x[i + 2].qs, x[i + 3].qs));
        __m512i s0 = dot_offset(u0, load_q8_pair(y + i), 12);
        __m512i s1 = dot_offset(u1, load_q8_pair(y + i + 2), 12);
        acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), spread_pair(d, 0), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), spread_pair(d, 1), acc1);
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    for (; i < nb; i++)
        s += (float)blk_mxfp4(x + i, y + i) * (hm_e8m0_to_f32_half(x[i].e) * hm_fp16_to_f32(y[i].d));
    *out = s;
}

/* ---- dequantisation ---- */

static void to_float_q8_0_avx512(const void *src, float *dst, int64_t n) {
    const hm_block_q8_0 *x = src;
    for (int64_t i = 0; i < n / HM_QK8_0; i++) {
        const __m512 d = _mm512_set1_ps(hm_fp16_to_f32(x[i].d));
        for (int h = 0; h < 2; h++) {
            __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(x[i].qs + 16 * h)));
            _mm512_storeu_ps(dst + i * HM_QK8_0 + 16 * h, _mm512_mul_ps(_mm512_cvtepi32_ps(q), d));
        }
    }
}

static void to_float_q4_0_avx512(const void *src, float *dst, int64_t n) {
    const hm_block_q4_0 *x = src;
    const __m128i m4 = _mm_set1_epi8(0x0f);
    const __m512i eight = _mm512_set1_epi32(8);
    for (int64_t i = 0; i < n / HM_QK4_0; i++) {
        const __m512 d = _mm512_set1_ps(hm_fp16_to_f32(x[i].d));
        __m128i q = _mm_loadu_si128((const __m128i *)x[i].qs);
        __m512i lo = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_and_si128(q, m4)), eight);
        __m512i hi = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q, 4), m4)), eight);
        _mm512_storeu_ps(dst + i * HM_QK4_0, _mm512_mul_ps(_mm512_cvtepi32_ps(lo), d));
        _mm512_storeu_ps(dst + i * HM_QK4_0 + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(hi), d));
    }
}

static void to_float_q5_0_avx512(const void *src, float *dst, int64_t n) {
    const hm_block_q5_0 *x = src;
    const __m128i m4 = _mm_set1_epi8(0x0f);
    const __m512i sixteen = _mm512_set1_epi32(16);
    for (int64_t i = 0; i < n / HM_QK5_0; i++) {
        const __m512 d = _mm512_set1_ps(hm_fp16_to_f32(x[i].d));
        uint32_t qh;
        memcpy(&qh, x[i].qh, 4);
        __m128i q = _mm_loadu_si128((const __m128i *)x[i].qs);
        __m512i lo = _mm512_cvtepu8_epi32(_mm_and_si128(q, m4));
        __m512i hi = _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q, 4), m4));
        /* +16 where the fifth bit is set, then -16 for every element */
        lo = _mm512_sub_epi32(_mm512_mask_add_epi32(lo, (__mmask16)(qh & 0xffff), lo, sixteen), sixteen);
        hi = _mm512_sub_epi32(_mm512_mask_add_epi32(hi, (__mmask16)(qh >> 16), hi, sixteen), sixteen);
        _mm512_storeu_ps(dst + i * HM_QK5_0, _mm512_mul_ps(_mm512_cvtepi32_ps(lo), d));
        _mm512_storeu_ps(dst + i * HM_QK5_0 + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(hi), d));
    }
}

static void to_float_mxfp4_avx512(const void *src, float *dst, int64_t n) {
    const hm_block_mxfp4 *x = src;
    const __m128i m4 = _mm_set1_epi8(0x0f);
    const __m128i tab = _mm_loadu_si128((const __m128i *)hm_kvalues_mxfp4);
    for (int64_t i = 0; i < n / HM_QK_MXFP4; i++) {
        const __m512 d = _mm512_set1_ps(hm_e8m0_to_f32_half(x[i].e));
        __m128i q = _mm_loadu_si128((const __m128i *)x[i].qs);
        __m512i lo = _mm512_cvtepi8_epi32(_mm_shuffle_epi8(tab, _mm_and_si128(q, m4)));
        __m512i hi = _mm512_cvtepi8_epi32(_mm_shuffle_epi8(tab, _mm_and_si128(_mm_srli_epi16(q, 4), m4)));
        _mm512_storeu_ps(dst + i * HM_QK_MXFP4, _mm512_mul_ps(_mm512_cvtepi32_ps(lo), d));
        _mm512_storeu_ps(dst + i * HM_QK_MXFP4 + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(hi), d));
    }
}

/* ---- Q8_0 activation quantiser ---- */

/* roundf (half away from zero) of each lane, exactly: trunc, then step away from zero when the
 * dropped fraction (exact in float) is at least one half. */
static inline __m512 round_away(__m512 v) {
    __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(v, t)), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    __m512 one = _mm512_castsi512_ps(_mm512_or_si512(
        _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32((int)0x80000000u)),
        _mm512_castps_si512(_mm512_set1_ps(1.0f))));
    return _mm512_mask_add_ps(t, up, t, one);
}

static void from_float_q8_0_avx512(const float *src, void *dst, int64_t n) {
    hm_block_q8_0 *y = dst;
    for (int64_t i = 0; i < n / HM_QK8_0; i++) {
        const float *x = src + i * HM_QK8_0;
        __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = (uint16_t)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        const __m512 s = _mm512_set1_ps(id);
        __m512i q0 = _mm512_cvttps_epi32(round_away(_mm512_mul_ps(v0, s)));
        __m512i q1 = _mm512_cvttps_epi32(round_away(_mm512_mul_ps(v1, s)));
        _mm_storeu_si128((__m128i *)y[i].qs, _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(y[i].qs + 16), _mm512_cvtepi32_epi8(q1));
    }
}

void hm_quant_register_q8_0_avx512(hm_type_traits *table) {
    table[HM_TYPE_Q8_0].vec_dot_isa[HM_ISA_AVX512] = vec_dot_q8_0_q8_0_avx512;
    table[HM_TYPE_Q8_0].to_float_isa[HM_ISA_AVX512] = to_float_q8_0_avx512;
    table[HM_TYPE_Q8_0].from_float_isa[HM_ISA_AVX512] = from_float_q8_0_avx512;
    table[HM_TYPE_Q4_0].vec_dot_isa[HM_ISA_AVX512] = vec_dot_q4_0_q8_0_avx512;
    table[HM_TYPE_Q4_0].to_float_isa[HM_ISA_AVX512] = to_float_q4_0_avx512;
    table[HM_TYPE_Q5_0].vec_dot_isa[HM_ISA_AVX512] = vec_dot_q5_0_q8_0_avx512;
    table[HM_TYPE_Q5_0].to_float_isa[HM_ISA_AVX512] = to_float_q5_0_avx512;
    table[HM_TYPE_MXFP4].vec_dot_isa[HM_ISA_AVX512] = vec_dot_mxfp4_q8_0_avx512;
    table[HM_TYPE_MXFP4].to_float_isa[HM_ISA_AVX512] = to_float_mxfp4_avx512;
}

#endif
