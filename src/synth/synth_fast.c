/* synth_fast.c - `hotmoe synth --fast-experts`: expert rows written directly as random quantised
 * blocks, for I/O benchmarks on models of tens of GB (the K-quant search quantiser takes about a
 * minute per GB on two cores; this is bound by the disk).
 *
 * A block's quants are uniform random codes; its scales are chosen so that the dequantised values
 * have mean ~0 and the tensor's std (0.02 for the synth presets), the magnitude the regular path
 * gives by quantising N(0, 0.02^2): per block a super-scale D (f16, the same in every block) and
 * per sub-block a 6/8-bit scale drawn uniformly from [SC_LO, SC_LO + 15]; for the types with a
 * min (q4_k, q5_k) the min equals the scale and dmin = D * (nmax / 2), so that the values are
 * D * sc * (q - nmax / 2): centred exactly. The symmetric types ((q - 2^(b-1)) * d) would be off
 * centre by half a step (0.11 std for 4 bits), so their scale's sign is random per block (q4_0,
 * q5_0, q8_0) or sub-block (q6_k): mean 0 over a tensor.
 *
 * Invariants: a block's bytes depend only on (tensor key, block index in the tensor): any thread
 * split gives the same file. Only the types below (and the i-quants, synth_fast_iq.c) have a
 * generator; the caller keeps the regular path for the others (hm_synth_fast_supported). */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "../core/fp16.h"
#include "../core/status.h"
#include "../quant/quant.h"
#include "../quant/quant_impl.h"
#include "../quant/quant_k_impl.h"
#include "synth_impl.h"

#define SC_LO 40 /* sub-block scales in [SC_LO, SC_LO + 15] */

/* E[sc^2] of sc uniform on the 16 integers from SC_LO: mean^2 + (16^2 - 1) / 12 */
static double sc_rms(void) {
    const double m = SC_LO + 7.5;
    return sqrt(m * m + 255.0 / 12.0);
}

/* std of a code uniform on [0, 2^bits) */
static double code_std(int bits) {
    const double n = (double)(1u << bits);
    return sqrt((n * n - 1.0) / 12.0);
}

/* Fill n bytes with the random words w0, w0 + 1, ... of (key). */
static void fill_random(uint8_t *dst, size_t n, uint64_t key, uint64_t w0) {
    for (size_t i = 0; i < n; i += 8) {
        uint64_t r = hm_synth_mix64(key + (w0 + i / 8 + 1) * 0x9e3779b97f4a7c15ull);
        memcpy(dst + i, &r, n - i < 8 ? n - i : 8);
    }
}

bool hm_synth_fast_supported(int type) {
    switch (type) {
    case HM_TYPE_Q4_0: case HM_TYPE_Q5_0: case HM_TYPE_Q8_0: case HM_TYPE_Q4_K: case HM_TYPE_Q5_K: case HM_TYPE_Q6_K:
        return true;
    default: return hm_synth_fast_iq_supported(type);
    }
}

/* Pack 8 six-bit scales and mins the q4_k/q5_k way (quant_k.c's k4_pack_scales). */
static void pack_k4(const uint8_t ls[8], const uint8_t lm[8], uint8_t packed[12]) {
    for (int j = 0; j < 4; j++) {
        packed[j] = (uint8_t)(ls[j] | ((ls[j + 4] >> 4) << 6));
        packed[j + 4] = (uint8_t)(lm[j] | ((lm[j + 4] >> 4) << 6));
        packed[j + 8] = (uint8_t)((ls[j + 4] & 0xf) | ((lm[j + 4] & 0xf) << 4));
    }
}

void hm_synth_fast_row(int type, uint64_t key, int64_t row, int64_t ne0, float std, uint8_t *out) {
    const hm_type_traits *tr = hm_type_get(type);
    const int64_t nb = ne0 / tr->blck_size;
    const size_t bs = tr->type_size;
    /* words per block, rounded up; block b of the tensor uses words [b * wpb, (b + 1) * wpb) */
    const uint64_t wpb = (bs + 7) / 8 + 1; /* + 1: the sub-scale word */
    const uint64_t key2 = hm_synth_mix64(key ^ 0x6661737465787073ull); /* "fastexps": not the gauss stream */
    for (int64_t ib = 0; ib < nb; ib++) {
        const uint64_t b = (uint64_t)row * (uint64_t)nb + (uint64_t)ib, w0 = b * wpb;
        uint8_t *y = out + (size_t)ib * bs;
        fill_random(y, bs, key2, w0);
        const uint64_t sw = hm_synth_mix64(key2 + (w0 + wpb) * 0x9e3779b97f4a7c15ull); /* sub-scales */
        switch (type) {
        case HM_TYPE_Q4_0: case HM_TYPE_Q5_0: case HM_TYPE_Q8_0: {
            const int bits = type == HM_TYPE_Q4_0 ? 4 : type == HM_TYPE_Q5_0 ? 5 : 8;
            /* one scale per block: spread d like the K types' sub-scales */
            double d = std / code_std(bits) * (double)(SC_LO + (sw & 15)) / sc_rms();
            if (sw & 16) d = -d;
            const uint16_t h = hm_f32_to_fp16((float)d);
            memcpy(y, &h, 2); /* d is the first field of all three */
            break;
        }
        case HM_TYPE_Q4_K: case HM_TYPE_Q5_K: {
            const int bits = type == HM_TYPE_Q4_K ? 4 : 5;
            const uint16_t d = hm_f32_to_fp16((float)(std / (code_std(bits) * sc_rms())));
            const uint16_t dmin = hm_f32_to_fp16(hm_fp16_to_f32(d) * (float)((1u << bits) - 1) * 0.5f);
            uint8_t ls[8];
            for (int j = 0; j < 8; j++) ls[j] = (uint8_t)(SC_LO + ((sw >> (4 * j)) & 15));
            uint8_t packed[12];
            pack_k4(ls, ls, packed);
            _Static_assert(offsetof(hm_block_q4_k, scales) == 4 && offsetof(hm_block_q5_k, scales) == 4, "k4 layout");
            memcpy(y + 4, packed, 12);
            memcpy(y, &d, 2);
            memcpy(y + 2, &dmin, 2);
            break;
        }
        case HM_TYPE_Q6_K: {
            int8_t sc[16];
            const uint64_t sign = hm_synth_mix64(sw);
            for (int j = 0; j < 16; j++)
                sc[j] = (int8_t)((sign >> j & 1 ? -1 : 1) * (SC_LO + (int)((sw >> (4 * j)) & 15)));
            const uint16_t d = hm_f32_to_fp16((float)(std / (code_std(6) * sc_rms())));
            memcpy(y + offsetof(hm_block_q6_k, scales), sc, 16);
            memcpy(y + offsetof(hm_block_q6_k, d), &d, 2);
            break;
        }
        default:
            HM_ASSERT(hm_synth_fast_iq_supported(type) && "hm_synth_fast_row: type without a generator");
            hm_synth_fast_iq_block(type, std, y);
        }
    }
}
