/* quant_lowbit_avx512.c - AVX-512 variants of the low-bit family (placeholder). */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include "quant_lowbit_impl.h"
void hm_lowbit_register_avx512(hm_type_traits *table) { (void)table; }
#endif
