/* test_gptoss_gpu.c - the gpt-oss forward pass on the GPU against the CPU engine, and gpt-oss's
 * CUDA ops (cuda_gptoss.h) against double-precision scalar references written here.
 *
 * Kernels: hm_cuda_add_bias (exact: one f32 add per element, as the CPU's); the ring attention
 * with sinks (hm_cuda_gemma_attention_kv_sinks over an f16 cache) at head dim 64, one query (the
 * range split over blocks: the merge's sinks), a batch of 8 (no split) and, with the flash path on,
 * a batch of 64 (flash prefill; window 16 and none), scale 1/8, sinks in [-3, 3], against
 * softmax(scale q.k, sink) v in double. Bounds: the exact kernels max abs error 1e-4 as
 * test_gemma4_gpu's ATTN_ABS (|v| <= 1); flash rounds q, the probabilities and v to f16, 2e-3.
 *
 * Model: synth gpt-oss-tiny (4 layers, 2 sliding with window 16 + 2 full, every feature on),
 * F32 and MXFP4, a 40-token prompt (> the window) and 16 decode steps, n_ubatch 64 (prefill path)
 * and 8 (decode path; the sliding layers' rings wrap), run by the CPU engine (held to llama.cpp by
 * tests/cli_llama_ref_gptoss.sh) and with -ngl 99 on the GPU. The CUDA expert kernels do not add
 * gpt-oss's per-expert biases yet, so its experts are computed by the CPU (hm_moe_gpu_unfit says
 * why) while attention, the biases, the sinks and the router run on the device: the test checks
 * that placement and that the store saw every routed row. Bounds as test_gemma4_gpu: exact path
 * (decode, F32) NMSE 1e-6, bf16 prefill 1e-4, MXFP4 (Q8_0 dense matrices: the CPU rounds their
 * activations to Q8_0, the GPU keeps f32) 3e-4. Decode as a CUDA graph and per launch
 * (HOTMOE_CUDA_GRAPH=0) must give the same bytes.
 * Exits 77 ("skipped: no GPU") without a CUDA device. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cuda/cuda_gemma.h"
#include "backend/cuda/cuda_gptoss.h"
#include "core/fp16.h"
#include "gpu_compare.h"
#include "hotmoe.h"
#include "test.h"
/* last: its file-scope `err` would shadow the parameters of the helpers above */
#include "cuda_test.h"

#define NMSE_EXACT 1e-6
#define NMSE_BF16 1e-4
#define NMSE_Q8 3e-4
#define ATTN_ABS 1e-4
#define FLASH_ABS 2e-3

/* ==== kernels against double references ==================================================== */

static float frand(uint64_t *s) { return (float)((double)(xorshift64(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0); }

static void *dev_copy(const void *h, size_t n) {
    void *d = NULL;
    CK(hm_cuda_alloc(ctx, n, &d, &err));
    CK(hm_cuda_upload(ctx, d, h, n, &err));
    return d;
}

static void check_add_bias(void) {
    const int64_t rows = 7, width = 300;
    uint64_t seed = 11;
    float *a = xmalloc((size_t)(rows * width) * 4), *b = xmalloc((size_t)width * 4), *o = xmalloc((size_t)(rows * width) * 4);
    for (int64_t i = 0; i < rows * width; i++) a[i] = frand(&seed);
    for (int64_t i = 0; i < width; i++) b[i] = frand(&seed);
    float *ad = dev_copy(a, (size_t)(rows * width) * 4), *bd = dev_copy(b, (size_t)width * 4);
    CK(hm_cuda_add_bias(ctx, ad, bd, rows, width, &err));
    CK(hm_cuda_download(ctx, o, ad, (size_t)(rows * width) * 4, &err));
    int64_t bad = 0;
    for (int64_t i = 0; i < rows * width; i++) bad += o[i] != a[i] + b[i % width];
    CHECKF(bad == 0, "add_bias: %lld elements differ from a + b", (long long)bad);
    hm_cuda_free(ctx, ad);
    hm_cuda_free(ctx, bd);
    free(a);
    free(b);
    free(o);
}

/* n_tok queries at positions pos0.., a ring of cap rows holding positions 0..pos0+n_tok-1 (the
 * latest cap of them), window W (0 = all), 8 q / 2 kv heads of 64, sinks. */
static void check_sinks(int64_t cap, int32_t W, int64_t pos0, int64_t n_tok, bool flash, uint64_t seed) {
    const int hd = 64, n_head = 8, n_kv = 2;
    const float scale = 0.125f;
    const size_t nq = (size_t)n_tok * n_head * hd, nc = (size_t)n_kv * (size_t)cap * hd;
    float *q = xmalloc(nq * 4), *o = xmalloc(nq * 4), sinks[8];
    uint16_t *kc = xmalloc(nc * 2), *vc = xmalloc(nc * 2);
    double *ref = xmalloc(nq * 8), *sc = xmalloc((size_t)(pos0 + n_tok) * 8);
    int32_t *pos = xmalloc((size_t)n_tok * 4);
    for (size_t i = 0; i < nq; i++) q[i] = 3.0f * frand(&seed); /* scores of a few units: the sinks compete */
    for (size_t i = 0; i < nc; i++) {
        kc[i] = hm_f32_to_fp16(frand(&seed));
        vc[i] = hm_f32_to_fp16(frand(&seed));
    }
    for (int h = 0; h < n_head; h++) sinks[h] = 3.0f * frand(&seed);
    for (int64_t t = 0; t < n_tok; t++) pos[t] = (int32_t)(pos0 + t);
    for (int64_t t = 0; t < n_tok; t++)
        for (int h = 0; h < n_head; h++) {
            const int g = h / (n_head / n_kv);
            const int64_t p1 = pos[t];
            int64_t p0 = W > 0 ? p1 - W + 1 : 0;
            if (p0 < 0) p0 = 0;
            const float *qv = q + ((size_t)t * n_head + (size_t)h) * hd;
            double mx = sinks[h], sum = 0;
            for (int64_t s = p0; s <= p1; s++) {
                const uint16_t *kr = kc + ((size_t)g * (size_t)cap + (size_t)(s % cap)) * hd;
                double a = 0;
                for (int j = 0; j < hd; j++) a += (double)qv[j] * (double)hm_fp16_to_f32(kr[j]);
                sc[s] = a * scale;
                mx = fmax(mx, sc[s]);
            }
            double *r = ref + ((size_t)t * n_head + (size_t)h) * hd;
            for (int j = 0; j < hd; j++) r[j] = 0;
            for (int64_t s = p0; s <= p1; s++) {
                const double e = exp(sc[s] - mx);
                sum += e;
                const uint16_t *vr = vc + ((size_t)g * (size_t)cap + (size_t)(s % cap)) * hd;
                for (int j = 0; j < hd; j++) r[j] += e * (double)hm_fp16_to_f32(vr[j]);
            }
            sum += exp((double)sinks[h] - mx);
            for (int j = 0; j < hd; j++) r[j] /= sum;
        }
    float *qd = dev_copy(q, nq * 4), *od = NULL, *skd = dev_copy(sinks, sizeof sinks);
    uint16_t *kd = dev_copy(kc, nc * 2), *vd = dev_copy(vc, nc * 2);
    int32_t *pd = dev_copy(pos, (size_t)n_tok * 4);
    size_t scr = hm_cuda_gemma_attention_scratch_size(ctx, hd);
    const size_t fl = hm_cuda_flash_scratch_size(ctx, n_tok, n_head, hd, pos0 + n_tok);
    if (fl > scr) scr = fl;
    void *sd = NULL;
    CK(hm_cuda_alloc(ctx, nq * 4, (void **)&od, &err));
    CK(hm_cuda_alloc(ctx, scr, &sd, &err));
    hm_cuda_set_flash(ctx, flash);
    CK(hm_cuda_gemma_attention_kv_sinks(ctx, HM_CUDA_KV_F16, qd, n_tok, pd, pos0 + n_tok, kd, vd, cap, W, n_head, n_kv,
                                        hd, scale, skd, od, sd, scr, &err));
    hm_cuda_set_flash(ctx, true);
    CK(hm_cuda_download(ctx, o, od, nq * 4, &err));
    double e = 0;
    for (size_t i = 0; i < nq; i++) e = fmax(e, fabs((double)o[i] - ref[i]));
    const double bound = flash ? FLASH_ABS : ATTN_ABS;
    printf("attention with sinks, cap %lld, window %d, %lld queries at %lld%s: max abs err %.3g\n", (long long)cap, W,
           (long long)n_tok, (long long)pos0, flash ? " (flash)" : "", e);
    CHECKF(e <= bound, "sinks window %d n_tok %lld%s: max abs err %.3g > %.3g", W, (long long)n_tok,
           flash ? " flash" : "", e, bound);
    hm_cuda_free(ctx, qd);
    hm_cuda_free(ctx, od);
    hm_cuda_free(ctx, skd);
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

static void check_kernels(void) {
    check_add_bias();
    check_sinks(24, 16, 700, 1, false, 1);    /* one query: its range split over blocks, merged */
    check_sinks(4096, 0, 3000, 1, false, 2);  /* a long full-attention range */
    check_sinks(24, 16, 60, 8, false, 3);     /* a batch on the exact kernel */
    check_sinks(80, 16, 100, 64, true, 4);    /* flash prefill over a ring with a window */
    check_sinks(1200, 0, 1000, 64, true, 5);  /* flash over a full cache (split over the keys) */
}

/* ==== the model: GPU against the CPU engine ================================================== */

#define SP 40
#define SDEC 16
#define SSTEP (1 + SDEC)

static void run_synth(const char *type, bool quant) {
    char path[] = "/tmp/hm_gptgpu_XXXXXX", label[48];
    if (!gpu_compare_synth(path, "gpt-oss", "gpt-oss-tiny", type, 5)) return;
    snprintf(label, sizeof label, "gpt-oss-tiny %s", type);
    hm_err e = {{0}};
    int32_t V = 0, n_layer = 0, K = 0;
    uint64_t unit_bytes = 0, n_units = 0;
    hm_model *m = gpu_compare_open_cpu(path, label, &V, &n_layer, &K, &unit_bytes, &n_units, &e);
    if (!m) {
        unlink(path);
        return;
    }
    const int32_t ub[2] = {64, 8};
    int32_t toks[SP + SDEC], dummy[1];
    gpu_compare_prompts(0x2545f4914f6cdd1dull, V, toks, SP, dummy, 0);
    float *cpu[2], *gpu = xmalloc((size_t)SSTEP * V * 4), *g2 = xmalloc((size_t)SSTEP * V * 4);
    for (int i = 0; i < 2; i++) {
        cpu[i] = xmalloc((size_t)SSTEP * V * 4);
        CHECKF(gpu_compare_run_fresh(m, 64, ub[i], toks, SP, SDEC, i == 0, cpu[i], V, &e) == HM_OK, "%s CPU run %d: %s",
               label, i, e.msg);
    }
    hm_model_close(m);

    hm_placement_opts po;
    hm_placement_opts_default(&po);
    po.n_gpu_layers = 99;
    po.n_ctx = 64;
    hm_model_opts mo;
    memset(&mo, 0, sizeof mo);
    mo.placement = &po;
    m = NULL;
    hm_status st = hm_model_open(&m, path, &mo, &e);
    CHECKF(st == HM_OK, "%s -ngl 99: open: %s", label, e.msg);
    for (int i = 0; st == HM_OK && i < 2; i++) {
        char what[96];
        snprintf(what, sizeof what, "%s -ngl 99 n_ubatch %d", label, ub[i]);
        hm_status s2 = gpu_compare_run_fresh(m, 64, ub[i], toks, SP, SDEC, false, gpu, V, &e);
        CHECKF(s2 == HM_OK, "%s: %s", what, e.msg);
        if (s2 != HM_OK) continue;
        const double w = gpu_compare_logits(what, gpu, cpu[i], SSTEP, V, quant ? NMSE_Q8 : i == 0 ? NMSE_BF16 : NMSE_EXACT);
        fprintf(stderr, "%s: worst NMSE vs the CPU %.3g\n", what, w);
        if (i == 1) { /* decode as one CUDA graph vs per launch: the same kernels in the same order */
            setenv("HOTMOE_CUDA_GRAPH", "0", 1);
            s2 = gpu_compare_run_fresh(m, 64, ub[i], toks, SP, SDEC, false, g2, V, &e);
            unsetenv("HOTMOE_CUDA_GRAPH");
            CHECKF(s2 == HM_OK, "%s without graphs: %s", what, e.msg);
            int64_t nd = 0;
            for (size_t j = 0; s2 == HM_OK && j < (size_t)SSTEP * (size_t)V; j++) nd += gpu[j] != g2[j];
            CHECKF(nd == 0, "%s: graph vs per-launch decode: %lld logits differ", what, (long long)nd);
        }
    }
    if (st == HM_OK) {
        hm_usage u;
        memset(&u, 0, sizeof u);
        if (hm_model_usage(m, &u, &e) == HM_OK) {
            /* the experts on the CPU (no VRAM slots: the CUDA kernels lack the biases); every row routed */
            CHECKF(u.vram_slots == 0, "%s: %lld VRAM slots, want 0 until the CUDA experts add biases", label,
                   (long long)u.vram_slots);
            for (int32_t l = 0; l < n_layer; l++) {
                const uint64_t rows = l + 1 < n_layer ? 2u * (SP + SDEC) : 2u * SSTEP;
                CHECKF(u.layer_hits[l] + u.layer_misses[l] >= rows * (uint64_t)K, "%s layer %d: %llu routed rows x k",
                       label, l, (unsigned long long)(u.layer_hits[l] + u.layer_misses[l]));
            }
            hm_usage_free(&u);
        }
    }
    hm_model_close(m);
    free(gpu);
    free(g2);
    free(cpu[0]);
    free(cpu[1]);
    unlink(path);
}

int main(void) {
    const int rc = cuda_test_open("nothing to check without a device");
    if (rc >= 0) return rc;
    check_kernels();
    hm_cuda_close(ctx);
    ctx = NULL;
    run_synth("f32", false);
    run_synth("mxfp4", true);
    return test_done();
}
