/* quant_iq_grids.c - the CPU's copies of the i-quant lattice tables (values: quant_iq_grids.h). */
#include "quant_iq_impl.h"

#define HM_IQ_TABLE(type, name, count) const type hm_##name[count] =
#include "quant_iq_grids.h"
