/* quant_iq_lattice.c - the level-pattern lattices the i-quant quantisers search (see
 * quant_iq_impl.h): each grid's points as levels, the map from a level pattern to its grid point,
 * and the neighbour lists of the patterns that are not on the grid. Built once per grid on first
 * use (pthread_once), read-only afterwards. */
#include <pthread.h>
#include <stdlib.h>

#include "quant_iq_impl.h"

static hm_iq_lattice lattices[HM_IQ_LAT_COUNT];
static pthread_once_t once[HM_IQ_LAT_COUNT] = {PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT,
                                               PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT};

/* Level of element i of grid point k. */
static int grid_level(enum hm_iq_lat which, int k, int i) {
    switch (which) {
    case HM_IQ_LAT_IQ2XXS: case HM_IQ_LAT_IQ2XS: case HM_IQ_LAT_IQ2S: {
        const uint64_t g = which == HM_IQ_LAT_IQ2XXS ? hm_iq2xxs_grid[k] : which == HM_IQ_LAT_IQ2XS ? hm_iq2xs_grid[k]
                                                                                                      : hm_iq2s_grid[k];
        const int b = (int)((g >> (8 * i)) & 0xff); /* 8, 25, 43 */
        return b == 8 ? 0 : b == 25 ? 1 : 2;
    }
    case HM_IQ_LAT_IQ1: return (int)(int8_t)(uint8_t)(hm_iq1s_grid[k] >> (8 * i)) + 1; /* -1, 0, 1 */
    case HM_IQ_LAT_IQ3XXS: return ((int)((hm_iq3xxs_grid[k] >> (8 * i)) & 0xff) - 4) / 8; /* 4, 12, .., 60 */
    default: return ((int)((hm_iq3s_grid[k] >> (8 * i)) & 0xff) - 1) / 2; /* 1, 3, .., 15 */
    }
}

static void build(enum hm_iq_lat which) {
    static const struct { int n, dim, bits, nwant; } spec[HM_IQ_LAT_COUNT] = {
        {256, 8, 2, 2}, {512, 8, 2, 2}, {1024, 8, 2, 1}, {2048, 8, 2, 3}, {256, 4, 3, 2}, {512, 4, 3, 3}};
    hm_iq_lattice *L = &lattices[which];
    const int n = spec[which].n, dim = spec[which].dim, bits = spec[which].bits, nwant = spec[which].nwant;
    const int n_pat = 1 << (bits * dim), max_level = bits == 2 ? 2 : 7;
    L->n = n;
    L->dim = dim;
    L->bits = bits;
    L->pos = malloc(sizeof(uint64_t) * (size_t)n);
    L->map = malloc(sizeof(int) * (size_t)n_pat);
    L->off = malloc(sizeof(int) * (size_t)n_pat);
    int *d2 = malloc(sizeof(int) * (size_t)n);
    if (!L->pos || !L->map || !L->off || !d2) abort(); /* < 1 MiB, once */
    for (int u = 0; u < n_pat; u++) L->map[u] = L->off[u] = -1;
    for (int k = 0; k < n; k++) {
        uint64_t p = 0;
        int u = 0;
        for (int i = 0; i < dim; i++) {
            const int l = grid_level(which, k, i);
            p |= (uint64_t)(2 * l + 1) << (8 * i);
            u |= l << (bits * i);
        }
        L->pos[k] = p;
        L->map[u] = k;
    }
    size_t cap = 0, used = 0;
    L->nb = NULL;
    for (int u = 0; u < n_pat; u++) {
        if (L->map[u] >= 0) continue;
        bool reachable = true; /* the quantisers clamp levels to max_level */
        for (int i = 0; i < dim; i++) reachable &= ((u >> (bits * i)) & ((1 << bits) - 1)) <= max_level;
        if (!reachable) continue;
        int dist[3] = {INT32_MAX, INT32_MAX, INT32_MAX}; /* the nwant smallest distinct distances */
        for (int k = 0; k < n; k++) {
            int s = 0;
            for (int i = 0; i < dim; i++) {
                const int diff = (int)((L->pos[k] >> (8 * i)) & 0xff) - (2 * ((u >> (bits * i)) & ((1 << bits) - 1)) + 1);
                s += diff * diff;
            }
            d2[k] = s;
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
        size_t end = used + 1;
        for (int w = 0; w < nwant && dist[w] != INT32_MAX; w++)
            for (int k = 0; k < n; k++)
                if (d2[k] == dist[w]) L->nb[end++] = (uint16_t)k;
        L->nb[used] = (uint16_t)(end - used - 1);
        used = end;
    }
    free(d2);
}

static void build_0(void) { build(HM_IQ_LAT_IQ2XXS); }
static void build_1(void) { build(HM_IQ_LAT_IQ2XS); }
static void build_2(void) { build(HM_IQ_LAT_IQ2S); }
static void build_3(void) { build(HM_IQ_LAT_IQ1); }
static void build_4(void) { build(HM_IQ_LAT_IQ3XXS); }
static void build_5(void) { build(HM_IQ_LAT_IQ3S); }

const hm_iq_lattice *hm_iq_lattice_get(enum hm_iq_lat which) {
    static void (*const fn[HM_IQ_LAT_COUNT])(void) = {build_0, build_1, build_2, build_3, build_4, build_5};
    pthread_once(&once[which], fn[which]);
    return &lattices[which];
}
