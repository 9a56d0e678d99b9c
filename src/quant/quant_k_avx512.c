/* quant_k_avx512.c - AVX-512 (F+BW+VL, VNNI when present) variants of the K-quant family: dot
 * products against Q8_K and the Q8_K activation quantiser.
 *
 * One zmm covers 64 elements = two 32-element sub-blocks (or four 16-element ones for Q6_K), in
 * the activation's own order, so Q8_K rows are loaded straight: the 32 packed bytes of a Q4_K /
 * Q5_K chunk are broadcast to both halves, low nibbles taken in one half and high nibbles in the
 * other (one GFNI affine op, or shift + mask), meeting the chunk's first and second sub-block.
 * Q4_K/Q5_K mins come from the activation's bsums. Levels x int8 via maddubs (no saturation: all
 * levels are <= 63, or |level| <= 127 against a sign-adjusted activation for IQ4_XS), then
 * vpdpwssd against the sub-block scales spread over their lanes with one vpermw. Integer sums
 * per super-block are exact; only the float accumulation order differs from the reference.
 * Q8_K quantisation equals hm_from_float_q8_k_ref byte for byte. */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)

#include <immintrin.h>
#include <string.h>

#include "core/fp16.h"
#include "quant_impl.h"
#include "quant_k_impl.h"

#ifdef __AVX512VNNI__
#define K_DPWSSD(acc, a, b) _mm512_dpwssd_epi32((acc), (a), (b))
#else
#define K_DPWSSD(acc, a, b) _mm512_add_epi32((acc), _mm512_madd_epi16((a), (b)))
#endif

/* vpermw index: int16 lanes 16*h .. 16*h+15 take word 2c+h (h = 0, 1): the scales of the two
 * 32-element sub-blocks of chunk c over their 16 maddubs lanes each. */
static inline __m512i idx_pair32(int c) {
    return _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * c)), _mm256_set1_epi16((short)(2 * c + 1)), 1);
}

/* vpermw index: lanes 8*k .. 8*k+7 take word 4t+k (k = 0..3): four 16-element sub-blocks. */
static inline __m512i idx_quad16(int t) {
    const __m512i lane = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14,
                                          13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    return _mm512_add_epi16(_mm512_srli_epi16(lane, 3), _mm512_set1_epi16((short)(4 * t)));
}

/* Broadcast 32 bytes to both halves of a zmm. */
static inline __m512i bcast256(const void *p) { return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p)); }

/* Nibble extraction, per 64-bit lane either the low nibble or the high nibble shifted down of
 * every byte; sel has one bit per lane (set = high). With GFNI one affine transform per vector
 * (bit matrix rows: output bit i <- input bit i, or i + 4), else a variable shift and a mask. */
typedef struct k_nibsel {
#ifdef __GFNI__
    __m512i matrix;
#else
    __m512i shift;
#endif
} k_nibsel;

static inline k_nibsel k_nibsel_make(unsigned sel) {
    k_nibsel k;
#ifdef __GFNI__
    const long long lo = 0x0102040800000000ll, hi = 0x1020408000000000ll;
    k.matrix = _mm512_mask_blend_epi64((__mmask8)sel, _mm512_set1_epi64(lo), _mm512_set1_epi64(hi));
#else
    k.shift = _mm512_maskz_mov_epi64((__mmask8)sel, _mm512_set1_epi64(4));
#endif
    return k;
}

static inline __m512i k_nibbles(__m512i v, k_nibsel k) {
#ifdef __GFNI__
    return _mm512_gf2p8affine_epi64_epi8(v, k.matrix, 0);
#else
    return _mm512_and_si512(_mm512_srlv_epi64(v, k.shift), _mm512_set1_epi8(0x0f));
#endif
}

/* sum_j m[j] * (bsums[2j] + bsums[2j+1]) as 8 int32 lanes. */
static inline __m256i k4_mins_dot(uint64_t m, const int16_t *bsums) {
    __m256i m32 = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)m));
    __m256i mdup = _mm256_or_si256(m32, _mm256_slli_epi32(m32, 16));
    return _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)bsums), mdup);
}

void hm_vec_dot_q4_k_avx512(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q4_k *x = vx;
    const hm_block_q8_k *y = vy;
    const k_nibsel halves = k_nibsel_make(0xf0); /* low nibbles | high nibbles */
    const __m512i idx0 = idx_pair32(0), idx1 = idx_pair32(1), idx2 = idx_pair32(2), idx3 = idx_pair32(3);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / HM_QK_K; i++) {
        uint64_t sc, m;
        hm_k4_unpack_scales64(x[i].scales, &sc, &m);
        const float d = hm_k_half(x[i].d) * y[i].d, dmin = hm_k_half(x[i].dmin) * y[i].d;
        /* mins share the accumulator (lanes 0-7): one reduction per row */
        acc = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(_mm512_zextsi256_si512(k4_mins_dot(m, y[i].bsums))), _mm512_set1_ps(dmin), acc);
        const __m512i scz = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc)));
        const uint8_t *q = x[i].qs;
        const int8_t *a = y[i].qs;
        __m512i q0 = k_nibbles(bcast256(q), halves);
        __m512i q1 = k_nibbles(bcast256(q + 32), halves);
        __m512i q2 = k_nibbles(bcast256(q + 64), halves);
        __m512i q3 = k_nibbles(bcast256(q + 96), halves);
        __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
        s0 = K_DPWSSD(s0, _mm512_maddubs_epi16(q0, _mm512_loadu_si512(a)), _mm512_permutexvar_epi16(idx0, scz));
        s1 = K_DPWSSD(s1, _mm512_maddubs_epi16(q1, _mm512_loadu_si512(a + 64)), _mm512_permutexvar_epi16(idx1, scz));
        s0 = K_DPWSSD(s0, _mm512_maddubs_epi16(q2, _mm512_loadu_si512(a + 128)), _mm512_permutexvar_epi16(idx2, scz));
        s1 = K_DPWSSD(s1, _mm512_maddubs_epi16(q3, _mm512_loadu_si512(a + 192)), _mm512_permutexvar_epi16(idx3, scz));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), _mm512_set1_ps(d), acc);
    }
    *out = _mm512_reduce_add_ps(acc);
}

void hm_vec_dot_q5_k_avx512(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q5_k *x = vx;
    const hm_block_q8_k *y = vy;
    const __m512i bit4 = _mm512_set1_epi8(0x10);
    const k_nibsel halves = k_nibsel_make(0xf0); /* low nibbles | high nibbles */
    /* fifth bits: chunk c takes bit 2c (low half) and 2c+1 (high half) of qh; pre-shift the high
     * half by one so both sit at bit 2c, then move bit 2c to bit 4 */
    const __m512i hshift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(1), 1);
    __m512i idx[4];
    for (int c = 0; c < 4; c++) idx[c] = idx_pair32(c);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / HM_QK_K; i++) {
        uint64_t sc, m;
        hm_k4_unpack_scales64(x[i].scales, &sc, &m);
        const float d = hm_k_half(x[i].d) * y[i].d, dmin = hm_k_half(x[i].dmin) * y[i].d;
        /* mins share the accumulator (lanes 0-7): one reduction per row */
        acc = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(_mm512_zextsi256_si512(k4_mins_dot(m, y[i].bsums))), _mm512_set1_ps(dmin), acc);
        const __m512i scz = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc)));
        __m512i hb = _mm512_srlv_epi16(bcast256(x[i].qh), hshift);
        const uint8_t *q = x[i].qs;
        const int8_t *a = y[i].qs;
        __m512i s = _mm512_setzero_si512();
        for (int c = 0; c < 4; c++, q += 32, a += 64) {
            /* level = nibble | (fifth bit << 4), one ternary-logic op: (a | (b & c)) */
            const __m512i lv = _mm512_ternarylogic_epi32(k_nibbles(bcast256(q), halves), _mm512_slli_epi16(hb, 4), bit4, 0xf8);
            hb = _mm512_srli_epi16(hb, 2);
            s = K_DPWSSD(s, _mm512_maddubs_epi16(lv, _mm512_loadu_si512(a)), _mm512_permutexvar_epi16(idx[c], scz));
        }
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(d), acc);
    }
    *out = _mm512_reduce_add_ps(acc);
}

void hm_vec_dot_q6_k_avx512(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q6_k *x = vx;
    const hm_block_q8_k *y = vy;
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    /* per half of the zmm: low nibbles take qh bits 0-1 | 2-3, high nibbles bits 4-5 | 6-7 */
    const __m512i lshift = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i rshift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i idx0 = idx_quad16(0), idx1 = idx_quad16(1), idx2 = idx_quad16(2), idx3 = idx_quad16(3);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / HM_QK_K; i++) {
        const float d = hm_k_half(x[i].d) * y[i].d;
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
        const __m512i scz = _mm512_castsi256_si512(sc16);
        /* sum_j sc[j] * bsums[j]: the -32 offset of every level, applied once */
        const __m256i offs = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[i].bsums), sc16);
        const int8_t *a = y[i].qs;
        __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++, a += 128) {
            const __m512i ql = _mm512_loadu_si512(x[i].ql + 64 * h);
            const __m512i qh = bcast256(x[i].qh + 32 * h);
            const __m512i lo = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(_mm512_sllv_epi16(qh, lshift), m30));
            const __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                               _mm512_and_si512(_mm512_srlv_epi16(qh, rshift), m30));
            s0 = K_DPWSSD(s0, _mm512_maddubs_epi16(lo, _mm512_loadu_si512(a)), _mm512_permutexvar_epi16(h ? idx2 : idx0, scz));
            s1 = K_DPWSSD(s1, _mm512_maddubs_epi16(hi, _mm512_loadu_si512(a + 64)), _mm512_permutexvar_epi16(h ? idx3 : idx1, scz));
        }
        __m512i s = _mm512_sub_epi32(_mm512_add_epi32(s0, s1), _mm512_zextsi256_si512(_mm256_slli_epi32(offs, 5)));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(d), acc);
    }
    *out = _mm512_reduce_add_ps(acc);
}

void hm_vec_dot_iq4_xs_avx512(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_iq4_xs *x = vx;
    const hm_block_q8_k *y = vy;
    const __m512i b3 = _mm512_set1_epi8(0x08);
    /* |kvalues|; levels 0..7 are the negative ones (bit 3 clear) */
    const __m128i kv = _mm_loadu_si128((const __m128i *)hm_kvalues_iq4nl);
    const __m512i table = _mm512_broadcast_i32x4(_mm_abs_epi8(kv));
    const k_nibsel lanes = k_nibsel_make(0xcc); /* 128-bit lanes: low, high, low, high nibbles */
    __m512i idx[4];
    for (int c = 0; c < 4; c++) idx[c] = idx_pair32(c);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / HM_QK_K; i++) {
        const float d = hm_k_half(x[i].d) * y[i].d;
        const __m512i scz = _mm512_castsi128_si512(hm_iq4xs_scales16(&x[i]));
        __m512i s = _mm512_setzero_si512();
        for (int c = 0; c < 4; c++) {
            /* 16 bytes of sub-block 2c then 16 of 2c+1 -> 128-bit lanes [A A B B], shifted 0 4 0 4:
             * elements 0..15, 16..31 of each sub-block, the activation's order */
            const __m512i qv = _mm512_shuffle_i64x2(bcast256(x[i].qs + 32 * c), bcast256(x[i].qs + 32 * c), 0x50);
            const __m512i nib = k_nibbles(qv, lanes);
            const __m512i mag = _mm512_shuffle_epi8(table, nib);
            const __mmask64 neg = _mm512_testn_epi8_mask(nib, b3);
            const __m512i av = _mm512_loadu_si512(y[i].qs + 64 * c);
            const __m512i as = _mm512_mask_sub_epi8(av, neg, _mm512_setzero_si512(), av);
            s = K_DPWSSD(s, _mm512_maddubs_epi16(mag, as), _mm512_permutexvar_epi16(idx[c], scz));
        }
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(d), acc);
    }
    *out = _mm512_reduce_add_ps(acc);
}

void hm_from_float_q8_k_avx512(const float *src, void *dst, int64_t n) {
    hm_block_q8_k *y = dst;
    const __m512i ones8 = _mm512_set1_epi8(1), ones16 = _mm512_set1_epi16(1);
    const __m512i lim = _mm512_set1_epi32(127);
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    for (int64_t i = 0; i < n / HM_QK_K; i++, src += HM_QK_K) {
        __m512 vmax = _mm512_setzero_ps();
        for (int j = 0; j < HM_QK_K; j += 16) vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_loadu_ps(src + j)));
        const float amax = _mm512_reduce_max_ps(vmax);
        if (!amax) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        /* the reference keeps the first element of largest magnitude, with its sign */
        const __m512 va = _mm512_set1_ps(amax);
        float max = 0;
        for (int j = 0; j < HM_QK_K; j += 16) {
            __mmask16 k = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(src + j)), va, _CMP_EQ_OQ);
            if (k) {
                max = src[j + __builtin_ctz((unsigned)k)];
                break;
            }
        }
        const float iscale = -127.f / max;
        const __m512 vs = _mm512_set1_ps(iscale);
        __m512i quads[4];
        for (int j = 0; j < HM_QK_K; j += 64) {
            __m128i b[4];
            for (int k = 0; k < 4; k++)
                b[k] = _mm512_cvtsepi32_epi8(
                    _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(vs, _mm512_loadu_ps(src + j + 16 * k))), lim));
            __m512i p = _mm512_castsi128_si512(b[0]);
            p = _mm512_inserti32x4(p, b[1], 1);
            p = _mm512_inserti32x4(p, b[2], 2);
            p = _mm512_inserti32x4(p, b[3], 3);
            _mm512_storeu_si512(y[i].qs + j, p);
            quads[j / 64] = _mm512_madd_epi16(_mm512_maddubs_epi16(ones8, p), ones16); /* sums of 4 */
        }
        /* two rounds of pairwise sums over the concatenated quads keep the group order */
        const __m512i p01 = _mm512_add_epi32(_mm512_permutex2var_epi32(quads[0], even, quads[1]),
                                             _mm512_permutex2var_epi32(quads[0], odd, quads[1]));
        const __m512i p23 = _mm512_add_epi32(_mm512_permutex2var_epi32(quads[2], even, quads[3]),
                                             _mm512_permutex2var_epi32(quads[2], odd, quads[3]));
        const __m512i g = _mm512_add_epi32(_mm512_permutex2var_epi32(p01, even, p23), _mm512_permutex2var_epi32(p01, odd, p23));
        _mm256_storeu_si256((__m256i *)y[i].bsums, _mm512_cvtepi32_epi16(g));
        y[i].d = 1 / iscale;
    }
}

#endif
