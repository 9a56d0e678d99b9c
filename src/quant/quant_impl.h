/* quant_impl.h - internals shared inside quant/: block layouts and the registration hooks each
 * type family uses to fill its rows of the traits table.
 *
 * Families (one file per family and ISA):
 *   quant_float*.c  F32, F16, BF16
 *   quant_q8_0*.c   Q8_0 (also the activation partner of Q4_0 / Q8_0 / MXFP4), Q4_0, MXFP4
 *   quant_k*.c      Q8_K (activation partner of the K-quants and IQ4_XS), Q4_K, Q5_K, Q6_K, IQ4_XS
 * A register function fills the entries for its types: names/sizes, the scalar reference
 * functions, and each SIMD variant compiled in (guarded by __AVX2__ / __AVX512F__ etc.). */
#ifndef HM_QUANT_IMPL_H
#define HM_QUANT_IMPL_H

#include "quant.h"

void hm_quant_register_float(hm_type_traits *table);  /* F32 F16 BF16 */
void hm_quant_register_q8_0(hm_type_traits *table);   /* Q8_0 Q4_0 MXFP4 */
void hm_quant_register_k(hm_type_traits *table);      /* Q8_K Q4_K Q5_K Q6_K IQ4_XS */

#endif
