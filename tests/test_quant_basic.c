/* test_quant_basic.c - the float and Q8_0 quant families (F32, F16, BF16, Q8_0, Q4_0, Q5_0,
 * MXFP4): hand-built blocks with hand-derived values, quantisation of hand-picked floats
 * (ggml's rounding rules: q8_0 half away from zero, q4_0 trunc(x/d + 8.5) and q5_0
 * trunc(x/d + 16.5) clamped, mxfp4 nearest code with the lowest code winning ties), round-trip
 * error bounds on random data, every SIMD variant against the scalar reference, vec_dot against
 * the dot of the dequantised rows, and the IEEE half conversions exhaustively (and against F16C). */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __F16C__
#include <immintrin.h>
#endif

#include "core/fp16.h"
#include "quant/quant.h"
#include "quant/quant_impl.h"
#include "test.h"

#define MAXN 4096

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_u64(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float rng_unit(void) { return (float)(rng_u64() >> 40) / 16777216.0f; } /* [0,1) */
static float rng_normal(void) {
    float u = rng_unit() + 1e-7f, v = rng_unit();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

static bool same_bits(float a, float b) { return hm_f32_bits(a) == hm_f32_bits(b); }

/* ---- traits ---- */

static void test_traits(void) {
    static const struct { int t; const char *name; int64_t blck; size_t size; int partner; } want[] = {
        {HM_TYPE_F32, "f32", 1, 4, HM_TYPE_F32},       {HM_TYPE_F16, "f16", 1, 2, HM_TYPE_F32},
        {HM_TYPE_BF16, "bf16", 1, 2, HM_TYPE_F32},     {HM_TYPE_Q8_0, "q8_0", 32, 34, HM_TYPE_Q8_0},
        {HM_TYPE_Q4_0, "q4_0", 32, 18, HM_TYPE_Q8_0},  {HM_TYPE_MXFP4, "mxfp4", 32, 17, HM_TYPE_Q8_0},
        {HM_TYPE_Q5_0, "q5_0", 32, 22, HM_TYPE_Q8_0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const hm_type_traits *e = hm_type_get(want[i].t);
        CHECK(e && e->name && strcmp(e->name, want[i].name) == 0);
        CHECK(e->blck_size == want[i].blck && e->type_size == want[i].size);
        CHECK((int)e->vec_dot_type == want[i].partner);
        CHECKF(e->supported, "%s", want[i].name);
        CHECK(e->to_float && e->from_float && e->vec_dot);
        CHECK(hm_type_from_name(want[i].name) == want[i].t);
    }
    CHECK(hm_row_size(HM_TYPE_Q4_0, 4096) == 128 * 18);
    CHECK(hm_row_size(HM_TYPE_MXFP4, 64) == 34);
    CHECK(hm_row_size(HM_TYPE_Q5_0, 4096) == 128 * 22);
    CHECK(hm_row_size(HM_TYPE_Q8_0, 33) == 0);
}

/* ---- hand-built blocks ---- */

static void test_known_q4_0(void) {
    hm_block_q4_0 b;
    b.d = 0x3800; /* 0.5 */
    for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    for (int isa = 0; isa < HM_ISA_COUNT; isa++) {
        hm_to_float_fn f = hm_type_get(HM_TYPE_Q4_0)->to_float_isa[isa];
        if (!f) continue;
        float out[32];
        f(&b, out, 32);
        for (int j = 0; j < 16; j++) {
            CHECKF(out[j] == (float)(j - 8) * 0.5f, "isa %d el %d: %g", isa, j, out[j]);
            CHECKF(out[j + 16] == (float)(7 - j) * 0.5f, "isa %d el %d: %g", isa, j + 16, out[j + 16]);
        }
    }
    /* quantise: the largest magnitude is -8, so d = -8/-8 = 1 and q = min(15, trunc(x + 8.5)) */
    float x[32] = {-8, 7, 7.6f, 0.5f, -0.5f, 1.49f, -7.51f, 0};
    hm_block_q4_0 q;
    hm_type_get(HM_TYPE_Q4_0)->from_float_ref(x, &q, 32);
    CHECK(q.d == 0x3c00);
    CHECK((q.qs[0] & 15) == 0 && (q.qs[1] & 15) == 15 && (q.qs[2] & 15) == 15 && (q.qs[3] & 15) == 9);
    CHECK((q.qs[4] & 15) == 8 && (q.qs[5] & 15) == 9 && (q.qs[6] & 15) == 0 && (q.qs[7] & 15) == 8);
    CHECK((q.qs[0] >> 4) == 8); /* element 16 = 0 */
    /* a positive extreme: d = 8/-8 = -1, so +8 gets code 0 and decodes to (0-8)*-1 = 8 */
    float y[32] = {0};
    y[16] = 8.0f;
    y[17] = -3.0f;
    hm_type_get(HM_TYPE_Q4_0)->from_float_ref(y, &q, 32);
    CHECK(q.d == 0xbc00 && (q.qs[0] >> 4) == 0 && (q.qs[1] >> 4) == 11);
    /* all zeros: d = 0/-8 = -0 (stored as 0x8000, as ggml does), every code 8 */
    memset(y, 0, sizeof y);
    hm_type_get(HM_TYPE_Q4_0)->from_float_ref(y, &q, 32);
    CHECK(q.d == 0x8000 && q.qs[0] == 0x88 && q.qs[15] == 0x88);
}

/* q5_0: qs as q4_0, qh bit j = fifth bit of element j, value = (q - 16) * d. */
static void test_known_q5_0(void) {
    hm_block_q5_0 b;
    b.d = 0x3800; /* 0.5 */
    for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    /* fifth bits set on elements 1,3,5,7 (0xaa), 8,10,12,14 (0x55), 16-19 (0x0f), 28-31 (0xf0) */
    b.qh[0] = 0xaa, b.qh[1] = 0x55, b.qh[2] = 0x0f, b.qh[3] = 0xf0;
    /* element j < 16: code j (+16 where set); element 16 + j: code 15 - j (+16 where set) */
    static const float want[32] = {
        -8, 0.5f, -7, 1.5f, -6, 2.5f, -5, 3.5f, 4, -3.5f, 5, -2.5f, 6, -1.5f, 7, -0.5f,
        7.5f, 7, 6.5f, 6, -2.5f, -3, -3.5f, -4, -4.5f, -5, -5.5f, -6, 1.5f, 1, 0.5f, 0,
    };
    for (int isa = 0; isa < HM_ISA_COUNT; isa++) {
        hm_to_float_fn f = hm_type_get(HM_TYPE_Q5_0)->to_float_isa[isa];
        if (!f) continue;
        float out[32];
        f(&b, out, 32);
        for (int j = 0; j < 32; j++) CHECKF(out[j] == want[j], "isa %d el %d: %g", isa, j, out[j]);
    }
    /* quantise: the largest magnitude is -16, so d = -16/-16 = 1 and q = min(31, trunc(x + 16.5)):
     * codes 0, 31, 31 (32 clamped), 17, 16, 17, 0, 16; the zeros elsewhere get 16 */
    float x[32] = {-16, 15, 15.6f, 0.5f, -0.5f, 1.49f, -15.51f, 0};
    hm_block_q5_0 q;
    hm_type_get(HM_TYPE_Q5_0)->from_float_ref(x, &q, 32);
    CHECK(q.d == 0x3c00);
    CHECK((q.qs[0] & 15) == 0 && (q.qs[1] & 15) == 15 && (q.qs[2] & 15) == 15 && (q.qs[3] & 15) == 1);
    CHECK((q.qs[4] & 15) == 0 && (q.qs[5] & 15) == 1 && (q.qs[6] & 15) == 0 && (q.qs[7] & 15) == 0);
    CHECK((q.qs[0] >> 4) == 0);                 /* element 16 = 0 -> code 16 */
    CHECK(q.qh[0] == 0xbe && q.qh[1] == 0xff); /* fifth bits: elements 1-5, 7 and 8-15 */
    CHECK(q.qh[2] == 0xff && q.qh[3] == 0xff);
    /* a positive extreme: d = 16/-16 = -1, so +16 gets code 0 and decodes to (0-16)*-1 = 16;
     * -3 -> trunc(3 + 16.5) = 19 */
    float y[32] = {0};
    y[16] = 16.0f;
    y[17] = -3.0f;
    hm_type_get(HM_TYPE_Q5_0)->from_float_ref(y, &q, 32);
    CHECK(q.d == 0xbc00 && (q.qs[0] >> 4) == 0 && (q.qs[1] >> 4) == 3);
    CHECK(q.qh[2] == 0xfe && q.qh[0] == 0xff);
    /* all zeros: d = -0 (0x8000, as ggml), every code 16: nibbles 0, all fifth bits set */
    memset(y, 0, sizeof y);
    hm_type_get(HM_TYPE_Q5_0)->from_float_ref(y, &q, 32);
    CHECK(q.d == 0x8000 && q.qs[0] == 0x00 && q.qs[15] == 0x00);
    CHECK(q.qh[0] == 0xff && q.qh[1] == 0xff && q.qh[2] == 0xff && q.qh[3] == 0xff);
}

static void test_known_q8_0(void) {
    hm_block_q8_0 b;
    b.d = 0x3400; /* 0.25 */
    for (int j = 0; j < 32; j++) b.qs[j] = (int8_t)(j - 16);
    b.qs[31] = -128;
    for (int isa = 0; isa < HM_ISA_COUNT; isa++) {
        hm_to_float_fn f = hm_type_get(HM_TYPE_Q8_0)->to_float_isa[isa];
        if (!f) continue;
        float out[32];
        f(&b, out, 32);
        for (int j = 0; j < 31; j++) CHECKF(out[j] == (float)(j - 16) * 0.25f, "isa %d el %d", isa, j);
        CHECK(out[31] == -32.0f);
    }
    /* amax 127 gives d = 1: codes are roundf(x), halves away from zero */
    float x[32] = {127, 0.5f, -0.5f, 1.5f, -2.5f, 2.4999998f, 0.49999997f, -126.5f, 3.0f};
    for (int isa = 0; isa < HM_ISA_COUNT; isa++) {
        hm_from_float_fn f = hm_type_get(HM_TYPE_Q8_0)->from_float_isa[isa];
        if (!f) continue;
        hm_block_q8_0 q;
        f(x, &q, 32);
        static const int8_t want[9] = {127, 1, -1, 2, -3, 2, 0, -127, 3};
        CHECK(q.d == 0x3c00);
        for (int j = 0; j < 9; j++) CHECKF(q.qs[j] == want[j], "isa %d el %d: %d", isa, j, q.qs[j]);
        CHECK(q.qs[31] == 0);
    }
}

static void test_known_mxfp4(void) {
    /* e = 127 is scale 1: codes 0..7 are the E2M1 values 0 .5 1 1.5 2 3 4 6, 8..15 their negatives */
    static const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    hm_block_mxfp4 b;
    b.e = 127;
    for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    for (int isa = 0; isa < HM_ISA_COUNT; isa++) {
        hm_to_float_fn f = hm_type_get(HM_TYPE_MXFP4)->to_float_isa[isa];
        if (!f) continue;
        float out[32];
        f(&b, out, 32);
        for (int j = 0; j < 16; j++) {
            CHECKF(out[j] == e2m1[j], "isa %d el %d: %g", isa, j, out[j]);
            CHECKF(out[j + 16] == e2m1[15 - j], "isa %d el %d: %g", isa, j + 16, out[j + 16]);
        }
        /* other exponents: e = 130 scales by 8; e = 1 and e = 0 are the subnormal scales */
        b.e = 130;
        f(&b, out, 32);
        CHECK(out[7] == 48.0f && out[16 + 2] == -24.0f); /* 6*8, code 13 = -3 -> -3*8 */
        b.e = 1; /* 2^-126: code 7 = 6 * 2^-126 */
        f(&b, out, 32);
        CHECK(out[7] == ldexpf(6.0f, -126) && out[1] == ldexpf(1.0f, -127));
        b.e = 0; /* 2^-127: code 1 = 2^-128 (a float subnormal) */
        f(&b, out, 32);
        CHECK(out[1] == ldexpf(1.0f, -128) && out[7] == ldexpf(3.0f, -126));
        b.e = 254;
        f(&b, out, 32);
        CHECK(out[1] == ldexpf(1.0f, 126));
        b.e = 127;
    }
    /* quantise: amax 6 -> e = floor(log2 6) - 2 + 127 = 127; ties go to the lower code */
    float x[32] = {6, 0.25f, -0.25f, 5, -5, 2.5f, 0.74f, -6, 1.0f, 0.0f, -0.0f, 3.1f};
    hm_block_mxfp4 q;
    hm_type_get(HM_TYPE_MXFP4)->from_float_ref(x, &q, 32);
    static const int want[12] = {7, 0, 0, 6, 14, 4, 1, 15, 2, 0, 0, 5};
    CHECK(q.e == 127);
    for (int j = 0; j < 12; j++) CHECKF((q.qs[j] & 15) == want[j], "el %d: code %d", j, q.qs[j] & 15);
    /* amax 0.1: log2 = -3.32 -> floor -4 -> e = 121, scale 2^-6: -0.1 / 2^-6 = -6.4 -> -6 (code 15) */
    memset(x, 0, sizeof x);
    x[20] = -0.1f;
    x[21] = 0.04f; /* 2.56 -> 3 (code 5) */
    hm_type_get(HM_TYPE_MXFP4)->from_float_ref(x, &q, 32);
    CHECK(q.e == 121 && (q.qs[4] >> 4) == 15 && (q.qs[5] >> 4) == 5);
}

static void test_known_f16_bf16(void) {
    static const struct { uint16_t h; float f; } f16[] = {
        {0x0000, 0.0f}, {0x0001, 0x1p-24f}, {0x03ff, 1023 * 0x1p-24f}, {0x0400, 0x1p-14f},
        {0x3c00, 1.0f}, {0x3c01, 1.0f + 0x1p-10f}, {0x7bff, 65504.0f}, {0xc000, -2.0f},
        {0x7c00, INFINITY}, {0xfc00, -INFINITY}, {0x8001, -0x1p-24f},
    };
    const hm_type_traits *t = hm_type_get(HM_TYPE_F16);
    for (size_t i = 0; i < sizeof f16 / sizeof f16[0]; i++) {
        CHECKF(same_bits(hm_fp16_to_f32(f16[i].h), f16[i].f), "%04x", f16[i].h);
        CHECKF(hm_f32_to_fp16(f16[i].f) == f16[i].h, "%04x", f16[i].h);
        float o;
        t->to_float(&f16[i].h, &o, 1);
        CHECK(same_bits(o, f16[i].f));
    }
    float z = hm_fp16_to_f32(0x8000);
    CHECK(z == 0.0f && signbit(z));
    CHECK(hm_f32_to_fp16(-0.0f) == 0x8000);
    CHECK(isnan(hm_fp16_to_f32(0x7e00)) && isnan(hm_fp16_to_f32(0xfc01)));
    CHECK((hm_f32_to_fp16(NAN) & 0x7e00) == 0x7e00);
    /* rounding: to nearest, ties to even, overflow at 65520, underflow tie at 2^-25 */
    CHECK(hm_f32_to_fp16(65519.0f) == 0x7bff && hm_f32_to_fp16(65520.0f) == 0x7c00);
    CHECK(hm_f32_to_fp16(1.0f + 0x1p-11f) == 0x3c00);     /* tie -> even 0x3c00 */
    CHECK(hm_f32_to_fp16(1.0f + 3 * 0x1p-11f) == 0x3c02); /* tie -> even 0x3c02 */
    CHECK(hm_f32_to_fp16(0x1p-25f) == 0x0000);
    CHECK(hm_f32_to_fp16(0x1.000002p-25f) == 0x0001);
    CHECK(hm_f32_to_fp16(3 * 0x1p-25f) == 0x0002);        /* 1.5 ulp subnormal tie -> even */
    CHECK(hm_f32_to_fp16(0x1.ffcp-15f) == 0x0400);        /* rounds up into the normals */

    /* bf16: truncation with round-to-nearest-even, quiet NaN */
    CHECK(hm_f32_to_bf16(hm_bits_f32(0x3f808000u)) == 0x3f80); /* tie -> even */
    CHECK(hm_f32_to_bf16(hm_bits_f32(0x3f818000u)) == 0x3f82); /* tie -> even */
    CHECK(hm_f32_to_bf16(hm_bits_f32(0x3f808001u)) == 0x3f81);
    CHECK(hm_f32_to_bf16(hm_bits_f32(0xbf80ffffu)) == 0xbf81);
    CHECK(hm_f32_to_bf16(hm_bits_f32(0x7f800001u)) == 0x7fc0);
    CHECK(hm_f32_to_bf16(INFINITY) == 0x7f80 && hm_f32_to_bf16(-0.0f) == 0x8000);
    CHECK(hm_f32_to_bf16(FLT_MAX) == 0x7f80);
    CHECK(hm_bf16_to_f32(0x3fc0) == 1.5f && hm_bf16_to_f32(0xc1a0) == -20.0f);
}

/* ---- F16 exhaustive ---- */

static void test_f16_exhaustive(void) {
    int bad_rt = 0, bad_hw = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = hm_fp16_to_f32((uint16_t)h);
        uint16_t back = hm_f32_to_fp16(f);
        bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        if (nan ? back != (h | 0x200) : back != h) bad_rt++;
#ifdef __F16C__
        float hw = _cvtsh_ss((unsigned short)h);
        if (!same_bits(hw, f)) bad_hw++;
#endif
    }
    CHECKF(bad_rt == 0, "%d halves do not round-trip", bad_rt);
    CHECKF(bad_hw == 0, "%d halves differ from F16C", bad_hw);
#ifdef __F16C__
    /* f32 -> f16 against F16C: a stride through all 2^32 patterns plus random ones */
    int bad = 0;
    for (uint64_t u = 0; u < (1ull << 32); u += 251) {
        float f = hm_bits_f32((uint32_t)u);
        if (hm_f32_to_fp16(f) != (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)) bad++;
    }
    for (int i = 0; i < 1 << 22; i++) {
        float f = hm_bits_f32((uint32_t)rng_u64());
        if (hm_f32_to_fp16(f) != (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)) bad++;
    }
    CHECKF(bad == 0, "%d floats convert differently from F16C", bad);
#endif
}

/* ---- random data ---- */

/* Random floats for type t: normal-ish with a few large and tiny values; for F16 also values
 * beyond its range and in its subnormals; specials only where asked. */
static void fill_floats(float *x, int64_t n, int t, bool specials) {
    for (int64_t i = 0; i < n; i++) {
        float v = rng_normal();
        uint64_t r = rng_u64() % 64;
        if (r == 0) v *= 1000.0f;
        if (r == 1) v *= 1e-3f;
        if (t == HM_TYPE_F16 && r == 2) v *= 70000.0f;
        if (t == HM_TYPE_F16 && r == 3) v *= 1e-6f;
        if (specials && r == 4) v = (rng_u64() & 1) ? INFINITY : -INFINITY;
        if (specials && r == 5) v = hm_bits_f32((uint32_t)rng_u64() | 0x7f800001u);
        if (specials && r == 6) v = hm_bits_f32((uint32_t)rng_u64()); /* any pattern */
        x[i] = v;
    }
}

static float f1[MAXN], f2[MAXN];

/* Random valid blocks (any byte pattern, but finite scales); with finite set, float types get
 * finite values instead of raw bit patterns. */
static void fill_blocks(void *dst, int t, int64_t n, bool finite) {
    const hm_type_traits *e = hm_type_get(t);
    if (finite && e->blck_size == 1) {
        fill_floats(f2, n, HM_TYPE_F32, false); /* within every type's range */
        e->from_float_ref(f2, dst, n);
        return;
    }
    size_t bytes = hm_row_size(t, n);
    uint8_t *p = dst;
    for (size_t i = 0; i < bytes; i++) p[i] = (uint8_t)rng_u64();
    for (int64_t b = 0; b < n / e->blck_size; b++) {
        uint8_t *blk = p + (size_t)b * e->type_size;
        if (t == HM_TYPE_Q8_0 || t == HM_TYPE_Q4_0 || t == HM_TYPE_Q5_0) {
            uint16_t d = hm_f32_to_fp16(ldexpf(0.5f + rng_unit(), -(int)(rng_u64() % 12)));
            memcpy(blk, &d, 2);
        } else if (t == HM_TYPE_MXFP4) {
            uint64_t r = rng_u64();
            blk[0] = (uint8_t)(r % 8 == 0 ? r / 8 % 3 : 110 + r / 8 % 30); /* some subnormal scales */
        }
    }
}

static double dot_d(const float *a, const float *b, int64_t n, double *abs_sum) {
    double s = 0, as = 0;
    for (int64_t i = 0; i < n; i++) {
        s += (double)a[i] * b[i];
        as += fabs((double)a[i] * b[i]);
    }
    *abs_sum = as;
    return s;
}

static float xf[MAXN], yf[MAXN], xr[MAXN], yr[MAXN];
static uint8_t xq[MAXN * 4], yq[MAXN * 4], q1[MAXN * 4], q2[MAXN * 4];

static const int types[] = {HM_TYPE_F32, HM_TYPE_F16, HM_TYPE_BF16, HM_TYPE_Q8_0, HM_TYPE_Q4_0, HM_TYPE_Q5_0,
                            HM_TYPE_MXFP4};
static const int64_t lens_float[] = {1, 7, 8, 15, 16, 17, 31, 33, 64, 100, 255, 256, 1000, 4096};
static const int64_t lens_block[] = {32, 64, 96, 128, 160, 224, 256, 288, 1056, 4096};

static void test_simd_vs_ref(void) {
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const int t = types[ti];
        const hm_type_traits *e = hm_type_get(t);
        const hm_type_traits *p = hm_type_get((int)e->vec_dot_type);
        const bool blk = e->blck_size > 1;
        const int64_t *lens = blk ? lens_block : lens_float;
        const size_t nlens = blk ? sizeof lens_block / sizeof lens_block[0] : sizeof lens_float / sizeof lens_float[0];
        for (size_t li = 0; li < nlens; li++) {
            const int64_t n = lens[li];
            for (int rep = 0; rep < 4; rep++) {
                /* conversions: bit-exact */
                fill_blocks(xq, t, n, false);
                e->to_float_ref(xq, f1, n);
                fill_floats(xf, n, t, !blk);
                e->from_float_ref(xf, q1, n);
                for (int isa = 0; isa < HM_ISA_COUNT; isa++) {
                    if (!hm_isa_available((hm_isa)isa)) continue;
                    if (e->to_float_isa[isa]) {
                        e->to_float_isa[isa](xq, f2, n);
                        CHECKF(memcmp(f1, f2, (size_t)n * 4) == 0, "%s to_float isa %d n %lld", e->name, isa, (long long)n);
                    }
                    if (e->from_float_isa[isa]) {
                        memset(q2, 0xa5, hm_row_size(t, n));
                        e->from_float_isa[isa](xf, q2, n);
                        CHECKF(memcmp(q1, q2, hm_row_size(t, n)) == 0, "%s from_float isa %d n %lld", e->name, isa, (long long)n);
                    }
                }
                /* dot: every variant near the scalar reference and near the exact dot of the
                 * dequantised rows, relative to sum |x*y| */
                fill_blocks(xq, t, n, true);
                fill_floats(yf, n, HM_TYPE_F32, false);
                p->from_float(yf, yq, n);
                p->to_float_ref(yq, yr, n);
                e->to_float_ref(xq, xr, n);
                double as;
                const double exact = dot_d(xr, yr, n, &as);
                float ref;
                e->vec_dot_isa[HM_ISA_SCALAR](n, &ref, xq, yq);
                CHECKF(fabs(ref - exact) <= 1e-5 * as + 1e-30, "%s ref dot n %lld: %g vs %g", e->name, (long long)n, ref, exact);
                for (int isa = 1; isa < HM_ISA_COUNT; isa++) {
                    if (!e->vec_dot_isa[isa] || !hm_isa_available((hm_isa)isa)) continue;
                    float got;
                    e->vec_dot_isa[isa](n, &got, xq, yq);
                    CHECKF(fabs(got - ref) <= 1e-5 * as + 1e-30, "%s dot isa %d n %lld: %.9g vs %.9g (sum|xy| %g)",
                           e->name, isa, (long long)n, got, ref, as);
                }
                float fast;
                e->vec_dot(n, &fast, xq, yq);
                CHECK(fabs(fast - ref) <= 1e-5 * as + 1e-30);
            }
        }
    }
}

/* Quantise random rows, dequantise, and bound the error by the format's step. */
static void test_round_trip(void) {
    const int64_t n = MAXN;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const int t = types[ti];
        const hm_type_traits *e = hm_type_get(t);
        for (int i = 0; i < n; i++) xf[i] = rng_normal() * (i % 7 == 0 ? 4.0f : 1.0f);
        e->from_float(xf, q1, n);
        e->to_float(q1, f1, n);
        double se = 0, sx = 0;
        int bad = 0;
        const int64_t bs = e->blck_size > 1 ? e->blck_size : 32;
        for (int64_t b = 0; b < n / bs; b++) {
            float amax = 0;
            for (int64_t j = 0; j < bs; j++) amax = fmaxf(amax, fabsf(xf[b * bs + j]));
            for (int64_t j = 0; j < bs; j++) {
                const float x = xf[b * bs + j], err = fabsf(x - f1[b * bs + j]);
                float bound = 0;
                switch (t) {
                case HM_TYPE_F32: bound = 0; break;
                case HM_TYPE_F16: bound = fabsf(x) * 0x1p-11f + 0x1p-25f; break;
                case HM_TYPE_BF16: bound = fabsf(x) * 0x1p-8f; break;
                /* step d = amax/127, codes from the unrounded d: d/2, plus 127 steps of fp16(d)'s
                 * relative error 2^-11 */
                case HM_TYPE_Q8_0: bound = amax / 127.0f * (0.5f + 127.0f * 0x1p-11f) * 1.0001f; break;
                /* step d = amax/8; the end opposite the signed max clamps at 7d (error up to d) */
                case HM_TYPE_Q4_0: bound = amax / 8.0f * (1.0f + 8.0f * 0x1p-11f) * 1.0001f; break;
                /* the same with 16 steps: d = amax/16, the far end clamps at 15d */
                case HM_TYPE_Q5_0: bound = amax / 16.0f * (1.0f + 16.0f * 0x1p-11f) * 1.0001f; break;
                /* scale s = 2^floor(log2 amax - 2): codes reach 6s >= 1.5 amax... the largest gap is
                 * 2s (between 4s and 6s, half of it is s), values above 6s clamp: error < 2s */
                case HM_TYPE_MXFP4: bound = 2.0f * ldexpf(1.0f, (int)floorf(log2f(amax)) - 2); break;
                }
                if (err > bound) bad++;
                se += (double)err * err;
                sx += (double)x * x;
            }
        }
        CHECKF(bad == 0, "%s: %d elements beyond the error bound", e->name, bad);
        /* RMS error relative to RMS signal, against the uniform-rounding estimate step/sqrt(12) */
        const double rel = sqrt(se / sx);
        double lim = 0;
        switch (t) {
        case HM_TYPE_F32: lim = 0; break;
        case HM_TYPE_F16: lim = 0x1p-11; break;
        case HM_TYPE_BF16: lim = 0x1p-8; break;
        case HM_TYPE_Q8_0: lim = 0.02; break;  /* ~ (amax/rms)/127/sqrt(12), amax/rms ~ 5 */
        case HM_TYPE_Q4_0: lim = 0.2; break;   /* ~ (amax/rms)/8/sqrt(12) */
        case HM_TYPE_Q5_0: lim = 0.1; break;   /* ~ (amax/rms)/16/sqrt(12) */
        case HM_TYPE_MXFP4: lim = 0.2; break;
        }
        CHECKF(rel <= lim, "%s: relative RMS error %g > %g", e->name, rel, lim);
        fprintf(stderr, "%-6s relative RMS error %.5f\n", e->name, rel);
    }
}

int main(void) {
    test_traits();
    test_known_q4_0();
    test_known_q5_0();
    test_known_q8_0();
    test_known_mxfp4();
    test_known_f16_bf16();
    test_f16_exhaustive();
    test_round_trip();
    test_simd_vs_ref();
    return test_done();
}
