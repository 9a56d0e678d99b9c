/* quant_float.c - placeholder registration (being written). */
#include "quant_impl.h"
void hm_quant_register_float(hm_type_traits *table) { (void)table; }
