/* quant_q8_0.c - placeholder registration (being written). */
#include "quant_impl.h"
void hm_quant_register_q8_0(hm_type_traits *table) { (void)table; }
