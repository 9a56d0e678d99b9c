/* test_gptoss_gpu.c - the gpt-oss forward pass on the GPU against the CPU engine, and gpt-oss's
 * CUDA ops (cuda_gptoss.h) against double-precision scalar references written here.
 *
 * Kernels: the grouped MoE kernels with gpt-oss's experts (check_moe_oai, host- and device-routed);
 * hm_cuda_add_bias (exact: one f32 add per element, as the CPU's); the ring attention
 * with sinks (hm_cuda_gemma_attention_kv_sinks over an f16 cache) at head dim 64, one query (the
 * range split over blocks: the merge's sinks), a batch of 8 (no split) and, with the flash path on,
 * a batch of 64 (flash prefill; window 16 and none), scale 1/8, sinks in [-3, 3], against
 * softmax(scale q.k, sink) v in double. Bounds: the exact kernels max abs error 1e-4 as
 * test_gemma4_gpu's ATTN_ABS (|v| <= 1); flash rounds q, the probabilities and v to f16, 2e-3.
 *
 * Model: synth gpt-oss-tiny (4 layers, 2 sliding with window 16 + 2 full, every feature on),
 * F32 and MXFP4, a 40-token prompt (> the window) and 16 decode steps, n_ubatch 64 (prefill path)
 * and 8 (decode path; the sliding layers' rings wrap), run by the CPU engine (held to llama.cpp by
 * tests/cli_llama_ref_gptoss.sh) and on the GPU under three placements: -ngl 99 (every unit HOT:
 * the grouped kernels' clamped SwiGLU and per-expert biases, host-routed for prefill and
 * device-routed for decode, with hm_cuda_moe_dev_down_bias), --vram-budget ~30 % of the units with
 * lru (hot and cold units in one layer) and --cpu-moe (every unit on the CPU); store stats: per
 * layer hits + misses = rows x k, -ngl no misses, --cpu-moe no hits. Bounds as test_gemma4_gpu: exact path
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
#include "quant/quant.h"
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

/* max |g - r| / max |r| */
static double rel_err(const float *g, const double *r, size_t n) {
    double md = 0, mr = 1e-30;
    for (size_t i = 0; i < n; i++) {
        md = fmax(md, fabs((double)g[i] - r[i]));
        mr = fmax(mr, fabs(r[i]));
    }
    return md / mr;
}

static double swiglu_oai_d(double g, double u) {
    const double a = g < 7.0 ? g : 7.0, b = u < -7.0 ? -7.0 : u > 7.0 ? 7.0 : u;
    return a / (1.0 + exp(-1.702 * a)) * (b + 1.0);
}

/* The grouped MoE kernels with gpt-oss's experts (clamped SwiGLU, gate/up/down biases; gate and
 * up biases wide enough that the clamps take many rows) on F32 units: host-routed
 * (hm_cuda_moe_act) and device-routed (hm_cuda_moe_dev_act + hm_cuda_moe_dev_down_bias, one
 * expert cold) against a double reference; bound KERN_REL (f32 math against double). */
#define KERN_REL 1e-5
static void check_moe_oai(void) {
    enum { E = 256, F = 256, NX = 3, T = 2, K = 2 };
    uint64_t seed = 77;
    const size_t mw = (size_t)E * F;
    float *w = xmalloc(3 * NX * mw * 4), *x = xmalloc(T * E * 4), *o = xmalloc(T * E * 4);
    float *bias = xmalloc((size_t)NX * (2 * F + E) * 4);
    double *r = xmalloc(T * E * 8), *r_hot = xmalloc(T * E * 8), hbuf[F];
    for (size_t i = 0; i < 3 * NX * mw; i++) w[i] = 0.06f * frand(&seed);
    for (int i = 0; i < T * E; i++) x[i] = frand(&seed);
    for (int i = 0; i < NX * (2 * F + E); i++) bias[i] = 8.0f * frand(&seed);
    const int32_t ids[T * K] = {0, 2, 1, 0};
    const float wt[T * K] = {0.7f, 0.3f, 0.6f, 0.4f};
    /* unit e: gate at w + (3e) mw, up (3e+1) mw ([F][E]), down (3e+2) mw ([E][F]); biases at
     * bias + e (2F + E): gate [F], up [F], down [E] */
    for (int i = 0; i < T * E; i++) r[i] = r_hot[i] = 0;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) {
            const int e = ids[t * K + j];
            const float *gw = w + (size_t)(3 * e) * mw, *uw = gw + mw, *dw = uw + mw;
            const float *gb = bias + (size_t)e * (2 * F + E), *ub = gb + F, *db = ub + F;
            for (int f = 0; f < F; f++) {
                double gs = gb[f], us = ub[f];
                for (int c = 0; c < E; c++) {
                    gs += (double)gw[(size_t)f * E + c] * x[t * E + c];
                    us += (double)uw[(size_t)f * E + c] * x[t * E + c];
                }
                hbuf[f] = swiglu_oai_d(gs, us);
            }
            for (int i = 0; i < E; i++) {
                double a = db[i];
                for (int f = 0; f < F; f++) a += (double)dw[(size_t)i * F + f] * hbuf[f];
                r[t * E + i] += wt[t * K + j] * a;
                if (e != 2) r_hot[t * E + i] += wt[t * K + j] * a;
            }
        }
    float *wd = dev_copy(w, 3 * NX * mw * 4), *xd = dev_copy(x, T * E * 4), *od = NULL;
    float *bd = dev_copy(bias, (size_t)NX * (2 * F + E) * 4);
    CK(hm_cuda_alloc(ctx, T * E * 4, (void **)&od, &err));
    const int32_t tok0[2] = {0, 1}, tok1[1] = {1}, tok2[1] = {0};
    const float w0[2] = {0.7f, 0.4f}, w1[1] = {0.6f}, w2[1] = {0.3f};
    hm_cuda_moe_unit units[NX];
    const int32_t *toks[NX] = {tok0, tok1, tok2};
    const float *wts[NX] = {w0, w1, w2};
    const int32_t nts[NX] = {2, 1, 1};
    for (int e = 0; e < NX; e++) {
        const float *gb = bd + (size_t)e * (2 * F + E);
        units[e] = (hm_cuda_moe_unit){.gate = wd + (size_t)(3 * e) * mw, .up = wd + (size_t)(3 * e + 1) * mw,
                                      .down = wd + (size_t)(3 * e + 2) * mw, .tok_host = toks[e], .w_host = wts[e],
                                      .n_tok = nts[e], .gate_b = gb, .up_b = gb + F, .down_b = gb + 2 * F};
    }
    const size_t scr = hm_cuda_moe_scratch_size(T, T * K, NX, F);
    void *sd = NULL;
    CK(hm_cuda_alloc(ctx, scr, &sd, &err));
    CK(hm_cuda_memset(ctx, od, 0, T * E * 4, &err));
    CK(hm_cuda_moe_act(ctx, units, NX, HM_TYPE_F32, HM_TYPE_F32, HM_CUDA_ACT_SWIGLU_OAI, xd, T, E, F, od, sd, scr,
                       &err));
    CK(hm_cuda_download(ctx, o, od, T * E * 4, &err));
    double e = rel_err(o, r, T * E);
    printf("moe clamped SwiGLU + biases (host-routed): rel err %.3g\n", e);
    CHECKF(e <= KERN_REL, "moe swiglu_oai: rel err %.3g", e);
    hm_cuda_moe_slot slots[NX];
    for (int x2 = 0; x2 < NX; x2++)
        slots[x2] = x2 == 2 ? (hm_cuda_moe_slot){.gate = NULL}
                            : (hm_cuda_moe_slot){.gate = units[x2].gate, .up = units[x2].up, .down = units[x2].down,
                                                 .gate_b = units[x2].gate_b, .up_b = units[x2].up_b,
                                                 .down_b = units[x2].down_b};
    hm_cuda_moe_slot *sld = dev_copy(slots, sizeof slots);
    int32_t *idd = dev_copy(ids, sizeof ids);
    float *wtd = dev_copy(wt, sizeof wt);
    void *sd2 = NULL;
    const size_t scr2 = hm_cuda_moe_dev_scratch_size(T, K, F);
    CK(hm_cuda_alloc(ctx, scr2, &sd2, &err));
    CK(hm_cuda_memset(ctx, od, 0, T * E * 4, &err));
    CK(hm_cuda_moe_dev_act(ctx, sld, HM_TYPE_F32, HM_TYPE_F32, HM_CUDA_ACT_SWIGLU_OAI, idd, wtd, K, xd, T, E, F, od,
                           sd2, scr2, &err));
    CK(hm_cuda_moe_dev_down_bias(ctx, sld, idd, wtd, K, T, E, od, &err));
    CK(hm_cuda_download(ctx, o, od, T * E * 4, &err));
    e = rel_err(o, r_hot, T * E);
    printf("moe clamped SwiGLU + biases (device-routed, one cold expert): rel err %.3g\n", e);
    CHECKF(e <= KERN_REL, "moe_dev swiglu_oai: rel err %.3g", e);
    hm_cuda_free(ctx, wd);
    hm_cuda_free(ctx, xd);
    hm_cuda_free(ctx, od);
    hm_cuda_free(ctx, bd);
    hm_cuda_free(ctx, sd);
    hm_cuda_free(ctx, sd2);
    hm_cuda_free(ctx, sld);
    hm_cuda_free(ctx, idd);
    hm_cuda_free(ctx, wtd);
    free(w);
    free(x);
    free(o);
    free(bias);
    free(r);
    free(r_hot);
}

static void check_kernels(void) {
    check_moe_oai();
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

typedef enum place { P_ALL, P_LRU, P_CPU_MOE } place;
static const char *place_name[] = {"-ngl 99 (all experts HOT)", "--vram-budget 30% lru", "--cpu-moe"};

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

    for (int pl = P_ALL; pl <= P_CPU_MOE; pl++) {
        hm_placement_opts po;
        hm_placement_opts_default(&po);
        po.n_gpu_layers = 99;
        po.n_ctx = 64;
        if (pl == P_LRU) {
            po.vram_budget = (int64_t)((n_units * 3 + 9) / 10) * (int64_t)(unit_bytes + 3 * 256);
            po.policy = "lru";
        }
        if (pl == P_CPU_MOE) po.cpu_moe = true;
        hm_model_opts mo;
        memset(&mo, 0, sizeof mo);
        mo.placement = &po;
        m = NULL;
        hm_status st = hm_model_open(&m, path, &mo, &e);
        CHECKF(st == HM_OK, "%s %s: open: %s", label, place_name[pl], e.msg);
        if (st != HM_OK) continue;
        int runs = 0;
        for (int i = 0; i < 2; i++) {
            char what[160];
            snprintf(what, sizeof what, "%s %s n_ubatch %d", label, place_name[pl], ub[i]);
            hm_status s2 = gpu_compare_run_fresh(m, 64, ub[i], toks, SP, SDEC, false, gpu, V, &e);
            CHECKF(s2 == HM_OK, "%s: %s", what, e.msg);
            if (s2 != HM_OK) continue;
            runs++;
            const double w =
                gpu_compare_logits(what, gpu, cpu[i], SSTEP, V, quant ? NMSE_Q8 : i == 0 ? NMSE_BF16 : NMSE_EXACT);
            fprintf(stderr, "%s: worst NMSE vs the CPU %.3g\n", what, w);
            if (i == 1 && pl != P_LRU) { /* decode as one CUDA graph vs per launch: the same kernels in order */
                setenv("HOTMOE_CUDA_GRAPH", "0", 1);
                s2 = gpu_compare_run_fresh(m, 64, ub[i], toks, SP, SDEC, false, g2, V, &e);
                unsetenv("HOTMOE_CUDA_GRAPH");
                CHECKF(s2 == HM_OK, "%s without graphs: %s", what, e.msg);
                if (s2 == HM_OK) runs++;
                int64_t nd = 0;
                for (size_t j = 0; s2 == HM_OK && j < (size_t)SSTEP * (size_t)V; j++) nd += gpu[j] != g2[j];
                CHECKF(nd == 0, "%s: graph vs per-launch decode: %lld logits differ", what, (long long)nd);
            }
        }
        hm_usage u;
        memset(&u, 0, sizeof u);
        if (hm_model_usage(m, &u, &e) == HM_OK) {
            uint64_t hits = 0, misses = 0;
            for (int32_t l = 0; l < n_layer; l++) {
                /* each run: every row in every layer but the last, which computes the wanted rows only */
                const uint64_t rows = (uint64_t)runs * (l + 1 < n_layer ? SP + SDEC : SSTEP);
                const uint64_t h = u.layer_hits[l], mi = u.layer_misses[l];
                hits += h;
                misses += mi;
                CHECKF(h + mi == rows * (uint64_t)K, "%s %s layer %d: %llu hits + %llu misses, want %llu x %d", label,
                       place_name[pl], l, (unsigned long long)h, (unsigned long long)mi, (unsigned long long)rows, K);
                if (pl == P_ALL) CHECKF(mi == 0, "%s -ngl layer %d: %llu misses", label, l, (unsigned long long)mi);
                if (pl == P_CPU_MOE) CHECKF(h == 0, "%s --cpu-moe layer %d: %llu hits", label, l, (unsigned long long)h);
            }
            if (pl == P_LRU) CHECKF(hits > 0 && misses > 0, "%s lru: %llu hits, %llu misses", label,
                                    (unsigned long long)hits, (unsigned long long)misses);
            CHECKF(pl == P_CPU_MOE ? u.vram_slots == 0 : u.vram_slots > 0, "%s %s: %lld VRAM slots", label,
                   place_name[pl], (long long)u.vram_slots);
            hm_usage_free(&u);
        }
        hm_model_close(m);
    }
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
