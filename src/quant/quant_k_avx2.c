/* quant_k_avx2.c - AVX2 variants of the K-quant family: dot products against Q8_K and the Q8_K
 * activation quantiser.
 *
 * Dots: weight levels (unsigned, at most 63) times activation int8 through maddubs (never
 * saturates: 2 * 63 * 127 < 2^15), then madd against the sub-block scales as int16, so each
 * super-block's integer sum is exact and only the float accumulation differs from the scalar
 * reference. Q4_K/Q5_K mins and Q6_K's -32 offset come from the activation's bsums instead of
 * touching every element. IQ4_XS levels are signed: the sign moves onto the activation
 * (sign_epi8) so maddubs sees |level| <= 127 (2 * 127 * 127 < 2^15).
 * Q8_K quantisation here equals hm_from_float_q8_k_ref byte for byte (same products, cvtps2dq
 * rounds to nearest even like the reference's hm_k_round). */
#ifdef __AVX2__

#include <immintrin.h>
#include <string.h>

#include "core/fp16.h"
#include "quant_impl.h"
#include "quant_k_impl.h"

static inline float hsum256_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* int16 lanes all holding byte j of the low 8 bytes of v (bytes are zero-extended). */
static inline __m256i bcast_byte16(__m256i v, int j) {
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)(0x8000 | j)));
}

/* From 8 int16 in both 128-bit halves of v: low half's lanes all = word 2k, high half's all =
 * word 2k+1 (the scales of two consecutive sub-blocks of 16 lanes each). */
static inline __m256i pair_words16(__m256i v, int k) {
    const short lo = (short)(((4 * k + 1) << 8) | (4 * k)), hi = (short)(((4 * k + 3) << 8) | (4 * k + 2));
    return _mm256_shuffle_epi8(v, _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo)));
}

/* sum_j m[j] * (bsums[2j] + bsums[2j+1]) as 8 int32 lanes. */
static inline __m256i k4_mins_dot(uint64_t m, const int16_t *bsums) {
    __m256i m32 = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)m));
    __m256i mdup = _mm256_or_si256(m32, _mm256_slli_epi32(m32, 16));
    return _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)bsums), mdup);
}

void hm_vec_dot_q4_k_avx2(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q4_k *x = vx;
    const hm_block_q8_k *y = vy;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / HM_QK_K; i++) {
        uint64_t sc, m;
        hm_k4_unpack_scales64(x[i].scales, &sc, &m);
        const float d = hm_k_half(x[i].d) * y[i].d, dmin = hm_k_half(x[i].dmin) * y[i].d;
        accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(k4_mins_dot(m, y[i].bsums)), _mm256_set1_ps(dmin), accm);
        const __m256i scv = _mm256_broadcastsi128_si256(_mm_cvtsi64_si128((long long)sc));
        const uint8_t *q = x[i].qs;
        const int8_t *a = y[i].qs;
        __m256i sumi = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++, q += 32, a += 64) {
            const __m256i qv = _mm256_loadu_si256((const __m256i *)q);
            const __m256i lo = _mm256_and_si256(qv, m4), hi = _mm256_and_si256(_mm256_srli_epi16(qv, 4), m4);
            const __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)a));
            const __m256i p1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(a + 32)));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p0, bcast_byte16(scv, 2 * c)));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p1, bcast_byte16(scv, 2 * c + 1)));
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(d), acc);
    }
    *out = hsum256_ps(acc) - hsum256_ps(accm);
}

void hm_vec_dot_q5_k_avx2(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q5_k *x = vx;
    const hm_block_q8_k *y = vy;
    const __m256i m4 = _mm256_set1_epi8(0x0f), bit4 = _mm256_set1_epi8(0x10);
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / HM_QK_K; i++) {
        uint64_t sc, m;
        hm_k4_unpack_scales64(x[i].scales, &sc, &m);
        const float d = hm_k_half(x[i].d) * y[i].d, dmin = hm_k_half(x[i].dmin) * y[i].d;
        accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(k4_mins_dot(m, y[i].bsums)), _mm256_set1_ps(dmin), accm);
        const __m256i scv = _mm256_broadcastsi128_si256(_mm_cvtsi64_si128((long long)sc));
        /* hb >> 2c each chunk: bits 0 and 1 of every byte are then the fifth bits of chunk c */
        __m256i hb = _mm256_loadu_si256((const __m256i *)x[i].qh);
        const uint8_t *q = x[i].qs;
        const int8_t *a = y[i].qs;
        __m256i sumi = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++, q += 32, a += 64) {
            const __m256i qv = _mm256_loadu_si256((const __m256i *)q);
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(qv, m4),
                                               _mm256_and_si256(_mm256_slli_epi16(hb, 4), bit4));
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qv, 4), m4),
                                               _mm256_and_si256(_mm256_slli_epi16(hb, 3), bit4));
            hb = _mm256_srli_epi16(hb, 2);
            const __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)a));
            const __m256i p1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(a + 32)));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p0, bcast_byte16(scv, 2 * c)));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p1, bcast_byte16(scv, 2 * c + 1)));
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(d), acc);
    }
    *out = hsum256_ps(acc) - hsum256_ps(accm);
}

void hm_vec_dot_q6_k_avx2(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q6_k *x = vx;
    const hm_block_q8_k *y = vy;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / HM_QK_K; i++) {
        const float d = hm_k_half(x[i].d) * y[i].d;
        /* sum_j sc[j] * bsums[j]: the -32 offset of every level, applied once */
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
        const __m256i offs = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[i].bsums), sc16);
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i qa = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h));
            const __m256i qb = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * h));
            const __m256i scv = _mm256_broadcastsi128_si256(
                _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(x[i].scales + 8 * h))));
            const int8_t *a = y[i].qs + 128 * h;
            __m256i q6[4];
            q6[0] = _mm256_or_si256(_mm256_and_si256(qa, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
            q6[1] = _mm256_or_si256(_mm256_and_si256(qb, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
            q6[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qa, 4), m4), _mm256_and_si256(qh, m30));
            q6[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qb, 4), m4),
                                    _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
            for (int k = 0; k < 4; k++) {
                const __m256i p = _mm256_maddubs_epi16(q6[k], _mm256_loadu_si256((const __m256i *)(a + 32 * k)));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, pair_words16(scv, k)));
            }
        }
        sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(offs, 5));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(d), acc);
    }
    *out = hsum256_ps(acc);
}

void hm_vec_dot_iq4_xs_avx2(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_iq4_xs *x = vx;
    const hm_block_q8_k *y = vy;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)hm_kvalues_iq4nl));
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / HM_QK_K; i++) {
        const float d = hm_k_half(x[i].d) * y[i].d;
        const __m256i scv = _mm256_broadcastsi128_si256(hm_iq4xs_scales16(&x[i]));
        __m256i sumi = _mm256_setzero_si256();
        for (int k = 0; k < 4; k++) {
            /* 32 bytes = sub-blocks 2k (low half) and 2k+1 (high half); activations regrouped so
             * the low nibbles meet elements 0..15 and the high nibbles 16..31 of each */
            const __m256i qv = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * k));
            const int8_t *a = y[i].qs + 64 * k;
            const __m256i alo = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
                                                        _mm_loadu_si128((const __m128i *)(a + 32)), 1);
            const __m256i ahi = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(a + 16))),
                                                        _mm_loadu_si128((const __m128i *)(a + 48)), 1);
            const __m256i vlo = _mm256_shuffle_epi8(table, _mm256_and_si256(qv, m4));
            const __m256i vhi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(qv, 4), m4));
            const __m256i plo = _mm256_maddubs_epi16(_mm256_sign_epi8(vlo, vlo), _mm256_sign_epi8(alo, vlo));
            const __m256i phi = _mm256_maddubs_epi16(_mm256_sign_epi8(vhi, vhi), _mm256_sign_epi8(ahi, vhi));
            const __m256i s = pair_words16(scv, k);
            /* two madds: plo + phi could reach 2 * 32258 and overflow int16 */
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(_mm256_madd_epi16(plo, s), _mm256_madd_epi16(phi, s)));
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(d), acc);
    }
    *out = hsum256_ps(acc);
}

void hm_from_float_q8_k_avx2(const float *src, void *dst, int64_t n) {
    hm_block_q8_k *y = dst;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (int64_t i = 0; i < n / HM_QK_K; i++, src += HM_QK_K) {
        __m256 vmax = _mm256_setzero_ps();
        for (int j = 0; j < HM_QK_K; j += 8) vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, _mm256_loadu_ps(src + j)));
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        const float amax = _mm_cvtss_f32(m);
        if (!amax) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        /* the reference keeps the first element of largest magnitude, with its sign */
        const __m256 va = _mm256_set1_ps(amax);
        float max = 0;
        for (int j = 0; j < HM_QK_K; j += 8) {
            int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(src + j)), va, _CMP_EQ_OQ));
            if (mask) {
                max = src[j + __builtin_ctz((unsigned)mask)];
                break;
            }
        }
        const float iscale = -127.f / max;
        const __m256 vs = _mm256_set1_ps(iscale);
        const __m256i lim = _mm256_set1_epi32(127);
        __m256i quads[8];
        for (int j = 0; j < HM_QK_K; j += 32) {
            __m256i v[4];
            for (int k = 0; k < 4; k++)
                v[k] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(src + j + 8 * k))), lim);
            /* packs work per 128-bit half: restore element order with one permute */
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
            p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(y[i].qs + j), p);
            quads[j / 32] = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, p), ones16);
        }
        /* quads[k]: 8 sums of 4; lanes 0-3 = group 2k, 4-7 = group 2k+1 */
        __m256i r0 = _mm256_hadd_epi32(_mm256_hadd_epi32(quads[0], quads[1]), _mm256_hadd_epi32(quads[2], quads[3]));
        __m256i r1 = _mm256_hadd_epi32(_mm256_hadd_epi32(quads[4], quads[5]), _mm256_hadd_epi32(quads[6], quads[7]));
        /* r0 = [g0 g2 g4 g6 | g1 g3 g5 g7], r1 the same for g8..g15 */
        const __m256i pk = _mm256_packs_epi32(r0, r1); /* [g0 g2 .. g14 | g1 g3 .. g15] */
        const __m128i lo = _mm256_castsi256_si128(pk), hi = _mm256_extracti128_si256(pk, 1);
        _mm_storeu_si128((__m128i *)y[i].bsums, _mm_unpacklo_epi16(lo, hi));
        _mm_storeu_si128((__m128i *)(y[i].bsums + 8), _mm_unpackhi_epi16(lo, hi));
        y[i].d = 1 / iscale;
    }
}

#endif
