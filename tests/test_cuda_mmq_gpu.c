/* test_cuda_mmq_gpu.c - the int8 tensor-core prefill matmul (cuda_mmq.cu, on by default; the test
 * switches it with hm_cuda_set_mmq) against the CPU's vec_dot, plus a timing line next to the bf16
 * WMMA path it replaces (HOTMOE_CUDA_MMQ=0).
 *
 * Host part (runs everywhere): the kernel's staging of the weights (hm_cuda_mmq_host_dot: the same
 * mmq_stage code, the same integer block sums and f32 operations in the same order) must agree
 * with the CPU's vec_dot against the CPU's own Q8_K row up to float summation order, for Q4_K,
 * Q5_K, Q6_K, IQ4_XS and the low-bit types Q3_K, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M
 * (a scale per 16, like Q6_K; Q2_K has no tiles: its mins come per 16); the 32-sums it uses must
 * be the CPU's bsums pairwise.
 * GPU part: hm_cuda_matmul with the switch on, n_tok 9 / 64 / 512 / 1000 (the last over a
 * workspace chunk), ne0 2048 / 4096 / 16384, ne1 not a multiple of the 64-row tile:
 *   - bit-identical to the host emulation (every float operation is the same and in the same
 *     order, the integer sums are exact: a wrong mma fragment layout or tile edge cannot pass);
 *   - within float order of the CPU vec_dot: |y - cpu| <= 1e-5 * max |cpu| (the decode int8
 *     path's bound; ne0 <= 16384 is <= 64 block sums per output);
 *   - NMSE against the bf16 path (switch off) <= 1e-3 (both are ~1e-5 from exact f32: bf16
 *     rounding vs Q8_K rounding; a layout bug gives ~1);
 *   - the switch does not touch other types (Q8_0) nor the decode path (n_tok <= 8): same bits.
 * hm_cuda_moe_act with the switch on (gate / up and down in int8 tiles): deterministic, NMSE vs
 * the CPU engine's numerics <= 1e-5, vs the switch-off (f32) path <= 1e-3.
 * Then prints the 4096 x 4096, n_tok 512 timings of both paths for every type.
 * Exits 77 ("skipped: no GPU") without a device once the host part passed, 1 if it failed. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/cuda/cuda_ops.h"
#include "cuda_test.h"
#include "quant/quant.h"

/* Test hooks (cuda_matvec.cu, cuda_mmq.cu): the device quantiser and the MMQ block arithmetic on
 * the host. */
void hm_cuda_q8k_host_quant(const float *x, int64_t n, int8_t *q, float *d);
bool hm_cuda_mmq_host_dot(int type, const void *row, int64_t ne0, const int8_t *xq, const float *xd,
                          const int *xs32, float *out);

static const int types[] = {HM_TYPE_Q4_K,    HM_TYPE_Q5_K,    HM_TYPE_Q6_K,   HM_TYPE_IQ4_XS, HM_TYPE_Q3_K,
                            HM_TYPE_IQ2_XXS, HM_TYPE_IQ2_XS,  HM_TYPE_IQ2_S,  HM_TYPE_IQ3_XXS, HM_TYPE_IQ3_S,
                            HM_TYPE_IQ1_S,   HM_TYPE_IQ1_M};
#define N_TYPES 12
#define Q8K_BLOCK 292 /* sizeof hm_block_q8_k: float d, int8 qs[256], int16 bsums[16] */

static uint64_t rng = 0x2545f4914f6cdd1dull;
static void fill(float *x, int64_t n, float scale) { fill_normal(&rng, x, n, scale); }

/* Weights through the CPU's reference quantiser; the grid i-quants' (a lattice search, too slow
 * for these shapes) as random blocks unless quantise is forced. */
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

/* Activations of n_tok rows quantised both ways: the CPU's Q8_K blocks (cq) and the device
 * quantiser's codes, scales and 32-sums (as k_mmq_quant lays them out). */
typedef struct {
    int64_t n_tok, ne0;
    uint8_t *cq;   /* [n_tok][ne0 / 256] hm_block_q8_k */
    int8_t *xq;    /* [n_tok][ne0] */
    float *xd;     /* [n_tok][ne0 / 256] */
    int *xs;       /* [n_tok][ne0 / 32] */
} qacts;

static qacts quant_acts(const float *x, int64_t n_tok, int64_t ne0) {
    qacts a = {n_tok, ne0, NULL, NULL, NULL, NULL};
    const int64_t nb = ne0 / 256;
    a.cq = xmalloc((size_t)(n_tok * nb) * Q8K_BLOCK);
    a.xq = xmalloc((size_t)(n_tok * ne0));
    a.xd = xmalloc(sizeof(float) * (size_t)(n_tok * nb));
    a.xs = xmalloc(sizeof(int) * (size_t)(n_tok * ne0 / 32));
    for (int64_t t = 0; t < n_tok; t++) {
        hm_type_get(HM_TYPE_Q8_K)->from_float(x + t * ne0, a.cq + (size_t)(t * nb) * Q8K_BLOCK, ne0);
        hm_cuda_q8k_host_quant(x + t * ne0, ne0, a.xq + t * ne0, a.xd + t * nb);
    }
    for (int64_t i = 0; i < n_tok * ne0 / 32; i++) {
        int s = 0;
        for (int e = 0; e < 32; e++) s += a.xq[32 * i + e];
        a.xs[i] = s;
    }
    return a;
}
static void free_acts(qacts *a) { free(a->cq), free(a->xq), free(a->xd), free(a->xs); }

static float cpu_dot(int type, const void *row, const qacts *a, int64_t t) {
    float r;
    hm_type_get(type)->vec_dot(a->ne0, &r, row, a->cq + (size_t)(t * (a->ne0 / 256)) * Q8K_BLOCK);
    return r;
}
static float emu_dot(int type, const void *row, const qacts *a, int64_t t) {
    float r = 0;
    hm_cuda_mmq_host_dot(type, row, a->ne0, a->xq + t * a->ne0, a->xd + t * (a->ne0 / 256),
                         a->xs + t * (a->ne0 / 32), &r);
    return r;
}

/* ---- host part ---- */

static void host_checks(void) {
    /* the 32-sums are the CPU's bsums pairwise, the codes and scales the CPU's */
    {
        const int64_t ne0 = 1024;
        float *x = xmalloc(sizeof(float) * (size_t)ne0);
        fill(x, ne0, 1.0f);
        memset(x + 256, 0, 256 * sizeof(float)); /* an all-zero block */
        qacts a = quant_acts(x, 1, ne0);
        int bad = 0;
        for (int b = 0; b < 4; b++) {
            const uint8_t *blk = a.cq + (size_t)b * Q8K_BLOCK;
            bad += memcmp(blk, &a.xd[b], 4) != 0 || memcmp(blk + 4, a.xq + 256 * b, 256) != 0;
            for (int j = 0; j < 8; j++) {
                int16_t s0, s1;
                memcpy(&s0, blk + 260 + 4 * j, 2);
                memcpy(&s1, blk + 262 + 4 * j, 2);
                bad += a.xs[8 * b + j] != s0 + s1;
            }
        }
        CHECKF(bad == 0, "mmq activations: %d codes / scales / 32-sums differ from the CPU's Q8_K", bad);
        free_acts(&a);
        free(x);
    }
    const int64_t ne0s[] = {256, 2048, 4608};
    for (int ti = 0; ti < N_TYPES; ti++)
        for (int si = 0; si < 6; si++) {
            const int type = types[ti];
            const int64_t ne0 = ne0s[si % 3], ne1 = 7, n_tok = 3;
            size_t rs;
            /* quantised weights, then random blocks (i-quants; the others quantised again); odd rows
             * of q6_K at ne0 256 are 2-aligned */
            uint8_t *w = make_w_q(type, ne0, ne1, &rs, si < 3);
            float *x = xmalloc(sizeof(float) * (size_t)(n_tok * ne0));
            fill(x, n_tok * ne0, 1.0f);
            qacts a = quant_acts(x, n_tok, ne0);
            double worst = 0, mx = 0;
            for (int64_t t = 0; t < n_tok; t++)
                for (int64_t r = 0; r < ne1; r++) {
                    const float ref = cpu_dot(type, w + (size_t)r * rs, &a, t), e = emu_dot(type, w + (size_t)r * rs, &a, t);
                    if (fabs(e - ref) > worst) worst = fabs(e - ref);
                    if (fabs(ref) > mx) mx = fabs(ref);
                }
            CHECKF(worst <= 1e-5 * mx, "host mmq %s ne0 %lld: |emu - cpu| %.3g of max %.3g", hm_type_name(type),
                   (long long)ne0, worst, mx);
            if (si % 3 == 2)
                printf("host: %-7s %s mmq block sums vs CPU vec_dot: max |diff| / max |y| %.2e\n", hm_type_name(type),
                       si < 3 ? "quantised" : "random   ", worst / mx);
            free_acts(&a);
            free(w);
            free(x);
        }
}

/* ---- GPU part ---- */

static void *dev_from(const void *h, size_t n) {
    void *d;
    CK(hm_cuda_alloc(ctx, n, &d, &err));
    CK(hm_cuda_upload(ctx, d, h, n, &err));
    return d;
}

static double nmse(const float *y, const float *ref, int64_t n) {
    double e = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = (double)y[i] - ref[i];
        e += d * d;
        s += (double)ref[i] * ref[i];
    }
    return s > 0 ? e / s : e;
}

/* y = W x through hm_cuda_matmul with the mmq switch on / off, downloaded into y. */
static void run_mm(const hm_cuda_mat *m, const float *dx, int64_t n_tok, float *dy, float *y, bool mmq) {
    CK(hm_cuda_set_mmq(ctx, mmq, &err));
    CK(hm_cuda_memset(ctx, dy, 0xff, sizeof(float) * (size_t)(n_tok * m->ne1), &err));
    CK(hm_cuda_matmul(ctx, m, dx, n_tok, dy, &err));
    CK(hm_cuda_download(ctx, y, dy, sizeof(float) * (size_t)(n_tok * m->ne1), &err));
}

static void gpu_case(int type, int64_t ne0, int64_t ne1, int64_t n_tok) {
    size_t rs;
    uint8_t *w = make_w(type, ne0, ne1, &rs);
    float *x = xmalloc(sizeof(float) * (size_t)(n_tok * ne0));
    fill(x, n_tok * ne0, 1.0f);
    void *dw = dev_from(w, rs * (size_t)ne1);
    float *dx = dev_from(x, sizeof(float) * (size_t)(n_tok * ne0)), *dy;
    CK(hm_cuda_alloc(ctx, sizeof(float) * (size_t)(n_tok * ne1), (void **)&dy, &err));
    float *y = xmalloc(sizeof(float) * (size_t)(n_tok * ne1)), *yb = xmalloc(sizeof(float) * (size_t)(n_tok * ne1));
    const hm_cuda_mat m = {dw, type, ne0, ne1, rs};
    run_mm(&m, dx, n_tok, dy, y, true);
    run_mm(&m, dx, n_tok, dy, yb, false);
    qacts a = quant_acts(x, n_tok, ne0);
    /* every row for the small shapes; for the large ones every 13th row, the first and last tile's */
    const int64_t step = ne1 * n_tok * ne0 > ((int64_t)1 << 31) ? 13 : 1;
    double md = 0, mx = 0;
    int64_t n_emu = 0, n_checked = 0;
    for (int64_t r = 0; r < ne1; r++) {
        if (step > 1 && r % step && r >= 64 && r < ne1 - 64) continue;
        for (int64_t t = 0; t < n_tok; t++) {
            const float g = y[t * ne1 + r], ref = cpu_dot(type, w + (size_t)r * rs, &a, t);
            const float e = emu_dot(type, w + (size_t)r * rs, &a, t);
            n_emu += memcmp(&g, &e, 4) != 0;
            n_checked++;
            const double d = fabs(g - ref);
            if (isnan(d)) md = INFINITY;
            else if (d > md) md = d;
            if (fabs(ref) > mx) mx = fabs(ref);
        }
    }
    const double nb = nmse(y, yb, n_tok * ne1);
    CHECKF(n_emu == 0, "mmq %s %lldx%lld n_tok %lld: %lld of %lld results differ from the host emulation",
           hm_type_name(type), (long long)ne0, (long long)ne1, (long long)n_tok, (long long)n_emu, (long long)n_checked);
    CHECKF(md <= 1e-5 * mx, "mmq %s %lldx%lld n_tok %lld: |gpu - cpu| %.3g of max %.3g", hm_type_name(type),
           (long long)ne0, (long long)ne1, (long long)n_tok, md, mx);
    CHECKF(nb <= 1e-3, "mmq %s %lldx%lld n_tok %lld: NMSE vs the bf16 path %.3g", hm_type_name(type), (long long)ne0,
           (long long)ne1, (long long)n_tok, nb);
    printf("mmq %-6s %5lld x %5lld n_tok %4lld: %lld checked, %lld differ from emulation, max |gpu - cpu| / max %.2e, "
           "NMSE vs bf16 path %.2e\n", hm_type_name(type), (long long)ne0, (long long)ne1, (long long)n_tok,
           (long long)n_checked, (long long)n_emu, md / mx, nb);
    free_acts(&a);
    hm_cuda_free(ctx, dw), hm_cuda_free(ctx, dx), hm_cuda_free(ctx, dy);
    free(w), free(x), free(y), free(yb);
}

/* The switch leaves other types (Q8_0) and the decode path (n_tok <= 8) alone: same bits. */
static void gpu_untouched(void) {
    const int64_t ne0 = 2048, ne1 = 300, n_tok = 40;
    const int cases[][2] = {{HM_TYPE_Q8_0, 40}, {HM_TYPE_Q4_K, 8}, {HM_TYPE_Q6_K, 3}};
    for (int c = 0; c < 3; c++) {
        const int type = cases[c][0];
        const int64_t nt = cases[c][1];
        size_t rs;
        uint8_t *w = make_w(type, ne0, ne1, &rs);
        float *x = xmalloc(sizeof(float) * (size_t)(n_tok * ne0));
        fill(x, n_tok * ne0, 1.0f);
        void *dw = dev_from(w, rs * (size_t)ne1);
        float *dx = dev_from(x, sizeof(float) * (size_t)(n_tok * ne0)), *dy;
        CK(hm_cuda_alloc(ctx, sizeof(float) * (size_t)(n_tok * ne1), (void **)&dy, &err));
        float *y = xmalloc(sizeof(float) * (size_t)(n_tok * ne1)), *yb = xmalloc(sizeof(float) * (size_t)(n_tok * ne1));
        const hm_cuda_mat m = {dw, type, ne0, ne1, rs};
        run_mm(&m, dx, nt, dy, y, true);
        run_mm(&m, dx, nt, dy, yb, false);
        CHECKF(memcmp(y, yb, sizeof(float) * (size_t)(nt * ne1)) == 0, "mmq switch changed %s n_tok %lld",
               hm_type_name(type), (long long)nt);
        hm_cuda_free(ctx, dw), hm_cuda_free(ctx, dx), hm_cuda_free(ctx, dy);
        free(w), free(x), free(y), free(yb);
    }
    printf("mmq switch: Q8_0 prefill and the n_tok <= 8 decode path unchanged\n");
}

/* hm_cuda_moe_act (the prefill grouped MoE) with the switch on: gate / up and down take the int8
 * tiles (cuda_mmq.cu). Reference: the CPU engine's numerics (x and h quantised to Q8_K, vec_dot),
 * which the int8 path reproduces up to float order (and Q8_K codes of h that float order flips).
 * Deterministic; NMSE vs the CPU <= 1e-5 and vs the switch-off (f32) path <= 1e-3 (Q8_K rounding
 * apart, ~1e-5; a wrong unit, pair, token map or tile gives ~1). */
static float silu_h(float v) { return v / (1.0f + expf(-v)); }

static void gpu_moe_case(int gt, int dt, int64_t n_batch, int n_units, int k, int64_t n_embd, int64_t n_ff, bool down_tiles) {
    size_t rg, rd;
    uint8_t **gw = xmalloc(sizeof(uint8_t *) * (size_t)(3 * n_units));
    void **dwt = xmalloc(sizeof(void *) * (size_t)(3 * n_units));
    for (int u = 0; u < n_units; u++) {
        gw[3 * u] = make_w(gt, n_embd, n_ff, &rg);
        gw[3 * u + 1] = make_w(gt, n_embd, n_ff, &rg);
        gw[3 * u + 2] = make_w(dt, n_ff, n_embd, &rd);
        dwt[3 * u] = dev_from(gw[3 * u], rg * (size_t)n_ff);
        dwt[3 * u + 1] = dev_from(gw[3 * u + 1], rg * (size_t)n_ff);
        dwt[3 * u + 2] = dev_from(gw[3 * u + 2], rd * (size_t)n_embd);
    }
    /* token t -> units s, s+1, .. s+k-1 (mod n_units), s = (7t + 3) % n_units; every token also
     * takes unit 0 when k > 1 (one unit over 64 pairs: several pair tiles) */
    int32_t *toks = xmalloc(sizeof(int32_t) * (size_t)(n_units * n_batch));
    float *ws = xmalloc(sizeof(float) * (size_t)(n_units * n_batch));
    int32_t *cnt = calloc((size_t)n_units, sizeof(int32_t));
    for (int64_t t = 0; t < n_batch; t++) {
        const int s = (int)((7 * t + 3) % n_units);
        for (int j = 0; j < k; j++) {
            const int u = j == k - 1 && k > 1 ? 0 : (s + j) % n_units;
            bool dup = false;
            for (int j2 = 0; j2 < j; j2++) dup |= (s + j2) % n_units == u;
            if (dup) continue;
            toks[u * n_batch + cnt[u]] = (int32_t)t;
            ws[u * n_batch + cnt[u]] = 0.5f / (float)k + 0.01f * (float)j;
            cnt[u]++;
        }
    }
    hm_cuda_moe_unit *mu = xmalloc(sizeof(hm_cuda_moe_unit) * (size_t)n_units);
    int64_t n_pairs = 0;
    for (int u = 0; u < n_units; u++) {
        mu[u] = (hm_cuda_moe_unit){.gate = dwt[3 * u], .up = dwt[3 * u + 1], .down = dwt[3 * u + 2],
                                   .tok_host = toks + u * n_batch, .w_host = ws + u * n_batch, .n_tok = cnt[u]};
        n_pairs += cnt[u];
    }
    float *x = xmalloc(sizeof(float) * (size_t)(n_batch * n_embd));
    fill(x, n_batch * n_embd, 1.0f);
    /* the CPU reference */
    float *ref = calloc((size_t)(n_batch * n_embd), sizeof(float)), *h = xmalloc(sizeof(float) * (size_t)n_ff);
    qacts a = quant_acts(x, n_batch, n_embd);
    for (int u = 0; u < n_units; u++)
        for (int32_t q = 0; q < cnt[u]; q++) {
            const int64_t t = toks[u * n_batch + q];
            for (int64_t r = 0; r < n_ff; r++)
                h[r] = silu_h(cpu_dot(gt, gw[3 * u] + (size_t)r * rg, &a, t)) * cpu_dot(gt, gw[3 * u + 1] + (size_t)r * rg, &a, t);
            qacts ha = quant_acts(h, 1, n_ff);
            for (int64_t r = 0; r < n_embd; r++) ref[t * n_embd + r] += ws[u * n_batch + q] * cpu_dot(dt, gw[3 * u + 2] + (size_t)r * rd, &ha, 0);
            free_acts(&ha);
        }
    float *dx = dev_from(x, sizeof(float) * (size_t)(n_batch * n_embd)), *dout;
    const size_t ob = sizeof(float) * (size_t)(n_batch * n_embd), ss = hm_cuda_moe_scratch_size(n_batch, n_pairs, n_units, n_ff);
    void *scr;
    CK(hm_cuda_alloc(ctx, ss, &scr, &err));
    CK(hm_cuda_alloc(ctx, ob, (void **)&dout, &err));
    float *out[3];
    for (int i = 0; i < 3; i++) { /* mmq, mmq again, the switch off */
        out[i] = xmalloc(ob);
        CK(hm_cuda_set_mmq(ctx, i < 2, &err));
        CK(hm_cuda_memset(ctx, dout, 0, ob, &err));
        CK(hm_cuda_moe_act(ctx, mu, n_units, gt, dt, HM_CUDA_ACT_SILU, dx, n_batch, n_embd, n_ff, dout, scr, ss, &err));
        CK(hm_cuda_download(ctx, out[i], dout, ob, &err));
    }
    const double e_cpu = nmse(out[0], ref, n_batch * n_embd), e_off = nmse(out[0], out[2], n_batch * n_embd),
                 e_old = nmse(out[2], ref, n_batch * n_embd);
    CHECKF(!memcmp(out[0], out[1], ob), "mmq moe: two runs differ (not deterministic)");
    /* down_tiles false: the down type has no int8 tiles, so down runs on the bf16 path with the
     * switch on as off; the CPU comparison is then that path's (no worse than all of it off) */
    const bool ok_cpu = down_tiles ? e_cpu <= 1e-5 : e_cpu <= e_old && e_cpu <= 1e-3;
    CHECKF(ok_cpu && e_off <= 1e-3, "mmq moe %s/%s n_batch %lld: NMSE vs CPU %.3g (switch off %.3g), vs the "
           "switch-off path %.3g", hm_type_name(gt), hm_type_name(dt), (long long)n_batch, e_cpu, e_old, e_off);
    printf("mmq moe %-6s/%-6s n_batch %4lld, %d units, %lld pairs: NMSE vs CPU %.2e (switch off: %.2e), vs switch off "
           "%.2e\n", hm_type_name(gt), hm_type_name(dt), (long long)n_batch, n_units, (long long)n_pairs, e_cpu, e_old, e_off);
    CK(hm_cuda_set_mmq(ctx, false, &err));
    for (int i = 0; i < 3; i++) free(out[i]);
    for (int i = 0; i < 3 * n_units; i++) hm_cuda_free(ctx, dwt[i]), free(gw[i]);
    hm_cuda_free(ctx, dx), hm_cuda_free(ctx, dout), hm_cuda_free(ctx, scr);
    free_acts(&a);
    free(gw), free(dwt), free(toks), free(ws), free(cnt), free(mu), free(x), free(ref), free(h);
}

static void bench(int type) {
    const int64_t ne0 = 4096, ne1 = 4096, n_tok = 512;
    size_t rs;
    uint8_t *w = make_w(type, ne0, ne1, &rs);
    float *x = xmalloc(sizeof(float) * (size_t)(n_tok * ne0));
    fill(x, n_tok * ne0, 1.0f);
    void *dw = dev_from(w, rs * (size_t)ne1);
    float *dx = dev_from(x, sizeof(float) * (size_t)(n_tok * ne0)), *dy;
    CK(hm_cuda_alloc(ctx, sizeof(float) * (size_t)(n_tok * ne1), (void **)&dy, &err));
    const hm_cuda_mat m = {dw, type, ne0, ne1, rs};
    double t[2];
    for (int k = 0; k < 2; k++) {
        CK(hm_cuda_set_mmq(ctx, k == 1, &err));
        const int iters = 50;
        double t0 = 0;
        for (int it = -5; it < iters; it++) {
            if (it == 0) {
                CK(hm_cuda_sync(ctx, &err));
                t0 = now_s();
            }
            CK(hm_cuda_matmul(ctx, &m, dx, n_tok, dy, &err));
        }
        CK(hm_cuda_sync(ctx, &err));
        t[k] = (now_s() - t0) / iters;
    }
    const double gb = (double)rs * (double)ne1 * 1e-9, tf = 2.0 * (double)ne0 * (double)ne1 * (double)n_tok * 1e-12;
    printf("prefill matmul %s 4096 x 4096, n_tok 512: bf16 wmma %.1f us (%.0f GB/s, %.1f TFLOP/s) -> int8 mmq %.1f us "
           "(%.0f GB/s, %.1f TFLOP/s), x%.2f\n", hm_type_name(type), t[0] * 1e6, gb / t[0], tf / t[0], t[1] * 1e6,
           gb / t[1], tf / t[1], t[0] / t[1]);
    CK(hm_cuda_set_mmq(ctx, false, &err));
    hm_cuda_free(ctx, dw), hm_cuda_free(ctx, dx), hm_cuda_free(ctx, dy);
    free(w), free(x);
}

int main(void) {
    host_checks();
    const int rc = cuda_test_open("the host checks of the mmq staging and block sums passed");
    if (rc >= 0) return rc;
    for (int ti = 0; ti < N_TYPES; ti++) {
        gpu_case(types[ti], 2048, 1000, 9);
        gpu_case(types[ti], 2048, 1000, 64);
        gpu_case(types[ti], 4096, 333, 512);
    }
    gpu_case(HM_TYPE_Q4_K, 4096, 4096, 512);
    gpu_case(HM_TYPE_Q6_K, 4096, 4096, 512);
    gpu_case(HM_TYPE_Q4_K, 16384, 70, 1000); /* 1000 tokens of 16384: two workspace chunks */
    gpu_untouched();
    gpu_moe_case(HM_TYPE_Q4_K, HM_TYPE_Q6_K, 100, 12, 4, 1024, 512, true);  /* unit 0: 100 pairs, 2 tiles */
    gpu_moe_case(HM_TYPE_Q4_K, HM_TYPE_Q4_K, 40, 5, 3, 2048, 768, true);
    gpu_moe_case(HM_TYPE_Q5_K, HM_TYPE_IQ4_XS, 600, 16, 8, 1024, 512, true); /* 4800 pairs: two chunks */
    /* the low-bit types; Q2_K has no tiles, so (IQ2_XXS, Q2_K) runs gate / up in int8 tiles and
     * down on the other path in one call */
    gpu_moe_case(HM_TYPE_IQ2_XXS, HM_TYPE_Q2_K, 100, 12, 4, 1024, 512, false);
    gpu_moe_case(HM_TYPE_Q3_K, HM_TYPE_IQ3_XXS, 40, 5, 3, 2048, 768, true);
    gpu_moe_case(HM_TYPE_IQ1_S, HM_TYPE_IQ2_XS, 100, 12, 4, 1024, 512, true);
    gpu_moe_case(HM_TYPE_IQ1_M, HM_TYPE_IQ3_S, 100, 12, 4, 1024, 512, true);
    gpu_moe_case(HM_TYPE_IQ2_S, HM_TYPE_Q3_K, 100, 12, 4, 1024, 512, true);
    for (int ti = 0; ti < N_TYPES; ti++) bench(types[ti]);
    hm_cuda_close(ctx);
    return test_done();
}
