/* test_quant_lowbit.c - the low-bit family (Q4_1, Q5_1, Q8_1, IQ4_NL, Q2_K, Q3_K).
 *
 * 1. Hand-built blocks: fields chosen here, packed from the layouts ggml-common.h documents,
 *    expected floats from the format's formula (exact: small dyadic products).
 * 2. Traits: names, sizes, partners, parsing.
 * 3. Round trip on gaussian data: relative RMSE under a bound derived from the level spacing;
 *    zero blocks stay zero.
 * 4. Dots: the scalar reference against the dot of the dequantised operands (in double), and
 *    every SIMD variant against the scalar reference, on quantised data, random bit patterns and
 *    extreme activations, with block counts that leave a tail.
 * Byte identity with ggml's quantisers was checked outside the repository (a program linking a
 * llama.cpp build; see the commit that added this file), not here. */
#include <stdint.h>
#include <string.h>

#include "core/fp16.h"
#include "quant/quant.h"
#include "quant/quant_lowbit_impl.h"
#include "test.h"

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static uint32_t rnd_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}
static double rnd_unit(void) { return (rnd_u32() + 0.5) / 4294967296.0; }
static float rnd_gauss(void) { return (float)(sqrt(-2.0 * log(rnd_unit())) * cos(6.283185307179586 * rnd_unit())); }

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) abort();
    return p;
}

/* The IQ4_NL levels as ggml-common.h lists them (kvalues_iq4nl). */
static const int iq4nl_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static int count_bad(const float *got, const float *want, int n, const char *what) {
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (got[i] != want[i] && bad++ < 3) fprintf(stderr, "%s[%d] = %g, want %g\n", what, i, (double)got[i], (double)want[i]);
    return bad;
}

/* ---------------------------------------------------------------- 1. hand-built blocks */

static void test_hand_q4_1(void) {
    hm_block_q4_1 b;
    b.d = 0x3800; /* 0.5 */
    b.m = 0xbc00; /* -1 */
    int q[32];
    for (int e = 0; e < 32; e++) q[e] = (e * 5 + 1) % 16;
    for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(q[j] | (q[j + 16] << 4));
    float out[32], want[32];
    for (int e = 0; e < 32; e++) want[e] = 0.5f * q[e] - 1.0f;
    hm_type_get(HM_TYPE_Q4_1)->to_float_ref(&b, out, 32);
    CHECK(count_bad(out, want, 32, "q4_1") == 0);
}

static void test_hand_q5_1(void) {
    hm_block_q5_1 b;
    b.d = 0x3400; /* 0.25 */
    b.m = 0x3800; /* 0.5 */
    int q[32];
    uint32_t qh = 0;
    for (int e = 0; e < 32; e++) q[e] = (e * 7 + 3) % 32;
    for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)((q[j] & 15) | ((q[j + 16] & 15) << 4));
    for (int e = 0; e < 32; e++) qh |= (uint32_t)(q[e] >> 4) << e;
    memcpy(b.qh, &qh, 4);
    float out[32], want[32];
    for (int e = 0; e < 32; e++) want[e] = 0.25f * q[e] + 0.5f;
    hm_type_get(HM_TYPE_Q5_1)->to_float_ref(&b, out, 32);
    CHECK(count_bad(out, want, 32, "q5_1") == 0);
}

static void test_hand_iq4_nl(void) {
    hm_block_iq4_nl b;
    b.d = 0x3000; /* 0.125 */
    int q[32];
    for (int e = 0; e < 32; e++) q[e] = (e * 3) % 16;
    for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(q[j] | (q[j + 16] << 4));
    float out[32], want[32];
    for (int e = 0; e < 32; e++) want[e] = 0.125f * iq4nl_levels[q[e]];
    hm_type_get(HM_TYPE_IQ4_NL)->to_float_ref(&b, out, 32);
    CHECK(count_bad(out, want, 32, "iq4_nl") == 0);
}

/* 2-bit codes as ggml packs them: byte 32h + l, bits 2s..2s+1 = element 128h + 32s + l. */
static void pack2(const int q[256], uint8_t qs[64]) {
    memset(qs, 0, 64);
    for (int e = 0; e < 256; e++) qs[32 * (e / 128) + e % 32] |= (uint8_t)(q[e] << (2 * ((e % 128) / 32)));
}

static void test_hand_q2_k(void) {
    hm_block_q2_k b;
    int sc[16], mn[16], q[256];
    for (int j = 0; j < 16; j++) {
        sc[j] = (j * 5 + 2) % 16;
        mn[j] = 15 - j;
        b.scales[j] = (uint8_t)(sc[j] | (mn[j] << 4));
    }
    for (int e = 0; e < 256; e++) q[e] = (e * 3 + e / 7) % 4;
    pack2(q, b.qs);
    b.d = 0x3800;    /* 0.5 */
    b.dmin = 0x3400; /* 0.25 */
    float out[256], want[256];
    for (int e = 0; e < 256; e++) want[e] = 0.5f * sc[e / 16] * q[e] - 0.25f * mn[e / 16];
    hm_type_get(HM_TYPE_Q2_K)->to_float_ref(&b, out, 256);
    CHECK(count_bad(out, want, 256, "q2_K") == 0);
}

static void test_hand_q3_k(void) {
    hm_block_q3_k b;
    memset(&b, 0, sizeof b);
    int s[16], lv[256], low[256];
    /* 6-bit scales: low nibble of s[j] in scales[j % 8] (nibble j / 8), top 2 bits at bits
     * 2 * (j / 4) of scales[8 + j % 4] */
    for (int j = 0; j < 16; j++) {
        s[j] = (j * 4 + 1) % 64;
        b.scales[j % 8] |= (uint8_t)((s[j] & 15) << (4 * (j / 8)));
        b.scales[8 + j % 4] |= (uint8_t)((s[j] >> 4) << (2 * (j / 4)));
    }
    /* level in [-4, 3]: high bit set -> level = low bits, clear -> low bits - 4 */
    for (int e = 0; e < 256; e++) {
        lv[e] = (e * 5 + e / 9) % 8 - 4;
        const int hi = lv[e] >= 0;
        low[e] = hi ? lv[e] : lv[e] + 4;
        if (hi) b.hmask[e % 32] |= (uint8_t)(1u << (e / 32));
    }
    pack2(low, b.qs);
    b.d = 0x3800; /* 0.5 */
    float out[256], want[256];
    for (int e = 0; e < 256; e++) want[e] = 0.5f * (s[e / 16] - 32) * lv[e];
    hm_type_get(HM_TYPE_Q3_K)->to_float_ref(&b, out, 256);
    CHECK(count_bad(out, want, 256, "q3_K") == 0);
}

/* Q8_1 of a block whose amax is 127: d = 1, codes = the values, s = their sum. */
static void test_hand_q8_1(void) {
    float x[32];
    int sum = 0;
    for (int e = 0; e < 32; e++) {
        x[e] = (float)((e * 37) % 255 - 127);
        sum += (int)x[e];
    }
    x[5] = 127.0f;
    sum += 127 - ((5 * 37) % 255 - 127);
    hm_block_q8_1 b;
    hm_type_get(HM_TYPE_Q8_1)->from_float_ref(x, &b, 32);
    CHECK(b.d == 0x3c00);
    int bad = 0;
    for (int e = 0; e < 32; e++) bad += b.qs[e] != (int8_t)x[e];
    CHECK(bad == 0);
    CHECKF(hm_fp16_to_f32(b.s) == (float)sum, "s %g vs %d", (double)hm_fp16_to_f32(b.s), sum);
}

/* Every compiled Q8_1 quantiser (the activations' run-time one included) writes the reference's
 * bytes: gaussian rows, and rows of halves (amax 127: d = 1, every value k + 1/2 a tie that roundf
 * takes away from zero, where round-to-even would not), by hand: the code of -126.5 is -127, of
 * 2.5 is 3. */
static void test_simd_q8_1(void) {
    enum { N = 32 * 37 };
    static float x[N];
    static uint8_t want[N / 32 * 36], got[N / 32 * 36];
    const hm_type_traits *tr = hm_type_get(HM_TYPE_Q8_1);
    for (int kind = 0; kind < 3; kind++) {
        for (int i = 0; i < N; i++)
            x[i] = kind == 0 ? rnd_gauss() : kind == 1 ? (float)((i * 37) % 254 - 127) + 0.5f : rnd_gauss() * 1e-3f;
        if (kind == 1)
            for (int b = 0; b < N / 32; b++) x[32 * b + 7] = b % 2 ? 127.0f : -127.0f; /* amax 127 in every block */
        if (kind == 2) memset(x + 64, 0, 32 * sizeof(float)); /* an all-zero block: d = 0 */
        tr->from_float_ref(x, want, N);
        if (kind == 1) {
            const hm_block_q8_1 *b = (const hm_block_q8_1 *)(const void *)want;
            CHECK(b[0].d == 0x3c00);
            int bad = 0;
            for (int e = 0; e < 32; e++)
                if (e != 7) bad += b[0].qs[e] != (int8_t)(x[e] < 0 ? x[e] - 0.5f : x[e] + 0.5f);
            CHECKF(bad == 0, "q8_1 ties: %d codes not rounded away from zero", bad);
        }
        for (int isa = 0; isa < HM_ISA_COUNT; isa++) {
            if (!tr->from_float_isa[isa] || !hm_isa_available((hm_isa)isa)) continue;
            memset(got, 0xa5, sizeof got);
            tr->from_float_isa[isa](x, got, N);
            CHECKF(memcmp(got, want, sizeof got) == 0, "q8_1 from_float isa %d kind %d differs from the reference", isa, kind);
        }
        memset(got, 0xa5, sizeof got);
        tr->from_float(x, got, N);
        CHECKF(memcmp(got, want, sizeof got) == 0, "q8_1 run-time from_float kind %d differs from the reference", kind);
    }
}

/* ---------------------------------------------------------------- 2. traits */

static void test_traits(void) {
    static const struct { int t; const char *name; int64_t blck; size_t size; int partner; } want[] = {
        {HM_TYPE_Q4_1, "q4_1", 32, 20, HM_TYPE_Q8_1},   {HM_TYPE_Q5_1, "q5_1", 32, 24, HM_TYPE_Q8_1},
        {HM_TYPE_IQ4_NL, "iq4_nl", 32, 18, HM_TYPE_Q8_0}, {HM_TYPE_Q2_K, "q2_K", 256, 84, HM_TYPE_Q8_K},
        {HM_TYPE_Q3_K, "q3_K", 256, 110, HM_TYPE_Q8_K}, {HM_TYPE_Q8_1, "q8_1", 32, 36, HM_TYPE_Q8_1},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const hm_type_traits *tr = hm_type_get(want[i].t);
        CHECK(tr && tr->supported);
        CHECK(strcmp(tr->name, want[i].name) == 0);
        CHECK(tr->blck_size == want[i].blck && tr->type_size == want[i].size);
        CHECK((int)tr->vec_dot_type == want[i].partner);
        CHECK(hm_type_from_name(want[i].name) == want[i].t);
        CHECK(hm_row_size(want[i].t, 4096) == want[i].size * (size_t)(4096 / want[i].blck));
        CHECK(tr->vec_dot && tr->to_float && tr->from_float);
    }
    CHECK(HM_TYPE_IQ4_NL == 20);
    CHECK(hm_type_from_name("IQ4_NL") == 20);
}

/* ---------------------------------------------------------------- 3. round trip */

static void test_round_trip(void) {
    /* Bounds from the level spacing on N(0,1) data: Q4_1 / Q5_1 step (max-min)/15 and /31 over
     * 32 values (range about 4.1) gives rmse step/sqrt(12) = 0.079 / 0.038; IQ4_NL as IQ4_XS
     * (0.08); Q3_K: levels -4..3 times amax/4 of 16 values (median amax 2.03) give step 0.51,
     * rmse 0.147, plus the 6-bit sub-scales and the clipped side's missing +4 level; Q2_K: 4 levels over the 16 values' range (about 3.5)
     * gives step 1.17, rmse 0.34, which the fit must beat. */
    static const struct { int t; double bound; } cases[] = {
        {HM_TYPE_Q4_1, 0.085}, {HM_TYPE_Q5_1, 0.042}, {HM_TYPE_IQ4_NL, 0.080},
        {HM_TYPE_Q2_K, 0.34},  {HM_TYPE_Q3_K, 0.17},  {HM_TYPE_Q8_1, 0.0075},
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
    }
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

/* ---------------------------------------------------------------- 4. dots */

/* Random raw blocks with finite, small fp16 scale fields. */
static void random_blocks(int t, uint8_t *q, int64_t nb) {
    const size_t ts = hm_type_get(t)->type_size;
    for (size_t i = 0; i < (size_t)nb * ts; i++) q[i] = (uint8_t)rnd_u32();
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *p = q + (size_t)b * ts;
        const uint16_t d = hm_f32_to_fp16((float)(rnd_unit() * 0.01 + 0.001));
        const uint16_t m = hm_f32_to_fp16((float)((rnd_unit() - 0.5) * 0.02));
        switch (t) {
        case HM_TYPE_Q4_1: case HM_TYPE_Q5_1: memcpy(p, &d, 2); memcpy(p + 2, &m, 2); break;
        case HM_TYPE_IQ4_NL: memcpy(p, &d, 2); break;
        case HM_TYPE_Q2_K: memcpy(p + 80, &d, 2); memcpy(p + 82, &d, 2); break;
        case HM_TYPE_Q3_K: memcpy(p + 108, &d, 2); break;
        }
    }
}

/* The dot of the dequantised operands in double, and sum |x_i y_i|. For a Q8_1 partner the
 * format's own term m * s carries s rounded to fp16: the difference that rounding makes is
 * added, so what remains to compare is float accumulation only. */
static void deq_dot(int t, int64_t n, const void *qx, const void *qy, double *dot, double *mag) {
    const hm_type_traits *tr = hm_type_get(t);
    float *a = xmalloc((size_t)n * 4), *b = xmalloc((size_t)n * 4);
    tr->to_float_ref(qx, a, n);
    hm_type_get(tr->vec_dot_type)->to_float_ref(qy, b, n);
    double s = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        s += (double)a[i] * b[i];
        m += fabs((double)a[i] * b[i]);
    }
    if (tr->vec_dot_type == HM_TYPE_Q8_1 && t != HM_TYPE_Q8_1) {
        const hm_block_q8_1 *y = qy;
        for (int64_t k = 0; k < n / 32; k++) {
            uint16_t mh;
            memcpy(&mh, (const uint8_t *)qx + (size_t)k * tr->type_size + 2, 2);
            int sum = 0;
            for (int j = 0; j < 32; j++) sum += y[k].qs[j];
            const double exact = (double)hm_fp16_to_f32(y[k].d) * sum;
            s += (double)hm_fp16_to_f32(mh) * ((double)hm_fp16_to_f32(y[k].s) - exact);
            m += fabs((double)hm_fp16_to_f32(mh) * hm_fp16_to_f32(y[k].s));
        }
    }
    *dot = s;
    *mag = m;
    free(a);
    free(b);
}

static void test_dots(void) {
    static const int types[] = {HM_TYPE_Q4_1, HM_TYPE_Q5_1, HM_TYPE_IQ4_NL, HM_TYPE_Q2_K, HM_TYPE_Q3_K, HM_TYPE_Q8_1};
    static const int64_t lens[] = {256, 768, 2816, 7168};
    int simd_checked = 0;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        const int64_t n = lens[li];
        float *xf = xmalloc((size_t)n * 4), *yf = xmalloc((size_t)n * 4);
        uint8_t *qx = xmalloc((size_t)n * 2), *qy = xmalloc((size_t)n * 2);
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
            const int t = types[ti];
            const hm_type_traits *tr = hm_type_get(t);
            const int64_t nb = n / tr->blck_size;
            for (int mode = 0; mode < 3; mode++) {
                /* 0: quantised gaussians; 1: random bit patterns; 2: random bits x +-1 activations
                 * (every activation code +-127) */
                for (int64_t i = 0; i < n; i++) {
                    xf[i] = rnd_gauss();
                    yf[i] = mode == 2 ? (rnd_u32() & 1 ? 1.f : -1.f) : rnd_gauss();
                }
                if (mode == 0 || t == HM_TYPE_Q8_1) tr->from_float_ref(xf, qx, n);
                else random_blocks(t, qx, nb);
                hm_type_get(tr->vec_dot_type)->from_float_ref(yf, qy, n);
                double want, mag;
                deq_dot(t, n, qx, qy, &want, &mag);
                float ref = NAN;
                tr->vec_dot_isa[HM_ISA_SCALAR](n, &ref, qx, qy);
                CHECKF(fabs(ref - want) <= 2e-6 * mag + 1e-30, "%s n=%lld mode %d: scalar %.9g vs dequantised %.9g (mag %.3g)",
                       tr->name, (long long)n, mode, (double)ref, want, mag);
                for (int isa = HM_ISA_AVX2; isa < HM_ISA_COUNT; isa++) {
                    if (!tr->vec_dot_isa[isa] || !hm_isa_available((hm_isa)isa)) continue;
                    float got = NAN;
                    tr->vec_dot_isa[isa](n, &got, qx, qy);
                    simd_checked++;
                    CHECKF(fabs(got - ref) <= 1e-6 * mag + 1e-30, "%s n=%lld mode %d isa %d: %.9g vs scalar %.9g (mag %.3g)",
                           tr->name, (long long)n, mode, isa, (double)got, (double)ref, mag);
                }
            }
        }
        free(xf);
        free(yf);
        free(qx);
        free(qy);
    }
    fprintf(stderr, "%d SIMD dot comparisons\n", simd_checked);
}

int main(void) {
    test_hand_q4_1();
    test_hand_q5_1();
    test_hand_iq4_nl();
    test_hand_q2_k();
    test_hand_q3_k();
    test_hand_q8_1();
    test_simd_q8_1();
    test_traits();
    test_round_trip();
    test_dots();
    return test_done();
}
