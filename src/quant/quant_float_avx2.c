/* quant_float_avx2.c - AVX2 (+FMA, F16C) variants of the float family: F32/F16/BF16 x F32 dot
 * products and F16/BF16 conversions. Conversions are bit-exact with the scalar reference
 * (F16C rounds to nearest even like hm_f32_to_fp16; BF16 uses the same integer rounding).
 * Dot products keep 4x8 float partial sums, so they differ from the double-accumulated
 * reference only by float rounding. */
#include "quant_impl.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#include "core/fp16.h"

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256 load_f16x8(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static inline __m256 load_bf16x8(const uint16_t *p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

static void vec_dot_f32_avx2(int64_t n, float *out, const void *vx, const void *vy) {
    const float *x = vx, *y = vy;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(y + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), _mm256_loadu_ps(y + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
    float s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) s += x[i] * y[i];
    *out = s;
}

static void vec_dot_f16_avx2(int64_t n, float *out, const void *vx, const void *vy) {
    const uint16_t *x = vx;
    const float *y = vy;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(load_f16x8(x + i), _mm256_loadu_ps(y + i), a0);
        a1 = _mm256_fmadd_ps(load_f16x8(x + i + 8), _mm256_loadu_ps(y + i + 8), a1);
        a2 = _mm256_fmadd_ps(load_f16x8(x + i + 16), _mm256_loadu_ps(y + i + 16), a2);
        a3 = _mm256_fmadd_ps(load_f16x8(x + i + 24), _mm256_loadu_ps(y + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(load_f16x8(x + i), _mm256_loadu_ps(y + i), a0);
    float s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) s += hm_fp16_to_f32(x[i]) * y[i];
    *out = s;
}

static void vec_dot_bf16_avx2(int64_t n, float *out, const void *vx, const void *vy) {
    const uint16_t *x = vx;
    const float *y = vy;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(load_bf16x8(x + i), _mm256_loadu_ps(y + i), a0);
        a1 = _mm256_fmadd_ps(load_bf16x8(x + i + 8), _mm256_loadu_ps(y + i + 8), a1);
        a2 = _mm256_fmadd_ps(load_bf16x8(x + i + 16), _mm256_loadu_ps(y + i + 16), a2);
        a3 = _mm256_fmadd_ps(load_bf16x8(x + i + 24), _mm256_loadu_ps(y + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(load_bf16x8(x + i), _mm256_loadu_ps(y + i), a0);
    float s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) s += hm_bf16_to_f32(x[i]) * y[i];
    *out = s;
}

static void to_float_f16_avx2(const void *src, float *dst, int64_t n) {
    const uint16_t *x = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_f16x8(x + i));
    for (; i < n; i++) dst[i] = hm_fp16_to_f32(x[i]);
}

static void from_float_f16_avx2(const float *src, void *dst, int64_t n) {
    uint16_t *y = dst;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = hm_f32_to_fp16(src[i]);
}

static void to_float_bf16_avx2(const void *src, float *dst, int64_t n) {
    const uint16_t *x = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_bf16x8(x + i));
    for (; i < n; i++) dst[i] = hm_bf16_to_f32(x[i]);
}

/* Round to nearest even on the upper 16 bits; NaNs keep their top bits and become quiet. */
static void from_float_bf16_avx2(const float *src, void *dst, int64_t n) {
    uint16_t *y = dst;
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1), quiet = _mm256_set1_epi32(0x40);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i x = _mm256_castps_si256(_mm256_loadu_ps(src + i));
        __m256i isnan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
        __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), one);
        __m256i r = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(bias, lsb)), 16);
        __m256i q = _mm256_or_si256(_mm256_srli_epi32(x, 16), quiet);
        r = _mm256_blendv_epi8(r, q, isnan);
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
        _mm_storeu_si128((__m128i *)(y + i), _mm256_castsi256_si128(p));
    }
    for (; i < n; i++) y[i] = hm_f32_to_bf16(src[i]);
}

void hm_quant_register_float_avx2(hm_type_traits *table) {
    table[HM_TYPE_F32].vec_dot_isa[HM_ISA_AVX2] = vec_dot_f32_avx2;
    table[HM_TYPE_F16].vec_dot_isa[HM_ISA_AVX2] = vec_dot_f16_avx2;
    table[HM_TYPE_F16].to_float_isa[HM_ISA_AVX2] = to_float_f16_avx2;
    table[HM_TYPE_F16].from_float_isa[HM_ISA_AVX2] = from_float_f16_avx2;
    table[HM_TYPE_BF16].vec_dot_isa[HM_ISA_AVX2] = vec_dot_bf16_avx2;
    table[HM_TYPE_BF16].to_float_isa[HM_ISA_AVX2] = to_float_bf16_avx2;
    table[HM_TYPE_BF16].from_float_isa[HM_ISA_AVX2] = from_float_bf16_avx2;
}

#endif
