/* quant_iq.c - the grid-based i-quant family (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S,
 * IQ1_M): scalar reference dequantisation and dot products against Q8_K, and the registration of
 * the family's rows of the traits table (quantisers: quant_iq_quantize.c; AVX2 / AVX-512 dots:
 * quant_iq_avx2.c, quant_iq_avx512.c).
 *
 * Every block is first unpacked into what all operations share: 256 signed integer levels (the
 * grid points with their signs; for IQ1 eight times grid +- delta, so that they stay integers)
 * and 32 scale codes s, one per group of 8 (the two groups of 8 of a 16 share theirs). The value
 * of element e of group g is then scale(d, s[g]) * level[e] with the float operations in the
 * order ggml's dequantize_row_iq* does them, so dequantisation is bit-exact with ggml's. Dot
 * products sum (2 s + 1) * sum(level * q8) exactly in integers per super-block and scale once by
 * d * d8 * 2^-k (k: 3 for IQ2 and IQ1, 2 for IQ3_XXS, 0 for IQ3_S), accumulating in double: they
 * are the reference the SIMD variants (quant_iq_avx2.c, quant_iq_avx512.c) are measured against. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <string.h>

#include "core/fp16.h"
#include "quant_impl.h"
#include "quant_iq_impl.h"

/* One group of 8 levels: the 8 grid bytes of g (little-endian), negated where signs has a bit. */
static inline void iq_put8(int8_t *q, uint64_t g, uint8_t signs) {
    for (int j = 0; j < 8; j++) {
        const int v = (int)((g >> (8 * j)) & 0xff);
        q[j] = (int8_t)(signs >> j & 1 ? -v : v);
    }
}
/* Two half-groups of 4 (the IQ3 grids) with one sign byte. */
static inline void iq_put4x2(int8_t *q, uint32_t g1, uint32_t g2, uint8_t signs) {
    iq_put8(q, (uint64_t)g1 | (uint64_t)g2 << 32, signs);
}
/* An IQ1 group: 8 * grid value (-1, 0, 1 as int8 bytes) + the shift (+1 or -1). */
static inline void iq1_put8(int8_t *q, uint64_t g, int shift) {
    for (int j = 0; j < 8; j++) q[j] = (int8_t)(8 * (int8_t)(uint8_t)(g >> (8 * j)) + shift);
}

/* Each unpacker: the block's fp16 super-scale as a float, q[256] levels, s[32] scale codes. */
static float unpack_iq2_xxs(const void *vb, int8_t *q, uint8_t *s) {
    const hm_block_iq2_xxs *b = vb;
    for (int ib = 0; ib < 8; ib++) {
        const uint16_t *w = b->qs + 4 * ib;
        const uint32_t idx = (uint32_t)w[0] | (uint32_t)w[1] << 16, sg = (uint32_t)w[2] | (uint32_t)w[3] << 16;
        for (int l = 0; l < 4; l++) {
            iq_put8(q + 32 * ib + 8 * l, hm_iq2xxs_grid[(idx >> (8 * l)) & 0xff], hm_iq_signs7((sg >> (7 * l)) & 0x7f));
            s[4 * ib + l] = (uint8_t)(sg >> 28);
        }
    }
    return hm_fp16_to_f32(b->d);
}

static float unpack_iq2_xs(const void *vb, int8_t *q, uint8_t *s) {
    const hm_block_iq2_xs *b = vb;
    for (int ib = 0; ib < 8; ib++)
        for (int l = 0; l < 4; l++) {
            const uint16_t w = b->qs[4 * ib + l];
            iq_put8(q + 32 * ib + 8 * l, hm_iq2xs_grid[w & 511], hm_iq_signs7(w >> 9));
            s[4 * ib + l] = (uint8_t)(b->scales[ib] >> (4 * (l / 2)) & 0xf);
        }
    return hm_fp16_to_f32(b->d);
}

static float unpack_iq2_s(const void *vb, int8_t *q, uint8_t *s) {
    const hm_block_iq2_s *b = vb;
    for (int ib = 0; ib < 8; ib++)
        for (int l = 0; l < 4; l++) {
            const int k = 4 * ib + l;
            const int idx = b->qs[k] | ((b->qh[ib] >> (2 * l)) & 3) << 8;
            iq_put8(q + 8 * k, hm_iq2s_grid[idx], b->qs[32 + k]);
            s[k] = (uint8_t)(b->scales[ib] >> (4 * (l / 2)) & 0xf);
        }
    return hm_fp16_to_f32(b->d);
}

static float unpack_iq3_xxs(const void *vb, int8_t *q, uint8_t *s) {
    const hm_block_iq3_xxs *b = vb;
    for (int ib = 0; ib < 8; ib++) {
        const uint8_t *qs = b->qs + 8 * ib, *ss = b->qs + 64 + 4 * ib;
        const uint32_t sg = (uint32_t)ss[0] | (uint32_t)ss[1] << 8 | (uint32_t)ss[2] << 16 | (uint32_t)ss[3] << 24;
        for (int l = 0; l < 4; l++) {
            iq_put4x2(q + 32 * ib + 8 * l, hm_iq3xxs_grid[qs[2 * l]], hm_iq3xxs_grid[qs[2 * l + 1]],
                      hm_iq_signs7((sg >> (7 * l)) & 0x7f));
            s[4 * ib + l] = (uint8_t)(sg >> 28);
        }
    }
    return hm_fp16_to_f32(b->d);
}

static float unpack_iq3_s(const void *vb, int8_t *q, uint8_t *s) {
    const hm_block_iq3_s *b = vb;
    for (int ib = 0; ib < 8; ib++)
        for (int l = 0; l < 4; l++) {
            const int k = 8 * ib + 2 * l; /* the group's two half-groups: k, k + 1 */
            const int i1 = b->qs[k] | ((b->qh[ib] >> (2 * l)) & 1) << 8;
            const int i2 = b->qs[k + 1] | ((b->qh[ib] >> (2 * l + 1)) & 1) << 8;
            iq_put4x2(q + 32 * ib + 8 * l, hm_iq3s_grid[i1], hm_iq3s_grid[i2], b->signs[4 * ib + l]);
            s[4 * ib + l] = (uint8_t)(b->scales[ib / 2] >> (4 * (ib % 2)) & 0xf);
        }
    return hm_fp16_to_f32(b->d);
}

static float unpack_iq1_s(const void *vb, int8_t *q, uint8_t *s) {
    const hm_block_iq1_s *b = vb;
    for (int ib = 0; ib < 8; ib++) {
        const uint16_t h = b->qh[ib];
        const int shift = h & 0x8000 ? -1 : 1;
        for (int l = 0; l < 4; l++) {
            const int idx = b->qs[4 * ib + l] | ((h >> (3 * l)) & 7) << 8;
            iq1_put8(q + 32 * ib + 8 * l, hm_iq1s_grid[idx], shift);
            s[4 * ib + l] = (uint8_t)((h >> 12) & 7);
        }
    }
    return hm_fp16_to_f32(b->d);
}

static float unpack_iq1_m(const void *vb, int8_t *q, uint8_t *s) {
    const hm_block_iq1_m *b = vb;
    for (int ib = 0; ib < 8; ib++) {
        const uint16_t sc = (uint16_t)(b->scales[2 * (ib / 2)] | b->scales[2 * (ib / 2) + 1] << 8);
        for (int l = 0; l < 4; l++) {
            const int h = b->qh[2 * ib + l / 2] >> (4 * (l % 2)) & 0xf;
            const int idx = b->qs[4 * ib + l] | (h & 7) << 8;
            iq1_put8(q + 32 * ib + 8 * l, hm_iq1s_grid[idx], h & 8 ? -1 : 1);
            s[4 * ib + l] = (uint8_t)(sc >> (6 * (ib % 2) + 3 * (l / 2)) & 7);
        }
    }
    return hm_fp16_to_f32(hm_iq1m_d(b->scales));
}

/* How a family turns (d, s) into the float scale of a group, as ggml's dequantisers do. */
enum iq_scale_kind {
    IQ_SCALE_QUARTER, /* d * (0.5 + s) * 0.25: IQ2 */
    IQ_SCALE_HALF,    /* d * (0.5 + s) * 0.5: IQ3_XXS */
    IQ_SCALE_ODD,     /* d * (2s + 1): IQ3_S */
    IQ_SCALE_ODD_IQ1, /* d * (2s + 1) times (level / 8): IQ1 */
};

typedef struct iq_desc {
    float (*unpack)(const void *b, int8_t *q, uint8_t *s);
    size_t size;
    enum iq_scale_kind kind;
    float dot_factor; /* the integer dot's 2^-k */
} iq_desc;

static void iq_to_float(const iq_desc *t, const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    int8_t q[HM_QK_K];
    uint8_t s[32];
    for (int64_t i = 0; i < n / HM_QK_K; i++, b += t->size, dst += HM_QK_K) {
        const float d = t->unpack(b, q, s);
        for (int g = 0; g < 32; g++) {
            float dl;
            switch (t->kind) {
            case IQ_SCALE_QUARTER: dl = d * (0.5f + s[g]) * 0.25f; break;
            case IQ_SCALE_HALF: dl = d * (0.5f + s[g]) * 0.5f; break;
            default: dl = d * (float)(2 * s[g] + 1); break;
            }
            if (t->kind == IQ_SCALE_ODD_IQ1)
                for (int j = 0; j < 8; j++) dst[8 * g + j] = dl * ((float)q[8 * g + j] * 0.125f);
            else
                for (int j = 0; j < 8; j++) dst[8 * g + j] = dl * (float)q[8 * g + j];
        }
    }
}

static void iq_vec_dot(const iq_desc *t, int64_t n, float *out, const void *vx, const void *vy) {
    const uint8_t *b = vx;
    const hm_block_q8_k *y = vy;
    int8_t q[HM_QK_K];
    uint8_t s[32];
    double sum = 0;
    for (int64_t i = 0; i < n / HM_QK_K; i++, b += t->size) {
        const float d = t->unpack(b, q, s);
        int64_t sumi = 0;
        for (int g = 0; g < 32; g++) {
            int32_t dg = 0;
            for (int j = 0; j < 8; j++) dg += q[8 * g + j] * y[i].qs[8 * g + j];
            sumi += (int64_t)(2 * s[g] + 1) * dg;
        }
        sum += (double)(d * y[i].d) * (double)sumi;
    }
    *out = (float)(sum * t->dot_factor);
}

static const iq_desc desc_iq2_xxs = {unpack_iq2_xxs, sizeof(hm_block_iq2_xxs), IQ_SCALE_QUARTER, 0.125f};
static const iq_desc desc_iq2_xs = {unpack_iq2_xs, sizeof(hm_block_iq2_xs), IQ_SCALE_QUARTER, 0.125f};
static const iq_desc desc_iq2_s = {unpack_iq2_s, sizeof(hm_block_iq2_s), IQ_SCALE_QUARTER, 0.125f};
static const iq_desc desc_iq3_xxs = {unpack_iq3_xxs, sizeof(hm_block_iq3_xxs), IQ_SCALE_HALF, 0.25f};
static const iq_desc desc_iq3_s = {unpack_iq3_s, sizeof(hm_block_iq3_s), IQ_SCALE_ODD, 1.0f};
static const iq_desc desc_iq1_s = {unpack_iq1_s, sizeof(hm_block_iq1_s), IQ_SCALE_ODD_IQ1, 0.125f};
static const iq_desc desc_iq1_m = {unpack_iq1_m, sizeof(hm_block_iq1_m), IQ_SCALE_ODD_IQ1, 0.125f};

#define IQ_FNS(T)                                                                                       \
    static void to_float_##T##_ref(const void *src, float *dst, int64_t n) { iq_to_float(&desc_##T, src, dst, n); } \
    static void vec_dot_##T##_scalar(int64_t n, float *out, const void *x, const void *y) {             \
        iq_vec_dot(&desc_##T, n, out, x, y);                                                            \
    }
IQ_FNS(iq2_xxs)
IQ_FNS(iq2_xs)
IQ_FNS(iq2_s)
IQ_FNS(iq3_xxs)
IQ_FNS(iq3_s)
IQ_FNS(iq1_s)
IQ_FNS(iq1_m)

/* ---------------------------------------------------------------- registration */

#ifdef __AVX2__
#define IQ_AVX2(f) f##_avx2
#else
#define IQ_AVX2(f) NULL
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define IQ_AVX512(f) f##_avx512
#else
#define IQ_AVX512(f) NULL
#endif

static void iq_set(hm_type_traits *e, const char *name, size_t type_size, hm_to_float_fn to_float_ref,
                   hm_from_float_fn from_float_ref, hm_vec_dot_fn dot_scalar, hm_vec_dot_fn dot_avx2,
                   hm_vec_dot_fn dot_avx512) {
    e->name = name;
    e->blck_size = HM_QK_K;
    e->type_size = type_size;
    e->to_float_ref = to_float_ref;
    e->from_float_ref = from_float_ref;
    e->vec_dot_type = HM_TYPE_Q8_K;
    e->vec_dot_isa[HM_ISA_SCALAR] = dot_scalar;
    e->vec_dot_isa[HM_ISA_AVX2] = dot_avx2;
    e->vec_dot_isa[HM_ISA_AVX512] = dot_avx512;
    e->to_float_isa[HM_ISA_SCALAR] = to_float_ref;
    e->from_float_isa[HM_ISA_SCALAR] = from_float_ref;
}

#define IQ_SET(ID, T)                                                                                     \
    iq_set(&table[ID], #T, sizeof(hm_block_##T), to_float_##T##_ref, hm_from_float_##T##_ref, vec_dot_##T##_scalar, \
           IQ_AVX2(hm_vec_dot_##T), IQ_AVX512(hm_vec_dot_##T))

void hm_quant_register_iq(hm_type_traits *table) {
    IQ_SET(HM_TYPE_IQ2_XXS, iq2_xxs);
    IQ_SET(HM_TYPE_IQ2_XS, iq2_xs);
    IQ_SET(HM_TYPE_IQ2_S, iq2_s);
    IQ_SET(HM_TYPE_IQ3_XXS, iq3_xxs);
    IQ_SET(HM_TYPE_IQ3_S, iq3_s);
    IQ_SET(HM_TYPE_IQ1_S, iq1_s);
    IQ_SET(HM_TYPE_IQ1_M, iq1_m);
}
