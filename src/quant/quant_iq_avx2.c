/* quant_iq_avx2.c - AVX2 dot products of the grid i-quants against Q8_K.
 *
 * Per 32 elements: the four grid entries of the groups go into one vector (as the scalar
 * unpacking, quant_iq.c, reads them) and meet the activations through maddubs. IQ2/IQ3 grid
 * points are unsigned (<= 62): their signs move onto the activation (sign_epi8 with +-1 lanes
 * expanded from the sign bytes), so maddubs never saturates (2 * 62 * 127 < 2^15). IQ1 levels
 * 8 g +- 1 are signed (|level| <= 9): abs on the weight side, the sign on the activation. The
 * pair sums are then multiplied by the (2s + 1) scale codes with madd, so each super-block's
 * integer sum is exact and only the float accumulation differs from the scalar reference. */
#ifdef __AVX2__

#include <immintrin.h>
#include <string.h>

#include "core/fp16.h"
#include "quant_impl.h"
#include "quant_iq_impl.h"

static inline float hsum256_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* +1 / -1 lanes from four sign bytes (byte l of s4 for the 8 lanes of group l). */
static inline __m256i signs_pm1(uint32_t s4) {
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3,
                                          3, 3, 3, 3, 3);
    const __m256i bits = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)s4), shuf);
    return _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bits), bits), _mm256_set1_epi8(1));
}

/* The 8 signs of a 7-bit sign code (bit 7 = parity, hm_iq_signs7) as +1 / -1 bytes: entry i byte j
 * is 0xff (-1) where bit j of the full sign byte is set, else 0x01. Generated from that rule. */
static const uint64_t signs7_pm1[128] = {
    0x0101010101010101ull, 0xff010101010101ffull, 0xff0101010101ff01ull, 0x010101010101ffffull,
    0xff01010101ff0101ull, 0x0101010101ff01ffull, 0x0101010101ffff01ull, 0xff01010101ffffffull,
    0xff010101ff010101ull, 0x01010101ff0101ffull, 0x01010101ff01ff01ull, 0xff010101ff01ffffull,
    0x01010101ffff0101ull, 0xff010101ffff01ffull, 0xff010101ffffff01ull, 0x01010101ffffffffull,
    0xff0101ff01010101ull, 0x010101ff010101ffull, 0x010101ff0101ff01ull, 0xff0101ff0101ffffull,
    0x010101ff01ff0101ull, 0xff0101ff01ff01ffull, 0xff0101ff01ffff01ull, 0x010101ff01ffffffull,
    0x010101ffff010101ull, 0xff0101ffff0101ffull, 0xff0101ffff01ff01ull, 0x010101ffff01ffffull,
    0xff0101ffffff0101ull, 0x010101ffffff01ffull, 0x010101ffffffff01ull, 0xff0101ffffffffffull,
    0xff01ff0101010101ull, 0x0101ff01010101ffull, 0x0101ff010101ff01ull, 0xff01ff010101ffffull,
    0x0101ff0101ff0101ull, 0xff01ff0101ff01ffull, 0xff01ff0101ffff01ull, 0x0101ff0101ffffffull,
    0x0101ff01ff010101ull, 0xff01ff01ff0101ffull, 0xff01ff01ff01ff01ull, 0x0101ff01ff01ffffull,
    0xff01ff01ffff0101ull, 0x0101ff01ffff01ffull, 0x0101ff01ffffff01ull, 0xff01ff01ffffffffull,
    0x0101ffff01010101ull, 0xff01ffff010101ffull, 0xff01ffff0101ff01ull, 0x0101ffff0101ffffull,
    0xff01ffff01ff0101ull, 0x0101ffff01ff01ffull, 0x0101ffff01ffff01ull, 0xff01ffff01ffffffull,
    0xff01ffffff010101ull, 0x0101ffffff0101ffull, 0x0101ffffff01ff01ull, 0xff01ffffff01ffffull,
    0x0101ffffffff0101ull, 0xff01ffffffff01ffull, 0xff01ffffffffff01ull, 0x0101ffffffffffffull,
    0xffff010101010101ull, 0x01ff0101010101ffull, 0x01ff01010101ff01ull, 0xffff01010101ffffull,
    0x01ff010101ff0101ull, 0xffff010101ff01ffull, 0xffff010101ffff01ull, 0x01ff010101ffffffull,
    0x01ff0101ff010101ull, 0xffff0101ff0101ffull, 0xffff0101ff01ff01ull, 0x01ff0101ff01ffffull,
    0xffff0101ffff0101ull, 0x01ff0101ffff01ffull, 0x01ff0101ffffff01ull, 0xffff0101ffffffffull,
    0x01ff01ff01010101ull, 0xffff01ff010101ffull, 0xffff01ff0101ff01ull, 0x01ff01ff0101ffffull,
    0xffff01ff01ff0101ull, 0x01ff01ff01ff01ffull, 0x01ff01ff01ffff01ull, 0xffff01ff01ffffffull,
    0xffff01ffff010101ull, 0x01ff01ffff0101ffull, 0x01ff01ffff01ff01ull, 0xffff01ffff01ffffull,
    0x01ff01ffffff0101ull, 0xffff01ffffff01ffull, 0xffff01ffffffff01ull, 0x01ff01ffffffffffull,
    0x01ffff0101010101ull, 0xffffff01010101ffull, 0xffffff010101ff01ull, 0x01ffff010101ffffull,
    0xffffff0101ff0101ull, 0x01ffff0101ff01ffull, 0x01ffff0101ffff01ull, 0xffffff0101ffffffull,
    0xffffff01ff010101ull, 0x01ffff01ff0101ffull, 0x01ffff01ff01ff01ull, 0xffffff01ff01ffffull,
    0x01ffff01ffff0101ull, 0xffffff01ffff01ffull, 0xffffff01ffffff01ull, 0x01ffff01ffffffffull,
    0xffffffff01010101ull, 0x01ffffff010101ffull, 0x01ffffff0101ff01ull, 0xffffffff0101ffffull,
    0x01ffffff01ff0101ull, 0xffffffff01ff01ffull, 0xffffffff01ffff01ull, 0x01ffffff01ffffffull,
    0x01ffffffff010101ull, 0xffffffffff0101ffull, 0xffffffffff01ff01ull, 0x01ffffffff01ffffull,
    0xffffffffffff0101ull, 0x01ffffffffff01ffull, 0x01ffffffffffff01ull, 0xffffffffffffffffull,
};

/* sum over 32 elements of grid (unsigned bytes) * sign * q8, times the scales, as 8 int32; the
 * signs as 7-bit codes c0..c3 of the four groups. */
static inline __m256i dot32_signs7(__m256i grid, uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, const int8_t *q8,
                                   __m256i sc) {
    const __m256i s = _mm256_setr_epi64x((long long)signs7_pm1[c0], (long long)signs7_pm1[c1], (long long)signs7_pm1[c2],
                                         (long long)signs7_pm1[c3]);
    const __m256i y = _mm256_loadu_si256((const __m256i *)q8);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(grid, _mm256_sign_epi8(y, s)), sc);
}

/* The scale codes of 32 elements as int16 lanes: lo for the first 16, hi for the second. */
static inline __m256i scales16(int lo, int hi) {
    return _mm256_setr_m128i(_mm_set1_epi16((short)lo), _mm_set1_epi16((short)hi));
}

/* sum over 32 elements of grid (unsigned bytes) * sign * q8, times the scales, as 8 int32. */
static inline __m256i dot32_unsigned(__m256i grid, uint32_t s4, const int8_t *q8, __m256i sc) {
    const __m256i y = _mm256_loadu_si256((const __m256i *)q8);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(grid, _mm256_sign_epi8(y, signs_pm1(s4))), sc);
}

/* The same for signed levels. */
static inline __m256i dot32_signed(__m256i lv, const int8_t *q8, __m256i sc) {
    const __m256i y = _mm256_loadu_si256((const __m256i *)q8);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(lv, lv), _mm256_sign_epi8(y, lv)), sc);
}

static inline __m256i grid4(uint64_t g0, uint64_t g1, uint64_t g2, uint64_t g3) {
    return _mm256_setr_epi64x((long long)g0, (long long)g1, (long long)g2, (long long)g3);
}

static inline uint32_t rd32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

#define IQ_DOT_BEGIN(BT)                                                 \
    const BT *x = vx;                                                    \
    const hm_block_q8_k *y = vy;                                         \
    __m256 acc = _mm256_setzero_ps();                                    \
    for (int64_t i = 0; i < n / HM_QK_K; i++) {                          \
        const BT *b = &x[i];                                             \
        const int8_t *q8 = y[i].qs;                                      \
        __m256i sumi = _mm256_setzero_si256();
#define IQ_DOT_END(D, FACTOR)                                                               \
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps((D) * y[i].d), acc); \
    }                                                                                       \
    *out = hsum256_ps(acc) * (FACTOR);

void hm_vec_dot_iq2_xxs_avx2(int64_t n, float *out, const void *vx, const void *vy) {
    IQ_DOT_BEGIN(hm_block_iq2_xxs)
    for (int ib = 0; ib < 8; ib++, q8 += 32) {
        const uint32_t idx = rd32(b->qs + 4 * ib), sg = rd32(b->qs + 4 * ib + 2);
        const __m256i g = grid4(hm_iq2xxs_grid[idx & 0xff], hm_iq2xxs_grid[(idx >> 8) & 0xff],
                                hm_iq2xxs_grid[(idx >> 16) & 0xff], hm_iq2xxs_grid[idx >> 24]);
        const int ls = 2 * (int)(sg >> 28) + 1;
        sumi = _mm256_add_epi32(sumi, dot32_signs7(g, sg & 127, (sg >> 7) & 127, (sg >> 14) & 127, (sg >> 21) & 127, q8,
                                                   _mm256_set1_epi16((short)ls)));
    }
    IQ_DOT_END(hm_fp16_to_f32(b->d), 0.125f)
}

void hm_vec_dot_iq2_xs_avx2(int64_t n, float *out, const void *vx, const void *vy) {
    IQ_DOT_BEGIN(hm_block_iq2_xs)
    for (int ib = 0; ib < 8; ib++, q8 += 32) {
        const uint16_t *w = b->qs + 4 * ib;
        const __m256i g = grid4(hm_iq2xs_grid[w[0] & 511], hm_iq2xs_grid[w[1] & 511], hm_iq2xs_grid[w[2] & 511],
                                hm_iq2xs_grid[w[3] & 511]);
        const int sc = b->scales[ib];
        sumi = _mm256_add_epi32(sumi, dot32_signs7(g, w[0] >> 9, w[1] >> 9, w[2] >> 9, w[3] >> 9, q8,
                                                   scales16(2 * (sc & 15) + 1, 2 * (sc >> 4) + 1)));
    }
    IQ_DOT_END(hm_fp16_to_f32(b->d), 0.125f)
}

void hm_vec_dot_iq2_s_avx2(int64_t n, float *out, const void *vx, const void *vy) {
    IQ_DOT_BEGIN(hm_block_iq2_s)
    for (int ib = 0; ib < 8; ib++, q8 += 32) {
        const uint8_t *qs = b->qs + 4 * ib;
        const int h = b->qh[ib];
        const __m256i g = grid4(hm_iq2s_grid[qs[0] | (h & 3) << 8], hm_iq2s_grid[qs[1] | (h & 0xc) << 6],
                                hm_iq2s_grid[qs[2] | (h & 0x30) << 4], hm_iq2s_grid[qs[3] | (h & 0xc0) << 2]);
        const int sc = b->scales[ib];
        sumi = _mm256_add_epi32(sumi, dot32_unsigned(g, rd32(b->qs + 32 + 4 * ib), q8,
                                                     scales16(2 * (sc & 15) + 1, 2 * (sc >> 4) + 1)));
    }
    IQ_DOT_END(hm_fp16_to_f32(b->d), 0.125f)
}

void hm_vec_dot_iq3_xxs_avx2(int64_t n, float *out, const void *vx, const void *vy) {
    IQ_DOT_BEGIN(hm_block_iq3_xxs)
    for (int ib = 0; ib < 8; ib++, q8 += 32) {
        const uint32_t sg = rd32(b->qs + 64 + 4 * ib);
        const uint8_t *q = b->qs + 8 * ib; /* eight table loads: cheaper than a gather on most cores */
        const __m256i g = _mm256_setr_epi32((int)hm_iq3xxs_grid[q[0]], (int)hm_iq3xxs_grid[q[1]], (int)hm_iq3xxs_grid[q[2]],
                                            (int)hm_iq3xxs_grid[q[3]], (int)hm_iq3xxs_grid[q[4]], (int)hm_iq3xxs_grid[q[5]],
                                            (int)hm_iq3xxs_grid[q[6]], (int)hm_iq3xxs_grid[q[7]]);
        sumi = _mm256_add_epi32(sumi, dot32_signs7(g, sg & 127, (sg >> 7) & 127, (sg >> 14) & 127, (sg >> 21) & 127, q8,
                                                   _mm256_set1_epi16((short)(2 * (sg >> 28) + 1))));
    }
    IQ_DOT_END(hm_fp16_to_f32(b->d), 0.25f)
}

void hm_vec_dot_iq3_s_avx2(int64_t n, float *out, const void *vx, const void *vy) {
    IQ_DOT_BEGIN(hm_block_iq3_s)
    for (int ib = 0; ib < 8; ib++, q8 += 32) {
        /* the 8 half-group indices qs[8ib + k] | bit k of qh[ib] << 8 */
        const uint8_t *q = b->qs + 8 * ib;
        const int h = b->qh[ib];
        const __m256i g = _mm256_setr_epi32(
            (int)hm_iq3s_grid[q[0] | (h << 8 & 256)], (int)hm_iq3s_grid[q[1] | (h << 7 & 256)],
            (int)hm_iq3s_grid[q[2] | (h << 6 & 256)], (int)hm_iq3s_grid[q[3] | (h << 5 & 256)],
            (int)hm_iq3s_grid[q[4] | (h << 4 & 256)], (int)hm_iq3s_grid[q[5] | (h << 3 & 256)],
            (int)hm_iq3s_grid[q[6] | (h << 2 & 256)], (int)hm_iq3s_grid[q[7] | (h << 1 & 256)]);
        const int s = (b->scales[ib / 2] >> (4 * (ib % 2))) & 15;
        sumi = _mm256_add_epi32(sumi, dot32_unsigned(g, rd32(b->signs + 4 * ib), q8, _mm256_set1_epi16((short)(2 * s + 1))));
    }
    IQ_DOT_END(hm_fp16_to_f32(b->d), 1.0f)
}

/* IQ1 levels 8 g + shift of four groups: g bytes -1 / 0 / 1, shift lanes +-1 per group. */
static inline __m256i iq1_levels(__m256i g, __m256i shift) {
    return _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), g), shift);
}
static inline uint64_t shift8(int neg) { return neg ? 0xffffffffffffffffull : 0x0101010101010101ull; }

void hm_vec_dot_iq1_s_avx2(int64_t n, float *out, const void *vx, const void *vy) {
    IQ_DOT_BEGIN(hm_block_iq1_s)
    for (int ib = 0; ib < 8; ib++, q8 += 32) {
        const uint8_t *qs = b->qs + 4 * ib;
        const int h = b->qh[ib];
        const __m256i g = grid4(hm_iq1s_grid[qs[0] | (h & 7) << 8], hm_iq1s_grid[qs[1] | ((h >> 3) & 7) << 8],
                                hm_iq1s_grid[qs[2] | ((h >> 6) & 7) << 8], hm_iq1s_grid[qs[3] | ((h >> 9) & 7) << 8]);
        const __m256i sh = _mm256_set1_epi64x((long long)shift8(h & 0x8000));
        sumi = _mm256_add_epi32(sumi, dot32_signed(iq1_levels(g, sh), q8, _mm256_set1_epi16((short)(2 * ((h >> 12) & 7) + 1))));
    }
    IQ_DOT_END(hm_fp16_to_f32(b->d), 0.125f)
}

void hm_vec_dot_iq1_m_avx2(int64_t n, float *out, const void *vx, const void *vy) {
    IQ_DOT_BEGIN(hm_block_iq1_m)
    for (int ib = 0; ib < 8; ib++, q8 += 32) {
        const uint8_t *qs = b->qs + 4 * ib;
        const int h0 = b->qh[2 * ib], h1 = b->qh[2 * ib + 1];
        const int sc = b->scales[2 * (ib / 2)] | b->scales[2 * (ib / 2) + 1] << 8;
        const __m256i g = grid4(hm_iq1s_grid[qs[0] | (h0 & 7) << 8], hm_iq1s_grid[qs[1] | ((h0 >> 4) & 7) << 8],
                                hm_iq1s_grid[qs[2] | (h1 & 7) << 8], hm_iq1s_grid[qs[3] | ((h1 >> 4) & 7) << 8]);
        /* the four groups' shifts (bits 3 and 7 of h0, h1) as +-1 lanes */
        const __m256i sh = _mm256_setr_epi64x((long long)shift8(h0 & 8), (long long)shift8(h0 & 0x80),
                                              (long long)shift8(h1 & 8), (long long)shift8(h1 & 0x80));
        const int s1 = (sc >> (6 * (ib % 2))) & 7, s2 = (sc >> (6 * (ib % 2) + 3)) & 7;
        sumi = _mm256_add_epi32(sumi, dot32_signed(iq1_levels(g, sh), q8, scales16(2 * s1 + 1, 2 * s2 + 1)));
    }
    IQ_DOT_END(hm_fp16_to_f32(hm_iq1m_d(b->scales)), 0.125f)
}

#endif
