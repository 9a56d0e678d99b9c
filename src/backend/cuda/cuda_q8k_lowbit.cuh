/* cuda_q8k_lowbit.cuh - the int8 (dp4a) units of the low-bit weight types whose CPU dot partner is
 * Q8_K: Q2_K, Q3_K and the grid i-quants IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M. They
 * plug into the int8 decode kernels of cuda_matvec.cu and cuda_moe.cu exactly like the K-quants'
 * q8k<T> (cuda_quant.cuh): unit p (0..7) of a 256-block is two chunks of 16 weights as int8
 * values, meeting the Q8_K codes x[off1 .. off1 + 15] and x[off2 .. off2 + 15] of the block, with
 * an integer scale per chunk (and a min per chunk for Q2_K), all read in at most 13 raw words.
 *
 * The integers are the CPU's (quant_lowbit.c, quant_iq.c): per 16 weights of Q2_K / Q3_K the
 * vec_dot's sub-block sum times its scale (Q2_K's mins times the same 16-code sums as its bsums);
 * per group of 8 of the i-quants (2s + 1) * sum(level * q8) with the level the CPU unpacks (the
 * signed grid point; IQ1: 8 * grid point + the +-1 shift). A unit's integer sum is exact (|sum| <
 * 2^24, so its float is too) and the CPU's block sum is the sum of its units' sums; the block
 * scale d * d8 is the same float product, the i-quants' 2^-k factor (0.125, 0.25, 1) is folded into
 * d (a power of two: exact). So only the float accumulation order differs from the CPU, as for the
 * K-quants (kind 0: affine, kind 3: symmetric with two chunk scales; cuda_quant.cuh's
 * q8k_unit_dot).
 *
 * Unit maps:
 * - Q2_K / Q3_K: unit p = (h, q, c) = (p >> 2, (p >> 1) & 1, p & 1) takes the 16-element
 *   sub-blocks j1 = 8h + 4q + c and j2 = j1 + 2, which share the 16 quant bytes 32h + 16c .. +15
 *   (shifts 4q and 4q + 2) and Q3_K's 16 hmask bytes 16c .. +15 (bits 4h + 2q, 4h + 2q + 1).
 * - the i-quants: unit p = 32-element sub-block p, groups of 8 l = 0..3 (chunk 1: groups 0, 1).
 * Included by cuda_quant.cuh after the block decoders (it uses their grid tables and helpers). */
#ifndef HM_BACKEND_CUDA_Q8K_LOWBIT_CUH
#define HM_BACKEND_CUDA_Q8K_LOWBIT_CUH

namespace hmcu {

#ifdef __CUDA_ARCH__
#define HMCU_IQ_GRID(name, i) (d_##name[i])
#else
#define HMCU_IQ_GRID(name, i) (hm_##name[i])
#endif

/* ---- Q2_K: scales[16] at 0, qs[64] at 16, d at 80, dmin at 82 (4-aligned blocks) ----
 * w[0..3] the quant bytes, w[4] scales[8h + 4q .. + 3] (j1's at byte c, j2's at c + 2),
 * w[5] = d | dmin << 16. */
template <> struct q8k<HM_TYPE_Q2_K> {
    static constexpr int size = 84, kind = 0;
    HMCU_HD static int off1(int p) { return 16 * (8 * (p >> 2) + 4 * ((p >> 1) & 1) + (p & 1)); }
    HMCU_HD static int off2(int p) { return off1(p) + 32; }
    HMCU_HD static qraw load(const uint8_t *b, int p) {
        qraw r;
        const uint32_t *q = (const uint32_t *)(b + 16 + 32 * (p >> 2) + 16 * (p & 1));
        r.w[0] = ldg(q); r.w[1] = ldg(q + 1); r.w[2] = ldg(q + 2); r.w[3] = ldg(q + 3);
        r.w[4] = ldg((const uint32_t *)(b + 8 * (p >> 2) + 4 * ((p >> 1) & 1)));
        r.w[5] = ldg((const uint32_t *)(b + 80));
        return r;
    }
    HMCU_HD static qunit dec(const qraw &r, const uint8_t *, int p) {
        qunit u;
        const int sh = 4 * ((p >> 1) & 1), c = p & 1;
HMCU_UNROLL
        for (int i = 0; i < 4; i++) {
            u.v1[i] = (r.w[i] >> sh) & 0x03030303u;
            u.v2[i] = (r.w[i] >> (sh + 2)) & 0x03030303u;
        }
        const uint32_t s1 = (r.w[4] >> (8 * c)) & 0xffu, s2 = (r.w[4] >> (8 * c + 16)) & 0xffu;
        u.s1 = (int)(s1 & 15u);
        u.m1 = (int)(s1 >> 4);
        u.s2 = (int)(s2 & 15u);
        u.m2 = (int)(s2 >> 4);
        u.d = half_f((uint16_t)r.w[5]);
        u.dm = half_f((uint16_t)(r.w[5] >> 16));
        return u;
    }
};

/* ---- Q3_K: hmask[32] at 0, qs[64] at 32, scales[12] at 96, d at 108 (2-aligned blocks) ----
 * w[0..4] the quant bytes and w[5..9] the hmask bytes as aligned words (ld16_a2_raw; every offset
 * read is a multiple of 16, so the block's own alignment decides the realignment), w[10] scales
 * [4q .. 4q + 3] (low nibbles / bits), w[11] scales[8 .. 11] (high bits), w[12] d. A level is
 * q - 4 where its hmask bit is clear: q | 0xfc (q in 0..3, as int8) else q. */
template <> struct q8k<HM_TYPE_Q3_K> {
    static constexpr int size = 110, kind = 3;
    HMCU_HD static int off1(int p) { return 16 * (8 * (p >> 2) + 4 * ((p >> 1) & 1) + (p & 1)); }
    HMCU_HD static int off2(int p) { return off1(p) + 32; }
    HMCU_HD static qraw load(const uint8_t *b, int p) {
        qraw r;
        ld16_a2_raw(b + 32 + 32 * (p >> 2) + 16 * (p & 1), r.w);
        ld16_a2_raw(b + 16 * (p & 1), r.w + 5);
        r.w[10] = ld32_a2(b + 96 + 4 * ((p >> 1) & 1));
        r.w[11] = ld32_a2(b + 104);
        r.w[12] = ld16(b + 108);
        return r;
    }
    HMCU_HD static qunit dec(const qraw &r, const uint8_t *b, int p) {
        qunit u;
        const int h = p >> 2, q = (p >> 1) & 1, c = p & 1;
        const bool odd = ((uintptr_t)b & 2) != 0;
        uint32_t qs[4], hm[4];
        ld16_a2_fix(r.w, odd, qs);
        ld16_a2_fix(r.w + 5, odd, hm);
        const int hb = 4 * h + 2 * q;
HMCU_UNROLL
        for (int i = 0; i < 4; i++) {
            const uint32_t n1 = ((hm[i] >> hb) & 0x01010101u) ^ 0x01010101u;
            const uint32_t n2 = ((hm[i] >> (hb + 1)) & 0x01010101u) ^ 0x01010101u;
            u.v1[i] = ((qs[i] >> (4 * q)) & 0x03030303u) | n1 * 0xfcu;
            u.v2[i] = ((qs[i] >> (4 * q + 2)) & 0x03030303u) | n2 * 0xfcu;
        }
        const int sl = 4 * h, shh = 2 * (2 * h + q);
        u.s1 = (int)(((r.w[10] >> (8 * c + sl)) & 15u) | ((r.w[11] >> (8 * c + shh)) & 3u) << 4) - 32;
        u.s2 = (int)(((r.w[10] >> (8 * c + 16 + sl)) & 15u) | ((r.w[11] >> (8 * c + 16 + shh)) & 3u) << 4) - 32;
        u.m1 = u.m2 = 0;
        u.d = half_f((uint16_t)r.w[12]);
        u.dm = 0.0f;
        return u;
    }
};

/* ---- the grid i-quants ---- */

/* The byte masks (0xff where the bit is set) of the low and high 4 bits of an 8-bit sign set. */
HMCU_HD uint32_t iq_smask4(uint32_t s4) { return (((s4 & 15u) * 0x00204081u) & 0x01010101u) * 0xffu; }
/* Four grid magnitudes (bytes >= 1) negated where m has 0xff: (g ^ m) + 1 never carries out of a
 * byte because g >= 1 keeps ~g <= 0xfe. */
HMCU_HD uint32_t iq_sign4(uint32_t g, uint32_t m) { return (g ^ m) + (m & 0x01010101u); }
/* A group of 8 levels (two words) from its grid point and 8 sign bits. */
HMCU_HD void iq_group(uint64_t grid, uint32_t signs, uint32_t *v) {
    v[0] = iq_sign4((uint32_t)grid, iq_smask4(signs));
    v[1] = iq_sign4((uint32_t)(grid >> 32), iq_smask4(signs >> 4));
}
/* IQ1: the levels 8 * g + shift of four grid bytes g in {-1, 0, 1} (as 0xff, 0, 1): the low two
 * bits of each byte select from a 4-entry byte table (entry 2 is never used). */
HMCU_HD uint32_t iq1_lvl4(uint32_t g, bool neg) {
    const uint32_t sel = (g & 3u) | (g >> 4 & 0x30u) | (g >> 8 & 0x300u) | (g >> 12 & 0x3000u);
    return byte_perm(neg ? 0xf70007ffu : 0xf9000901u, 0, sel);
}
HMCU_HD void iq1_group(uint64_t grid, bool neg, uint32_t *v) {
    v[0] = iq1_lvl4((uint32_t)grid, neg);
    v[1] = iq1_lvl4((uint32_t)(grid >> 32), neg);
}
/* Groups 0, 1 are chunk 1 (v1), groups 2, 3 chunk 2 (v2). */
HMCU_HD uint32_t *iq_slot(qunit &u, int l) { return l < 2 ? u.v1 + 2 * l : u.v2 + 2 * (l - 2); }

template <int T> struct q8k_iq {
    HMCU_HD static int off1(int p) { return 32 * p; }
    HMCU_HD static int off2(int p) { return 32 * p + 16; }
};

/* iq2_xxs (66 bytes): w[0] d, w[1] the four grid indices, w[2] signs (7 bits a group) | s << 28. */
template <> struct q8k<HM_TYPE_IQ2_XXS> : q8k_iq<HM_TYPE_IQ2_XXS> {
    static constexpr int size = 66, kind = 3;
    HMCU_HD static qraw load(const uint8_t *b, int p) {
        qraw r;
        r.w[0] = ld16(b);
        r.w[1] = ld32_a2(b + 2 + 8 * p);
        r.w[2] = ld32_a2(b + 6 + 8 * p);
        return r;
    }
    HMCU_HD static qunit dec(const qraw &r, const uint8_t *, int) {
        qunit u;
HMCU_UNROLL
        for (int l = 0; l < 4; l++)
            iq_group(HMCU_IQ_GRID(iq2xxs_grid, (r.w[1] >> (8 * l)) & 255u), iq_signs7((r.w[2] >> (7 * l)) & 127u),
                     iq_slot(u, l));
        u.s1 = u.s2 = (int)(2 * (r.w[2] >> 28) + 1);
        u.m1 = u.m2 = 0;
        u.d = half_f((uint16_t)r.w[0]) * 0.125f;
        u.dm = 0.0f;
        return u;
    }
};

/* iq2_xs (74 bytes): w[0] d, w[1..2] the four 16-bit codes (9-bit index | 7 signs << 9), w[3] the
 * scales byte (groups 0-1 low nibble, 2-3 high). */
template <> struct q8k<HM_TYPE_IQ2_XS> : q8k_iq<HM_TYPE_IQ2_XS> {
    static constexpr int size = 74, kind = 3;
    HMCU_HD static qraw load(const uint8_t *b, int p) {
        qraw r;
        r.w[0] = ld16(b);
        r.w[1] = ld32_a2(b + 2 + 8 * p);
        r.w[2] = ld32_a2(b + 6 + 8 * p);
        r.w[3] = b[66 + p];
        return r;
    }
    HMCU_HD static qunit dec(const qraw &r, const uint8_t *, int) {
        qunit u;
HMCU_UNROLL
        for (int l = 0; l < 4; l++) {
            const uint32_t c = (r.w[1 + (l >> 1)] >> (16 * (l & 1))) & 0xffffu;
            iq_group(HMCU_IQ_GRID(iq2xs_grid, c & 511u), iq_signs7(c >> 9), iq_slot(u, l));
        }
        u.s1 = (int)(2 * (r.w[3] & 15u) + 1);
        u.s2 = (int)(2 * (r.w[3] >> 4) + 1);
        u.m1 = u.m2 = 0;
        u.d = half_f((uint16_t)r.w[0]) * 0.125f;
        u.dm = 0.0f;
        return u;
    }
};

/* iq2_s (82 bytes): w[0] d, w[1] the four index low bytes, w[2] the four sign bytes, w[3] = qh
 * byte | scales byte << 8. */
template <> struct q8k<HM_TYPE_IQ2_S> : q8k_iq<HM_TYPE_IQ2_S> {
    static constexpr int size = 82, kind = 3;
    HMCU_HD static qraw load(const uint8_t *b, int p) {
        qraw r;
        r.w[0] = ld16(b);
        r.w[1] = ld32_a2(b + 2 + 4 * p);
        r.w[2] = ld32_a2(b + 34 + 4 * p);
        r.w[3] = (uint32_t)b[66 + p] | (uint32_t)b[74 + p] << 8;
        return r;
    }
    HMCU_HD static qunit dec(const qraw &r, const uint8_t *, int) {
        qunit u;
HMCU_UNROLL
        for (int l = 0; l < 4; l++) {
            const uint32_t idx = ((r.w[1] >> (8 * l)) & 255u) | ((r.w[3] >> (2 * l)) & 3u) << 8;
            iq_group(HMCU_IQ_GRID(iq2s_grid, idx), (r.w[2] >> (8 * l)) & 255u, iq_slot(u, l));
        }
        u.s1 = (int)(2 * ((r.w[3] >> 8) & 15u) + 1);
        u.s2 = (int)(2 * ((r.w[3] >> 12) & 15u) + 1);
        u.m1 = u.m2 = 0;
        u.d = half_f((uint16_t)r.w[0]) * 0.125f;
        u.dm = 0.0f;
        return u;
    }
};

/* iq3_xxs (98 bytes): w[0] d, w[1..2] the eight 4-element grid indices, w[3] signs | s << 28. */
template <> struct q8k<HM_TYPE_IQ3_XXS> : q8k_iq<HM_TYPE_IQ3_XXS> {
    static constexpr int size = 98, kind = 3;
    HMCU_HD static qraw load(const uint8_t *b, int p) {
        qraw r;
        r.w[0] = ld16(b);
        r.w[1] = ld32_a2(b + 2 + 8 * p);
        r.w[2] = ld32_a2(b + 6 + 8 * p);
        r.w[3] = ld32_a2(b + 66 + 4 * p);
        return r;
    }
    HMCU_HD static qunit dec(const qraw &r, const uint8_t *, int) {
        qunit u;
HMCU_UNROLL
        for (int l = 0; l < 4; l++) {
            const uint32_t ix = r.w[1 + (l >> 1)] >> (16 * (l & 1));
            const uint64_t grid = (uint64_t)HMCU_IQ_GRID(iq3xxs_grid, ix & 255u) |
                                  (uint64_t)HMCU_IQ_GRID(iq3xxs_grid, (ix >> 8) & 255u) << 32;
            iq_group(grid, iq_signs7((r.w[3] >> (7 * l)) & 127u), iq_slot(u, l));
        }
        u.s1 = u.s2 = (int)(2 * (r.w[3] >> 28) + 1);
        u.m1 = u.m2 = 0;
        u.d = half_f((uint16_t)r.w[0]) * 0.25f;
        u.dm = 0.0f;
        return u;
    }
};

/* iq3_s (110 bytes): w[0] d, w[1..2] the eight index low bytes, w[3] the four sign bytes, w[4] =
 * qh byte | scales byte << 8 (nibble p % 2 is the sub-block's). */
template <> struct q8k<HM_TYPE_IQ3_S> : q8k_iq<HM_TYPE_IQ3_S> {
    static constexpr int size = 110, kind = 3;
    HMCU_HD static qraw load(const uint8_t *b, int p) {
        qraw r;
        r.w[0] = ld16(b);
        r.w[1] = ld32_a2(b + 2 + 8 * p);
        r.w[2] = ld32_a2(b + 6 + 8 * p);
        r.w[3] = ld32_a2(b + 74 + 4 * p);
        r.w[4] = (uint32_t)b[66 + p] | (uint32_t)b[106 + (p >> 1)] << 8;
        return r;
    }
    HMCU_HD static qunit dec(const qraw &r, const uint8_t *, int p) {
        qunit u;
HMCU_UNROLL
        for (int l = 0; l < 4; l++) {
            const uint32_t ix = r.w[1 + (l >> 1)] >> (16 * (l & 1));
            const uint32_t i1 = (ix & 255u) | ((r.w[4] >> (2 * l)) & 1u) << 8;
            const uint32_t i2 = ((ix >> 8) & 255u) | ((r.w[4] >> (2 * l + 1)) & 1u) << 8;
            const uint64_t grid = (uint64_t)HMCU_IQ_GRID(iq3s_grid, i1) | (uint64_t)HMCU_IQ_GRID(iq3s_grid, i2) << 32;
            iq_group(grid, (r.w[3] >> (8 * l)) & 255u, iq_slot(u, l));
        }
        u.s1 = u.s2 = (int)(2 * ((r.w[4] >> (8 + 4 * (p & 1))) & 15u) + 1);
        u.m1 = u.m2 = 0;
        u.d = half_f((uint16_t)r.w[0]);
        u.dm = 0.0f;
        return u;
    }
};

/* iq1_s (50 bytes): w[0] d, w[1] the four index low bytes, w[2] the sub-block's qh word (3 index
 * bits a group, s in bits 12..14, the shift's sign in bit 15). */
template <> struct q8k<HM_TYPE_IQ1_S> : q8k_iq<HM_TYPE_IQ1_S> {
    static constexpr int size = 50, kind = 3;
    HMCU_HD static qraw load(const uint8_t *b, int p) {
        qraw r;
        r.w[0] = ld16(b);
        r.w[1] = ld32_a2(b + 2 + 4 * p);
        r.w[2] = ld16(b + 34 + 2 * p);
        return r;
    }
    HMCU_HD static qunit dec(const qraw &r, const uint8_t *, int) {
        qunit u;
        const bool neg = (r.w[2] & 0x8000u) != 0;
HMCU_UNROLL
        for (int l = 0; l < 4; l++) {
            const uint32_t idx = ((r.w[1] >> (8 * l)) & 255u) | ((r.w[2] >> (3 * l)) & 7u) << 8;
            iq1_group(HMCU_IQ_GRID(iq1s_grid, idx), neg, iq_slot(u, l));
        }
        u.s1 = u.s2 = (int)(2 * ((r.w[2] >> 12) & 7u) + 1);
        u.m1 = u.m2 = 0;
        u.d = half_f((uint16_t)r.w[0]) * 0.125f;
        u.dm = 0.0f;
        return u;
    }
};

/* iq1_m (56 bytes, no d field): w[0] the four index low bytes, w[1] qh[2p] | qh[2p + 1] << 8 (a
 * nibble a group: 3 index bits, the shift's sign), w[2..3] the four scale words (3-bit scales, the
 * fp16 super-scale in their top nibbles). */
template <> struct q8k<HM_TYPE_IQ1_M> : q8k_iq<HM_TYPE_IQ1_M> {
    static constexpr int size = 56, kind = 3;
    HMCU_HD static qraw load(const uint8_t *b, int p) {
        qraw r;
        r.w[0] = ld32_a2(b + 4 * p);
        r.w[1] = ld16(b + 32 + 2 * p);
        r.w[2] = ld32_a2(b + 48);
        r.w[3] = ld32_a2(b + 52);
        return r;
    }
    HMCU_HD static qunit dec(const qraw &r, const uint8_t *, int p) {
        qunit u;
HMCU_UNROLL
        for (int l = 0; l < 4; l++) {
            const uint32_t h = (r.w[1] >> (4 * l)) & 15u;
            iq1_group(HMCU_IQ_GRID(iq1s_grid, ((r.w[0] >> (8 * l)) & 255u) | (h & 7u) << 8), (h & 8u) != 0,
                      iq_slot(u, l));
        }
        /* a select, not r.w[2 + (p >> 2)]: p is a run-time value, and an index would put r in local memory */
        const uint32_t sc = ((p & 4 ? r.w[3] : r.w[2]) >> (16 * ((p >> 1) & 1))) & 0xffffu;
        const uint32_t d16 = (r.w[2] >> 12 & 0x000fu) | (r.w[2] >> 24 & 0x00f0u) | (r.w[3] >> 4 & 0x0f00u) |
                             (r.w[3] >> 16 & 0xf000u);
        u.s1 = (int)(2 * ((sc >> (6 * (p & 1))) & 7u) + 1);
        u.s2 = (int)(2 * ((sc >> (6 * (p & 1) + 3)) & 7u) + 1);
        u.m1 = u.m2 = 0;
        u.d = half_f((uint16_t)d16) * 0.125f;
        u.dm = 0.0f;
        return u;
    }
};

#undef HMCU_IQ_GRID

} /* namespace hmcu */

#endif
