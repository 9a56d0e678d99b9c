/* test_quant_k.c - the K-quant family (Q8_K, Q4_K, Q5_K, Q6_K, IQ4_XS).
 *
 * 1. Hand-built blocks: fields chosen here, packed from the layout ggml documents, expected
 *    floats from the format's formula (exact: all products are small dyadic numbers).
 * 2. Round trip on gaussian data: relative RMSE under a bound derived from the level spacing.
 * 3. Every SIMD variant against the scalar reference (dot within float-accumulation error;
 *    Q8_K quantisation byte-identical), including random bit patterns and extreme activations.
 * 4. vec_dot equals the dot of the dequantised operands.
 * 5. Golden hashes of the reference quantisers' bytes, taken from ggml's own quantisers
 *    (quantize_row_*_ref, compiled from ggml's source) on a generator that only uses exact float
 *    operations, so the bytes llama.cpp would write are pinned. */
#include <stdint.h>
#include <string.h>

#include "core/fp16.h"
#include "quant/quant.h"
#include "quant/quant_k_impl.h"
#include "test.h"

/* ---------------------------------------------------------------- data */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
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
/* Approximately N(0,1) from exact float operations only (sum of 4 uniforms on a 2^-12 grid,
 * centred and scaled by a power of two): identical on every libm, for the golden hashes. */
static float rnd_golden(void) {
    int32_t s = 0;
    for (int k = 0; k < 4; k++) s += (int32_t)(rnd_u32() >> 20);
    return (float)(s - 8190) * (1.0f / 2048.0f);
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) abort();
    return p;
}

static const int k_types[] = {HM_TYPE_Q4_K, HM_TYPE_Q5_K, HM_TYPE_Q6_K, HM_TYPE_IQ4_XS};
#define N_TYPES 4

/* ---------------------------------------------------------------- 1. hand-built blocks */

/* Packs 6-bit scales/mins the way ggml-common.h documents block_q4_K.scales: bytes 0-3 low 6
 * bits sc[0..3], bytes 4-7 low 6 bits m[0..3]; bytes 8-11 sc[4..7] low nibble | m[4..7] low
 * nibble << 4; the top 2 bits of sc[4+j] / m[4+j] in bits 6-7 of byte j / 4+j. */
static void pack_k4_scales(const int sc[8], const int m[8], uint8_t out[12]) {
    for (int j = 0; j < 4; j++) {
        out[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        out[4 + j] = (uint8_t)((m[j] & 63) | ((m[j + 4] >> 4) << 6));
        out[8 + j] = (uint8_t)((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
    }
}

static void test_hand_q4_k(void) {
    hm_block_q4_k b;
    memset(&b, 0, sizeof b);
    const int sc[8] = {3, 10, 17, 24, 31, 38, 45, 63}, m[8] = {60, 1, 33, 16, 47, 5, 0, 63};
    b.d = 0x3800;    /* 0.5 */
    b.dmin = 0x3400; /* 0.25 */
    pack_k4_scales(sc, m, b.scales);
    int q[256];
    for (int e = 0; e < 256; e++) q[e] = (e * 7 + 3) % 16;
    /* chunk c of 64: byte 32c + l holds element 64c + l (low nibble) and 64c + 32 + l (high) */
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) b.qs[32 * c + l] = (uint8_t)(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
    float out[256];
    hm_type_get(HM_TYPE_Q4_K)->to_float_ref(&b, out, 256);
    int bad = 0;
    for (int e = 0; e < 256; e++) {
        const float want = 0.5f * sc[e / 32] * q[e] - 0.25f * m[e / 32];
        if (out[e] != want) bad++;
    }
    CHECKF(bad == 0, "q4_K hand block: %d of 256 elements wrong", bad);
    CHECK(out[0] == 0.5f * 3 * 3 - 0.25f * 60);
    CHECK(out[255] == 0.5f * 63 * ((255 * 7 + 3) % 16) - 0.25f * 63);
}

static void test_hand_q5_k(void) {
    hm_block_q5_k b;
    memset(&b, 0, sizeof b);
    const int sc[8] = {63, 2, 19, 40, 8, 55, 31, 16}, m[8] = {0, 63, 17, 48, 32, 9, 62, 15};
    b.d = 0x3400;    /* 0.25 */
    b.dmin = 0x3c00; /* 1 */
    pack_k4_scales(sc, m, b.scales);
    int q[256];
    for (int e = 0; e < 256; e++) q[e] = (e * 11 + 5) % 32;
    /* low 4 bits as q4_K; bit 4 of element 64c + l in qh[l] bit 2c, of 64c + 32 + l in bit 2c+1 */
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            const int lo = q[64 * c + l], hi = q[64 * c + 32 + l];
            b.qs[32 * c + l] = (uint8_t)((lo & 15) | ((hi & 15) << 4));
            b.qh[l] |= (uint8_t)(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
        }
    float out[256];
    hm_type_get(HM_TYPE_Q5_K)->to_float_ref(&b, out, 256);
    int bad = 0;
    for (int e = 0; e < 256; e++)
        if (out[e] != 0.25f * sc[e / 32] * q[e] - 1.0f * m[e / 32]) bad++;
    CHECKF(bad == 0, "q5_K hand block: %d of 256 elements wrong", bad);
}

static void test_hand_q6_k(void) {
    hm_block_q6_k b;
    memset(&b, 0, sizeof b);
    b.d = 0x3400; /* 0.25 */
    int sc[16], q[256];
    for (int j = 0; j < 16; j++) sc[j] = j == 3 ? -128 : j == 9 ? 127 : (j * 13 % 41) - 20;
    for (int j = 0; j < 16; j++) b.scales[j] = (int8_t)sc[j];
    for (int e = 0; e < 256; e++) q[e] = (e * 5 + 1) % 64;
    /* per half h of 128: ql[64h + l] = q(l) | q(l+64) << 4, ql[64h + 32 + l] = q(l+32) | q(l+96) << 4,
     * qh[32h + l] = top 2 bits of q(l), q(l+32), q(l+64), q(l+96) at bits 0, 2, 4, 6 */
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const int *qq = q + 128 * h;
            b.ql[64 * h + l] = (uint8_t)((qq[l] & 15) | ((qq[l + 64] & 15) << 4));
            b.ql[64 * h + 32 + l] = (uint8_t)((qq[l + 32] & 15) | ((qq[l + 96] & 15) << 4));
            b.qh[32 * h + l] = (uint8_t)((qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) | ((qq[l + 64] >> 4) << 4) |
                                         ((qq[l + 96] >> 4) << 6));
        }
    float out[256];
    hm_type_get(HM_TYPE_Q6_K)->to_float_ref(&b, out, 256);
    int bad = 0;
    for (int e = 0; e < 256; e++)
        if (out[e] != 0.25f * sc[e / 16] * (q[e] - 32)) bad++;
    CHECKF(bad == 0, "q6_K hand block: %d of 256 elements wrong", bad);
    /* d is the last field: bytes 208-209 of the 210 */
    CHECK(((const uint8_t *)&b)[208] == 0x00 && ((const uint8_t *)&b)[209] == 0x34);
}

static void test_hand_iq4_xs(void) {
    static const int kv[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    hm_block_iq4_xs b;
    memset(&b, 0, sizeof b);
    b.d = 0x3000; /* 0.125 */
    int ls[8], q[256];
    for (int j = 0; j < 8; j++) ls[j] = (j * 9 + 5) % 64; /* 5 14 23 32 41 50 59 4 */
    /* ls[j]: low 4 bits in scales_l[j/2] (nibble j%2), high 2 bits at scales_h bits 2j, 2j+1 */
    for (int j = 0; j < 8; j++) {
        b.scales_l[j / 2] |= (uint8_t)((ls[j] & 15) << (4 * (j % 2)));
        b.scales_h |= (uint16_t)((ls[j] >> 4) << (2 * j));
    }
    for (int e = 0; e < 256; e++) q[e] = (e * 3 + 1) % 16;
    /* sub-block j: byte 16j + l holds element 32j + l (low) and 32j + 16 + l (high) */
    for (int j = 0; j < 8; j++)
        for (int l = 0; l < 16; l++) b.qs[16 * j + l] = (uint8_t)(q[32 * j + l] | (q[32 * j + 16 + l] << 4));
    float out[256];
    hm_type_get(HM_TYPE_IQ4_XS)->to_float_ref(&b, out, 256);
    int bad = 0;
    for (int e = 0; e < 256; e++)
        if (out[e] != 0.125f * (ls[e / 32] - 32) * kv[q[e]]) bad++;
    CHECKF(bad == 0, "iq4_xs hand block: %d of 256 elements wrong", bad);
}

static void test_hand_q8_k(void) {
    /* d = 1/iscale with iscale = -127 / (value of largest magnitude); bsums = sums of 16 */
    float x[256];
    for (int i = 0; i < 256; i++) x[i] = (float)((i % 17) - 8);
    x[100] = -12.7f; /* largest magnitude, negative: iscale = -127 / -12.7 = 10, levels = 10x */
    hm_block_q8_k b;
    hm_type_get(HM_TYPE_Q8_K)->from_float_ref(x, &b, 256);
    CHECK_NEAR(b.d, 0.1f, 1e-7);
    CHECK(b.qs[100] == -127);
    int bad = 0;
    for (int i = 0; i < 256; i++)
        if (i != 100 && b.qs[i] != 10 * ((i % 17) - 8)) bad++;
    CHECKF(bad == 0, "q8_K levels: %d wrong", bad);
    int bs_bad = 0;
    for (int j = 0; j < 16; j++) {
        int s = 0;
        for (int l = 0; l < 16; l++) s += b.qs[16 * j + l];
        if (b.bsums[j] != s) bs_bad++;
    }
    CHECK(bs_bad == 0);
    /* all-zero block: d = 0, everything zero */
    memset(x, 0, sizeof x);
    memset(&b, 0x5a, sizeof b);
    hm_type_get(HM_TYPE_Q8_K)->from_float_ref(x, &b, 256);
    const uint8_t *p = (const uint8_t *)&b;
    int nz = 0;
    for (size_t i = 0; i < sizeof b; i++) nz += p[i] != 0;
    CHECK(nz == 0);
}

static void test_traits(void) {
    static const struct { int t; const char *name; size_t size; } want[] = {
        {HM_TYPE_Q8_K, "q8_K", 292}, {HM_TYPE_Q4_K, "q4_K", 144}, {HM_TYPE_Q5_K, "q5_K", 176},
        {HM_TYPE_Q6_K, "q6_K", 210}, {HM_TYPE_IQ4_XS, "iq4_xs", 136},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const hm_type_traits *tr = hm_type_get(want[i].t);
        CHECK(tr->name && strcmp(tr->name, want[i].name) == 0);
        CHECK(tr->blck_size == 256 && tr->type_size == want[i].size);
        CHECK(tr->supported);
        CHECK(tr->vec_dot_type == HM_TYPE_Q8_K);
        CHECK(tr->vec_dot && tr->to_float && tr->from_float);
        CHECK(hm_row_size(want[i].t, 7168) == 28 * want[i].size);
        CHECK(hm_row_size(want[i].t, 100) == 0);
        for (int isa = 0; isa < HM_ISA_COUNT; isa++)
            if (want[i].t != HM_TYPE_Q8_K) CHECK((tr->vec_dot_isa[isa] != NULL) == hm_isa_available((hm_isa)isa));
    }
    CHECK(hm_type_from_name("Q4_K") == HM_TYPE_Q4_K && hm_type_from_name("iq4_XS") == HM_TYPE_IQ4_XS);
}

/* ---------------------------------------------------------------- 2. round trip */

/* Relative RMSE bounds on N(0,1) data, from the level spacing: a uniform quantiser with step s
 * has RMS error s/sqrt(12). These reference quantisers are ggml's (byte-identical, see
 * test_golden), so the numbers are ggml's too.
 * Q6_K: symmetric per 16 elements, scale ~ max|x|/32; max |x| of 16 normals ~ max of 32 normals
 *   ~ 2.04, step 0.064 -> 1.84% (measured 1.78%); bound 2.0%.
 * Q5_K: min + scale per 32 elements, range ~ 2 * 2.04 over 31 steps -> 3.8%; the weighted
 *   (scale, min) search clips a little (measured 3.62%); bound 3.8%.
 * Q4_K: same over 15 steps -> 7.85% (measured 7.16%); bound 7.5%.
 * IQ4_XS: 16 non-linear levels, -127 at the sub-block's max (2.04): spacing 11-16 units near 0,
 *   ~ 0.2-0.26, wider in the tails where x^2 weighs most -> ~7-8% (measured 7.66%); bound 8.0%.
 * Q8_K: 127 steps up to max |x| of 256 normals ~ 3.0 -> 0.68% (measured 0.70%); bound 0.75%. */
static void test_round_trip(void) {
    static const struct { int t; double bound; } cases[] = {
        {HM_TYPE_Q4_K, 0.075}, {HM_TYPE_Q5_K, 0.038}, {HM_TYPE_Q6_K, 0.020}, {HM_TYPE_IQ4_XS, 0.080},
        {HM_TYPE_Q8_K, 0.0075},
    };
    const int64_t n = 256 * 64;
    float *x = xmalloc((size_t)n * 4), *z = xmalloc((size_t)n * 4);
    uint8_t *q = xmalloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) x[i] = rnd_gauss();
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const hm_type_traits *tr = hm_type_get(cases[c].t);
        tr->from_float_ref(x, q, n);
        tr->to_float_ref(q, z, n);
        double e2 = 0, x2 = 0;
        for (int64_t i = 0; i < n; i++) {
            e2 += (double)(x[i] - z[i]) * (x[i] - z[i]);
            x2 += (double)x[i] * x[i];
        }
        const double rel = sqrt(e2 / x2);
        fprintf(stderr, "round trip %-6s rel rmse %.4f (bound %.4f)\n", tr->name, rel, cases[c].bound);
        CHECKF(rel < cases[c].bound, "%s rel rmse %.4f >= %.3f", tr->name, rel, cases[c].bound);
        /* at a typical weight magnitude (std 1/32) the fp16 super-scales still carry enough
         * precision: same bound */
        for (int64_t i = 0; i < n; i++) z[i] = x[i] * (1.0f / 32);
        tr->from_float_ref(z, q, n);
        tr->to_float_ref(q, z, n);
        e2 = 0;
        for (int64_t i = 0; i < n; i++) e2 += (double)(x[i] / 32 - z[i]) * (x[i] / 32 - z[i]);
        CHECKF(sqrt(e2 / (x2 / 1024)) < cases[c].bound, "%s scaled rel rmse %.4f", tr->name, sqrt(e2 / (x2 / 1024)));
    }
    /* zeros stay zeros */
    memset(x, 0, 256 * 4);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const hm_type_traits *tr = hm_type_get(cases[c].t);
        tr->from_float_ref(x, q, 256);
        tr->to_float_ref(q, z, 256);
        int nz = 0;
        for (int i = 0; i < 256; i++) nz += z[i] != 0;
        CHECKF(nz == 0, "%s: zero block dequantises to %d non-zeros", tr->name, nz);
    }
    free(x);
    free(z);
    free(q);
}

/* ---------------------------------------------------------------- 3./4. dots */

/* Random raw bytes for a block of type t, with fp16 scale fields set to small normal values so
 * the float result stays finite: reaches every level and scale bit pattern. */
static void random_blocks(int t, uint8_t *q, int64_t nb) {
    const size_t ts = hm_type_get(t)->type_size;
    for (size_t i = 0; i < (size_t)nb * ts; i++) q[i] = (uint8_t)rnd_u32();
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *p = q + (size_t)b * ts;
        const uint16_t d = hm_f32_to_fp16((float)(rnd_unit() * 0.01 + 0.001));
        const uint16_t dm = hm_f32_to_fp16((float)(rnd_unit() * 0.01));
        switch (t) {
        case HM_TYPE_Q4_K: case HM_TYPE_Q5_K: memcpy(p, &d, 2); memcpy(p + 2, &dm, 2); break;
        case HM_TYPE_Q6_K: memcpy(p + 208, &d, 2); break;
        case HM_TYPE_IQ4_XS: memcpy(p, &d, 2); break;
        }
    }
}

/* sum |x_i y_i| and sum x_i y_i of the dequantised operands, in double. */
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
        float *xf = xmalloc((size_t)n * 4), *yf = xmalloc((size_t)n * 4);
        uint8_t *qx = xmalloc((size_t)nb * 256), *qy = xmalloc((size_t)nb * sizeof(hm_block_q8_k));
        for (int ti = 0; ti < N_TYPES; ti++) {
            const int t = k_types[ti];
            const hm_type_traits *tr = hm_type_get(t);
            for (int mode = 0; mode < 3; mode++) {
                /* 0: quantised gaussians; 1: random bit patterns; 2: random bits x extreme +-127 activations */
                for (int64_t i = 0; i < n; i++) {
                    xf[i] = rnd_gauss();
                    yf[i] = mode == 2 ? (rnd_u32() & 1 ? 1.f : -1.f) : rnd_gauss();
                }
                if (mode == 0) tr->from_float_ref(xf, qx, n);
                else random_blocks(t, qx, nb);
                hm_type_get(HM_TYPE_Q8_K)->from_float_ref(yf, qy, n);
                double want, mag;
                deq_dot(t, n, qx, qy, &want, &mag);
                float ref = NAN;
                tr->vec_dot_isa[HM_ISA_SCALAR](n, &ref, qx, qy);
                /* 4: the scalar dot against the dequantised dot (float rounding of the terms) */
                CHECKF(fabs(ref - want) <= 2e-6 * mag + 1e-30, "%s n=%lld mode %d: scalar %.9g vs dequantised %.9g (mag %.3g)",
                       tr->name, (long long)n, mode, (double)ref, want, mag);
                /* 3: each SIMD variant against the scalar reference */
                for (int isa = HM_ISA_AVX2; isa < HM_ISA_COUNT; isa++) {
                    if (!tr->vec_dot_isa[isa]) continue;
                    float got = NAN;
                    tr->vec_dot_isa[isa](n, &got, qx, qy);
                    CHECKF(fabs(got - ref) <= 1e-6 * mag + 1e-30, "%s n=%lld mode %d isa %d: %.9g vs scalar %.9g (mag %.3g)",
                           tr->name, (long long)n, mode, isa, (double)got, (double)ref, mag);
                }
            }
        }
        /* Q8_K x Q8_K (scalar only) */
        {
            uint8_t *qx8 = xmalloc((size_t)nb * sizeof(hm_block_q8_k));
            for (int64_t i = 0; i < n; i++) xf[i] = rnd_gauss();
            hm_type_get(HM_TYPE_Q8_K)->from_float_ref(xf, qx8, n);
            double want, mag;
            deq_dot(HM_TYPE_Q8_K, n, qx8, qy, &want, &mag);
            float got = NAN;
            hm_type_get(HM_TYPE_Q8_K)->vec_dot(n, &got, qx8, qy);
            CHECKF(fabs(got - want) <= 2e-6 * mag, "q8_K dot %.9g vs %.9g", (double)got, want);
            free(qx8);
        }
        free(xf);
        free(yf);
        free(qx);
        free(qy);
    }
}

/* ---------------------------------------------------------------- Q8_K quantiser variants */

static void test_q8_k_variants(void) {
    const hm_type_traits *q8k = hm_type_get(HM_TYPE_Q8_K);
    hm_from_float_fn fns[HM_ISA_COUNT];
    for (int isa = 0; isa < HM_ISA_COUNT; isa++) {
        fns[isa] = q8k->from_float_isa[isa];
        /* every compiled ISA has a Q8_K quantiser: it is the run-time path of every K-quant dot */
        CHECK((fns[isa] != NULL) == hm_isa_available((hm_isa)isa));
    }
    CHECK(fns[HM_ISA_SCALAR] == q8k->from_float_ref);
    const int64_t n = 256 * 40;
    float *x = xmalloc((size_t)n * 4);
    const size_t bytes = (size_t)(n / 256) * sizeof(hm_block_q8_k);
    uint8_t *want = xmalloc(bytes), *got = xmalloc(bytes);
    for (int mode = 0; mode < 5; mode++) {
        for (int64_t i = 0; i < n; i++) {
            const int64_t blk = i / 256;
            float g = rnd_gauss();
            switch (mode) {
            case 0: x[i] = g; break;
            case 1: x[i] = blk % 4 == 0 ? 0.f : g * 1e-30f; break;           /* zero blocks, tiny values */
            case 2: x[i] = (float)((int)(g * 8)) * 0.5f; break;               /* many exact ties at .5 */
            case 3: x[i] = (i % 256 == 77) ? 3.f : (i % 256 == 200 ? -3.f : g); break; /* +-max: first wins */
            case 4: x[i] = (i % 256 == 5) ? -3.f : (i % 256 == 6 ? 3.f : g * 0.1f); break;
            }
        }
        fns[0](x, want, n);
        for (int isa = 1; isa < HM_ISA_COUNT; isa++) {
            if (!fns[isa]) continue;
            memset(got, 0x5a, bytes);
            fns[isa](x, got, n);
            CHECKF(memcmp(want, got, bytes) == 0, "q8_K from_float isa %d differs from reference (mode %d)", isa, mode);
        }
    }
    /* the table's run-time quantiser is one of them */
    hm_type_get(HM_TYPE_Q8_K)->from_float(x, got, n);
    CHECK(memcmp(want, got, bytes) == 0);
    free(x);
    free(want);
    free(got);
}

/* ---------------------------------------------------------------- 5. golden bytes */

static uint64_t fnv1a(const uint8_t *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* FNV-1a of the bytes ggml's quantize_row_<type>_ref (quantize_iq4_xs without importance
 * weights) writes for golden_input(); recorded with ggml's ggml-quants.c built for the host
 * (as llama.cpp builds ggml-base). Our reference quantisers must write the same bytes. */
static void golden_input(float *x, int64_t n) {
    rng_state = 0x243f6a8885a308d3ull;
    for (int64_t i = 0; i < n; i++) {
        float g = rnd_golden();
        x[i] = (i / 256) % 7 == 3 ? g * g * g : (i / 32) % 11 == 5 ? 0.f : g;
    }
}

static void test_golden(void) {
    static const struct { int t; uint64_t hash; } want[] = {
        {HM_TYPE_Q4_K, 0xf99e9bae4176ffb9ull}, {HM_TYPE_Q5_K, 0x0520d010b68ffa46ull},
        {HM_TYPE_Q6_K, 0xb0bb670f550c7c09ull}, {HM_TYPE_IQ4_XS, 0xf0c593c1fe5beb29ull},
        {HM_TYPE_Q8_K, 0x7be280c59d450075ull},
    };
    const int64_t n = 256 * 64;
    float *x = xmalloc((size_t)n * 4);
    uint8_t *q = xmalloc((size_t)n * 2);
    golden_input(x, n);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const hm_type_traits *tr = hm_type_get(want[i].t);
        const size_t rs = hm_row_size(want[i].t, n);
        tr->from_float_ref(x, q, n);
        const uint64_t h = fnv1a(q, rs);
        CHECKF(h == want[i].hash, "%s golden hash %016llx, ggml's %016llx", tr->name, (unsigned long long)h,
               (unsigned long long)want[i].hash);
    }
    free(x);
    free(q);
}

int main(void) {
    test_traits();
    test_hand_q4_k();
    test_hand_q5_k();
    test_hand_q6_k();
    test_hand_iq4_xs();
    test_hand_q8_k();
    test_round_trip();
    test_dots();
    test_q8_k_variants();
    test_golden();
    return test_done();
}
