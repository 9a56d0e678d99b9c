/* cuda_quant_lowbit.cuh - device-side decoding of the low-bit weight types (Q4_1, Q5_1, IQ4_NL,
 * Q2_K, Q3_K): the load<T> / dec<T> halves of deq8<T> (cuda_quant.cuh says why groups of 8), so
 * that the exact f32 decode path, the bf16 prefill path and get_rows run them. Bit-exact with the
 * CPU's to_float_ref (src/quant/quant_lowbit.c): the affine types compute q * d + m and
 * d * q - m as a rounded product then a rounded add, as the CPU reference does (never fused).
 * Layouts: src/quant/quant_lowbit_impl.h (ggml-common.h compatible). Included by cuda_quant.cuh
 * after the other types. The int8 (dp4a / MMQ) units of Q2_K and Q3_K are in cuda_q8k_lowbit.cuh;
 * Q4_1, Q5_1 and IQ4_NL (Q8_1 / Q8_0 partners) have none yet. */
#ifndef HM_BACKEND_CUDA_QUANT_LOWBIT_CUH
#define HM_BACKEND_CUDA_QUANT_LOWBIT_CUH

namespace hmcu {

template <> struct qtype<HM_TYPE_Q4_1>   { static constexpr int blk = 32,  size = 20,  align = 4; };
template <> struct qtype<HM_TYPE_Q5_1>   { static constexpr int blk = 32,  size = 24,  align = 8; };
template <> struct qtype<HM_TYPE_IQ4_NL> { static constexpr int blk = 32,  size = 18,  align = 2; };
template <> struct qtype<HM_TYPE_Q2_K>   { static constexpr int blk = 256, size = 84,  align = 4; };
template <> struct qtype<HM_TYPE_Q3_K>   { static constexpr int blk = 256, size = 110, align = 2; };

/* a * b + c and a * b - c with the product rounded on its own (no FMA), as the CPU computes. */
HMCU_HD float mul_add_rn(float a, float b, float c) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(__fmul_rn(a, b), c);
#else
    volatile float p = a * b;
    return p + c;
#endif
}
HMCU_HD float mul_sub_rn(float a, float b, float c) {
#ifdef __CUDA_ARCH__
    return __fsub_rn(__fmul_rn(a, b), c);
#else
    volatile float p = a * b;
    return p - c;
#endif
}

/* q4_1: groups 0, 1 are the low nibbles of qs[0..7], qs[8..15]; groups 2, 3 the high nibbles.
 * a = {d | m << 16, qs lo, qs hi}. */
template <> HMCU_HD raw load<HM_TYPE_Q4_1>(const uint8_t *__restrict__ row, int g) {
    const uint8_t *b = row + (int64_t)(g >> 2) * 20;
    const uint8_t *q = b + 4 + 8 * (g & 1);
    return raw{make_uint4(ldg((const uint32_t *)b), ldg((const uint32_t *)q), ldg((const uint32_t *)(q + 4)), 0),
               make_uint4(0, 0, 0, 0)};
}
template <> HMCU_HD void dec<HM_TYPE_Q4_1>(const raw &r, int g, float w[8]) {
    const float d = half_f((uint16_t)r.a.x), m = half_f((uint16_t)(r.a.x >> 16));
    int q[8];
    nib8(make_uint2(r.a.y, r.a.z), (g & 2) != 0, q);
HMCU_UNROLL
    for (int i = 0; i < 8; i++) w[i] = mul_add_rn((float)q[i], d, m);
}

/* q5_1: as q4_1 (qs at 8), the fifth bit of element e at bit e of the word qh (bytes 4..7), so
 * group k's 8 bits are its byte k. a = {d | m << 16, qs lo, qs hi, qh}. */
template <> HMCU_HD raw load<HM_TYPE_Q5_1>(const uint8_t *__restrict__ row, int g) {
    const uint8_t *b = row + (int64_t)(g >> 2) * 24;
    const uint2 hd = ldg((const uint2 *)b);
    const uint2 u = ldg((const uint2 *)(b + 8 + 8 * (g & 1)));
    return raw{make_uint4(hd.x, u.x, u.y, hd.y), make_uint4(0, 0, 0, 0)};
}
template <> HMCU_HD void dec<HM_TYPE_Q5_1>(const raw &r, int g, float w[8]) {
    const float d = half_f((uint16_t)r.a.x), m = half_f((uint16_t)(r.a.x >> 16));
    const uint32_t h = r.a.w >> (8 * (g & 3));
    int q[8];
    nib8(make_uint2(r.a.y, r.a.z), (g & 2) != 0, q);
HMCU_UNROLL
    for (int i = 0; i < 8; i++) w[i] = mul_add_rn((float)(q[i] | (int)((h >> i) & 1u) << 4), d, m);
}

/* iq4_nl: q4_0's layout (2-aligned 18-byte blocks), levels from the IQ4_NL table. */
template <> HMCU_HD raw load<HM_TYPE_IQ4_NL>(const uint8_t *__restrict__ row, int g) {
    const uint8_t *b = row + (int64_t)(g >> 2) * 18;
    const uint2 u = ld8_a2(b + 2 + 8 * (g & 1));
    return raw{make_uint4(ld16(b), u.x, u.y, 0), make_uint4(0, 0, 0, 0)};
}
template <> HMCU_HD void dec<HM_TYPE_IQ4_NL>(const raw &r, int g, float w[8]) {
    const float d = half_f((uint16_t)r.a.x);
    int q[8];
    nib8(make_uint2(r.a.y, r.a.z), (g & 2) != 0, q);
HMCU_UNROLL
    for (int i = 0; i < 8; i++) w[i] = d * (float)lut_iq4nl((uint32_t)q[i]);
}

/* Group l (0..31) of a q2_K / q3_K block = elements 8l .. 8l+7: 128-element half h = l / 16,
 * shift 2 * ((l % 16) / 4), qs bytes 32h + 8(l % 4) + i; 16-element sub-block j = l / 2. */

/* q2_K: a = {qs lo, qs hi, d | dmin << 16, scales[j]}. */
template <> HMCU_HD raw load<HM_TYPE_Q2_K>(const uint8_t *__restrict__ row, int g) {
    const uint8_t *b = row + (int64_t)(g >> 5) * 84;
    const int l = g & 31;
    const uint8_t *q = b + 16 + 32 * (l >> 4) + 8 * (l & 3);
    return raw{make_uint4(ldg((const uint32_t *)q), ldg((const uint32_t *)(q + 4)), ldg((const uint32_t *)(b + 80)),
                          b[(l & 31) >> 1]),
               make_uint4(0, 0, 0, 0)};
}
template <> HMCU_HD void dec<HM_TYPE_Q2_K>(const raw &r, int g, float w[8]) {
    const int sh = 2 * ((g & 15) >> 2);
    const float dl = half_f((uint16_t)r.a.z) * (float)(r.a.w & 15u);
    const float ml = half_f((uint16_t)(r.a.z >> 16)) * (float)(r.a.w >> 4);
HMCU_UNROLL
    for (int i = 0; i < 4; i++) {
        w[i] = mul_sub_rn(dl, (float)((r.a.x >> (8 * i + sh)) & 3u), ml);
        w[i + 4] = mul_sub_rn(dl, (float)((r.a.y >> (8 * i + sh)) & 3u), ml);
    }
}

/* q3_K: the high bit of element e is bit e / 32 = l / 4 of hmask[e % 32] = hmask[8(l % 4) + i];
 * the 6-bit scale s[j]: low nibble scales[j % 8] >> 4 (j / 8), top bits scales[8 + j % 4] >>
 * 2 (j / 4). a = {qs lo, qs hi, hmask lo, hmask hi}, b.x = d | scales[j % 8] << 16 |
 * scales[8 + j % 4] << 24. */
template <> HMCU_HD raw load<HM_TYPE_Q3_K>(const uint8_t *__restrict__ row, int g) {
    const uint8_t *b = row + (int64_t)(g >> 5) * 110;
    const int l = g & 31, j = l >> 1;
    const uint2 q = ld8_a2(b + 32 + 32 * (l >> 4) + 8 * (l & 3));
    const uint2 hm = ld8_a2(b + 8 * (l & 3));
    return raw{make_uint4(q.x, q.y, hm.x, hm.y),
               make_uint4((uint32_t)ld16(b + 108) | (uint32_t)b[96 + (j & 7)] << 16 | (uint32_t)b[104 + (j & 3)] << 24,
                          0, 0, 0)};
}
template <> HMCU_HD void dec<HM_TYPE_Q3_K>(const raw &r, int g, float w[8]) {
    const int l = g & 31, j = l >> 1, sh = 2 * ((l & 15) >> 2), hb = l >> 2;
    const int s = (int)(((r.b.x >> 16) >> (4 * (j >> 3))) & 15u) | (int)(((r.b.x >> 24) >> (2 * (j >> 2))) & 3u) << 4;
    const float dl = half_f((uint16_t)r.b.x) * (float)(s - 32);
HMCU_UNROLL
    for (int i = 0; i < 4; i++) {
        const int q0 = (int)((r.a.x >> (8 * i + sh)) & 3u) - ((r.a.z >> (8 * i + hb)) & 1u ? 0 : 4);
        const int q1 = (int)((r.a.y >> (8 * i + sh)) & 3u) - ((r.a.w >> (8 * i + hb)) & 1u ? 0 : 4);
        w[i] = dl * (float)q0;
        w[i + 4] = dl * (float)q1;
    }
}

} /* namespace hmcu */

#endif
