/* quant_lowbit_avx512.c - AVX-512 (F+BW+VL, VNNI when present) dot products of the low-bit
 * family: Q4_1 / Q5_1 x Q8_1, IQ4_NL x Q8_0, Q2_K / Q3_K x Q8_K.
 *
 * 32-element types: two blocks per zmm (one per 256-bit half), each half scaled by its own
 * dx*dy. Q2_K / Q3_K: one zmm is 64 consecutive elements = four 16-element sub-blocks: the 32
 * bytes of a 128-element half are broadcast to both halves of the zmm and shifted by 2s and
 * 2s+2, giving the codes of elements 32s..32s+63; the sub-block scales are spread over their 8
 * int16 lanes each by one vpermw. Q3_K's missing high bit subtracts 4 x the activation (a
 * second maddubs under a byte mask). Integer sums per block are exact; only the float
 * accumulation order differs from the scalar reference. */
#include "core/fp16.h"
#include "quant_lowbit_impl.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>

#ifdef __AVX512VNNI__
#define LB_DPWSSD(acc, a, b) _mm512_dpwssd_epi32((acc), (a), (b))
#else
#define LB_DPWSSD(acc, a, b) _mm512_add_epi32((acc), _mm512_madd_epi16((a), (b)))
#endif

static inline __m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

/* a in lanes 0-7, b in lanes 8-15. */
static inline __m512 join_ps(float a, float b) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(a)), _mm256_castps_pd(_mm256_set1_ps(b)), 1));
}

static inline __m512i ld2(const int8_t *a, const int8_t *b) {
    return join(_mm256_loadu_si256((const __m256i *)a), _mm256_loadu_si256((const __m256i *)b));
}

/* int32 lanes of sum(u * y) for unsigned bytes u <= 127 and signed y. */
static inline __m512i dot_u8s8(__m512i u, __m512i y) {
    return LB_DPWSSD(_mm512_setzero_si512(), _mm512_maddubs_epi16(u, y), _mm512_set1_epi16(1));
}

static void vec_dot_q4_1_avx512(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q4_1 *x = vx;
    const hm_block_q8_1 *y = vy;
    const int64_t nb = n / HM_QK4_1;
    __m512 acc = _mm512_setzero_ps();
    float summs = 0;
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m512i p = dot_u8s8(join(hm_lb_nibbles(x[i].qs), hm_lb_nibbles(x[i + 1].qs)), ld2(y[i].qs, y[i + 1].qs));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p),
                              join_ps(_cvtsh_ss(x[i].d) * _cvtsh_ss(y[i].d), _cvtsh_ss(x[i + 1].d) * _cvtsh_ss(y[i + 1].d)), acc);
        summs += _cvtsh_ss(x[i].m) * _cvtsh_ss(y[i].s) + _cvtsh_ss(x[i + 1].m) * _cvtsh_ss(y[i + 1].s);
    }
    float tail = 0;
    if (i < nb) {
        const __m256i p = hm_lb_dot_u8s8(hm_lb_nibbles(x[i].qs), _mm256_loadu_si256((const __m256i *)y[i].qs));
        const __m512 pf = _mm512_cvtepi32_ps(_mm512_castsi256_si512(p));
        tail = _mm512_mask_reduce_add_ps(0xff, pf) * (_cvtsh_ss(x[i].d) * _cvtsh_ss(y[i].d)) + _cvtsh_ss(x[i].m) * _cvtsh_ss(y[i].s);
    }
    *out = _mm512_reduce_add_ps(acc) + summs + tail;
}

static void vec_dot_q5_1_avx512(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q5_1 *x = vx;
    const hm_block_q8_1 *y = vy;
    const int64_t nb = n / HM_QK5_1;
    __m512 acc = _mm512_setzero_ps();
    float summs = 0;
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m512i p = dot_u8s8(join(hm_lb_q5_1_codes(&x[i]), hm_lb_q5_1_codes(&x[i + 1])), ld2(y[i].qs, y[i + 1].qs));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p),
                              join_ps(_cvtsh_ss(x[i].d) * _cvtsh_ss(y[i].d), _cvtsh_ss(x[i + 1].d) * _cvtsh_ss(y[i + 1].d)), acc);
        summs += _cvtsh_ss(x[i].m) * _cvtsh_ss(y[i].s) + _cvtsh_ss(x[i + 1].m) * _cvtsh_ss(y[i + 1].s);
    }
    float tail = 0;
    if (i < nb) {
        const __m256i p = hm_lb_dot_u8s8(hm_lb_q5_1_codes(&x[i]), _mm256_loadu_si256((const __m256i *)y[i].qs));
        const __m512 pf = _mm512_cvtepi32_ps(_mm512_castsi256_si512(p));
        tail = _mm512_mask_reduce_add_ps(0xff, pf) * (_cvtsh_ss(x[i].d) * _cvtsh_ss(y[i].d)) + _cvtsh_ss(x[i].m) * _cvtsh_ss(y[i].s);
    }
    *out = _mm512_reduce_add_ps(acc) + summs + tail;
}

static void vec_dot_iq4_nl_avx512(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_iq4_nl *x = vx;
    const hm_block_q8_0 *y = vy;
    const __m512i tab = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)hm_kvalues_iq4nl));
    const int64_t nb = n / HM_QK4_NL;
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m512i v = _mm512_shuffle_epi8(tab, join(hm_lb_nibbles(x[i].qs), hm_lb_nibbles(x[i + 1].qs)));
        const __m512i a = ld2(y[i].qs, y[i + 1].qs);
        /* |v| x (a with v's sign): negate a where v < 0 */
        const __mmask64 neg = _mm512_movepi8_mask(v);
        const __m512i sa = _mm512_mask_sub_epi8(a, neg, _mm512_setzero_si512(), a);
        const __m512i p = dot_u8s8(_mm512_abs_epi8(v), sa);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p),
                              join_ps(_cvtsh_ss(x[i].d) * _cvtsh_ss(y[i].d), _cvtsh_ss(x[i + 1].d) * _cvtsh_ss(y[i + 1].d)), acc);
    }
    float tail = 0;
    if (i < nb) {
        const __m256i tab2 = _mm512_castsi512_si256(tab);
        const __m256i p = hm_lb_dot_s8s8(_mm256_shuffle_epi8(tab2, hm_lb_nibbles(x[i].qs)), _mm256_loadu_si256((const __m256i *)y[i].qs));
        tail = _mm512_mask_reduce_add_ps(0xff, _mm512_cvtepi32_ps(_mm512_castsi256_si512(p))) * (_cvtsh_ss(x[i].d) * _cvtsh_ss(y[i].d));
    }
    *out = _mm512_reduce_add_ps(acc) + tail;
}

/* vpermw index: lanes 8k..8k+7 take word 4t+k (k = 0..3): the scales of four 16-element
 * sub-blocks, zmm t of a super-block. */
static inline __m512i idx_quad16(int t) {
    const __m512i lane = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14,
                                          13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    return _mm512_add_epi16(_mm512_srli_epi16(lane, 3), _mm512_set1_epi16((short)(4 * t)));
}

/* Codes of elements 128h + 32s .. +63 (s = 0 or 2): the half's 32 bytes in both zmm halves,
 * shifted by 2s (low) and 2s + 2 (high). */
static inline __m512i codes64(const uint8_t *q32, int s) {
    const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)q32));
    const __m512i sh = _mm512_inserti64x4(_mm512_set1_epi64(2 * s), _mm256_set1_epi64x(2 * s + 2), 1);
    return _mm512_and_si512(_mm512_srlv_epi64(q, sh), _mm512_set1_epi8(3));
}

static void vec_dot_q2_k_avx512(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q2_k *x = vx;
    const hm_block_q8_k *y = vy;
    __m512i idx[4];
    for (int t = 0; t < 4; t++) idx[t] = idx_quad16(t);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / HM_QK_K; i++) {
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)x[i].scales);
        const __m512i sc16 = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_and_si128(sc8, _mm_set1_epi8(0x0f))));
        const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), _mm_set1_epi8(0x0f)));
        const __m256i mins = _mm256_madd_epi16(mins16, _mm256_loadu_si256((const __m256i *)y[i].bsums));
        __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
        for (int t = 0; t < 4; t++) {
            const __m512i codes = codes64(x[i].qs + 32 * (t / 2), 2 * (t % 2));
            const __m512i p = _mm512_maddubs_epi16(codes, _mm512_loadu_si512(y[i].qs + 64 * t));
            if (t % 2) s1 = LB_DPWSSD(s1, p, _mm512_permutexvar_epi16(idx[t], sc16));
            else s0 = LB_DPWSSD(s0, p, _mm512_permutexvar_epi16(idx[t], sc16));
        }
        const float d = _cvtsh_ss(x[i].d) * y[i].d, dmin = _cvtsh_ss(x[i].dmin) * y[i].d;
        acc = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(_mm512_zextsi256_si512(mins)), _mm512_set1_ps(dmin), acc);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), _mm512_set1_ps(d), acc);
    }
    *out = _mm512_reduce_add_ps(acc);
}

static void vec_dot_q3_k_avx512(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q3_k *x = vx;
    const hm_block_q8_k *y = vy;
    __m512i idx[4];
    for (int t = 0; t < 4; t++) idx[t] = idx_quad16(t);
    const __m512i four = _mm512_set1_epi8(4);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / HM_QK_K; i++) {
        uint32_t u[4];
        hm_q3k_scales_u(x[i].scales, u);
        const __m128i sc8 = _mm_sub_epi8(_mm_setr_epi32((int)u[0], (int)u[1], (int)u[2], (int)u[3]), _mm_set1_epi8(32));
        const __m512i sc16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(sc8));
        const __m512i hm = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x[i].hmask));
        __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
        for (int t = 0; t < 4; t++) {
            const int h = t / 2, s = 2 * (t % 2);
            const __m512i codes = codes64(x[i].qs + 32 * h, s);
            /* high bit of element 128h + 32s' + l: bit 4h + s' of hmask[l] (s' = s low, s + 1 high) */
            const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (4 * h + s))),
                                                   _mm256_set1_epi8((char)(1 << (4 * h + s + 1))), 1);
            const __mmask64 clear = _mm512_testn_epi8_mask(hm, bit);
            const __m512i a = _mm512_loadu_si512(y[i].qs + 64 * t);
            const __m512i p = _mm512_sub_epi16(_mm512_maddubs_epi16(codes, a),
                                               _mm512_maddubs_epi16(_mm512_maskz_mov_epi8(clear, four), a));
            if (t % 2) s1 = LB_DPWSSD(s1, p, _mm512_permutexvar_epi16(idx[t], sc16));
            else s0 = LB_DPWSSD(s0, p, _mm512_permutexvar_epi16(idx[t], sc16));
        }
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), _mm512_set1_ps(_cvtsh_ss(x[i].d) * y[i].d), acc);
    }
    *out = _mm512_reduce_add_ps(acc);
}

/* Q8_1 activations, two blocks a step: the reference's d = amax / 127, q = roundf(x * (1 / d))
 * (half away from zero, done exactly as trunc + a step where the fraction is >= 0.5), s = d * sum q;
 * bit-exact. */
static void from_float_q8_1_avx512(const float *src, void *dst, int64_t n) {
    hm_block_q8_1 *y = dst;
    const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
    const int64_t nb = n / HM_QK8_1;
    for (int64_t i = 0; i < nb; i++, src += HM_QK8_1) {
        const __m512 v0 = _mm512_loadu_ps(src), v1 = _mm512_loadu_ps(src + 16);
        const float d = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1))) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = hm_f32_to_fp16(d);
        __m512i q[2];
        const __m512 vs[2] = {v0, v1};
        for (int k = 0; k < 2; k++) {
            const __m512 x = _mm512_mul_ps(vs[k], _mm512_set1_ps(id));
            const __m512 t = _mm512_roundscale_ps(x, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            const __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(x, t)), half, _CMP_GE_OQ);
            const __m512 step = _mm512_castsi512_ps(_mm512_or_si512(
                _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u)), _mm512_castps_si512(one)));
            q[k] = _mm512_cvttps_epi32(_mm512_mask_add_ps(t, up, t, step));
        }
        _mm_storeu_si128((__m128i *)y[i].qs, _mm512_cvtsepi32_epi8(q[0]));
        _mm_storeu_si128((__m128i *)(y[i].qs + 16), _mm512_cvtsepi32_epi8(q[1]));
        y[i].s = hm_f32_to_fp16((float)_mm512_reduce_add_epi32(_mm512_add_epi32(q[0], q[1])) * d);
    }
}

void hm_lowbit_register_avx512(hm_type_traits *table) {
    table[HM_TYPE_Q4_1].vec_dot_isa[HM_ISA_AVX512] = vec_dot_q4_1_avx512;
    table[HM_TYPE_Q5_1].vec_dot_isa[HM_ISA_AVX512] = vec_dot_q5_1_avx512;
    table[HM_TYPE_IQ4_NL].vec_dot_isa[HM_ISA_AVX512] = vec_dot_iq4_nl_avx512;
    table[HM_TYPE_Q2_K].vec_dot_isa[HM_ISA_AVX512] = vec_dot_q2_k_avx512;
    table[HM_TYPE_Q3_K].vec_dot_isa[HM_ISA_AVX512] = vec_dot_q3_k_avx512;
    table[HM_TYPE_Q8_1].from_float_isa[HM_ISA_AVX512] = from_float_q8_1_avx512;
    table[HM_TYPE_Q8_1].from_float = from_float_q8_1_avx512;
}
#endif
