/* test_kv_quant.c - the bf16 / q8_0 / q4_0 KV caches on the CPU (-ctk/-ctv).
 *
 * Kernels: hm_cpu_kv_write_ring must store each row exactly as ggml's reference quantiser does
 * (the type's from_float_ref, byte for byte); attention over that cache must be exact attention
 * over the dequantised values (a double reference computed from to_float_ref of the stored rows,
 * NMSE < 1e-10: f32 rounding only) in every kernel that reads it: hm_cpu_attention_ring's
 * per-query kernel (short batches, rings) and tiled kernel (prefill; a plain cache and a windowed
 * ring), and hm_cpu_attention_kv (the grouped decode kernel of a plain cache). Against the same
 * attention over an f16 cache of the same K/V it must stay inside a bound derived per output
 * element from the element error bounds of both types (see elem_bound below).
 * Model: the bundled tiny qwen3moe with a q8_0 cache vs f16 and f32 caches (logits of 96 positions,
 * prefill and token by token), and hm_model_kv_bytes of every type computed by hand (q8_0: 34 bytes
 * per 32 values). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "core/fp16.h"
#include "hotmoe.h"
#include "quant/quant.h"
#include "test.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float rnd_n(void) { /* ~N(0,1): sum of 4 uniforms, scaled */
    double s = 0;
    for (int i = 0; i < 4; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        s += (double)(rng >> 11) / 9007199254740992.0;
    }
    return (float)((s - 2.0) * 1.7320508);
}

static double nmse(const float *y, const double *ref, size_t n) {
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        e += ((double)y[i] - ref[i]) * ((double)y[i] - ref[i]);
        r += ref[i] * ref[i];
    }
    return r > 0 ? e / r : e;
}

/* Bound on |x - deq(x)| for element i of a row x of d values stored as type t:
 *   q8_0: the code rounds x / s to the nearest integer (s = amax / 127, an f32; 1/s is used, so a
 *         code may sit a hair past the half step: 0.5 + 1e-4), and s is stored as f16 (relative error
 *         <= 2^-11, times |code| <= 127): amax * ((0.5 + 1e-4) / 127 + 2^-11);
 *   q4_0: s = max / -8 (max: the value of largest magnitude) with codes clamped to 0..15 around 8:
 *         half a step, but a full step |s| = amax / 8 for a value at -max (code 16 clamped to 15),
 *         plus the f16 scale's error times |code - 8| <= 8: amax * ((1 + 1e-4) / 8 + 2^-11);
 *   bf16: |x| * 2^-8 (round to nearest, 8 bits of mantissa);
 *   f16:  |x| * 2^-11 + 2^-25 (normal range; the subnormal step covers the rest). */
static double elem_bound(int t, const float *x, int d, int i) {
    if (t == HM_TYPE_F16) return fabs((double)x[i]) * 0x1p-11 + 0x1p-25;
    if (t == HM_TYPE_BF16) return fabs((double)x[i]) * 0x1p-8 + 1e-38;
    const int b0 = i / 32 * 32;
    double amax = 0;
    for (int j = b0; j < b0 + 32 && j < d; j++) amax = fabs((double)x[j]) > amax ? fabs((double)x[j]) : amax;
    if (t == HM_TYPE_Q8_0) return amax * ((0.5 + 1e-4) / 127.0 + 0x1p-11);
    return amax * ((1.0 + 1e-4) / 8.0 + 0x1p-11);
}

#define N_HEAD 8
#define N_KV 2

/* One case: n_ctx positions written (rows p % cap), queries at the last n_tok positions, window W
 * (0: none). Types: t (under test) and f16 (the comparison). */
static void run_case(hm_pool *pool, int t, int d, int64_t n_pos, int64_t cap, int32_t W, int n_tok) {
    const hm_type_traits *tt = hm_type_get(t);
    const size_t rb = hm_row_size(t, d), rb16 = hm_row_size(HM_TYPE_F16, d);
    const int64_t row_kv = (int64_t)N_KV * d, row_q = (int64_t)N_HEAD * d;
    float *k = malloc((size_t)(n_pos * row_kv) * sizeof(float)), *v = malloc((size_t)(n_pos * row_kv) * sizeof(float));
    for (int64_t i = 0; i < n_pos * row_kv; i++) {
        k[i] = rnd_n();
        v[i] = rnd_n();
    }
    for (int64_t i = 0; i < n_pos * row_kv; i += 97) k[i] *= 6.0f; /* outliers: a block's scale is its max */
    char *kc = calloc((size_t)(N_KV * cap), rb), *vc = calloc((size_t)(N_KV * cap), rb);
    char *kh = calloc((size_t)(N_KV * cap), rb16), *vh = calloc((size_t)(N_KV * cap), rb16);
    int32_t *pos = malloc((size_t)n_pos * sizeof(int32_t));
    for (int64_t p = 0; p < n_pos; p++) pos[p] = (int32_t)p;
    /* the prefix in batches of 5 positions (several writes, as a session does), then the queries' rows */
    for (int64_t p = 0; p < n_pos; p += 5) {
        const int64_t n = n_pos - p < 5 ? n_pos - p : 5;
        hm_cpu_kv_write_ring(pool, kc, vc, t, cap, N_KV, d, k + p * row_kv, v + p * row_kv, n, pos + p);
        hm_cpu_kv_write_ring(pool, kh, vh, HM_TYPE_F16, cap, N_KV, d, k + p * row_kv, v + p * row_kv, n, pos + p);
    }
    /* the write: ggml's reference quantiser, byte for byte, for every row still in the ring */
    char *want = malloc(rb);
    int bad = 0;
    for (int64_t p = n_pos - (cap < n_pos ? cap : n_pos); p < n_pos; p++)
        for (int h = 0; h < N_KV; h++) {
            const size_t at = ((size_t)h * (size_t)cap + (size_t)(p % cap)) * rb;
            tt->from_float_ref(k + p * row_kv + h * d, want, d);
            bad += memcmp(kc + at, want, rb) != 0;
            tt->from_float_ref(v + p * row_kv + h * d, want, d);
            bad += memcmp(vc + at, want, rb) != 0;
        }
    CHECKF(bad == 0, "%s d=%d: %d cache rows differ from ggml's quantiser", tt->name, d, bad);
    free(want);

    float *q = malloc((size_t)(n_tok * row_q) * sizeof(float));
    for (int64_t i = 0; i < n_tok * row_q; i++) q[i] = rnd_n();
    const int32_t *qpos = pos + (n_pos - n_tok);
    const float scale = 1.0f / sqrtf((float)d);
    float *out = malloc((size_t)(n_tok * row_q) * sizeof(float)), *out16 = malloc((size_t)(n_tok * row_q) * sizeof(float));
    const size_t fl = hm_cpu_attention_ring_scratch_floats(cap, hm_pool_size(pool)) +
                      hm_cpu_attn_tiled_scratch_floats(N_HEAD, N_KV, d, hm_pool_size(pool));
    float *ws = malloc(fl * sizeof(float));
    hm_cpu_attention_ring(pool, q, n_tok, qpos, kc, vc, t, cap, W, N_HEAD, N_KV, d, scale, out, ws);
    hm_cpu_attention_ring(pool, q, n_tok, qpos, kh, vh, HM_TYPE_F16, cap, W, N_HEAD, N_KV, d, scale, out16, ws);

    /* exactness over the dequantised cache, and the derived bound against the f16 cache */
    double *ref = malloc((size_t)(n_tok * row_q) * sizeof(double));
    double *sc = malloc((size_t)cap * sizeof(double)), *kd = malloc((size_t)d * sizeof(double));
    float *row = malloc((size_t)d * sizeof(float));
    double worst = 0; /* max over elements of |out - out16| / bound */
    for (int ti = 0; ti < n_tok; ti++)
        for (int h = 0; h < N_HEAD; h++) {
            const int g = h / (N_HEAD / N_KV);
            const int64_t p1 = qpos[ti], p0 = W > 0 && p1 - W + 1 > 0 ? p1 - W + 1 : 0;
            const float *qv = q + ti * row_q + h * d;
            double m = -INFINITY, l = 0, delta = 0, vmax[512] = {0}, verr[512] = {0};
            for (int64_t p = p0; p <= p1; p++) {
                const size_t at = ((size_t)g * (size_t)cap + (size_t)(p % cap)) * rb;
                tt->to_float_ref(kc + at, row, d);
                double s = 0, ds = 0;
                for (int i = 0; i < d; i++) {
                    s += (double)qv[i] * row[i];
                    const float *kx = k + p * row_kv + g * d;
                    ds += fabs((double)qv[i]) * (elem_bound(t, kx, d, i) + elem_bound(HM_TYPE_F16, kx, d, i));
                }
                sc[p - p0] = s * scale;
                m = sc[p - p0] > m ? sc[p - p0] : m;
                delta = ds * scale > delta ? ds * scale : delta;
                const float *vx = v + p * row_kv + g * d;
                for (int i = 0; i < d; i++) {
                    const double eb = elem_bound(t, vx, d, i) + elem_bound(HM_TYPE_F16, vx, d, i);
                    verr[i] = eb > verr[i] ? eb : verr[i];
                    vmax[i] = fabs((double)vx[i]) + elem_bound(HM_TYPE_F16, vx, d, i) > vmax[i]
                                  ? fabs((double)vx[i]) + elem_bound(HM_TYPE_F16, vx, d, i) : vmax[i];
                }
            }
            for (int64_t p = p0; p <= p1; p++) l += (sc[p - p0] = exp(sc[p - p0] - m));
            for (int i = 0; i < d; i++) kd[i] = 0;
            for (int64_t p = p0; p <= p1; p++) {
                tt->to_float_ref(vc + ((size_t)g * (size_t)cap + (size_t)(p % cap)) * rb, row, d);
                for (int i = 0; i < d; i++) kd[i] += sc[p - p0] * row[i];
            }
            for (int i = 0; i < d; i++) {
                const size_t at = (size_t)(ti * row_q + h * d + i);
                ref[at] = kd[i] / l;
                /* scores of the two caches differ by at most delta each, so each softmax weight
                 * moves by a factor within e^(+-2 delta): |sum (p' - p) v| <= (e^(2 delta) - 1) max|v|;
                 * the values themselves differ by at most verr; 1e-5 relative for f32 rounding */
                const double bound = expm1(2 * delta) * vmax[i] + verr[i] + 1e-5 * (fabs(ref[at]) + 1e-3);
                const double r = fabs((double)out[at] - (double)out16[at]) / bound;
                worst = r > worst ? r : worst;
            }
        }
    const double e = nmse(out, ref, (size_t)(n_tok * row_q));
    const bool tiled = hm_cpu_attn_tiled_takes(n_tok, N_HEAD, N_KV, d);
    if (W == 0 && cap >= n_pos && hm_cpu_attention_kv_takes(t, d)) {
        /* a plain cache's decode path: the grouped kernel of cpu_attn.c over the same rows */
        hm_scratch scr = {.size = hm_cpu_attention_scratch_size(n_tok, cap, N_HEAD, d, hm_pool_size(pool))};
        scr.data = malloc(scr.size);
        float *og = malloc((size_t)(n_tok * row_q) * sizeof(float));
        hm_cpu_attention_kv(pool, t, q, n_tok, qpos, kc, vc, cap, N_HEAD, N_KV, d, scale, og, &scr);
        const double eg = nmse(og, ref, (size_t)(n_tok * row_q));
        CHECKF(eg < 1e-10, "%s d=%d n_tok=%d (grouped): nmse %.3g vs the dequantised cache", tt->name, d, n_tok, eg);
        printf("%-5s d=%3d n_tok=%2d cap=%4lld W=%2d grouped   nmse(dequant ref) %.2e\n", tt->name, d, n_tok,
               (long long)cap, W, eg);
        free(og);
        free(scr.data);
    }
    CHECKF(e < 1e-10, "%s d=%d n_tok=%d cap=%lld W=%d (%s): nmse %.3g vs the dequantised cache", tt->name, d, n_tok,
           (long long)cap, W, tiled ? "tiled" : "per query", e);
    CHECKF(worst <= 1.0, "%s d=%d n_tok=%d: |out - out_f16| reaches %.3f of the derived bound", tt->name, d, n_tok,
           worst);
    printf("%-5s d=%3d n_tok=%2d cap=%4lld W=%2d %-9s nmse(dequant ref) %.2e  |vs f16| / bound max %.3f\n", tt->name, d,
           n_tok, (long long)cap, W, tiled ? "tiled" : "per-query", e, worst);
    free(k), free(v), free(kc), free(vc), free(kh), free(vh), free(pos), free(q), free(out), free(out16), free(ws);
    free(ref), free(sc), free(kd), free(row);
}

/* The bundled model: q8_0 cache vs f16 and f32 caches, prefill (ubatch 512) and token by token. */
static float *model_logits(hm_model *m, hm_kv_type kv, int ubatch, const int32_t *tok, int n) {
    hm_session_opts so;
    hm_session_opts_default(&so);
    so.kv_type = kv;
    so.n_ctx = 256;
    so.n_ubatch = ubatch;
    so.n_threads = 2;
    hm_session *s = NULL;
    hm_err err;
    if (hm_session_open(&s, m, &so, &err) != HM_OK) {
        fprintf(stderr, "session: %s\n", err.msg);
        return NULL;
    }
    const int V = hm_model_n_vocab(m);
    float *all = malloc((size_t)n * (size_t)V * sizeof(float));
    const float *lg = NULL;
    for (int i = 0; i < n; i += ubatch) { /* logits of every position */
        const int c = n - i < ubatch ? n - i : ubatch;
        if (hm_session_eval(s, tok + i, c, true, &lg, &err) != HM_OK) {
            fprintf(stderr, "eval: %s\n", err.msg);
            free(all);
            hm_session_close(s);
            return NULL;
        }
        memcpy(all + (size_t)i * (size_t)V, lg, (size_t)c * (size_t)V * sizeof(float));
    }
    hm_session_close(s);
    return all;
}

static double maxdiff(const float *a, const float *b, size_t n) {
    double md = 0;
    for (size_t i = 0; i < n; i++) {
        const double dd = fabs((double)a[i] - (double)b[i]);
        if (!(dd <= md)) md = dd;
    }
    return md;
}

/* mean over positions of each position's max |a - b| */
static double mean_row_maxdiff(const float *a, const float *b, int n, int V) {
    double s = 0;
    for (int t = 0; t < n; t++) s += maxdiff(a + (size_t)t * V, b + (size_t)t * V, (size_t)V);
    return s / n;
}

static int top1_agree(const float *a, const float *b, int n, int V) {
    int agree = 0;
    for (int t = 0; t < n; t++) {
        int ia = 0, ib = 0;
        for (int i = 1; i < V; i++) {
            if (a[(size_t)t * V + i] > a[(size_t)t * V + ia]) ia = i;
            if (b[(size_t)t * V + i] > b[(size_t)t * V + ib]) ib = i;
        }
        agree += ia == ib;
    }
    return agree;
}

static void test_model(void) {
    const char *path = test_src_path("models/tiny-qwen3moe-q8_0.gguf");
    hm_model *m = NULL;
    hm_err err;
    if (hm_model_open(&m, path, NULL, &err) != HM_OK) {
        fprintf(stderr, "model %s: %s\n", path, err.msg);
        CHECK(0);
        return;
    }
    const hm_model_info *inf = hm_model_get_info(m);
    /* bytes by hand: every layer has a cache; K and V; n_head_kv rows of head_dim per position;
     * q8_0 = 34 bytes per 32 values, q4_0 18, bf16 / f16 2 a value, f32 4 */
    const uint64_t rows = (uint64_t)inf->n_layer * 2 * (uint64_t)inf->n_head_kv * 1000;
    const struct { hm_kv_type t; uint64_t per_row; } kb[] = {
        {HM_KV_F16, (uint64_t)inf->head_dim * 2}, {HM_KV_F32, (uint64_t)inf->head_dim * 4},
        {HM_KV_BF16, (uint64_t)inf->head_dim * 2}, {HM_KV_Q8_0, (uint64_t)inf->head_dim / 32 * 34},
        {HM_KV_Q4_0, (uint64_t)inf->head_dim / 32 * 18}};
    for (size_t i = 0; i < sizeof kb / sizeof kb[0]; i++) {
        uint64_t got = 0;
        CHECK(hm_model_kv_bytes(m, 1000, 0, kb[i].t, &got, &err) == HM_OK);
        CHECKF(got == rows * kb[i].per_row, "%s: kv bytes %llu, by hand %llu", hm_kv_type_name(kb[i].t),
               (unsigned long long)got, (unsigned long long)(rows * kb[i].per_row));
    }

    enum { N = 96 };
    const int V = hm_model_n_vocab(m);
    int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(((int64_t)i * 7919 + 13) % V);
    float *f32 = model_logits(m, HM_KV_F32, 512, tok, N), *f16 = model_logits(m, HM_KV_F16, 512, tok, N);
    float *q8 = model_logits(m, HM_KV_Q8_0, 512, tok, N), *q8t = model_logits(m, HM_KV_Q8_0, 1, tok, N);
    CHECK(f32 && f16 && q8 && q8t);
    if (f32 && f16 && q8 && q8t) {
        const size_t n = (size_t)N * (size_t)V;
        const double d16 = maxdiff(f16, f32, n), d8 = maxdiff(q8, f32, n), d8_16 = maxdiff(q8, f16, n);
        const double d8t = maxdiff(q8t, q8, n);
        const int a8 = top1_agree(q8, f16, N, V), a8_32 = top1_agree(q8, f32, N, V);
        printf("model: max |logit diff| f16-f32 %.3g, q8_0-f32 %.3g, q8_0-f16 %.3g; top-1 q8_0 vs f16 %d/%d, vs f32 "
               "%d/%d; q8_0 prefill vs token by token %.3g\n", d16, d8, d8_16, a8, N, a8_32, N, d8t);
        printf("model: mean per-position max |diff| f16-f32 %.3g, q8_0-f32 %.3g, q8_0-f16 %.3g, q8_0 prefill vs "
               "token by token %.3g\n", mean_row_maxdiff(f16, f32, N, V), mean_row_maxdiff(q8, f32, N, V),
               mean_row_maxdiff(q8, f16, N, V), mean_row_maxdiff(q8t, q8, N, V));
        /* This model's weights are q8_0: every matmul quantises its input rows to q8_0 blocks, so a
         * perturbation of the attention output moves the logits in steps (a code that flips, an
         * expert the router swaps), not smoothly; the max over 96 x 8192 logits is one such flip
         * (f16 vs f32 KV: ~1.9 of logits up to 15). So the checks are on the typical position and
         * on the argmax: q8_0's cache must cost at most twice what f16's rounding costs (mean of each
         * position's max |diff| vs the f32 cache), and keep >= 90 % of f32's top-1 choices. */
        const double m16 = mean_row_maxdiff(f16, f32, N, V), m8 = mean_row_maxdiff(q8, f32, N, V);
        CHECKF(m8 <= 2 * m16, "q8_0 cache: mean per-position max |diff| %.3g vs f32, f16's %.3g", m8, m16);
        CHECKF(a8_32 >= N * 9 / 10, "top-1 q8_0 vs f32: %d of %d", a8_32, N);
        CHECKF(a8 >= N * 9 / 10, "top-1 q8_0 vs f16: %d of %d", a8, N);
    }
    free(f32), free(f16), free(q8), free(q8t);
    hm_model_close(m);
}

int main(void) {
    hm_pool *pool = NULL;
    hm_err err;
    if (hm_pool_open(&pool, 2, &err) != HM_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    CHECK(!hm_cpu_kv_row_ok(HM_TYPE_Q8_0, 40) && hm_cpu_kv_row_ok(HM_TYPE_Q8_0, 64) && !hm_cpu_kv_row_ok(HM_TYPE_Q4_K, 256));
    const int types[] = {HM_TYPE_Q8_0, HM_TYPE_Q4_0, HM_TYPE_BF16};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const int t = types[ti];
        run_case(pool, t, 64, 300, 300, 0, 1);   /* decode on a plain cache */
        run_case(pool, t, 128, 300, 300, 0, 7);  /* a short batch: per query */
        run_case(pool, t, 64, 300, 300, 0, 40);  /* prefill: the tiled kernel (AVX-512) */
        run_case(pool, t, 256, 140, 63, 24, 40); /* a sliding ring of 24 + 40 - 1 rows */
        run_case(pool, t, 128, 140, 63, 24, 1);
    }
    test_model();
    hm_pool_close(pool);
    return test_done();
}
