/* test_gemma4_gpu.c - the gemma4 forward pass on the GPU (dense part, ring KV and hot experts on
 * the device, cold experts on the CPU at the same time) against the CPU engine, and the Gemma
 * CUDA ops (cuda_gemma.h, the GELU grouped MoE kernels) against double-precision scalar
 * references written here.
 *
 * Kernels (random inputs, one CHECK per op): hm_cuda_gemma_attention over a ring cache with a
 * window and without one, head dims 32 and 512, one query (the range split over blocks) and a
 * batch of queries (no split); hm_cuda_rope_neox_ff with frequency factors (some 1e30: pairs left
 * unrotated); hm_cuda_gelu_mul; hm_cuda_softcap; hm_cuda_scale_by_id; hm_cuda_moe_act and
 * hm_cuda_moe_dev_act with the GELU gate on F32 units. Bounds: max error 1e-5 relative to the
 * largest reference value (f32 math against double); attention (reading the same f16 cache values
 * as the reference, |v| <= 1) max absolute error 1e-4 (ATTN_ABS).
 *
 * Models, each run by the CPU engine (verified against transformers by test_gemma4_hf) and by
 * the GPU, logits compared step by step with gpu_compare.h's rule (NMSE bound + the same argmax
 * unless a near-tie):
 *   (a) the tiny HF fixture (tests/fixtures/hf_ref/gemma4: head dims 32 sliding / 64 global,
 *       window 16, K = V on the global layer, n_embd 64: the experts run in VRAM slots beside
 *       the device's dense part, as on a real model); the fixture's 80 tokens as 64 of
 *       prompt and 16 decode steps, twice: n_ubatch 64+ (one prefill batch: the prefill path,
 *       its matmuls on the exact-f32 reference path HOTMOE_CUDA_EXACT=1 because the fixture's
 *       random routing flips under bf16 rounding: NMSE up to 0.15 measured) and n_ubatch 8
 *       (micro-batches of 8: the decode matvec path, the sliding layers' ring of 24 rows wraps). The n_ubatch 8 run is also held to transformers' logits with the
 *       CPU's own f16-KV bound (test_gemma4_hf: max |d| < 5e-2).
 *   (b) synth gemma4-tiny (3 layers: 2 sliding with head dim 64 + 1 global with 128, window 16,
 *       n_embd 256, 16 experts k 4, n_ff_exp 256: units fit VRAM slots), F32 and Q4_K_M: a
 *       40-token prompt (> the window) and 16 decode steps, once with n_ubatch 64 (prefill path)
 *       and once with n_ubatch 8 (decode path, ring wrap); placements -ngl 99 (every unit HOT),
 *       --vram-budget ~30 % of the units with lru (hot and cold units in one layer, units moving)
 *       and --cpu-moe (no slots). Store stats: per layer hits + misses = rows x k; -ngl no
 *       misses, --cpu-moe no hits, lru both and swaps.
 * Bounds. Exact path (<= 8 rows, F32 weights): summation order, expf/tanhf ulps and a rare f16 KV
 * rounding flip differ; Gemma's attention has scale 1 over unit-RMS q/k heads, so scores are
 * ~sqrt(hd) and a flip moves them 10x more than with 1/sqrt(d): NMSE_EXACT = 1e-6 (still ~1e4
 * above the f32 estimate). Prefill (bf16 weights and activations, 2^-9 relative): the synth's
 * embedding dominates its residual (synth_gemma4.c: 32x a block), NMSE_BF16 = 1e-4 as qwen3moe's
 * (the HF fixture's random blocks do not dilute it: routing flips, hence its exact path). Q4_K_M: the CPU
 * quantises activations to Q8 (0.6 % rms) while the GPU keeps f32: NMSE_Q8 = 3e-4 for both runs.
 * -ctk q8_0: the f32 synth's two runs with a q8_0 KV cache on the GPU against the CPU's q8_0 cache
 * (run_synth_q8_0 says the bound).
 * Exits 77 ("skipped: no GPU") without a CUDA device. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cuda/cuda_gemma.h"
#include "core/fp16.h"
#include "fixture.h"
#include "gpu_compare.h"
#include "hotmoe.h"
#include "quant/quant.h"
#include "test.h"
/* last: its file-scope `err` would shadow the parameters of the helpers above */
#include "cuda_test.h"

#define NMSE_EXACT 1e-6
#define NMSE_BF16 1e-4
#define NMSE_Q8 3e-4
#define KERN_REL 1e-5
#define ATTN_ABS 1e-4 /* f32 scores of hd terms (|q|, |k| <= 1) err ~sqrt(hd) 2^-24 |s| ~1e-5, times |v| <= 1 */

/* ==== kernels against double references ==================================================== */

static float frand(uint64_t *s) { return (float)((double)(xorshift64(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0); }

static void *dev_copy(const void *h, size_t n) {
    void *d = NULL;
    CK(hm_cuda_alloc(ctx, n, &d, &err));
    CK(hm_cuda_upload(ctx, d, h, n, &err));
    return d;
}

static void dev_get(void *h, const void *d, size_t n) { CK(hm_cuda_download(ctx, h, d, n, &err)); }

static double abs_err(const float *g, const double *r, size_t n) {
    double md = 0;
    for (size_t i = 0; i < n; i++) md = fmax(md, fabs((double)g[i] - r[i]));
    return md;
}

/* max |g - r| / max |r| */
static double rel_err(const float *g, const double *r, size_t n) {
    double md = 0, mr = 1e-30;
    for (size_t i = 0; i < n; i++) {
        md = fmax(md, fabs((double)g[i] - r[i]));
        mr = fmax(mr, fabs(r[i]));
    }
    return md / mr;
}

/* One attention case: n_tok queries at positions pos0.., a ring of cap rows holding positions
 * 0..pos0+n_tok-1 (the latest cap of them), window W (0 = all). */
static void check_attention(int hd, int n_head, int n_kv, int64_t cap, int32_t W, int64_t pos0, int64_t n_tok,
                            uint64_t seed) {
    const size_t nq = (size_t)n_tok * (size_t)n_head * (size_t)hd, nc = (size_t)n_kv * (size_t)cap * (size_t)hd;
    float *q = xmalloc(nq * 4), *o = xmalloc(nq * 4);
    uint16_t *kc = xmalloc(nc * 2), *vc = xmalloc(nc * 2);
    double *ref = xmalloc(nq * 8), *sc = xmalloc((size_t)(pos0 + n_tok) * 8);
    int32_t *pos = xmalloc((size_t)n_tok * 4);
    for (size_t i = 0; i < nq; i++) q[i] = frand(&seed);
    for (size_t i = 0; i < nc; i++) {
        kc[i] = hm_f32_to_fp16(frand(&seed));
        vc[i] = hm_f32_to_fp16(frand(&seed));
    }
    for (int64_t t = 0; t < n_tok; t++) pos[t] = (int32_t)(pos0 + t);
    for (int64_t t = 0; t < n_tok; t++)
        for (int h = 0; h < n_head; h++) {
            const int g = h / (n_head / n_kv);
            const int64_t p1 = pos[t];
            int64_t p0 = W > 0 ? p1 - W + 1 : 0;
            if (p0 < 0) p0 = 0;
            const float *qv = q + ((size_t)t * (size_t)n_head + (size_t)h) * (size_t)hd;
            double mx = -INFINITY, sum = 0;
            for (int64_t s = p0; s <= p1; s++) {
                const uint16_t *kr = kc + ((size_t)g * (size_t)cap + (size_t)(s % cap)) * (size_t)hd;
                double a = 0;
                for (int j = 0; j < hd; j++) a += (double)qv[j] * (double)hm_fp16_to_f32(kr[j]);
                sc[s] = a;
                mx = fmax(mx, a);
            }
            double *r = ref + ((size_t)t * (size_t)n_head + (size_t)h) * (size_t)hd;
            for (int j = 0; j < hd; j++) r[j] = 0;
            for (int64_t s = p0; s <= p1; s++) {
                const double e = exp(sc[s] - mx);
                sum += e;
                const uint16_t *vr = vc + ((size_t)g * (size_t)cap + (size_t)(s % cap)) * (size_t)hd;
                for (int j = 0; j < hd; j++) r[j] += e * (double)hm_fp16_to_f32(vr[j]);
            }
            for (int j = 0; j < hd; j++) r[j] /= sum;
        }
    float *qd = dev_copy(q, nq * 4), *od = NULL;
    uint16_t *kd = dev_copy(kc, nc * 2), *vd = dev_copy(vc, nc * 2);
    int32_t *pd = dev_copy(pos, (size_t)n_tok * 4);
    const size_t scr = hm_cuda_gemma_attention_scratch_size(ctx, hd);
    void *sd = NULL;
    CK(hm_cuda_alloc(ctx, nq * 4, (void **)&od, &err));
    CK(hm_cuda_alloc(ctx, scr, &sd, &err));
    CK(hm_cuda_gemma_attention(ctx, qd, n_tok, pd, pos0 + n_tok, kd, vd, cap, W, n_head, n_kv, hd, 1.0f, od, sd, scr,
                               &err));
    dev_get(o, od, nq * 4);
    const double e = abs_err(o, ref, nq);
    printf("attention hd %d, %d/%d heads, cap %lld, window %d, %lld queries at %lld: max abs err %.3g\n", hd, n_head,
           n_kv, (long long)cap, W, (long long)n_tok, (long long)pos0, e);
    CHECKF(e <= ATTN_ABS, "attention hd %d window %d n_tok %lld: max abs err %.3g", hd, W, (long long)n_tok, e);
    hm_cuda_free(ctx, qd);
    hm_cuda_free(ctx, od);
    hm_cuda_free(ctx, kd);
    hm_cuda_free(ctx, vd);
    hm_cuda_free(ctx, pd);
    hm_cuda_free(ctx, sd);
    free(q);
    free(o);
    free(kc);
    free(vc);
    free(ref);
    free(sc);
    free(pos);
}

static void check_rope(void) {
    const int n_tok = 5, n_head = 3, hd = 64, n_rot = 64, half = n_rot / 2;
    const size_t n = (size_t)n_tok * n_head * hd;
    uint64_t seed = 77;
    float *x = xmalloc(n * 4), ff[32];
    double *r = xmalloc(n * 8);
    int32_t pos[5] = {0, 1, 17, 300, 4095};
    for (size_t i = 0; i < n; i++) x[i] = frand(&seed);
    for (int i = 0; i < half; i++) ff[i] = i < 8 ? 1.0f + 0.1f * (float)i : 1e30f; /* proportional: upper pairs fixed */
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < n_head; h++) {
            const float *v = x + ((size_t)t * n_head + h) * hd;
            double *o = r + ((size_t)t * n_head + h) * hd;
            for (int i = 0; i < hd; i++) o[i] = v[i];
            for (int i = 0; i < half; i++) {
                const double a = (double)pos[t] * pow(1e6, -2.0 * i / n_rot) / (double)ff[i];
                o[i] = v[i] * cos(a) - v[i + half] * sin(a);
                o[i + half] = v[i] * sin(a) + v[i + half] * cos(a);
            }
        }
    float *xd = dev_copy(x, n * 4), *fd = dev_copy(ff, sizeof ff);
    int32_t *pd = dev_copy(pos, sizeof pos);
    CK(hm_cuda_rope_neox_ff(ctx, xd, n_tok, n_head, hd, n_rot, pd, 1e6f, fd, &err));
    dev_get(x, xd, n * 4);
    const double e = rel_err(x, r, n);
    printf("rope_neox_ff: rel err %.3g\n", e);
    CHECKF(e <= KERN_REL, "rope_neox_ff: rel err %.3g", e);
    hm_cuda_free(ctx, xd);
    hm_cuda_free(ctx, fd);
    hm_cuda_free(ctx, pd);
    free(x);
    free(r);
}

static double gelu_d(double x) { return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

static void check_elementwise(void) {
    const size_t n = 10000;
    uint64_t seed = 5;
    float *g = xmalloc(n * 4), *u = xmalloc(n * 4), *o = xmalloc(n * 4), tab[16];
    double *r = xmalloc(n * 8);
    int32_t ids[64];
    for (size_t i = 0; i < n; i++) {
        g[i] = 6 * frand(&seed);
        u[i] = frand(&seed);
        r[i] = gelu_d(g[i]) * u[i];
    }
    float *gd = dev_copy(g, n * 4), *ud = dev_copy(u, n * 4);
    CK(hm_cuda_gelu_mul(ctx, gd, ud, gd, (int64_t)n, &err));
    dev_get(o, gd, n * 4);
    double e = rel_err(o, r, n);
    printf("gelu_mul: rel err %.3g\n", e);
    CHECKF(e <= KERN_REL, "gelu_mul: rel err %.3g", e);
    for (size_t i = 0; i < n; i++) {
        g[i] = 100 * frand(&seed);
        r[i] = 30.0 * tanh(g[i] / 30.0);
    }
    CK(hm_cuda_upload(ctx, gd, g, n * 4, &err));
    CK(hm_cuda_softcap(ctx, gd, (int64_t)n, 30.0f, &err));
    dev_get(o, gd, n * 4);
    e = rel_err(o, r, n);
    printf("softcap: rel err %.3g\n", e);
    CHECKF(e <= KERN_REL, "softcap: rel err %.3g", e);
    for (int i = 0; i < 16; i++) tab[i] = 1.0f + 0.05f * frand(&seed);
    for (int i = 0; i < 64; i++) {
        ids[i] = (int32_t)(xorshift64(&seed) % 16);
        g[i] = frand(&seed);
        r[i] = (double)g[i] * (double)tab[ids[i]];
    }
    float *td = dev_copy(tab, sizeof tab);
    int32_t *idd = dev_copy(ids, sizeof ids);
    CK(hm_cuda_upload(ctx, gd, g, 64 * 4, &err));
    CK(hm_cuda_scale_by_id(ctx, gd, idd, td, 64, &err));
    dev_get(o, gd, 64 * 4);
    e = rel_err(o, r, 64);
    CHECKF(e <= KERN_REL, "scale_by_id: rel err %.3g", e);
    hm_cuda_free(ctx, gd);
    hm_cuda_free(ctx, ud);
    hm_cuda_free(ctx, td);
    hm_cuda_free(ctx, idd);
    free(g);
    free(u);
    free(o);
    free(r);
}

/* The GELU grouped kernels on F32 units: 2 tokens, k 2 of 3 experts (expert 2 COLD in the device
 * routed variant: its pairs are skipped there and left out of its reference). */
static void check_moe_gelu(void) {
    enum { E = 256, F = 256, NX = 3, T = 2, K = 2 };
    uint64_t seed = 99;
    const size_t mw = (size_t)E * F;
    float *w = xmalloc(3 * NX * mw * 4), *x = xmalloc(T * E * 4), *o = xmalloc(T * E * 4);
    double *r = xmalloc(T * E * 8), *r_hot = xmalloc(T * E * 8), hbuf[F];
    for (size_t i = 0; i < 3 * NX * mw; i++) w[i] = 0.06f * frand(&seed);
    for (int i = 0; i < T * E; i++) x[i] = frand(&seed);
    const int32_t ids[T * K] = {0, 2, 1, 0};
    const float wt[T * K] = {0.7f, 0.3f, 0.6f, 0.4f};
    /* unit e: gate at w + (3e) mw, up (3e+1) mw ([F][E]), down (3e+2) mw ([E][F]) */
    for (int t = 0; t < T; t++)
        for (int i = 0; i < E; i++) r[t * E + i] = r_hot[t * E + i] = 0;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) {
            const int e = ids[t * K + j];
            const float *gw = w + (size_t)(3 * e) * mw, *uw = gw + mw, *dw = uw + mw;
            for (int f = 0; f < F; f++) {
                double gs = 0, us = 0;
                for (int c = 0; c < E; c++) {
                    gs += (double)gw[(size_t)f * E + c] * x[t * E + c];
                    us += (double)uw[(size_t)f * E + c] * x[t * E + c];
                }
                hbuf[f] = gelu_d(gs) * us;
            }
            for (int i = 0; i < E; i++) {
                double a = 0;
                for (int f = 0; f < F; f++) a += (double)dw[(size_t)i * F + f] * hbuf[f];
                r[t * E + i] += wt[t * K + j] * a;
                if (e != 2) r_hot[t * E + i] += wt[t * K + j] * a;
            }
        }
    float *wd = dev_copy(w, 3 * NX * mw * 4), *xd = dev_copy(x, T * E * 4), *od = NULL;
    CK(hm_cuda_alloc(ctx, T * E * 4, (void **)&od, &err));
    /* host-routed: units 0, 1, 2 with their (token, weight) lists */
    const int32_t tok0[2] = {0, 1}, tok1[1] = {1}, tok2[1] = {0};
    const float w0[2] = {0.7f, 0.4f}, w1[1] = {0.6f}, w2[1] = {0.3f};
    hm_cuda_moe_unit units[NX];
    const int32_t *toks[NX] = {tok0, tok1, tok2};
    const float *wts[NX] = {w0, w1, w2};
    const int32_t nts[NX] = {2, 1, 1};
    for (int e = 0; e < NX; e++)
        units[e] = (hm_cuda_moe_unit){.gate = wd + (size_t)(3 * e) * mw, .up = wd + (size_t)(3 * e + 1) * mw,
                                      .down = wd + (size_t)(3 * e + 2) * mw, .tok_host = toks[e], .w_host = wts[e],
                                      .n_tok = nts[e]};
    const size_t scr = hm_cuda_moe_scratch_size(T, T * K, NX, F);
    void *sd = NULL;
    CK(hm_cuda_alloc(ctx, scr, &sd, &err));
    CK(hm_cuda_memset(ctx, od, 0, T * E * 4, &err));
    CK(hm_cuda_moe_act(ctx, units, NX, HM_TYPE_F32, HM_TYPE_F32, HM_CUDA_ACT_GELU, xd, T, E, F, od, sd, scr, &err));
    dev_get(o, od, T * E * 4);
    double e = rel_err(o, r, T * E);
    printf("moe GELU (host-routed): rel err %.3g\n", e);
    CHECKF(e <= KERN_REL, "moe GELU: rel err %.3g", e);
    /* device-routed, expert 2 cold */
    hm_cuda_moe_slot slots[NX];
    for (int x2 = 0; x2 < NX; x2++)
        slots[x2] = x2 == 2 ? (hm_cuda_moe_slot){.gate = NULL}
                            : (hm_cuda_moe_slot){.gate = units[x2].gate, .up = units[x2].up, .down = units[x2].down};
    hm_cuda_moe_slot *sld = dev_copy(slots, sizeof slots);
    int32_t *idd = dev_copy(ids, sizeof ids);
    float *wtd = dev_copy(wt, sizeof wt);
    void *sd2 = NULL;
    const size_t scr2 = hm_cuda_moe_dev_scratch_size(T, K, F);
    CK(hm_cuda_alloc(ctx, scr2, &sd2, &err));
    CK(hm_cuda_memset(ctx, od, 0, T * E * 4, &err));
    CK(hm_cuda_moe_dev_act(ctx, sld, HM_TYPE_F32, HM_TYPE_F32, HM_CUDA_ACT_GELU, idd, wtd, K, xd, T, E, F, od, sd2,
                           scr2, &err));
    dev_get(o, od, T * E * 4);
    e = rel_err(o, r_hot, T * E);
    printf("moe GELU (device-routed, one cold expert): rel err %.3g\n", e);
    CHECKF(e <= KERN_REL, "moe_dev GELU: rel err %.3g", e);
    hm_cuda_free(ctx, wd);
    hm_cuda_free(ctx, xd);
    hm_cuda_free(ctx, od);
    hm_cuda_free(ctx, sd);
    hm_cuda_free(ctx, sd2);
    hm_cuda_free(ctx, sld);
    hm_cuda_free(ctx, idd);
    hm_cuda_free(ctx, wtd);
    free(w);
    free(x);
    free(o);
    free(r);
    free(r_hot);
}

static void check_kernels(void) {
    /* one query (the range split over blocks) and a batch (no split); ring and full caches. These
     * check the exact kernel (ATTN_ABS); the flash kernel long batches get has its own test
     * (test_cuda_flash_gpu.c), so it is off here. */
    hm_cuda_set_flash(ctx, false);
    check_attention(32, 4, 2, 24, 16, 70, 1, 1);
    check_attention(32, 4, 2, 24, 16, 60, 8, 2);
    check_attention(512, 4, 1, 300, 0, 299, 1, 3);
    check_attention(512, 4, 1, 300, 0, 240, 60, 4);
    check_attention(256, 8, 2, 1040, 1024, 3000, 1, 5);
    check_attention(128, 2, 1, 4096, 0, 4000, 1, 6);
    hm_cuda_set_flash(ctx, true);
    check_rope();
    check_elementwise();
    check_moe_gelu();
}

/* ==== models: GPU against the CPU engine ======================================================= */

typedef struct seqdef {
    int32_t np, ndec, n_ubatch, n_ctx;
} seqdef;

/* One run of d (its n_ctx, n_ubatch, np and ndec) on a fresh session. */
static hm_status run_seq(hm_model *m, const seqdef *d, int32_t *toks, bool greedy, float *out, int32_t V,
                         hm_err *e) {
    return gpu_compare_run_fresh(m, d->n_ctx, d->n_ubatch, toks, d->np, d->ndec, greedy, out, V, e);
}

static hm_model *open_gpu(const char *path, const hm_placement_opts *po, hm_err *e) {
    hm_model_opts mo;
    memset(&mo, 0, sizeof mo);
    mo.placement = po;
    hm_model *m = NULL;
    return hm_model_open(&m, path, &mo, e) == HM_OK ? m : NULL;
}

/* (a) the HF fixture: experts on the CPU (n_embd 64), dense part on the device */
static void run_fixture(void) {
    fixture fx;
    static int32_t tok[256];
    if (!fixture_open(&fx, "tests/fixtures/hf_ref/gemma4/", tok, 256) || fx.n < 80) {
        fprintf(stderr, "gemma4 fixture not present: its part skipped\n");
        return;
    }
    hm_err e = {{0}};
    hm_model *m = NULL;
    CHECKF(hm_model_open(&m, fx.gguf, NULL, &e) == HM_OK, "fixture on the CPU: %s", e.msg);
    if (!m) return;
    const int32_t V = hm_model_n_vocab(m);
    size_t got = 0;
    float *want = fixture_read_logits(&fx, V, &got);
    const seqdef defs[2] = {{64, 16, 0, 80}, {64, 16, 8, 80}};
    const int NS = 17;
    float *cpu[2], *gpu = xmalloc((size_t)NS * V * 4);
    for (int i = 0; i < 2; i++) {
        cpu[i] = xmalloc((size_t)NS * V * 4);
        int32_t t[80];
        memcpy(t, tok, sizeof t);
        CHECKF(run_seq(m, &defs[i], t, false, cpu[i], V, &e) == HM_OK, "fixture CPU run %d: %s", i, e.msg);
    }
    hm_model_close(m);
    hm_placement_opts po;
    hm_placement_opts_default(&po);
    po.n_gpu_layers = 99;
    po.n_ctx = 80;
    /* the fixture's random weights route on near-ties that bf16 prefill rounding flips (NMSE up to
     * 0.15 seen): its prefill matmuls take the exact-f32 reference path (HOTMOE_CUDA_EXACT=1, read
     * when the device opens) and both runs are held to the exact bound; bf16 prefill is checked on
     * the synth model (b) */
    setenv("HOTMOE_CUDA_EXACT", "1", 1);
    m = open_gpu(fx.gguf, &po, &e);
    unsetenv("HOTMOE_CUDA_EXACT");
    CHECKF(m != NULL, "fixture on the GPU: %s", e.msg);
    for (int i = 0; m && i < 2; i++) {
        int32_t t[80];
        memcpy(t, tok, sizeof t);
        char what[96];
        snprintf(what, sizeof what, "fixture n_ubatch %d", defs[i].n_ubatch);
        hm_status st = run_seq(m, &defs[i], t, false, gpu, V, &e);
        CHECKF(st == HM_OK, "%s: %s", what, e.msg);
        if (st != HM_OK) continue;
        const double w = gpu_compare_logits(what, gpu, cpu[i], NS, V, NMSE_EXACT);
        double dt = -1;
        if (i == 1 && got == (size_t)fx.n * (size_t)V) { /* transformers' rows 63..79 */
            dt = fixture_maxdiff(gpu, want + (size_t)63 * V, (size_t)NS * V);
            CHECKF(dt < 5e-2, "%s vs transformers: max |d| %.3g", what, dt);
        }
        fprintf(stderr, "%s: worst NMSE vs CPU %.3g; max |d| vs transformers %.3g\n", what, w, dt);
    }
    if (m) {
        hm_usage u;
        if (hm_model_usage(m, &u, &e) == HM_OK) {
            /* n_embd 64: a multiple of 32 and of the experts' blocks, so its units run in VRAM slots */
            CHECKF(u.vram_slots > 0, "fixture: %lld VRAM slots (n_embd 64 can use them)", (long long)u.vram_slots);
            hm_usage_free(&u);
        }
    }
    hm_model_close(m);
    free(gpu);
    free(cpu[0]);
    free(cpu[1]);
    free(want);
    fixture_close(&fx);
}

/* (b) synth gemma4-tiny */
#define SP 40
#define SDEC 16
#define SSTEP (1 + SDEC)

typedef enum place { P_ALL, P_LRU, P_CPU_MOE } place;
static const char *place_name[] = {"-ngl 99 (all experts HOT)", "--vram-budget 30% lru", "--cpu-moe"};

static void run_synth(const char *type, bool quant) {
    char path[] = "/tmp/hm_g4gpu_XXXXXX", label[40];
    if (!gpu_compare_synth(path, "gemma4", "gemma4-tiny", type, 21)) return;
    snprintf(label, sizeof label, "gemma4-tiny %s", type);
    hm_err e = {{0}};
    int32_t V = 0, n_layer = 0, K = 0;
    uint64_t unit_bytes = 0, n_units = 0;
    hm_model *m = gpu_compare_open_cpu(path, label, &V, &n_layer, &K, &unit_bytes, &n_units, &e);
    if (!m) {
        unlink(path);
        return;
    }
    hm_status st;
    const seqdef defs[2] = {{SP, SDEC, 64, 64}, {SP, SDEC, 8, 64}};
    int32_t toks[SP + SDEC], dummy[1];
    gpu_compare_prompts(0x9e3779b97f4a7c15ull, V, toks, SP, dummy, 0);
    float *cpu[2], *gpu = xmalloc((size_t)SSTEP * V * 4);
    for (int i = 0; i < 2; i++) {
        cpu[i] = xmalloc((size_t)SSTEP * V * 4);
        CHECKF(run_seq(m, &defs[i], toks, i == 0, cpu[i], V, &e) == HM_OK, "%s CPU run %d: %s", type, i, e.msg);
    }
    hm_model_close(m);

    for (int p = P_ALL; p <= P_CPU_MOE && !test_failures_; p++) {
        hm_placement_opts po;
        hm_placement_opts_default(&po);
        po.n_gpu_layers = 99;
        po.n_ctx = 64;
        if (p == P_LRU) {
            po.vram_budget = (int64_t)((n_units * 3 + 9) / 10) * (int64_t)(unit_bytes + 3 * 256);
            po.policy = "lru";
        }
        if (p == P_CPU_MOE) po.cpu_moe = true;
        m = open_gpu(path, &po, &e);
        CHECKF(m != NULL, "%s %s: open: %s", type, place_name[p], e.msg);
        if (!m) continue;
        double worst[2] = {-1, -1};
        for (int i = 0; i < 2; i++) {
            int32_t t[SP + SDEC];
            memcpy(t, toks, sizeof t);
            char what[160];
            snprintf(what, sizeof what, "gemma4-tiny %s %s n_ubatch %d", type, place_name[p], defs[i].n_ubatch);
            st = run_seq(m, &defs[i], t, false, gpu, V, &e);
            CHECKF(st == HM_OK, "%s: %s", what, e.msg);
            if (st == HM_OK)
                worst[i] = gpu_compare_logits(what, gpu, cpu[i], SSTEP, V,
                                              quant ? NMSE_Q8 : (i == 0 ? NMSE_BF16 : NMSE_EXACT));
        }
        hm_usage u;
        memset(&u, 0, sizeof u);
        st = hm_model_usage(m, &u, &e);
        CHECKF(st == HM_OK, "usage: %s", e.msg);
        uint64_t hits = 0, misses = 0;
        for (int32_t l = 0; st == HM_OK && l < n_layer; l++) {
            /* both runs: every row in every layer but the last, which computes the wanted rows only */
            const uint64_t rows = l + 1 < n_layer ? 2u * (SP + SDEC) : 2u * SSTEP;
            const uint64_t h = u.layer_hits[l], mi = u.layer_misses[l];
            hits += h;
            misses += mi;
            CHECKF(h + mi == rows * (uint64_t)K, "%s %s layer %d: %llu hits + %llu misses, want %llu x %d", type,
                   place_name[p], l, (unsigned long long)h, (unsigned long long)mi, (unsigned long long)rows, K);
            if (p == P_ALL) CHECKF(mi == 0, "%s -ngl layer %d: %llu misses", type, l, (unsigned long long)mi);
            if (p == P_CPU_MOE) CHECKF(h == 0, "%s --cpu-moe layer %d: %llu hits", type, l, (unsigned long long)h);
        }
        if (st == HM_OK) {
            if (p == P_LRU)
                CHECKF(hits > 0 && misses > 0 && u.swaps_in > 0, "%s lru: %llu hits, %llu misses, %llu swaps in",
                       type, (unsigned long long)hits, (unsigned long long)misses, (unsigned long long)u.swaps_in);
            CHECKF(p == P_CPU_MOE ? u.vram_slots == 0 : u.vram_slots > 0, "%s %s: %lld VRAM slots", type,
                   place_name[p], (long long)u.vram_slots);
            fprintf(stderr, "gemma4-tiny %s %-28s NMSE prefill %.3g, decode %.3g; %lld slots, %llu hits, %llu misses, "
                    "%llu swaps in\n", type, place_name[p], worst[0], worst[1], (long long)u.vram_slots,
                    (unsigned long long)hits, (unsigned long long)misses, (unsigned long long)u.swaps_in);
        }
        hm_usage_free(&u);
        if ((p == P_ALL || p == P_CPU_MOE) && worst[1] >= 0) {
            /* decode steps run as one CUDA graph (moe.h, hm_moe_graph); the per-launch path
             * (HOTMOE_CUDA_GRAPH=0) runs the same kernels in the same order: the n_ubatch 8 run's
             * logits (still in gpu) must be bit-identical */
            float *g2 = malloc((size_t)SSTEP * (size_t)V * sizeof(float));
            int32_t t[SP + SDEC];
            memcpy(t, toks, sizeof t);
            setenv("HOTMOE_CUDA_GRAPH", "0", 1);
            st = g2 ? run_seq(m, &defs[1], t, false, g2, V, &e) : HM_ERR_NOMEM;
            unsetenv("HOTMOE_CUDA_GRAPH");
            CHECKF(st == HM_OK, "%s %s without graphs: %s", type, place_name[p], e.msg);
            if (st == HM_OK) {
                int64_t nd = 0;
                for (size_t i = 0; i < (size_t)SSTEP * (size_t)V; i++) nd += gpu[i] != g2[i];
                CHECKF(nd == 0, "gemma4-tiny %s %s: graph vs per-launch decode: %lld logits differ", type,
                       place_name[p], (long long)nd);
            }
            free(g2);
        }
        hm_model_close(m);
    }
    free(gpu);
    free(cpu[0]);
    free(cpu[1]);
    unlink(path);
}

/* -ctk q8_0 end to end: the two runs of run_synth (n_ubatch 64: the flash prefill over the q8_0
 * ring and global caches; n_ubatch 8: the exact kernels) with a q8_0 KV cache, all on the GPU
 * (-ngl 99), against the CPU engine's own q8_0 cache on the same tokens. A q8_0 code on a rounding
 * boundary may flip between the backends (their K/V rows come from different matmuls), moving that
 * value by one step (1/127 of its block's largest value, ~0.8 %): both runs are held to NMSE_BF16
 * (Q4_K_M: NMSE_Q8, the CPU's activation rounding dominating). */
static hm_status run_kv(hm_model *m, const seqdef *d, hm_kv_type kv, int32_t *toks, float *out, int32_t V,
                        hm_err *e) {
    hm_session_opts so;
    hm_session_opts_default(&so);
    so.n_ctx = d->n_ctx;
    so.n_ubatch = d->n_ubatch;
    so.n_threads = 4;
    so.kv_type = kv;
    hm_session *s = NULL;
    hm_status st = hm_session_open(&s, m, &so, e);
    if (st != HM_OK) return st;
    st = gpu_compare_run(s, toks, d->np, d->ndec, false, out, V, e);
    hm_session_close(s);
    return st;
}

static void run_synth_q8_0(const char *type, bool quant) {
    char path[] = "/tmp/hm_g4gpu8_XXXXXX";
    if (!gpu_compare_synth(path, "gemma4", "gemma4-tiny", type, 21)) return;
    hm_err e = {{0}};
    hm_model *mc = NULL;
    CHECKF(hm_model_open(&mc, path, NULL, &e) == HM_OK, "q8_0 %s: CPU open: %s", type, e.msg);
    hm_placement_opts po;
    hm_placement_opts_default(&po);
    po.n_gpu_layers = 99;
    po.n_ctx = 64;
    hm_model *mg = mc ? open_gpu(path, &po, &e) : NULL;
    CHECKF(!mc || mg, "q8_0 %s: GPU open: %s", type, e.msg);
    if (mc && mg) {
        const int32_t V = hm_model_n_vocab(mc);
        const seqdef defs[2] = {{SP, SDEC, 64, 64}, {SP, SDEC, 8, 64}};
        int32_t toks[SP + SDEC], dummy[1];
        gpu_compare_prompts(0x9e3779b97f4a7c15ull, V, toks, SP, dummy, 0);
        for (int i = 0; i < SDEC; i++) toks[SP + i] = toks[(7 * i) % SP]; /* fixed decode tokens */
        float *c8 = xmalloc((size_t)SSTEP * V * 4), *g8 = xmalloc((size_t)SSTEP * V * 4);
        for (int i = 0; i < 2; i++) {
            hm_status st = run_kv(mc, &defs[i], HM_KV_Q8_0, toks, c8, V, &e);
            CHECKF(st == HM_OK, "q8_0 %s CPU run %d: %s", type, i, e.msg);
            if (st == HM_OK) st = run_kv(mg, &defs[i], HM_KV_Q8_0, toks, g8, V, &e);
            CHECKF(st == HM_OK, "q8_0 %s GPU run %d: %s", type, i, e.msg);
            if (st != HM_OK) continue;
            char what[96];
            snprintf(what, sizeof what, "gemma4-tiny %s -ngl 99 -ctk q8_0 n_ubatch %d", type, defs[i].n_ubatch);
            const double w = gpu_compare_logits(what, g8, c8, SSTEP, V, quant ? NMSE_Q8 : NMSE_BF16);
            fprintf(stderr, "%s: NMSE vs the CPU's q8_0 cache %.3g\n", what, w);
        }
        free(c8);
        free(g8);
    }
    hm_model_close(mg);
    hm_model_close(mc);
    unlink(path);
}

int main(void) {
    const int rc = cuda_test_open("nothing to check without a device");
    if (rc >= 0) return rc;
    check_kernels();
    hm_cuda_close(ctx);
    ctx = NULL;
    run_fixture();
    run_synth("f32", false);
    run_synth("q4_k_m", true);
    run_synth_q8_0("f32", false);
    return test_done();
}
