/* test_qwen3next_gpu.c - the qwen3next forward pass on the GPU against the CPU engine (which
 * tests/cli_llama_ref_qwen3next.sh holds to llama.cpp), and the two kernel paths Qwen3-Next's GGUF
 * layout adds to qwen35moe's (hm_deltanet.grouped) against scalar references written here.
 *
 * 1. Kernels, d_k 64 (the register path), d_v 48 (a partial column block): hm_cuda_delta_gates reading the fused ssm_ba rows (per key head its betas, then its
 *    alphas) against a double reference of the gates; hm_cuda_gated_delta with grouped value heads
 *    (value head h reads key head h / (n_v / n_k)) against the CPU's hm_cpu_gated_delta_seq with the
 *    same layout (test_cpu_deltanet checks that against the tiled form on renumbered heads), in two
 *    calls carrying the state. Bounds: max |d| / max |ref| < 1e-5 (f32 against double, or the CPU's
 *    f32 in another order, over a few dozen tokens, as test_qwen35moe_gpu.c).
 * 2. synth qwen3next tiny (4 layers: 3 DeltaNet with 2 key heads of 4 value heads + 1 gated
 *    attention; 16 experts k 4 and a shared expert), F32 and Q8_0: a 40-token prompt and 16 decode
 *    steps, once with n_ubatch 64 (the prefill path) and once with n_ubatch 8 (micro-batches on the
 *    exact path, the recurrent state carried); placements -ngl 99, --vram-budget ~30 % of the units
 *    (lru) and --cpu-moe; logits by gpu_compare.h's rule with test_qwen35moe_gpu.c's bounds (NMSE
 *    1e-4 where a bf16 prefill is involved, 1e-7 on the F32 exact path, 3e-4 for Q8_0 whose CPU
 *    quantises activations); the decode graph bit-identical with the per-launch path.
 * Exits 77 ("skipped: no GPU") without a CUDA device. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cpu/cpu_deltanet.h"
#include "backend/cuda/cuda_linattn.h"
#include "gpu_compare.h"
#include "cuda_test.h"

#define NMSE_F32_EXACT 1e-7
#define NMSE_BF16 1e-4
#define NMSE_Q8 3e-4

enum { KT = 37, NK = 2, NV = 6, DK = 64, DV = 48, R = NV / NK };

static void *dev_copy(const void *h, size_t n) {
    void *d = NULL;
    CK(hm_cuda_alloc(ctx, n, &d, &err));
    CK(hm_cuda_upload(ctx, d, h, n, &err));
    return d;
}

static void dev_get(void *h, const void *d, size_t n) { CK(hm_cuda_download(ctx, h, d, n, &err)); }

static double rel_err(const float *a, const float *ref, size_t n) {
    double m = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        m = fmax(m, fabs((double)a[i] - ref[i]));
        r = fmax(r, fabs((double)ref[i]));
    }
    return r > 0 ? m / r : m;
}

/* q, k [KT, NK DK], v [KT, NV DV], g (log decay), beta [KT, NV] */
static void make_inputs(float *q, float *k, float *v, float *g, float *b) {
    uint64_t s = 0x51ed2701u;
    fill_normal(&s, q, KT * NK * DK, 0.1f);
    fill_normal(&s, k, KT * NK * DK, 0.1f);
    fill_normal(&s, v, KT * NV * DV, 1.0f);
    for (int i = 0; i < KT * NV; i++) g[i] = -0.05f - 0.2f * (float)rnd_unit(&s), b[i] = (float)rnd_unit(&s);
}

static void gpu_kernel_checks(void) {
    static float q[KT * NK * DK], k[KT * NK * DK], v[KT * NV * DV], g[KT * NV], b[KT * NV];
    static float ba[KT * 2 * NV], A[NV], dt[NV], gg[KT * NV], gb[KT * NV], rg[KT * NV], rb[KT * NV];
    static float S[NV * DK * DV], out[KT * NV * DV], rS[NV * DK * DV], rout[KT * NV * DV];
    make_inputs(q, k, v, g, b);
    /* the gates from fused rows: a reference in double */
    uint64_t s = 7;
    fill_normal(&s, ba, KT * 2 * NV, 2.0f);
    for (int h = 0; h < NV; h++) A[h] = -(float)(0.5 + rnd_unit(&s)), dt[h] = (float)rnd_normal(&s);
    for (int t = 0; t < KT; t++)
        for (int h = 0; h < NV; h++) {
            const float *row = ba + t * 2 * NV + (h / R) * 2 * R;
            const double a = (double)row[R + h % R] + dt[h];
            rg[t * NV + h] = (float)(A[h] * (a > 20 ? a : log1p(exp(a))));
            rb[t * NV + h] = (float)(1.0 / (1.0 + exp(-(double)row[h % R])));
        }
    float *dba = dev_copy(ba, sizeof ba), *dA = dev_copy(A, sizeof A), *ddt = dev_copy(dt, sizeof dt);
    float *dg = dev_copy(gg, sizeof gg), *db = dev_copy(gb, sizeof gb);
    CK(hm_cuda_delta_gates(ctx, dba + R, dba, dA, ddt, KT, NV, R, dg, db, &err));
    dev_get(gg, dg, sizeof gg);
    dev_get(gb, db, sizeof gb);
    CHECKF(rel_err(gg, rg, KT * NV) < 1e-5 && rel_err(gb, rb, KT * NV) < 1e-5, "fused gates: g %g, beta %g",
           rel_err(gg, rg, KT * NV), rel_err(gb, rb, KT * NV));
    /* the grouped delta rule, in two calls (the state carried), against the CPU's */
    hm_pool *pool = NULL;
    CK(hm_pool_open(&pool, 2, &err));
    memset(rS, 0, sizeof rS);
    hm_cpu_gated_delta_seq(pool, q, k, NK * DK, v, NV * DV, g, b, KT, NK, NV, true, DK, DV, rS, rout);
    hm_pool_close(pool);
    memset(S, 0, sizeof S);
    float *dq = dev_copy(q, sizeof q), *dk = dev_copy(k, sizeof k), *dv = dev_copy(v, sizeof v);
    float *dgg = dev_copy(g, sizeof g), *dbb = dev_copy(b, sizeof b), *dS = dev_copy(S, sizeof S);
    float *dout = dev_copy(out, sizeof out);
    const int t1 = 11, qs = NK * DK, vs = NV * DV;
    CK(hm_cuda_gated_delta(ctx, dq, dk, qs, dv, vs, dgg, dbb, t1, NK, NV, true, DK, DV, dS, dout, &err));
    CK(hm_cuda_gated_delta(ctx, dq + t1 * qs, dk + t1 * qs, qs, dv + t1 * vs, vs, dgg + t1 * NV, dbb + t1 * NV, KT - t1,
                           NK, NV, true, DK, DV, dS, dout + t1 * vs, &err));
    dev_get(out, dout, sizeof out);
    dev_get(S, dS, sizeof S);
    CHECKF(rel_err(out, rout, KT * NV * DV) < 1e-5 && rel_err(S, rS, NV * DK * DV) < 1e-5,
           "grouped delta rule: out %g, state %g", rel_err(out, rout, KT * NV * DV), rel_err(S, rS, NV * DK * DV));
    void *bufs[] = {dba, dA, ddt, dg, db, dq, dk, dv, dgg, dbb, dS, dout};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) hm_cuda_free(ctx, bufs[i]);
}

/* ---- the synth model ---- */
#define SP 40
#define SDEC 16
#define SSTEP (1 + SDEC)

typedef enum place { P_ALL, P_LRU, P_CPU_MOE } place;
static const char *place_name[] = {"-ngl 99", "--vram-budget 30% lru", "--cpu-moe"};

static void run_synth(const char *type, bool quant) {
    char path[] = "/tmp/hm_q3ngpu_XXXXXX", label[40];
    if (!gpu_compare_synth(path, "qwen3next", "tiny", type, 5)) return;
    snprintf(label, sizeof label, "qwen3next tiny %s", type);
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
    gpu_compare_prompts(0x9e3779b97f4a7c15ull, V, toks, SP, dummy, 0);
    float *cpu[2], *gpu = xmalloc((size_t)SSTEP * V * 4), *g2 = xmalloc((size_t)SSTEP * V * 4);
    for (int i = 0; i < 2; i++) {
        cpu[i] = xmalloc((size_t)SSTEP * V * 4);
        CHECKF(gpu_compare_run_fresh(m, 64, ub[i], toks, SP, SDEC, i == 0, cpu[i], V, &e) == HM_OK, "%s CPU %d: %s",
               label, i, e.msg);
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
        po.cpu_moe = p == P_CPU_MOE;
        hm_model_opts mo;
        memset(&mo, 0, sizeof mo);
        mo.placement = &po;
        m = NULL;
        CHECKF(hm_model_open(&m, path, &mo, &e) == HM_OK, "%s %s: open: %s", label, place_name[p], e.msg);
        if (!m) continue;
        double worst[2] = {-1, -1};
        for (int i = 0; i < 2; i++) {
            char what[128];
            snprintf(what, sizeof what, "%s %s n_ubatch %d", label, place_name[p], ub[i]);
            hm_status st = gpu_compare_run_fresh(m, 64, ub[i], toks, SP, SDEC, false, gpu, V, &e);
            CHECKF(st == HM_OK, "%s: %s", what, e.msg);
            if (st == HM_OK)
                worst[i] = gpu_compare_logits(what, gpu, cpu[i], SSTEP, V,
                                              quant ? NMSE_Q8 : (i == 0 ? NMSE_BF16 : NMSE_F32_EXACT));
        }
        fprintf(stderr, "%s %-22s NMSE prefill %.3g, micro-batches of 8 %.3g\n", label, place_name[p], worst[0],
                worst[1]);
        if (p != P_LRU && worst[1] >= 0) { /* gpu holds the n_ubatch 8 run: the graph's decode */
            setenv("HOTMOE_CUDA_GRAPH", "0", 1);
            hm_status st = gpu_compare_run_fresh(m, 64, ub[1], toks, SP, SDEC, false, g2, V, &e);
            unsetenv("HOTMOE_CUDA_GRAPH");
            CHECKF(st == HM_OK, "%s %s without graphs: %s", label, place_name[p], e.msg);
            int64_t nd = 0;
            for (size_t i = 0; st == HM_OK && i < (size_t)SSTEP * (size_t)V; i++) nd += gpu[i] != g2[i];
            CHECKF(nd == 0, "%s %s: graph vs per-launch: %lld logits differ", label, place_name[p], (long long)nd);
        }
        hm_model_close(m);
    }
    free(gpu), free(g2), free(cpu[0]), free(cpu[1]);
    unlink(path);
}

int main(void) {
    const int rc = cuda_test_open("nothing to check without a device");
    if (rc >= 0) return rc;
    gpu_kernel_checks();
    hm_cuda_close(ctx);
    ctx = NULL;
    run_synth("f32", false);
    run_synth("q8_0", true);
    return test_done();
}
