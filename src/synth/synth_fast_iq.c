/* synth_fast_iq.c - the --fast-experts generators of the grid i-quants (see synth_fast.c): a
 * block is random bytes (uniform grid indices, signs and sub-block scale codes) with one
 * super-scale D chosen so that the dequantised values have the tensor's std: D = std / rms(v),
 * where rms(v)^2 = E[scale(s)^2] * E[g^2] over uniform codes s and grid entries g (the grid's
 * bytes, or for IQ1 the level g +- 1/8). Signs (IQ2/IQ3) and shifts (IQ1) are symmetric, so the
 * values are centred up to the IQ1 grid's own mean. The rms of each type is computed once from
 * the lattice tables. */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "../core/fp16.h"
#include "../quant/quant.h"
#include "../quant/quant_iq_impl.h"
#include "synth_impl.h"

enum { F_IQ2_XXS, F_IQ2_XS, F_IQ2_S, F_IQ3_XXS, F_IQ3_S, F_IQ1, F_COUNT };
static double rms_unit[F_COUNT]; /* rms of the values of a block with D = 1 */
static pthread_once_t rms_once = PTHREAD_ONCE_INIT;

static double grid_ms(const void *grid, int n, int bytes, bool iq1) {
    double s = 0;
    for (int k = 0; k < n; k++)
        for (int i = 0; i < bytes; i++) {
            const uint64_t e = bytes == 8 ? ((const uint64_t *)grid)[k] : ((const uint32_t *)grid)[k];
            const double g = iq1 ? (double)(int8_t)(uint8_t)(e >> (8 * i)) : (double)((e >> (8 * i)) & 0xff);
            s += g * g;
        }
    return s / (n * bytes) + (iq1 ? 1.0 / 64 : 0.0); /* IQ1: + E[delta^2], delta = +-1/8 */
}

/* E[scale^2] over codes s uniform in [0, n): scale = a * (b + c * s) */
static double scale_ms(int n, double a, double b, double c) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (a * (b + c * i)) * (a * (b + c * i));
    return s / n;
}

static void rms_init(void) {
    rms_unit[F_IQ2_XXS] = sqrt(scale_ms(16, 0.25, 0.5, 1) * grid_ms(hm_iq2xxs_grid, 256, 8, false));
    rms_unit[F_IQ2_XS] = sqrt(scale_ms(16, 0.25, 0.5, 1) * grid_ms(hm_iq2xs_grid, 512, 8, false));
    rms_unit[F_IQ2_S] = sqrt(scale_ms(16, 0.25, 0.5, 1) * grid_ms(hm_iq2s_grid, 1024, 8, false));
    rms_unit[F_IQ3_XXS] = sqrt(scale_ms(16, 0.5, 0.5, 1) * grid_ms(hm_iq3xxs_grid, 256, 4, false));
    rms_unit[F_IQ3_S] = sqrt(scale_ms(16, 1, 1, 2) * grid_ms(hm_iq3s_grid, 512, 4, false));
    rms_unit[F_IQ1] = sqrt(scale_ms(8, 1, 1, 2) * grid_ms(hm_iq1s_grid, 2048, 8, true));
}

bool hm_synth_fast_iq_supported(int type) {
    switch (type) {
    case HM_TYPE_IQ2_XXS: case HM_TYPE_IQ2_XS: case HM_TYPE_IQ2_S: case HM_TYPE_IQ3_XXS: case HM_TYPE_IQ3_S:
    case HM_TYPE_IQ1_S: case HM_TYPE_IQ1_M: return true;
    default: return false;
    }
}

void hm_synth_fast_iq_block(int type, float std, uint8_t *y) {
    pthread_once(&rms_once, rms_init);
    const int f = type == HM_TYPE_IQ2_XXS ? F_IQ2_XXS : type == HM_TYPE_IQ2_XS ? F_IQ2_XS : type == HM_TYPE_IQ2_S ? F_IQ2_S
                : type == HM_TYPE_IQ3_XXS ? F_IQ3_XXS : type == HM_TYPE_IQ3_S ? F_IQ3_S : F_IQ1;
    const uint16_t d = hm_f32_to_fp16((float)(std / rms_unit[f]));
    if (type != HM_TYPE_IQ1_M) {
        memcpy(y, &d, 2); /* d is the first field of every type but IQ1_M */
        return;
    }
    /* IQ1_M: the super-scale is the top nibbles of the four scale words (bytes 48..55) */
    for (int w = 0; w < 4; w++) y[49 + 2 * w] = (uint8_t)((y[49 + 2 * w] & 0x0f) | ((d >> (4 * w)) & 0xf) << 4);
}
