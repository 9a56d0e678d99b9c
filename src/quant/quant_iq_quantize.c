/* quant_iq_quantize.c - importance-weighted quantisers of the grid i-quants: the same bytes as
 * ggml's quantize_iq2_xxs / quantize_iq2_xs for the same floats and importance vector.
 *
 * A group of 8 magnitudes is quantised to levels l in {0, 1, 2} (value 2l + 1 times the scale);
 * a level pattern that is not a grid point is replaced by the best of its precomputed neighbours
 * (the grid points at the nwant smallest squared distances, in order of distance then index, as
 * ggml's iq2xs_init_impl lists them). The signs are taken out first, the element of least weighted
 * magnitude flipped when a group has an odd count of negatives (the 7-bit sign code implies even).
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
#define IQ2_KMAP_SIZE 43692 /* level patterns: 2 bits per element, 8 elements, digits <= 2 */

static inline int iq_round(float v) {
    float t = v + 12582912.f;
    int32_t i;
    memcpy(&i, &t, 4);
    return (i & 0x007fffff) - 0x00400000;
}
static inline int iq_imin(int a, int b) { return a < b ? a : b; }
static inline int iq_imax(int a, int b) { return a > b ? a : b; }

/* ---------------------------------------------------------------- the 2-bit lattice search */

/* A grid as level patterns: pos[k] holds 2l + 1 per element, map[u] the grid index of level
 * pattern u (-1 if none), nb[off[u]] the neighbour list of an off-grid u: count, then indices. */
typedef struct iq2_lattice {
    int n;
    uint64_t *pos;
    int *map;
    int *off;
    uint16_t *nb;
} iq2_lattice;

enum { IQ2_LAT_256, IQ2_LAT_512, IQ2_LAT_1024, IQ2_LAT_IQ1, IQ2_LAT_COUNT };
static iq2_lattice lattices[IQ2_LAT_COUNT];
static pthread_once_t lattice_once[IQ2_LAT_COUNT] = {PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT,
                                                     PTHREAD_ONCE_INIT};

/* Level (0..2) of a grid byte: IQ2 grids hold 8, 25, 43; the IQ1 grid int8 -1, 0, 1. */
static int grid_level(int which, uint8_t b) {
    if (which == IQ2_LAT_IQ1) return (int)(int8_t)b + 1;
    return b == 8 ? 0 : b == 25 ? 1 : 2;
}

static void lattice_build(int which) {
    static const struct { const uint64_t *grid; int n, nwant; } src[IQ2_LAT_COUNT] = {
        {hm_iq2xxs_grid, 256, 2}, {hm_iq2xs_grid, 512, 2}, {hm_iq2s_grid, 1024, 1}, {hm_iq1s_grid, 2048, 3}};
    iq2_lattice *L = &lattices[which];
    const int n = src[which].n, nwant = src[which].nwant;
    L->n = n;
    L->pos = malloc(sizeof(uint64_t) * (size_t)n);
    L->map = malloc(sizeof(int) * IQ2_KMAP_SIZE);
    L->off = malloc(sizeof(int) * IQ2_KMAP_SIZE);
    int *d2 = malloc(sizeof(int) * (size_t)n);
    if (!L->pos || !L->map || !L->off || !d2) abort(); /* a few hundred KiB at first use */
    for (int i = 0; i < IQ2_KMAP_SIZE; i++) L->map[i] = -1;
    for (int k = 0; k < n; k++) {
        uint64_t p = 0;
        int u = 0;
        for (int i = 0; i < 8; i++) {
            const int l = grid_level(which, (uint8_t)(src[which].grid[k] >> (8 * i)));
            p |= (uint64_t)(2 * l + 1) << (8 * i);
            u |= l << (2 * i);
        }
        L->pos[k] = p;
        L->map[u] = k;
    }
    /* neighbour lists: every grid point at one of the nwant smallest distances, nearest first,
     * ties by index */
    size_t cap = 0, used = 0;
    L->nb = NULL;
    for (int u = 0; u < IQ2_KMAP_SIZE; u++) {
        L->off[u] = -1;
        if (L->map[u] >= 0) continue;
        int dist[3] = {INT32_MAX, INT32_MAX, INT32_MAX};
        for (int k = 0; k < n; k++) {
            int s = 0;
            for (int i = 0; i < 8; i++) {
                const int diff = (int)((L->pos[k] >> (8 * i)) & 0xff) - (2 * ((u >> (2 * i)) & 3) + 1);
                s += diff * diff;
            }
            d2[k] = s;
            /* keep the nwant smallest distinct distances, ascending */
            for (int w = 0; w < nwant; w++) {
                if (s == dist[w]) break;
                if (s < dist[w]) {
                    for (int v = nwant - 1; v > w; v--) dist[v] = dist[v - 1];
                    dist[w] = s;
                    break;
                }
            }
        }
        if (used + (size_t)n + 1 > cap) {
            cap = cap ? 2 * cap : 65536;
            L->nb = realloc(L->nb, sizeof(uint16_t) * cap);
            if (!L->nb) abort();
        }
        L->off[u] = (int)used;
        size_t cnt = used + 1;
        for (int w = 0; w < nwant && dist[w] != INT32_MAX; w++)
            for (int k = 0; k < n; k++)
                if (d2[k] == dist[w]) L->nb[cnt++] = (uint16_t)k;
        L->nb[used] = (uint16_t)(cnt - used - 1);
        used = cnt;
    }
    free(d2);
}

static void build_256(void) { lattice_build(IQ2_LAT_256); }
static void build_512(void) { lattice_build(IQ2_LAT_512); }
static void build_1024(void) { lattice_build(IQ2_LAT_1024); }
static void build_iq1(void) { lattice_build(IQ2_LAT_IQ1); }

static const iq2_lattice *lattice_get(int which) {
    static void (*const build[IQ2_LAT_COUNT])(void) = {build_256, build_512, build_1024, build_iq1};
    pthread_once(&lattice_once[which], build[which]);
    return &lattices[which];
}

/* The grid point nearest (weighted) to xval / scale among u's neighbours; its levels into Lq. */
static int iq2_best_neighbour(const iq2_lattice *lat, int u, const float *xval, const float *weight, float scale,
                              int8_t *Lq) {
    const uint16_t *nb = lat->nb + lat->off[u];
    float best_d2 = FLT_MAX;
    int best = -1;
    for (int j = 1; j <= nb[0]; j++) {
        const uint64_t p = lat->pos[nb[j]];
        float d2 = 0;
        for (int i = 0; i < 8; i++) {
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
    for (int i = 0; i < 8; i++) Lq[i] = (int8_t)((((p >> (8 * i)) & 0xff) - 1) / 2);
    return best;
}

/* Levels of 8 magnitudes at inverse scale id, moved onto the grid; returns true if they were
 * on it already. */
static bool iq2_group_levels(const iq2_lattice *lat, const float *xval, const float *waux, float id, float scale,
                             int8_t *Lq) {
    int u = 0;
    for (int i = 0; i < 8; i++) {
        const int l = iq_imax(0, iq_imin(2, iq_round(0.5f * (id * xval[i] - 1))));
        Lq[i] = (int8_t)l;
        u |= l << (2 * i);
    }
    if (lat->map[u] >= 0) return true;
    iq2_best_neighbour(lat, u, xval, waux, scale, Lq);
    return false;
}

static int iq2_grid_index(const iq2_lattice *lat, const int8_t *Lq) {
    int u = 0;
    for (int i = 0; i < 8; i++) u |= Lq[i] << (2 * i);
    return lat->map[u];
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

/* weight[i] = qw[i] * sqrt(sigma2 + x^2) and its square root, over n elements. */
static void iq_weights(const float *xb, const float *qw, float sigma2, int n, float *weight, float *waux) {
    for (int i = 0; i < n; i++) weight[i] = qw[i] * sqrtf(sigma2 + xb[i] * xb[i]);
    for (int i = 0; i < n; i++) waux[i] = sqrtf(weight[i]);
}

static float iq_sigma2(const float *xbl) {
    float sumx2 = 0;
    for (int i = 0; i < HM_QK_K; i++) sumx2 += xbl[i] * xbl[i];
    return sumx2 / HM_QK_K;
}

/* ---------------------------------------------------------------- IQ2_XXS */

static void quantize_block_iq2_xxs(const iq2_lattice *lat, const float *xbl, const float *qwb, hm_block_iq2_xxs *y) {
    const int kMaxQ = 3;
    float scales[8], weight[32], waux[32], xval[32];
    int8_t L[32], Laux[32];
    uint8_t signs7[4];
    uint32_t q2[16];
    memset(q2, 0, sizeof q2);
    y->d = hm_f32_to_fp16(0.f);
    float max_scale = 0;
    const float sigma2 = iq_sigma2(xbl);
    for (int ib = 0; ib < 8; ib++) {
        const float *xb = xbl + 32 * ib;
        iq_weights(xb, qwb + 32 * ib, sigma2, 32, weight, waux);
        iq_signs_out(xb, weight, 32, xval, signs7);
        float max = xval[0];
        for (int i = 1; i < 32; i++) max = max > xval[i] ? max : xval[i];
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
            for (int k = 0; k < 4; k++) iq2_group_levels(lat, xval + 8 * k, waux + 8 * k, id, this_scale, Laux + 8 * k);
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
            for (int k = 0; k < 4; k++) iq2_group_levels(lat, xval + 8 * k, waux + 8 * k, id, scale, L + 8 * k);
            float sumqx, sumq2;
            iq2_sums(32, weight, xval, L, &sumqx, &sumq2);
            if (sumq2 > 0) scale = sumqx / sumq2;
        }
        if (scale < 0) {
            scale = -scale;
            for (int k = 0; k < 4; k++) signs7[k] = (uint8_t)(~signs7[k] & 127);
        }
        for (int k = 0; k < 4; k++) {
            const int gi = iq2_grid_index(lat, L + 8 * k);
            q2[2 * ib] |= (uint32_t)(gi < 0 ? 0 : gi) << (8 * k);
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
    for (int ib = 0; ib < 8; ib++) {
        const int l = iq_imax(0, iq_imin(15, iq_round(0.5f * (id * scales[ib] - 1))));
        q2[2 * ib + 1] |= (uint32_t)l << 28;
    }
    memcpy(y->qs, q2, sizeof q2);
}

/* ---------------------------------------------------------------- IQ2_XS */

static void quantize_block_iq2_xs(const iq2_lattice *lat, const float *xbl, const float *qwb, hm_block_iq2_xs *y) {
    const int kMaxQ = 3;
    float scales[16], weight[16], waux[16], xval[16];
    int8_t L[16], Laux[16];
    bool on_grid[2], on_grid_aux[2];
    uint8_t signs7[2];
    uint16_t q2[32];
    memset(q2, 0, sizeof q2);
    memset(y->scales, 0, sizeof y->scales);
    y->d = hm_f32_to_fp16(0.f);
    float max_scale = 0;
    const float sigma2 = iq_sigma2(xbl);
    for (int ib = 0; ib < 16; ib++) {
        const float *xb = xbl + 16 * ib;
        iq_weights(xb, qwb + 16 * ib, sigma2, 16, weight, waux);
        iq_signs_out(xb, weight, 16, xval, signs7);
        float max = xval[0];
        for (int i = 1; i < 16; i++) max = max > xval[i] ? max : xval[i];
        memset(L, 0, 16);
        if (max < IQ_GROUP_MAX_EPS) {
            scales[ib] = 0;
            continue;
        }
        float best = 0;
        float scale = max / (2 * kMaxQ - 1);
        on_grid[0] = on_grid[1] = true;
        for (int is = -9; is <= 9; is++) {
            float id = (2 * kMaxQ - 1 + is * 0.1f) / max;
            float this_scale = 1 / id;
            for (int k = 0; k < 2; k++)
                on_grid_aux[k] = iq2_group_levels(lat, xval + 8 * k, waux + 8 * k, id, this_scale, Laux + 8 * k);
            float sumqx, sumq2;
            iq2_sums(16, weight, xval, Laux, &sumqx, &sumq2);
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                scale = sumqx / sumq2;
                best = scale * sumqx;
                memcpy(L, Laux, 16);
                on_grid[0] = on_grid_aux[0];
                on_grid[1] = on_grid_aux[1];
            }
        }
        if ((!on_grid[0] || !on_grid[1]) && scale > 0) {
            float id = 1 / scale;
            for (int k = 0; k < 2; k++)
                if (!on_grid[k]) iq2_group_levels(lat, xval + 8 * k, waux + 8 * k, id, scale, L + 8 * k);
            float sumqx, sumq2;
            iq2_sums(16, weight, xval, L, &sumqx, &sumq2);
            if (sumq2 > 0) scale = sumqx / sumq2;
        }
        if (scale < 0) {
            scale = -scale;
            for (int k = 0; k < 2; k++) signs7[k] = (uint8_t)(~signs7[k] & 127);
        }
        for (int k = 0; k < 2; k++) {
            const int gi = iq2_grid_index(lat, L + 8 * k);
            q2[2 * ib + k] = (uint16_t)((gi < 0 ? 0 : gi) | signs7[k] << 9);
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
    for (int ib = 0; ib < 16; ib++) {
        const int l = iq_imax(0, iq_imin(15, iq_round(0.5f * (id * scales[ib] - 1))));
        if (ib % 2 == 0) y->scales[ib / 2] = (uint8_t)l;
        else y->scales[ib / 2] |= (uint8_t)(l << 4);
    }
    memcpy(y->qs, q2, sizeof q2);
}

/* ---------------------------------------------------------------- entry points */

/* Rows of one of the types here with importance qw[n_per_row] (NULL: uniform importance). */
bool hm_quant_iq_quantize(int t, const float *src, void *dst, int64_t nrow, int64_t n_per_row, const float *qw) {
    if (n_per_row % HM_QK_K) return false;
    float *ones = NULL;
    if (!qw) {
        ones = malloc(sizeof(float) * (size_t)n_per_row);
        if (!ones) return false;
        for (int64_t i = 0; i < n_per_row; i++) ones[i] = 1.0f;
        qw = ones;
    }
    const int64_t nb = n_per_row / HM_QK_K;
    bool ok = true;
    for (int64_t r = 0; r < nrow && ok; r++) {
        const float *x = src + r * n_per_row;
        for (int64_t b = 0; b < nb; b++) {
            const float *xb = x + HM_QK_K * b, *wb = qw + HM_QK_K * b;
            switch (t) {
            case HM_TYPE_IQ2_XXS:
                quantize_block_iq2_xxs(lattice_get(IQ2_LAT_256), xb, wb, (hm_block_iq2_xxs *)dst + r * nb + b);
                break;
            case HM_TYPE_IQ2_XS:
                quantize_block_iq2_xs(lattice_get(IQ2_LAT_512), xb, wb, (hm_block_iq2_xs *)dst + r * nb + b);
                break;
            default: ok = false; break;
            }
            if (!ok) break;
        }
    }
    free(ones);
    return ok;
}

void hm_from_float_iq2_xxs_ref(const float *src, void *dst, int64_t n) {
    hm_quant_iq_quantize(HM_TYPE_IQ2_XXS, src, dst, 1, n, NULL);
}
void hm_from_float_iq2_xs_ref(const float *src, void *dst, int64_t n) {
    hm_quant_iq_quantize(HM_TYPE_IQ2_XS, src, dst, 1, n, NULL);
}
