/* cuda_quant.cuh - device-side block decoding: for every weight type, deq8<T>(row, g, w) writes
 * the 8 consecutive elements 8g .. 8g+7 of a row as f32, bit-exact with the CPU's to_float_ref
 * up to the order of the two float operations of the affine K-quants.
 *
 * Why groups of 8: a warp whose lane l decodes group l reads 8 consecutive activations per lane,
 * so the activation loads of a warp are one contiguous 1 KiB run (perfectly coalesced), and the
 * weight bytes of consecutive lanes are consecutive too. Each type reads its bytes with the widest
 * load its block alignment allows (16 B for F32/F16/BF16 and the header of Q4_K/Q5_K, 8 B for the
 * quants of Q4_K/Q5_K/IQ4_XS, 2 B for Q8_0/Q4_0/Q5_0/Q6_K whose blocks are only 2-aligned, bytes
 * for MXFP4). Layouts: src/quant/quant_impl.h and quant_k_impl.h (ggml-common.h compatible). */
#ifndef HM_BACKEND_CUDA_QUANT_CUH
#define HM_BACKEND_CUDA_QUANT_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

extern "C" {
#include "quant/quant.h"
}

namespace hmcu {

/* Decoding is __host__ __device__ so its bit layouts can be checked on the CPU too; the few
 * device intrinsics it needs have host equivalents here. */
#define HMCU_HD __host__ __device__ __forceinline__
#ifdef __CUDA_ARCH__
#define HMCU_UNROLL _Pragma("unroll")
#else
#define HMCU_UNROLL
#endif

template <typename V> HMCU_HD V ldg(const V *p) {
#ifdef __CUDA_ARCH__
    return __ldg(p);
#else
    return *p;
#endif
}
HMCU_HD uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#ifdef __CUDA_ARCH__
    return __byte_perm(x, y, s);
#else
    const uint64_t v = (uint64_t)y << 32 | x;
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) r |= (uint32_t)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
#endif
}
HMCU_HD float u2f(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

HMCU_HD float half_f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
HMCU_HD float bf16_f(uint16_t h) { return u2f((uint32_t)h << 16); }
HMCU_HD uint16_t ld16(const uint8_t *p) { return *(const uint16_t *)p; }
HMCU_HD uint32_t ld32(const uint8_t *p) { return *(const uint32_t *)p; }
/* 8 bytes from a 2-aligned address, as two little-endian words. */
HMCU_HD uint2 ld8_a2(const uint8_t *p) {
    const uint16_t *q = (const uint16_t *)p;
    return make_uint2((uint32_t)q[0] | (uint32_t)q[1] << 16, (uint32_t)q[2] | (uint32_t)q[3] << 16);
}
HMCU_HD uint2 ld8_a1(const uint8_t *p) {
    return make_uint2((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24,
                      (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24);
}

/* 2^(e-128): half the E8M0 scale, as quant_impl.h's hm_e8m0_to_f32_half. */
HMCU_HD float e8m0_half(uint32_t e) {
    return u2f(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

/* 16-entry signed int8 tables looked up in registers with byte permutes (no memory traffic, no
 * divergence): t0..t3 hold entries 0-3, 4-7, 8-11, 12-15 little-endian. */
HMCU_HD int lut16(uint32_t q, uint32_t t0, uint32_t t1, uint32_t t2, uint32_t t3) {
    uint32_t lo = byte_perm(t0, t1, q & 7), hi = byte_perm(t2, t3, q & 7);
    return (int)(int8_t)(q & 8 ? hi : lo);
}
/* Doubled E2M1 values {0,1,2,3,4,6,8,12,-0,-1,-2,-3,-4,-6,-8,-12}. */
HMCU_HD int lut_mxfp4(uint32_t q) {
    return lut16(q, 0x03020100u, 0x0c080604u, 0xfdfeff00u, 0xf4f8fafcu);
}
/* IQ4_NL levels {-127,-104,-83,-65,-49,-35,-22,-10,1,13,25,38,53,69,89,113}. */
HMCU_HD int lut_iq4nl(uint32_t q) {
    return lut16(q, 0xbfad9881u, 0xf6eaddcfu, 0x26190d01u, 0x71594535u);
}

/* The 8 nibbles (low or high) of the 8 bytes in u, as ints. */
HMCU_HD void nib8(uint2 u, bool high, int q[8]) {
    const uint32_t a = high ? u.x >> 4 : u.x, b = high ? u.y >> 4 : u.y;
HMCU_UNROLL
    for (int i = 0; i < 4; i++) {
        q[i] = (int)((a >> (8 * i)) & 15u);
        q[i + 4] = (int)((b >> (8 * i)) & 15u);
    }
}

/* 6-bit scale and min of sub-block j (0..7) of a q4_K/q5_K block from its packed words
 * s0 = scales[0..3], s1 = scales[4..7], s2 = scales[8..11] (see hm_k4_unpack_scales). */
HMCU_HD void k4_scale_min(uint32_t s0, uint32_t s1, uint32_t s2, int j, int *sc, int *m) {
    const int sh = 8 * (j & 3);
    if (j < 4) {
        *sc = (int)((s0 >> sh) & 63u);
        *m = (int)((s1 >> sh) & 63u);
    } else {
        *sc = (int)(((s2 >> sh) & 15u) | (((s0 >> sh) >> 6 & 3u) << 4));
        *m = (int)(((s2 >> sh) >> 4 & 15u) | (((s1 >> sh) >> 6 & 3u) << 4));
    }
}

template <int T> struct qtype;
/* elems/bytes per block, required alignment of rows (bytes). */
template <> struct qtype<HM_TYPE_F32>    { static constexpr int blk = 1,   size = 4,   align = 16; };
template <> struct qtype<HM_TYPE_F16>    { static constexpr int blk = 1,   size = 2,   align = 16; };
template <> struct qtype<HM_TYPE_BF16>   { static constexpr int blk = 1,   size = 2,   align = 16; };
template <> struct qtype<HM_TYPE_Q8_0>   { static constexpr int blk = 32,  size = 34,  align = 2; };
template <> struct qtype<HM_TYPE_Q4_0>   { static constexpr int blk = 32,  size = 18,  align = 2; };
template <> struct qtype<HM_TYPE_Q5_0>   { static constexpr int blk = 32,  size = 22,  align = 2; };
template <> struct qtype<HM_TYPE_MXFP4>  { static constexpr int blk = 32,  size = 17,  align = 1; };
template <> struct qtype<HM_TYPE_Q4_K>   { static constexpr int blk = 256, size = 144, align = 16; };
template <> struct qtype<HM_TYPE_Q5_K>   { static constexpr int blk = 256, size = 176, align = 16; };
template <> struct qtype<HM_TYPE_Q6_K>   { static constexpr int blk = 256, size = 210, align = 2; };
template <> struct qtype<HM_TYPE_IQ4_XS> { static constexpr int blk = 256, size = 136, align = 8; };

/* Decoding is split in two halves so that a kernel can issue the loads of several groups before
 * the arithmetic of the first (memory-level parallelism): load<T>(row, g) reads the raw bytes of
 * group g into a `raw` (8 registers; unused words are dropped by the compiler), dec<T>(raw, g, w)
 * turns them into 8 floats. deq8 = dec(load()), so the host check of deq8 covers both halves. */
struct raw {
    uint4 a, b;
};

template <int T> HMCU_HD raw load(const uint8_t *__restrict__ row, int g);
template <int T> HMCU_HD void dec(const raw &r, int g, float w[8]);

template <int T> HMCU_HD void deq8(const uint8_t *__restrict__ row, int64_t g, float w[8]) {
    dec<T>(load<T>(row, (int)g), (int)g, w);
}

template <> HMCU_HD raw load<HM_TYPE_F32>(const uint8_t *__restrict__ row, int g) {
    const uint4 *p = (const uint4 *)row + 2 * (int64_t)g;
    return raw{ldg(p), ldg(p + 1)};
}
template <> HMCU_HD void dec<HM_TYPE_F32>(const raw &r, int, float w[8]) {
    w[0] = u2f(r.a.x); w[1] = u2f(r.a.y); w[2] = u2f(r.a.z); w[3] = u2f(r.a.w);
    w[4] = u2f(r.b.x); w[5] = u2f(r.b.y); w[6] = u2f(r.b.z); w[7] = u2f(r.b.w);
}

template <> HMCU_HD raw load<HM_TYPE_F16>(const uint8_t *__restrict__ row, int g) {
    return raw{ldg((const uint4 *)row + g), make_uint4(0, 0, 0, 0)};
}
template <> HMCU_HD void dec<HM_TYPE_F16>(const raw &r, int, float w[8]) {
    const uint32_t v[4] = {r.a.x, r.a.y, r.a.z, r.a.w};
HMCU_UNROLL
    for (int i = 0; i < 4; i++) {
        w[2 * i] = half_f((uint16_t)v[i]);
        w[2 * i + 1] = half_f((uint16_t)(v[i] >> 16));
    }
}

template <> HMCU_HD raw load<HM_TYPE_BF16>(const uint8_t *__restrict__ row, int g) {
    return raw{ldg((const uint4 *)row + g), make_uint4(0, 0, 0, 0)};
}
template <> HMCU_HD void dec<HM_TYPE_BF16>(const raw &r, int, float w[8]) {
    const uint32_t v[4] = {r.a.x, r.a.y, r.a.z, r.a.w};
HMCU_UNROLL
    for (int i = 0; i < 4; i++) {
        w[2 * i] = u2f(v[i] << 16);
        w[2 * i + 1] = u2f(v[i] & 0xffff0000u);
    }
}

/* q8_0: group k of block b is qs[8k .. 8k+7]. a = {d, qs lo, qs hi}. */
template <> HMCU_HD raw load<HM_TYPE_Q8_0>(const uint8_t *__restrict__ row, int g) {
    const uint8_t *b = row + (int64_t)(g >> 2) * 34;
    const uint2 u = ld8_a2(b + 2 + 8 * (g & 3));
    return raw{make_uint4(ld16(b), u.x, u.y, 0), make_uint4(0, 0, 0, 0)};
}
template <> HMCU_HD void dec<HM_TYPE_Q8_0>(const raw &r, int, float w[8]) {
    const float d = half_f((uint16_t)r.a.x);
HMCU_UNROLL
    for (int i = 0; i < 4; i++) {
        w[i] = d * (float)(int8_t)(r.a.y >> (8 * i));
        w[i + 4] = d * (float)(int8_t)(r.a.z >> (8 * i));
    }
}

/* q4_0 / mxfp4: groups 0,1 are the low nibbles of qs[0..15], groups 2,3 the high nibbles. */
template <> HMCU_HD raw load<HM_TYPE_Q4_0>(const uint8_t *__restrict__ row, int g) {
    const uint8_t *b = row + (int64_t)(g >> 2) * 18;
    const uint2 u = ld8_a2(b + 2 + 8 * (g & 1));
    return raw{make_uint4(ld16(b), u.x, u.y, 0), make_uint4(0, 0, 0, 0)};
}
template <> HMCU_HD void dec<HM_TYPE_Q4_0>(const raw &r, int g, float w[8]) {
    const float d = half_f((uint16_t)r.a.x);
    int q[8];
    nib8(make_uint2(r.a.y, r.a.z), (g & 2) != 0, q);
HMCU_UNROLL
    for (int i = 0; i < 8; i++) w[i] = d * (float)(q[i] - 8);
}

/* q5_0: as q4_0 (qs at 6), plus the fifth bits: element e of the block is bit e of the
 * little-endian word qh (bytes 2..5), so group k's 8 bits are byte k of it. The block is 22 bytes,
 * only 2-aligned: qh is read as two halves. a = {d, qs lo, qs hi, qh}. */
template <> HMCU_HD raw load<HM_TYPE_Q5_0>(const uint8_t *__restrict__ row, int g) {
    const uint8_t *b = row + (int64_t)(g >> 2) * 22;
    const uint2 u = ld8_a2(b + 6 + 8 * (g & 1));
    return raw{make_uint4(ld16(b), u.x, u.y, (uint32_t)ld16(b + 2) | (uint32_t)ld16(b + 4) << 16),
               make_uint4(0, 0, 0, 0)};
}
template <> HMCU_HD void dec<HM_TYPE_Q5_0>(const raw &r, int g, float w[8]) {
    const float d = half_f((uint16_t)r.a.x);
    const uint32_t h = r.a.w >> (8 * (g & 3));
    int q[8];
    nib8(make_uint2(r.a.y, r.a.z), (g & 2) != 0, q);
HMCU_UNROLL
    for (int i = 0; i < 8; i++) w[i] = d * (float)((q[i] | (int)((h >> i) & 1u) << 4) - 16);
}

template <> HMCU_HD raw load<HM_TYPE_MXFP4>(const uint8_t *__restrict__ row, int g) {
    const uint8_t *b = row + (int64_t)(g >> 2) * 17;
    const uint2 u = ld8_a1(b + 1 + 8 * (g & 1));
    return raw{make_uint4(b[0], u.x, u.y, 0), make_uint4(0, 0, 0, 0)};
}
template <> HMCU_HD void dec<HM_TYPE_MXFP4>(const raw &r, int g, float w[8]) {
    const float d = e8m0_half(r.a.x);
    int q[8];
    nib8(make_uint2(r.a.y, r.a.z), (g & 2) != 0, q);
HMCU_UNROLL
    for (int i = 0; i < 8; i++) w[i] = d * (float)lut_mxfp4((uint32_t)q[i]);
}

/* q4_K: lane-group l (0..31) of a block: sub-block j = l/4 (scale j), chunk c = l/8, nibble half
 * (l/4)&1, bytes qs[32c + 8(l%4) ..]. a = header {d, dmin, scales[12]}, b.xy = the 8 quant bytes. */
template <> HMCU_HD raw load<HM_TYPE_Q4_K>(const uint8_t *__restrict__ row, int g) {
    const uint8_t *b = row + (int64_t)(g >> 5) * 144;
    const int l = g & 31;
    const uint2 u = ldg((const uint2 *)(b + 16 + 32 * (l >> 3) + 8 * (l & 3)));
    return raw{ldg((const uint4 *)b), make_uint4(u.x, u.y, 0, 0)};
}
template <> HMCU_HD void dec<HM_TYPE_Q4_K>(const raw &r, int g, float w[8]) {
    const int j = (g & 31) >> 2;
    int sc, m;
    k4_scale_min(r.a.y, r.a.z, r.a.w, j, &sc, &m);
    const float d = half_f((uint16_t)r.a.x) * (float)sc, dm = half_f((uint16_t)(r.a.x >> 16)) * (float)m;
    int q[8];
    nib8(make_uint2(r.b.x, r.b.y), (j & 1) != 0, q);
HMCU_UNROLL
    for (int i = 0; i < 8; i++) w[i] = d * (float)q[i] - dm;
}

/* q5_K: as q4_K plus bit 2c + half of qh[8(l%4) + i]. b.xy = quants, b.zw = the qh bytes. */
template <> HMCU_HD raw load<HM_TYPE_Q5_K>(const uint8_t *__restrict__ row, int g) {
    const uint8_t *b = row + (int64_t)(g >> 5) * 176;
    const int l = g & 31;
    const uint2 hb = ldg((const uint2 *)(b + 16 + 8 * (l & 3)));
    const uint2 u = ldg((const uint2 *)(b + 48 + 32 * (l >> 3) + 8 * (l & 3)));
    return raw{ldg((const uint4 *)b), make_uint4(u.x, u.y, hb.x, hb.y)};
}
template <> HMCU_HD void dec<HM_TYPE_Q5_K>(const raw &r, int g, float w[8]) {
    const int j = (g & 31) >> 2;
    int sc, m;
    k4_scale_min(r.a.y, r.a.z, r.a.w, j, &sc, &m);
    const float d = half_f((uint16_t)r.a.x) * (float)sc, dm = half_f((uint16_t)(r.a.x >> 16)) * (float)m;
    int q[8];
    nib8(make_uint2(r.b.x, r.b.y), (j & 1) != 0, q);
HMCU_UNROLL
    for (int i = 0; i < 4; i++) {
        q[i] |= (int)((r.b.z >> (8 * i + j)) & 1u) << 4;
        q[i + 4] |= (int)((r.b.w >> (8 * i + j)) & 1u) << 4;
    }
HMCU_UNROLL
    for (int i = 0; i < 8; i++) w[i] = d * (float)q[i] - dm;
}

/* q6_K: element e = 8l .. 8l+7 of the block: half h = l/16, quarter k = (l%16)/4, l0 = 8(l%4);
 * low 4 bits from ql[64h + 32(k&1) + l0 + i] (high nibble when k >= 2), top 2 bits from
 * qh[32h + l0 + i] bits 2k, 2k+1; scale scales[l/2]. a = {ql lo, ql hi, qh lo, qh hi},
 * b.x = d | scale << 16. */
template <> HMCU_HD raw load<HM_TYPE_Q6_K>(const uint8_t *__restrict__ row, int g) {
    const uint8_t *b = row + (int64_t)(g >> 5) * 210;
    const int l = g & 31, hf = l >> 4, k = (l >> 2) & 3, l0 = 8 * (l & 3);
    const uint2 ql = ld8_a2(b + 64 * hf + 32 * (k & 1) + l0);
    const uint2 qh = ld8_a2(b + 128 + 32 * hf + l0);
    return raw{make_uint4(ql.x, ql.y, qh.x, qh.y),
               make_uint4((uint32_t)ld16(b + 208) | (uint32_t)b[192 + (l >> 1)] << 16, 0, 0, 0)};
}
template <> HMCU_HD void dec<HM_TYPE_Q6_K>(const raw &r, int g, float w[8]) {
    const int k = (g >> 2) & 3;
    const float d = half_f((uint16_t)r.b.x) * (float)(int8_t)(r.b.x >> 16);
    int q[8];
    nib8(make_uint2(r.a.x, r.a.y), k >= 2, q);
HMCU_UNROLL
    for (int i = 0; i < 4; i++) {
        q[i] |= (int)((r.a.z >> (8 * i + 2 * k)) & 3u) << 4;
        q[i + 4] |= (int)((r.a.w >> (8 * i + 2 * k)) & 3u) << 4;
    }
HMCU_UNROLL
    for (int i = 0; i < 8; i++) w[i] = d * (float)(q[i] - 32);
}

/* iq4_xs: sub-block j = l/4, group k = l%4: low nibbles of qs[16j + 8k ..] for k < 2, high
 * nibbles of qs[16j + 8(k-2) ..] for k >= 2. a.xy = {d, scales_h, scales_l[4]}, a.zw = quants. */
template <> HMCU_HD raw load<HM_TYPE_IQ4_XS>(const uint8_t *__restrict__ row, int g) {
    const uint8_t *b = row + (int64_t)(g >> 5) * 136;
    const int l = g & 31, j = l >> 2, k = l & 3;
    const uint2 hd = ldg((const uint2 *)b);
    const uint2 u = ldg((const uint2 *)(b + 8 + 16 * j + 8 * (k & 1)));
    return raw{make_uint4(hd.x, hd.y, u.x, u.y), make_uint4(0, 0, 0, 0)};
}
template <> HMCU_HD void dec<HM_TYPE_IQ4_XS>(const raw &r, int g, float w[8]) {
    const int l = g & 31, j = l >> 2, k = l & 3;
    const int ls = (int)(((r.a.y >> (4 * j)) & 15u) | (((r.a.x >> 16) >> (2 * j) & 3u) << 4));
    const float d = half_f((uint16_t)r.a.x) * (float)(ls - 32);
    int q[8];
    nib8(make_uint2(r.a.z, r.a.w), k >= 2, q);
HMCU_UNROLL
    for (int i = 0; i < 8; i++) w[i] = d * (float)lut_iq4nl((uint32_t)q[i]);
}

/* ---- the grid i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) ----------------
 * Group g of a row is group l = g % 32 of block g / 32: exactly one grid entry (two for IQ3) with
 * its signs and scale, so a lane reads a few bytes (the blocks are only 2-aligned) and looks its
 * grid entry up in a device copy of the lattice tables (quant_iq_grids.h; the host side of these
 * functions reads the CPU's copies). Values as quant_iq.c, in ggml's float order. */
#define HM_IQ_TABLE(type, name, count) static const __device__ type d_##name[count] =
#include "quant/quant_iq_grids.h"
#undef HM_IQ_TABLE
} /* namespace hmcu */
extern "C" {
extern const uint64_t hm_iq2xxs_grid[256], hm_iq2xs_grid[512], hm_iq2s_grid[1024], hm_iq1s_grid[2048];
extern const uint32_t hm_iq3xxs_grid[256], hm_iq3s_grid[512];
}
namespace hmcu {
#ifdef __CUDA_ARCH__
#define HMCU_IQ_GRID(name, i) (d_##name[i])
#else
#define HMCU_IQ_GRID(name, i) (hm_##name[i])
#endif

template <> struct qtype<HM_TYPE_IQ2_XXS> { static constexpr int blk = 256, size = 66,  align = 2; };
template <> struct qtype<HM_TYPE_IQ2_XS>  { static constexpr int blk = 256, size = 74,  align = 2; };
template <> struct qtype<HM_TYPE_IQ2_S>   { static constexpr int blk = 256, size = 82,  align = 2; };
template <> struct qtype<HM_TYPE_IQ3_XXS> { static constexpr int blk = 256, size = 98,  align = 2; };
template <> struct qtype<HM_TYPE_IQ3_S>   { static constexpr int blk = 256, size = 110, align = 2; };
template <> struct qtype<HM_TYPE_IQ1_S>   { static constexpr int blk = 256, size = 50,  align = 2; };
template <> struct qtype<HM_TYPE_IQ1_M>   { static constexpr int blk = 256, size = 56,  align = 2; };

/* The 8 signs of a group from its 7 stored bits (bit 7: even count of minus signs). */
HMCU_HD uint32_t iq_signs7(uint32_t s7) {
#ifdef __CUDA_ARCH__
    return s7 | (uint32_t)(__popc(s7) & 1) << 7;
#else
    return s7 | (uint32_t)(__builtin_popcount(s7) & 1) << 7;
#endif
}
/* w[j] = db * (+-grid byte j): the grid's unsigned bytes, negated where signs has bit j. */
HMCU_HD void iq_grid8(uint64_t grid, uint32_t signs, float db, float w[8]) {
HMCU_UNROLL
    for (int j = 0; j < 8; j++) {
        const float v = db * (float)(int)((grid >> (8 * j)) & 0xffu);
        w[j] = signs >> j & 1u ? -v : v;
    }
}
/* w[j] = dl * (grid int8 byte j + delta): IQ1. */
HMCU_HD void iq1_grid8(uint64_t grid, float delta, float dl, float w[8]) {
HMCU_UNROLL
    for (int j = 0; j < 8; j++) w[j] = dl * ((float)(int8_t)(uint8_t)(grid >> (8 * j)) + delta);
}
HMCU_HD uint32_t ld32_a2(const uint8_t *p) { return (uint32_t)ld16(p) | (uint32_t)ld16(p + 2) << 16; }

/* iq2_xxs: a = {d, index byte, the sub-block's sign/scale word}. */
template <> HMCU_HD raw load<HM_TYPE_IQ2_XXS>(const uint8_t *__restrict__ row, int g) {
    const uint8_t *b = row + (int64_t)(g >> 5) * 66;
    const int l = g & 31, ib = l >> 2;
    return raw{make_uint4(ld16(b), b[2 + 8 * ib + (l & 3)], ld32_a2(b + 6 + 8 * ib), 0), make_uint4(0, 0, 0, 0)};
}
template <> HMCU_HD void dec<HM_TYPE_IQ2_XXS>(const raw &r, int g, float w[8]) {
    const float db = half_f((uint16_t)r.a.x) * (0.5f + (float)(r.a.z >> 28)) * 0.25f;
    iq_grid8(HMCU_IQ_GRID(iq2xxs_grid, r.a.y), iq_signs7((r.a.z >> (7 * (g & 3))) & 127u), db, w);
}

/* iq2_xs: a = {d, qs word, scales byte}. */
template <> HMCU_HD raw load<HM_TYPE_IQ2_XS>(const uint8_t *__restrict__ row, int g) {
    const uint8_t *b = row + (int64_t)(g >> 5) * 74;
    const int l = g & 31;
    return raw{make_uint4(ld16(b), ld16(b + 2 + 2 * l), b[66 + (l >> 2)], 0), make_uint4(0, 0, 0, 0)};
}
template <> HMCU_HD void dec<HM_TYPE_IQ2_XS>(const raw &r, int g, float w[8]) {
    const uint32_t s = (r.a.z >> (4 * ((g >> 1) & 1))) & 15u;
    const float db = half_f((uint16_t)r.a.x) * (0.5f + (float)s) * 0.25f;
    iq_grid8(HMCU_IQ_GRID(iq2xs_grid, r.a.y & 511u), iq_signs7(r.a.y >> 9), db, w);
}

/* iq2_s: a = {d, qs byte, qh byte, scales byte}, b.x = the group's sign byte. */
template <> HMCU_HD raw load<HM_TYPE_IQ2_S>(const uint8_t *__restrict__ row, int g) {
    const uint8_t *b = row + (int64_t)(g >> 5) * 82;
    const int l = g & 31, ib = l >> 2;
    return raw{make_uint4(ld16(b), b[2 + l], b[66 + ib], b[74 + ib]), make_uint4(b[34 + l], 0, 0, 0)};
}
template <> HMCU_HD void dec<HM_TYPE_IQ2_S>(const raw &r, int g, float w[8]) {
    const int k = g & 3;
    const uint32_t s = (r.a.w >> (4 * (k >> 1))) & 15u;
    const float db = half_f((uint16_t)r.a.x) * (0.5f + (float)s) * 0.25f;
    iq_grid8(HMCU_IQ_GRID(iq2s_grid, r.a.y | ((r.a.z >> (2 * k)) & 3u) << 8), r.b.x, db, w);
}

/* iq3_xxs: a = {d, the two index bytes, the sub-block's sign/scale word}. */
template <> HMCU_HD raw load<HM_TYPE_IQ3_XXS>(const uint8_t *__restrict__ row, int g) {
    const uint8_t *b = row + (int64_t)(g >> 5) * 98;
    const int l = g & 31, ib = l >> 2;
    return raw{make_uint4(ld16(b), ld16(b + 2 + 8 * ib + 2 * (l & 3)), ld32_a2(b + 66 + 4 * ib), 0),
               make_uint4(0, 0, 0, 0)};
}
template <> HMCU_HD void dec<HM_TYPE_IQ3_XXS>(const raw &r, int g, float w[8]) {
    const float db = half_f((uint16_t)r.a.x) * (0.5f + (float)(r.a.z >> 28)) * 0.5f;
    const uint64_t grid = (uint64_t)HMCU_IQ_GRID(iq3xxs_grid, r.a.y & 255u) |
                          (uint64_t)HMCU_IQ_GRID(iq3xxs_grid, r.a.y >> 8) << 32;
    iq_grid8(grid, iq_signs7((r.a.z >> (7 * (g & 3))) & 127u), db, w);
}

/* iq3_s: a = {d, the two index bytes, qh byte, sign byte}, b.x = scales byte. */
template <> HMCU_HD raw load<HM_TYPE_IQ3_S>(const uint8_t *__restrict__ row, int g) {
    const uint8_t *b = row + (int64_t)(g >> 5) * 110;
    const int l = g & 31, ib = l >> 2;
    return raw{make_uint4(ld16(b), ld16(b + 2 + 8 * ib + 2 * (l & 3)), b[66 + ib], b[74 + l]),
               make_uint4(b[106 + (ib >> 1)], 0, 0, 0)};
}
template <> HMCU_HD void dec<HM_TYPE_IQ3_S>(const raw &r, int g, float w[8]) {
    const int k = g & 3, ib = (g & 31) >> 2;
    const uint32_t s = (r.b.x >> (4 * (ib & 1))) & 15u;
    const float db = half_f((uint16_t)r.a.x) * (float)(int)(1 + 2 * s);
    const uint32_t i1 = (r.a.y & 255u) | ((r.a.z >> (2 * k)) & 1u) << 8;
    const uint32_t i2 = (r.a.y >> 8) | ((r.a.z >> (2 * k + 1)) & 1u) << 8;
    const uint64_t grid = (uint64_t)HMCU_IQ_GRID(iq3s_grid, i1) | (uint64_t)HMCU_IQ_GRID(iq3s_grid, i2) << 32;
    iq_grid8(grid, r.a.w, db, w);
}

/* iq1_s: a = {d, qs byte, the sub-block's qh word}. */
template <> HMCU_HD raw load<HM_TYPE_IQ1_S>(const uint8_t *__restrict__ row, int g) {
    const uint8_t *b = row + (int64_t)(g >> 5) * 50;
    const int l = g & 31;
    return raw{make_uint4(ld16(b), b[2 + l], ld16(b + 34 + 2 * (l >> 2)), 0), make_uint4(0, 0, 0, 0)};
}
template <> HMCU_HD void dec<HM_TYPE_IQ1_S>(const raw &r, int g, float w[8]) {
    const float dl = half_f((uint16_t)r.a.x) * (float)(int)(2 * ((r.a.z >> 12) & 7u) + 1);
    const float delta = r.a.z & 0x8000u ? -0.125f : 0.125f;
    iq1_grid8(HMCU_IQ_GRID(iq1s_grid, r.a.y | ((r.a.z >> (3 * (g & 3))) & 7u) << 8), delta, dl, w);
}

/* iq1_m: a = {qs byte, qh byte, the sub-block pair's scale word, the fp16 super-scale}. */
template <> HMCU_HD raw load<HM_TYPE_IQ1_M>(const uint8_t *__restrict__ row, int g) {
    const uint8_t *b = row + (int64_t)(g >> 5) * 56;
    const int l = g & 31, ib = l >> 2;
    const uint32_t d = (uint32_t)(ld16(b + 48) >> 12) | ((uint32_t)(ld16(b + 50) >> 8) & 0x00f0u) |
                       ((uint32_t)(ld16(b + 52) >> 4) & 0x0f00u) | ((uint32_t)ld16(b + 54) & 0xf000u);
    return raw{make_uint4(b[l], b[32 + 2 * ib + ((l & 3) >> 1)], ld16(b + 48 + 2 * (ib >> 1)), d), make_uint4(0, 0, 0, 0)};
}
template <> HMCU_HD void dec<HM_TYPE_IQ1_M>(const raw &r, int g, float w[8]) {
    const int k = g & 3, ib = (g & 31) >> 2;
    const uint32_t h = (r.a.y >> (4 * (k & 1))) & 15u;
    const uint32_t s = (r.a.z >> (6 * (ib & 1) + 3 * (k >> 1))) & 7u;
    const float dl = half_f((uint16_t)r.a.w) * (float)(int)(2 * s + 1);
    iq1_grid8(HMCU_IQ_GRID(iq1s_grid, r.a.x | (h & 7u) << 8), h & 8u ? -0.125f : 0.125f, dl, w);
}
#undef HMCU_IQ_GRID

/* sum over all lanes of a warp, every lane gets it */
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* acc[t] += row . xs[t] over this lane's groups (lane, lane+32, ...) for NT activation rows at
 * once: the weight bytes are read and decoded once for all NT tokens. xs[t] 16-byte aligned. */
template <int T, int NT>
__device__ __forceinline__ void warp_row_dot(const uint8_t *__restrict__ row, int64_t n_groups,
                                             const float *const (&xs)[NT], float (&acc)[NT], int lane) {
#pragma unroll(NT <= 2 ? 4 : 2)
    for (int64_t g = lane; g < n_groups; g += 32) {
        float w[8];
        deq8<T>(row, g, w);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float4 *xp = (const float4 *)xs[t] + 2 * g;
            const float4 a = __ldg(xp), b = __ldg(xp + 1);
            float s = w[0] * a.x;
            s = fmaf(w[1], a.y, s); s = fmaf(w[2], a.z, s); s = fmaf(w[3], a.w, s);
            s = fmaf(w[4], b.x, s); s = fmaf(w[5], b.y, s); s = fmaf(w[6], b.z, s);
            s = fmaf(w[7], b.w, s);
            acc[t] += s;
        }
    }
}

/* The fast path (hm_cuda_kern HM_CUDA_KERN_NEW): acc[r][t] += row r . x[r][t] for R rows at once,
 * lane l taking groups l, l+32, ... in ascending order like warp_row_dot (so each row's per-lane
 * sum, and after warp_sum its result, is the same for any R and U). The loop body first issues the
 * loads of U groups of all R rows (U*R independent loads in flight per lane, instead of one), then
 * decodes and multiplies. SX: every row takes the same activations (a matvec: x[0][t] is used and
 * loaded once for all R rows); otherwise row r multiplies x[r][t] (the MoE down rows of k experts). */
template <int T, int NT, int R, int U, bool SX>
__device__ __forceinline__ void warp_rows_dot(const uint8_t *const (&rows)[R], int n_groups,
                                              const float *const (&xs)[R][NT], float (&acc)[R][NT], int lane) {
    for (int g0 = lane; g0 < n_groups; g0 += 32 * U) {
        raw rw[U][R];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++)
                if (g0 + 32 * u < n_groups) rw[u][r] = load<T>(rows[r], g0 + 32 * u);
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int g = g0 + 32 * u;
            if (g >= n_groups) break;
            float4 xa[SX ? 1 : R][NT][2];
#pragma unroll
            for (int r = 0; r < (SX ? 1 : R); r++)
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    const float4 *xp = (const float4 *)xs[r][t] + 2 * g;
                    xa[r][t][0] = __ldg(xp);
                    xa[r][t][1] = __ldg(xp + 1);
                }
#pragma unroll
            for (int r = 0; r < R; r++) {
                float w[8];
                dec<T>(rw[u][r], g, w);
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    const float4 a = xa[SX ? 0 : r][t][0], b = xa[SX ? 0 : r][t][1];
                    float s = w[0] * a.x;
                    s = fmaf(w[1], a.y, s); s = fmaf(w[2], a.z, s); s = fmaf(w[3], a.w, s);
                    s = fmaf(w[4], b.x, s); s = fmaf(w[5], b.y, s); s = fmaf(w[6], b.z, s);
                    s = fmaf(w[7], b.w, s);
                    acc[r][t] += s;
                }
            }
        }
    }
}


/* ---- int8 decode path (HM_CUDA_KERN_DEFAULT for Q4_K, Q5_K, Q6_K, IQ4_XS; Q2_K, Q3_K and the
 * grid i-quants in cuda_q8k_lowbit.cuh) ----------------------------------------------------------
 * Activations are quantised to Q8_K exactly as the CPU's quantize_row_q8_K (quant_k.c): per
 * 256-element block max = the value of largest |x| (first on ties), iscale = -127 / max,
 * q = min(127, round_half_even(iscale * x)), d = 1 / iscale; an all-zero block is all zero. The
 * weights are read as "units": unit p (0..7) of a block is 32 weights as two 16-element chunks
 * (x offsets off1, off2 in the block) of int8 values with integer scales, so a lane's dot is
 * eight dp4a per token, the exact integer sums of the CPU's vec_dot, then one or two float
 * multiply-adds with the block scales. Only the float accumulation order differs from the CPU. */

HMCU_HD int dp4a(uint32_t a, uint32_t b, int c) {
#ifdef __CUDA_ARCH__
    return __dp4a((int)a, (int)b, c);
#else
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
#endif
}

/* Which weight types take the int8 decode path (their CPU dot partner is Q8_K): Q4_K, Q5_K, Q6_K,
 * IQ4_XS, and Q2_K, Q3_K and the grid i-quants (their units: cuda_q8k_lowbit.cuh). */
HMCU_HD constexpr bool q8k_type(int t) {
    return t == HM_TYPE_Q4_K || t == HM_TYPE_Q5_K || t == HM_TYPE_Q6_K || t == HM_TYPE_IQ4_XS || t == HM_TYPE_Q2_K ||
           t == HM_TYPE_Q3_K || t == HM_TYPE_IQ2_XXS || t == HM_TYPE_IQ2_XS || t == HM_TYPE_IQ2_S ||
           t == HM_TYPE_IQ3_XXS || t == HM_TYPE_IQ3_S || t == HM_TYPE_IQ1_S || t == HM_TYPE_IQ1_M;
}
/* Which of them have int8 MMQ prefill tiles (cuda_mmq.cu): all but Q2_K, whose mins come per 16
 * elements (the tile's min path takes them per 32). */
HMCU_HD constexpr bool q8k_mmq_type(int t) { return q8k_type(t) && t != HM_TYPE_Q2_K; }

/* Registers of raw bytes per unit, and how many units of R rows a lane loads before it decodes
 * the first (about 64 registers of loads in flight). */
HMCU_HD constexpr int q8k_words(int t) {
    return t == HM_TYPE_Q4_K ? 8 : t == HM_TYPE_Q5_K ? 12 : t == HM_TYPE_Q6_K ? 11 : t == HM_TYPE_Q3_K ? 13
         : t == HM_TYPE_IQ2_XXS || t == HM_TYPE_IQ1_S ? 3
         : t == HM_TYPE_IQ2_XS || t == HM_TYPE_IQ3_XXS || t == HM_TYPE_IQ1_M ? 4 : t == HM_TYPE_IQ2_S ? 5 : 6;
}
HMCU_HD constexpr int q8k_unroll(int t, int r) {
    return 64 / (q8k_words(t) * r) < 1 ? 1 : 64 / (q8k_words(t) * r) > 4 ? 4 : 64 / (q8k_words(t) * r);
}
/* Shared memory of n_rows activation rows of ne0 quantised to Q8_K (int8 + a float per 256), and
 * the most a kernel takes without opting in (48 KiB; larger calls take the f32 kernels). */
static inline size_t hm_cuda_q8k_smem(int64_t n_rows, int64_t ne0) {
    return (size_t)n_rows * (size_t)ne0 + (size_t)n_rows * (size_t)(ne0 / 256) * 4;
}
#define HM_CUDA_Q8K_SMEM_MAX 49152

/* The best (largest |x|, then lowest index) of two candidates: quantize_row_q8_K's choice. */
struct q8max {
    float a, v; /* |x| and x */
    int i;      /* index in the block; 256 = none */
};
HMCU_HD q8max q8max_better(q8max p, q8max q) { return q.a > p.a || (q.a == p.a && q.i < p.i) ? q : p; }

/* The inverse scale of a block whose best is m (0 for an all-zero block) and the code of x. */
HMCU_HD float q8k_iscale(const q8max &m) {
#ifdef __CUDA_ARCH__
    return m.a > 0.0f ? __fdiv_rn(-127.0f, m.v) : 0.0f;
#else
    return m.a > 0.0f ? -127.0f / m.v : 0.0f;
#endif
}
HMCU_HD float q8k_d(float iscale) {
#ifdef __CUDA_ARCH__
    return iscale != 0.0f ? __fdiv_rn(1.0f, iscale) : 0.0f;
#else
    return iscale != 0.0f ? 1.0f / iscale : 0.0f;
#endif
}
HMCU_HD int q8k_code(float iscale, float x) {
#ifdef __CUDA_ARCH__
    const int q = __float2int_rn(__fmul_rn(iscale, x));
#else
    volatile float p = iscale * x; /* one rounding, like the CPU's unfused product */
    const int q = (int)rintf(p);
#endif
    return q < 127 ? q : 127;
}

/* One unit of weights as int8 chunks: values v1 (x[off1 .. off1+15]) and v2 (x[off2 ..]), integer
 * scales s1, s2 and mins m1, m2 (Q4_K/Q5_K), block scales d, dm (as floats). */
struct qunit {
    uint32_t v1[4], v2[4];
    int s1, s2, m1, m2;
    float d, dm;
};
/* The raw bytes of one unit (load: issued first, for loads in flight; dec: the arithmetic). */
struct qraw {
    uint32_t w[13];
};

template <int T> struct q8k;

/* q4_K unit p: chunk c = p/2, half h = p%2: qs[32c + 16h .. +15], low nibbles are elements
 * 64c + 16h + i (sub-block 2c), high nibbles 64c + 32 + 16h + i (sub-block 2c + 1).
 * w[0..3] = header {d, dmin, scales[12]}, w[4..7] = the 16 quant bytes. */
template <> struct q8k<HM_TYPE_Q4_K> {
    static constexpr int size = 144, kind = 0; /* kind 0: affine (scale and min) */
    HMCU_HD static int off1(int p) { return 64 * (p >> 1) + 16 * (p & 1); }
    HMCU_HD static int off2(int p) { return off1(p) + 32; }
    HMCU_HD static qraw load(const uint8_t *b, int p) {
        qraw r;
        const uint4 h = ldg((const uint4 *)b), q = ldg((const uint4 *)(b + 16 + 16 * p));
        r.w[0] = h.x; r.w[1] = h.y; r.w[2] = h.z; r.w[3] = h.w;
        r.w[4] = q.x; r.w[5] = q.y; r.w[6] = q.z; r.w[7] = q.w;
        return r;
    }
    HMCU_HD static qunit dec(const qraw &r, const uint8_t *, int p) {
        qunit u;
HMCU_UNROLL
        for (int i = 0; i < 4; i++) {
            u.v1[i] = r.w[4 + i] & 0x0f0f0f0fu;
            u.v2[i] = (r.w[4 + i] >> 4) & 0x0f0f0f0fu;
        }
        k4_scale_min(r.w[1], r.w[2], r.w[3], p & ~1, &u.s1, &u.m1);
        k4_scale_min(r.w[1], r.w[2], r.w[3], p | 1, &u.s2, &u.m2);
        u.d = half_f((uint16_t)r.w[0]);
        u.dm = half_f((uint16_t)(r.w[0] >> 16));
        return u;
    }
};

/* q5_K: as q4_K (qs at 48), plus bit 2c (first chunk) / 2c + 1 (second) of qh[16h + i]. */
template <> struct q8k<HM_TYPE_Q5_K> {
    static constexpr int size = 176, kind = 0;
    HMCU_HD static int off1(int p) { return 64 * (p >> 1) + 16 * (p & 1); }
    HMCU_HD static int off2(int p) { return off1(p) + 32; }
    HMCU_HD static qraw load(const uint8_t *b, int p) {
        qraw r;
        const uint4 h = ldg((const uint4 *)b), q = ldg((const uint4 *)(b + 48 + 16 * p)),
                    qh = ldg((const uint4 *)(b + 16 + 16 * (p & 1)));
        r.w[0] = h.x; r.w[1] = h.y; r.w[2] = h.z; r.w[3] = h.w;
        r.w[4] = q.x; r.w[5] = q.y; r.w[6] = q.z; r.w[7] = q.w;
        r.w[8] = qh.x; r.w[9] = qh.y; r.w[10] = qh.z; r.w[11] = qh.w;
        return r;
    }
    HMCU_HD static qunit dec(const qraw &r, const uint8_t *, int p) {
        qunit u;
        const int c = p >> 1;
HMCU_UNROLL
        for (int i = 0; i < 4; i++) {
            u.v1[i] = (r.w[4 + i] & 0x0f0f0f0fu) | ((r.w[8 + i] >> (2 * c)) & 0x01010101u) << 4;
            u.v2[i] = ((r.w[4 + i] >> 4) & 0x0f0f0f0fu) | ((r.w[8 + i] >> (2 * c + 1)) & 0x01010101u) << 4;
        }
        k4_scale_min(r.w[1], r.w[2], r.w[3], p & ~1, &u.s1, &u.m1);
        k4_scale_min(r.w[1], r.w[2], r.w[3], p | 1, &u.s2, &u.m2);
        u.d = half_f((uint16_t)r.w[0]);
        u.dm = half_f((uint16_t)(r.w[0] >> 16));
        return u;
    }
};

/* 16 bytes at a 2-aligned address p as five aligned words (the first one at p & ~3; every word
 * read holds a byte of the block, so it is inside the allocation) and their realignment. */
HMCU_HD void ld16_a2_raw(const uint8_t *p, uint32_t *w) {
    const uint32_t *a = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
HMCU_UNROLL
    for (int i = 0; i < 5; i++) w[i] = ldg(a + i);
}
HMCU_HD void ld16_a2_fix(const uint32_t *w, bool odd, uint32_t *out) {
HMCU_UNROLL
    for (int i = 0; i < 4; i++) out[i] = byte_perm(w[i], w[i + 1], odd ? 0x5432u : 0x3210u);
}

/* q6_K unit p: half h = p/4, k = (p/2)%2, s = p%2: ql[64h + 32k + 16s + i] low nibbles are
 * elements 128h + 32k + 16s + i (top bits 2k, 2k+1 of qh[32h + 16s + i], scale 8h + 2k + s),
 * high nibbles elements +64 (bits 2k+4, 2k+5, scale +4). Values 0..63; the -32 offset is taken
 * out of the integer sum (32 * sum x). The block is only 2-aligned: w[0..4] ql, w[5..9] qh as
 * aligned words, w[10] = d | scale1 << 16 | scale2 << 24. */
template <> struct q8k<HM_TYPE_Q6_K> {
    static constexpr int size = 210, kind = 1; /* kind 1: symmetric, offset 32 */
    HMCU_HD static int off1(int p) { return 128 * (p >> 2) + 32 * ((p >> 1) & 1) + 16 * (p & 1); }
    HMCU_HD static int off2(int p) { return off1(p) + 64; }
    HMCU_HD static qraw load(const uint8_t *b, int p) {
        qraw r;
        const int h = p >> 2, k = (p >> 1) & 1, s = p & 1;
        ld16_a2_raw(b + 64 * h + 32 * k + 16 * s, r.w);
        ld16_a2_raw(b + 128 + 32 * h + 16 * s, r.w + 5);
        r.w[10] = (uint32_t)ld16(b + 208) | (uint32_t)b[192 + 8 * h + 2 * k + s] << 16 |
                  (uint32_t)b[196 + 8 * h + 2 * k + s] << 24;
        r.w[11] = 0;
        return r;
    }
    HMCU_HD static qunit dec(const qraw &r, const uint8_t *b, int p) {
        qunit u;
        const int k = (p >> 1) & 1;
        const bool odd = ((uintptr_t)b & 2) != 0; /* every offset read is a multiple of 16 */
        uint32_t ql[4], qh[4];
        ld16_a2_fix(r.w, odd, ql);
        ld16_a2_fix(r.w + 5, odd, qh);
HMCU_UNROLL
        for (int i = 0; i < 4; i++) {
            u.v1[i] = (ql[i] & 0x0f0f0f0fu) | ((qh[i] >> (2 * k)) & 0x03030303u) << 4;
            u.v2[i] = ((ql[i] >> 4) & 0x0f0f0f0fu) | ((qh[i] >> (2 * k + 4)) & 0x03030303u) << 4;
        }
        u.s1 = (int)(int8_t)(r.w[10] >> 16);
        u.s2 = (int)(int8_t)(r.w[10] >> 24);
        u.m1 = u.m2 = 0;
        u.d = half_f((uint16_t)r.w[10]);
        u.dm = 0.0f;
        return u;
    }
};

/* 16 bytes at a 2-aligned address p as six words read as three 8-byte loads from p & ~7 (for the
 * q6_K offsets every 8-byte granule read holds a byte of the block, so it is inside the
 * allocation) and their realignment by m8 = p & 7 (0, 2, 4 or 6). */
HMCU_HD void ld16_a2_raw8(const uint8_t *p, uint32_t *w) {
    const uint2 *a = (const uint2 *)((uintptr_t)p & ~(uintptr_t)7);
HMCU_UNROLL
    for (int i = 0; i < 3; i++) {
        const uint2 v = ldg(a + i);
        w[2 * i] = v.x;
        w[2 * i + 1] = v.y;
    }
}
HMCU_HD void ld16_a2_fix8(const uint32_t *w, int m8, uint32_t *out) {
    uint32_t v[5];
HMCU_UNROLL
    for (int j = 0; j < 5; j++) v[j] = m8 & 4 ? w[j + 1] : w[j];
HMCU_UNROLL
    for (int i = 0; i < 4; i++) out[i] = byte_perm(v[i], v[i + 1], m8 & 2 ? 0x5432u : 0x3210u);
}

/* The unit loaders of the current int8 kernels: q8k<T>, except q6_K, read with 8-byte loads (9
 * loads a unit instead of 13: ql and qh as three 8-byte words each, w[0..5] and w[6..11], w[12] =
 * d | scale1 << 16 | scale2 << 24). The same qunit as q8k<HM_TYPE_Q6_K>, bit for bit. */
template <int T> struct q8kx : q8k<T> {};
template <> struct q8kx<HM_TYPE_Q6_K> {
    static constexpr int size = 210, kind = 1;
    HMCU_HD static int off1(int p) { return q8k<HM_TYPE_Q6_K>::off1(p); }
    HMCU_HD static int off2(int p) { return q8k<HM_TYPE_Q6_K>::off2(p); }
    HMCU_HD static qraw load(const uint8_t *b, int p) {
        qraw r;
        const int h = p >> 2, k = (p >> 1) & 1, s = p & 1;
        ld16_a2_raw8(b + 64 * h + 32 * k + 16 * s, r.w);
        ld16_a2_raw8(b + 128 + 32 * h + 16 * s, r.w + 6);
        r.w[12] = (uint32_t)ld16(b + 208) | (uint32_t)b[192 + 8 * h + 2 * k + s] << 16 |
                  (uint32_t)b[196 + 8 * h + 2 * k + s] << 24;
        return r;
    }
    HMCU_HD static qunit dec(const qraw &r, const uint8_t *b, int p) {
        qunit u;
        const int k = (p >> 1) & 1;
        const int m8 = (int)((uintptr_t)b & 7); /* every offset read is a multiple of 16 */
        uint32_t ql[4], qh[4];
        ld16_a2_fix8(r.w, m8, ql);
        ld16_a2_fix8(r.w + 6, m8, qh);
HMCU_UNROLL
        for (int i = 0; i < 4; i++) {
            u.v1[i] = (ql[i] & 0x0f0f0f0fu) | ((qh[i] >> (2 * k)) & 0x03030303u) << 4;
            u.v2[i] = ((ql[i] >> 4) & 0x0f0f0f0fu) | ((qh[i] >> (2 * k + 4)) & 0x03030303u) << 4;
        }
        u.s1 = (int)(int8_t)(r.w[12] >> 16);
        u.s2 = (int)(int8_t)(r.w[12] >> 24);
        u.m1 = u.m2 = 0;
        u.d = half_f((uint16_t)r.w[12]);
        u.dm = 0.0f;
        return u;
    }
};

/* The IQ4_NL levels of the four nibbles in the low halves of q's bytes, as four int8. */
HMCU_HD uint32_t lut4_iq4nl(uint32_t q) {
    const uint32_t sel = (q & 7u) | (q >> 4 & 0x70u) | (q >> 8 & 0x700u) | (q >> 12 & 0x7000u);
    const uint32_t lo = byte_perm(0xbfad9881u, 0xf6eaddcfu, sel), hi = byte_perm(0x26190d01u, 0x71594535u, sel);
    const uint32_t m = ((q >> 3) & 0x01010101u) * 0xffu;
    return (hi & m) | (lo & ~m);
}

/* iq4_xs unit p = sub-block p: qs[16p .. 16p+15], low nibbles elements 32p + i, high 32p + 16 + i,
 * one scale ls - 32. w[0..1] = {d, scales_h, scales_l[4]}, w[2..5] the quants (8-aligned). */
template <> struct q8k<HM_TYPE_IQ4_XS> {
    static constexpr int size = 136, kind = 2; /* kind 2: symmetric */
    HMCU_HD static int off1(int p) { return 32 * p; }
    HMCU_HD static int off2(int p) { return 32 * p + 16; }
    HMCU_HD static qraw load(const uint8_t *b, int p) {
        qraw r;
        const uint2 h = ldg((const uint2 *)b), q0 = ldg((const uint2 *)(b + 8 + 16 * p)),
                    q1 = ldg((const uint2 *)(b + 16 + 16 * p));
        r.w[0] = h.x; r.w[1] = h.y;
        r.w[2] = q0.x; r.w[3] = q0.y; r.w[4] = q1.x; r.w[5] = q1.y;
        return r;
    }
    HMCU_HD static qunit dec(const qraw &r, const uint8_t *, int p) {
        qunit u;
HMCU_UNROLL
        for (int i = 0; i < 4; i++) {
            u.v1[i] = lut4_iq4nl(r.w[2 + i] & 0x0f0f0f0fu);
            u.v2[i] = lut4_iq4nl((r.w[2 + i] >> 4) & 0x0f0f0f0fu);
        }
        u.s1 = u.s2 = (int)(((r.w[1] >> (4 * p)) & 15u) | (((r.w[0] >> 16) >> (2 * p) & 3u) << 4)) - 32;
        u.m1 = u.m2 = 0;
        u.d = half_f((uint16_t)r.w[0]);
        u.dm = 0.0f;
        return u;
    }
};

/* acc + the unit's dot with one token's chunks xa = x[off1 ..], xb = x[off2 ..] (16 int8 each)
 * of a Q8_K block of scale xd. bs1, bs2: the chunks' sums (kinds 0 and 1 need them). */
template <int T>
HMCU_HD float q8k_unit_dot(const qunit &u, const uint4 &xa, const uint4 &xb, int bs1, int bs2, float xd, float acc) {
    int d1 = dp4a(u.v1[0], xa.x, 0);
    d1 = dp4a(u.v1[1], xa.y, d1); d1 = dp4a(u.v1[2], xa.z, d1); d1 = dp4a(u.v1[3], xa.w, d1);
    int d2 = dp4a(u.v2[0], xb.x, 0);
    d2 = dp4a(u.v2[1], xb.y, d2); d2 = dp4a(u.v2[2], xb.z, d2); d2 = dp4a(u.v2[3], xb.w, d2);
    if (q8k<T>::kind == 0) {
        const int sumi = u.s1 * d1 + u.s2 * d2, summ = u.m1 * bs1 + u.m2 * bs2;
        acc = fmaf(u.d * xd, (float)sumi, acc);
        return fmaf(-(u.dm * xd), (float)summ, acc);
    }
    if (q8k<T>::kind == 1) {
        const int sumi = u.s1 * (d1 - 32 * bs1) + u.s2 * (d2 - 32 * bs2);
        return fmaf(u.d * xd, (float)sumi, acc);
    }
    if (q8k<T>::kind == 3) /* symmetric, a scale per chunk (Q3_K, the i-quants) */
        return fmaf(u.d * xd, (float)(u.s1 * d1 + u.s2 * d2), acc);
    return fmaf(u.d * xd, (float)(u.s1 * (d1 + d2)), acc);
}
HMCU_HD int q8_sum16(const uint4 &x) {
    return dp4a(0x01010101u, x.w, dp4a(0x01010101u, x.z, dp4a(0x01010101u, x.y, dp4a(0x01010101u, x.x, 0))));
}

#ifdef __CUDACC__
/* Quantise one block of 256 floats, lane l holding elements 8l .. 8l+7 in a, b, into q (16-byte
 * aligned, shared) and *d with one warp: the best is reduced over the warp with the CPU's tie
 * rule, so every lane derives the same scale. */
__device__ __forceinline__ void q8k_quant_vals_warp(const float4 &a, const float4 &b, int8_t *q, float *d, int lane) {
    const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    q8max m = {0.0f, 0.0f, 256};
#pragma unroll
    for (int i = 0; i < 8; i++)
        if (fabsf(v[i]) > m.a) m = q8max{fabsf(v[i]), v[i], 8 * lane + i};
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        q8max n;
        n.a = __shfl_xor_sync(0xffffffffu, m.a, o);
        n.v = __shfl_xor_sync(0xffffffffu, m.v, o);
        n.i = __shfl_xor_sync(0xffffffffu, m.i, o);
        m = q8max_better(m, n);
    }
    const float is = q8k_iscale(m);
    uint32_t w[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < 8; i++) w[i >> 2] |= (uint32_t)(uint8_t)q8k_code(is, v[i]) << (8 * (i & 3));
    *(uint2 *)(q + 8 * lane) = make_uint2(w[0], w[1]);
    if (lane == 0) *d = q8k_d(is);
}
/* Quantise one 256-element block x (16-byte aligned, global) into q and *d with one warp. */
__device__ __forceinline__ void q8k_quant_block_warp(const float *__restrict__ x, int8_t *q, float *d, int lane) {
    const float4 a = __ldg((const float4 *)x + 2 * lane), b = __ldg((const float4 *)x + 2 * lane + 1);
    q8k_quant_vals_warp(a, b, q, d, lane);
}

/* Quantise n_rows rows of ne0 floats (row stride xstride floats) into q ([n_rows][ne0] int8) and
 * d ([n_rows][ne0 / 256]) with all warps of the block; rows r < 32 with bit r of skip set are left
 * out (their h was never written: cold experts). */
__device__ __forceinline__ void q8k_quant_rows_block(const float *__restrict__ x, int64_t xstride, int n_rows,
                                                     int ne0, int8_t *q, float *d, uint32_t skip) {
    const int nb = ne0 / 256, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    for (int task = threadIdx.x >> 5; task < n_rows * nb; task += nw) {
        const int r = task / nb, b = task - r * nb;
        if (r < 32 && (skip >> r & 1u)) continue;
        q8k_quant_block_warp(x + r * xstride + 256 * b, q + (int64_t)r * ne0 + 256 * b, d + task, lane);
    }
}

/* As q8k_quant_rows_block (no skip beyond row 31 either), each warp's blocks taken B at a time
 * with all their loads issued before the first reduction: one L2 round trip per B blocks instead
 * of one per block. Same codes and scales, bit for bit. */
template <int B>
__device__ __forceinline__ void q8k_quant_rows_blockb(const float *__restrict__ x, int64_t xstride, int n_rows,
                                                      int ne0, int8_t *q, float *d, uint32_t skip) {
    const int nb = ne0 / 256, lane = threadIdx.x & 31, nw = blockDim.x >> 5, n_tasks = n_rows * nb;
    for (int t0 = threadIdx.x >> 5; t0 < n_tasks; t0 += B * nw) {
        float4 a[B], b[B];
        bool go[B];
#pragma unroll
        for (int i = 0; i < B; i++) {
            const int task = t0 + i * nw, r = task / nb, bl = task - r * nb;
            go[i] = task < n_tasks && !(r < 32 && (skip >> r & 1u));
            if (go[i]) {
                const float4 *xp = (const float4 *)(x + r * xstride + 256 * bl) + 2 * lane;
                a[i] = __ldg(xp);
                b[i] = __ldg(xp + 1);
            }
        }
#pragma unroll
        for (int i = 0; i < B; i++) {
            const int task = t0 + i * nw, r = task / nb, bl = task - r * nb;
            if (go[i]) q8k_quant_vals_warp(a[i], b[i], q + (int64_t)r * ne0 + 256 * bl, d + task, lane);
        }
    }
}

/* Which int8 decode kernels run (a test / A-B hook, cuda_matvec.cu): false = the current ones
 * (persistent, loads of the next rows in flight while the current ones are summed), true = the
 * first int8 kernels (HOTMOE_CUDA_Q8=v1 in the environment, or hm_cuda_q8_set_variant(1)). Both
 * give bit-identical results. */
bool hm_cu_q8_v1(void);

/* Issue the loads of U units (u0, u0 + 32, ...) of R rows: rw[u][r] (Q: the unit loader). */
template <int T, int R, int U, class Q = q8k<T>>
__device__ __forceinline__ void q8k_load(const uint8_t *const (&rows)[R], int u0, int n_units, qraw (&rw)[U][R]) {
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int un = u0 + 32 * u;
            if (un < n_units) rw[u][r] = Q::load(rows[r] + (int64_t)(un >> 3) * Q::size, un & 7);
        }
}

/* acc[r][t] += row r . x_t for R rows of n_units units and NT tokens, x_t quantised in shared
 * memory: xq + tok[t] * ne0 (int8), xd + tok[t] * (ne0 / 256). Lane l takes units l, l + 32, ...
 * U at a time; rw holds the first U units' loads (issued by the caller with q8k_load). */
template <int T, int NT, int R, int U, class Q = q8k<T>>
__device__ __forceinline__ void q8k_rows_dot(const uint8_t *const (&rows)[R], int n_units, const int8_t *xq,
                                             const float *xd, int ne0, const int (&tok)[NT], float (&acc)[R][NT],
                                             int lane, qraw (&rw)[U][R]) {
    for (int u0 = lane; u0 < n_units; u0 += 32 * U) {
        if (u0 != lane) q8k_load<T, R, U, Q>(rows, u0, n_units, rw);
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int un = u0 + 32 * u;
            if (un >= n_units) break;
            const int b = un >> 3, p = un & 7;
            qunit qu[R];
#pragma unroll
            for (int r = 0; r < R; r++) qu[r] = Q::dec(rw[u][r], rows[r] + (int64_t)b * Q::size, p);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const int8_t *xb = xq + (int64_t)tok[t] * ne0 + 256 * b;
                const uint4 xa = *(const uint4 *)(xb + q8k<T>::off1(p)), xc = *(const uint4 *)(xb + q8k<T>::off2(p));
                const float dx = xd[tok[t] * (ne0 >> 8) + b];
                int bs1 = 0, bs2 = 0;
                if (q8k<T>::kind < 2) {
                    bs1 = q8_sum16(xa);
                    bs2 = q8_sum16(xc);
                }
#pragma unroll
                for (int r = 0; r < R; r++) acc[r][t] = q8k_unit_dot<T>(qu[r], xa, xc, bs1, bs2, dx, acc[r][t]);
            }
        }
    }
}
#endif

} /* namespace hmcu */

#include "cuda_quant_lowbit.cuh"
#include "cuda_q8k_lowbit.cuh"

/* Expand M(T) for every weight type the backend supports (dispatch tables of the .cu files). */
#define HM_CUDA_FOR_TYPES(M) \
    M(HM_TYPE_F32) M(HM_TYPE_F16) M(HM_TYPE_BF16) M(HM_TYPE_Q8_0) M(HM_TYPE_Q4_0) \
    M(HM_TYPE_Q5_0) M(HM_TYPE_MXFP4) M(HM_TYPE_Q4_K) M(HM_TYPE_Q5_K) M(HM_TYPE_Q6_K) M(HM_TYPE_IQ4_XS) \
    M(HM_TYPE_Q4_1) M(HM_TYPE_Q5_1) M(HM_TYPE_IQ4_NL) M(HM_TYPE_Q2_K) M(HM_TYPE_Q3_K) \
    M(HM_TYPE_IQ2_XXS) M(HM_TYPE_IQ2_XS) M(HM_TYPE_IQ2_S) M(HM_TYPE_IQ3_XXS) M(HM_TYPE_IQ3_S) M(HM_TYPE_IQ1_S) \
    M(HM_TYPE_IQ1_M)

/* Expand M(T) for every type of the int8 MMQ prefill (q8k_mmq_type; cuda_mmq.cu's dispatch). */
#define HM_CUDA_FOR_MMQ_TYPES(M) \
    M(HM_TYPE_Q4_K) M(HM_TYPE_Q5_K) M(HM_TYPE_Q6_K) M(HM_TYPE_IQ4_XS) M(HM_TYPE_Q3_K) \
    M(HM_TYPE_IQ2_XXS) M(HM_TYPE_IQ2_XS) M(HM_TYPE_IQ2_S) M(HM_TYPE_IQ3_XXS) M(HM_TYPE_IQ3_S) M(HM_TYPE_IQ1_S) \
    M(HM_TYPE_IQ1_M)

/* Expand M(T) for every type of the int8 decode path (q8k_type; the MoE kernels' dispatch). */
#define HM_CUDA_FOR_Q8K_TYPES(M) \
    M(HM_TYPE_Q4_K) M(HM_TYPE_Q5_K) M(HM_TYPE_Q6_K) M(HM_TYPE_IQ4_XS) M(HM_TYPE_Q2_K) M(HM_TYPE_Q3_K) \
    M(HM_TYPE_IQ2_XXS) M(HM_TYPE_IQ2_XS) M(HM_TYPE_IQ2_S) M(HM_TYPE_IQ3_XXS) M(HM_TYPE_IQ3_S) M(HM_TYPE_IQ1_S) \
    M(HM_TYPE_IQ1_M)

#endif
