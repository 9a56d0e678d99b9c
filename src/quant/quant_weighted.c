/* quant_weighted.c - quantisation with an importance vector (llama.cpp's imatrix) for the types
 * that are not grid i-quants: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL,
 * IQ4_XS; and hm_quant_quantize, the one entry point that quantises rows of any type the way
 * ggml_quantize_chunk does (these, the i-quants through hm_quant_iq_quantize, the reference
 * quantisers where ggml ignores the importance or none is given).
 *
 * Each importance-weighted fit follows ggml's (quantize_row_<type>_impl in ggml-quants.c): per
 * element a weight qw[i] * sqrt(sigma2 + x[i]^2) (sigma2: the mean square of the super-block, or of
 * the row for the 32-element types, twice it for most), a weighted search of each sub-block's scale
 * (and min), then a weighted fit of the sub-block scales to their 4/6-bit codes (make_qp_quants
 * style), then the elements re-rounded under the stored scales. The bytes must equal ggml's for the
 * same floats and importance, so the float operations are written in ggml's order and this file is
 * compiled with contraction off (ggml-base is built without -march flags: no FMA). */
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
#include "quant_lowbit_impl.h"

#define W_GROUP_MAX_EPS 1e-15f

static inline int w_clamp(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* x[0..n) ~ scale * (L - nmax), L in [0, 2 nmax): the scale of least weighted squared error over
 * 19 trial inverse scales around nmax / max|x| (ggml's make_qx_quants, rmse_type 1, weights w). */
static float w_fit_sym(int n, int nmax, const float *x, int8_t *L, const float *w) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; ++i) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < W_GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = w_clamp(hm_k_round(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        sumlx += w[i] * x[i] * l;
        suml2 += w[i] * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; ++i) {
            int l = w_clamp(hm_k_round(iscale * x[i]), -nmax, nmax - 1);
            sumlx += w[i] * x[i] * l;
            suml2 += w[i] * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; ++i) L[i] = (int8_t)(nmax + w_clamp(hm_k_round(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* x[0..n) ~ scale * L + min, L in [0, nmax], min <= 0: the weighted least-squares fit over
 * nstep + 1 trial scales (ggml's make_qkx3_quants with weights, squared error). *neg_min = -min. */
static float w_fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L, float *neg_min,
                             uint8_t *Laux, float rmin, float rdelta, int nstep) {
    float min = x[0], max = x[0];
    float sum_w = w[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max <= min) {
        memset(L, 0, (size_t)n);
        *neg_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_err = 0;
    for (int i = 0; i < n; ++i) {
        int l = hm_k_round(iscale * (x[i] - min));
        L[i] = (uint8_t)w_clamp(l, 0, nmax);
        float diff = scale * L[i] + min - x[i];
        diff = diff * diff;
        best_err += w[i] * diff;
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            int l = w_clamp(hm_k_round(iscale * (x[i] - min)), 0, nmax);
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
            float err = 0;
            for (int i = 0; i < n; ++i) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = diff * diff;
                err += w[i] * diff;
            }
            if (err < best_err) {
                memcpy(L, Laux, (size_t)n);
                best_err = err;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *neg_min = -min;
    return scale;
}

/* Non-negative x[0..n) (sub-block scales or mins) ~ scale * L, L in [0, nmax]: 9 trial scales,
 * then up to 5 rounds of moving single codes while that lowers the weighted error (ggml's
 * make_qp_quants). */
static float w_fit_pos(int n, int nmax, const float *x, uint8_t *L, const float *w) {
    float max = 0;
    for (int i = 0; i < n; ++i) max = max > x[i] ? max : x[i];
    if (max < W_GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = nmax / max;
    for (int i = 0; i < n; ++i) L[i] = (uint8_t)hm_k_round(iscale * x[i]);
    float scale = 1 / iscale;
    float best_mse = 0;
    for (int i = 0; i < n; ++i) {
        float diff = x[i] - scale * L[i];
        best_mse += w[i] * diff * diff;
    }
    for (int is = -4; is <= 4; ++is) {
        if (is == 0) continue;
        float iscale_is = (0.1f * is + nmax) / max;
        float scale_is = 1 / iscale_is;
        float mse = 0;
        for (int i = 0; i < n; ++i) {
            int l = hm_k_min(nmax, hm_k_round(iscale_is * x[i]));
            float diff = x[i] - scale_is * l;
            mse += w[i] * diff * diff;
        }
        if (mse < best_mse) {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = hm_k_min(nmax, hm_k_round(iscale * x[i]));
        L[i] = (uint8_t)l;
        sumlx += w[i] * x[i] * l;
        suml2 += w[i] * l * l;
    }
    for (int itry = 0; itry < 5; ++itry) {
        int n_changed = 0;
        for (int i = 0; i < n; ++i) {
            float slx = sumlx - w[i] * x[i] * L[i];
            float sl2 = suml2 - w[i] * L[i] * L[i];
            if (slx > 0 && sl2 > 0) {
                int new_l = hm_k_min(nmax, hm_k_round(x[i] * sl2 / slx));
                if (new_l != L[i]) {
                    slx += w[i] * x[i] * new_l;
                    sl2 += w[i] * new_l * new_l;
                    if (slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (uint8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        ++n_changed;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* The four 2-bit codes of elements j, j+32, j+64, j+96 of each 128-element half in one byte. */
static void w_pack2(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < HM_QK_K; j += 128)
        for (int l = 0; l < 32; ++l)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

static float w_sum_sq(const float *x, int64_t n) {
    float s = 0;
    for (int64_t j = 0; j < n; ++j) s += x[j] * x[j];
    return s;
}

/* ---------------------------------------------------------------- K-quants, one row */

static void q2_k_row(const float *x, hm_block_q2_k *y, int64_t n, const float *qw) {
    uint8_t L[HM_QK_K], Laux[16], Ls[16], Lm[16];
    float mins[16], scales[16], sw[16], weight[16];
    for (int64_t i = 0; i < n / HM_QK_K; i++, x += HM_QK_K) {
        memset(sw, 0, sizeof sw);
        float sigma2 = w_sum_sq(x, HM_QK_K) / HM_QK_K;
        for (int j = 0; j < 16; ++j) {
            const float *q = qw + HM_QK_K * i + 16 * j;
            for (int l = 0; l < 16; ++l) weight[l] = q[l] * sqrtf(sigma2 + x[16 * j + l] * x[16 * j + l]);
            for (int l = 0; l < 16; ++l) sw[j] += weight[l];
            scales[j] = w_fit_scale_min(16, 3, x + 16 * j, weight, L + 16 * j, &mins[j], Laux, -0.9f, 0.05f, 36);
        }
        float dm = w_fit_pos(16, 15, scales, Ls, sw);
        float mm = w_fit_pos(16, 15, mins, Lm, sw);
        y[i].d = hm_f32_to_fp16(dm);
        y[i].dmin = hm_f32_to_fp16(mm);
        dm = hm_fp16_to_f32(y[i].d);
        mm = hm_fp16_to_f32(y[i].dmin);
        for (int j = 0; j < 16; ++j) y[i].scales[j] = (uint8_t)(Ls[j] | (Lm[j] << 4));
        for (int j = 0; j < 16; ++j) {
            const float d = dm * (y[i].scales[j] & 0xF);
            if (!d) continue;
            const float m = mm * (y[i].scales[j] >> 4);
            for (int ii = 0; ii < 16; ++ii) L[16 * j + ii] = (uint8_t)w_clamp(hm_k_round((x[16 * j + ii] + m) / d), 0, 3);
        }
        w_pack2(L, y[i].qs);
    }
}

static void q3_k_row(const float *x, hm_block_q3_k *y, int64_t n, const float *qw) {
    int8_t L[HM_QK_K], Ls[16];
    float scales[16], weight[16], sw[16];
    for (int64_t i = 0; i < n / HM_QK_K; i++, x += HM_QK_K) {
        float sigma2 = 2 * w_sum_sq(x, HM_QK_K) / HM_QK_K;
        for (int j = 0; j < 16; ++j) {
            const float *q = qw + HM_QK_K * i + 16 * j;
            for (int l = 0; l < 16; ++l) weight[l] = q[l] * sqrtf(sigma2 + x[16 * j + l] * x[16 * j + l]);
            float sumw = 0;
            for (int l = 0; l < 16; ++l) sumw += weight[l];
            sw[j] = sumw;
            scales[j] = w_fit_sym(16, 4, x + 16 * j, L + 16 * j, weight);
        }
        memset(y[i].scales, 0, 12);
        float d_block = w_fit_sym(16, 32, scales, Ls, sw);
        for (int j = 0; j < 16; ++j) {
            int l = Ls[j];
            if (j < 8) y[i].scales[j] = (uint8_t)(l & 0xF);
            else y[i].scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
            l >>= 4;
            y[i].scales[j % 4 + 8] |= (uint8_t)(l << (2 * (j / 4)));
        }
        y[i].d = hm_f32_to_fp16(d_block);
        for (int j = 0; j < 16; ++j) {
            int sc = j < 8 ? y[i].scales[j] & 0xF : y[i].scales[j - 8] >> 4;
            sc = (sc | (((y[i].scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
            float d = hm_fp16_to_f32(y[i].d) * sc;
            if (!d) continue;
            for (int ii = 0; ii < 16; ++ii) L[16 * j + ii] = (int8_t)(w_clamp(hm_k_round(x[16 * j + ii] / d), -4, 3) + 4);
        }
        memset(y[i].hmask, 0, sizeof y[i].hmask);
        int m = 0;
        uint8_t hm = 1;
        for (int j = 0; j < HM_QK_K; ++j) {
            if (L[j] > 3) {
                y[i].hmask[m] |= hm;
                L[j] -= 4;
            }
            if (++m == HM_QK_K / 8) {
                m = 0;
                hm <<= 1;
            }
        }
        w_pack2((const uint8_t *)L, y[i].qs);
    }
}

/* Q4_K / Q5_K share everything but the code range (15 / 31) and the packing. */
static void k45_fit(const float *x, const float *qw, int64_t i, int nmax, uint8_t *L, uint8_t *scales12, uint16_t *d,
                    uint16_t *dmin) {
    uint8_t Laux[32], Ls[8], Lm[8];
    float weights[32], sw[8], mins[8], scales[8];
    float sigma2 = 2 * w_sum_sq(x, HM_QK_K) / HM_QK_K;
    for (int j = 0; j < 8; ++j) {
        const float *q = qw + HM_QK_K * i + 32 * j;
        for (int l = 0; l < 32; ++l) weights[l] = q[l] * sqrtf(sigma2 + x[32 * j + l] * x[32 * j + l]);
        float sumw = 0;
        for (int l = 0; l < 32; ++l) sumw += weights[l];
        sw[j] = sumw;
        scales[j] = w_fit_scale_min(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, -0.9f, 0.05f, 36);
    }
    float d_block = w_fit_pos(8, 63, scales, Ls, sw);
    float m_block = w_fit_pos(8, 63, mins, Lm, sw);
    for (int j = 0; j < 8; ++j) {
        uint8_t ls = (uint8_t)hm_k_min(63, Ls[j]), lm = (uint8_t)hm_k_min(63, Lm[j]);
        if (j < 4) {
            scales12[j] = ls;
            scales12[j + 4] = lm;
        } else {
            scales12[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            scales12[j - 4] |= (uint8_t)((ls >> 4) << 6);
            scales12[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *d = hm_f32_to_fp16(d_block);
    *dmin = hm_f32_to_fp16(m_block);
    uint8_t sc[8], mn[8];
    hm_k4_unpack_scales(scales12, sc, mn);
    for (int j = 0; j < 8; ++j) {
        const float dd = hm_fp16_to_f32(*d) * sc[j];
        if (!dd) continue;
        const float dm = hm_fp16_to_f32(*dmin) * mn[j];
        for (int ii = 0; ii < 32; ++ii) L[32 * j + ii] = (uint8_t)w_clamp(hm_k_round((x[32 * j + ii] + dm) / dd), 0, nmax);
    }
}

static void q4_k_row(const float *x, hm_block_q4_k *y, int64_t n, const float *qw) {
    uint8_t L[HM_QK_K];
    for (int64_t i = 0; i < n / HM_QK_K; i++, x += HM_QK_K) {
        k45_fit(x, qw, i, 15, L, y[i].scales, &y[i].d, &y[i].dmin);
        uint8_t *q = y[i].qs;
        for (int j = 0; j < HM_QK_K; j += 64, q += 32)
            for (int l = 0; l < 32; ++l) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
    }
}

static void q5_k_row(const float *x, hm_block_q5_k *y, int64_t n, const float *qw) {
    uint8_t L[HM_QK_K];
    for (int64_t i = 0; i < n / HM_QK_K; i++, x += HM_QK_K) {
        k45_fit(x, qw, i, 31, L, y[i].scales, &y[i].d, &y[i].dmin);
        uint8_t *qh = y[i].qh, *ql = y[i].qs;
        memset(qh, 0, HM_QK_K / 8);
        uint8_t m1 = 1, m2 = 2;
        for (int c = 0; c < HM_QK_K; c += 64, ql += 32) {
            for (int j = 0; j < 32; ++j) {
                int l1 = L[c + j], l2 = L[c + j + 32];
                if (l1 > 15) {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                if (l2 > 15) {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[j] = (uint8_t)(l1 | (l2 << 4));
            }
            m1 = (uint8_t)(m1 << 2);
            m2 = (uint8_t)(m2 << 2);
        }
    }
}

/* Q6_K: ggml passes the importance straight through as the weights (no sigma2 term). */
static void q6_k_row(const float *x, hm_block_q6_k *y, int64_t n, const float *qw) {
    int8_t L[HM_QK_K];
    float scales[16];
    for (int64_t i = 0; i < n / HM_QK_K; i++, x += HM_QK_K) {
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < 16; ++ib) {
            const float scale = w_fit_sym(16, 32, x + 16 * ib, L + 16 * ib, qw + HM_QK_K * i + 16 * ib);
            scales[ib] = scale;
            const float abs_scale = fabsf(scale);
            if (abs_scale > max_abs_scale) {
                max_abs_scale = abs_scale;
                max_scale = scale;
            }
        }
        if (max_abs_scale < W_GROUP_MAX_EPS) {
            memset(&y[i], 0, sizeof y[i]);
            y[i].d = hm_f32_to_fp16(0.f);
            continue;
        }
        float iscale = -128.f / max_scale;
        y[i].d = hm_f32_to_fp16(1 / iscale);
        for (int ib = 0; ib < 16; ++ib) y[i].scales[ib] = (int8_t)hm_k_min(127, hm_k_round(iscale * scales[ib]));
        for (int j = 0; j < 16; ++j) {
            float d = hm_fp16_to_f32(y[i].d) * y[i].scales[j];
            if (!d) continue;
            for (int ii = 0; ii < 16; ++ii) L[16 * j + ii] = (int8_t)(w_clamp(hm_k_round(x[16 * j + ii] / d), -32, 31) + 32);
        }
        uint8_t *ql = y[i].ql, *qh = y[i].qh;
        for (int j = 0; j < HM_QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; ++l) {
                const uint8_t q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF, q3 = L[j + l + 64] & 0xF,
                              q4 = L[j + l + 96] & 0xF;
                ql[l] = (uint8_t)(q1 | (q3 << 4));
                ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
                qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                                  ((L[j + l + 96] >> 4) << 6));
            }
        }
    }
}

/* ---------------------------------------------------------------- 32-element types, one row */

/* The weights of block ib of a row: qw * sqrt(sigma2 + x^2), sigma2 the row's mean square. */
static void w_block_weights(const float *xb, const float *qwb, float sigma2, float *w) {
    for (int j = 0; j < 32; ++j) w[j] = qwb[j] * sqrtf(sigma2 + xb[j] * xb[j]);
}

static void q4_0_row(const float *x, hm_block_q4_0 *y, int64_t n, const float *qw) {
    float weight[32];
    int8_t L[32];
    const float sigma2 = w_sum_sq(x, n) / n;
    for (int64_t ib = 0; ib < n / 32; ++ib) {
        w_block_weights(x + 32 * ib, qw + 32 * ib, sigma2, weight);
        float d = w_fit_sym(32, 8, x + 32 * ib, L, weight);
        y[ib].d = hm_f32_to_fp16(d);
        for (int j = 0; j < 16; ++j) y[ib].qs[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
    }
}

static void q5_0_row(const float *x, hm_block_q5_0 *y, int64_t n, const float *qw) {
    float weight[32];
    int8_t L[32];
    const float sigma2 = w_sum_sq(x, n) / n;
    for (int64_t ib = 0; ib < n / 32; ++ib) {
        w_block_weights(x + 32 * ib, qw + 32 * ib, sigma2, weight);
        float d = w_fit_sym(32, 16, x + 32 * ib, L, weight);
        y[ib].d = hm_f32_to_fp16(d);
        uint32_t qh = 0;
        for (int j = 0; j < 16; ++j) {
            const uint8_t a = (uint8_t)L[j], b = (uint8_t)L[j + 16];
            y[ib].qs[j] = (uint8_t)((a & 0x0F) | ((b & 0x0F) << 4));
            qh |= (uint32_t)((a & 0x10u) >> 4) << j;
            qh |= (uint32_t)((b & 0x10u) >> 4) << (j + 16);
        }
        memcpy(y[ib].qh, &qh, 4);
    }
}

static void q4_1_row(const float *x, hm_block_q4_1 *y, int64_t n, const float *qw) {
    float weight[32], min;
    uint8_t L[32], Laux[32];
    const float sigma2 = w_sum_sq(x, n) / n;
    for (int64_t ib = 0; ib < n / 32; ++ib) {
        w_block_weights(x + 32 * ib, qw + 32 * ib, sigma2, weight);
        float d = w_fit_scale_min(32, 15, x + 32 * ib, weight, L, &min, Laux, -0.9f, 0.05f, 36);
        y[ib].d = hm_f32_to_fp16(d);
        y[ib].m = hm_f32_to_fp16(-min);
        for (int j = 0; j < 16; ++j) y[ib].qs[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
    }
}

static void q5_1_row(const float *x, hm_block_q5_1 *y, int64_t n, const float *qw) {
    float weight[32], min;
    uint8_t L[32], Laux[32];
    const float sigma2 = w_sum_sq(x, n) / n;
    for (int64_t ib = 0; ib < n / 32; ++ib) {
        w_block_weights(x + 32 * ib, qw + 32 * ib, sigma2, weight);
        float d = w_fit_scale_min(32, 31, x + 32 * ib, weight, L, &min, Laux, -0.9f, 0.05f, 36);
        y[ib].d = hm_f32_to_fp16(d);
        y[ib].m = hm_f32_to_fp16(-min);
        uint32_t qh = 0;
        for (int j = 0; j < 16; ++j) {
            y[ib].qs[j] = (uint8_t)((L[j] & 0x0F) | ((L[j + 16] & 0x0F) << 4));
            qh |= (uint32_t)((L[j] & 0x10u) >> 4) << j;
            qh |= (uint32_t)((L[j + 16] & 0x10u) >> 4) << (j + 16);
        }
        memcpy(y[ib].qh, &qh, 4);
    }
}

/* ---------------------------------------------------------------- IQ4_NL / IQ4_XS */

/* One super-block of sbs elements (32: IQ4_NL, 256: IQ4_XS) in sub-blocks of 32 (ggml's
 * quantize_row_iq4_nl_impl with ntry 7 and weights; sigma2 over the super-block). */
static void iq4_superblock(int sbs, const float *x, const float *qw, uint16_t *dh, uint8_t *q4, uint16_t *scales_h,
                           uint8_t *scales_l) {
    const int8_t *values = hm_kvalues_iq4nl;
    uint8_t L[HM_QK_K];
    float scales[HM_QK_K / 32], weight[32];
    float sigma2 = 0;
    for (int j = 0; j < sbs; ++j) sigma2 += x[j] * x[j];
    sigma2 *= 2.f / sbs;
    memset(q4, 0, (size_t)sbs / 2);
    dh[0] = hm_f32_to_fp16(0.f);
    float max_scale = 0, amax_scale = 0;
    for (int ib = 0; ib < sbs / 32; ++ib) {
        const float *xb = x + ib * 32;
        uint8_t *Lb = L + ib * 32;
        for (int j = 0; j < 32; ++j) weight[j] = qw[ib * 32 + j] * sqrtf(sigma2 + xb[j] * xb[j]);
        float amax = 0, max = 0;
        for (int j = 0; j < 32; ++j) {
            float ax = fabsf(xb[j]);
            if (ax > amax) {
                amax = ax;
                max = xb[j];
            }
        }
        if (amax < W_GROUP_MAX_EPS) {
            scales[ib] = 0;
            continue;
        }
        float d = -max / values[0];
        float id = 1 / d;
        float sumqx = 0, sumq2 = 0;
        for (int j = 0; j < 32; ++j) {
            int l = hm_k_nearest_level(16, values, id * xb[j]);
            Lb[j] = (uint8_t)l;
            float q = values[l];
            sumqx += weight[j] * q * xb[j];
            sumq2 += weight[j] * q * q;
        }
        d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
        float best = d * sumqx;
        for (int itry = -7; itry <= 7; ++itry) {
            id = (itry + values[0]) / max;
            sumqx = sumq2 = 0;
            for (int j = 0; j < 32; ++j) {
                float q = values[hm_k_nearest_level(16, values, id * xb[j])];
                sumqx += weight[j] * q * xb[j];
                sumq2 += weight[j] * q * q;
            }
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        float abs_d = fabsf(d);
        if (abs_d > amax_scale) {
            amax_scale = abs_d;
            max_scale = d;
        }
    }
    if (sbs > 32) {
        *scales_h = 0;
        float d = -max_scale / 32;
        dh[0] = hm_f32_to_fp16(d);
        float id = d ? 1 / d : 0.f;
        for (int ib = 0; ib < sbs / 32; ++ib) {
            int l = w_clamp(hm_k_round(id * scales[ib]), -32, 31);
            float dl = d * l;
            float idl = dl ? 1 / dl : 0.f;
            for (int j = 0; j < 32; ++j) L[ib * 32 + j] = (uint8_t)hm_k_nearest_level(16, values, idl * x[ib * 32 + j]);
            l += 32;
            const uint8_t l_l = (uint8_t)(l & 0xf), l_h = (uint8_t)(l >> 4);
            if (ib % 2 == 0) scales_l[ib / 2] = l_l;
            else scales_l[ib / 2] |= (uint8_t)(l_l << 4);
            *scales_h |= (uint16_t)(l_h << 2 * (ib % 8));
        }
    } else {
        dh[0] = hm_f32_to_fp16(scales[0]);
        float id = scales[0] ? 1 / scales[0] : 0;
        for (int j = 0; j < sbs; ++j) L[j] = (uint8_t)hm_k_nearest_level(16, values, id * x[j]);
    }
    for (int i = 0; i < sbs / 32; ++i)
        for (int j = 0; j < 16; ++j) q4[16 * i + j] = (uint8_t)(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}

static void iq4_nl_row(const float *x, hm_block_iq4_nl *y, int64_t n, const float *qw) {
    for (int64_t ib = 0; ib < n / 32; ++ib) iq4_superblock(32, x + 32 * ib, qw + 32 * ib, &y[ib].d, y[ib].qs, NULL, NULL);
}

static void iq4_xs_row(const float *x, hm_block_iq4_xs *y, int64_t n, const float *qw) {
    for (int64_t ib = 0; ib < n / HM_QK_K; ++ib)
        iq4_superblock(HM_QK_K, x + HM_QK_K * ib, qw + HM_QK_K * ib, &y[ib].d, y[ib].qs, &y[ib].scales_h,
                       y[ib].scales_l);
}

/* ---------------------------------------------------------------- the entry point */

bool hm_quant_weighted_supported(int t) {
    switch (t) {
    case HM_TYPE_Q2_K: case HM_TYPE_Q3_K: case HM_TYPE_Q4_K: case HM_TYPE_Q5_K: case HM_TYPE_Q6_K:
    case HM_TYPE_Q4_0: case HM_TYPE_Q4_1: case HM_TYPE_Q5_0: case HM_TYPE_Q5_1: case HM_TYPE_IQ4_NL:
    case HM_TYPE_IQ4_XS:
    case HM_TYPE_IQ2_XXS: case HM_TYPE_IQ2_XS: case HM_TYPE_IQ2_S: case HM_TYPE_IQ3_XXS: case HM_TYPE_IQ3_S:
    case HM_TYPE_IQ1_S: case HM_TYPE_IQ1_M:
    /* ggml ignores the importance for these */
    case HM_TYPE_F32: case HM_TYPE_F16: case HM_TYPE_BF16: case HM_TYPE_Q8_0: case HM_TYPE_MXFP4: return true;
    default: return false;
    }
}

bool hm_quant_quantize(int t, const float *src, void *dst, int64_t nrow, int64_t n_per_row, const float *qw) {
    const hm_type_traits *tr = hm_type_get(t);
    if (!tr || !tr->name || tr->blck_size <= 0 || n_per_row % tr->blck_size) return false;
    if (hm_quant_iq_quantize(t, src, dst, nrow, n_per_row, qw)) return true;
    const size_t rs = hm_row_size(t, n_per_row);
    if (!qw || t == HM_TYPE_F32 || t == HM_TYPE_F16 || t == HM_TYPE_BF16 || t == HM_TYPE_Q8_0 || t == HM_TYPE_MXFP4) {
        if (!tr->from_float_ref) return false;
        for (int64_t r = 0; r < nrow; r++) tr->from_float_ref(src + r * n_per_row, (uint8_t *)dst + (size_t)r * rs, n_per_row);
        return true;
    }
    for (int64_t r = 0; r < nrow; r++) {
        const float *x = src + r * n_per_row;
        void *y = (uint8_t *)dst + (size_t)r * rs;
        switch (t) {
        case HM_TYPE_Q2_K: q2_k_row(x, y, n_per_row, qw); break;
        case HM_TYPE_Q3_K: q3_k_row(x, y, n_per_row, qw); break;
        case HM_TYPE_Q4_K: q4_k_row(x, y, n_per_row, qw); break;
        case HM_TYPE_Q5_K: q5_k_row(x, y, n_per_row, qw); break;
        case HM_TYPE_Q6_K: q6_k_row(x, y, n_per_row, qw); break;
        case HM_TYPE_Q4_0: q4_0_row(x, y, n_per_row, qw); break;
        case HM_TYPE_Q4_1: q4_1_row(x, y, n_per_row, qw); break;
        case HM_TYPE_Q5_0: q5_0_row(x, y, n_per_row, qw); break;
        case HM_TYPE_Q5_1: q5_1_row(x, y, n_per_row, qw); break;
        case HM_TYPE_IQ4_NL: iq4_nl_row(x, y, n_per_row, qw); break;
        case HM_TYPE_IQ4_XS: iq4_xs_row(x, y, n_per_row, qw); break;
        default: return false;
        }
    }
    return true;
}
