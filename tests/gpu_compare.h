/* gpu_compare.h - shared helpers for the tests that run a model on the GPU and compare its logits
 * with the CPU engine's (test_qwen3moe_gpu.c, test_gpu_vram_degrade_gpu.c, test_multi_gpu_gpu.c,
 * test_gpu_ram_tier_gpu.c, test_gemma4_gpu.c):
 *   gpu_compare_have_device  false (after printing "skipped: no GPU") without a CUDA device
 *   gpu_compare_prompts      the two prompts from a seed: P random, D the end of P reversed
 *   gpu_compare_units        the model's unit size and count (to size a --vram-budget)
 *   gpu_compare_argmax       the first index of the largest logit
 *   gpu_compare_run          a prompt then n_dec single-token steps on a session, logits per step
 *   gpu_compare_run_fresh    gpu_compare_run on a fresh session of a model (n_ctx, n_ubatch given)
 *   gpu_compare_synth        a synthetic model (hm_synth) in a fresh /tmp file
 *   gpu_compare_open_cpu     the model opened on the CPU, with its shape (vocab, layers, k, units)
 *   gpu_compare_ref_pd       the CPU reference of two prompts P and D, each run greedily
 *   gpu_compare_logits       one run's logits against the reference's, step by step
 * The comparison rule, per step: NMSE = sum (g - c)^2 / sum c^2 at most the caller's bound (derived
 * from the numerics of what is compared), and the same argmax unless the reference's logits of the
 * two picks are closer than max(GPU_COMPARE_NEAR_TIE x max |logit|, 4 x the step's rms logit
 * difference): a near-tie the allowed rounding may break either way (then either may win).
 *
 * Typical use:
 *   if (!gpu_compare_have_device()) return 77;
 *   ... the CPU: gpu_compare_run(s, toks, np, NDEC, true, ref_logits, V, &err) (picks the decode tokens)
 *   ... the GPU: gpu_compare_run(s, toks, np, NDEC, false, g, V, &err) (feeds the same tokens)
 *   double worst = gpu_compare_logits("label", g, ref_logits, 1 + NDEC, V, bound);
 *
 * Everything is static inline; this includes test.h (the CHECKs count in the including test). */
#ifndef HM_TEST_GPU_COMPARE_H
#define HM_TEST_GPU_COMPARE_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cuda/cuda_device.h"
#include "hotmoe_tools.h"
#include "test.h"

#define GPU_COMPARE_NEAR_TIE 1e-3 /* logits closer than this (x max |logit|) may swap places */

/* With a CUDA device: prints device 0's name to stderr, returns true. Without: prints
 * "skipped: no GPU" to stdout, returns false (main then returns 77). */
static inline bool gpu_compare_have_device(void) {
    if (hm_cuda_device_count() == 0) {
        printf("skipped: no GPU\n");
        return false;
    }
    char name[256];
    if (hm_cuda_device_name(0, name, sizeof name) == 0) fprintf(stderr, "device 0: %s\n", name);
    return true;
}

/* p[0..np): tokens below n_vocab from an LCG started at seed; d[0..nd): p's last nd reversed
 * (nd <= np). */
static inline void gpu_compare_prompts(uint64_t seed, int32_t n_vocab, int32_t *p, int32_t np, int32_t *d,
                                       int32_t nd) {
    uint64_t rng = seed;
    for (int i = 0; i < np; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (int32_t)((rng >> 33) % (uint64_t)n_vocab);
    }
    for (int i = 0; i < nd; i++) d[i] = p[np - 1 - i];
}

/* From hm_model_usage: *unit_bytes (the largest unit: a slot) and *n_units (n_layer x n_expert); both left
 * as they are when usage fails (err says why). */
static inline void gpu_compare_units(hm_model *m, uint64_t *unit_bytes, uint64_t *n_units, hm_err *err) {
    hm_usage u;
    if (hm_model_usage(m, &u, err) == HM_OK) {
        *unit_bytes = u.unit_bytes;
        *n_units = (uint64_t)u.n_layer * (uint64_t)u.n_expert;
        hm_usage_free(&u);
    }
}

static inline int32_t gpu_compare_argmax(const float *x, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* On session s (as it is: the caller resets or opens it fresh): prompt toks[0..np) then n_dec single
 * tokens toks[np..np + n_dec), logits per step into out ([1 + n_dec][V]). greedy: the reference
 * picks toks[np + i] = argmax of step i's logits. Returns the first failing eval's status. */
static inline hm_status gpu_compare_run(hm_session *s, int32_t *toks, int32_t np, int32_t n_dec, bool greedy,
                                        float *out, int32_t V, hm_err *err) {
    for (int step = 0; step < 1 + n_dec; step++) {
        const float *lg = NULL;
        const int32_t *t = step == 0 ? toks : toks + np + step - 1;
        hm_status st = hm_session_eval(s, t, step == 0 ? np : 1, false, &lg, err);
        if (st != HM_OK) return st;
        memcpy(out + (size_t)step * (size_t)V, lg, (size_t)V * sizeof(float));
        if (greedy && step < n_dec) toks[np + step] = gpu_compare_argmax(lg, V);
    }
    return HM_OK;
}

/* gpu_compare_run on a fresh session of m (n_ctx, n_ubatch (0: the default), 4 threads, f16 KV cache),
 * closed after; the session open's status when that fails (err says why). */
static inline hm_status gpu_compare_run_fresh(hm_model *m, int32_t n_ctx, int32_t n_ubatch, int32_t *toks, int32_t np,
                                              int32_t n_dec, bool greedy, float *out, int32_t V, hm_err *err) {
    hm_session_opts so;
    hm_session_opts_default(&so);
    so.n_ctx = n_ctx;
    so.n_ubatch = n_ubatch;
    so.n_threads = 4;
    so.kv_type = HM_KV_F16;
    hm_session *s = NULL;
    hm_status st = hm_session_open(&s, m, &so, err);
    if (st != HM_OK) return st;
    st = gpu_compare_run(s, toks, np, n_dec, greedy, out, V, err);
    hm_session_close(s);
    return st;
}

/* A synthetic model (hm_synth of arch / preset / type / seed, 4 threads) in a fresh file: path is a
 * mkstemp template ("/tmp/hm_..._XXXXXX"), rewritten to the file's name. CHECKs the file and the
 * synth; false when either fails (the file, if made, is removed then). */
static inline bool gpu_compare_synth(char *path, const char *arch, const char *preset, const char *type,
                                     uint64_t seed) {
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return false;
    close(fd);
    hm_synth_opts so = {.arch = arch, .preset = preset, .type = type, .seed = seed, .out_path = path,
                        .n_threads = 4};
    hm_err err = {{0}};
    hm_status st = hm_synth(&so, &err);
    CHECKF(st == HM_OK, "synth %s %s: %s", preset, type, err.msg);
    if (st != HM_OK) unlink(path);
    return st == HM_OK;
}

/* path opened on the CPU (no placement; CHECKed, label naming it) and its shape: *V = n_vocab,
 * *n_layer, *k = n_expert_used, and gpu_compare_units' *unit_bytes / *n_units. NULL when the open
 * fails (err says why). */
static inline hm_model *gpu_compare_open_cpu(const char *path, const char *label, int32_t *V, int32_t *n_layer,
                                             int32_t *k, uint64_t *unit_bytes, uint64_t *n_units, hm_err *err) {
    hm_model *m = NULL;
    hm_status st = hm_model_open(&m, path, NULL, err);
    CHECKF(st == HM_OK, "%s: open on the CPU: %s", label, err->msg);
    if (st != HM_OK) return NULL;
    const hm_model_info *inf = hm_model_get_info(m);
    *V = inf->n_vocab;
    *n_layer = inf->n_layer;
    *k = inf->n_expert_used;
    gpu_compare_units(m, unit_bytes, n_units, err);
    return m;
}

/* The CPU reference of the two-prompt tests: prompts P (np tokens) and D (nd) from seed
 * (gpu_compare_prompts), each then n_dec greedy steps on a fresh session of m (gpu_compare_run_fresh,
 * n_ctx 64): toks_p / toks_d ([np + n_dec], [nd + n_dec]) get the picked tokens, *lp / *ld
 * (malloc'd here, [1 + n_dec][V]; the caller frees them) the logits per step. CHECKed, label naming
 * the model. */
static inline void gpu_compare_ref_pd(hm_model *m, const char *label, uint64_t seed, int32_t V, int32_t *toks_p,
                                      int32_t np, int32_t *toks_d, int32_t nd, int32_t n_dec, float **lp, float **ld,
                                      hm_err *err) {
    const size_t n = (size_t)(1 + n_dec) * (size_t)V;
    *lp = malloc(n * sizeof(float));
    *ld = malloc(n * sizeof(float));
    CHECK(*lp && *ld);
    if (!*lp || !*ld) return;
    gpu_compare_prompts(seed, V, toks_p, np, toks_d, nd);
    CHECKF(gpu_compare_run_fresh(m, 64, 0, toks_p, np, n_dec, true, *lp, V, err) == HM_OK, "%s CPU P: %s", label,
           err->msg);
    CHECKF(gpu_compare_run_fresh(m, 64, 0, toks_d, nd, n_dec, true, *ld, V, err) == HM_OK, "%s CPU D: %s", label,
           err->msg);
}

/* Compare one run's logits g with the reference's c ([n_step][V] each), step by step, by the rule
 * above: one CHECK each for the NMSE and the argmax, what naming the run. Returns the worst NMSE. */
static inline double gpu_compare_logits(const char *what, const float *g, const float *c, int n_step, int32_t V,
                                        double bound) {
    double worst = 0;
    for (int step = 0; step < n_step; step++) {
        const float *gs = g + (size_t)step * (size_t)V, *cs = c + (size_t)step * (size_t)V;
        double num = 0, den = 0, mx = 1;
        for (int32_t i = 0; i < V; i++) {
            const double d = (double)gs[i] - (double)cs[i];
            num += d * d;
            den += (double)cs[i] * (double)cs[i];
            if (fabs((double)cs[i]) > mx) mx = fabs((double)cs[i]);
        }
        const double nmse = den > 0 ? num / den : num;
        if (nmse > worst) worst = nmse;
        CHECKF(nmse <= bound, "%s step %d: NMSE %.3g > %.3g", what, step, nmse, bound);
        /* a different argmax only where the reference's top two are closer than the noise allowed */
        const int32_t ag = gpu_compare_argmax(gs, V), ac = gpu_compare_argmax(cs, V);
        const double tie = fmax(GPU_COMPARE_NEAR_TIE * mx, 4.0 * sqrt(num / V));
        CHECKF(ag == ac || (double)cs[ac] - (double)cs[ag] <= tie,
               "%s step %d: argmax %d (GPU) vs %d (CPU), CPU logits %.6g vs %.6g", what, step, ag, ac,
               (double)cs[ag], (double)cs[ac]);
    }
    return worst;
}

#endif
