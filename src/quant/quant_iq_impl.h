/* quant_iq_impl.h - internals of the grid-based i-quant family (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
 * IQ3_S, IQ1_S, IQ1_M): block layouts bit-exact with ggml-common.h, the lattice tables
 * (quant_iq_grids.c), the sign decoding and the SIMD entry points the family's register function
 * (quant_iq.c) installs.
 *
 * Every type works on super-blocks of HM_QK_K = 256 elements made of 32 groups of 8 grid points;
 * the dot partner is Q8_K. A group's magnitudes come from one grid entry, its signs (IQ2/IQ3) from
 * 7 stored bits whose 8th is the parity (an even number of minus signs), IQ1's values are
 * {-1, 0, 1} + a per-32 shift of +-1/8. */
#ifndef HM_QUANT_IQ_IMPL_H
#define HM_QUANT_IQ_IMPL_H

#include <stdint.h>

#include "quant.h"
#include "quant_k_impl.h"

/* The lattice tables (values in quant_iq_grids.h). */
extern const uint64_t hm_iq2xxs_grid[256];
extern const uint64_t hm_iq2xs_grid[512];
extern const uint64_t hm_iq2s_grid[1024];
extern const uint32_t hm_iq3xxs_grid[256];
extern const uint32_t hm_iq3s_grid[512];
extern const uint64_t hm_iq1s_grid[2048];

#define HM_IQ1_DELTA 0.125f

/* iq2_xxs: per 32 elements (ib) two words qs[4ib], qs[4ib+1] read as aux0, aux1: the bytes of
 * aux0 index hm_iq2xxs_grid for the 4 groups of 8; aux1 bits 7l..7l+6 are group l's 7 sign bits,
 * bits 28..31 the scale s; value = d * (0.5 + s) * 0.25 * grid * sign. */
typedef struct hm_block_iq2_xxs {
    uint16_t d;
    uint16_t qs[HM_QK_K / 8];
} hm_block_iq2_xxs;

/* iq2_xs: qs[4ib + l] = grid index (9 bits) | 7 sign bits << 9; scales[ib] low nibble for groups
 * 0-1, high nibble for groups 2-3 (value scale d * (0.5 + s) * 0.25). */
typedef struct hm_block_iq2_xs {
    uint16_t d;
    uint16_t qs[HM_QK_K / 8];
    uint8_t scales[HM_QK_K / 32];
} hm_block_iq2_xs;

/* iq2_s: grid index (10 bits) of group 4ib + l = qs[4ib + l] | bits 2l..2l+1 of qh[ib] << 8;
 * its 8 explicit sign bits are qs[32 + 4ib + l]; scales as iq2_xs. */
typedef struct hm_block_iq2_s {
    uint16_t d;
    uint8_t qs[HM_QK_K / 4];
    uint8_t qh[HM_QK_K / 32];
    uint8_t scales[HM_QK_K / 32];
} hm_block_iq2_s;

/* iq3_xxs: qs[0..63] index hm_iq3xxs_grid, 4 elements each (group l of sub-block ib: entries
 * 8ib + 2l and 8ib + 2l + 1); then per ib a word: 7 sign bits per group, scale s in bits 28..31;
 * value = d * (0.5 + s) * 0.5 * grid * sign. */
typedef struct hm_block_iq3_xxs {
    uint16_t d;
    uint8_t qs[3 * HM_QK_K / 8];
} hm_block_iq3_xxs;

/* iq3_s: grid index (9 bits) of half-group k (0..63) = qs[k] | bit k%8 of qh[k/8] << 8; signs
 * explicit, 8 per group in signs[]; scales[ib/2] nibble ib%2 = s, value = d * (1 + 2s) * grid *
 * sign. */
typedef struct hm_block_iq3_s {
    uint16_t d;
    uint8_t qs[HM_QK_K / 4];
    uint8_t qh[HM_QK_K / 32];
    uint8_t signs[HM_QK_K / 8];
    uint8_t scales[HM_QK_K / 64];
} hm_block_iq3_s;

/* iq1_s: grid index (11 bits) of group 4ib + l = qs[4ib + l] | bits 3l..3l+2 of qh[ib] << 8;
 * qh[ib] bits 12..14 = s, bit 15 = the shift's sign; value = d * (2s + 1) * (grid +- 1/8). */
typedef struct hm_block_iq1_s {
    uint16_t d;
    uint8_t qs[HM_QK_K / 8];
    uint16_t qh[HM_QK_K / 32];
} hm_block_iq1_s;

/* iq1_m: no d field: the fp16 super-scale is the top nibbles of the four scale words
 * (sc[0] >> 12 | sc[1] >> 8 & 0xf0 | ...). Group 4ib + l: index qs[4ib + l] | 3 bits of
 * qh[2ib + l/2] (low nibble for even l, high for odd) << 8, bit 3 of that nibble the shift's sign;
 * 3-bit scales: word sc[ib/2] bits 6(ib%2) .. +2 for groups 0-1, +3 .. +5 for groups 2-3. */
typedef struct hm_block_iq1_m {
    uint8_t qs[HM_QK_K / 8];
    uint8_t qh[HM_QK_K / 16];
    uint8_t scales[HM_QK_K / 32];
} hm_block_iq1_m;

_Static_assert(sizeof(hm_block_iq2_xxs) == 66, "iq2_xxs block is 66 bytes");
_Static_assert(sizeof(hm_block_iq2_xs) == 74, "iq2_xs block is 74 bytes");
_Static_assert(sizeof(hm_block_iq2_s) == 82, "iq2_s block is 82 bytes");
_Static_assert(sizeof(hm_block_iq3_xxs) == 98, "iq3_xxs block is 98 bytes");
_Static_assert(sizeof(hm_block_iq3_s) == 110, "iq3_s block is 110 bytes");
_Static_assert(sizeof(hm_block_iq1_s) == 50, "iq1_s block is 50 bytes");
_Static_assert(sizeof(hm_block_iq1_m) == 56, "iq1_m block is 56 bytes");

/* The 8 signs of a group from its 7 stored bits: bit 7 makes the count of minus signs even. */
static inline uint8_t hm_iq_signs7(uint32_t s7) {
    return (uint8_t)(s7 | (uint32_t)(__builtin_popcount(s7) & 1) << 7);
}

/* The iq1_m super-scale (fp16 bits) from its four scale words. */
static inline uint16_t hm_iq1m_d(const uint8_t scales[8]) {
    const uint16_t s0 = (uint16_t)(scales[0] | scales[1] << 8), s1 = (uint16_t)(scales[2] | scales[3] << 8),
                   s2 = (uint16_t)(scales[4] | scales[5] << 8), s3 = (uint16_t)(scales[6] | scales[7] << 8);
    return (uint16_t)((s0 >> 12) | ((s1 >> 8) & 0x00f0) | ((s2 >> 4) & 0x0f00) | (s3 & 0xf000));
}

/* ---- the lattices the quantisers search (quant_iq_lattice.c) ----
 * A grid as level patterns: a grid point of dim elements (8, or 4 for IQ3) has levels l per
 * element (0..2 for IQ2/IQ1, 0..7 for IQ3), digit i of its pattern u = sum l_i << (bits * i).
 * pos[k] holds 2l + 1 per element (byte i = element i), map[u] the grid index of pattern u or -1,
 * and for an off-grid u, nb + off[u] its neighbour list: a count, then the grid points at the
 * nwant smallest squared distances of 2l + 1, nearest first and ties by index (the order ggml's
 * iq2xs_init_impl / iq3xs_init_impl sort them in). Built once on first use, then read-only. */
typedef struct hm_iq_lattice {
    int n, dim, bits;
    uint64_t *pos;
    int *map;
    int *off;
    uint16_t *nb;
} hm_iq_lattice;

enum hm_iq_lat { HM_IQ_LAT_IQ2XXS, HM_IQ_LAT_IQ2XS, HM_IQ_LAT_IQ2S, HM_IQ_LAT_IQ1, HM_IQ_LAT_IQ3XXS, HM_IQ_LAT_IQ3S,
                 HM_IQ_LAT_COUNT };

const hm_iq_lattice *hm_iq_lattice_get(enum hm_iq_lat which);

/* Reference quantisers (quant_iq_quantize.c): hm_quant_iq_quantize without an importance vector
 * (ggml's own no-imatrix weighting for IQ2_S, IQ3_XXS, IQ3_S, IQ1_M; uniform importance for the
 * types ggml only quantises with one: IQ2_XXS, IQ2_XS, IQ1_S). */
void hm_from_float_iq2_xxs_ref(const float *src, void *dst, int64_t n);
void hm_from_float_iq2_xs_ref(const float *src, void *dst, int64_t n);
void hm_from_float_iq2_s_ref(const float *src, void *dst, int64_t n);
void hm_from_float_iq3_xxs_ref(const float *src, void *dst, int64_t n);
void hm_from_float_iq3_s_ref(const float *src, void *dst, int64_t n);
void hm_from_float_iq1_s_ref(const float *src, void *dst, int64_t n);
void hm_from_float_iq1_m_ref(const float *src, void *dst, int64_t n);

/* SIMD variants (quant_iq_avx2.c, quant_iq_avx512.c), registered by quant_iq.c where compiled. */
void hm_vec_dot_iq2_xxs_avx2(int64_t n, float *out, const void *x, const void *y);
void hm_vec_dot_iq2_xs_avx2(int64_t n, float *out, const void *x, const void *y);
void hm_vec_dot_iq2_s_avx2(int64_t n, float *out, const void *x, const void *y);
void hm_vec_dot_iq3_xxs_avx2(int64_t n, float *out, const void *x, const void *y);
void hm_vec_dot_iq3_s_avx2(int64_t n, float *out, const void *x, const void *y);
void hm_vec_dot_iq1_s_avx2(int64_t n, float *out, const void *x, const void *y);
void hm_vec_dot_iq1_m_avx2(int64_t n, float *out, const void *x, const void *y);
/* AVX-512 variants (quant_iq_avx512.c), where compiled (F+BW+VL). */
void hm_vec_dot_iq2_xxs_avx512(int64_t n, float *out, const void *x, const void *y);
void hm_vec_dot_iq2_xs_avx512(int64_t n, float *out, const void *x, const void *y);
void hm_vec_dot_iq2_s_avx512(int64_t n, float *out, const void *x, const void *y);
void hm_vec_dot_iq3_xxs_avx512(int64_t n, float *out, const void *x, const void *y);
void hm_vec_dot_iq3_s_avx512(int64_t n, float *out, const void *x, const void *y);
void hm_vec_dot_iq1_s_avx512(int64_t n, float *out, const void *x, const void *y);
void hm_vec_dot_iq1_m_avx512(int64_t n, float *out, const void *x, const void *y);

#endif
