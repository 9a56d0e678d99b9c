/* quant_q8_0.c - the Q8_0 family: Q8_0, Q4_0, Q5_0 and MXFP4 (32-element blocks, layouts in
 * quant_impl.h), scalar reference and registration.
 *
 * All four take Q8_0 activations as their dot partner. The reference quantisers reproduce
 * ggml's quantize_row_*_ref rounding step for step (same float operations in the same order),
 * so quantising the same floats gives the same bytes as ggml. Dot products sum each block in
 * integers and accumulate the scaled block sums in float, as ggml does. */
#include <math.h>

#include "core/fp16.h"
#include "quant_impl.h"

/* ---- Q8_0 ---- */

static void to_float_q8_0_ref(const void *src, float *dst, int64_t n) {
    const hm_block_q8_0 *x = src;
    for (int64_t i = 0; i < n / HM_QK8_0; i++) {
        const float d = hm_fp16_to_f32(x[i].d);
        for (int j = 0; j < HM_QK8_0; j++) dst[i * HM_QK8_0 + j] = (float)x[i].qs[j] * d;
    }
}

/* d = amax/127, q = roundf(x * (1/d)) (half away from zero); d is stored rounded to fp16 but the
 * unrounded 1/d is used for the codes, as ggml does. */
static void from_float_q8_0_ref(const float *src, void *dst, int64_t n) {
    hm_block_q8_0 *y = dst;
    for (int64_t i = 0; i < n / HM_QK8_0; i++) {
        const float *x = src + i * HM_QK8_0;
        float amax = 0.0f;
        for (int j = 0; j < HM_QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = hm_f32_to_fp16(d);
        for (int j = 0; j < HM_QK8_0; j++) y[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

static void vec_dot_q8_0_q8_0_ref(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q8_0 *x = vx;
    const hm_block_q8_0 *y = vy;
    float s = 0.0f;
    for (int64_t i = 0; i < n / HM_QK8_0; i++) {
        int32_t si = 0;
        for (int j = 0; j < HM_QK8_0; j++) si += x[i].qs[j] * y[i].qs[j];
        s += (float)si * (hm_fp16_to_f32(x[i].d) * hm_fp16_to_f32(y[i].d));
    }
    *out = s;
}

/* ---- Q4_0 ---- */

/* a*b rounded to float on its own: the build's -ffp-contract must not fuse it with a following
 * add into an FMA, because ggml's reference quantiser (built for baseline x86-64) does not. */
static inline float mul_unfused(float a, float b) {
    volatile float p = a * b;
    return p;
}

static void to_float_q4_0_ref(const void *src, float *dst, int64_t n) {
    const hm_block_q4_0 *x = src;
    for (int64_t i = 0; i < n / HM_QK4_0; i++) {
        const float d = hm_fp16_to_f32(x[i].d);
        float *o = dst + i * HM_QK4_0;
        for (int j = 0; j < HM_QK4_0 / 2; j++) {
            o[j] = (float)((x[i].qs[j] & 0x0f) - 8) * d;
            o[j + HM_QK4_0 / 2] = (float)((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

/* d = max / -8 where max is the signed value of largest magnitude (first one on ties), so that
 * value maps to code 0 exactly; q = min(15, trunc(x/d + 8.5)). */
static void from_float_q4_0_ref(const float *src, void *dst, int64_t n) {
    hm_block_q4_0 *y = dst;
    for (int64_t i = 0; i < n / HM_QK4_0; i++) {
        const float *x = src + i * HM_QK4_0;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < HM_QK4_0; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = hm_f32_to_fp16(d);
        for (int j = 0; j < HM_QK4_0 / 2; j++) {
            int q0 = (int8_t)(mul_unfused(x[j], id) + 8.5f);
            int q1 = (int8_t)(mul_unfused(x[j + HM_QK4_0 / 2], id) + 8.5f);
            q0 = q0 < 15 ? q0 : 15;
            q1 = q1 < 15 ? q1 : 15;
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static void vec_dot_q4_0_q8_0_ref(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q4_0 *x = vx;
    const hm_block_q8_0 *y = vy;
    float s = 0.0f;
    for (int64_t i = 0; i < n / HM_QK4_0; i++) {
        int32_t si = 0;
        for (int j = 0; j < HM_QK4_0 / 2; j++) {
            si += ((x[i].qs[j] & 0x0f) - 8) * y[i].qs[j];
            si += ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + HM_QK4_0 / 2];
        }
        s += (float)si * (hm_fp16_to_f32(x[i].d) * hm_fp16_to_f32(y[i].d));
    }
    *out = s;
}

/* ---- Q5_0 ---- */

/* The fifth bit of element j, 0 or 16. */
static inline int q5_0_hbit(const hm_block_q5_0 *b, int j) { return ((b->qh[j >> 3] >> (j & 7)) & 1) << 4; }

static void to_float_q5_0_ref(const void *src, float *dst, int64_t n) {
    const hm_block_q5_0 *x = src;
    for (int64_t i = 0; i < n / HM_QK5_0; i++) {
        const float d = hm_fp16_to_f32(x[i].d);
        float *o = dst + i * HM_QK5_0;
        for (int j = 0; j < HM_QK5_0 / 2; j++) {
            o[j] = (float)(((x[i].qs[j] & 0x0f) | q5_0_hbit(&x[i], j)) - 16) * d;
            o[j + HM_QK5_0 / 2] = (float)(((x[i].qs[j] >> 4) | q5_0_hbit(&x[i], j + HM_QK5_0 / 2)) - 16) * d;
        }
    }
}

/* As q4_0 with 16 in place of 8: d = max / -16 (max = signed value of largest magnitude, first
 * on ties), q = min(31, trunc(x/d + 16.5)); bit 4 of each code goes to qh. */
static void from_float_q5_0_ref(const float *src, void *dst, int64_t n) {
    hm_block_q5_0 *y = dst;
    for (int64_t i = 0; i < n / HM_QK5_0; i++) {
        const float *x = src + i * HM_QK5_0;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < HM_QK5_0; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        const float d = max / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = hm_f32_to_fp16(d);
        uint32_t qh = 0;
        for (int j = 0; j < HM_QK5_0 / 2; j++) {
            int q0 = (int8_t)(mul_unfused(x[j], id) + 16.5f);
            int q1 = (int8_t)(mul_unfused(x[j + HM_QK5_0 / 2], id) + 16.5f);
            q0 = q0 < 31 ? q0 : 31;
            q1 = q1 < 31 ? q1 : 31;
            y[i].qs[j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
            qh |= (uint32_t)((q0 >> 4) & 1) << j;
            qh |= (uint32_t)((q1 >> 4) & 1) << (j + HM_QK5_0 / 2);
        }
        for (int k = 0; k < 4; k++) y[i].qh[k] = (uint8_t)(qh >> (8 * k));
    }
}

static void vec_dot_q5_0_q8_0_ref(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q5_0 *x = vx;
    const hm_block_q8_0 *y = vy;
    float s = 0.0f;
    for (int64_t i = 0; i < n / HM_QK5_0; i++) {
        int32_t si = 0;
        for (int j = 0; j < HM_QK5_0 / 2; j++) {
            si += (((x[i].qs[j] & 0x0f) | q5_0_hbit(&x[i], j)) - 16) * y[i].qs[j];
            si += (((x[i].qs[j] >> 4) | q5_0_hbit(&x[i], j + HM_QK5_0 / 2)) - 16) * y[i].qs[j + HM_QK5_0 / 2];
        }
        s += (float)si * (hm_fp16_to_f32(x[i].d) * hm_fp16_to_f32(y[i].d));
    }
    *out = s;
}

/* ---- MXFP4 ---- */

static void to_float_mxfp4_ref(const void *src, float *dst, int64_t n) {
    const hm_block_mxfp4 *x = src;
    for (int64_t i = 0; i < n / HM_QK_MXFP4; i++) {
        const float d = hm_e8m0_to_f32_half(x[i].e);
        float *o = dst + i * HM_QK_MXFP4;
        for (int j = 0; j < HM_QK_MXFP4 / 2; j++) {
            o[j] = (float)hm_kvalues_mxfp4[x[i].qs[j] & 0x0f] * d;
            o[j + HM_QK_MXFP4 / 2] = (float)hm_kvalues_mxfp4[x[i].qs[j] >> 4] * d;
        }
    }
}

/* The code whose scaled value is nearest to v; the lowest code wins ties (so +0 beats -0). */
static int mxfp4_best_code(float v, float d) {
    int best = 0;
    float best_err = fabsf((float)hm_kvalues_mxfp4[0] * d - v);
    for (int k = 1; k < 16; k++) {
        float err = fabsf((float)hm_kvalues_mxfp4[k] * d - v);
        if (err < best_err) {
            best = k;
            best_err = err;
        }
    }
    return best;
}

/* e = floor(log2(amax)) - 2 + 127: the largest FP4 magnitude (6 = 12 in the doubled table)
 * times 2^(e-127) lands in [amax*1.5, amax*3), so the block's max sits near code 4..6. ggml
 * leaves exponents outside 0..255 undefined (float->uint8 overflow); we clamp them. */
static void from_float_mxfp4_ref(const float *src, void *dst, int64_t n) {
    hm_block_mxfp4 *y = dst;
    for (int64_t i = 0; i < n / HM_QK_MXFP4; i++) {
        const float *x = src + i * HM_QK_MXFP4;
        float amax = 0.0f;
        for (int j = 0; j < HM_QK_MXFP4; j++)
            if (amax < fabsf(x[j])) amax = fabsf(x[j]);
        uint8_t e = 0;
        if (amax > 0.0f) {
            float ef = floorf(log2f(amax)) - 2.0f + 127.0f;
            e = ef <= 0.0f ? 0 : ef >= 255.0f ? 255 : (uint8_t)ef;
        }
        const float d = hm_e8m0_to_f32_half(e);
        y[i].e = e;
        for (int j = 0; j < HM_QK_MXFP4 / 2; j++) {
            int q0 = mxfp4_best_code(x[j], d);
            int q1 = mxfp4_best_code(x[j + HM_QK_MXFP4 / 2], d);
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static void vec_dot_mxfp4_q8_0_ref(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_mxfp4 *x = vx;
    const hm_block_q8_0 *y = vy;
    float s = 0.0f;
    for (int64_t i = 0; i < n / HM_QK_MXFP4; i++) {
        int32_t si = 0;
        for (int j = 0; j < HM_QK_MXFP4 / 2; j++) {
            si += hm_kvalues_mxfp4[x[i].qs[j] & 0x0f] * y[i].qs[j];
            si += hm_kvalues_mxfp4[x[i].qs[j] >> 4] * y[i].qs[j + HM_QK_MXFP4 / 2];
        }
        s += (float)si * (hm_e8m0_to_f32_half(x[i].e) * hm_fp16_to_f32(y[i].d));
    }
    *out = s;
}

/* ---- registration ---- */

static void set_scalar(hm_type_traits *e, const char *name, size_t size, hm_to_float_fn to,
                       hm_from_float_fn from, hm_vec_dot_fn dot) {
    e->name = name;
    e->blck_size = 32;
    e->type_size = size;
    e->to_float_ref = to;
    e->from_float_ref = from;
    e->vec_dot_type = HM_TYPE_Q8_0;
    e->vec_dot_isa[HM_ISA_SCALAR] = dot;
    e->to_float_isa[HM_ISA_SCALAR] = to;
    e->from_float_isa[HM_ISA_SCALAR] = from;
}

static void pick_fastest(hm_type_traits *e) {
    for (int isa = HM_ISA_COUNT - 1; isa >= 0; isa--) {
        if (!e->to_float && e->to_float_isa[isa]) e->to_float = e->to_float_isa[isa];
        if (!e->from_float && e->from_float_isa[isa]) e->from_float = e->from_float_isa[isa];
    }
}

void hm_quant_register_q8_0(hm_type_traits *table) {
    set_scalar(&table[HM_TYPE_Q8_0], "q8_0", sizeof(hm_block_q8_0), to_float_q8_0_ref,
               from_float_q8_0_ref, vec_dot_q8_0_q8_0_ref);
    set_scalar(&table[HM_TYPE_Q4_0], "q4_0", sizeof(hm_block_q4_0), to_float_q4_0_ref,
               from_float_q4_0_ref, vec_dot_q4_0_q8_0_ref);
    set_scalar(&table[HM_TYPE_Q5_0], "q5_0", sizeof(hm_block_q5_0), to_float_q5_0_ref,
               from_float_q5_0_ref, vec_dot_q5_0_q8_0_ref);
    set_scalar(&table[HM_TYPE_MXFP4], "mxfp4", sizeof(hm_block_mxfp4), to_float_mxfp4_ref,
               from_float_mxfp4_ref, vec_dot_mxfp4_q8_0_ref);
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    hm_quant_register_q8_0_avx2(table);
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
    hm_quant_register_q8_0_avx512(table);
#endif
    pick_fastest(&table[HM_TYPE_Q8_0]);
    pick_fastest(&table[HM_TYPE_Q4_0]);
    pick_fastest(&table[HM_TYPE_Q5_0]);
    pick_fastest(&table[HM_TYPE_MXFP4]);
}
