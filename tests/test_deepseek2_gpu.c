/* test_deepseek2_gpu.c - deepseek2 (DeepSeek-V2/V3: MLA over the compressed KV cache) on the GPU
 * against the CPU engine (whose logits tests/cli_llama_ref_deepseek2.sh holds to llama.cpp), and
 * the MLA CUDA ops (cuda_mla.h) against their CPU twins and a double reference.
 *
 * Kernels (random inputs): hm_cuda_mla_in against hm_cpu_mla_in (qa's rope parts, kv normed and
 * rotated, the f16 cache rows: max error 1e-5 relative to the largest value; the cache rows within
 * one f16 rounding); hm_cuda_mla_attention over an f16 cache of 96 and of 576 values per row (the
 * real models' kv_lora 512 + rope 64) against a double reference reading the same f16 values
 * (max abs error 1e-4, as test_gemma4_gpu's attention); hm_cuda_copy_strided exactly.
 *
 * Model: synth deepseek2-tiny (3 layers, the first dense; q LoRA; MLA kv_lora 64 + rope 32 over 4
 * heads; YaRN; 16 experts k 4 in 4 groups, sigmoid + exp_probs_b, one shared expert), F32 and
 * Q8_0: a 40-token prompt and 16 decode steps, with n_ubatch 64 (the prefill path) and 8 (the
 * decode path), placements -ngl 99 (every unit hot) and --cpu-moe; logits compared step by step
 * with gpu_compare.h's rule. Bounds as test_gemma4_gpu's (its numerics are the same kinds): F32
 * decode NMSE_EXACT 1e-6, F32 prefill (bf16 tensor cores) NMSE_BF16 1e-4, Q8_0 (the CPU
 * quantises activations to Q8, the GPU keeps f32) NMSE_Q8 3e-4. Exits 77 without a CUDA device. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cpu/cpu_mla.h"
#include "backend/cuda/cuda_mla.h"
#include "core/fp16.h"
#include "gpu_compare.h"
#include "hotmoe.h"
#include "test.h"
/* last: its file-scope `err` would shadow the parameters of the helpers above */
#include "cuda_test.h"

#define NMSE_EXACT 1e-6
#define NMSE_BF16 1e-4
#define NMSE_Q8 3e-4
#define KERN_REL 1e-5
#define ATTN_ABS 1e-4

static float frand(uint64_t *s) { return (float)(rnd_unit(s) * 2.0 - 1.0); }

static void *dev_copy(const void *h, size_t n) {
    void *d = NULL;
    CK(hm_cuda_alloc(ctx, n, &d, &err));
    CK(hm_cuda_upload(ctx, d, h, n, &err));
    return d;
}

static void dev_get(void *h, const void *d, size_t n) {
    CK(hm_cuda_sync(ctx, &err));
    CK(hm_cuda_download(ctx, h, d, n, &err));
}

static double max_rel(const float *a, const float *b, size_t n) {
    double md = 0, mr = 1e-30;
    for (size_t i = 0; i < n; i++) {
        md = fmax(md, fabs((double)a[i] - b[i]));
        mr = fmax(mr, fabs((double)b[i]));
    }
    return md / mr;
}

static void check_mla_in(void) {
    enum { N = 5, H = 3, NOPE = 32, ROT = 32, LORA = 64, QW = NOPE + ROT, AW = LORA + ROT, NCTX = 16 };
    uint64_t s = 5;
    float q[N * H * QW], qa[N * H * AW], kv[N * AW], norm[LORA], ff[ROT / 2];
    float qa_g[N * H * AW], kv_g[N * AW];
    uint16_t kc_g[NCTX * AW];
    int32_t pos[N] = {0, 3, 4, 9, 15};
    for (int i = 0; i < N * H * QW; i++) q[i] = frand(&s);
    for (int i = 0; i < N * AW; i++) kv[i] = frand(&s);
    for (int i = 0; i < LORA; i++) norm[i] = 1.0f + 0.1f * frand(&s);
    for (int i = 0; i < ROT / 2; i++) ff[i] = 1.0f + 0.5f * (float)i;
    memset(qa, 0, sizeof qa);
    float *qd = dev_copy(q, sizeof q), *qad = dev_copy(qa, sizeof qa), *kvd = dev_copy(kv, sizeof kv);
    float *nd = dev_copy(norm, sizeof norm), *fd = dev_copy(ff, sizeof ff);
    int32_t *pd = dev_copy(pos, sizeof pos);
    uint16_t *kcd = NULL;
    CK(hm_cuda_alloc(ctx, sizeof kc_g, (void **)&kcd, &err));
    CK(hm_cuda_mla_in(ctx, qd, qad, kvd, N, H, NOPE, LORA, ROT, pd, 10000.0f, fd, nd, 1e-6f, kcd, NCTX, &err));
    dev_get(qa_g, qad, sizeof qa_g);
    dev_get(kv_g, kvd, sizeof kv_g);
    dev_get(kc_g, kcd, sizeof kc_g);
    hm_pool *pool = NULL;
    CK(hm_pool_open(&pool, 1, &err));
    hm_cpu_mla_in(pool, q, qa, kv, N, H, NOPE, LORA, ROT, pos, 10000.0f, ff, norm, 1e-6f);
    hm_pool_close(pool);
    const double e1 = max_rel(qa_g, qa, sizeof qa / 4), e2 = max_rel(kv_g, kv, sizeof kv / 4);
    double e3 = 0;
    for (int t = 0; t < N; t++)
        for (int i = 0; i < AW; i++) {
            const double r = kv[t * AW + i], g = hm_fp16_to_f32(kc_g[pos[t] * AW + i]);
            e3 = fmax(e3, fabs(g - r) / fmax(fabs(r), 1e-3));
        }
    printf("mla_in: qa rel err %.3g, kv rel err %.3g, cache rows rel err %.3g\n", e1, e2, e3);
    CHECKF(e1 <= KERN_REL && e2 <= KERN_REL, "mla_in: qa %.3g, kv %.3g", e1, e2);
    CHECKF(e3 <= 1e-3, "mla_in cache rows: %.3g (one f16 rounding is 4.9e-4)", e3);
    hm_cuda_free(ctx, qd), hm_cuda_free(ctx, qad), hm_cuda_free(ctx, kvd), hm_cuda_free(ctx, nd);
    hm_cuda_free(ctx, fd), hm_cuda_free(ctx, pd), hm_cuda_free(ctx, kcd);
}

static void check_mla_attention(int hd, int n_head, int64_t n_tok, int64_t pos0) {
    const int64_t n_ctx = pos0 + n_tok;
    const size_t nq = (size_t)(n_tok * n_head * hd), nc = (size_t)(n_ctx * hd);
    uint64_t s = 11 + (uint64_t)hd;
    float *q = xmalloc(nq * 4), *o = xmalloc(nq * 4);
    uint16_t *kc = xmalloc(nc * 2);
    double *ref = xmalloc(nq * 8), *sc = xmalloc((size_t)n_ctx * 8);
    int32_t *pos = xmalloc((size_t)n_tok * 4);
    const float scale = 1.0f / sqrtf((float)hd) * 3.0f;
    for (size_t i = 0; i < nq; i++) q[i] = frand(&s);
    for (size_t i = 0; i < nc; i++) kc[i] = hm_f32_to_fp16(frand(&s));
    for (int64_t t = 0; t < n_tok; t++) pos[t] = (int32_t)(pos0 + t);
    for (int64_t t = 0; t < n_tok; t++)
        for (int h = 0; h < n_head; h++) {
            const float *qv = q + ((size_t)t * n_head + h) * hd;
            double mx = -INFINITY, sum = 0;
            for (int64_t p = 0; p <= pos[t]; p++) {
                double a = 0;
                for (int j = 0; j < hd; j++) a += (double)qv[j] * hm_fp16_to_f32(kc[p * hd + j]);
                sc[p] = a * scale;
                mx = fmax(mx, sc[p]);
            }
            double *r = ref + ((size_t)t * n_head + h) * hd;
            for (int j = 0; j < hd; j++) r[j] = 0;
            for (int64_t p = 0; p <= pos[t]; p++) {
                const double e = exp(sc[p] - mx);
                sum += e;
                for (int j = 0; j < hd; j++) r[j] += e * hm_fp16_to_f32(kc[p * hd + j]);
            }
            for (int j = 0; j < hd; j++) r[j] /= sum;
        }
    float *qd = dev_copy(q, nq * 4), *od = NULL;
    uint16_t *kd = dev_copy(kc, nc * 2);
    int32_t *pd = dev_copy(pos, (size_t)n_tok * 4);
    CK(hm_cuda_alloc(ctx, nq * 4, (void **)&od, &err));
    CK(hm_cuda_mla_attention(ctx, qd, n_tok, pd, kd, n_ctx, n_head, hd, scale, od, &err));
    dev_get(o, od, nq * 4);
    double e = 0;
    for (size_t i = 0; i < nq; i++) e = fmax(e, fabs(o[i] - ref[i]));
    printf("mla_attention hd %d, %d heads, %lld queries at %lld: max abs err %.3g\n", hd, n_head, (long long)n_tok,
           (long long)pos0, e);
    CHECKF(e <= ATTN_ABS, "mla_attention hd %d: %.3g", hd, e);
    hm_cuda_free(ctx, qd), hm_cuda_free(ctx, od), hm_cuda_free(ctx, kd), hm_cuda_free(ctx, pd);
    free(q), free(o), free(kc), free(ref), free(sc), free(pos);
}

static void check_copy_strided(void) {
    float src[7 * 10], dst[7 * 6], got[7 * 6];
    for (int i = 0; i < 70; i++) src[i] = (float)i;
    for (int i = 0; i < 42; i++) dst[i] = -1.0f;
    float *sd = dev_copy(src, sizeof src), *dd = dev_copy(dst, sizeof dst);
    CK(hm_cuda_copy_strided(ctx, dd + 1, 6, sd + 3, 10, 7, 4, &err));
    dev_get(got, dd, sizeof got);
    int bad = 0;
    for (int r = 0; r < 7; r++)
        for (int j = 0; j < 6; j++)
            bad += got[r * 6 + j] != (j >= 1 && j < 5 ? src[r * 10 + 3 + j - 1] : -1.0f);
    CHECKF(bad == 0, "copy_strided: %d wrong", bad);
    hm_cuda_free(ctx, sd), hm_cuda_free(ctx, dd);
}

/* ---- the model ---- */

#define SP 40
#define SDEC 16
#define SSTEP (1 + SDEC)

static hm_model *open_gpu(const char *path, const hm_placement_opts *po, hm_err *e) {
    hm_model_opts mo;
    memset(&mo, 0, sizeof mo);
    mo.placement = po;
    hm_model *m = NULL;
    return hm_model_open(&m, path, &mo, e) == HM_OK ? m : NULL;
}

static void run_synth(const char *type, bool quant) {
    char path[] = "/tmp/hm_ds2gpu_XXXXXX";
    if (!gpu_compare_synth(path, "deepseek2", "deepseek2-tiny", type, 1)) return;
    hm_err e = {{0}};
    int32_t V = 0, n_layer = 0, K = 0;
    uint64_t unit_bytes = 0, n_units = 0;
    hm_model *m = gpu_compare_open_cpu(path, type, &V, &n_layer, &K, &unit_bytes, &n_units, &e);
    if (!m) {
        unlink(path);
        return;
    }
    const int32_t ubs[2] = {64, 8};
    int32_t toks[SP + SDEC], dummy[1];
    gpu_compare_prompts(0x9e3779b97f4a7c15ull, V, toks, SP, dummy, 0);
    float *cpu[2], *gpu = xmalloc((size_t)SSTEP * V * 4);
    for (int i = 0; i < 2; i++) {
        cpu[i] = xmalloc((size_t)SSTEP * V * 4);
        CHECKF(gpu_compare_run_fresh(m, 64, ubs[i], toks, SP, SDEC, i == 0, cpu[i], V, &e) == HM_OK,
               "%s CPU run %d: %s", type, i, e.msg);
    }
    hm_model_close(m);
    for (int p = 0; p < 2; p++) {
        hm_placement_opts po;
        hm_placement_opts_default(&po);
        po.n_gpu_layers = 99;
        po.n_ctx = 64;
        po.cpu_moe = p == 1;
        m = open_gpu(path, &po, &e);
        CHECKF(m != NULL, "%s %s: open: %s", type, p ? "--cpu-moe" : "-ngl 99", e.msg);
        if (!m) continue;
        for (int i = 0; i < 2; i++) {
            int32_t t[SP + SDEC];
            memcpy(t, toks, sizeof t);
            char what[160];
            snprintf(what, sizeof what, "deepseek2-tiny %s %s n_ubatch %d", type, p ? "--cpu-moe" : "-ngl 99", ubs[i]);
            hm_status st = gpu_compare_run_fresh(m, 64, ubs[i], t, SP, SDEC, false, gpu, V, &e);
            CHECKF(st == HM_OK, "%s: %s", what, e.msg);
            if (st == HM_OK) {
                const double w = gpu_compare_logits(what, gpu, cpu[i], SSTEP, V,
                                                    quant ? NMSE_Q8 : (i == 0 ? NMSE_BF16 : NMSE_EXACT));
                printf("%s: worst NMSE %.3g\n", what, w);
            }
        }
        hm_model_close(m);
    }
    free(cpu[0]), free(cpu[1]), free(gpu);
    unlink(path);
}

int main(void) {
    int rc = cuda_test_open("no host part");
    if (rc >= 0) return rc;
    check_mla_in();
    check_mla_attention(96, 4, 1, 37);
    check_mla_attention(96, 4, 9, 0);
    check_mla_attention(576, 16, 1, 200);
    check_mla_attention(576, 16, 5, 20);
    check_copy_strided();
    hm_cuda_close(ctx);
    run_synth("f32", false);
    run_synth("q8_0", true);
    return test_done();
}
