/* test_quant_iq.c - the grid i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M).
 *
 * 1. Traits: ggml's names, block and type sizes.
 * 2. Hand-built blocks: fields packed here from ggml-common.h's layout, grid entries written out
 *    from ggml's tables, expected floats from the format's formula (all exact dyadic numbers).
 * 3. vec_dot equals the dot of the dequantised operands (random bit patterns, gaussian and
 *    extreme activations), and every SIMD variant agrees with the scalar reference.
 * 4. The importance-matrix quantisers: golden hashes of the bytes ggml's quantize_<type> writes
 *    (recorded from a llama.cpp build of ggml-base on an input built from exact float operations,
 *    with an importance vector and with uniform importance), and the round trip of gaussian data
 *    within the error of a 3-level (2-bit) grid.
 * (Byte-identity with ggml's dequantisers on millions of random blocks is checked outside the
 * repository against a llama.cpp build: see the note.) */
#include <stdint.h>
#include <string.h>

#include "core/fp16.h"
#include "quant/quant.h"
#include "quant/quant_k_impl.h"
#include "test.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static uint32_t rnd_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}
static double rnd_unit(void) { return (rnd_u32() + 0.5) / 4294967296.0; }
static float rnd_gauss(void) {
    return (float)(sqrt(-2.0 * log(rnd_unit())) * cos(6.283185307179586 * rnd_unit()));
}
static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) abort();
    return p;
}

static const int iq_types[] = {HM_TYPE_IQ2_XXS, HM_TYPE_IQ2_XS, HM_TYPE_IQ2_S, HM_TYPE_IQ3_XXS,
                               HM_TYPE_IQ3_S,   HM_TYPE_IQ1_S,  HM_TYPE_IQ1_M};
#define N_TYPES 7

/* ---------------------------------------------------------------- 1. traits */

static void test_traits(void) {
    static const struct { int t; const char *name; size_t size; } want[N_TYPES] = {
        {HM_TYPE_IQ2_XXS, "iq2_xxs", 66}, {HM_TYPE_IQ2_XS, "iq2_xs", 74}, {HM_TYPE_IQ2_S, "iq2_s", 82},
        {HM_TYPE_IQ3_XXS, "iq3_xxs", 98}, {HM_TYPE_IQ3_S, "iq3_s", 110},  {HM_TYPE_IQ1_S, "iq1_s", 50},
        {HM_TYPE_IQ1_M, "iq1_m", 56},
    };
    for (int i = 0; i < N_TYPES; i++) {
        const hm_type_traits *tr = hm_type_get(want[i].t);
        CHECK(tr && tr->name && strcmp(tr->name, want[i].name) == 0);
        CHECK(tr->blck_size == 256);
        CHECK(tr->type_size == want[i].size);
        CHECK(tr->vec_dot_type == HM_TYPE_Q8_K);
        CHECK(tr->to_float_ref && tr->vec_dot_isa[HM_ISA_SCALAR]);
        CHECK(hm_type_from_name(want[i].name) == want[i].t);
        CHECK(hm_row_size(want[i].t, 1024) == 4 * want[i].size);
    }
}

/* ---------------------------------------------------------------- 2. hand-built blocks */

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Dequantise one block of type t and compare elements [0, n) with want. */
static void check_block(int t, const uint8_t *blk, const float *want, int n, const char *what) {
    float got[256];
    hm_type_get(t)->to_float_ref(blk, got, 256);
    for (int i = 0; i < n; i++)
        CHECKF(got[i] == want[i], "%s: element %d: %.9g, want %.9g", what, i, (double)got[i], (double)want[i]);
}

static void test_hand_iq2_xxs(void) {
    uint8_t b[66] = {0};
    put16(b, 0x3c00); /* d = 1 */
    /* sub-block 0: index bytes {1, 0, 0, 0}; s = 3; signs7 group 0 = 0b0000001 (odd: the parity bit
     * negates element 7 too), group 1 = 0b0000011 (even) */
    put32(b + 2, 0x00000001u);
    put32(b + 6, 3u << 28 | 0x03u << 7 | 0x01u);
    /* grid[1] = 0x080808080808082b: 43, 8, 8, 8, 8, 8, 8, 8; grid[0] all 8; db = (0.5 + 3) / 4 */
    const float db = 0.875f;
    float want[40];
    const float g0[8] = {-43, 8, 8, 8, 8, 8, 8, -8}, g1[8] = {-8, -8, 8, 8, 8, 8, 8, 8};
    for (int j = 0; j < 8; j++) want[j] = db * g0[j], want[8 + j] = db * g1[j];
    for (int j = 16; j < 32; j++) want[j] = db * 8;
    for (int j = 32; j < 40; j++) want[j] = 0.125f * 8; /* sub-block 1: all zero bytes, s = 0 */
    check_block(HM_TYPE_IQ2_XXS, b, want, 40, "iq2_xxs");
}

static void test_hand_iq2_xs(void) {
    uint8_t b[74] = {0};
    put16(b, 0x4000); /* d = 2 */
    put16(b + 2, 1 | 5 << 9);  /* group 0: grid[1], signs7 0b101 (even) */
    put16(b + 6, 0 | 1 << 9);  /* group 2: grid[0], signs7 0b1 (odd: element 7 too) */
    put16(b + 8, 300);         /* group 3: grid[300] = 0x1908190808191908 */
    b[2 + 64] = 0x21;          /* groups 0-1 s = 1, groups 2-3 s = 2 */
    const float d01 = 2 * 1.5f * 0.25f, d23 = 2 * 2.5f * 0.25f;
    const float g0[8] = {-43, 8, -8, 8, 8, 8, 8, 8}, g2[8] = {-8, 8, 8, 8, 8, 8, 8, -8},
                g3[8] = {8, 25, 25, 8, 8, 25, 8, 25};
    float want[32];
    for (int j = 0; j < 8; j++) {
        want[j] = d01 * g0[j];
        want[8 + j] = d01 * 8;
        want[16 + j] = d23 * g2[j];
        want[24 + j] = d23 * g3[j];
    }
    check_block(HM_TYPE_IQ2_XS, b, want, 32, "iq2_xs");
}

static void test_hand_iq2_s(void) {
    uint8_t b[82] = {0};
    put16(b, 0x3c00);
    b[2 + 0] = 1;        /* group 0: index 1 */
    b[2 + 1] = 1;        /* group 1: index 1 | qh bits 2-3 = 1 -> 257 = 0x0819081919192b08 */
    b[2 + 64] = 1 << 2;  /* qh[0] */
    b[2 + 32] = 0x81;    /* group 0's explicit signs: elements 0 and 7 */
    b[2 + 33] = 0x02;    /* group 1: element 1 */
    b[2 + 72] = 0x04;    /* scales[0]: groups 0-1 s = 4 */
    const float db = 4.5f * 0.25f;
    const float g0[8] = {-43, 8, 8, 8, 8, 8, 8, -8}, g1[8] = {8, -43, 25, 25, 25, 8, 25, 8};
    float want[16];
    for (int j = 0; j < 8; j++) want[j] = db * g0[j], want[8 + j] = db * g1[j];
    check_block(HM_TYPE_IQ2_S, b, want, 16, "iq2_s");
}

static void test_hand_iq3_xxs(void) {
    uint8_t b[98] = {0};
    put16(b, 0x3c00);
    b[2] = 2; /* half-groups 0, 1: grid[2] = 0x04040424 (36, 4, 4, 4) and grid[0] (4, 4, 4, 4) */
    put32(b + 2 + 64, 2u << 28 | 0x10u); /* s = 2; group 0 signs7 = element 4 (odd: element 7 too) */
    const float db = 2.5f * 0.5f;
    const float g0[8] = {36, 4, 4, 4, -4, 4, 4, -4};
    float want[16];
    for (int j = 0; j < 8; j++) want[j] = db * g0[j], want[8 + j] = db * 4;
    check_block(HM_TYPE_IQ3_XXS, b, want, 16, "iq3_xxs");
}

static void test_hand_iq3_s(void) {
    uint8_t b[110] = {0};
    put16(b, 0x3800); /* d = 0.5 */
    b[2 + 0] = 1;     /* grid[1] = 0x01010103: 3, 1, 1, 1 */
    b[2 + 1] = 0;     /* with qh[0] bit 1: grid[256] = 0x05090507: 7, 5, 9, 5 */
    b[2 + 64] = 0x02;
    b[2 + 72] = 0x0f;      /* signs of group 0: elements 0..3 */
    b[2 + 104] = 0x03;     /* scales[0]: sub-block 0 s = 3, sub-block 1 s = 0 */
    const float db = 0.5f * 7;
    const float g0[8] = {-3, -1, -1, -1, 7, 5, 9, 5};
    float want[40];
    for (int j = 0; j < 8; j++) want[j] = db * g0[j];
    for (int j = 8; j < 32; j++) want[j] = db * 1;
    for (int j = 32; j < 40; j++) want[j] = 0.5f * 1;
    check_block(HM_TYPE_IQ3_S, b, want, 40, "iq3_s");
}

static void test_hand_iq1_s(void) {
    uint8_t b[50] = {0};
    put16(b, 0x3c00);
    b[2 + 0] = 1;                                   /* grid[1] = 0xffffffffffffff01: 1, -1 x 7 */
    put16(b + 2 + 32, (uint16_t)(0x8000 | 2 << 12 | 1 << 3)); /* s = 2, shift -1/8; group 1 index 256 */
    /* grid[256] = 0xff00ff01000100ff: -1, 0, 1, 0, 1, -1, 0, -1 */
    const float dl = 5, g1[8] = {-1, 0, 1, 0, 1, -1, 0, -1};
    float want[32];
    want[0] = dl * (1 - 0.125f);
    for (int j = 1; j < 8; j++) want[j] = dl * (-1 - 0.125f);
    for (int j = 0; j < 8; j++) want[8 + j] = dl * (g1[j] - 0.125f);
    for (int j = 16; j < 32; j++) want[j] = dl * (-1 - 0.125f);
    check_block(HM_TYPE_IQ1_S, b, want, 32, "iq1_s");
}

static void test_hand_iq1_m(void) {
    uint8_t b[56] = {0};
    b[0] = 1;   /* group 0: grid[1] */
    b[2] = 44;  /* group 2: index 44 | 256 = 300 = 0xff000000ff00ff00: 0, -1, 0, -1, 0, 0, 0, -1 */
    b[32] = 0x08; /* qh[0]: group 0 shift -1/8, group 1 +1/8 (index 0) */
    b[33] = 0x01; /* qh[1]: group 2 index bit 8, shift +1/8 */
    /* scale words: d = 1.0 = 0x3c00 in the top nibbles (word 0 <- 0x0, 1 <- 0x0, 2 <- 0xc,
     * 3 <- 0x3); word 0 bits 0-2 = 1 (groups 0-1 of sub-block 0), bits 3-5 = 2 (groups 2-3) */
    put16(b + 48, 1 | 2 << 3);
    put16(b + 52, 0xc000);
    put16(b + 54, 0x3000);
    const float g2[8] = {0, -1, 0, -1, 0, 0, 0, -1};
    float want[32];
    want[0] = 3 * (1 - 0.125f);
    for (int j = 1; j < 8; j++) want[j] = 3 * (-1 - 0.125f);
    for (int j = 0; j < 8; j++) {
        want[8 + j] = 3 * (-1 + 0.125f);
        want[16 + j] = 5 * (g2[j] + 0.125f);
        want[24 + j] = 5 * (-1 + 0.125f);
    }
    check_block(HM_TYPE_IQ1_M, b, want, 32, "iq1_m");
}

/* ---------------------------------------------------------------- 3. dot products */

/* Random bytes with a sane fp16 super-scale (in the d field, or iq1_m's scale nibbles). */
static void random_blocks(int t, uint8_t *q, int64_t nb) {
    const size_t ts = hm_type_get(t)->type_size;
    for (size_t i = 0; i < (size_t)nb * ts; i++) q[i] = (uint8_t)rnd_u32();
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *p = q + (size_t)b * ts;
        const uint16_t d = hm_f32_to_fp16((float)(rnd_unit() * 0.01 + 0.001));
        if (t == HM_TYPE_IQ1_M) {
            for (int w = 0; w < 4; w++) p[49 + 2 * w] = (uint8_t)((p[49 + 2 * w] & 0x0f) | ((d >> (4 * w)) & 0xf) << 4);
        } else {
            memcpy(p, &d, 2);
        }
    }
}

static void deq_dot(int t, int64_t n, const void *qx, const void *qy, double *dot, double *mag) {
    float *a = xmalloc((size_t)n * 4), *b = xmalloc((size_t)n * 4);
    hm_type_get(t)->to_float_ref(qx, a, n);
    hm_type_get(HM_TYPE_Q8_K)->to_float_ref(qy, b, n);
    double s = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        s += (double)a[i] * b[i];
        m += fabs((double)a[i] * b[i]);
    }
    *dot = s;
    *mag = m;
    free(a);
    free(b);
}

static void test_dots(void) {
    static const int64_t lens[] = {256, 512, 2048, 7168};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        const int64_t n = lens[li], nb = n / 256;
        float *yf = xmalloc((size_t)n * 4);
        uint8_t *qx = xmalloc((size_t)nb * 256), *qy = xmalloc((size_t)nb * sizeof(hm_block_q8_k));
        for (int ti = 0; ti < N_TYPES; ti++) {
            const int t = iq_types[ti];
            const hm_type_traits *tr = hm_type_get(t);
            for (int mode = 0; mode < 2; mode++) {
                /* random bit patterns against 0: gaussian activations, 1: extreme +-1 (codes +-127) */
                for (int64_t i = 0; i < n; i++) yf[i] = mode == 1 ? (rnd_u32() & 1 ? 1.f : -1.f) : rnd_gauss();
                random_blocks(t, qx, nb);
                hm_type_get(HM_TYPE_Q8_K)->from_float_ref(yf, qy, n);
                double want, mag;
                deq_dot(t, n, qx, qy, &want, &mag);
                float ref = NAN;
                tr->vec_dot_isa[HM_ISA_SCALAR](n, &ref, qx, qy);
                CHECKF(fabs(ref - want) <= 2e-6 * mag + 1e-30, "%s n=%lld mode %d: scalar %.9g vs dequantised %.9g (mag %.3g)",
                       tr->name, (long long)n, mode, (double)ref, want, mag);
                float simd[HM_ISA_COUNT];
                for (int isa = HM_ISA_AVX2; isa < HM_ISA_COUNT; isa++) {
                    if (!tr->vec_dot_isa[isa] || !hm_isa_available((hm_isa)isa)) continue;
                    float got = NAN;
                    tr->vec_dot_isa[isa](n, &got, qx, qy);
                    simd[isa] = got;
                    CHECKF(fabs(got - ref) <= 1e-6 * mag + 1e-30, "%s n=%lld mode %d isa %d: %.9g vs scalar %.9g (mag %.3g)",
                           tr->name, (long long)n, mode, isa, (double)got, (double)ref, mag);
                }
                /* AVX-512 keeps AVX2's float order: the same bits (a model's logits do not move with the ISA) */
                if (tr->vec_dot_isa[HM_ISA_AVX2] && tr->vec_dot_isa[HM_ISA_AVX512] && hm_isa_available(HM_ISA_AVX512))
                    CHECKF(memcmp(&simd[HM_ISA_AVX2], &simd[HM_ISA_AVX512], sizeof(float)) == 0,
                           "%s n=%lld mode %d: avx512 %.9g, avx2 %.9g", tr->name, (long long)n, mode,
                           (double)simd[HM_ISA_AVX512], (double)simd[HM_ISA_AVX2]);
            }
        }
        free(yf);
        free(qx);
        free(qy);
    }
}

/* ---------------------------------------------------------------- 4. quantisers */

static uint64_t fnv1a(const uint8_t *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}
/* Approximately N(0,1) from exact float operations only (as test_quant_k.c's golden input). */
static float rnd_golden(void) {
    int32_t s = 0;
    for (int k = 0; k < 4; k++) s += (int32_t)(rnd_u32() >> 20);
    return (float)(s - 8190) * (1.0f / 2048.0f);
}

static void test_golden(void) {
    /* FNV-1a of ggml_quantize_chunk(type, x, q, 0, 4, 4096, w): w = the dyadic importance below,
     * then w = all ones */
    /* and (none: ggml refuses) w = NULL, ggml's own weighting */
    static const struct { int t; uint64_t imatrix, ones, none; } want[] = {
        {HM_TYPE_IQ2_XXS, 0xc6e24ab5ea17741dull, 0x792a02b377121153ull, 0},
        {HM_TYPE_IQ2_XS, 0x8976642d399ae08full, 0xeac46fdc6a40dd3full, 0},
        {HM_TYPE_IQ2_S, 0xabaa263bdd7d3c2dull, 0x3ba2672580b1ac61ull, 0x2badf18e5a79175bull},
        {HM_TYPE_IQ3_XXS, 0xb99af9bfd1535a52ull, 0xc72389e6c143842cull, 0x747ec500d02b670eull},
        {HM_TYPE_IQ3_S, 0xe772427db0d28bfcull, 0xd9d5d2d88afb918aull, 0x66f2745eb4ae4aa2ull},
        {HM_TYPE_IQ1_S, 0x04d4366e2f85a7e8ull, 0xab30b1fc637fb276ull, 0},
        {HM_TYPE_IQ1_M, 0x2e2982ec9a547196ull, 0xca7103a134775716ull, 0xb2843440e8959f05ull},
    };
    const int64_t n = 4096, nrow = 4;
    float *x = xmalloc((size_t)(n * nrow) * 4), *qw = xmalloc((size_t)n * 4), *ones = xmalloc((size_t)n * 4);
    uint8_t *q = xmalloc((size_t)(n * nrow));
    rng_state = 0x243f6a8885a308d3ull;
    for (int64_t i = 0; i < n * nrow; i++) {
        float g = rnd_golden();
        x[i] = (i / 256) % 7 == 3 ? g * g * g : (i / 32) % 11 == 5 ? 0.f : g;
    }
    for (int i = 0; i < n; i++) {
        qw[i] = (float)(1 + (i * 37) % 13) * 0.25f;
        ones[i] = 1.0f;
    }
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const size_t bytes = hm_row_size(want[i].t, n) * (size_t)nrow;
        CHECK(hm_quant_iq_quantize(want[i].t, x, q, nrow, n, qw));
        uint64_t h = fnv1a(q, bytes);
        CHECKF(h == want[i].imatrix, "%s imatrix golden hash %016llx, ggml's %016llx", hm_type_name(want[i].t),
               (unsigned long long)h, (unsigned long long)want[i].imatrix);
        CHECK(hm_quant_iq_quantize(want[i].t, x, q, nrow, n, ones));
        h = fnv1a(q, bytes);
        CHECKF(h == want[i].ones, "%s uniform golden hash %016llx, ggml's %016llx", hm_type_name(want[i].t),
               (unsigned long long)h, (unsigned long long)want[i].ones);
        /* NULL: ggml's own weighting where it has one, else uniform importance */
        CHECK(hm_quant_iq_quantize(want[i].t, x, q, nrow, n, NULL));
        h = fnv1a(q, bytes);
        const uint64_t w_none = want[i].none ? want[i].none : want[i].ones;
        CHECKF(h == w_none, "%s no-importance golden hash %016llx, want %016llx", hm_type_name(want[i].t),
               (unsigned long long)h, (unsigned long long)w_none);
    }
    free(x);
    free(qw);
    free(ones);
    free(q);
}

/* Gaussian data through from_float_ref and back. The relative RMS errors of ggml's quantisers on
 * N(0,1) here (the same bytes, pinned by the golden hashes) are about IQ2_XXS 0.34, IQ2_XS 0.30,
 * IQ2_S 0.27, IQ3_XXS 0.21, IQ3_S 0.16, IQ1_S 0.49, IQ1_M 0.58; the bounds (about 1.3 times)
 * catch a wrong scale or packing (which gives >= 1) and sit in the order of the formats' bits. */
static void test_round_trip(void) {
    static const double rt_bound[N_TYPES] = {0.45, 0.40, 0.36, 0.28, 0.22, 0.65, 0.75};
    const int64_t n = 256 * 32;
    float *x = xmalloc((size_t)n * 4), *y = xmalloc((size_t)n * 4);
    uint8_t *q = xmalloc((size_t)n);
    for (int k = 0; k < N_TYPES; k++) {
        const hm_type_traits *tr = hm_type_get(iq_types[k]);
        CHECK(tr->from_float_ref != NULL);
        if (!tr->from_float_ref) continue;
        for (int64_t i = 0; i < n; i++) x[i] = rnd_gauss();
        tr->from_float_ref(x, q, n);
        tr->to_float_ref(q, y, n);
        double e = 0, s = 0;
        for (int64_t i = 0; i < n; i++) {
            e += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
            s += (double)x[i] * x[i];
        }
        const double rel = sqrt(e / s);
        CHECKF(rel < rt_bound[k], "%s round trip relative rmse %.4f (bound %.2f)", tr->name, rel, rt_bound[k]);
        printf("%s: round trip relative rmse %.4f\n", tr->name, rel);
    }
    free(x);
    free(y);
    free(q);
}

int main(void) {
    test_traits();
    test_hand_iq2_xxs();
    test_hand_iq2_xs();
    test_hand_iq2_s();
    test_hand_iq3_xxs();
    test_hand_iq3_s();
    test_hand_iq1_s();
    test_hand_iq1_m();
    test_dots();
    test_golden();
    test_round_trip();
    return test_done();
}
