/* test_moe_archs_gpu.c - glm4moe, olmoe and llama-with-experts (Mixtral) on the GPU against the CPU
 * engine (which tests/cli_llama_ref_moe_archs.sh holds to llama.cpp), and the ops they brought to
 * CUDA (cuda_rope_bias.cu) against double-precision scalar references written here.
 *
 * Kernels (random inputs): hm_cuda_rope_norm_ff (pairs 2i, 2i + 1) over part of a head (n_rot 32
 * of 64) without frequency factors and over a whole head with them; hm_cuda_add_bias. Bound: max
 * error 1e-5 relative to the largest reference value (f32 math against double).
 *
 * Models: synth glm4moe-tiny (a dense layer, sigmoid routing with score bias over 4 groups of which
 * 2 are kept, routed scale 2.5, a shared expert, q/k/v biases, q/k norms, partial NEOX RoPE, a
 * NextN layer that is not run), olmoe-tiny (whole-projection q/k norms, softmax top-k without
 * renormalisation) and mixtral-tiny (normal RoPE pairs, 8 experts k 2), each F32 and Q4_K_M. The
 * CPU runs two sequences (gpu_compare_ref_pd): P, a 40-token prompt (the GPU's prefill path: bf16
 * tensor-core matmuls) and 8 greedy decode steps; D, a 6-token prompt (the exact-f32 matvec path)
 * and 8 steps. Each placement then runs P and D on the GPU with the CPU's tokens: -ngl 99 (every
 * unit in VRAM), --cpu-moe (none) and --vram-budget ~30 % of the units with lru (hot and cold
 * units in one layer, units moving between steps). Bounds, as test_qwen3moe_gpu.c derives them:
 * F32 D NMSE 1e-7 (summation order, expf, a rare f16 KV rounding flip), F32 P 1e-4 (bf16 prefill),
 * Q4_K_M 3e-4 (the CPU's Q8 activation rounding); argmax equal unless a near-tie (gpu_compare.h).
 * Store: per layer hits + misses = rows x k on the MoE layers, nothing on glm4moe's dense layer;
 * --cpu-moe no hits, -ngl 99 no misses. D under -ngl 99 and --cpu-moe again with
 * HOTMOE_CUDA_GRAPH=0: the per-launch path must give bit-identical logits to the decode graph.
 * Exits 77 ("skipped: no GPU") without a CUDA device. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu_compare.h"
#include "hotmoe.h"
#include "test.h"
/* last: its file-scope `err` would shadow the parameters of the helpers above */
#include "cuda_test.h"

#define NP 40
#define ND 6
#define NDEC 8
#define NSTEP (1 + NDEC)
#define NMSE_F32_EXACT 1e-7
#define NMSE_BF16 1e-4
#define NMSE_Q8 3e-4
#define KERN_REL 1e-5

/* ==== kernels ==== */

static float frand(uint64_t *s) { return (float)((double)(xorshift64(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0); }

static void *dev_copy(const void *h, size_t n) {
    void *d = NULL;
    CK(hm_cuda_alloc(ctx, n, &d, &err));
    CK(hm_cuda_upload(ctx, d, h, n, &err));
    return d;
}

static double rel_err(const float *g, const double *r, size_t n) {
    double md = 0, mr = 1e-30;
    for (size_t i = 0; i < n; i++) {
        md = fmax(md, fabs((double)g[i] - r[i]));
        mr = fmax(mr, fabs(r[i]));
    }
    return md / mr;
}

static void check_rope_norm(int n_rot, bool with_ff) {
    const int n_tok = 5, n_head = 3, hd = 64, half = n_rot / 2;
    const size_t n = (size_t)n_tok * n_head * hd;
    uint64_t seed = 99;
    float *x = xmalloc(n * 4), ff[32];
    double *r = xmalloc(n * 8);
    int32_t pos[5] = {0, 1, 17, 300, 4095};
    for (size_t i = 0; i < n; i++) x[i] = frand(&seed);
    for (int i = 0; i < half; i++) ff[i] = 1.0f + 0.25f * (float)i;
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < n_head; h++) {
            const float *v = x + ((size_t)t * n_head + h) * hd;
            double *o = r + ((size_t)t * n_head + h) * hd;
            for (int i = 0; i < hd; i++) o[i] = v[i];
            for (int i = 0; i < half; i++) {
                double a = (double)pos[t] * pow(1e4, -2.0 * i / n_rot);
                if (with_ff) a /= (double)ff[i];
                o[2 * i] = v[2 * i] * cos(a) - v[2 * i + 1] * sin(a);
                o[2 * i + 1] = v[2 * i] * sin(a) + v[2 * i + 1] * cos(a);
            }
        }
    float *xd = dev_copy(x, n * 4), *fd = dev_copy(ff, sizeof ff);
    int32_t *pd = dev_copy(pos, sizeof pos);
    CK(hm_cuda_rope_norm_ff(ctx, xd, n_tok, n_head, hd, n_rot, pd, 1e4f, with_ff ? fd : NULL, &err));
    CK(hm_cuda_download(ctx, x, xd, n * 4, &err));
    const double e = rel_err(x, r, n);
    printf("rope_norm_ff n_rot %d%s: rel err %.3g\n", n_rot, with_ff ? " with factors" : "", e);
    CHECKF(e <= KERN_REL, "rope_norm_ff n_rot %d: rel err %.3g", n_rot, e);
    hm_cuda_free(ctx, xd);
    hm_cuda_free(ctx, fd);
    hm_cuda_free(ctx, pd);
    free(x);
    free(r);
}

static void check_add_bias(void) {
    const int64_t rows = 7, w = 300;
    uint64_t seed = 5;
    float *a = xmalloc((size_t)(rows * w) * 4), b[300];
    double *r = xmalloc((size_t)(rows * w) * 8);
    for (int64_t i = 0; i < rows * w; i++) a[i] = frand(&seed);
    for (int64_t i = 0; i < w; i++) b[i] = frand(&seed);
    for (int64_t i = 0; i < rows * w; i++) r[i] = (double)a[i] + (double)b[i % w];
    float *ad = dev_copy(a, (size_t)(rows * w) * 4), *bd = dev_copy(b, sizeof b);
    CK(hm_cuda_add_bias(ctx, ad, bd, rows, w, &err));
    CK(hm_cuda_download(ctx, a, ad, (size_t)(rows * w) * 4, &err));
    const double e = rel_err(a, r, (size_t)(rows * w));
    printf("add_bias: rel err %.3g\n", e);
    CHECKF(e <= KERN_REL, "add_bias: rel err %.3g", e);
    hm_cuda_free(ctx, ad);
    hm_cuda_free(ctx, bd);
    free(a);
    free(r);
}

/* ==== models ==== */

typedef struct ref {
    int32_t n_vocab, n_layer, k;
    int32_t toks_p[NP + NDEC], toks_d[ND + NDEC];
    float *lp, *ld;
    uint64_t unit_bytes, n_units;
} ref;

typedef enum place { P_ALL, P_CPU_MOE, P_LRU } place;
static const char *place_name[] = {"-ngl 99", "--cpu-moe", "--vram-budget 30% lru"};

static void run_placement(const char *path, const char *label, const ref *r, place p, bool quant, int32_t n_dense) {
    hm_placement_opts po;
    hm_placement_opts_default(&po);
    po.n_gpu_layers = 99;
    po.n_ctx = 64;
    if (p == P_CPU_MOE) po.cpu_moe = true;
    if (p == P_LRU) {
        po.vram_budget = (int64_t)((r->n_units * 3 + 9) / 10) * (int64_t)(r->unit_bytes + 3 * 256);
        po.policy = "lru";
    }
    hm_model_opts mo;
    memset(&mo, 0, sizeof mo);
    mo.placement = &po;
    hm_err e = {{0}};
    hm_model *m = NULL;
    hm_status st = hm_model_open(&m, path, &mo, &e);
    CHECKF(st == HM_OK, "%s %s: open: %s", label, place_name[p], e.msg);
    if (st != HM_OK) return;
    const int32_t V = r->n_vocab;
    float *g = malloc((size_t)NSTEP * (size_t)V * sizeof(float));
    int32_t tp[NP + NDEC], td[ND + NDEC];
    memcpy(tp, r->toks_p, sizeof tp);
    memcpy(td, r->toks_d, sizeof td);
    char what[160];
    snprintf(what, sizeof what, "%s %s P (prefill %d)", label, place_name[p], NP);
    st = gpu_compare_run_fresh(m, 64, 0, tp, NP, NDEC, false, g, V, &e);
    CHECKF(st == HM_OK, "%s: %s", what, e.msg);
    const double wp = st == HM_OK ? gpu_compare_logits(what, g, r->lp, NSTEP, V, quant ? NMSE_Q8 : NMSE_BF16) : -1;
    snprintf(what, sizeof what, "%s %s D (prompt %d)", label, place_name[p], ND);
    st = gpu_compare_run_fresh(m, 64, 0, td, ND, NDEC, false, g, V, &e);
    CHECKF(st == HM_OK, "%s: %s", what, e.msg);
    const double wd = st == HM_OK ? gpu_compare_logits(what, g, r->ld, NSTEP, V, quant ? NMSE_Q8 : NMSE_F32_EXACT) : -1;

    hm_usage u;
    memset(&u, 0, sizeof u);
    st = hm_model_usage(m, &u, &e);
    CHECKF(st == HM_OK, "%s usage: %s", label, e.msg);
    uint64_t hits = 0, misses = 0;
    for (int32_t l = 0; st == HM_OK && l < r->n_layer; l++) {
        const uint64_t rows = l + 1 < r->n_layer ? (uint64_t)(NP + ND + 2 * NDEC) : (uint64_t)(2 * NSTEP);
        const uint64_t h = u.layer_hits[l], mi = u.layer_misses[l];
        hits += h;
        misses += mi;
        const uint64_t want = l < n_dense ? 0 : rows * (uint64_t)r->k;
        CHECKF(h + mi == want, "%s %s layer %d: %llu hits + %llu misses, want %llu", label, place_name[p], l,
               (unsigned long long)h, (unsigned long long)mi, (unsigned long long)want);
    }
    if (st == HM_OK) {
        if (p == P_CPU_MOE) CHECKF(hits == 0, "%s --cpu-moe: %llu hits", label, (unsigned long long)hits);
        if (p == P_ALL) CHECKF(misses == 0, "%s -ngl 99: %llu misses", label, (unsigned long long)misses);
        if (p == P_LRU) CHECKF(hits > 0 && misses > 0, "%s lru: %llu hits, %llu misses", label,
                               (unsigned long long)hits, (unsigned long long)misses);
        fprintf(stderr, "%s %-22s NMSE P %.3g, D %.3g; %llu hits, %llu misses, %llu swaps in\n", label,
                place_name[p], wp, wd, (unsigned long long)hits, (unsigned long long)misses,
                (unsigned long long)u.swaps_in);
    }
    hm_usage_free(&u);
    if (p != P_LRU && wd >= 0) { /* the decode graph against the per-launch path: bit-identical */
        float *g2 = malloc((size_t)NSTEP * (size_t)V * sizeof(float));
        memcpy(td, r->toks_d, sizeof td);
        setenv("HOTMOE_CUDA_GRAPH", "0", 1);
        hm_status st2 = gpu_compare_run_fresh(m, 64, 0, td, ND, NDEC, false, g2, V, &e);
        unsetenv("HOTMOE_CUDA_GRAPH");
        CHECKF(st2 == HM_OK, "%s without graphs: %s", what, e.msg);
        if (st2 == HM_OK && g2) {
            int64_t ndiff = 0;
            for (size_t i = 0; i < (size_t)NSTEP * (size_t)V; i++) ndiff += g[i] != g2[i];
            CHECKF(ndiff == 0, "%s: graph vs per-launch decode: %lld logits differ", what, (long long)ndiff);
        }
        free(g2);
    }
    free(g);
    hm_model_close(m);
}

static void run_model(const char *arch, const char *preset, const char *type, int32_t n_dense) {
    char path[] = "/tmp/hm_maGPU_XXXXXX", label[64];
    if (!gpu_compare_synth(path, arch, preset, type, 11)) return;
    snprintf(label, sizeof label, "%s %s", preset, type);
    const bool quant = strcmp(type, "f32") != 0;
    ref r;
    memset(&r, 0, sizeof r);
    hm_err e = {{0}};
    hm_model *m = gpu_compare_open_cpu(path, label, &r.n_vocab, &r.n_layer, &r.k, &r.unit_bytes, &r.n_units, &e);
    if (m) {
        gpu_compare_ref_pd(m, label, 0x2545f4914f6cdd1dull, r.n_vocab, r.toks_p, NP, r.toks_d, ND, NDEC, &r.lp, &r.ld,
                           &e);
        hm_model_close(m);
        for (int p = P_ALL; p <= P_LRU; p++) run_placement(path, label, &r, (place)p, quant, n_dense);
    }
    free(r.lp);
    free(r.ld);
    unlink(path);
}

int main(void) {
    int rc = cuda_test_open("no host part");
    if (rc >= 0) return rc;
    check_rope_norm(32, false);
    check_rope_norm(64, true);
    check_add_bias();
    hm_cuda_close(ctx);
    static const char *types[] = {"f32", "q4_k_m"};
    for (int t = 0; t < 2; t++) {
        run_model("glm4moe", "glm4moe-tiny", types[t], 1);
        run_model("olmoe", "olmoe-tiny", types[t], 0);
        run_model("llama", "mixtral-tiny", types[t], 0);
    }
    return test_done();
}
