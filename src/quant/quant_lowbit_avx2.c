/* quant_lowbit_avx2.c - AVX2 (+FMA, F16C) dot products of the low-bit family: Q4_1 / Q5_1 x
 * Q8_1, IQ4_NL x Q8_0, Q2_K / Q3_K x Q8_K.
 *
 * 32-element types: one block per register, codes x activations by vpmaddubsw (unsigned codes,
 * or |level| against the sign-adjusted activation for IQ4_NL), the block sum scaled by dx*dy;
 * Q4_1 / Q5_1 add m * s (the activation's scaled sum) per block. Q2_K / Q3_K: each 32 bytes of
 * qs give four registers of 2-bit codes (shifts 0, 2, 4, 6), each register two 16-element
 * sub-blocks (one per 128-bit lane), weighted by their scales through vpmaddwd; Q2_K's mins
 * come from the activation's bsums, Q3_K's missing high bit subtracts 4 x the activation. All
 * integer sums are exact; only the float accumulation order differs from the reference. */
#include "core/fp16.h"
#include "quant_lowbit_impl.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline int32_t hsum8i(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

static void vec_dot_q4_1_avx2(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q4_1 *x = vx;
    const hm_block_q8_1 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    float summs = 0;
    for (int64_t i = 0; i < n / HM_QK4_1; i++) {
        const __m256i p = hm_lb_dot_u8s8(hm_lb_nibbles(x[i].qs), _mm256_loadu_si256((const __m256i *)y[i].qs));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(_cvtsh_ss(x[i].d) * _cvtsh_ss(y[i].d)), acc);
        summs += _cvtsh_ss(x[i].m) * _cvtsh_ss(y[i].s);
    }
    *out = hsum8(acc) + summs;
}

static void vec_dot_q5_1_avx2(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q5_1 *x = vx;
    const hm_block_q8_1 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    float summs = 0;
    for (int64_t i = 0; i < n / HM_QK5_1; i++) {
        const __m256i p = hm_lb_dot_u8s8(hm_lb_q5_1_codes(&x[i]), _mm256_loadu_si256((const __m256i *)y[i].qs));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(_cvtsh_ss(x[i].d) * _cvtsh_ss(y[i].d)), acc);
        summs += _cvtsh_ss(x[i].m) * _cvtsh_ss(y[i].s);
    }
    *out = hsum8(acc) + summs;
}

static void vec_dot_iq4_nl_avx2(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_iq4_nl *x = vx;
    const hm_block_q8_0 *y = vy;
    const __m256i tab = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)hm_kvalues_iq4nl));
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / HM_QK4_NL; i++) {
        const __m256i v = _mm256_shuffle_epi8(tab, hm_lb_nibbles(x[i].qs));
        const __m256i p = hm_lb_dot_s8s8(v, _mm256_loadu_si256((const __m256i *)y[i].qs));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(_cvtsh_ss(x[i].d) * _cvtsh_ss(y[i].d)), acc);
    }
    *out = hsum8(acc);
}

/* pshufb control putting byte `lo` (lane 0) / `hi` (lane 1) of the source's lanes into the low
 * byte of every int16 and zero into the high byte. */
static inline __m256i pick16(int lo, int hi) {
    return _mm256_set_m128i(_mm_set1_epi16((short)(0x8000 | hi)), _mm_set1_epi16((short)(0x8000 | lo)));
}

static void vec_dot_q2_k_avx2(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q2_k *x = vx;
    const hm_block_q8_k *y = vy;
    const __m256i m3 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(0x0f);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / HM_QK_K; i++) {
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)x[i].scales);
        const __m256i sc = _mm256_and_si256(_mm256_broadcastsi128_si256(sc8), m4);
        const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), _mm_set1_epi8(0x0f)));
        const int32_t summ = hsum8i(_mm256_madd_epi16(mins16, _mm256_loadu_si256((const __m256i *)y[i].bsums)));
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * h));
            for (int s = 0; s < 4; s++) {
                const int j = 8 * h + 2 * s; /* sub-blocks j (lane 0) and j + 1 (lane 1) */
                const __m256i codes = _mm256_and_si256(_mm256_srli_epi16(q, 2 * s), m3);
                const __m256i a = _mm256_loadu_si256((const __m256i *)(y[i].qs + 16 * j));
                const __m256i scale = _mm256_shuffle_epi8(sc, pick16(j, j + 1));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(codes, a), scale));
            }
        }
        const float d = _cvtsh_ss(x[i].d) * y[i].d, dmin = _cvtsh_ss(x[i].dmin) * y[i].d;
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(d), acc);
        acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(_mm256_setr_epi32(summ, 0, 0, 0, 0, 0, 0, 0)), _mm256_set1_ps(dmin), acc);
    }
    *out = hsum8(acc);
}

static void vec_dot_q3_k_avx2(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q3_k *x = vx;
    const hm_block_q8_k *y = vy;
    const __m256i m3 = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / HM_QK_K; i++) {
        uint32_t u[4];
        hm_q3k_scales_u(x[i].scales, u);
        const __m128i sc8 = _mm_sub_epi8(_mm_setr_epi32((int)u[0], (int)u[1], (int)u[2], (int)u[3]), _mm_set1_epi8(32));
        const __m256i sc = _mm256_broadcastsi128_si256(sc8);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)x[i].hmask);
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * h));
            for (int s = 0; s < 4; s++) {
                const int j = 8 * h + 2 * s;
                const __m256i codes = _mm256_and_si256(_mm256_srli_epi16(q, 2 * s), m3);
                const __m256i bit = _mm256_set1_epi8((char)(1 << (4 * h + s)));
                const __m256i sub = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), _mm256_setzero_si256()), four);
                const __m256i a = _mm256_loadu_si256((const __m256i *)(y[i].qs + 16 * j));
                const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(codes, a), _mm256_maddubs_epi16(sub, a));
                /* the signed scale byte in both bytes of each int16, then shifted down with sign */
                const __m256i scale = _mm256_srai_epi16(
                    _mm256_shuffle_epi8(sc, _mm256_set_m128i(_mm_set1_epi16((short)((j + 1) | ((j + 1) << 8))),
                                                             _mm_set1_epi16((short)(j | (j << 8))))),
                    8);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, scale));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(_cvtsh_ss(x[i].d) * y[i].d), acc);
    }
    *out = hsum8(acc);
}

/* roundf (half away from zero) of 8 floats, exactly: truncate, then step away from zero where the
 * dropped fraction is at least one half (v - trunc(v) is exact). */
static inline __m256i round_away_avx2(__m256 v) {
    const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_sub_ps(v, t));
    const __m256 step = _mm256_or_ps(_mm256_and_ps(v, _mm256_set1_ps(-0.0f)), _mm256_set1_ps(1.0f));
    return _mm256_cvttps_epi32(_mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ), step)));
}

/* Q8_1 activations: the reference's d = amax / 127, q = roundf(x / d) as x * (1 / d), s = d * sum q,
 * bit-exact. */
static void from_float_q8_1_avx2(const float *src, void *dst, int64_t n) {
    hm_block_q8_1 *y = dst;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < n / HM_QK8_1; i++, src += HM_QK8_1) {
        __m256 v[4], m = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(src + 8 * k);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[k]));
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float d = _mm_cvtss_f32(h) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = hm_f32_to_fp16(d);
        __m256i q[4];
        for (int k = 0; k < 4; k++) q[k] = round_away_avx2(_mm256_mul_ps(v[k], _mm256_set1_ps(id)));
        const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        /* int32 -> int8 in element order (packs interleave 128-bit lanes: undo with a permute) */
        const __m256i p16 = _mm256_packs_epi32(q[0], q[1]), p16b = _mm256_packs_epi32(q[2], q[3]);
        const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16, p16b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)y[i].qs, p8);
        y[i].s = hm_f32_to_fp16((float)_mm_cvtsi128_si32(s4) * d);
    }
}

void hm_lowbit_register_avx2(hm_type_traits *table) {
    table[HM_TYPE_Q4_1].vec_dot_isa[HM_ISA_AVX2] = vec_dot_q4_1_avx2;
    table[HM_TYPE_Q5_1].vec_dot_isa[HM_ISA_AVX2] = vec_dot_q5_1_avx2;
    table[HM_TYPE_IQ4_NL].vec_dot_isa[HM_ISA_AVX2] = vec_dot_iq4_nl_avx2;
    table[HM_TYPE_Q2_K].vec_dot_isa[HM_ISA_AVX2] = vec_dot_q2_k_avx2;
    table[HM_TYPE_Q3_K].vec_dot_isa[HM_ISA_AVX2] = vec_dot_q3_k_avx2;
    table[HM_TYPE_Q8_1].from_float_isa[HM_ISA_AVX2] = from_float_q8_1_avx2;
    table[HM_TYPE_Q8_1].from_float = from_float_q8_1_avx2;
}
#endif
