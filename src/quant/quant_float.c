/* quant_float.c - the float family: F32, F16 (IEEE half), BF16 (truncated f32), scalar
 * reference and registration.
 *
 * Dot partner: all three take F32 activations. F16/BF16 weights dominate the bytes read (the
 * activation row is small and stays in cache), so widening the weight in registers costs nothing
 * in a memory-bound matvec and keeps the activation exact; ggml's F16xF16 / BF16xBF16 would round
 * the activation and buy no speed on CPUs without native half/bf16 dot instructions.
 *
 * Scalar dot products accumulate in double (like ggml's ggml_float): they are the reference the
 * SIMD variants are measured against. */
#include <string.h>

#include "core/fp16.h"
#include "quant_impl.h"

static void copy_f32(const void *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }
static void copy_to_f32(const float *src, void *dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }

static void to_float_f16_ref(const void *src, float *dst, int64_t n) {
    const uint16_t *x = src;
    for (int64_t i = 0; i < n; i++) dst[i] = hm_fp16_to_f32(x[i]);
}

static void from_float_f16_ref(const float *src, void *dst, int64_t n) {
    uint16_t *y = dst;
    for (int64_t i = 0; i < n; i++) y[i] = hm_f32_to_fp16(src[i]);
}

static void to_float_bf16_ref(const void *src, float *dst, int64_t n) {
    const uint16_t *x = src;
    for (int64_t i = 0; i < n; i++) dst[i] = hm_bf16_to_f32(x[i]);
}

static void from_float_bf16_ref(const float *src, void *dst, int64_t n) {
    uint16_t *y = dst;
    for (int64_t i = 0; i < n; i++) y[i] = hm_f32_to_bf16(src[i]);
}

static void vec_dot_f32_ref(int64_t n, float *out, const void *vx, const void *vy) {
    const float *x = vx, *y = vy;
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * (double)y[i];
    *out = (float)s;
}

static void vec_dot_f16_ref(int64_t n, float *out, const void *vx, const void *vy) {
    const uint16_t *x = vx;
    const float *y = vy;
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)hm_fp16_to_f32(x[i]) * (double)y[i];
    *out = (float)s;
}

static void vec_dot_bf16_ref(int64_t n, float *out, const void *vx, const void *vy) {
    const uint16_t *x = vx;
    const float *y = vy;
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)hm_bf16_to_f32(x[i]) * (double)y[i];
    *out = (float)s;
}

static void set_scalar(hm_type_traits *e, const char *name, size_t size, hm_to_float_fn to,
                       hm_from_float_fn from, hm_vec_dot_fn dot) {
    e->name = name;
    e->blck_size = 1;
    e->type_size = size;
    e->to_float_ref = to;
    e->from_float_ref = from;
    e->vec_dot_type = HM_TYPE_F32;
    e->vec_dot_isa[HM_ISA_SCALAR] = dot;
    e->to_float_isa[HM_ISA_SCALAR] = to;
    e->from_float_isa[HM_ISA_SCALAR] = from;
}

/* Fastest compiled conversion variant of each entry (vec_dot is chosen by quant.c). */
static void pick_fastest(hm_type_traits *e) {
    for (int isa = HM_ISA_COUNT - 1; isa >= 0; isa--) {
        if (!e->to_float && e->to_float_isa[isa]) e->to_float = e->to_float_isa[isa];
        if (!e->from_float && e->from_float_isa[isa]) e->from_float = e->from_float_isa[isa];
    }
}

void hm_quant_register_float(hm_type_traits *table) {
    set_scalar(&table[HM_TYPE_F32], "f32", 4, copy_f32, copy_to_f32, vec_dot_f32_ref);
    set_scalar(&table[HM_TYPE_F16], "f16", 2, to_float_f16_ref, from_float_f16_ref, vec_dot_f16_ref);
    set_scalar(&table[HM_TYPE_BF16], "bf16", 2, to_float_bf16_ref, from_float_bf16_ref, vec_dot_bf16_ref);
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    hm_quant_register_float_avx2(table);
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
    hm_quant_register_float_avx512(table);
#endif
    pick_fastest(&table[HM_TYPE_F32]);
    pick_fastest(&table[HM_TYPE_F16]);
    pick_fastest(&table[HM_TYPE_BF16]);
}
