/* quant_lowbit.c - the low-bit family: Q4_1, Q5_1, Q8_1 (their activation partner), IQ4_NL, Q2_K
 * and Q3_K. Scalar reference (de)quantisation and dot products, and registration.
 *
 * Reference quantisers reproduce what llama-quantize writes without an importance matrix
 * (ggml_quantize_chunk with no weights: quantize_row_q4_1_ref, quantize_row_q5_1_ref,
 * quantize_row_q2_K_ref, quantize_row_q3_K_ref, and for IQ4_NL quantize_iq4_nl's search with 7
 * tries): same float operations in the same order, unfused, so the same floats give the same
 * bytes. Dequantisation is written with the same operation order (d * q - m etc.) so it is
 * bit-exact with ggml's dequantize_row_*. One deliberate difference: an IQ4_NL block whose
 * values are all (nearly) zero gets the codes of the nearest level to 0, where ggml's reference
 * leaves whatever its stack held (the scale is 0 either way).
 *
 * Dot partners as in ggml: Q4_1 / Q5_1 against Q8_1, IQ4_NL against Q8_0, Q2_K / Q3_K against
 * Q8_K. Scalar dots sum each block in integers and accumulate in double (the reference the SIMD
 * variants in quant_lowbit_avx2.c / quant_lowbit_avx512.c are measured against). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <float.h>
#include <math.h>
#include <string.h>

#include "core/fp16.h"
#include "quant_lowbit_impl.h"

#define LB_GROUP_MAX_EPS 1e-15f

/* ---------------------------------------------------------------- Q8_1 */

/* As Q8_0 (d = amax/127, q = roundf(x / d)), plus s = fp16(d * sum q). */
static void from_float_q8_1_ref(const float *src, void *dst, int64_t n) {
    hm_block_q8_1 *y = dst;
    for (int64_t i = 0; i < n / HM_QK8_1; i++, src += HM_QK8_1) {
        float amax = 0.0f;
        for (int j = 0; j < HM_QK8_1; j++) amax = fmaxf(amax, fabsf(src[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = hm_f32_to_fp16(d);
        int sum = 0;
        for (int j = 0; j < HM_QK8_1; j++) {
            y[i].qs[j] = (int8_t)roundf(src[j] * id);
            sum += y[i].qs[j];
        }
        y[i].s = hm_f32_to_fp16((float)sum * d);
    }
}

static void to_float_q8_1_ref(const void *src, float *dst, int64_t n) {
    const hm_block_q8_1 *x = src;
    for (int64_t i = 0; i < n / HM_QK8_1; i++) {
        const float d = hm_fp16_to_f32(x[i].d);
        for (int j = 0; j < HM_QK8_1; j++) *dst++ = (float)x[i].qs[j] * d;
    }
}

static void vec_dot_q8_1_scalar(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q8_1 *x = vx, *y = vy;
    double s = 0;
    for (int64_t i = 0; i < n / HM_QK8_1; i++) {
        int32_t si = 0;
        for (int j = 0; j < HM_QK8_1; j++) si += x[i].qs[j] * y[i].qs[j];
        s += (double)(hm_fp16_to_f32(x[i].d) * hm_fp16_to_f32(y[i].d)) * si;
    }
    *out = (float)s;
}

/* ---------------------------------------------------------------- Q4_1 */

static void to_float_q4_1_ref(const void *src, float *dst, int64_t n) {
    const hm_block_q4_1 *x = src;
    for (int64_t i = 0; i < n / HM_QK4_1; i++, dst += HM_QK4_1) {
        const float d = hm_fp16_to_f32(x[i].d), m = hm_fp16_to_f32(x[i].m);
        for (int j = 0; j < HM_QK4_1 / 2; j++) {
            dst[j] = (float)(x[i].qs[j] & 0x0f) * d + m;
            dst[j + HM_QK4_1 / 2] = (float)(x[i].qs[j] >> 4) * d + m;
        }
    }
}

/* min/max of the block; d = (max - min) / 15, q = min(15, trunc((x - min) / d + 0.5)). */
static void from_float_q4_1_ref(const float *src, void *dst, int64_t n) {
    hm_block_q4_1 *y = dst;
    for (int64_t i = 0; i < n / HM_QK4_1; i++, src += HM_QK4_1) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < HM_QK4_1; j++) {
            if (src[j] < min) min = src[j];
            if (src[j] > max) max = src[j];
        }
        const float d = (max - min) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = hm_f32_to_fp16(d);
        y[i].m = hm_f32_to_fp16(min);
        for (int j = 0; j < HM_QK4_1 / 2; j++) {
            const int q0 = hm_k_min(15, (int8_t)((src[j] - min) * id + 0.5f));
            const int q1 = hm_k_min(15, (int8_t)((src[j + HM_QK4_1 / 2] - min) * id + 0.5f));
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static void vec_dot_q4_1_scalar(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q4_1 *x = vx;
    const hm_block_q8_1 *y = vy;
    double s = 0;
    for (int64_t i = 0; i < n / HM_QK4_1; i++) {
        int32_t si = 0;
        for (int j = 0; j < HM_QK4_1 / 2; j++)
            si += (x[i].qs[j] & 0x0f) * y[i].qs[j] + (x[i].qs[j] >> 4) * y[i].qs[j + HM_QK4_1 / 2];
        s += (double)(hm_fp16_to_f32(x[i].d) * hm_fp16_to_f32(y[i].d)) * si +
             (double)(hm_fp16_to_f32(x[i].m) * hm_fp16_to_f32(y[i].s));
    }
    *out = (float)s;
}

/* ---------------------------------------------------------------- Q5_1 */

static inline int q5_1_hbit(const hm_block_q5_1 *b, int j) { return ((b->qh[j >> 3] >> (j & 7)) & 1) << 4; }

static void to_float_q5_1_ref(const void *src, float *dst, int64_t n) {
    const hm_block_q5_1 *x = src;
    for (int64_t i = 0; i < n / HM_QK5_1; i++, dst += HM_QK5_1) {
        const float d = hm_fp16_to_f32(x[i].d), m = hm_fp16_to_f32(x[i].m);
        for (int j = 0; j < HM_QK5_1 / 2; j++) {
            dst[j] = (float)((x[i].qs[j] & 0x0f) | q5_1_hbit(&x[i], j)) * d + m;
            dst[j + HM_QK5_1 / 2] = (float)((x[i].qs[j] >> 4) | q5_1_hbit(&x[i], j + HM_QK5_1 / 2)) * d + m;
        }
    }
}

/* As q4_1 with 31 levels; ggml does not clamp the code (it cannot exceed 31 for finite input). */
static void from_float_q5_1_ref(const float *src, void *dst, int64_t n) {
    hm_block_q5_1 *y = dst;
    for (int64_t i = 0; i < n / HM_QK5_1; i++, src += HM_QK5_1) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < HM_QK5_1; j++) {
            if (src[j] < min) min = src[j];
            if (src[j] > max) max = src[j];
        }
        const float d = (max - min) / 31.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = hm_f32_to_fp16(d);
        y[i].m = hm_f32_to_fp16(min);
        uint32_t qh = 0;
        for (int j = 0; j < HM_QK5_1 / 2; j++) {
            const int q0 = (uint8_t)(int)((src[j] - min) * id + 0.5f);
            const int q1 = (uint8_t)(int)((src[j + HM_QK5_1 / 2] - min) * id + 0.5f);
            y[i].qs[j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
            qh |= (uint32_t)((q0 >> 4) & 1) << j;
            qh |= (uint32_t)((q1 >> 4) & 1) << (j + HM_QK5_1 / 2);
        }
        for (int k = 0; k < 4; k++) y[i].qh[k] = (uint8_t)(qh >> (8 * k));
    }
}

static void vec_dot_q5_1_scalar(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q5_1 *x = vx;
    const hm_block_q8_1 *y = vy;
    double s = 0;
    for (int64_t i = 0; i < n / HM_QK5_1; i++) {
        int32_t si = 0;
        for (int j = 0; j < HM_QK5_1 / 2; j++) {
            si += ((x[i].qs[j] & 0x0f) | q5_1_hbit(&x[i], j)) * y[i].qs[j];
            si += ((x[i].qs[j] >> 4) | q5_1_hbit(&x[i], j + HM_QK5_1 / 2)) * y[i].qs[j + HM_QK5_1 / 2];
        }
        s += (double)(hm_fp16_to_f32(x[i].d) * hm_fp16_to_f32(y[i].d)) * si +
             (double)(hm_fp16_to_f32(x[i].m) * hm_fp16_to_f32(y[i].s));
    }
    *out = (float)s;
}

/* ---------------------------------------------------------------- IQ4_NL */

static void to_float_iq4_nl_ref(const void *src, float *dst, int64_t n) {
    const hm_block_iq4_nl *x = src;
    for (int64_t i = 0; i < n / HM_QK4_NL; i++, dst += HM_QK4_NL) {
        const float d = hm_fp16_to_f32(x[i].d);
        for (int j = 0; j < HM_QK4_NL / 2; j++) {
            dst[j] = d * hm_kvalues_iq4nl[x[i].qs[j] & 0xf];
            dst[j + HM_QK4_NL / 2] = d * hm_kvalues_iq4nl[x[i].qs[j] >> 4];
        }
    }
}

/* One block: its IQ4 scale (hm_k_iq4_fit_scale), the codes the nearest levels under it. */
static void iq4nl_quantize_block(const float *x, hm_block_iq4_nl *y) {
    const int8_t *values = hm_kvalues_iq4nl;
    const float d = hm_k_iq4_fit_scale(x);
    y->d = hm_f32_to_fp16(d);
    const float id = d ? 1 / d : 0;
    for (int j = 0; j < HM_QK4_NL / 2; j++) {
        const int l0 = hm_k_nearest_level(16, values, id * x[j]);
        const int l1 = hm_k_nearest_level(16, values, id * x[j + HM_QK4_NL / 2]);
        y->qs[j] = (uint8_t)(l0 | (l1 << 4));
    }
}

static void from_float_iq4_nl_ref(const float *src, void *dst, int64_t n) {
    hm_block_iq4_nl *y = dst;
    for (int64_t i = 0; i < n / HM_QK4_NL; i++) iq4nl_quantize_block(src + HM_QK4_NL * i, &y[i]);
}

static void vec_dot_iq4_nl_scalar(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_iq4_nl *x = vx;
    const hm_block_q8_0 *y = vy;
    double s = 0;
    for (int64_t i = 0; i < n / HM_QK4_NL; i++) {
        int32_t si = 0;
        for (int j = 0; j < HM_QK4_NL / 2; j++)
            si += hm_kvalues_iq4nl[x[i].qs[j] & 0xf] * y[i].qs[j] +
                  hm_kvalues_iq4nl[x[i].qs[j] >> 4] * y[i].qs[j + HM_QK4_NL / 2];
        s += (double)(hm_fp16_to_f32(x[i].d) * hm_fp16_to_f32(y[i].d)) * si;
    }
    *out = (float)s;
}

/* ---------------------------------------------------------------- shared 2-bit layout */

/* The 2-bit codes of a q2_k / q3_k block in element order. */
static void lb_unpack2(const uint8_t qs[64], uint8_t out[HM_QK_K]) {
    for (int e = 0; e < HM_QK_K; e++) {
        const int h = e / 128, r = e % 128;
        out[e] = (uint8_t)((qs[32 * h + r % 32] >> (2 * (r / 32))) & 3);
    }
}

static void lb_pack2(const uint8_t L[HM_QK_K], uint8_t qs[64]) {
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *Lh = L + 128 * h;
            qs[32 * h + l] = (uint8_t)(Lh[l] | (Lh[l + 32] << 2) | (Lh[l + 64] << 4) | (Lh[l + 96] << 6));
        }
}

/* ---------------------------------------------------------------- Q2_K */

static void to_float_q2_k_ref(const void *src, float *dst, int64_t n) {
    const hm_block_q2_k *x = src;
    uint8_t q[HM_QK_K];
    for (int64_t i = 0; i < n / HM_QK_K; i++) {
        const float d = hm_fp16_to_f32(x[i].d), dmin = hm_fp16_to_f32(x[i].dmin);
        lb_unpack2(x[i].qs, q);
        for (int j = 0; j < 16; j++) {
            const float dl = d * (x[i].scales[j] & 0xf), ml = dmin * (x[i].scales[j] >> 4);
            for (int l = 0; l < 16; l++) *dst++ = dl * q[16 * j + l] - ml;
        }
    }
}

/* Per 16-element sub-block a (scale, min) fit with weights |x|; both quantised to 4 bits
 * against the block's largest; every element re-quantised against the quantised pair. */
static void from_float_q2_k_ref(const float *src, void *dst, int64_t n) {
    hm_block_q2_k *y = dst;
    uint8_t L[HM_QK_K], Laux[16];
    float weights[16], mins[16], scales[16];
    for (int64_t i = 0; i < n / HM_QK_K; i++, src += HM_QK_K) {
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < 16; j++) {
            for (int l = 0; l < 16; l++) weights[l] = fabsf(src[16 * j + l]);
            scales[j] = hm_k_fit_scale_min(16, 3, src + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0) {
            const float iscale = 15.f / max_scale;
            for (int j = 0; j < 16; j++) y[i].scales[j] = (uint8_t)hm_k_round(iscale * scales[j]);
            y[i].d = hm_f32_to_fp16(max_scale / 15.f);
        } else {
            memset(y[i].scales, 0, sizeof y[i].scales);
            y[i].d = hm_f32_to_fp16(0.f);
        }
        if (max_min > 0) {
            const float iscale = 15.f / max_min;
            for (int j = 0; j < 16; j++) y[i].scales[j] |= (uint8_t)(hm_k_round(iscale * mins[j]) << 4);
            y[i].dmin = hm_f32_to_fp16(max_min / 15.f);
        } else {
            y[i].dmin = hm_f32_to_fp16(0.f);
        }
        for (int j = 0; j < 16; j++) {
            const float d = hm_fp16_to_f32(y[i].d) * (y[i].scales[j] & 0xf);
            if (!d) continue; /* keep the fit's levels */
            const float dm = hm_fp16_to_f32(y[i].dmin) * (y[i].scales[j] >> 4);
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = (uint8_t)hm_k_max(0, hm_k_min(3, hm_k_round((src[16 * j + l] + dm) / d)));
        }
        lb_pack2(L, y[i].qs);
    }
}

static void vec_dot_q2_k_scalar(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q2_k *x = vx;
    const hm_block_q8_k *y = vy;
    uint8_t q[HM_QK_K];
    double sum = 0;
    for (int64_t i = 0; i < n / HM_QK_K; i++) {
        lb_unpack2(x[i].qs, q);
        int32_t sumi = 0, summ = 0;
        for (int j = 0; j < 16; j++) {
            int32_t s = 0;
            for (int l = 0; l < 16; l++) s += q[16 * j + l] * y[i].qs[16 * j + l];
            sumi += (x[i].scales[j] & 0xf) * s;
            summ += (x[i].scales[j] >> 4) * y[i].bsums[j];
        }
        sum += (double)(hm_fp16_to_f32(x[i].d) * y[i].d) * sumi - (double)(hm_fp16_to_f32(x[i].dmin) * y[i].d) * summ;
    }
    *out = (float)sum;
}

/* ---------------------------------------------------------------- Q3_K */

/* The 256 levels of a q3_k block (q - 4 where the high bit is clear, in [-4, 3]). */
static void q3k_levels(const hm_block_q3_k *b, int8_t out[HM_QK_K]) {
    uint8_t q[HM_QK_K];
    lb_unpack2(b->qs, q);
    for (int e = 0; e < HM_QK_K; e++) out[e] = (int8_t)(q[e] - ((b->hmask[e % 32] >> (e / 32)) & 1 ? 0 : 4));
}

static void to_float_q3_k_ref(const void *src, float *dst, int64_t n) {
    const hm_block_q3_k *x = src;
    int8_t q[HM_QK_K], sc[16];
    for (int64_t i = 0; i < n / HM_QK_K; i++) {
        const float d = hm_fp16_to_f32(x[i].d);
        q3k_levels(&x[i], q);
        hm_q3k_scales(x[i].scales, sc);
        for (int j = 0; j < 16; j++) {
            const float dl = d * sc[j];
            for (int l = 0; l < 16; l++) *dst++ = dl * q[16 * j + l];
        }
    }
}

/* Symmetric fit x ~ scale * L, L in [-nmax, nmax), weights x^2: the grid through the
 * largest-magnitude value, then up to 5 passes moving single elements to the level that the
 * rest of the fit prefers while that raises sumlx^2 / suml2. Returns scale; L offset by nmax.
 * (ggml's make_q3_quants with do_rmse.) */
static float q3k_fit(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < LB_GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.f;
    }
    const float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = hm_k_max(-nmax, hm_k_min(nmax - 1, hm_k_round(iscale * x[i])));
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                const int new_l = hm_k_max(-nmax, hm_k_min(nmax - 1, hm_k_round(x[i] * sl2 / slx)));
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

static void from_float_q3_k_ref(const float *src, void *dst, int64_t n) {
    hm_block_q3_k *y = dst;
    int8_t L[HM_QK_K], sc[16];
    float scales[16];
    for (int64_t i = 0; i < n / HM_QK_K; i++, src += HM_QK_K) {
        float max_scale = 0, amax = 0;
        for (int j = 0; j < 16; j++) {
            scales[j] = q3k_fit(16, 4, src + 16 * j, L + 16 * j);
            const float a = fabsf(scales[j]);
            if (a > amax) {
                amax = a;
                max_scale = scales[j];
            }
        }
        memset(y[i].scales, 0, sizeof y[i].scales);
        if (max_scale) {
            const float iscale = -32.f / max_scale;
            for (int j = 0; j < 16; j++) {
                const int l = hm_k_max(-32, hm_k_min(31, (int8_t)hm_k_round(iscale * scales[j]))) + 32;
                y[i].scales[j % 8] |= (uint8_t)((l & 0xf) << (4 * (j / 8)));
                y[i].scales[8 + j % 4] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
            }
            y[i].d = hm_f32_to_fp16(1 / iscale);
        } else {
            y[i].d = hm_f32_to_fp16(0.f);
        }
        hm_q3k_scales(y[i].scales, sc);
        for (int j = 0; j < 16; j++) {
            const float d = hm_fp16_to_f32(y[i].d) * sc[j];
            if (!d) continue; /* keep the fit's levels */
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = (int8_t)(hm_k_max(-4, hm_k_min(3, hm_k_round(src[16 * j + l] / d))) + 4);
        }
        memset(y[i].hmask, 0, sizeof y[i].hmask);
        uint8_t L2[HM_QK_K];
        for (int e = 0; e < HM_QK_K; e++) {
            if (L[e] > 3) y[i].hmask[e % 32] |= (uint8_t)(1u << (e / 32));
            L2[e] = (uint8_t)(L[e] & 3);
        }
        lb_pack2(L2, y[i].qs);
    }
}

static void vec_dot_q3_k_scalar(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q3_k *x = vx;
    const hm_block_q8_k *y = vy;
    int8_t q[HM_QK_K], sc[16];
    double sum = 0;
    for (int64_t i = 0; i < n / HM_QK_K; i++) {
        q3k_levels(&x[i], q);
        hm_q3k_scales(x[i].scales, sc);
        int32_t sumi = 0;
        for (int j = 0; j < 16; j++) {
            int32_t s = 0;
            for (int l = 0; l < 16; l++) s += q[16 * j + l] * y[i].qs[16 * j + l];
            sumi += sc[j] * s;
        }
        sum += (double)(hm_fp16_to_f32(x[i].d) * y[i].d) * sumi;
    }
    *out = (float)sum;
}

/* ---------------------------------------------------------------- registration */

static void lb_set(hm_type_traits *e, const char *name, int64_t blck, size_t size, hm_to_float_fn to,
                   hm_from_float_fn from, hm_type dot_type, hm_vec_dot_fn dot) {
    e->name = name;
    e->blck_size = blck;
    e->type_size = size;
    e->to_float_ref = to;
    e->from_float_ref = from;
    e->vec_dot_type = dot_type;
    e->vec_dot_isa[HM_ISA_SCALAR] = dot;
    e->to_float_isa[HM_ISA_SCALAR] = to;
    e->from_float_isa[HM_ISA_SCALAR] = from;
}

void hm_quant_register_lowbit(hm_type_traits *table) {
    lb_set(&table[HM_TYPE_Q8_1], "q8_1", 32, sizeof(hm_block_q8_1), to_float_q8_1_ref, from_float_q8_1_ref,
           HM_TYPE_Q8_1, vec_dot_q8_1_scalar);
    lb_set(&table[HM_TYPE_Q4_1], "q4_1", 32, sizeof(hm_block_q4_1), to_float_q4_1_ref, from_float_q4_1_ref,
           HM_TYPE_Q8_1, vec_dot_q4_1_scalar);
    lb_set(&table[HM_TYPE_Q5_1], "q5_1", 32, sizeof(hm_block_q5_1), to_float_q5_1_ref, from_float_q5_1_ref,
           HM_TYPE_Q8_1, vec_dot_q5_1_scalar);
    lb_set(&table[HM_TYPE_IQ4_NL], "iq4_nl", 32, sizeof(hm_block_iq4_nl), to_float_iq4_nl_ref,
           from_float_iq4_nl_ref, HM_TYPE_Q8_0, vec_dot_iq4_nl_scalar);
    lb_set(&table[HM_TYPE_Q2_K], "q2_K", HM_QK_K, sizeof(hm_block_q2_k), to_float_q2_k_ref, from_float_q2_k_ref,
           HM_TYPE_Q8_K, vec_dot_q2_k_scalar);
    lb_set(&table[HM_TYPE_Q3_K], "q3_K", HM_QK_K, sizeof(hm_block_q3_k), to_float_q3_k_ref, from_float_q3_k_ref,
           HM_TYPE_Q8_K, vec_dot_q3_k_scalar);
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    hm_lowbit_register_avx2(table);
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
    hm_lowbit_register_avx512(table);
#endif
}
