/* quant_lowbit_avx2.c - AVX2 variants of the low-bit family (placeholder while the scalar
 * reference is verified). */
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "quant_lowbit_impl.h"
void hm_lowbit_register_avx2(hm_type_traits *table) { (void)table; }
#endif
