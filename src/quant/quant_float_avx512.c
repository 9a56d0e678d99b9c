/* quant_float_avx512.c - AVX-512 (F/BW/VL) variants of the float family: F32/F16/BF16 x F32
 * dot products and F16/BF16 conversions; tails use masked loads, so any n works. Conversions
 * are bit-exact with the scalar reference; dot products keep 4x16 float partial sums. */
#include "quant_impl.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>

static inline __mmask16 tail_mask(int64_t left) { return (__mmask16)((1u << left) - 1u); }

static inline __m512 load_f16x16(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
static inline __m512 load_f16x16_mask(const uint16_t *p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}
static inline __m512 load_bf16x16(const uint16_t *p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
static inline __m512 load_bf16x16_mask(const uint16_t *p, __mmask16 m) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

/* One dot-product body per weight format: LOAD(p) gives 16 floats, LOADM(p, m) a masked 16. */
#define HM_DOT_BODY(T, LOAD, LOADM)                                                     \
    const T *x = vx;                                                                    \
    const float *y = vy;                                                                \
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                         \
    int64_t i = 0;                                                                      \
    for (; i + 64 <= n; i += 64) {                                                      \
        a0 = _mm512_fmadd_ps(LOAD(x + i), _mm512_loadu_ps(y + i), a0);                  \
        a1 = _mm512_fmadd_ps(LOAD(x + i + 16), _mm512_loadu_ps(y + i + 16), a1);        \
        a2 = _mm512_fmadd_ps(LOAD(x + i + 32), _mm512_loadu_ps(y + i + 32), a2);        \
        a3 = _mm512_fmadd_ps(LOAD(x + i + 48), _mm512_loadu_ps(y + i + 48), a3);        \
    }                                                                                   \
    for (; i + 16 <= n; i += 16) a0 = _mm512_fmadd_ps(LOAD(x + i), _mm512_loadu_ps(y + i), a0); \
    if (i < n) {                                                                        \
        __mmask16 m = tail_mask(n - i);                                                 \
        a1 = _mm512_fmadd_ps(LOADM(x + i, m), _mm512_maskz_loadu_ps(m, y + i), a1);     \
    }                                                                                   \
    *out = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));

#define LOAD_F32(p) _mm512_loadu_ps(p)
#define LOADM_F32(p, m) _mm512_maskz_loadu_ps(m, p)

static void vec_dot_f32_avx512(int64_t n, float *out, const void *vx, const void *vy) {
    HM_DOT_BODY(float, LOAD_F32, LOADM_F32)
}
static void vec_dot_f16_avx512(int64_t n, float *out, const void *vx, const void *vy) {
    HM_DOT_BODY(uint16_t, load_f16x16, load_f16x16_mask)
}
static void vec_dot_bf16_avx512(int64_t n, float *out, const void *vx, const void *vy) {
    HM_DOT_BODY(uint16_t, load_bf16x16, load_bf16x16_mask)
}

static void to_float_f16_avx512(const void *src, float *dst, int64_t n) {
    const uint16_t *x = src;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load_f16x16(x + i));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(dst + i, m, load_f16x16_mask(x + i, m));
    }
}

static void from_float_f16_avx512(const float *src, void *dst, int64_t n) {
    uint16_t *y = dst;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(y + i), _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm256_mask_storeu_epi16(y + i, m, h);
    }
}

static void to_float_bf16_avx512(const void *src, float *dst, int64_t n) {
    const uint16_t *x = src;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load_bf16x16(x + i));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(dst + i, m, load_bf16x16_mask(x + i, m));
    }
}

/* Round to nearest even on the upper 16 bits; NaNs keep their top bits and become quiet. */
static inline __m256i f32_to_bf16x16(__m512i x) {
    __mmask16 isnan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)),
                                              _mm512_set1_epi32(0x7f800000));
    __m512i hi = _mm512_srli_epi32(x, 16);
    __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
    r = _mm512_mask_or_epi32(r, isnan, hi, _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
}

static void from_float_bf16_avx512(const float *src, void *dst, int64_t n) {
    uint16_t *y = dst;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(y + i), f32_to_bf16x16(_mm512_castps_si512(_mm512_loadu_ps(src + i))));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        __m256i h = f32_to_bf16x16(_mm512_castps_si512(_mm512_maskz_loadu_ps(m, src + i)));
        _mm256_mask_storeu_epi16(y + i, m, h);
    }
}

void hm_quant_register_float_avx512(hm_type_traits *table) {
    table[HM_TYPE_F32].vec_dot_isa[HM_ISA_AVX512] = vec_dot_f32_avx512;
    table[HM_TYPE_F16].vec_dot_isa[HM_ISA_AVX512] = vec_dot_f16_avx512;
    table[HM_TYPE_F16].to_float_isa[HM_ISA_AVX512] = to_float_f16_avx512;
    table[HM_TYPE_F16].from_float_isa[HM_ISA_AVX512] = from_float_f16_avx512;
    table[HM_TYPE_BF16].vec_dot_isa[HM_ISA_AVX512] = vec_dot_bf16_avx512;
    table[HM_TYPE_BF16].to_float_isa[HM_ISA_AVX512] = to_float_bf16_avx512;
    table[HM_TYPE_BF16].from_float_isa[HM_ISA_AVX512] = from_float_bf16_avx512;
}

#endif
