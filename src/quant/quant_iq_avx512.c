/* quant_iq_avx512.c - AVX-512 (F+BW+VL; VNNI when present) dot products of the grid i-quants
 * against Q8_K.
 *
 * One zmm is 64 elements, two 32-element sub-blocks: the eight grid entries of their groups (IQ2 /
 * IQ1: eight 8-byte entries; IQ3: sixteen 4-byte entries), put together in registers. Signs never touch the
 * weights: they become a 64-bit mask, one bit an element, that negates the activations under it
 * (vpsubb with a mask), so the IQ2/IQ3 grid bytes (<= 62) stay unsigned for maddubs (no saturation:
 * 2 * 62 * 127 < 2^15). IQ1 levels 8 g +- 1 are signed: their absolute value meets the activation
 * negated where the level is negative. The int16 pair sums are multiplied by the 16-element scale
 * codes (2s + 1) with madd (vpdpwssd under VNNI), so each super-block's integer sums are exact;
 * the float accumulation is the AVX2 variant's (IQ_DOT_END), so the two give the same bits and
 * differ from the scalar reference (quant_iq.c) only by float summation order. */
#include "quant_iq_impl.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#include <string.h>

#include "core/fp16.h"
#include "quant_impl.h"

#ifdef __AVX512VNNI__
#define IQ_DPWSSD(acc, a, b) _mm512_dpwssd_epi32((acc), (a), (b))
#else
#define IQ_DPWSSD(acc, a, b) _mm512_add_epi32((acc), _mm512_madd_epi16((a), (b)))
#endif

static inline uint32_t rd32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline uint64_t rd64(const void *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* The scale codes of 64 elements as int16 lanes, one code per 16 elements. */
static inline __m512i scales4(int a, int b, int c, int d) {
    const __m256i lo = _mm256_setr_m128i(_mm_set1_epi16((short)a), _mm_set1_epi16((short)b));
    const __m256i hi = _mm256_setr_m128i(_mm_set1_epi16((short)c), _mm_set1_epi16((short)d));
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* acc + sum over 64 elements of grid (unsigned bytes) * (-1 where sign bit) * q8, times sc. */
static inline __m512i dot64_unsigned(__m512i acc, __m512i grid, uint64_t signs, const int8_t *q8, __m512i sc) {
    const __m512i y = _mm512_loadu_si512((const void *)q8);
    const __m512i ys = _mm512_mask_sub_epi8(y, (__mmask64)signs, _mm512_setzero_si512(), y);
    return IQ_DPWSSD(acc, _mm512_maddubs_epi16(grid, ys), sc);
}

/* The same for signed levels. */
static inline __m512i dot64_signed(__m512i acc, __m512i lv, const int8_t *q8, __m512i sc) {
    const __m512i y = _mm512_loadu_si512((const void *)q8);
    const __m512i ys = _mm512_mask_sub_epi8(y, _mm512_movepi8_mask(lv), _mm512_setzero_si512(), y);
    return IQ_DPWSSD(acc, _mm512_maddubs_epi16(_mm512_abs_epi8(lv), ys), sc);
}

/* Eight 8-byte grid entries as one zmm, built in registers (eight scalar stores read back as one
 * 64-byte load would stall store forwarding). */
static inline __m512i grid8(const uint64_t g[8]) {
    const __m256i lo = _mm256_setr_epi64x((long long)g[0], (long long)g[1], (long long)g[2], (long long)g[3]);
    const __m256i hi = _mm256_setr_epi64x((long long)g[4], (long long)g[5], (long long)g[6], (long long)g[7]);
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* Sixteen 4-byte grid entries (IQ3) as one zmm, built in registers (table loads: cheaper than a
 * gather on most cores). */
static inline __m512i grid16(const uint32_t e[16]) {
    const __m256i lo = _mm256_setr_epi32((int)e[0], (int)e[1], (int)e[2], (int)e[3], (int)e[4], (int)e[5], (int)e[6], (int)e[7]);
    const __m256i hi =
        _mm256_setr_epi32((int)e[8], (int)e[9], (int)e[10], (int)e[11], (int)e[12], (int)e[13], (int)e[14], (int)e[15]);
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* Each byte of v (7-bit codes) with its parity in bit 7: eight hm_iq_signs7 at once. */
static inline uint64_t signs7_bytes(uint64_t v) {
    uint64_t p = v ^ (v >> 4);
    p ^= p >> 2;
    p ^= p >> 1;
    return v | (p & 0x0101010101010101ull) << 7;
}

/* Eight 7-bit sign codes (bits 7k..7k+6 of a and b: four each) as one 64-bit mask. */
static inline uint64_t signs7x8(uint32_t a, uint32_t b) {
#ifdef __BMI2__
    const uint64_t v = _pdep_u64(a & 0x0fffffffu, 0x7f7f7f7full) | _pdep_u64(b & 0x0fffffffu, 0x7f7f7f7full) << 32;
#else
    uint64_t v = 0;
    for (int k = 0; k < 4; k++)
        v |= (uint64_t)((a >> (7 * k)) & 127) << (8 * k) | (uint64_t)((b >> (7 * k)) & 127) << (8 * k + 32);
#endif
    return signs7_bytes(v);
}

/* The float side is the AVX2 variant's, so that both give the same bits: the two 256-bit halves of
 * the integer sums (sub-blocks 2j and 2j+1 lane by lane, as the AVX2 code accumulates them into one
 * ymm) are added exactly, then scaled and accumulated in 8 float lanes and summed in its order. */
static inline float hsum256_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#define IQ_DOT_BEGIN(BT)                                \
    const BT *x = vx;                                   \
    const hm_block_q8_k *y = vy;                        \
    __m256 acc = _mm256_setzero_ps();                   \
    for (int64_t i = 0; i < n / HM_QK_K; i++) {         \
        const BT *b = &x[i];                            \
        const int8_t *q8 = y[i].qs;                     \
        __m512i sumi = _mm512_setzero_si512();
#define IQ_DOT_END(D, FACTOR)                                                                               \
        const __m256i s8 = _mm256_add_epi32(_mm512_castsi512_si256(sumi), _mm512_extracti64x4_epi64(sumi, 1)); \
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s8), _mm256_set1_ps((D) * y[i].d), acc);                    \
    }                                                                                                       \
    *out = hsum256_ps(acc) * (FACTOR);

void hm_vec_dot_iq2_xxs_avx512(int64_t n, float *out, const void *vx, const void *vy) {
    IQ_DOT_BEGIN(hm_block_iq2_xxs)
    for (int ib = 0; ib < 8; ib += 2, q8 += 64) {
        const uint32_t i0 = rd32(b->qs + 4 * ib), s0 = rd32(b->qs + 4 * ib + 2);
        const uint32_t i1 = rd32(b->qs + 4 * ib + 4), s1 = rd32(b->qs + 4 * ib + 6);
        const uint64_t g[8] = {hm_iq2xxs_grid[i0 & 0xff], hm_iq2xxs_grid[(i0 >> 8) & 0xff],
                               hm_iq2xxs_grid[(i0 >> 16) & 0xff], hm_iq2xxs_grid[i0 >> 24],
                               hm_iq2xxs_grid[i1 & 0xff], hm_iq2xxs_grid[(i1 >> 8) & 0xff],
                               hm_iq2xxs_grid[(i1 >> 16) & 0xff], hm_iq2xxs_grid[i1 >> 24]};
        const int l0 = 2 * (int)(s0 >> 28) + 1, l1 = 2 * (int)(s1 >> 28) + 1;
        sumi = dot64_unsigned(sumi, grid8(g), signs7x8(s0, s1), q8, scales4(l0, l0, l1, l1));
    }
    IQ_DOT_END(hm_fp16_to_f32(b->d), 0.125f)
}

void hm_vec_dot_iq2_xs_avx512(int64_t n, float *out, const void *vx, const void *vy) {
    IQ_DOT_BEGIN(hm_block_iq2_xs)
    for (int ib = 0; ib < 8; ib += 2, q8 += 64) {
        const uint16_t *w = b->qs + 4 * ib;
        uint64_t g[8];
        for (int k = 0; k < 8; k++) g[k] = hm_iq2xs_grid[w[k] & 511];
        /* the eight codes w[k] >> 9 as bytes */
        const __m128i c = _mm_srli_epi16(_mm_loadu_si128((const __m128i *)(const void *)w), 9);
        const uint64_t m = signs7_bytes((uint64_t)_mm_cvtsi128_si64(_mm_packus_epi16(c, c)));
        const int c0 = b->scales[ib], c1 = b->scales[ib + 1];
        sumi = dot64_unsigned(sumi, grid8(g), m, q8,
                              scales4(2 * (c0 & 15) + 1, 2 * (c0 >> 4) + 1, 2 * (c1 & 15) + 1, 2 * (c1 >> 4) + 1));
    }
    IQ_DOT_END(hm_fp16_to_f32(b->d), 0.125f)
}

void hm_vec_dot_iq2_s_avx512(int64_t n, float *out, const void *vx, const void *vy) {
    IQ_DOT_BEGIN(hm_block_iq2_s)
    for (int ib = 0; ib < 8; ib += 2, q8 += 64) {
        const uint8_t *qs = b->qs + 4 * ib;
        const int h0 = b->qh[ib], h1 = b->qh[ib + 1];
        const uint64_t g[8] = {hm_iq2s_grid[qs[0] | (h0 & 3) << 8],    hm_iq2s_grid[qs[1] | (h0 & 0xc) << 6],
                               hm_iq2s_grid[qs[2] | (h0 & 0x30) << 4], hm_iq2s_grid[qs[3] | (h0 & 0xc0) << 2],
                               hm_iq2s_grid[qs[4] | (h1 & 3) << 8],    hm_iq2s_grid[qs[5] | (h1 & 0xc) << 6],
                               hm_iq2s_grid[qs[6] | (h1 & 0x30) << 4], hm_iq2s_grid[qs[7] | (h1 & 0xc0) << 2]};
        const int c0 = b->scales[ib], c1 = b->scales[ib + 1];
        sumi = dot64_unsigned(sumi, grid8(g), rd64(b->qs + 32 + 4 * ib), q8,
                              scales4(2 * (c0 & 15) + 1, 2 * (c0 >> 4) + 1, 2 * (c1 & 15) + 1, 2 * (c1 >> 4) + 1));
    }
    IQ_DOT_END(hm_fp16_to_f32(b->d), 0.125f)
}

void hm_vec_dot_iq3_xxs_avx512(int64_t n, float *out, const void *vx, const void *vy) {
    IQ_DOT_BEGIN(hm_block_iq3_xxs)
    for (int ib = 0; ib < 8; ib += 2, q8 += 64) {
        const uint32_t s0 = rd32(b->qs + 64 + 4 * ib), s1 = rd32(b->qs + 64 + 4 * ib + 4);
        const uint8_t *q = b->qs + 8 * ib;
        uint32_t e[16];
        for (int k = 0; k < 16; k++) e[k] = hm_iq3xxs_grid[q[k]];
        const __m512i g = grid16(e);
        const int l0 = 2 * (int)(s0 >> 28) + 1, l1 = 2 * (int)(s1 >> 28) + 1;
        sumi = dot64_unsigned(sumi, g, signs7x8(s0, s1), q8, scales4(l0, l0, l1, l1));
    }
    IQ_DOT_END(hm_fp16_to_f32(b->d), 0.25f)
}

void hm_vec_dot_iq3_s_avx512(int64_t n, float *out, const void *vx, const void *vy) {
    IQ_DOT_BEGIN(hm_block_iq3_s)
    for (int ib = 0; ib < 8; ib += 2, q8 += 64) {
        /* the 16 half-group indices qs[8ib + k] | bit k%8 of qh[ib + k/8] << 8 */
        const uint8_t *q = b->qs + 8 * ib;
        const uint32_t h = (uint32_t)b->qh[ib] | (uint32_t)b->qh[ib + 1] << 8;
        uint32_t e[16];
        for (int k = 0; k < 16; k++) e[k] = hm_iq3s_grid[q[k] | ((h >> k) & 1) << 8];
        const __m512i g = grid16(e);
        const int c = b->scales[ib / 2], s0 = 2 * (c & 15) + 1, s1 = 2 * (c >> 4) + 1;
        sumi = dot64_unsigned(sumi, g, rd64(b->signs + 4 * ib), q8, scales4(s0, s0, s1, s1));
    }
    IQ_DOT_END(hm_fp16_to_f32(b->d), 1.0f)
}

/* IQ1 levels 8 g + shift: g bytes -1 / 0 / 1, shift +-1 per group of 8 (bit k of neg: group k). */
static inline __m512i iq1_levels(__m512i g, uint32_t neg) {
#ifdef __BMI2__
    const uint64_t m = _pdep_u64(neg, 0x0101010101010101ull) * 0xff;
#else
    uint64_t m = 0;
    for (int k = 0; k < 8; k++) m |= (0ull - ((neg >> k) & 1u)) & (0xffull << (8 * k));
#endif
    const __m512i shift = _mm512_mask_blend_epi8((__mmask64)m, _mm512_set1_epi8(1), _mm512_set1_epi8(-1));
    /* 8 g per byte: the 16-bit shift's carry into the next byte is masked off */
    const __m512i g8 = _mm512_and_si512(_mm512_slli_epi16(g, 3), _mm512_set1_epi8((char)0xf8));
    return _mm512_add_epi8(g8, shift);
}

void hm_vec_dot_iq1_s_avx512(int64_t n, float *out, const void *vx, const void *vy) {
    IQ_DOT_BEGIN(hm_block_iq1_s)
    for (int ib = 0; ib < 8; ib += 2, q8 += 64) {
        const uint8_t *qs = b->qs + 4 * ib;
        const int h0 = b->qh[ib], h1 = b->qh[ib + 1];
        const uint64_t g[8] = {hm_iq1s_grid[qs[0] | (h0 & 7) << 8],        hm_iq1s_grid[qs[1] | ((h0 >> 3) & 7) << 8],
                               hm_iq1s_grid[qs[2] | ((h0 >> 6) & 7) << 8], hm_iq1s_grid[qs[3] | ((h0 >> 9) & 7) << 8],
                               hm_iq1s_grid[qs[4] | (h1 & 7) << 8],        hm_iq1s_grid[qs[5] | ((h1 >> 3) & 7) << 8],
                               hm_iq1s_grid[qs[6] | ((h1 >> 6) & 7) << 8], hm_iq1s_grid[qs[7] | ((h1 >> 9) & 7) << 8]};
        const uint32_t neg = (h0 & 0x8000 ? 0x0fu : 0) | (h1 & 0x8000 ? 0xf0u : 0);
        const int l0 = 2 * ((h0 >> 12) & 7) + 1, l1 = 2 * ((h1 >> 12) & 7) + 1;
        sumi = dot64_signed(sumi, iq1_levels(grid8(g), neg), q8, scales4(l0, l0, l1, l1));
    }
    IQ_DOT_END(hm_fp16_to_f32(b->d), 0.125f)
}

void hm_vec_dot_iq1_m_avx512(int64_t n, float *out, const void *vx, const void *vy) {
    IQ_DOT_BEGIN(hm_block_iq1_m)
    const uint16_t *sw = (const uint16_t *)(const void *)b->scales;
    for (int ib = 0; ib < 8; ib += 2, q8 += 64) {
        const uint8_t *qs = b->qs + 4 * ib;
        const uint32_t h = rd32(b->qh + 2 * ib); /* qh[2ib .. 2ib+3]: a nibble a group */
        uint64_t g[8];
        uint32_t neg = 0;
        for (int k = 0; k < 8; k++) {
            const uint32_t nib = (h >> (4 * k)) & 15;
            g[k] = hm_iq1s_grid[qs[k] | (nib & 7) << 8];
            neg |= (nib >> 3) << k;
        }
        uint16_t sc;
        memcpy(&sc, sw + ib / 2, 2);
        const int a0 = 2 * (sc & 7) + 1, a1 = 2 * ((sc >> 3) & 7) + 1, a2 = 2 * ((sc >> 6) & 7) + 1,
                  a3 = 2 * ((sc >> 9) & 7) + 1;
        sumi = dot64_signed(sumi, iq1_levels(grid8(g), neg), q8, scales4(a0, a1, a2, a3));
    }
    IQ_DOT_END(hm_fp16_to_f32(hm_iq1m_d(b->scales)), 0.125f)
}

#endif
