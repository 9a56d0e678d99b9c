/* test_ppmodel_gpu.c - the prompt-processing hand-over with GPU placements (issue 25): the copy
 * evaluates in a session of its own and hm_exec_state_copy moves its positions between the device
 * chains (or host and device). On the synth tiny qwen3moe (main q8_0, copy q4_0, one seed) and the
 * tests' tiny qwen35moe (main f32, copy q8_0: a recurrent state):
 *  - the copy equal to the main model (the same file opened twice, both on the GPU): logits after
 *    the copy's prefill and the main model's decode steps are byte-identical to the main model
 *    alone on the GPU;
 *  - main on the GPU, the q4_0 copy on the GPU, vs the same two on the CPU (the shared state, which
 *    test_ppmodel.c checks against the copy's own session byte for byte): within the GPU path's
 *    tolerance of the CPU (relative max |diff| <= BOUND), and the same argmax at every step;
 *  - main on the GPU, the copy on the CPU (host -> device) and the reverse: the same bound;
 *  - the main model's store counted the copy's routing (the warm hand-over), and with a VRAM budget
 *    its slots are in use after the prefill (the policy placed the prompt's hot units).
 * Skips (77) without a device. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu_compare.h"
#include "hotmoe_tools.h"
#include "test.h"
#include "tiny_qwen35moe.h"

#define NP 48
#define ND 8
#define BOUND 2e-2 /* relative to max(1, max |logit|): the GPU's quantised-activation kernels vs the CPU's */

enum { CPU = 0, GPU_ALL = 1, GPU_BUDGET = 2 };

static hm_model *open_at(const char *path, int where) {
    hm_placement_opts po;
    hm_placement_opts_default(&po);
    if (where != CPU) {
        po.n_gpu_layers = 99;
        po.n_ctx = 128;
        if (where == GPU_BUDGET) {
            po.vram_budget = 1 << 20; /* a few slots: the policy must choose */
            po.policy = "online";
        }
    }
    hm_model_opts mo;
    hm_model_opts_default(&mo);
    mo.placement = &po;
    hm_model *m = NULL;
    hm_err err = {{0}};
    CHECKF(hm_model_open(&m, path, &mo, &err) == HM_OK, "open %s: %s", path, err.msg);
    return m;
}

/* prefill tok through the copy (pp NULL: the main model), then ND decode steps; logits to out. ps
 * (may be NULL): the hand-over's stats; used_after: VRAM slots in use right after the prefill. */
static int run_x(hm_model *m, hm_model *pp, bool warm, const int32_t *tok, const int32_t *dec, float *out, int32_t V,
                 hm_pp_stats *ps, int64_t *used_after) {
    hm_session_opts so;
    hm_session_opts_default(&so);
    so.n_ctx = 128;
    so.n_ubatch = 16;
    hm_session *s = NULL;
    hm_err err = {{0}};
    const float *lg = NULL;
    int rc = -1;
    if (hm_session_open(&s, m, &so, &err) != HM_OK) goto done;
    if (pp) {
        hm_pp_opts o;
        hm_pp_opts_default(&o);
        o.model = pp;
        o.min_tokens = 1;
        o.no_warm = !warm;
        if (hm_session_set_pp(s, &o, &err) != HM_OK) goto done;
    }
    if (hm_session_prefill(s, tok, NP, &lg, &err) != HM_OK) goto done;
    if (ps) hm_session_pp_stats(s, ps);
    if (used_after) {
        hm_usage u;
        *used_after = -1;
        if (hm_model_usage(m, &u, &err) == HM_OK) {
            *used_after = u.vram_slots_used;
            hm_usage_free(&u);
        }
    }
    for (int i = 0; i < ND; i++) {
        if (hm_session_eval(s, &dec[i], 1, false, &lg, &err) != HM_OK) goto done;
        memcpy(out + (size_t)i * (size_t)V, lg, (size_t)V * sizeof(float));
    }
    rc = 0;
done:
    if (rc) fprintf(stderr, "run: %s\n", err.msg);
    hm_session_close(s);
    return rc;
}

static int run(hm_model *m, hm_model *pp, const int32_t *tok, const int32_t *dec, float *out, int32_t V) {
    return run_x(m, pp, true, tok, dec, out, V, NULL, NULL);
}

static double rel_diff(const float *a, const float *b, size_t n) {
    double md = 0, mx = 1;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - (double)b[i]);
        if (d > md) md = d;
        if (fabs((double)b[i]) > mx) mx = fabs((double)b[i]);
    }
    return md / mx;
}

static bool same_argmax(const float *a, const float *b, int32_t V) {
    for (int i = 0; i < ND; i++) {
        const float *x = a + (size_t)i * (size_t)V, *y = b + (size_t)i * (size_t)V;
        int32_t ia = 0, ib = 0;
        for (int32_t j = 1; j < V; j++) {
            if (x[j] > x[ia]) ia = j;
            if (y[j] > y[ib]) ib = j;
        }
        if (ia != ib) return false;
    }
    return true;
}

static void pair_case(const char *label, const char *main_path, const char *pp_path) {
    fprintf(stderr, "--- %s\n", label);
    hm_model *mc = open_at(main_path, CPU), *pc = open_at(pp_path, CPU);
    hm_model *mg = open_at(main_path, GPU_ALL), *pg = open_at(pp_path, GPU_ALL), *sg = open_at(main_path, GPU_ALL);
    if (!mc || !pc || !mg || !pg || !sg) goto out;
    const int32_t V = hm_model_n_vocab(mc);
    int32_t tok[NP], dec[ND];
    for (int i = 0; i < NP; i++) tok[i] = 2 + (i * 37 + 11) % (V - 4);
    for (int i = 0; i < ND; i++) dec[i] = 3 + (i * 53 + 7) % (V - 4);
    const size_t n = (size_t)ND * (size_t)V;
    float *ref = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float)), *alone = malloc(n * sizeof(float));
    if (!ref || !got || !alone) goto free_bufs;

    /* the copy = the main model, both on the GPU: byte-identical with the main model alone */
    if (run(mg, NULL, tok, dec, alone, V) == 0 && run(mg, sg, tok, dec, got, V) == 0)
        CHECKF(!memcmp(alone, got, n * sizeof(float)), "%s: GPU copy = main changed the logits (rel %.3g)", label,
               rel_diff(got, alone, n));
    else
        CHECK(0);
    /* the CPU reference: the shared state (test_ppmodel.c) */
    CHECK(run(mc, pc, tok, dec, ref, V) == 0);
    const struct { hm_model *m, *pp; const char *what; } cases[] = {
        {mg, pg, "main GPU, copy GPU"}, {mg, pc, "main GPU, copy CPU"}, {mc, pg, "main CPU, copy GPU"}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        if (run(cases[k].m, cases[k].pp, tok, dec, got, V) != 0) {
            CHECKF(0, "%s: %s failed", label, cases[k].what);
            continue;
        }
        const double d = rel_diff(got, ref, n);
        fprintf(stderr, "  %s: rel max |diff| vs the CPU %.3g\n", cases[k].what, d);
        CHECKF(d <= BOUND, "%s: %s: %.3g", label, cases[k].what, d);
        CHECKF(same_argmax(got, ref, V), "%s: %s: another argmax", label, cases[k].what);
    }
    /* warm hand-over into a VRAM budget: the main store counted the prompt, the residency was
     * re-planned from its counts and its slots hold units right after the prefill; without the warm
     * hand-over none (an online store starts empty); the logits are the same either way */
    {
        hm_model *mc2 = open_at(main_path, GPU_BUDGET);
        int64_t used_cold = -1;
        if (!mc2 || run_x(mc2, pg, false, tok, dec, alone, V, NULL, &used_cold) != 0) CHECK(0);
        hm_model_close(mc2);
        hm_model *mb = open_at(main_path, GPU_BUDGET);
        hm_pp_stats ps;
        int64_t used_warm = -1;
        if (mb && run_x(mb, pg, true, tok, dec, got, V, &ps, &used_warm) == 0) {
            fprintf(stderr, "  VRAM slots used after the prefill: %lld warm, %lld cold; %llu re-plans\n",
                    (long long)used_warm, (long long)used_cold, (unsigned long long)ps.replans);
            CHECKF(ps.replans >= 1 && used_warm > 0 && used_cold == 0, "%s: warm %lld, cold %lld slots used", label,
                   (long long)used_warm, (long long)used_cold);
            CHECKF(rel_diff(got, alone, n) <= BOUND && same_argmax(got, alone, V),
                   "%s: the warm hand-over changed the logits beyond the bound", label);
            hm_usage u;
            hm_err err = {{0}};
            if (hm_model_usage(mb, &u, &err) == HM_OK) {
                CHECKF(u.prompt_tokens == NP, "%s: the main store counted %llu prompt tokens", label,
                       (unsigned long long)u.prompt_tokens);
                CHECKF(u.vram_slots > 0 && u.vram_slots_used > 0, "%s: %lld of %lld slots used", label,
                       (long long)u.vram_slots_used, (long long)u.vram_slots);
                hm_usage_free(&u);
            }
        } else {
            CHECK(0);
        }
        hm_model_close(mb);
    }
free_bufs:
    free(ref);
    free(got);
    free(alone);
out:
    hm_model_close(sg);
    hm_model_close(pg);
    hm_model_close(mg);
    hm_model_close(pc);
    hm_model_close(mc);
}

int main(void) {
    if (!gpu_compare_have_device()) return 77;
    char a[128], b[128];
    snprintf(a, sizeof a, "/tmp/hm_ppgpu_q8.%d.gguf", (int)getpid());
    snprintf(b, sizeof b, "/tmp/hm_ppgpu_q4.%d.gguf", (int)getpid());
    hm_err err = {{0}};
    hm_synth_opts o = {.preset = "tiny", .type = "q8_0", .seed = 3, .out_path = a, .n_threads = 4};
    CHECKF(hm_synth(&o, &err) == HM_OK, "synth: %s", err.msg);
    o.type = "q4_0";
    o.out_path = b;
    CHECKF(hm_synth(&o, &err) == HM_OK, "synth: %s", err.msg);
    pair_case("qwen3moe q8_0 + q4_0", a, b);
    CHECKF(tq35_write(a, 4, HM_TYPE_F32, "tiny qwen35moe (test_ppmodel_gpu)", &err) == HM_OK, "%s", err.msg);
    CHECKF(tq35_write(b, 4, HM_TYPE_Q8_0, "tiny qwen35moe (test_ppmodel_gpu)", &err) == HM_OK, "%s", err.msg);
    pair_case("qwen35moe f32 + q8_0", a, b);
    unlink(a);
    unlink(b);
    return test_done();
}
