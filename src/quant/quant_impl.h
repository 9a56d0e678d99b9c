/* quant_impl.h - internals shared inside quant/: block layouts and the registration hooks each
 * type family uses to fill its rows of the traits table.
 *
 * Families (one file per family and ISA):
 *   quant_float*.c  F32, F16, BF16
 *   quant_q8_0*.c   Q8_0 (also the activation partner of Q4_0 / Q5_0 / Q8_0 / MXFP4), Q4_0, Q5_0,
 *                   MXFP4
 *   quant_k*.c      Q8_K (activation partner of the K-quants and IQ4_XS), Q4_K, Q5_K, Q6_K, IQ4_XS
 *   quant_lowbit*.c Q8_1 (activation partner of Q4_1 / Q5_1), Q4_1, Q5_1, IQ4_NL, Q2_K, Q3_K
 *   quant_iq*.c     the grid i-quants IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M (Q8_K partner)
 * A register function fills the entries for its types: names/sizes, the scalar reference
 * functions, and each SIMD variant compiled in (guarded by __AVX2__ / __AVX512F__ etc.). */
#ifndef HM_QUANT_IMPL_H
#define HM_QUANT_IMPL_H

#include <string.h>

#include "quant.h"

void hm_quant_register_float(hm_type_traits *table);  /* F32 F16 BF16 */
void hm_quant_register_q8_0(hm_type_traits *table);   /* Q8_0 Q4_0 Q5_0 MXFP4 */
void hm_quant_register_k(hm_type_traits *table);      /* Q8_K Q4_K Q5_K Q6_K IQ4_XS */
void hm_quant_register_lowbit(hm_type_traits *table); /* Q8_1 Q4_1 Q5_1 IQ4_NL Q2_K Q3_K */
void hm_quant_register_iq(hm_type_traits *table);     /* IQ2_XXS IQ2_XS IQ2_S IQ3_XXS IQ3_S IQ1_S IQ1_M */

/* SIMD halves of the float and Q8_0 families: each fills vec_dot_isa / to_float_isa /
 * from_float_isa[its isa] for the family's types; called by the family's register function
 * only where compiled (quant_float_avx2.c etc.). */
void hm_quant_register_float_avx2(hm_type_traits *table);
void hm_quant_register_float_avx512(hm_type_traits *table);
void hm_quant_register_q8_0_avx2(hm_type_traits *table);
void hm_quant_register_q8_0_avx512(hm_type_traits *table);

/* ---- block layouts of the Q8_0 family, bit-exact with ggml-common.h ---- */
#define HM_QK8_0 32
#define HM_QK4_0 32
#define HM_QK5_0 32
#define HM_QK_MXFP4 32

/* q8_0: value = qs[i] * d. */
typedef struct hm_block_q8_0 {
    uint16_t d;           /* fp16 scale */
    int8_t qs[HM_QK8_0];
} hm_block_q8_0;

/* q4_0: qs[j] low nibble = element j, high nibble = element j + 16; value = (q - 8) * d. */
typedef struct hm_block_q4_0 {
    uint16_t d;           /* fp16 scale */
    uint8_t qs[HM_QK4_0 / 2];
} hm_block_q4_0;

/* q5_0: low four bits in qs as q4_0; qh holds the 32 fifth bits, element j at bit j of the
 * little-endian uint32 (qh[j / 8] bit j % 8); value = (q - 16) * d. */
typedef struct hm_block_q5_0 {
    uint16_t d;           /* fp16 scale */
    uint8_t qh[4];
    uint8_t qs[HM_QK5_0 / 2];
} hm_block_q5_0;

/* mxfp4: nibble order as q4_0; value = kvalues_mxfp4[q] * 2^(e - 128), where the table holds
 * twice the FP4 E2M1 values (so 2^(e-128) is half the E8M0 scale 2^(e-127), as ggml does). */
typedef struct hm_block_mxfp4 {
    uint8_t e;            /* E8M0 shared exponent */
    uint8_t qs[HM_QK_MXFP4 / 2];
} hm_block_mxfp4;

_Static_assert(sizeof(hm_block_q8_0) == 34, "q8_0 block is 34 bytes");
_Static_assert(sizeof(hm_block_q4_0) == 18, "q4_0 block is 18 bytes");
_Static_assert(sizeof(hm_block_q5_0) == 22, "q5_0 block is 22 bytes");
_Static_assert(sizeof(hm_block_mxfp4) == 17, "mxfp4 block is 17 bytes");

/* Doubled E2M1 values, indexed by the 4-bit code (bit 3 = sign). */
static const int8_t hm_kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* 2^(e-128) as a float: half the E8M0 scale (e = 0, 1 give the subnormals 2^-128, 2^-127;
 * e = 255 gives 2^127 — ggml does not treat it as NaN either). */
static inline float hm_e8m0_to_f32_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

#endif
