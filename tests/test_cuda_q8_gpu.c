/* test_cuda_q8_gpu.c - the CUDA int8 decode kernels (Q8_K activations, dp4a) against the CPU's own
 * quantiser and vec_dot, plus an old-vs-new timing print.
 *
 * Host part (runs everywhere, before any GPU work): the device code's Q8_K quantiser, run on the
 * host (hm_cuda_q8k_host_quant), must give the CPU quantiser's bytes and scales exactly, ties and
 * zero blocks included; its unit decoding and dp4a sums (hm_cuda_q8k_host_dot) must agree with the
 * CPU's vec_dot on the same Q8_K row up to float summation order, for Q4_K, Q5_K, Q6_K, IQ4_XS and
 * the low-bit types Q2_K, Q3_K, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M (quantised
 * weights, and random blocks for the i-quants); and the units' integer sums must be the CPU's
 * exactly: summed in double (hm_cuda_q8k_host_dot_dbl) they give the scalar vec_dot's float (at
 * most one ulp apart: double rounding in another order; a wrong integer moves it by far more).
 * GPU part: hm_cuda_matmul's decode path (n_tok 1..8) bit-identical to the host emulation and
 * within float order of the CPU vec_dot, hm_cuda_matvec_multi bit-identical to separate calls,
 * hm_cuda_moe_dev_act (SiLU and GELU, hot and cold experts, several k) against a CPU reference,
 * and both as far from the exact-f32 kernels (HM_CUDA_KERN_F32) as the CPU's own Q8_K rounding is.
 * Exits 77 ("skipped: no GPU") without a device once the host part passed, 1 if it failed. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/cuda/cuda_ops.h"
#include "cuda_test.h"
#include "quant/quant.h"

/* Test hooks defined in cuda_matvec.cu: the device code's quantiser and row dot run on the host. */
void hm_cuda_q8k_host_quant(const float *x, int64_t n, int8_t *q, float *d);
bool hm_cuda_q8k_host_dot(int type, const void *row, int64_t ne0, const int8_t *xq, const float *xd, float *out);
bool hm_cuda_q8k_host_dot_dbl(int type, const void *row, int64_t ne0, const int8_t *xq, const float *xd, float *out);

static const int types[] = {HM_TYPE_Q4_K,    HM_TYPE_Q5_K,   HM_TYPE_Q6_K,  HM_TYPE_IQ4_XS, HM_TYPE_Q2_K,
                            HM_TYPE_Q3_K,    HM_TYPE_IQ2_XXS, HM_TYPE_IQ2_XS, HM_TYPE_IQ2_S, HM_TYPE_IQ3_XXS,
                            HM_TYPE_IQ3_S,   HM_TYPE_IQ1_S,  HM_TYPE_IQ1_M};
#define N_TYPES 13
#define Q8K_BLOCK 292 /* sizeof hm_block_q8_k: float d, int8 qs[256], int16 bsums[16] */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double rnd_u(void) { return rnd_unit(&rng); }
static void fill(float *x, int64_t n, float scale) { fill_normal(&rng, x, n, scale); }

/* The CPU's Q8_K quantisation of n floats (the run-time quantiser, as the CPU matmul uses). */
static void *cpu_q8k(const float *x, int64_t n) {
    void *q = xmalloc((size_t)(n / 256) * Q8K_BLOCK);
    hm_type_get(HM_TYPE_Q8_K)->from_float(x, q, n);
    return q;
}
/* The CPU's dot of one weight row with x (x quantised by the CPU). */
static float cpu_dot(int type, const void *row, int64_t ne0, const void *xq8) {
    float r;
    hm_type_get(type)->vec_dot(ne0, &r, row, xq8);
    return r;
}
/* Weights of `type`: ne1 rows of ne0 random floats through the CPU's reference quantiser
 * (random_iq_blocks for the i-quants unless quantise is forced). */
static uint8_t *make_w_q(int type, int64_t ne0, int64_t ne1, size_t *rs, bool quantise) {
    *rs = hm_row_size(type, ne0);
    if (cuda_test_iq_type(type) && !quantise) {
        uint8_t *w = xmalloc(*rs * (size_t)ne1);
        random_iq_blocks(&rng, type, w, *rs * (size_t)ne1);
        return w;
    }
    float *f = xmalloc(sizeof(float) * (size_t)(ne0 * ne1));
    fill(f, ne0 * ne1, 0.05f);
    uint8_t *w = xmalloc(*rs * (size_t)ne1);
    for (int64_t r = 0; r < ne1; r++) hm_type_get(type)->from_float_ref(f + r * ne0, w + (size_t)r * *rs, ne0);
    free(f);
    return w;
}
static uint8_t *make_w(int type, int64_t ne0, int64_t ne1, size_t *rs) { return make_w_q(type, ne0, ne1, rs, false); }

/* ---- host part ---- */

static void host_quant(void) {
    const int64_t n = 256 * 12;
    float *x = xmalloc(sizeof(float) * (size_t)n);
    fill(x, n, 1.0f);
    memset(x + 256, 0, 256 * sizeof(float));                 /* block 1: all zero */
    x[512 + 7] = 3.0f, x[512 + 200] = -3.0f;                  /* block 2: tie, positive first */
    x[768 + 9] = -3.0f, x[768 + 100] = 3.0f;                  /* block 3: tie, negative first */
    x[1024 + 255] = -5.0f;                                    /* block 4: max in the last lane */
    for (int i = 0; i < 256; i++) x[1280 + i] = (float)(i - 128) * 0.5f; /* block 5: exact halves */
    for (int i = 0; i < 256; i++) x[1536 + i] = i == 31 ? 1e-30f : 0.0f; /* block 6: one tiny value */
    int8_t q[256 * 12];
    float d[12];
    hm_cuda_q8k_host_quant(x, n, q, d);
    uint8_t *c = cpu_q8k(x, n);
    uint8_t *cr = xmalloc((size_t)(n / 256) * Q8K_BLOCK);
    hm_type_get(HM_TYPE_Q8_K)->from_float_ref(x, cr, n);
    int bad = 0;
    for (int64_t b = 0; b < n / 256; b++) {
        const uint8_t *blk = c + b * Q8K_BLOCK;
        bad += memcmp(blk, &d[b], 4) != 0 || memcmp(blk + 4, q + 256 * b, 256) != 0;
        bad += memcmp(blk, cr + b * Q8K_BLOCK, 260) != 0; /* runtime = reference quantiser */
    }
    CHECKF(bad == 0, "q8_K quantiser: %d blocks differ from the CPU's", bad);
    printf("host: q8_K quantiser bit-exact with the CPU's on %lld blocks (ties, zero, halves)\n", (long long)(n / 256));
    free(x);
    free(c);
    free(cr);
}

/* Whether two floats are at most one unit in the last place apart. */
static bool within_ulp(float a, float b) {
    return a == b || nextafterf(a, b) == b;
}

static void host_dots(void) {
    const int64_t ne0s[] = {256, 512, 2048, 4608};
    for (int ti = 0; ti < N_TYPES; ti++)
        for (int si = 0; si < 8; si++) {
            const int type = types[ti];
            const int64_t ne0 = ne0s[si % 4], ne1 = 7;
            size_t rs;
            /* the first four: quantised weights; the last four: random bytes (i-quants) or quantised again */
            uint8_t *w = make_w_q(type, ne0, ne1, &rs, si < 4);
            float *x = xmalloc(sizeof(float) * (size_t)ne0);
            fill(x, ne0, 1.0f);
            int8_t *xq = xmalloc((size_t)ne0);
            float *xd = xmalloc(sizeof(float) * (size_t)(ne0 / 256));
            hm_cuda_q8k_host_quant(x, ne0, xq, xd);
            void *c = cpu_q8k(x, ne0);
            double worst = 0, mx = 0;
            int n_exact = 0, n_far = 0;
            const hm_vec_dot_fn scalar = hm_type_get(type)->vec_dot_isa[HM_ISA_SCALAR];
            for (int64_t r = 0; r < ne1; r++) { /* rows of odd index are 2-aligned for q6_K at ne0 256 */
                float g = 0, gd = 0, rs_ref = 0;
                CHECK(hm_cuda_q8k_host_dot(type, w + (size_t)r * rs, ne0, xq, xd, &g));
                const float ref = cpu_dot(type, w + (size_t)r * rs, ne0, c);
                if (fabs(g - ref) > worst) worst = fabs(g - ref);
                if (fabs(ref) > mx) mx = fabs(ref);
                /* the units' integer sums are the CPU's: summed in double as the scalar dot sums its
                 * blocks, they give its float (up to the double rounding of a different order) */
                CHECK(hm_cuda_q8k_host_dot_dbl(type, w + (size_t)r * rs, ne0, xq, xd, &gd));
                scalar(ne0, &rs_ref, w + (size_t)r * rs, c);
                n_exact += memcmp(&gd, &rs_ref, 4) == 0;
                n_far += !within_ulp(gd, rs_ref);
            }
            CHECKF(worst <= 1e-5 * mx, "host dot %s ne0 %lld: |gpu - cpu| %.3g of max %.3g", hm_type_name(type),
                   (long long)ne0, worst, mx);
            CHECKF(n_far == 0, "host dot %s ne0 %lld: %d rows' unit sums (in double) differ from the scalar CPU dot",
                   hm_type_name(type), (long long)ne0, n_far);
            if (si % 4 == 3)
                printf("host: %-7s %s unit dots vs CPU vec_dot: max |diff| / max |y| %.2e; in double %d/%d rows "
                       "bit-identical to the scalar dot\n", hm_type_name(type), si < 4 ? "quantised" : "random   ",
                       worst / mx, n_exact, (int)ne1);
            free(w);
            free(x);
            free(xq);
            free(xd);
            free(c);
        }
}

/* ---- GPU part ---- */

static void *dev_from(const void *h, size_t n) {
    void *d;
    CK(hm_cuda_alloc(ctx, n, &d, &err));
    CK(hm_cuda_upload(ctx, d, h, n, &err));
    return d;
}
static void dev_to(void *h, const void *d, size_t n) { CK(hm_cuda_download(ctx, h, d, n, &err)); }

/* Whether a matvec of n_tok rows of ne0 takes the int8 kernel (its quantised x fits in 48 KiB). */
static bool q8_fits(int64_t n_tok, int64_t ne0) { return n_tok * ne0 + n_tok * (ne0 / 256) * 4 <= 49152; }

static double nmse(const float *y, const float *ref, int64_t n) {
    double e = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = (double)y[i] - ref[i];
        e += d * d;
        s += (double)ref[i] * ref[i];
    }
    return s > 0 ? e / s : e;
}

static void gpu_matvec(void) {
    const int64_t shapes[][2] = {{256, 37}, {512, 200}, {2048, 300}, {4608, 129}, {6144, 64}};
    for (int ti = 0; ti < N_TYPES; ti++)
        for (int si = 0; si < 5; si++) {
            const int type = types[ti];
            const int64_t ne0 = shapes[si][0], ne1 = shapes[si][1];
            size_t rs;
            uint8_t *w = make_w(type, ne0, ne1, &rs);
            float *x = xmalloc(sizeof(float) * (size_t)(8 * ne0));
            fill(x, 8 * ne0, 1.0f);
            void *dw = dev_from(w, rs * (size_t)ne1);
            float *dx = dev_from(x, sizeof(float) * (size_t)(8 * ne0));
            float *dy, *dy2;
            CK(hm_cuda_alloc(ctx, sizeof(float) * (size_t)(8 * ne1), (void **)&dy, &err));
            CK(hm_cuda_alloc(ctx, sizeof(float) * (size_t)(8 * ne1), (void **)&dy2, &err));
            float *y = xmalloc(sizeof(float) * (size_t)(8 * ne1)), *yf = xmalloc(sizeof(float) * (size_t)(8 * ne1));
            float *ref = xmalloc(sizeof(float) * (size_t)(8 * ne1)), *emu = xmalloc(sizeof(float) * (size_t)(8 * ne1));
            int8_t *xq = xmalloc((size_t)ne0);
            float *xd = xmalloc(sizeof(float) * (size_t)(ne0 / 256));
            for (int t = 0; t < 8; t++) {
                void *c = cpu_q8k(x + t * ne0, ne0);
                hm_cuda_q8k_host_quant(x + t * ne0, ne0, xq, xd);
                for (int64_t r = 0; r < ne1; r++) {
                    ref[t * ne1 + r] = cpu_dot(type, w + (size_t)r * rs, ne0, c);
                    hm_cuda_q8k_host_dot(type, w + (size_t)r * rs, ne0, xq, xd, &emu[t * ne1 + r]);
                }
                free(c);
            }
            hm_cuda_mat m = {dw, type, ne0, ne1, rs};
            double worst_rel = 0, worst_f32 = 0;
            for (int nt = 1; nt <= 8; nt++) {
                hm_cuda_set_kern(ctx, HM_CUDA_KERN_DEFAULT);
                CK(hm_cuda_memset(ctx, dy, 0xff, sizeof(float) * (size_t)(8 * ne1), &err));
                CK(hm_cuda_matmul(ctx, &m, dx, nt, dy, &err));
                dev_to(y, dy, sizeof(float) * (size_t)(nt * ne1));
                hm_cuda_set_kern(ctx, HM_CUDA_KERN_F32);
                CK(hm_cuda_matmul(ctx, &m, dx, nt, dy2, &err));
                dev_to(yf, dy2, sizeof(float) * (size_t)(nt * ne1));
                const bool q8path = q8_fits(nt, ne0);
                double mx = 0, md = 0;
                int n_emu_diff = 0;
                for (int64_t i = 0; i < nt * ne1; i++) {
                    if (fabs(ref[i]) > mx) mx = fabs(ref[i]);
                    if (fabs(y[i] - ref[i]) > md) md = fabs(y[i] - ref[i]);
                    n_emu_diff += memcmp(&y[i], &emu[i], 4) != 0;
                }
                if (q8path) {
                    CHECKF(n_emu_diff == 0, "matvec %s %lldx%lld n_tok %d: %d results differ from the host emulation",
                           hm_type_name(type), (long long)ne0, (long long)ne1, nt, n_emu_diff);
                    CHECKF(md <= 1e-5 * mx, "matvec %s %lldx%lld n_tok %d: |gpu - cpu| %.3g of %.3g", hm_type_name(type),
                           (long long)ne0, (long long)ne1, nt, md, mx);
                    if (md / mx > worst_rel) worst_rel = md / mx;
                }
                /* the distance to exact f32 is the CPU's own Q8_K rounding (same codes) */
                const double e = nmse(y, yf, nt * ne1), ec = nmse(ref, yf, nt * ne1);
                CHECKF(e <= 1.1 * ec + 1e-12 && ec < 1e-3, "matvec %s %lldx%lld n_tok %d: nmse vs f32 kernel %.3g "
                       "(the CPU's %.3g)", hm_type_name(type), (long long)ne0, (long long)ne1, nt, e, ec);
                if (e > worst_f32) worst_f32 = e;
            }
            /* hm_cuda_matvec_multi: three segments, bit-identical to one matmul of each */
            if (ne1 >= 30) {
                const int64_t rows[3] = {ne1 / 3, ne1 / 5, ne1 - ne1 / 3 - ne1 / 5};
                hm_cuda_set_kern(ctx, HM_CUDA_KERN_DEFAULT);
                for (int nt = 1; nt <= 8; nt += 3) {
                    float *ys[3] = {dy2, dy2 + nt * rows[0], dy2 + nt * (rows[0] + rows[1])};
                    CK(hm_cuda_matvec_multi(ctx, &m, dx, nt, 3, ys, rows, &err));
                    float *got = xmalloc(sizeof(float) * (size_t)(nt * ne1));
                    dev_to(got, dy2, sizeof(float) * (size_t)(nt * ne1));
                    int bad = 0;
                    int64_t at = 0, r0 = 0;
                    for (int s = 0; s < 3; s++) {
                        hm_cuda_mat ms = {(const uint8_t *)dw + (size_t)r0 * rs, type, ne0, rows[s], rs};
                        CK(hm_cuda_matmul(ctx, &ms, dx, nt, dy, &err));
                        float *one = xmalloc(sizeof(float) * (size_t)(nt * rows[s]));
                        dev_to(one, dy, sizeof(float) * (size_t)(nt * rows[s]));
                        bad += memcmp(one, got + at, sizeof(float) * (size_t)(nt * rows[s])) != 0;
                        free(one);
                        at += nt * rows[s];
                        r0 += rows[s];
                    }
                    CHECKF(bad == 0, "matvec_multi %s n_tok %d: %d segments differ from separate matmuls",
                           hm_type_name(type), nt, bad);
                    free(got);
                }
            }
            printf("matvec %-6s %5lld x %-4lld n_tok 1..8: max |gpu - cpu vec_dot| / max|y| %.2e, nmse vs f32 kernel %.2e\n",
                   hm_type_name(type), (long long)ne0, (long long)ne1, worst_rel, worst_f32);
            hm_cuda_free(ctx, dw);
            hm_cuda_free(ctx, dx);
            hm_cuda_free(ctx, dy);
            hm_cuda_free(ctx, dy2);
            free(w), free(x), free(y), free(yf), free(ref), free(emu), free(xq), free(xd);
        }
    hm_cuda_set_kern(ctx, HM_CUDA_KERN_DEFAULT);
}

static float act_host(int act, float g, float u) {
    if (act == HM_CUDA_ACT_GELU) return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u;
    return g / (1.0f + expf(-g)) * u;
}

/* hm_cuda_moe_dev_act against the CPU: x and each hot pair's h quantised by the CPU's Q8_K, the
 * CPU's vec_dot for every row, the routing weights summed in pair order. */
static void gpu_moe_case(int gt, int dt, int act, int64_t n_tok, int n_expert, int k, int64_t n_embd, int64_t n_ff) {
    size_t rg, rd;
    uint8_t **gw = xmalloc(sizeof(void *) * (size_t)n_expert * 3);
    for (int e = 0; e < n_expert; e++) {
        gw[3 * e] = make_w(gt, n_embd, n_ff, &rg);
        gw[3 * e + 1] = make_w(gt, n_embd, n_ff, &rg);
        gw[3 * e + 2] = make_w(dt, n_ff, n_embd, &rd);
    }
    hm_cuda_moe_slot *slots = xmalloc(sizeof(hm_cuda_moe_slot) * (size_t)n_expert);
    void **dmem = xmalloc(sizeof(void *) * (size_t)n_expert * 3);
    for (int e = 0; e < n_expert; e++) {
        const bool hot = e % 3 != 1; /* every third expert cold */
        for (int i = 0; i < 3; i++)
            dmem[3 * e + i] = hot ? dev_from(gw[3 * e + i], (i < 2 ? rg * (size_t)n_ff : rd * (size_t)n_embd)) : NULL;
        slots[e] = (hm_cuda_moe_slot){.gate = dmem[3 * e], .up = dmem[3 * e + 1], .down = dmem[3 * e + 2]};
    }
    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)(n_tok * k));
    float *wt = xmalloc(sizeof(float) * (size_t)(n_tok * k));
    for (int64_t t = 0; t < n_tok; t++)
        for (int j = 0; j < k; j++) {
            ids[t * k + j] = (int32_t)((t * 7 + j * 5) % n_expert);
            wt[t * k + j] = (float)(0.2 + rnd_u());
        }
    float *x = xmalloc(sizeof(float) * (size_t)(n_tok * n_embd));
    fill(x, n_tok * n_embd, 1.0f);
    float *ref = xmalloc(sizeof(float) * (size_t)(n_tok * n_embd));
    float *h = xmalloc(sizeof(float) * (size_t)n_ff);
    /* What one flipped Q8_K code of a pair's h moves an output by at most: its routing weight times
     * the code's step (the block's scale, at most max|h| / 127) times the largest |value| of the
     * expert's down matrix. h rounds through expf / tanhf, whose last bits the device and the host
     * need not share, so a code of h lying at a rounding boundary can come out one step apart. */
    float *wd = xmalloc(sizeof(float) * (size_t)n_ff);
    double flip_max = 0;
    for (int64_t t = 0; t < n_tok; t++) {
        void *xq = cpu_q8k(x + t * n_embd, n_embd);
        for (int64_t r = 0; r < n_embd; r++) ref[t * n_embd + r] = 0.0f;
        for (int j = 0; j < k; j++) {
            const int e = ids[t * k + j];
            if (!slots[e].gate) continue;
            for (int64_t r = 0; r < n_ff; r++)
                h[r] = act_host(act, cpu_dot(gt, gw[3 * e] + (size_t)r * rg, n_embd, xq),
                                cpu_dot(gt, gw[3 * e + 1] + (size_t)r * rg, n_embd, xq));
            double hmax = 0, wmax = 0;
            for (int64_t r = 0; r < n_ff; r++) hmax = fmax(hmax, fabs(h[r]));
            for (int64_t r = 0; r < n_embd; r++) {
                hm_type_get(dt)->to_float_ref(gw[3 * e + 2] + (size_t)r * rd, wd, n_ff);
                for (int64_t i = 0; i < n_ff; i++) wmax = fmax(wmax, fabs(wd[i]));
            }
            flip_max = fmax(flip_max, wt[t * k + j] * hmax / 127.0 * wmax);
            void *hq = cpu_q8k(h, n_ff);
            for (int64_t r = 0; r < n_embd; r++)
                ref[t * n_embd + r] += wt[t * k + j] * cpu_dot(dt, gw[3 * e + 2] + (size_t)r * rd, n_ff, hq);
            free(hq);
        }
        free(xq);
    }
    void *dslots = dev_from(slots, sizeof(hm_cuda_moe_slot) * (size_t)n_expert);
    void *dids = dev_from(ids, sizeof(int32_t) * (size_t)(n_tok * k)), *dwt = dev_from(wt, sizeof(float) * (size_t)(n_tok * k));
    float *dx = dev_from(x, sizeof(float) * (size_t)(n_tok * n_embd));
    const size_t xb = sizeof(float) * (size_t)(n_tok * n_embd), ss = hm_cuda_moe_dev_scratch_size(n_tok, k, n_ff);
    void *scr, *dout;
    CK(hm_cuda_alloc(ctx, ss, &scr, &err));
    CK(hm_cuda_alloc(ctx, xb, &dout, &err));
    float *out[3];
    const int kerns[3] = {HM_CUDA_KERN_DEFAULT, HM_CUDA_KERN_DEFAULT, HM_CUDA_KERN_F32};
    for (int i = 0; i < 3; i++) {
        hm_cuda_set_kern(ctx, kerns[i]);
        CK(hm_cuda_memset(ctx, dout, 0, xb, &err));
        CK(hm_cuda_moe_dev_act(ctx, dslots, gt, dt, act, dids, dwt, k, dx, n_tok, n_embd, n_ff, dout, scr, ss, &err));
        out[i] = xmalloc(xb);
        dev_to(out[i], dout, xb);
    }
    hm_cuda_set_kern(ctx, HM_CUDA_KERN_DEFAULT);
    CHECKF(!memcmp(out[0], out[1], xb), "moe_dev: two runs differ (not deterministic)");
    double mx = 0, md = 0;
    for (int64_t i = 0; i < n_tok * n_embd; i++) {
        if (fabs(ref[i]) > mx) mx = fabs(ref[i]);
        if (fabs(out[0][i] - ref[i]) > md) md = fabs(out[0][i] - ref[i]);
    }
    const double e = nmse(out[0], out[2], n_tok * n_embd), ec = nmse(ref, out[2], n_tok * n_embd);
    /* the integer sums are the CPU's, the float order not (1e-5 of max|y|), and at most two codes of
     * h may flip (flip_max above each) */
    CHECKF(md <= 1e-5 * mx + 2.0 * flip_max, "moe_dev %s/%s act %d n_tok %lld k %d: |gpu - cpu| %.3g of %.3g (one "
           "flipped h code: %.3g)", hm_type_name(gt), hm_type_name(dt), act, (long long)n_tok, k, md, mx, flip_max);
    CHECKF(e <= 1.1 * ec + 1e-12 && ec < 1e-3, "moe_dev %s/%s: nmse vs f32 kernel %.3g (the CPU's %.3g)",
           hm_type_name(gt), hm_type_name(dt), e, ec);
    printf("moe_dev %-6s/%-6s %s n_tok %lld top-%d (%d experts, 1/3 cold): max |gpu - cpu| / max|y| %.2e, nmse vs f32 %.2e\n",
           hm_type_name(gt), hm_type_name(dt), act ? "gelu" : "silu", (long long)n_tok, k, n_expert, md / mx, e);
    for (int i = 0; i < 3; i++) free(out[i]);
    for (int e2 = 0; e2 < n_expert * 3; e2++) {
        hm_cuda_free(ctx, dmem[e2]);
        free(gw[e2]);
    }
    hm_cuda_free(ctx, dslots), hm_cuda_free(ctx, dids), hm_cuda_free(ctx, dwt), hm_cuda_free(ctx, dx);
    hm_cuda_free(ctx, scr), hm_cuda_free(ctx, dout);
    free(gw), free(slots), free(dmem), free(ids), free(wt), free(x), free(ref), free(h), free(wd);
}

/* ---- timings (prints, no asserts) ---- */

static double time_mv(int type, int64_t ne0, int64_t ne1, void *buf, size_t mb, size_t copies, const float *dx, float *dy) {
    const int iters = (int)(copies < 400 ? 400 : copies);
    double t0 = 0;
    for (int it = -20; it < iters; it++) {
        if (it == 0) {
            CK(hm_cuda_sync(ctx, &err));
            t0 = now_s();
        }
        hm_cuda_mat w = {(char *)buf + (size_t)((it + 20) % (int)copies) * mb, type, ne0, ne1, hm_row_size(type, ne0)};
        CK(hm_cuda_matmul(ctx, &w, dx, 1, dy, &err));
    }
    CK(hm_cuda_sync(ctx, &err));
    return (now_s() - t0) / iters;
}

static void bench_moe(int gt, int dt);

static void bench(void) {
    const struct { int type; int64_t ne0, ne1; } sh[] = {
        {HM_TYPE_Q4_K, 4096, 4096}, {HM_TYPE_Q4_K, 4608, 2048}, {HM_TYPE_Q4_K, 2048, 768}, {HM_TYPE_Q6_K, 4096, 4096},
        {HM_TYPE_Q6_K, 2048, 768}, {HM_TYPE_Q5_K, 4096, 4096}, {HM_TYPE_IQ4_XS, 4096, 4096},
        {HM_TYPE_Q2_K, 4096, 4096}, {HM_TYPE_Q2_K, 2048, 768}, {HM_TYPE_Q3_K, 4096, 4096}, {HM_TYPE_Q3_K, 768, 2048},
        {HM_TYPE_IQ2_XXS, 4096, 4096}, {HM_TYPE_IQ2_XXS, 2048, 768}, {HM_TYPE_IQ2_XS, 4096, 4096},
        {HM_TYPE_IQ2_S, 4096, 4096}, {HM_TYPE_IQ3_XXS, 4096, 4096}, {HM_TYPE_IQ3_S, 4096, 4096},
        {HM_TYPE_IQ1_S, 4096, 4096}, {HM_TYPE_IQ1_S, 2048, 768}, {HM_TYPE_IQ1_M, 4096, 4096}};
    printf("\ndecode matvec, 1 token, weights cycled through >= 1 GiB (ne0 x ne1): f32 kernel -> int8 kernel\n");
    float *hx = xmalloc(sizeof(float) * 4608);
    fill(hx, 4608, 1.0f);
    float *dx = dev_from(hx, sizeof(float) * 4608), *dy;
    CK(hm_cuda_alloc(ctx, sizeof(float) * 4608, (void **)&dy, &err));
    for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++) {
        size_t rs;
        uint8_t *w = make_w(sh[s].type, sh[s].ne0, sh[s].ne1, &rs);
        const size_t bytes = rs * (size_t)sh[s].ne1, mb = (bytes + 255) & ~(size_t)255, copies = ((size_t)1 << 30) / mb + 1;
        void *buf;
        CK(hm_cuda_alloc(ctx, copies * mb, &buf, &err));
        CK(hm_cuda_upload(ctx, buf, w, bytes, &err));
        for (size_t c = 1; c < copies; c++) CK(hm_cuda_copy(ctx, (char *)buf + c * mb, buf, bytes, &err));
        double t[2];
        for (int kk = 0; kk < 2; kk++) {
            hm_cuda_set_kern(ctx, kk ? HM_CUDA_KERN_DEFAULT : HM_CUDA_KERN_F32);
            t[kk] = time_mv(sh[s].type, sh[s].ne0, sh[s].ne1, buf, mb, copies, dx, dy);
        }
        printf("  %-6s %5lld x %-5lld %7.2f us (%5.0f GB/s) -> %7.2f us (%5.0f GB/s)\n", hm_type_name(sh[s].type),
               (long long)sh[s].ne0, (long long)sh[s].ne1, t[0] * 1e6, (double)bytes / t[0] * 1e-9, t[1] * 1e6,
               (double)bytes / t[1] * 1e-9);
        hm_cuda_free(ctx, buf);
        free(w);
    }
    hm_cuda_set_kern(ctx, HM_CUDA_KERN_DEFAULT);
    hm_cuda_free(ctx, dx);
    hm_cuda_free(ctx, dy);
    free(hx);

    const int pairs[][2] = {{HM_TYPE_Q4_K, HM_TYPE_Q6_K},    {HM_TYPE_Q2_K, HM_TYPE_Q3_K},     {HM_TYPE_IQ2_XXS, HM_TYPE_Q2_K},
                            {HM_TYPE_IQ1_S, HM_TYPE_IQ2_XXS}, {HM_TYPE_IQ2_S, HM_TYPE_IQ3_S}, {HM_TYPE_IQ3_XXS, HM_TYPE_IQ3_S}};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) bench_moe(pairs[i][0], pairs[i][1]);
}

/* The decode MoE: 256 experts, n_embd 2048, n_ff 512, gate/up of type gt, down of dt, top-8, 1 token. */
static void bench_moe(int gt, int dt) {
    const int n_expert = 256, k = 8;
    const int64_t n_embd = 2048, n_ff = 512;
    size_t rg, rd;
    uint8_t *g = make_w(gt, n_embd, n_ff, &rg), *dn = make_w(dt, n_ff, n_embd, &rd);
    const size_t gb = rg * (size_t)n_ff, db = rd * (size_t)n_embd, eb = (2 * gb + db + 255) & ~(size_t)255;
    void *all;
    CK(hm_cuda_alloc(ctx, eb * (size_t)n_expert, &all, &err));
    hm_cuda_moe_slot *slots = xmalloc(sizeof(hm_cuda_moe_slot) * (size_t)n_expert);
    for (int e = 0; e < n_expert; e++) {
        char *b = (char *)all + (size_t)e * eb;
        CK(hm_cuda_upload(ctx, b, g, gb, &err));
        CK(hm_cuda_upload(ctx, b + gb, g, gb, &err));
        CK(hm_cuda_upload(ctx, b + 2 * gb, dn, db, &err));
        slots[e] = (hm_cuda_moe_slot){.gate = b, .up = b + gb, .down = b + 2 * gb};
    }
    const int n_route = 64;
    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)(n_route * k));
    float *wt = xmalloc(sizeof(float) * (size_t)(n_route * k));
    for (int i = 0; i < n_route * k; i++) {
        ids[i] = (int32_t)((i * 37 + i / k * 11) % n_expert);
        wt[i] = 0.125f;
    }
    float *x = xmalloc(sizeof(float) * (size_t)n_embd);
    fill(x, n_embd, 1.0f);
    void *dslots = dev_from(slots, sizeof(hm_cuda_moe_slot) * (size_t)n_expert);
    int32_t *dids = dev_from(ids, sizeof(int32_t) * (size_t)(n_route * k));
    float *dwt = dev_from(wt, sizeof(float) * (size_t)(n_route * k)), *dxm = dev_from(x, sizeof(float) * (size_t)n_embd);
    const size_t ss = hm_cuda_moe_dev_scratch_size(1, k, n_ff);
    void *scr, *dout;
    CK(hm_cuda_alloc(ctx, ss, &scr, &err));
    CK(hm_cuda_alloc(ctx, sizeof(float) * (size_t)n_embd, &dout, &err));
    double t[2];
    for (int kk = 0; kk < 2; kk++) {
        hm_cuda_set_kern(ctx, kk ? HM_CUDA_KERN_DEFAULT : HM_CUDA_KERN_F32);
        const int iters = 400;
        double t0 = 0;
        for (int it = -20; it < iters; it++) {
            if (it == 0) {
                CK(hm_cuda_sync(ctx, &err));
                t0 = now_s();
            }
            const int r = (it + 20) % n_route;
            CK(hm_cuda_moe_dev(ctx, dslots, gt, dt, dids + r * k, dwt + r * k, k, dxm, 1, n_embd,
                               n_ff, dout, scr, ss, &err));
        }
        CK(hm_cuda_sync(ctx, &err));
        t[kk] = (now_s() - t0) / iters;
    }
    hm_cuda_set_kern(ctx, HM_CUDA_KERN_DEFAULT);
    const double mb = (double)k * (double)(2 * gb + db);
    printf("moe_dev decode (256 experts, 2048 / 512, %s / %s, top-8, 1 token, %.1f MB): %.2f us (%.0f GB/s) -> "
           "%.2f us (%.0f GB/s)\n", hm_type_name(gt), hm_type_name(dt), mb * 1e-6, t[0] * 1e6, mb / t[0] * 1e-9,
           t[1] * 1e6, mb / t[1] * 1e-9);
    hm_cuda_free(ctx, all), hm_cuda_free(ctx, dslots), hm_cuda_free(ctx, dids), hm_cuda_free(ctx, dwt);
    hm_cuda_free(ctx, dxm), hm_cuda_free(ctx, scr), hm_cuda_free(ctx, dout);
    free(g), free(dn), free(slots), free(ids), free(wt), free(x);
}

int main(void) {
    host_quant();
    host_dots();
    const int rc = cuda_test_open("the host checks of the q8 quantiser and unit dots passed");
    if (rc >= 0) return rc;
    gpu_matvec();
    const int acts[2] = {HM_CUDA_ACT_SILU, HM_CUDA_ACT_GELU};
    for (int a = 0; a < 2; a++) {
        gpu_moe_case(HM_TYPE_Q4_K, HM_TYPE_Q6_K, acts[a], 1, 12, 8, 2048, 512);
        gpu_moe_case(HM_TYPE_Q4_K, HM_TYPE_Q6_K, acts[a], 5, 12, 3, 1024, 512);
    }
    gpu_moe_case(HM_TYPE_IQ4_XS, HM_TYPE_Q5_K, HM_CUDA_ACT_SILU, 8, 9, 2, 512, 768);
    gpu_moe_case(HM_TYPE_Q5_K, HM_TYPE_IQ4_XS, HM_CUDA_ACT_GELU, 2, 6, 6, 768, 256);
    gpu_moe_case(HM_TYPE_Q6_K, HM_TYPE_Q4_K, HM_CUDA_ACT_SILU, 3, 40, 16, 256, 1024);
    /* the low-bit types, each as gate/up and as down (the mixes' pairs: llama-quantize's q2_k puts
     * Q3_K on down, iq2_xxs / iq1_s put Q2_K / IQ2_XXS there, iq3_xxs IQ3_XXS / IQ3_S) */
    gpu_moe_case(HM_TYPE_Q2_K, HM_TYPE_Q3_K, HM_CUDA_ACT_SILU, 1, 12, 8, 2048, 512);
    gpu_moe_case(HM_TYPE_Q3_K, HM_TYPE_Q2_K, HM_CUDA_ACT_GELU, 5, 12, 3, 1024, 512);
    gpu_moe_case(HM_TYPE_IQ2_XXS, HM_TYPE_Q2_K, HM_CUDA_ACT_SILU, 1, 12, 8, 2048, 768);
    gpu_moe_case(HM_TYPE_IQ1_S, HM_TYPE_IQ2_XXS, HM_CUDA_ACT_SILU, 3, 12, 4, 1024, 512);
    gpu_moe_case(HM_TYPE_IQ1_M, HM_TYPE_IQ2_XS, HM_CUDA_ACT_SILU, 2, 9, 6, 512, 768);
    gpu_moe_case(HM_TYPE_IQ2_S, HM_TYPE_IQ3_S, HM_CUDA_ACT_GELU, 1, 12, 8, 2048, 512);
    gpu_moe_case(HM_TYPE_IQ3_XXS, HM_TYPE_IQ3_XXS, HM_CUDA_ACT_SILU, 8, 9, 2, 512, 256);
    gpu_moe_case(HM_TYPE_IQ3_S, HM_TYPE_IQ1_S, HM_CUDA_ACT_SILU, 1, 12, 8, 1024, 512);
    gpu_moe_case(HM_TYPE_IQ2_XS, HM_TYPE_IQ1_M, HM_CUDA_ACT_SILU, 4, 12, 8, 768, 256);
    bench();
    hm_cuda_close(ctx);
    return test_done();
}
