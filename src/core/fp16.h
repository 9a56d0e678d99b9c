/* fp16.h - bit-exact IEEE half and bfloat16 conversions (scalar reference).
 *
 * Round-to-nearest-even on the way down, NaN preserved (quiet), infinities and subnormals
 * handled. SIMD code may use F16C / AVX-512 conversion instructions, which agree with these. */
#ifndef HM_CORE_FP16_H
#define HM_CORE_FP16_H

#include <stdint.h>
#include <string.h>

static inline uint32_t hm_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float hm_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline float hm_fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        if (man == 0) return hm_bits_f32(sign);
        /* subnormal: value = man * 2^-24 */
        float v = (float)man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    if (exp == 31) /* inf, or NaN made quiet as F16C's vcvtph2ps does */
        return hm_bits_f32(sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0));
    return hm_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t hm_f32_to_fp16(float f) {
    uint32_t x = hm_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
    if (ax < 0x38800000u) { /* below smallest normal half: subnormal or zero */
        if (ax < 0x33000000u) return (uint16_t)sign; /* < 2^-25: rounds to 0 */
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14..24 */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ax - 0x38000000u; /* rebias exponent 127 -> 15 */
    uint32_t lsb = (r >> 13) & 1u;
    r += 0xfffu + lsb; /* round to nearest even */
    return (uint16_t)(sign | (r >> 13));
}

static inline float hm_bf16_to_f32(uint16_t h) { return hm_bits_f32((uint32_t)h << 16); }

static inline uint16_t hm_f32_to_bf16(float f) {
    uint32_t x = hm_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet nan */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

#endif
