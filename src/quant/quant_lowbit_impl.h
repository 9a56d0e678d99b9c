/* quant_lowbit_impl.h - internals of the low-bit family: Q4_1, Q5_1 (with their activation
 * partner Q8_1), IQ4_NL (partner Q8_0) and the 2/3-bit K-quants Q2_K, Q3_K (partner Q8_K).
 * Block layouts bit-exact with ggml-common.h, the decoding helpers shared by the scalar and
 * SIMD files, and the SIMD entry points quant_lowbit.c registers.
 *
 * Invariant kept by every vec_dot variant: the integer part of each block's dot is exact; only
 * the float accumulation order differs between scalar, AVX2 and AVX-512. */
#ifndef HM_QUANT_LOWBIT_IMPL_H
#define HM_QUANT_LOWBIT_IMPL_H

#include <stdint.h>
#include <string.h>

#include "quant.h"
#include "quant_impl.h"
#include "quant_k_impl.h"

#define HM_QK4_1 32
#define HM_QK5_1 32
#define HM_QK8_1 32
#define HM_QK4_NL 32

/* q4_1: qs[j] low nibble = element j, high nibble = element j + 16; value = q * d + m. */
typedef struct hm_block_q4_1 {
    uint16_t d; /* fp16 scale */
    uint16_t m; /* fp16 minimum */
    uint8_t qs[HM_QK4_1 / 2];
} hm_block_q4_1;

/* q5_1: q4_1 plus a fifth bit per element in qh (element j at bit j of the little-endian uint32);
 * value = q * d + m, q in [0, 31]. */
typedef struct hm_block_q5_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[HM_QK5_1 / 2];
} hm_block_q5_1;

/* q8_1 (activations only): value = qs[i] * d; s = fp16(d * sum of qs). */
typedef struct hm_block_q8_1 {
    uint16_t d;
    uint16_t s;
    int8_t qs[HM_QK8_1];
} hm_block_q8_1;

/* iq4_nl: nibble order as q4_0; value = d * kvalues_iq4nl[q]. */
typedef struct hm_block_iq4_nl {
    uint16_t d;
    uint8_t qs[HM_QK4_NL / 2];
} hm_block_iq4_nl;

/* q2_k: 16 sub-blocks of 16; value = d * (scales[j] & 15) * q - dmin * (scales[j] >> 4),
 * q in [0, 3]. Element e, in 128-element half h = e / 128 with r = e % 128: bits 2*(r / 32) of
 * qs[32h + r % 32]. */
typedef struct hm_block_q2_k {
    uint8_t scales[HM_QK_K / 16];
    uint8_t qs[HM_QK_K / 4];
    uint16_t d;    /* fp16 super-scale of the scales */
    uint16_t dmin; /* fp16 super-scale of the mins */
} hm_block_q2_k;

/* q3_k: 16 sub-blocks of 16; value = d * (s[j] - 32) * (q - (high bit ? 0 : 4)), q the 2 low bits
 * laid out as q2_k's, the high bit of element e at bit e / 32 of hmask[e % 32]. The 6-bit s[j]:
 * low nibble in scales[j % 8] (nibble j / 8), top 2 bits at bits 2*(j / 4) of scales[8 + j % 4]. */
typedef struct hm_block_q3_k {
    uint8_t hmask[HM_QK_K / 8];
    uint8_t qs[HM_QK_K / 4];
    uint8_t scales[12];
    uint16_t d; /* fp16 */
} hm_block_q3_k;

_Static_assert(sizeof(hm_block_q4_1) == 20, "q4_1 block is 20 bytes");
_Static_assert(sizeof(hm_block_q5_1) == 24, "q5_1 block is 24 bytes");
_Static_assert(sizeof(hm_block_q8_1) == 36, "q8_1 block is 36 bytes");
_Static_assert(sizeof(hm_block_iq4_nl) == 18, "iq4_nl block is 18 bytes");
_Static_assert(sizeof(hm_block_q2_k) == 84, "q2_K block is 84 bytes");
_Static_assert(sizeof(hm_block_q3_k) == 110, "q3_K block is 110 bytes");

/* The 16 unsigned 6-bit sub-block scales of a q3_k block, byte j of the four words = s[j], done
 * on 32-bit words (four sub-blocks at once): words 0 and 1 take the low nibbles of bytes 0-7
 * (s[0..7]), words 2 and 3 their high nibbles (s[8..15]); the top two bits of s[j] sit at bits
 * 2 * (j / 4) of byte 8 + j % 4, i.e. in word 2 of the packed bytes shifted by 0, 2, 4, 6. */
static inline void hm_q3k_scales_u(const uint8_t packed[12], uint32_t out[4]) {
    uint32_t a, b, hi;
    memcpy(&a, packed, 4);
    memcpy(&b, packed + 4, 4);
    memcpy(&hi, packed + 8, 4);
    out[0] = (a & 0x0f0f0f0fu) | ((hi & 0x03030303u) << 4);
    out[1] = (b & 0x0f0f0f0fu) | (((hi >> 2) & 0x03030303u) << 4);
    out[2] = ((a >> 4) & 0x0f0f0f0fu) | (((hi >> 4) & 0x03030303u) << 4);
    out[3] = ((b >> 4) & 0x0f0f0f0fu) | (((hi >> 6) & 0x03030303u) << 4);
}

/* The 16 signed sub-block scales (s - 32) of a q3_k block. */
static inline void hm_q3k_scales(const uint8_t packed[12], int8_t out[16]) {
    uint32_t u[4];
    uint8_t b[16];
    hm_q3k_scales_u(packed, u);
    memcpy(b, u, 16);
    for (int j = 0; j < 16; j++) out[j] = (int8_t)(b[j] - 32);
}

#ifdef __AVX2__
#include <immintrin.h>

/* 32 nibbles of a 16-byte q4_1 / iq4_nl / q5_1 payload in element order (low nibbles then
 * high), values 0..15. */
static inline __m256i hm_lb_nibbles(const uint8_t *q) {
    const __m128i b = _mm_loadu_si128((const __m128i *)q);
    const __m128i m4 = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m4), _mm_and_si128(b, m4));
}

/* The 32 codes (0..31) of a q5_1 block in element order: nibble | fifth bit << 4. */
static inline __m256i hm_lb_q5_1_codes(const hm_block_q5_1 *b) {
    uint32_t qh;
    memcpy(&qh, b->qh, 4);
    /* byte k takes qh byte k / 8, then keeps bit k % 8 */
    const __m256i spread = _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
    const __m256i bitsel = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i h = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread), bitsel);
    const __m256i set = _mm256_and_si256(_mm256_cmpeq_epi8(h, bitsel), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(hm_lb_nibbles(b->qs), set);
}

/* Eight int32 lanes whose total is sum(x*y) over 32 signed bytes (y never -128). */
static inline __m256i hm_lb_dot_s8s8(__m256i x, __m256i y) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)), _mm256_set1_epi16(1));
}

/* Eight int32 lanes whose total is sum(u*y) over 32 unsigned bytes u <= 127 and signed y. */
static inline __m256i hm_lb_dot_u8s8(__m256i u, __m256i y) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), _mm256_set1_epi16(1));
}
#endif

/* SIMD variants (compiled where the build targets the ISA; registered by quant_lowbit.c). */
void hm_lowbit_register_avx2(hm_type_traits *table);
void hm_lowbit_register_avx512(hm_type_traits *table);

#endif
