/* quant_k.c - placeholder registration (being written). */
#include "quant_impl.h"
void hm_quant_register_k(hm_type_traits *table) { (void)table; }
