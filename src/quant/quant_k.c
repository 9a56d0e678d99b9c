/* quant_k.c - the K-quant family: Q8_K (activation partner), Q4_K, Q5_K, Q6_K, IQ4_XS. Scalar
 * reference (de)quantisation and dot products, and the registration of the SIMD variants.
 *
 * Reference quantisers reproduce ggml's reference quantisers (quantize_row_q4_K_ref, ..._q5_K,
 * ..._q6_K, quantize_row_iq4_xs without an importance matrix, quantize_row_q8_K_ref) so that a
 * file written by `synth` holds the bytes llama.cpp would have written for the same floats. That
 * needs the same float operations in the same order, unfused: this file is compiled with
 * floating-point contraction off (ggml-base, where ggml's quantisers live, is built without
 * -march flags, so it never fuses either). One deliberate difference: an all-zero Q8_K block gets
 * zero bsums, where ggml leaves them unwritten.
 *
 * Scalar dot products compute each super-block's integer sums exactly and accumulate in double:
 * they are the reference the AVX2 / AVX-512 variants (quant_k_avx2.c, quant_k_avx512.c) are
 * measured against. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <math.h>
#include <string.h>

#include "core/fp16.h"
#include "quant_impl.h"
#include "quant_k_impl.h"

#define K_GROUP_MAX_EPS 1e-15f

/* Fit x[0..n) ~ scale * L + min with L in [0, nmax], min <= 0, minimising the weighted squared
 * error: start from the min/max grid, then try nstep+1 stretched grids (iscale nudged by rmin +
 * rdelta*is) and keep the weighted least-squares (scale, min) of the best one; the error is
 * weighted squared, or weighted absolute with mad. Returns scale, *neg_min = -min. (ggml's
 * make_qkx2_quants; Q4_K / Q5_K without mad, Q2_K with.) */
float hm_k_fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L, float *neg_min, uint8_t *Laux,
                        float rmin, float rdelta, int nstep, bool mad) {
    float min = x[0], max = x[0];
    float sum_w = w[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; i++) L[i] = 0;
        *neg_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; i++) {
        int l = hm_k_round(iscale * (x[i] - min));
        L[i] = (uint8_t)hm_k_max(0, hm_k_min(nmax, l));
        float diff = scale * L[i] + min - x[i];
        best_error += w[i] * (mad ? fabsf(diff) : diff * diff);
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = hm_k_max(0, hm_k_min(nmax, hm_k_round(iscale * (x[i] - min))));
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                cur_error += w[i] * (mad ? fabsf(diff) : diff * diff);
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *neg_min = -min;
    return scale;
}

/* Symmetric fit x ~ scale * (L - nmax), L in [0, 2*nmax), weights x^2: the grid through the
 * largest-magnitude value, then 18 nudged grids, keeping the best least-squares scale.
 * (ggml's make_qx_quants with rmse_type 1 and no importance weights.) */
static float k_fit_scale_sym(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < K_GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = hm_k_max(-nmax, hm_k_min(nmax - 1, hm_k_round(iscale * x[i])));
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = hm_k_max(-nmax, hm_k_min(nmax - 1, hm_k_round(iscale * x[i])));
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                int l = hm_k_round(iscale * x[i]);
                L[i] = (int8_t)(nmax + hm_k_max(-nmax, hm_k_min(nmax - 1, l)));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Pack 8 six-bit scales and mins the q4_k/q5_k way (inverse of hm_k4_unpack_scales). */
static void k4_pack_scales(const uint8_t ls[8], const uint8_t lm[8], uint8_t packed[12]) {
    for (int j = 0; j < 4; j++) {
        packed[j] = (uint8_t)(ls[j] | ((ls[j + 4] >> 4) << 6));
        packed[j + 4] = (uint8_t)(lm[j] | ((lm[j + 4] >> 4) << 6));
        packed[j + 8] = (uint8_t)((ls[j + 4] & 0xf) | ((lm[j + 4] & 0xf) << 4));
    }
}

/* The shared first half of q4_k/q5_k quantisation: per sub-block (scale, min) fits, quantised
 * to 6 bits against the block's largest scale/min, then every element re-quantised against the
 * quantised pair. Fills d, dmin, packed scales and L[256] in [0, nmax]. */
static void k4_quantize_block(const float *x, int nmax, float rmin, int nstep, uint16_t *d_out, uint16_t *dmin_out,
                              uint8_t packed[12], uint8_t L[HM_QK_K]) {
    float scales[8], mins[8], weights[32];
    uint8_t Laux[32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        const float *xb = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += xb[l] * xb[l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(xb[l]);
        scales[j] = hm_k_fit_scale_min(32, nmax, xb, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, false);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        ls[j] = (uint8_t)hm_k_min(63, (uint8_t)hm_k_round(inv_scale * scales[j]));
        lm[j] = (uint8_t)hm_k_min(63, (uint8_t)hm_k_round(inv_min * mins[j]));
    }
    k4_pack_scales(ls, lm, packed);
    *d_out = hm_f32_to_fp16(max_scale / 63.f);
    *dmin_out = hm_f32_to_fp16(max_min / 63.f);
    const float d = hm_fp16_to_f32(*d_out), dmin = hm_fp16_to_f32(*dmin_out);
    for (int j = 0; j < 8; j++) {
        const float dj = d * ls[j];
        if (!dj) continue; /* keep the fit's levels */
        const float mj = dmin * lm[j];
        for (int l = 0; l < 32; l++) {
            int q = hm_k_round((x[32 * j + l] + mj) / dj);
            L[32 * j + l] = (uint8_t)hm_k_max(0, hm_k_min(nmax, q));
        }
    }
}

/* ---------------------------------------------------------------- Q8_K */

void hm_from_float_q8_k_ref(const float *src, void *dst, int64_t n) {
    hm_block_q8_k *y = dst;
    for (int64_t i = 0; i < n / HM_QK_K; i++, src += HM_QK_K) {
        float max = 0, amax = 0;
        for (int j = 0; j < HM_QK_K; j++) {
            float ax = fabsf(src[j]);
            if (ax > amax) {
                amax = ax;
                max = src[j];
            }
        }
        if (!amax) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < HM_QK_K; j++) y[i].qs[j] = (int8_t)hm_k_min(127, hm_k_round(iscale * src[j]));
        for (int j = 0; j < HM_QK_K / 16; j++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += y[i].qs[16 * j + l];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

static void to_float_q8_k_ref(const void *src, float *dst, int64_t n) {
    const hm_block_q8_k *x = src;
    for (int64_t i = 0; i < n / HM_QK_K; i++)
        for (int j = 0; j < HM_QK_K; j++) *dst++ = x[i].d * x[i].qs[j];
}

static void vec_dot_q8_k_scalar(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q8_k *x = vx, *y = vy;
    double sum = 0;
    for (int64_t i = 0; i < n / HM_QK_K; i++) {
        int32_t sumi = 0;
        for (int j = 0; j < HM_QK_K; j++) sumi += x[i].qs[j] * y[i].qs[j];
        sum += (double)(x[i].d * y[i].d) * sumi;
    }
    *out = (float)sum;
}

/* ---------------------------------------------------------------- Q4_K */

static void to_float_q4_k_ref(const void *src, float *dst, int64_t n) {
    const hm_block_q4_k *x = src;
    for (int64_t i = 0; i < n / HM_QK_K; i++) {
        const float d = hm_fp16_to_f32(x[i].d), dmin = hm_fp16_to_f32(x[i].dmin);
        uint8_t sc[8], m[8];
        hm_k4_unpack_scales(x[i].scales, sc, m);
        const uint8_t *q = x[i].qs;
        for (int c = 0; c < 4; c++, q += 32) {
            const float d1 = d * sc[2 * c], m1 = dmin * m[2 * c];
            const float d2 = d * sc[2 * c + 1], m2 = dmin * m[2 * c + 1];
            for (int l = 0; l < 32; l++) *dst++ = d1 * (q[l] & 0xf) - m1;
            for (int l = 0; l < 32; l++) *dst++ = d2 * (q[l] >> 4) - m2;
        }
    }
}

static void from_float_q4_k_ref(const float *src, void *dst, int64_t n) {
    hm_block_q4_k *y = dst;
    uint8_t L[HM_QK_K];
    for (int64_t i = 0; i < n / HM_QK_K; i++, src += HM_QK_K) {
        k4_quantize_block(src, 15, -1.f, 20, &y[i].d, &y[i].dmin, y[i].scales, L);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) y[i].qs[32 * c + l] = (uint8_t)(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
    }
}

static void vec_dot_q4_k_scalar(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q4_k *x = vx;
    const hm_block_q8_k *y = vy;
    double sum = 0;
    for (int64_t i = 0; i < n / HM_QK_K; i++) {
        uint8_t sc[8], m[8];
        hm_k4_unpack_scales(x[i].scales, sc, m);
        const uint8_t *q = x[i].qs;
        const int8_t *a = y[i].qs;
        int32_t sumi = 0, summ = 0;
        for (int c = 0; c < 4; c++, q += 32, a += 64) {
            int32_t s1 = 0, s2 = 0;
            for (int l = 0; l < 32; l++) {
                s1 += (q[l] & 0xf) * a[l];
                s2 += (q[l] >> 4) * a[l + 32];
            }
            sumi += sc[2 * c] * s1 + sc[2 * c + 1] * s2;
        }
        for (int j = 0; j < 8; j++) summ += m[j] * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        sum += (double)(hm_fp16_to_f32(x[i].d) * y[i].d) * sumi - (double)(hm_fp16_to_f32(x[i].dmin) * y[i].d) * summ;
    }
    *out = (float)sum;
}

/* ---------------------------------------------------------------- Q5_K */

static void to_float_q5_k_ref(const void *src, float *dst, int64_t n) {
    const hm_block_q5_k *x = src;
    for (int64_t i = 0; i < n / HM_QK_K; i++) {
        const float d = hm_fp16_to_f32(x[i].d), dmin = hm_fp16_to_f32(x[i].dmin);
        uint8_t sc[8], m[8];
        hm_k4_unpack_scales(x[i].scales, sc, m);
        const uint8_t *q = x[i].qs, *qh = x[i].qh;
        for (int c = 0; c < 4; c++, q += 32) {
            const float d1 = d * sc[2 * c], m1 = dmin * m[2 * c];
            const float d2 = d * sc[2 * c + 1], m2 = dmin * m[2 * c + 1];
            const uint8_t u1 = (uint8_t)(1u << (2 * c)), u2 = (uint8_t)(2u << (2 * c));
            for (int l = 0; l < 32; l++) *dst++ = d1 * ((q[l] & 0xf) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) *dst++ = d2 * ((q[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        }
    }
}

static void from_float_q5_k_ref(const float *src, void *dst, int64_t n) {
    hm_block_q5_k *y = dst;
    uint8_t L[HM_QK_K];
    for (int64_t i = 0; i < n / HM_QK_K; i++, src += HM_QK_K) {
        k4_quantize_block(src, 31, -0.5f, 15, &y[i].d, &y[i].dmin, y[i].scales, L);
        memset(y[i].qh, 0, sizeof y[i].qh);
        for (int c = 0; c < 4; c++) {
            for (int l = 0; l < 32; l++) {
                const int l1 = L[64 * c + l], l2 = L[64 * c + 32 + l];
                y[i].qh[l] |= (uint8_t)(((l1 >> 4) << (2 * c)) | ((l2 >> 4) << (2 * c + 1)));
                y[i].qs[32 * c + l] = (uint8_t)((l1 & 0xf) | ((l2 & 0xf) << 4));
            }
        }
    }
}

static void vec_dot_q5_k_scalar(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q5_k *x = vx;
    const hm_block_q8_k *y = vy;
    double sum = 0;
    for (int64_t i = 0; i < n / HM_QK_K; i++) {
        uint8_t sc[8], m[8];
        hm_k4_unpack_scales(x[i].scales, sc, m);
        const uint8_t *q = x[i].qs, *qh = x[i].qh;
        const int8_t *a = y[i].qs;
        int32_t sumi = 0, summ = 0;
        for (int c = 0; c < 4; c++, q += 32, a += 64) {
            int32_t s1 = 0, s2 = 0;
            for (int l = 0; l < 32; l++) {
                s1 += ((q[l] & 0xf) | (((qh[l] >> (2 * c)) & 1) << 4)) * a[l];
                s2 += ((q[l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4)) * a[l + 32];
            }
            sumi += sc[2 * c] * s1 + sc[2 * c + 1] * s2;
        }
        for (int j = 0; j < 8; j++) summ += m[j] * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        sum += (double)(hm_fp16_to_f32(x[i].d) * y[i].d) * sumi - (double)(hm_fp16_to_f32(x[i].dmin) * y[i].d) * summ;
    }
    *out = (float)sum;
}

/* ---------------------------------------------------------------- Q6_K */

/* The 256 levels of a q6_k block, offset removed (q - 32, in [-32, 31]), in element order. */
static void q6_decode(const hm_block_q6_k *b, int8_t out[HM_QK_K]) {
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
        int8_t *o = out + 128 * h;
        for (int l = 0; l < 32; l++) {
            o[l] = (int8_t)(((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32);
            o[l + 32] = (int8_t)(((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32);
            o[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            o[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
    }
}

static void to_float_q6_k_ref(const void *src, float *dst, int64_t n) {
    const hm_block_q6_k *x = src;
    int8_t q[HM_QK_K];
    for (int64_t i = 0; i < n / HM_QK_K; i++) {
        const float d = hm_fp16_to_f32(x[i].d);
        q6_decode(&x[i], q);
        for (int e = 0; e < HM_QK_K; e++) *dst++ = d * x[i].scales[e / 16] * q[e];
    }
}

static void from_float_q6_k_ref(const float *src, void *dst, int64_t n) {
    hm_block_q6_k *y = dst;
    int8_t L[HM_QK_K];
    float scales[16];
    for (int64_t i = 0; i < n / HM_QK_K; i++, src += HM_QK_K) {
        float max_scale = 0, max_abs_scale = 0;
        for (int j = 0; j < 16; j++) {
            scales[j] = k_fit_scale_sym(16, 32, src + 16 * j, L + 16 * j);
            if (fabsf(scales[j]) > max_abs_scale) {
                max_abs_scale = fabsf(scales[j]);
                max_scale = scales[j];
            }
        }
        if (max_abs_scale < K_GROUP_MAX_EPS) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -128.f / max_scale;
        y[i].d = hm_f32_to_fp16(1 / iscale);
        for (int j = 0; j < 16; j++) y[i].scales[j] = (int8_t)hm_k_min(127, hm_k_round(iscale * scales[j]));
        const float d = hm_fp16_to_f32(y[i].d);
        for (int j = 0; j < 16; j++) {
            const float dj = d * y[i].scales[j];
            if (!dj) continue; /* keep the fit's levels */
            for (int l = 0; l < 16; l++) {
                int q = hm_k_round(src[16 * j + l] / dj);
                L[16 * j + l] = (int8_t)(hm_k_max(-32, hm_k_min(31, q)) + 32);
            }
        }
        for (int h = 0; h < 2; h++) {
            const int8_t *Lh = L + 128 * h;
            uint8_t *ql = y[i].ql + 64 * h, *qh = y[i].qh + 32 * h;
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((Lh[l] & 0xf) | ((Lh[l + 64] & 0xf) << 4));
                ql[l + 32] = (uint8_t)((Lh[l + 32] & 0xf) | ((Lh[l + 96] & 0xf) << 4));
                qh[l] = (uint8_t)((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) |
                                  ((Lh[l + 96] >> 4) << 6));
            }
        }
    }
}

static void vec_dot_q6_k_scalar(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_q6_k *x = vx;
    const hm_block_q8_k *y = vy;
    int8_t q[HM_QK_K];
    double sum = 0;
    for (int64_t i = 0; i < n / HM_QK_K; i++) {
        q6_decode(&x[i], q);
        int32_t sumi = 0;
        for (int j = 0; j < 16; j++) {
            int32_t s = 0;
            for (int l = 0; l < 16; l++) s += q[16 * j + l] * y[i].qs[16 * j + l];
            sumi += x[i].scales[j] * s;
        }
        sum += (double)(hm_fp16_to_f32(x[i].d) * y[i].d) * sumi;
    }
    *out = (float)sum;
}

/* ---------------------------------------------------------------- IQ4_XS */

static inline int iq4xs_scale(const hm_block_iq4_xs *b, int j) {
    return (((b->scales_l[j / 2] >> (4 * (j % 2))) & 0xf) | (((b->scales_h >> (2 * j)) & 3) << 4)) - 32;
}

static void to_float_iq4_xs_ref(const void *src, float *dst, int64_t n) {
    const hm_block_iq4_xs *x = src;
    for (int64_t i = 0; i < n / HM_QK_K; i++) {
        const float d = hm_fp16_to_f32(x[i].d);
        for (int j = 0; j < 8; j++, dst += 32) {
            const float dl = d * iq4xs_scale(&x[i], j);
            const uint8_t *q = x[i].qs + 16 * j;
            for (int l = 0; l < 16; l++) {
                dst[l] = dl * hm_kvalues_iq4nl[q[l] & 0xf];
                dst[l + 16] = dl * hm_kvalues_iq4nl[q[l] >> 4];
            }
        }
    }
}

/* One super-block: per sub-block the best scale over 15 grids (weights x^2), then 6-bit
 * sub-scales against the largest, then every element to its nearest level.
 * (ggml's quantize_row_iq4_nl_impl(QK_K, 32, ..., no importance weights, ntry 7).) */
/* The IQ4 scale of 32 values (IQ4_NL's block, IQ4_XS's sub-block): the least-squares scale (weights
 * x^2) of the grid through the largest-magnitude value, then 15 nudged grids (-max / (-127 + t),
 * t in -7..7), keeping the best; 0 for an all-but-zero block. (ggml's quantize_row_iq4_nl_impl,
 * ntry 7, without importance weights.) */
float hm_k_iq4_fit_scale(const float *x) {
    const int8_t *values = hm_kvalues_iq4nl;
    const int ntry = 7;
    float amax = 0, max = 0;
    for (int j = 0; j < 32; j++) {
        float ax = fabsf(x[j]);
        if (ax > amax) {
            amax = ax;
            max = x[j];
        }
    }
    if (amax < K_GROUP_MAX_EPS) return 0;
    float d = -max / values[0];
    float id = 1 / d;
    float sumqx = 0, sumq2 = 0;
    for (int j = 0; j < 32; j++) {
        float q = values[hm_k_nearest_level(16, values, id * x[j])], w = x[j] * x[j];
        sumqx += w * q * x[j];
        sumq2 += w * q * q;
    }
    d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
    float best = d * sumqx;
    for (int itry = -ntry; itry <= ntry; itry++) {
        id = (itry + values[0]) / max;
        sumqx = sumq2 = 0;
        for (int j = 0; j < 32; j++) {
            float q = values[hm_k_nearest_level(16, values, id * x[j])], w = x[j] * x[j];
            sumqx += w * q * x[j];
            sumq2 += w * q * q;
        }
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    return d;
}

static void iq4xs_quantize_block(const float *x, hm_block_iq4_xs *y) {
    const int8_t *values = hm_kvalues_iq4nl;
    float scales[8];
    uint8_t L[HM_QK_K];
    memset(y->qs, 0, sizeof y->qs);
    float max_scale = 0, amax_scale = 0;
    for (int ib = 0; ib < 8; ib++) {
        const float d = hm_k_iq4_fit_scale(x + 32 * ib);
        scales[ib] = d;
        if (fabsf(d) > amax_scale) {
            amax_scale = fabsf(d);
            max_scale = d;
        }
    }
    const float d = -max_scale / 32; /* -0.0 for an all-zero block, as ggml writes it */
    y->d = hm_f32_to_fp16(d);
    y->scales_h = 0;
    const float id = d ? 1 / d : 0.f;
    for (int ib = 0; ib < 8; ib++) {
        int l = hm_k_max(-32, hm_k_min(31, hm_k_round(id * scales[ib])));
        const float dl = d * l;
        const float idl = dl ? 1 / dl : 0.f;
        for (int j = 0; j < 32; j++) L[32 * ib + j] = (uint8_t)hm_k_nearest_level(16, values, idl * x[32 * ib + j]);
        l += 32;
        if (ib % 2 == 0) y->scales_l[ib / 2] = (uint8_t)(l & 0xf);
        else y->scales_l[ib / 2] |= (uint8_t)((l & 0xf) << 4);
        y->scales_h |= (uint16_t)((l >> 4) << (2 * ib));
    }
    for (int ib = 0; ib < 8; ib++)
        for (int j = 0; j < 16; j++) y->qs[16 * ib + j] = (uint8_t)(L[32 * ib + j] | (L[32 * ib + 16 + j] << 4));
}

static void from_float_iq4_xs_ref(const float *src, void *dst, int64_t n) {
    hm_block_iq4_xs *y = dst;
    for (int64_t i = 0; i < n / HM_QK_K; i++) iq4xs_quantize_block(src + HM_QK_K * i, &y[i]);
}

static void vec_dot_iq4_xs_scalar(int64_t n, float *out, const void *vx, const void *vy) {
    const hm_block_iq4_xs *x = vx;
    const hm_block_q8_k *y = vy;
    double sum = 0;
    for (int64_t i = 0; i < n / HM_QK_K; i++) {
        int32_t sumi = 0;
        for (int j = 0; j < 8; j++) {
            const uint8_t *q = x[i].qs + 16 * j;
            const int8_t *a = y[i].qs + 32 * j;
            int32_t s = 0;
            for (int l = 0; l < 16; l++)
                s += hm_kvalues_iq4nl[q[l] & 0xf] * a[l] + hm_kvalues_iq4nl[q[l] >> 4] * a[l + 16];
            sumi += iq4xs_scale(&x[i], j) * s;
        }
        sum += (double)(hm_fp16_to_f32(x[i].d) * y[i].d) * sumi;
    }
    *out = (float)sum;
}

/* ---------------------------------------------------------------- registration */

static void k_set(hm_type_traits *e, const char *name, size_t type_size, hm_to_float_fn to_float_ref,
                  hm_from_float_fn from_float_ref, hm_vec_dot_fn dot_scalar, hm_vec_dot_fn dot_avx2,
                  hm_vec_dot_fn dot_avx512) {
    e->name = name;
    e->blck_size = HM_QK_K;
    e->type_size = type_size;
    e->to_float_ref = to_float_ref;
    e->from_float_ref = from_float_ref;
    e->vec_dot_type = HM_TYPE_Q8_K;
    e->vec_dot_isa[HM_ISA_SCALAR] = dot_scalar;
    e->vec_dot_isa[HM_ISA_AVX2] = dot_avx2;
    e->vec_dot_isa[HM_ISA_AVX512] = dot_avx512;
    e->to_float_isa[HM_ISA_SCALAR] = to_float_ref;
    e->from_float_isa[HM_ISA_SCALAR] = from_float_ref;
}

#ifdef __AVX2__
#define K_AVX2(f) f##_avx2
#else
#define K_AVX2(f) NULL
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define K_AVX512(f) f##_avx512
#else
#define K_AVX512(f) NULL
#endif

void hm_quant_register_k(hm_type_traits *table) {
    k_set(&table[HM_TYPE_Q8_K], "q8_K", sizeof(hm_block_q8_k), to_float_q8_k_ref, hm_from_float_q8_k_ref,
          vec_dot_q8_k_scalar, NULL, NULL);
    k_set(&table[HM_TYPE_Q4_K], "q4_K", sizeof(hm_block_q4_k), to_float_q4_k_ref, from_float_q4_k_ref,
          vec_dot_q4_k_scalar, K_AVX2(hm_vec_dot_q4_k), K_AVX512(hm_vec_dot_q4_k));
    k_set(&table[HM_TYPE_Q5_K], "q5_K", sizeof(hm_block_q5_k), to_float_q5_k_ref, from_float_q5_k_ref,
          vec_dot_q5_k_scalar, K_AVX2(hm_vec_dot_q5_k), K_AVX512(hm_vec_dot_q5_k));
    k_set(&table[HM_TYPE_Q6_K], "q6_K", sizeof(hm_block_q6_k), to_float_q6_k_ref, from_float_q6_k_ref,
          vec_dot_q6_k_scalar, K_AVX2(hm_vec_dot_q6_k), K_AVX512(hm_vec_dot_q6_k));
    k_set(&table[HM_TYPE_IQ4_XS], "iq4_xs", sizeof(hm_block_iq4_xs), to_float_iq4_xs_ref, from_float_iq4_xs_ref,
          vec_dot_iq4_xs_scalar, K_AVX2(hm_vec_dot_iq4_xs), K_AVX512(hm_vec_dot_iq4_xs));
    /* Activations are quantised at run time: the fastest Q8_K quantiser (all agree byte for byte). */
    hm_type_traits *q8k = &table[HM_TYPE_Q8_K];
#ifdef __AVX2__
    q8k->from_float_isa[HM_ISA_AVX2] = hm_from_float_q8_k_avx2;
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
    q8k->from_float_isa[HM_ISA_AVX512] = hm_from_float_q8_k_avx512;
#endif
    for (int isa = HM_ISA_COUNT - 1; isa >= 0 && !q8k->from_float; isa--) q8k->from_float = q8k->from_float_isa[isa];
}
