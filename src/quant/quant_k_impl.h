/* quant_k_impl.h - internals of the K-quant family (Q8_K, Q4_K, Q5_K, Q6_K, IQ4_XS): block
 * layouts bit-exact with ggml-common.h, the shared decoding helpers, and the SIMD entry points
 * the family's register function (quant_k.c) installs.
 *
 * Every type here works on super-blocks of HM_QK_K = 256 elements; its dot partner is Q8_K.
 * Invariant kept by all vec_dot variants: the integer part of each super-block's dot is exact,
 * only the float accumulation order differs between scalar, AVX2 and AVX-512. */
#ifndef HM_QUANT_K_IMPL_H
#define HM_QUANT_K_IMPL_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "quant.h"

#define HM_QK_K 256

/* ---- quantiser helpers shared by the K-quant families (quant_k.c, quant_lowbit.c) ---- */

static inline int hm_k_min(int a, int b) { return a < b ? a : b; }
static inline int hm_k_max(int a, int b) { return a > b ? a : b; }

/* Round to nearest, ties to even, for |v| < 2^22: adding 1.5 * 2^23 leaves the integer in the
 * low mantissa bits (the float addition itself does the rounding). Same results as ggml's
 * nearest_int and as cvtps2dq under the default rounding mode. */
static inline int hm_k_round(float v) {
    float t = v + 12582912.f;
    int32_t i;
    memcpy(&i, &t, 4);
    return (i & 0x007fffff) - 0x00400000;
}

/* Index of the level in val[0..n) (ascending) nearest to x; ties go up. */
static inline int hm_k_nearest_level(int n, const int8_t *val, float x) {
    if (x <= val[0]) return 0;
    if (x >= val[n - 1]) return n - 1;
    int lo = 0, hi = n - 1;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (x < val[mid]) hi = mid;
        else lo = mid;
    }
    return x - val[hi - 1] < val[hi] - x ? hi - 1 : hi;
}

/* ggml's make_qkx2_quants: x[0..n) ~ scale * L + min, L in [0, nmax], min <= 0 (quant_k.c). */
float hm_k_fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L, float *neg_min, uint8_t *Laux,
                         float rmin, float rdelta, int nstep, bool mad);
/* The IQ4 scale of 32 values: ggml's quantize_row_iq4_nl_impl search without importance (quant_k.c). */
float hm_k_iq4_fit_scale(const float *x);

/* q8_k (activations only): value = qs[i] * d; bsums[j] = sum of qs[16j .. 16j+15]. */
typedef struct hm_block_q8_k {
    float d;
    int8_t qs[HM_QK_K];
    int16_t bsums[HM_QK_K / 16];
} hm_block_q8_k;

/* q4_k: 8 sub-blocks of 32; value = d*sc[j]*q - dmin*m[j] with 6-bit sc/m packed in scales[12]
 * (see hm_k4_unpack_scales). qs: for each 64-element chunk c, 32 bytes whose low nibbles are
 * elements 64c..64c+31 and high nibbles 64c+32..64c+63. */
typedef struct hm_block_q4_k {
    uint16_t d;    /* fp16 super-scale of the scales */
    uint16_t dmin; /* fp16 super-scale of the mins */
    uint8_t scales[12];
    uint8_t qs[HM_QK_K / 2];
} hm_block_q4_k;

/* q5_k: as q4_k plus a fifth bit: bit 2c of qh[l] is the high bit of element 64c+l, bit 2c+1
 * that of element 64c+32+l. */
typedef struct hm_block_q5_k {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qh[HM_QK_K / 8];
    uint8_t qs[HM_QK_K / 2];
} hm_block_q5_k;

/* q6_k: 16 sub-blocks of 16; value = d * scales[j] * (q - 32), q in [0, 63]. Per 128-element
 * half h: ql[64h + l] low nibble = element l, ql[64h + 32 + l] low = l+32, high nibbles l+64,
 * l+96; qh[32h + l] bits 0-1, 2-3, 4-5, 6-7 are the top two bits of l, l+32, l+64, l+96. */
typedef struct hm_block_q6_k {
    uint8_t ql[HM_QK_K / 2];
    uint8_t qh[HM_QK_K / 4];
    int8_t scales[HM_QK_K / 16];
    uint16_t d; /* fp16 */
} hm_block_q6_k;

/* iq4_xs: 8 sub-blocks of 32; value = d * (ls[j] - 32) * kvalues_iq4nl[q]; ls is 6 bits: low 4
 * in scales_l[j/2] (nibble j%2), high 2 in scales_h bits 2j..2j+1. qs per sub-block: 16 bytes,
 * low nibbles elements 0..15, high nibbles 16..31. */
typedef struct hm_block_iq4_xs {
    uint16_t d; /* fp16 */
    uint16_t scales_h;
    uint8_t scales_l[HM_QK_K / 64];
    uint8_t qs[HM_QK_K / 2];
} hm_block_iq4_xs;

_Static_assert(sizeof(hm_block_q8_k) == 292, "q8_K block is 292 bytes");
_Static_assert(sizeof(hm_block_q4_k) == 144, "q4_K block is 144 bytes");
_Static_assert(sizeof(hm_block_q5_k) == 176, "q5_K block is 176 bytes");
_Static_assert(sizeof(hm_block_q6_k) == 210, "q6_K block is 210 bytes");
_Static_assert(sizeof(hm_block_iq4_xs) == 136, "iq4_xs block is 136 bytes");

/* The 16 non-linear levels of IQ4_NL / IQ4_XS. */
static const int8_t hm_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

/* Unpack the 12 bytes of 6-bit scales/mins of q4_k/q5_k into sc[0..7] and m[0..7] (bytes).
 * Layout: bytes 0-3 hold sc[0..3] in bits 0-5 and the top 2 bits of sc[4..7] in bits 6-7;
 * bytes 4-7 the same for m; bytes 8-11 hold sc[4..7] low nibbles | m[4..7] low nibbles << 4.
 * Done on 32-bit words: each word carries four sub-blocks at once. */
static inline void hm_k4_unpack_scales(const uint8_t *packed, uint8_t sc[8], uint8_t m[8]) {
    uint32_t a, b, c;
    memcpy(&a, packed, 4);
    memcpy(&b, packed + 4, 4);
    memcpy(&c, packed + 8, 4);
    const uint32_t sc_lo = a & 0x3f3f3f3fu;
    const uint32_t m_lo = b & 0x3f3f3f3fu;
    const uint32_t sc_hi = (c & 0x0f0f0f0fu) | (((a >> 6) & 0x03030303u) << 4);
    const uint32_t m_hi = ((c >> 4) & 0x0f0f0f0fu) | (((b >> 6) & 0x03030303u) << 4);
    memcpy(sc, &sc_lo, 4);
    memcpy(sc + 4, &sc_hi, 4);
    memcpy(m, &m_lo, 4);
    memcpy(m + 4, &m_hi, 4);
}

/* The same as 64-bit words (byte j = sub-block j, little-endian), for SIMD code: building
 * vectors from registers avoids the store-forwarding stall of reloading 8 bytes written as two
 * 4-byte halves. */
static inline void hm_k4_unpack_scales64(const uint8_t *packed, uint64_t *sc, uint64_t *m) {
    uint32_t a, b, c;
    memcpy(&a, packed, 4);
    memcpy(&b, packed + 4, 4);
    memcpy(&c, packed + 8, 4);
    const uint32_t sc_hi = (c & 0x0f0f0f0fu) | (((a >> 6) & 0x03030303u) << 4);
    const uint32_t m_hi = ((c >> 4) & 0x0f0f0f0fu) | (((b >> 6) & 0x03030303u) << 4);
    *sc = (a & 0x3f3f3f3fu) | (uint64_t)sc_hi << 32;
    *m = (b & 0x3f3f3f3fu) | (uint64_t)m_hi << 32;
}

#ifdef __AVX2__
#include <immintrin.h>

#include "core/fp16.h"

/* fp16 -> f32 in one instruction where F16C exists (exact, like hm_fp16_to_f32). */
static inline float hm_k_half(uint16_t h) {
#ifdef __F16C__
    return _cvtsh_ss(h);
#else
    return hm_fp16_to_f32(h);
#endif
}

/* The 8 signed sub-block scales (ls - 32) of an iq4_xs block as int16, computed in registers. */
static inline __m128i hm_iq4xs_scales16(const hm_block_iq4_xs *b) {
    uint32_t l;
    memcpy(&l, b->scales_l, 4);
    const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)l), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                        _mm256_set1_epi32(0xf));
    const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(b->scales_h), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                        _mm256_set1_epi32(3));
    const __m256i v = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
    return _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
}
#endif

/* SIMD variants (compiled only where the build targets the ISA; NULL-safe registration in
 * quant_k.c). Same contracts as the hm_to_float_fn / hm_from_float_fn / hm_vec_dot_fn types. */
void hm_vec_dot_q4_k_avx2(int64_t n, float *out, const void *x, const void *y);
void hm_vec_dot_q5_k_avx2(int64_t n, float *out, const void *x, const void *y);
void hm_vec_dot_q6_k_avx2(int64_t n, float *out, const void *x, const void *y);
void hm_vec_dot_iq4_xs_avx2(int64_t n, float *out, const void *x, const void *y);
void hm_from_float_q8_k_avx2(const float *src, void *dst, int64_t n);

void hm_vec_dot_q4_k_avx512(int64_t n, float *out, const void *x, const void *y);
void hm_vec_dot_q5_k_avx512(int64_t n, float *out, const void *x, const void *y);
void hm_vec_dot_q6_k_avx512(int64_t n, float *out, const void *x, const void *y);
void hm_vec_dot_iq4_xs_avx512(int64_t n, float *out, const void *x, const void *y);
void hm_from_float_q8_k_avx512(const float *src, void *dst, int64_t n);

/* Scalar reference of Q8_K quantisation (what the SIMD variants must equal byte for byte). */
void hm_from_float_q8_k_ref(const float *src, void *dst, int64_t n);

#endif
