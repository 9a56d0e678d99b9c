/* quant_iq_quantize.c - importance-weighted quantisers of the grid i-quants: the same bytes as
 * ggml's quantize_iq2_xxs / iq2_xs / iq2_s / iq3_xxs / iq3_s / iq1_s / iq1_m for the same floats
 * and importance vector (hm_quant_iq_quantize; the from_float_ref entries without one).
 *
 * IQ2/IQ3: the signs are taken out first (IQ2_XXS/XS, IQ3_XXS: the element of least weighted
 * magnitude flipped when a group has an odd count of negatives, the 7-bit sign code implies
 * even), magnitudes quantised to levels l (value 2l + 1 times the scale) over a search of trial
 * scales; a level pattern that is not a grid point is replaced by the best of its neighbours
 * (quant_iq_lattice.c). IQ1: an exact search of the three-run split of the sorted values.
 *
 * Reproducing ggml's bytes needs its float operations in its order, unfused: this file is compiled
 * with contraction off (ggml-base, where ggml's quantisers live, is built without -march flags). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/fp16.h"
#include "quant_impl.h"
#include "quant_iq_impl.h"

#define IQ_GROUP_MAX_EPS 1e-15f

static inline int iq_round(float v) {
    float t = v + 12582912.f;
    int32_t i;
    memcpy(&i, &t, 4);
    return (i & 0x007fffff) - 0x00400000;
}
static inline int iq_imin(int a, int b) { return a < b ? a : b; }
static inline int iq_imax(int a, int b) { return a > b ? a : b; }

/* ---------------------------------------------------------------- the lattice search */

/* The grid point nearest (weighted squared distance) to xval / scale among off-grid pattern u's
 * neighbours; its levels into Lq. */
static int lat_best_neighbour(const hm_iq_lattice *lat, int u, const float *xval, const float *weight, float scale,
                              int8_t *Lq) {
    const uint16_t *nb = lat->nb + lat->off[u];
    float best_d2 = FLT_MAX;
    int best = nb[1];
    for (int j = 1; j <= nb[0]; j++) {
        const uint64_t p = lat->pos[nb[j]];
        float d2 = 0;
        for (int i = 0; i < lat->dim; i++) {
            float q = (float)(int)((p >> (8 * i)) & 0xff);
            float diff = scale * q - xval[i];
            d2 += weight[i] * diff * diff;
        }
        if (d2 < best_d2) {
            best_d2 = d2;
            best = nb[j];
        }
    }
    const uint64_t p = lat->pos[best];
    for (int i = 0; i < lat->dim; i++) Lq[i] = (int8_t)((((p >> (8 * i)) & 0xff) - 1) / 2);
    return best;
}

/* Levels of one group of lat->dim magnitudes at inverse scale id, clamped to [0, kmax], moved
 * onto the grid (nearest neighbour at scale, weights waux) when off it; true if on it already. */
static bool lat_group(const hm_iq_lattice *lat, int kmax, const float *xval, const float *waux, float id, float scale,
                      int8_t *Lq) {
    int u = 0;
    for (int i = 0; i < lat->dim; i++) {
        const int l = iq_imax(0, iq_imin(kmax, iq_round(0.5f * (id * xval[i] - 1))));
        Lq[i] = (int8_t)l;
        u |= l << (lat->bits * i);
    }
    if (lat->map[u] >= 0) return true;
    lat_best_neighbour(lat, u, xval, waux, scale, Lq);
    return false;
}

static int lat_index(const hm_iq_lattice *lat, const int8_t *Lq) {
    int u = 0;
    for (int i = 0; i < lat->dim; i++) u |= Lq[i] << (lat->bits * i);
    return lat->map[u] < 0 ? 0 : lat->map[u];
}

/* Magnitudes and sign bits of groups of 8 (n / 8 groups): an odd count of negatives flips the
 * element of least weight * x^2. */
static void iq_signs_out(const float *xb, const float *weight, int n, float *xval, uint8_t *signs7) {
    for (int k = 0; k < n / 8; k++) {
        int nflip = 0;
        uint8_t s = 0;
        for (int i = 0; i < 8; i++) {
            if (xb[8 * k + i] >= 0) {
                xval[8 * k + i] = xb[8 * k + i];
            } else {
                xval[8 * k + i] = -xb[8 * k + i];
                nflip++;
                s |= (uint8_t)(1 << i);
            }
        }
        if (nflip % 2) {
            int imin = 0;
            float min = weight[8 * k] * xb[8 * k] * xb[8 * k];
            for (int i = 1; i < 8; i++) {
                float ax = weight[8 * k + i] * xb[8 * k + i] * xb[8 * k + i];
                if (ax < min) {
                    min = ax;
                    imin = i;
                }
            }
            xval[8 * k + imin] = -xval[8 * k + imin];
            s ^= (uint8_t)(1 << imin);
        }
        signs7[k] = s & 127;
    }
}

/* Weighted least-squares scale of n magnitudes at levels 2L + 1. */
static void iq2_sums(int n, const float *weight, const float *xval, const int8_t *Lq, float *sumqx, float *sumq2) {
    float a = 0, b = 0;
    for (int i = 0; i < n; i++) {
        float w = weight[i];
        float q = (float)(2 * Lq[i] + 1);
        a += w * xval[i] * q;
        b += w * q * q;
    }
    *sumqx = a;
    *sumq2 = b;
}

/* Scale of levels 0..nmax fitted to x (weights w): a grid of 9 trial inverse scales, then
 * coordinate descent on single levels. (ggml's make_qp_quants; only the scale is used here.) */
static float iq_fit_qp(int n, int nmax, const float *x, uint8_t *L, const float *w) {
    float max = 0;
    for (int i = 0; i < n; i++) max = max > x[i] ? max : x[i];
    if (max < IQ_GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = nmax / max;
    for (int i = 0; i < n; i++) L[i] = (uint8_t)iq_round(iscale * x[i]);
    float scale = 1 / iscale;
    float best_mse = 0;
    for (int i = 0; i < n; i++) {
        float diff = x[i] - scale * L[i];
        best_mse += w[i] * diff * diff;
    }
    for (int is = -4; is <= 4; is++) {
        if (is == 0) continue;
        float iscale_is = (0.1f * is + nmax) / max;
        float scale_is = 1 / iscale_is;
        float mse = 0;
        for (int i = 0; i < n; i++) {
            int l = iq_imin(nmax, iq_round(iscale_is * x[i]));
            float diff = x[i] - scale_is * l;
            mse += w[i] * diff * diff;
        }
        if (mse < best_mse) {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = iq_imin(nmax, iq_round(iscale * x[i]));
        L[i] = (uint8_t)l;
        sumlx += w[i] * x[i] * l;
        suml2 += w[i] * l * l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            float slx = sumlx - w[i] * x[i] * L[i];
            float sl2 = suml2 - w[i] * L[i] * L[i];
            if (slx > 0 && sl2 > 0) {
                int new_l = iq_imin(nmax, iq_round(x[i] * sl2 / slx));
                if (new_l != L[i]) {
                    slx += w[i] * x[i] * new_l;
                    sl2 += w[i] * new_l * new_l;
                    if (slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (uint8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* weight[i] = qw[i] * sqrt(sigma2 + x^2) (with importance), else the type's own weighting. */
static void iq_weights(const float *xb, const float *qw, float sigma2, int n, float *weight) {
    for (int i = 0; i < n; i++) weight[i] = qw[i] * sqrtf(sigma2 + xb[i] * xb[i]);
}
static void iq_sqrt(const float *w, int n, float *out) {
    for (int i = 0; i < n; i++) out[i] = sqrtf(w[i]);
}

static float iq_sumx2(const float *xbl) {
    float sumx2 = 0;
    for (int i = 0; i < HM_QK_K; i++) sumx2 += xbl[i] * xbl[i];
    return sumx2;
}

/* Plain sign bits of groups of 8 (IQ2_S, IQ3_S store all 8). */
static void iq_signs_out8(const float *xb, int n, float *xval, uint8_t *signs) {
    for (int k = 0; k < n / 8; k++) {
        uint8_t s = 0;
        for (int i = 0; i < 8; i++) {
            if (xb[8 * k + i] >= 0) {
                xval[8 * k + i] = xb[8 * k + i];
            } else {
                xval[8 * k + i] = -xb[8 * k + i];
                s |= (uint8_t)(1 << i);
            }
        }
        signs[k] = s;
    }
}

static float iq_fmax(const float *x, int n) {
    float m = x[0];
    for (int i = 1; i < n; i++) m = m > x[i] ? m : x[i];
    return m;
}

/* The scale search of IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S over one sub-block of n magnitudes: 2
 * is_max + 1 trial inverse scales (2 kmaxq - 1 + is * step) / max, each group's levels moved onto
 * the grid, the weighted least-squares scale of the best; then, if a group of the best was off
 * the grid, the levels at that scale again (only the off-grid groups, or all with refit_all) and
 * a final least-squares scale. L: the levels; returns the scale. */
typedef struct iq_search {
    int n, kmaxq, is_max;
    float step;
    bool refit_all, on_grid_init;
} iq_search;

static float iq_scale_search(const hm_iq_lattice *lat, const iq_search *c, const float *xval, const float *weight,
                             const float *waux, float max, int8_t *L) {
    const int ng = c->n / lat->dim;
    int8_t Laux[32];
    bool on_grid[8], on_grid_aux[8];
    float best = 0;
    float scale = max / (2 * c->kmaxq - 1);
    for (int k = 0; k < ng; k++) on_grid[k] = c->on_grid_init;
    for (int is = -c->is_max; is <= c->is_max; is++) {
        float id = (2 * c->kmaxq - 1 + is * c->step) / max;
        float this_scale = 1 / id;
        for (int k = 0; k < ng; k++)
            on_grid_aux[k] = lat_group(lat, c->kmaxq - 1, xval + lat->dim * k, waux + lat->dim * k, id, this_scale,
                                       Laux + lat->dim * k);
        float sumqx, sumq2;
        iq2_sums(c->n, weight, xval, Laux, &sumqx, &sumq2);
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            memcpy(L, Laux, (size_t)c->n);
            memcpy(on_grid, on_grid_aux, sizeof(bool) * (size_t)ng);
        }
    }
    int n_off = 0;
    for (int k = 0; k < ng; k++) n_off += !on_grid[k];
    if (n_off > 0 && scale > 0) {
        float id = 1 / scale;
        for (int k = 0; k < ng; k++) {
            if (!c->refit_all && on_grid[k]) continue;
            lat_group(lat, c->kmaxq - 1, xval + lat->dim * k, waux + lat->dim * k, id, scale, L + lat->dim * k);
        }
        float sumqx, sumq2;
        iq2_sums(c->n, weight, xval, L, &sumqx, &sumq2);
        if (sumq2 > 0) scale = sumqx / sumq2;
    }
    return scale;
}

/* 4-bit sub-block scale code of scale s against super-scale inverse id. */
static int iq_scale4(float id, float s) { return iq_imax(0, iq_imin(15, iq_round(0.5f * (id * s - 1)))); }

/* ---------------------------------------------------------------- IQ2_XXS */

static void quantize_block_iq2_xxs(const float *xbl, const float *qwb, hm_block_iq2_xxs *y) {
    const hm_iq_lattice *lat = hm_iq_lattice_get(HM_IQ_LAT_IQ2XXS);
    const int kMaxQ = 3;
    float scales[8], weight[32], waux[32], xval[32];
    int8_t L[32], Laux[32];
    uint8_t signs7[4];
    uint32_t q2[16];
    memset(q2, 0, sizeof q2);
    y->d = hm_f32_to_fp16(0.f);
    float max_scale = 0;
    const float sigma2 = iq_sumx2(xbl) / HM_QK_K;
    for (int ib = 0; ib < 8; ib++) {
        const float *xb = xbl + 32 * ib;
        iq_weights(xb, qwb + 32 * ib, sigma2, 32, weight);
        iq_sqrt(weight, 32, waux);
        iq_signs_out(xb, weight, 32, xval, signs7);
        float max = iq_fmax(xval, 32);
        if (max < IQ_GROUP_MAX_EPS) {
            scales[ib] = 0;
            memset(L, 0, 32);
            continue;
        }
        float scale = iq_fit_qp(32, kMaxQ + 1, xval, (uint8_t *)L, weight);
        float eff_max = scale * kMaxQ;
        if (eff_max <= 0) {
            scales[ib] = 0;
            memset(L, 0, 32);
            continue;
        }
        float best = 0;
        for (int is = -6; is <= 6; is++) {
            float id = (2 * kMaxQ - 1 + is * 0.1f) / eff_max;
            float this_scale = 1 / id;
            for (int k = 0; k < 4; k++) lat_group(lat, kMaxQ - 1, xval + 8 * k, waux + 8 * k, id, this_scale, Laux + 8 * k);
            float sumqx, sumq2;
            iq2_sums(32, weight, xval, Laux, &sumqx, &sumq2);
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                scale = sumqx / sumq2;
                best = scale * sumqx;
                memcpy(L, Laux, 32);
            }
        }
        if (scale > 0) {
            float id = 1 / scale;
            for (int k = 0; k < 4; k++) lat_group(lat, kMaxQ - 1, xval + 8 * k, waux + 8 * k, id, scale, L + 8 * k);
            float sumqx, sumq2;
            iq2_sums(32, weight, xval, L, &sumqx, &sumq2);
            if (sumq2 > 0) scale = sumqx / sumq2;
        }
        if (scale < 0) {
            scale = -scale;
            for (int k = 0; k < 4; k++) signs7[k] = (uint8_t)(~signs7[k] & 127);
        }
        for (int k = 0; k < 4; k++) {
            q2[2 * ib] |= (uint32_t)lat_index(lat, L + 8 * k) << (8 * k);
            q2[2 * ib + 1] |= (uint32_t)signs7[k] << (7 * k);
        }
        scales[ib] = scale;
        max_scale = max_scale > scale ? max_scale : scale;
    }
    if (!max_scale) {
        memset(y->qs, 0, sizeof y->qs);
        return;
    }
    float d = max_scale / 31;
    y->d = hm_f32_to_fp16(d);
    float id = 1 / d;
    for (int ib = 0; ib < 8; ib++) q2[2 * ib + 1] |= (uint32_t)iq_scale4(id, scales[ib]) << 28;
    memcpy(y->qs, q2, sizeof q2);
}

/* ---------------------------------------------------------------- IQ2_XS, IQ2_S */

static const iq_search search_iq2 = {16, 3, 9, 0.1f, false, true};

static void quantize_block_iq2_xs(const float *xbl, const float *qwb, hm_block_iq2_xs *y) {
    const hm_iq_lattice *lat = hm_iq_lattice_get(HM_IQ_LAT_IQ2XS);
    float scales[16], weight[16], waux[16], xval[16];
    int8_t L[16];
    uint8_t signs7[2];
    uint16_t q2[32];
    memset(q2, 0, sizeof q2);
    memset(y->scales, 0, sizeof y->scales);
    y->d = hm_f32_to_fp16(0.f);
    float max_scale = 0;
    const float sigma2 = iq_sumx2(xbl) / HM_QK_K;
    for (int ib = 0; ib < 16; ib++) {
        const float *xb = xbl + 16 * ib;
        iq_weights(xb, qwb + 16 * ib, sigma2, 16, weight);
        iq_sqrt(weight, 16, waux);
        iq_signs_out(xb, weight, 16, xval, signs7);
        float max = iq_fmax(xval, 16);
        memset(L, 0, 16);
        if (max < IQ_GROUP_MAX_EPS) {
            scales[ib] = 0;
            continue;
        }
        float scale = iq_scale_search(lat, &search_iq2, xval, weight, waux, max, L);
        if (scale < 0) {
            scale = -scale;
            for (int k = 0; k < 2; k++) signs7[k] = (uint8_t)(~signs7[k] & 127);
        }
        for (int k = 0; k < 2; k++) q2[2 * ib + k] = (uint16_t)(lat_index(lat, L + 8 * k) | signs7[k] << 9);
        scales[ib] = scale;
        max_scale = max_scale > scale ? max_scale : scale;
    }
    if (!max_scale) {
        memset(y->qs, 0, sizeof y->qs);
        return;
    }
    float d = max_scale / 31;
    y->d = hm_f32_to_fp16(d);
    float id = 1 / d;
    for (int ib = 0; ib < 16; ib++) y->scales[ib / 2] |= (uint8_t)(iq_scale4(id, scales[ib]) << (4 * (ib % 2)));
    memcpy(y->qs, q2, sizeof q2);
}

static void quantize_block_iq2_s(const float *xbl, const float *qwb, hm_block_iq2_s *y) {
    const hm_iq_lattice *lat = hm_iq_lattice_get(HM_IQ_LAT_IQ2S);
    float scales[16], weight[16], waux[16], xval[16];
    int8_t L[16];
    uint8_t signs[2];
    memset(y, 0, sizeof *y);
    float max_scale = 0;
    const float sigma2 = 2 * iq_sumx2(xbl) / HM_QK_K;
    for (int ib = 0; ib < 16; ib++) {
        const float *xb = xbl + 16 * ib;
        if (qwb) iq_weights(xb, qwb + 16 * ib, sigma2, 16, weight);
        else
            for (int i = 0; i < 16; i++) weight[i] = 0.25f * sigma2 + xb[i] * xb[i];
        iq_sqrt(weight, 16, waux);
        iq_signs_out8(xb, 16, xval, signs);
        float max = iq_fmax(xval, 16);
        memset(L, 0, 16);
        if (max < 1e-8f) {
            scales[ib] = 0;
            continue;
        }
        float scale = iq_scale_search(lat, &search_iq2, xval, weight, waux, max, L);
        if (scale < 0) {
            scale = -scale;
            for (int k = 0; k < 2; k++) signs[k] = (uint8_t)~signs[k];
        }
        for (int k = 0; k < 2; k++) {
            const int gi = lat_index(lat, L + 8 * k), i8 = 2 * ib + k;
            y->qs[i8] = (uint8_t)(gi & 255);
            y->qh[i8 / 4] |= (uint8_t)((gi >> 8) << (2 * (i8 % 4)));
            y->qs[32 + i8] = signs[k];
        }
        scales[ib] = scale;
        max_scale = max_scale > scale ? max_scale : scale;
    }
    if (!max_scale) return;
    float d = max_scale / 31;
    y->d = hm_f32_to_fp16(d * 0.9875f);
    float id = 1 / d;
    for (int ib = 0; ib < 16; ib++) y->scales[ib / 2] |= (uint8_t)(iq_scale4(id, scales[ib]) << (4 * (ib % 2)));
}

/* ---------------------------------------------------------------- IQ3_XXS, IQ3_S */

static void quantize_block_iq3_xxs(const float *xbl, const float *qwb, hm_block_iq3_xxs *y) {
    static const iq_search search = {32, 8, 15, 0.2f, false, true};
    const hm_iq_lattice *lat = hm_iq_lattice_get(HM_IQ_LAT_IQ3XXS);
    float scales[8], weight[32], waux[32], xval[32];
    int8_t L[32];
    uint8_t signs7[4];
    uint8_t q3[96];
    memset(q3, 0, sizeof q3);
    y->d = hm_f32_to_fp16(0.f);
    float max_scale = 0;
    const float sigma2 = 2 * iq_sumx2(xbl) / HM_QK_K;
    for (int ib = 0; ib < 8; ib++) {
        const float *xb = xbl + 32 * ib;
        if (qwb) iq_weights(xb, qwb + 32 * ib, sigma2, 32, weight);
        else
            for (int i = 0; i < 32; i++) weight[i] = xb[i] * xb[i];
        iq_sqrt(weight, 32, waux);
        iq_signs_out(xb, weight, 32, xval, signs7);
        float max = iq_fmax(xval, 32);
        memset(L, 0, 32);
        if (max < 1e-8f) {
            scales[ib] = 0;
            continue;
        }
        float scale = iq_scale_search(lat, &search, xval, weight, waux, max, L);
        if (scale < 0) {
            scale = -scale;
            for (int k = 0; k < 4; k++) signs7[k] = (uint8_t)(~signs7[k] & 127);
        }
        for (int k = 0; k < 8; k++) q3[8 * ib + k] = (uint8_t)lat_index(lat, L + 4 * k);
        const uint32_t ss = (uint32_t)signs7[0] | (uint32_t)signs7[1] << 7 | (uint32_t)signs7[2] << 14 |
                            (uint32_t)signs7[3] << 21;
        memcpy(q3 + 64 + 4 * ib, &ss, 4);
        scales[ib] = scale;
        max_scale = max_scale > scale ? max_scale : scale;
    }
    if (!max_scale) {
        memset(y->qs, 0, sizeof y->qs);
        return;
    }
    float d = max_scale / 31;
    y->d = hm_f32_to_fp16(d * 1.0125f);
    float id = 1 / d;
    for (int ib = 0; ib < 8; ib++) q3[64 + 4 * ib + 3] |= (uint8_t)(iq_scale4(id, scales[ib]) << 4);
    memcpy(y->qs, q3, sizeof q3);
}

static void quantize_block_iq3_s(const float *xbl, const float *qwb, hm_block_iq3_s *y) {
    static const iq_search search = {32, 8, 9, 0.2f, true, false};
    const hm_iq_lattice *lat = hm_iq_lattice_get(HM_IQ_LAT_IQ3S);
    float scales[8], weight[32], waux[32], xval[32];
    int8_t L[32];
    uint8_t signs[4];
    memset(y, 0, sizeof *y);
    float max_scale = 0;
    const float sigma2 = 2 * iq_sumx2(xbl) / HM_QK_K;
    /* ggml advances its qs / signs write positions only past sub-blocks it quantised: after an
     * all-zero sub-block the later ones' indices and signs land 8 and 4 bytes early (qh and the
     * scales are indexed by sub-block). Kept, for the same bytes. */
    int at = 0;
    for (int ib = 0; ib < 8; ib++) {
        const float *xb = xbl + 32 * ib;
        if (qwb) iq_weights(xb, qwb + 32 * ib, sigma2, 32, weight);
        else
            for (int i = 0; i < 32; i++) weight[i] = xb[i] * xb[i];
        iq_sqrt(weight, 32, waux);
        iq_signs_out8(xb, 32, xval, signs);
        float max = iq_fmax(xval, 32);
        memset(L, 0, 32);
        if (!max) {
            scales[ib] = 0;
            continue;
        }
        float scale = iq_scale_search(lat, &search, xval, weight, waux, max, L);
        if (scale < 0) {
            scale = -scale;
            for (int k = 0; k < 4; k++) signs[k] = (uint8_t)~signs[k];
        }
        for (int k = 0; k < 8; k++) {
            const int gi = lat_index(lat, L + 4 * k);
            y->qs[8 * at + k] = (uint8_t)(gi & 255);
            y->qh[ib] |= (uint8_t)((gi >> 8) << k);
        }
        memcpy(y->signs + 4 * at, signs, 4);
        at++;
        scales[ib] = scale;
        max_scale = max_scale > scale ? max_scale : scale;
    }
    if (!max_scale) return;
    float d = max_scale / 31;
    y->d = hm_f32_to_fp16(d * 1.033f);
    float id = 1 / d;
    for (int ib = 0; ib < 8; ib += 2)
        y->scales[ib / 2] = (uint8_t)(iq_scale4(id, scales[ib]) | iq_scale4(id, scales[ib + 1]) << 4);
}

/* ---------------------------------------------------------------- IQ1_S, IQ1_M
 * Levels -1, 0, 1 plus a shift of +-1/8: the exact weighted least-squares split of the sorted
 * values into three runs (every pair of boundaries), the groups then moved onto the grid. The
 * sort is libc's qsort over (value, index) records with a comparator on the value, as ggml sorts
 * them (so ties fall the same way with the same libc). */

typedef struct iq1_pair {
    float v;
    int32_t i;
} iq1_pair;

static int iq1_pair_cmp(const void *a, const void *b) {
    const float l = ((const iq1_pair *)a)->v, r = ((const iq1_pair *)b)->v;
    return l < r ? -1 : l > r ? 1 : 0;
}

static const float iq1_xp[3] = {-1 + HM_IQ1_DELTA, HM_IQ1_DELTA, 1 + HM_IQ1_DELTA};
static const float iq1_xm[3] = {-1 - HM_IQ1_DELTA, -HM_IQ1_DELTA, 1 - HM_IQ1_DELTA};

/* The grid point nearest to xb / scale (values xg[level]) among u's neighbours; levels into Lq. */
static int iq1_best_neighbour(const hm_iq_lattice *lat, const int8_t *Lq0, const float *xb, const float *weight,
                              float scale, const float *xg, int8_t *Lq) {
    int u = 0;
    for (int j = 0; j < 8; j++) u |= Lq0[j] << (2 * j);
    const uint16_t *nb = lat->nb + lat->off[u];
    float best_score = FLT_MAX;
    int best = nb[1];
    for (int j = 1; j <= nb[0]; j++) {
        const uint64_t p = lat->pos[nb[j]];
        float d2 = 0;
        for (int i = 0; i < 8; i++) {
            float q = xg[((int)((p >> (8 * i)) & 0xff) - 1) / 2];
            float w = weight[i];
            float diff = scale * q - xb[i];
            d2 += w * diff * diff;
        }
        if (d2 < best_score) {
            best_score = d2;
            best = nb[j];
        }
    }
    const uint64_t p = lat->pos[best];
    for (int i = 0; i < 8; i++) Lq[i] = (int8_t)((((p >> (8 * i)) & 0xff) - 1) / 2);
    return best;
}

/* Grid indices of the n/8 groups of levels L (shift tables xx[k]); the final scale refit when a
 * group was off the grid. */
static float iq1_on_grid(const hm_iq_lattice *lat, int n, const float *xb, const float *weight, float scale,
                         const float *const *xx, int8_t *L, uint16_t *index) {
    bool all_on_grid = true;
    for (int k = 0; k < n / 8; k++) {
        int u = 0;
        for (int j = 0; j < 8; j++) u |= L[8 * k + j] << (2 * j);
        int gi = lat->map[u];
        if (gi < 0) {
            all_on_grid = false;
            gi = iq1_best_neighbour(lat, L + 8 * k, xb + 8 * k, weight + 8 * k, scale, xx[k], L + 8 * k);
        }
        index[k] = (uint16_t)gi;
    }
    if (!all_on_grid) {
        float sumqx = 0, sumq2 = 0;
        for (int k = 0; k < n / 8; k++) {
            const uint64_t p = lat->pos[index[k]];
            for (int j = 0; j < 8; j++) {
                float w = weight[8 * k + j];
                float q = xx[k][((int)((p >> (8 * j)) & 0xff) - 1) / 2];
                sumqx += w * q * xb[8 * k + j];
                sumq2 += w * q * q;
            }
        }
        if (sumqx > 0 && sumq2 > 0) scale = sumqx / sumq2;
    }
    return scale;
}

static void quantize_block_iq1_s(const float *xbl, const float *qwb, hm_block_iq1_s *y) {
    const hm_iq_lattice *lat = hm_iq_lattice_get(HM_IQ_LAT_IQ1);
    float scales[8], weight[32], sumx[33], sumw[33];
    int8_t L[32], shifts[8];
    uint16_t index[4];
    iq1_pair pairs[32];
    y->d = hm_f32_to_fp16(0.f);
    memset(y->qs, 0, sizeof y->qs);
    memset(y->qh, 0, sizeof y->qh);
    float max_scale = 0;
    const float sigma2 = 2 * iq_sumx2(xbl) / HM_QK_K;
    for (int ib = 0; ib < 8; ib++) {
        const float *xb = xbl + 32 * ib;
        iq_weights(xb, qwb + 32 * ib, sigma2, 32, weight);
        float max = fabsf(xb[0]);
        for (int i = 1; i < 32; i++) max = max > fabsf(xb[i]) ? max : fabsf(xb[i]);
        if (max < 1e-12f) {
            scales[ib] = 0;
            shifts[ib] = 1;
            memset(L, 1, 32);
            continue;
        }
        for (int j = 0; j < 32; j++) pairs[j] = (iq1_pair){xb[j], j};
        qsort(pairs, 32, sizeof pairs[0], iq1_pair_cmp);
        sumx[0] = sumw[0] = 0;
        for (int j = 0; j < 32; j++) {
            const int i = pairs[j].i;
            sumx[j + 1] = sumx[j] + weight[i] * xb[i];
            sumw[j + 1] = sumw[j] + weight[i];
        }
        float best_score = -FLT_MAX, scale = max;
        int besti1 = -1, besti2 = -1, best_shift = 0;
        for (int i1 = 0; i1 <= 32; i1++) {
            for (int i2 = i1; i2 <= 32; i2++) {
                for (int sh = 1; sh >= -1; sh -= 2) {
                    const float *xs = sh == 1 ? iq1_xp : iq1_xm;
                    float sumqx = (sumx[i1] - sumx[0]) * xs[0] + (sumx[i2] - sumx[i1]) * xs[1] + (sumx[32] - sumx[i2]) * xs[2];
                    float sumq2 = (sumw[i1] - sumw[0]) * xs[0] * xs[0] + (sumw[i2] - sumw[i1]) * xs[1] * xs[1] +
                                  (sumw[32] - sumw[i2]) * xs[2] * xs[2];
                    if (sumq2 > 0 && sumqx * sumqx > best_score * sumq2) {
                        scale = sumqx / sumq2;
                        best_score = scale * sumqx;
                        besti1 = i1;
                        besti2 = i2;
                        best_shift = sh;
                    }
                }
            }
        }
        if (besti1 < 0 || besti2 < 0 || best_shift == 0) {
            scales[ib] = 0;
            shifts[ib] = 1;
            memset(L, 1, 32);
            continue;
        }
        for (int j = 0; j < 32; j++) L[pairs[j].i] = (int8_t)(j < besti1 ? 0 : j < besti2 ? 1 : 2);
        if (scale < 0) {
            for (int j = 0; j < 32; j++) L[j] = (int8_t)(2 - L[j]);
            scale = -scale;
            best_shift = -best_shift;
        }
        const float *xx = best_shift == 1 ? iq1_xp : iq1_xm;
        const float *const xk[4] = {xx, xx, xx, xx};
        scale = iq1_on_grid(lat, 32, xb, weight, scale, xk, L, index);
        uint16_t h = 0;
        for (int k = 0; k < 4; k++) {
            y->qs[4 * ib + k] = (uint8_t)(index[k] & 255);
            h |= (uint16_t)((index[k] >> 8) << (3 * k));
        }
        y->qh[ib] = h;
        scales[ib] = scale;
        shifts[ib] = (int8_t)best_shift;
        max_scale = max_scale > scale ? max_scale : scale;
    }
    if (!max_scale) return;
    float d = max_scale / 15;
    y->d = hm_f32_to_fp16(d * 1.125f);
    float id = 1 / d;
    for (int ib = 0; ib < 8; ib++) {
        int l = iq_imax(0, iq_imin(7, iq_round(0.5f * (id * scales[ib] - 1))));
        if (shifts[ib] == -1) l |= 8;
        y->qh[ib] |= (uint16_t)(l << 12);
    }
}

/* IQ1_M: per 16 elements two groups, each with its own shift sign: k = 0..3 codes the pair
 * (first group +/-, second group +/-) as 0: ++, 1: +-, 2: -+, 3: --. */
static void quantize_block_iq1_m(const float *xbl, const float *qwb, hm_block_iq1_m *y) {
    static const uint8_t masks[4] = {0x00, 0x80, 0x08, 0x88};
    const hm_iq_lattice *lat = hm_iq_lattice_get(HM_IQ_LAT_IQ1);
    float scales[16], weight[16];
    int8_t L[16], shifts[16];
    uint16_t index[2];
    iq1_pair pairs[16];
    float sumqx[4], sumq2[4];
    memset(y, 0, sizeof *y);
    float max_scale = 0;
    const float sigma2 = 2 * iq_sumx2(xbl) / HM_QK_K;
    for (int ib = 0; ib < 16; ib++) {
        const float *xb = xbl + 16 * ib;
        if (qwb) iq_weights(xb, qwb + 16 * ib, sigma2, 16, weight);
        else
            for (int i = 0; i < 16; i++) weight[i] = xb[i] * xb[i];
        float max = fabsf(xb[0]);
        for (int i = 1; i < 16; i++) max = max > fabsf(xb[i]) ? max : fabsf(xb[i]);
        if (max < 1e-7f) {
            scales[ib] = 0;
            shifts[ib] = 0;
            memset(L, 1, 16);
            continue;
        }
        for (int j = 0; j < 16; j++) pairs[j] = (iq1_pair){xb[j], j};
        qsort(pairs, 16, sizeof pairs[0], iq1_pair_cmp);
        float best_score = -FLT_MAX, scale = max;
        int besti1 = -1, besti2 = -1, best_k = -1;
        for (int i1 = 0; i1 <= 16; i1++) {
            for (int i2 = i1; i2 <= 16; i2++) {
                memset(sumqx, 0, sizeof sumqx);
                memset(sumq2, 0, sizeof sumq2);
                for (int j = 0; j < 16; j++) {
                    const int i = pairs[j].i, lv = j < i1 ? 0 : j < i2 ? 1 : 2;
                    const float p = iq1_xp[lv], m = iq1_xm[lv];
                    /* the first group's shift is k's high bit, the second's its low bit */
                    const float a1 = p, a2 = i < 8 ? p : m, a3 = i < 8 ? m : p, a4 = m;
                    sumqx[0] += weight[i] * a1 * xb[i];
                    sumqx[1] += weight[i] * a2 * xb[i];
                    sumqx[2] += weight[i] * a3 * xb[i];
                    sumqx[3] += weight[i] * a4 * xb[i];
                    sumq2[0] += weight[i] * a1 * a1;
                    sumq2[1] += weight[i] * a2 * a2;
                    sumq2[2] += weight[i] * a3 * a3;
                    sumq2[3] += weight[i] * a4 * a4;
                }
                for (int k = 0; k < 4; k++) {
                    if (sumq2[k] > 0 && sumqx[k] * sumqx[k] > best_score * sumq2[k]) {
                        scale = sumqx[k] / sumq2[k];
                        best_score = scale * sumqx[k];
                        besti1 = i1;
                        besti2 = i2;
                        best_k = k;
                    }
                }
            }
        }
        if (besti1 < 0 || besti2 < 0 || best_k < 0) {
            scales[ib] = 0;
            shifts[ib] = 0;
            memset(L, 1, 16);
            continue;
        }
        for (int j = 0; j < 16; j++) L[pairs[j].i] = (int8_t)(j < besti1 ? 0 : j < besti2 ? 1 : 2);
        if (scale < 0) {
            for (int j = 0; j < 16; j++) L[j] = (int8_t)(2 - L[j]);
            scale = -scale;
            best_k = 3 - best_k;
        }
        const float *const xk[2] = {best_k < 2 ? iq1_xp : iq1_xm, best_k % 2 == 0 ? iq1_xp : iq1_xm};
        scale = iq1_on_grid(lat, 16, xb, weight, scale, xk, L, index);
        y->qs[2 * ib] = (uint8_t)(index[0] & 255);
        y->qs[2 * ib + 1] = (uint8_t)(index[1] & 255);
        y->qh[ib] = (uint8_t)((index[0] >> 8) | ((index[1] >> 8) << 4));
        scales[ib] = scale;
        shifts[ib] = (int8_t)best_k;
        max_scale = max_scale > scale ? max_scale : scale;
    }
    if (!max_scale) return;
    uint16_t sc[4] = {0, 0, 0, 0};
    float d = max_scale / 15;
    float id = 1 / d;
    float sumqx_f = 0, sumq2_f = 0;
    for (int ib = 0; ib < 16; ib++) {
        const int l = iq_imax(0, iq_imin(7, iq_round(0.5f * (id * scales[ib] - 1))));
        sc[ib / 4] |= (uint16_t)(l << (3 * (ib % 4)));
        y->qh[ib] |= masks[shifts[ib]];
        const float *xb = xbl + 16 * ib;
        if (qwb) iq_weights(xb, qwb + 16 * ib, sigma2, 16, weight);
        else
            for (int i = 0; i < 16; i++) weight[i] = xb[i] * xb[i];
        for (int k = 0; k < 2; k++) {
            const float *xx = k == 0 ? (shifts[ib] < 2 ? iq1_xp : iq1_xm) : (shifts[ib] % 2 == 0 ? iq1_xp : iq1_xm);
            const uint64_t p = lat->pos[y->qs[2 * ib + k] + ((y->qh[ib] << (8 - 4 * k)) & 0x700)];
            for (int j = 0; j < 8; j++) {
                float w = weight[8 * k + j];
                float q = xx[((int)((p >> (8 * j)) & 0xff) - 1) / 2] * (2 * l + 1);
                sumqx_f += w * q * xb[8 * k + j];
                sumq2_f += w * q * q;
            }
        }
    }
    if (sumq2_f > 0) d = sumqx_f / sumq2_f;
    const uint16_t dh = hm_f32_to_fp16(d * 1.1125f);
    sc[0] |= (uint16_t)((dh & 0x000f) << 12);
    sc[1] |= (uint16_t)((dh & 0x00f0) << 8);
    sc[2] |= (uint16_t)((dh & 0x0f00) << 4);
    sc[3] |= (uint16_t)(dh & 0xf000);
    for (int w = 0; w < 4; w++) {
        y->scales[2 * w] = (uint8_t)sc[w];
        y->scales[2 * w + 1] = (uint8_t)(sc[w] >> 8);
    }
}

/* ---------------------------------------------------------------- entry points */

bool hm_quant_iq_quantize(int t, const float *src, void *dst, int64_t nrow, int64_t n_per_row, const float *qw) {
    if (n_per_row % HM_QK_K) return false;
    const bool needs_weights = t == HM_TYPE_IQ2_XXS || t == HM_TYPE_IQ2_XS || t == HM_TYPE_IQ1_S;
    switch (t) {
    case HM_TYPE_IQ2_XXS: case HM_TYPE_IQ2_XS: case HM_TYPE_IQ2_S: case HM_TYPE_IQ3_XXS: case HM_TYPE_IQ3_S:
    case HM_TYPE_IQ1_S: case HM_TYPE_IQ1_M: break;
    default: return false;
    }
    float *ones = NULL;
    if (!qw && needs_weights) {
        ones = malloc(sizeof(float) * (size_t)n_per_row);
        if (!ones) return false;
        for (int64_t i = 0; i < n_per_row; i++) ones[i] = 1.0f;
        qw = ones;
    }
    const int64_t nb = n_per_row / HM_QK_K;
    const size_t ts = hm_type_get(t)->type_size;
    for (int64_t r = 0; r < nrow; r++) {
        for (int64_t b = 0; b < nb; b++) {
            const float *xb = src + r * n_per_row + HM_QK_K * b, *wb = qw ? qw + HM_QK_K * b : NULL;
            void *yb = (uint8_t *)dst + (size_t)(r * nb + b) * ts;
            switch (t) {
            case HM_TYPE_IQ2_XXS: quantize_block_iq2_xxs(xb, wb, yb); break;
            case HM_TYPE_IQ2_XS: quantize_block_iq2_xs(xb, wb, yb); break;
            case HM_TYPE_IQ2_S: quantize_block_iq2_s(xb, wb, yb); break;
            case HM_TYPE_IQ3_XXS: quantize_block_iq3_xxs(xb, wb, yb); break;
            case HM_TYPE_IQ3_S: quantize_block_iq3_s(xb, wb, yb); break;
            case HM_TYPE_IQ1_S: quantize_block_iq1_s(xb, wb, yb); break;
            default: quantize_block_iq1_m(xb, wb, yb); break;
            }
        }
    }
    free(ones);
    return true;
}

#define IQ_REF(T, ID)                                                                                 \
    void hm_from_float_##T##_ref(const float *src, void *dst, int64_t n) {                            \
        hm_quant_iq_quantize(ID, src, dst, 1, n, NULL);                                               \
    }
IQ_REF(iq2_xxs, HM_TYPE_IQ2_XXS)
IQ_REF(iq2_xs, HM_TYPE_IQ2_XS)
IQ_REF(iq2_s, HM_TYPE_IQ2_S)
IQ_REF(iq3_xxs, HM_TYPE_IQ3_XXS)
IQ_REF(iq3_s, HM_TYPE_IQ3_S)
IQ_REF(iq1_s, HM_TYPE_IQ1_S)
IQ_REF(iq1_m, HM_TYPE_IQ1_M)
