/* test_multi_gpu_gpu.c - a qwen3moe model (and gemma4, qwen35moe: gemma4_split, qwen35moe_split
 * below) split over two GPUs (issue 11: -ts, --vram-budget per device; model_gpu.h) against the
 * CPU engine and against one GPU, through the public API.
 *
 * Models: the tiny qwen3moe synth (4 layers, 16 experts, k 4), F32 and Q4_K_M. The CPU engine
 * runs the two sequences of test_qwen3moe_gpu.c (P: a 40-token prompt, the prefill path, then 8
 * decode steps; D: a 6-token prompt, the decode path throughout, then 8 steps) and keeps its
 * logits per step. Placements on devices 0 and 1:
 *   (a) -ts 1,1 -ngl 99: layers 0-2 on device 0, 3 and the output on device 1 (llama.cpp's split:
 *       a layer il goes to the first device whose cumulative share exceeds il / 5), every unit on
 *       its layer's device. The same kernels run in the same order as on one GPU with -ngl 99,
 *       only on two devices with the residual copied across: P and D logits must be
 *       BIT-IDENTICAL to one GPU's (and within test_qwen3moe_gpu's bounds of the CPU's).
 *   (b) -ts 1,1 --n-cpu-moe 3: layer 3's units in device 1's slots, the rest on the CPU; layers
 *       0-2 no hits, layer 3 no misses (llama.cpp's layer placement per device).
 *   (c) --vram-budget 0:B,1:B (B = 15 % of the units each) static from the CPU run's profile:
 *       hits and misses, every slot of both devices used (device 1's one layer is the last, whose
 *       units the profile counts least: its slots fill with device 0's layers' units as peers).
 *   (d) the same budgets with lru (units move between steps, fills land mid-run).
 *   (e) -ts 7,3 -ngl 99: every layer on device 0, the output alone on device 1 (llama.cpp's split
 *       of 4 layers + output at 0.7): bit-identical to one GPU again.
 *   (f) --vram-budget 0:5%,1:40% static: device 1 has more slots than its one layer's 16 units, so
 *       device 0's layers' hottest units that device 0 has no room for go there as PEER units
 *       (computed on device 1 from the rows sent over, the sum sent back): usage shows peer units
 *       on device 1 only; (g) the same with --no-peer-experts: none, device 1 holds <= 16.
 * Each: NMSE and argmax against the CPU by gpu_compare.h's rule with test_qwen3moe_gpu's bounds
 * (F32: P 1e-4 (bf16 prefill), D 1e-7; Q4_K_M: 3e-4); the store's per-layer hits + misses = rows x k;
 * hm_model_usage's per-device slots (each device's units in its own slots: used <= slots, and
 * hits only in layers whose device has slots); D again with HOTMOE_CUDA_GRAPH=0 bit-identical to
 * the graph's decode (all but lru). Also a budget naming device 7 is HM_ERR_ARG.
 * Exits 77 ("skipped: fewer than 2 GPUs") with fewer than two CUDA devices. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "gpu_compare.h"
#include "hotmoe_tools.h"
#include "quant/quant.h"
#include "test.h"
#include "tiny_qwen35moe.h"

#define NP 40
#define ND 6
#define NDEC 8
#define NSTEP (1 + NDEC)
#define NMSE_F32_EXACT 1e-7
#define NMSE_BF16 1e-4
#define NMSE_Q8 3e-4

typedef struct ref {
    int32_t n_vocab, n_layer, k;
    int32_t toks_p[NP + NDEC], toks_d[ND + NDEC];
    float *lp, *ld;   /* the CPU's logits per step of P and D */
    float *gp, *gd;   /* one GPU's (-ngl 99) */
    uint64_t unit_bytes, n_units;
} ref;

/* Prompt toks[0..np) then NDEC single tokens on a fresh session (n_ctx 64), logits per step into out. */
static hm_status run_seq(hm_model *m, int32_t *toks, int32_t np, bool greedy, float *out, int32_t V, hm_err *err) {
    return gpu_compare_run_fresh(m, 64, 0, toks, np, NDEC, greedy, out, V, err);
}

typedef enum place { P_ONE, P_TS_ALL, P_TS_NCMOE, P_BUDGET_STATIC, P_BUDGET_LRU, P_OUT_ALONE, P_PEER, P_NO_PEER } place;
static const char *place_name[] = {"one GPU -ngl 99", "-ts 1,1 -ngl 99", "-ts 1,1 --n-cpu-moe 3",
                                   "--vram-budget 0:15%,1:15% static", "--vram-budget 0:15%,1:15% lru",
                                   "-ts 7,3 -ngl 99 (output alone)", "--vram-budget 0:5%,1:40% static",
                                   "--vram-budget 0:5%,1:40% static --no-peer-experts"};

static int64_t count_diff(const float *a, const float *b, size_t n) {
    int64_t d = 0;
    for (size_t i = 0; i < n; i++) d += a[i] != b[i];
    return d;
}

static void run_placement(const char *path, const char *label, ref *r, place p, const char *profile, bool quant) {
    hm_placement_opts po;
    hm_placement_opts_default(&po);
    po.n_gpu_layers = 99;
    po.n_ctx = 64;
    const int64_t slot = (int64_t)(r->unit_bytes + 3 * 256);
    const int64_t budget = (int64_t)((r->n_units * 15 + 99) / 100) * slot;
    switch (p) {
    case P_ONE: break;
    case P_TS_ALL:
        po.tensor_split[0] = po.tensor_split[1] = 1.0f;
        po.n_tensor_split = 2;
        break;
    case P_TS_NCMOE:
        po.tensor_split[0] = po.tensor_split[1] = 1.0f;
        po.n_tensor_split = 2;
        po.n_cpu_moe = 3;
        break;
    case P_BUDGET_STATIC:
    case P_BUDGET_LRU:
        po.vram_budgets[0] = (hm_gpu_budget){.device = 0, .bytes = budget};
        po.vram_budgets[1] = (hm_gpu_budget){.device = 1, .bytes = budget};
        po.n_vram_budgets = 2;
        po.policy = p == P_BUDGET_STATIC ? "static" : "lru";
        if (p == P_BUDGET_STATIC) po.profile = profile;
        break;
    case P_PEER:
    case P_NO_PEER:
        /* device 1 runs one layer (16 units) but gets 40 % of all units' slots: with peer units
         * the rest of its slots take device 0's layers' hottest units that device 0 (5 %) has no
         * room for */
        po.vram_budgets[0] = (hm_gpu_budget){.device = 0, .bytes = (int64_t)((r->n_units * 5 + 99) / 100) * slot};
        po.vram_budgets[1] = (hm_gpu_budget){.device = 1, .bytes = (int64_t)((r->n_units * 40 + 99) / 100) * slot};
        po.n_vram_budgets = 2;
        po.policy = "static";
        po.profile = profile;
        po.no_peer = p == P_NO_PEER;
        break;
    case P_OUT_ALONE:
        po.tensor_split[0] = 7.0f;
        po.tensor_split[1] = 3.0f;
        po.n_tensor_split = 2;
        break;
    }
    hm_model_opts mo;
    memset(&mo, 0, sizeof mo);
    mo.placement = &po;
    hm_err err = {{0}};
    hm_model *m = NULL;
    hm_status st = hm_model_open(&m, path, &mo, &err);
    CHECKF(st == HM_OK, "%s %s: open: %s", label, place_name[p], err.msg);
    if (st != HM_OK) return;
    const int32_t V = r->n_vocab;
    const size_t NV = (size_t)NSTEP * (size_t)V;
    float *g = malloc(NV * sizeof(float)), *g2 = malloc(NV * sizeof(float));
    int32_t tp[NP + NDEC], td[ND + NDEC];
    memcpy(tp, r->toks_p, sizeof tp);
    memcpy(td, r->toks_d, sizeof td);
    char what[160];

    snprintf(what, sizeof what, "%s %s P", label, place_name[p]);
    st = run_seq(m, tp, NP, false, g, V, &err);
    CHECKF(st == HM_OK, "%s: %s", what, err.msg);
    double wp = -1, wd = -1;
    if (st == HM_OK) {
        wp = gpu_compare_logits(what, g, r->lp, NSTEP, V, quant ? NMSE_Q8 : NMSE_BF16);
        if (p == P_ONE) memcpy(r->gp, g, NV * sizeof(float));
        if (p == P_TS_ALL || p == P_OUT_ALONE)
            CHECKF(count_diff(g, r->gp, NV) == 0, "%s: %lld logits differ from one GPU's", what,
                   (long long)count_diff(g, r->gp, NV));
    }
    snprintf(what, sizeof what, "%s %s D", label, place_name[p]);
    st = run_seq(m, td, ND, false, g, V, &err);
    CHECKF(st == HM_OK, "%s: %s", what, err.msg);
    if (st == HM_OK) {
        wd = gpu_compare_logits(what, g, r->ld, NSTEP, V, quant ? NMSE_Q8 : NMSE_F32_EXACT);
        if (p == P_ONE) memcpy(r->gd, g, NV * sizeof(float));
        if (p == P_TS_ALL || p == P_OUT_ALONE)
            CHECKF(count_diff(g, r->gd, NV) == 0, "%s: %lld logits differ from one GPU's", what,
                   (long long)count_diff(g, r->gd, NV));
    }

    hm_usage u;
    memset(&u, 0, sizeof u);
    st = hm_model_usage(m, &u, &err);
    CHECKF(st == HM_OK, "%s usage: %s", label, err.msg);
    if (st == HM_OK) {
        const int want_gpus = p == P_ONE ? 1 : 2;
        CHECKF(u.n_gpus == want_gpus && u.layer_gpu, "%s %s: %d GPUs in the usage, want %d", label, place_name[p],
               (int)u.n_gpus, want_gpus);
        uint64_t hits = 0, misses = 0;
        for (int32_t l = 0; u.layer_gpu && l < r->n_layer; l++) {
            const uint64_t rows = l + 1 < r->n_layer ? (uint64_t)(NP + ND + 2 * NDEC) : (uint64_t)(2 * NSTEP);
            const uint64_t h = u.layer_hits[l], mi = u.layer_misses[l];
            hits += h, misses += mi;
            CHECKF(h + mi == rows * (uint64_t)r->k, "%s %s layer %d: %llu hits + %llu misses, want %llu x %d", label,
                   place_name[p], l, (unsigned long long)h, (unsigned long long)mi, (unsigned long long)rows, r->k);
            /* 1,1 (and equal free VRAM, the split without -ts): layers 0-2 on device 0, 3 on 1 */
            const int32_t want_dev = p == P_ONE || p == P_OUT_ALONE ? 0 : (l < 3 ? 0 : 1);
            CHECKF(u.layer_gpu[l] == want_dev, "%s %s: layer %d on device %d, want %d", label, place_name[p], l,
                   (int)u.layer_gpu[l], (int)want_dev);
            if (p == P_TS_ALL || p == P_OUT_ALONE || p == P_ONE)
                CHECKF(mi == 0, "%s %s layer %d: %llu misses", label, place_name[p], l, (unsigned long long)mi);
            if (p == P_TS_NCMOE)
                CHECKF(l >= 3 ? mi == 0 : h == 0, "%s %s layer %d: %llu hits, %llu misses", label, place_name[p], l,
                       (unsigned long long)h, (unsigned long long)mi);
            /* a device without slots computes no hit of its layers */
            if (u.layer_gpu[l] >= 0 && u.layer_gpu[l] < u.n_gpus && u.gpu_slots[u.layer_gpu[l]] == 0)
                CHECKF(h == 0, "%s %s layer %d: %llu hits on a device without slots", label, place_name[p], l,
                       (unsigned long long)h);
        }
        int64_t used = 0;
        for (int32_t d = 0; d < u.n_gpus && d < HM_MAX_GPUS; d++) {
            CHECKF(u.gpu_slots_used[d] <= u.gpu_slots[d], "%s %s gpu %d: %lld of %lld slots used", label,
                   place_name[p], (int)d, (long long)u.gpu_slots_used[d], (long long)u.gpu_slots[d]);
            used += u.gpu_slots_used[d];
        }
        CHECKF(used == u.vram_slots_used, "%s %s: per-device used slots %lld, store %lld", label, place_name[p],
               (long long)used, (long long)u.vram_slots_used);
        if (p == P_TS_NCMOE)
            CHECKF(u.n_gpus == 2 && u.gpu_slots[0] == 0 && u.gpu_slots[1] > 0,
                   "%s %s: slots %lld / %lld, want 0 / > 0", label, place_name[p], (long long)u.gpu_slots[0],
                   (long long)u.gpu_slots[1]);
        if (p == P_PEER)
            CHECKF(u.n_gpus == 2 && u.gpu_peer[1] > 0 && u.gpu_peer[0] == 0 && u.gpu_slots_used[1] > 16,
                   "%s %s: device 1 holds %lld units, %lld of them peer (device 0: %lld peer)", label, place_name[p],
                   (long long)u.gpu_slots_used[1], (long long)u.gpu_peer[1], (long long)u.gpu_peer[0]);
        if (p == P_NO_PEER)
            CHECKF(u.n_gpus == 2 && u.gpu_peer[0] == 0 && u.gpu_peer[1] == 0 && u.gpu_slots_used[1] <= 16,
                   "%s %s: device 1 holds %lld units, %lld peer", label, place_name[p],
                   (long long)u.gpu_slots_used[1], (long long)u.gpu_peer[1]);
        if (p == P_BUDGET_STATIC || p == P_BUDGET_LRU) {
            CHECKF(u.n_gpus == 2 && u.gpu_slots[0] > 0 && u.gpu_slots[1] > 0 && hits > 0 && misses > 0,
                   "%s %s: slots %lld / %lld, %llu hits, %llu misses", label, place_name[p],
                   (long long)u.gpu_slots[0], (long long)u.gpu_slots[1], (unsigned long long)hits,
                   (unsigned long long)misses);
            /* with peer units (the default) a device's free slots take other devices' hot units:
             * every slot is used (the profile ranks more than 20 units) */
            if (p == P_BUDGET_STATIC)
                CHECKF(u.gpu_slots_used[0] == u.gpu_slots[0] && u.gpu_slots_used[1] == u.gpu_slots[1],
                       "%s %s: used %lld of %lld and %lld of %lld slots", label, place_name[p],
                       (long long)u.gpu_slots_used[0], (long long)u.gpu_slots[0], (long long)u.gpu_slots_used[1],
                       (long long)u.gpu_slots[1]);
        }
        fprintf(stderr,
                "%s %-36s NMSE P %.3g, D %.3g; slots %lld+%lld (used %lld+%lld, peer %lld+%lld), %llu hits, "
                "%llu misses\n",
                label, place_name[p], wp, wd, (long long)u.gpu_slots[0], (long long)u.gpu_slots[1],
                (long long)u.gpu_slots_used[0], (long long)u.gpu_slots_used[1], (long long)u.gpu_peer[0],
                (long long)u.gpu_peer[1], (unsigned long long)hits, (unsigned long long)misses);
    }
    hm_usage_free(&u);

    if (p != P_BUDGET_LRU && wd >= 0 && g2) {
        /* the graph's decode (one graph per device) vs the per-launch path: bit-identical */
        memcpy(td, r->toks_d, sizeof td);
        setenv("HOTMOE_CUDA_GRAPH", "0", 1);
        hm_status st2 = run_seq(m, td, ND, false, g2, V, &err);
        unsetenv("HOTMOE_CUDA_GRAPH");
        snprintf(what, sizeof what, "%s %s D without graphs", label, place_name[p]);
        CHECKF(st2 == HM_OK, "%s: %s", what, err.msg);
        if (st2 == HM_OK)
            CHECKF(count_diff(g, g2, NV) == 0, "%s: %lld of %lld logits differ from the graph's", what,
                   (long long)count_diff(g, g2, NV), (long long)NV);
    }
    free(g);
    free(g2);
    hm_model_close(m);
}

static void run_model(const char *type, bool quant) {
    char path[] = "/tmp/hm_mgpu_XXXXXX", prof[64];
    if (!gpu_compare_synth(path, "qwen3moe", "tiny", type, 11)) return;
    snprintf(prof, sizeof prof, "%s.profile.json", path);
    char label[32];
    snprintf(label, sizeof label, "tiny %s", type);
    ref r;
    memset(&r, 0, sizeof r);
    hm_err err = {{0}};
    hm_model *m = gpu_compare_open_cpu(path, label, &r.n_vocab, &r.n_layer, &r.k, &r.unit_bytes, &r.n_units, &err);
    if (m) {
        const size_t NV = (size_t)NSTEP * (size_t)r.n_vocab * sizeof(float);
        r.gp = malloc(NV), r.gd = malloc(NV);
        gpu_compare_ref_pd(m, label, 0x2545f4914f6cdd1dull, r.n_vocab, r.toks_p, NP, r.toks_d, ND, NDEC, &r.lp, &r.ld,
                           &err);
        CHECKF(hm_model_profile_save(m, prof, HM_PROFILE_FMT_HOTMOE, &err) == HM_OK, "profile: %s", err.msg);
        hm_model_close(m);
        CHECK(r.n_layer == 4);
        if (!test_failures_ && r.n_layer == 4)
            for (int p = P_ONE; p <= P_NO_PEER; p++) run_placement(path, label, &r, (place)p, prof, quant);
    }
    free(r.lp), free(r.ld), free(r.gp), free(r.gd);
    unlink(path);
    unlink(prof);
}

/* ---- gemma4 over two devices ----
 *
 * Synth gemma4-tiny (3 layers: 0 and 1 sliding, window 16, 2 global; test_gemma4_gpu's (b)), F32
 * and Q4_K_M: a 40-token prompt (> the window) and 16 decode steps, with n_ubatch 64 (the prefill
 * path, the ring as long as the context) and n_ubatch 8 (micro-batches on the decode path, the
 * sliding layers' ring of 24 rows wraps); the CPU engine's logits as the reference. Placements:
 *   -ts 1,1 -ngl 99: layers 0-1 (both sliding rings) on device 0, layer 2 (the global cache) and
 *     the output (soft-cap) on device 1; BIT-IDENTICAL to one GPU -ngl 99 in both runs, and the
 *     n_ubatch 8 run's decode graphs (one per device) bit-identical to HOTMOE_CUDA_GRAPH=0;
 *   -ts 7,3 -ngl 99: every layer on device 0, the output alone on device 1: bit-identical again;
 *   --vram-budget 0:30%,1:30% lru (of the units each): hot and cold units in one layer, units
 *     moving, peer units possible: within test_gemma4_gpu's bounds of the CPU's logits
 *     (F32: prefill 1e-4 (bf16), n_ubatch 8 1e-6 (exact path; Gemma's scale-1 attention);
 *     Q4_K_M 3e-4), per-layer hits + misses = rows x k, both devices with slots, hits and misses.
 * Every placement is also held to those bounds against the CPU. */
#define G4P 40
#define G4DEC 16
#define G4STEP (1 + G4DEC)
#define G4_NMSE_EXACT 1e-6

typedef enum g4place { G4_ONE, G4_TS, G4_OUT_ALONE, G4_LRU } g4place;
static const char *g4_place_name[] = {"one GPU -ngl 99", "-ts 1,1 -ngl 99", "-ts 7,3 -ngl 99 (output alone)",
                                      "--vram-budget 0:30%,1:30% lru"};

static hm_status g4_run(hm_model *m, int32_t n_ubatch, int32_t *toks, bool greedy, float *out, int32_t V,
                        hm_err *err) {
    return gpu_compare_run_fresh(m, 64, n_ubatch, toks, G4P, G4DEC, greedy, out, V, err);
}

static void gemma4_model(const char *type, bool quant) {
    char path[] = "/tmp/hm_mgpu_g4s_XXXXXX", label[40];
    if (!gpu_compare_synth(path, "gemma4", "gemma4-tiny", type, 21)) return;
    snprintf(label, sizeof label, "gemma4-tiny %s", type);
    hm_err err = {{0}};
    int32_t V = 0, n_layer = 0, K = 0;
    uint64_t unit_bytes = 0, n_units = 0;
    hm_model *m = gpu_compare_open_cpu(path, label, &V, &n_layer, &K, &unit_bytes, &n_units, &err);
    if (!m) {
        unlink(path);
        return;
    }
    hm_status st;
    const int32_t ub[2] = {64, 8};
    const size_t NV = (size_t)G4STEP * (size_t)V;
    int32_t toks[G4P + G4DEC], dummy[1];
    gpu_compare_prompts(0x9e3779b97f4a7c15ull, V, toks, G4P, dummy, 0);
    float *cpu[2], *one[2], *g = malloc(NV * sizeof(float)), *g2 = malloc(NV * sizeof(float));
    for (int i = 0; i < 2; i++) {
        cpu[i] = malloc(NV * sizeof(float));
        one[i] = malloc(NV * sizeof(float));
        /* the first run picks the decode tokens, the second feeds the same */
        CHECKF(g4_run(m, ub[i], toks, i == 0, cpu[i], V, &err) == HM_OK, "gemma4-tiny %s CPU n_ubatch %d: %s", type,
               ub[i], err.msg);
    }
    hm_model_close(m);
    CHECK(n_layer == 3);

    for (int p = G4_ONE; p <= G4_LRU && !test_failures_ && n_layer == 3; p++) {
        hm_placement_opts po;
        hm_placement_opts_default(&po);
        po.n_gpu_layers = 99;
        po.n_ctx = 64;
        if (p == G4_TS || p == G4_OUT_ALONE) {
            po.tensor_split[0] = p == G4_TS ? 1.0f : 7.0f;
            po.tensor_split[1] = p == G4_TS ? 1.0f : 3.0f;
            po.n_tensor_split = 2;
        }
        if (p == G4_LRU) {
            const int64_t b = (int64_t)((n_units * 3 + 9) / 10) * (int64_t)(unit_bytes + 3 * 256);
            po.vram_budgets[0] = (hm_gpu_budget){.device = 0, .bytes = b};
            po.vram_budgets[1] = (hm_gpu_budget){.device = 1, .bytes = b};
            po.n_vram_budgets = 2;
            po.policy = "lru";
        }
        hm_model_opts mo;
        memset(&mo, 0, sizeof mo);
        mo.placement = &po;
        m = NULL;
        st = hm_model_open(&m, path, &mo, &err);
        CHECKF(st == HM_OK, "gemma4-tiny %s %s: open: %s", type, g4_place_name[p], err.msg);
        if (st != HM_OK) continue;
        double worst[2] = {-1, -1};
        for (int i = 0; i < 2; i++) {
            int32_t t[G4P + G4DEC];
            memcpy(t, toks, sizeof t);
            char what[160];
            snprintf(what, sizeof what, "gemma4-tiny %s %s n_ubatch %d", type, g4_place_name[p], ub[i]);
            st = g4_run(m, ub[i], t, false, g, V, &err);
            CHECKF(st == HM_OK, "%s: %s", what, err.msg);
            if (st != HM_OK) continue;
            worst[i] = gpu_compare_logits(what, g, cpu[i], G4STEP, V,
                                          quant ? NMSE_Q8 : (i == 0 ? NMSE_BF16 : G4_NMSE_EXACT));
            if (p == G4_ONE) memcpy(one[i], g, NV * sizeof(float));
            if (p == G4_TS || p == G4_OUT_ALONE)
                CHECKF(count_diff(g, one[i], NV) == 0, "%s: %lld logits differ from one GPU's", what,
                       (long long)count_diff(g, one[i], NV));
        }
        hm_usage u;
        memset(&u, 0, sizeof u);
        st = hm_model_usage(m, &u, &err);
        CHECKF(st == HM_OK, "gemma4-tiny usage: %s", err.msg);
        if (st == HM_OK) {
            CHECKF(u.n_gpus == (p == G4_ONE ? 1 : 2) && u.layer_gpu, "gemma4-tiny %s %s: %d GPUs in the usage", type,
                   g4_place_name[p], (int)u.n_gpus);
            uint64_t hits = 0, misses = 0;
            for (int32_t l = 0; u.layer_gpu && l < n_layer; l++) {
                /* both runs: every row in every layer but the last, which computes the wanted rows */
                const uint64_t rows = l + 1 < n_layer ? 2u * (G4P + G4DEC) : 2u * G4STEP;
                const uint64_t h = u.layer_hits[l], mi = u.layer_misses[l];
                hits += h, misses += mi;
                CHECKF(h + mi == rows * (uint64_t)K, "gemma4-tiny %s %s layer %d: %llu hits + %llu misses, want "
                       "%llu x %d", type, g4_place_name[p], l, (unsigned long long)h, (unsigned long long)mi,
                       (unsigned long long)rows, K);
                if (p != G4_LRU) {
                    /* -ts 1,1: llama.cpp's split of 3 layers + output at 0.5: layers 0-1 on 0, 2 on 1 */
                    const int32_t want_dev = p == G4_TS && l == 2 ? 1 : 0;
                    CHECKF(u.layer_gpu[l] == want_dev, "gemma4-tiny %s %s: layer %d on device %d, want %d", type,
                           g4_place_name[p], l, (int)u.layer_gpu[l], (int)want_dev);
                    CHECKF(mi == 0, "gemma4-tiny %s %s layer %d: %llu misses", type, g4_place_name[p], l,
                           (unsigned long long)mi);
                }
            }
            if (p == G4_LRU)
                CHECKF(u.n_gpus == 2 && u.gpu_slots[0] > 0 && u.gpu_slots[1] > 0 && hits > 0 && misses > 0,
                       "gemma4-tiny %s %s: slots %lld / %lld, %llu hits, %llu misses", type, g4_place_name[p],
                       (long long)u.gpu_slots[0], (long long)u.gpu_slots[1], (unsigned long long)hits,
                       (unsigned long long)misses);
            fprintf(stderr, "gemma4-tiny %s %-32s NMSE n_ubatch 64 %.3g, 8 %.3g; slots %lld+%lld (peer %lld+%lld), "
                    "%llu hits, %llu misses\n", type, g4_place_name[p], worst[0], worst[1], (long long)u.gpu_slots[0],
                    (long long)u.gpu_slots[1], (long long)u.gpu_peer[0], (long long)u.gpu_peer[1],
                    (unsigned long long)hits, (unsigned long long)misses);
        }
        hm_usage_free(&u);
        if (p == G4_TS && worst[1] >= 0) {
            /* the n_ubatch 8 run (still in g): its decode steps ran as one graph per device; the
             * per-launch path runs the same kernels in the same order */
            int32_t t[G4P + G4DEC];
            memcpy(t, toks, sizeof t);
            setenv("HOTMOE_CUDA_GRAPH", "0", 1);
            st = g4_run(m, ub[1], t, false, g2, V, &err);
            unsetenv("HOTMOE_CUDA_GRAPH");
            CHECKF(st == HM_OK, "gemma4-tiny %s %s without graphs: %s", type, g4_place_name[p], err.msg);
            if (st == HM_OK)
                CHECKF(count_diff(g, g2, NV) == 0, "gemma4-tiny %s %s: graph vs per-launch decode: %lld logits "
                       "differ", type, g4_place_name[p], (long long)count_diff(g, g2, NV));
        }
        hm_model_close(m);
    }
    for (int i = 0; i < 2; i++) free(cpu[i]), free(one[i]);
    free(g);
    free(g2);
    unlink(path);
}

static void gemma4_split(void) {
    gemma4_model("f32", false);
    gemma4_model("q4_k_m", true);
}

/* What is refused: a device that is not there. */
static void refusals(void) {
    char path[] = "/tmp/hm_mgpu_g4_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    close(fd);
    hm_synth_opts so = {.arch = "gemma4", .preset = "gemma4-tiny", .type = "f32", .seed = 5, .out_path = path,
                        .n_threads = 4};
    hm_err err = {{0}};
    hm_status st = hm_synth(&so, &err);
    CHECKF(st == HM_OK, "synth gemma4: %s", err.msg);
    if (st == HM_OK) {
        hm_placement_opts po;
        hm_placement_opts_default(&po);
        hm_model_opts mo;
        memset(&mo, 0, sizeof mo);
        mo.placement = &po;
        hm_model *m = NULL;
        po.vram_budgets[0] = (hm_gpu_budget){.device = 7, .bytes = 1 << 20};
        po.n_vram_budgets = 1;
        st = hm_model_open(&m, path, &mo, &err);
        CHECKF(st == HM_ERR_ARG && strstr(err.msg, "device 7"), "--vram-budget 7:1MiB: status %d: %s", (int)st,
               err.msg);
        hm_model_close(m);
    }
    unlink(path);
}

/* ---- qwen35moe split over two GPUs ----
 *
 * A tiny qwen35moe written here (as test_qwen35moe_gpu.c's (b), but 8 layers: DeltaNet x3,
 * attention, DeltaNet x3, attention; n_embd 256, head_dim 256 with 64 rotary dims, DeltaNet
 * d_k = d_v = 128, 16 experts k 4 of n_ff 256, shared expert 256, vocab 512), F32 and Q8_0.
 * -ts 1,1 splits it at il / 9: layers 0-4 (3 DeltaNet, attention, DeltaNet) on device 0, 5-7
 * (2 DeltaNet, attention) and the output on device 1: each device holds the KV cache and the
 * recurrent state of its own layers of both kinds. Sequences (the CPU engine's logits the
 * reference): P (a 40-token prompt, the prefill path, then 8 steps), then trim(0) on the same
 * session (every device's recurrent state zeroed) and D (a 6-token prompt, decode throughout,
 * then 8 steps), and C (P in micro-batches of 24: the first wants no logits, so the forward stops
 * after the last layer's mixer on device 1). Placements:
 *   one GPU -ngl 99; -ts 1,1 -ngl 99: P, D and C BIT-IDENTICAL to one GPU's, D under
 *   HOTMOE_CUDA_GRAPH=0 bit-identical to the graph's, no misses; --vram-budget 0:30%,1:30% lru
 *   (units move between steps, peer units): hits and misses on both devices' slots.
 * Each within test_qwen35moe_gpu's bounds of the CPU (F32: P, C 1e-4 (bf16 prefill), D 1e-7;
 * Q8_0: 3e-4); per layer hits + misses = rows x k; each layer's device printed (layer_gpu), the
 * ranges contiguous and, under -ts 1,1, both kinds of layer on both devices. */

enum { Q35_NL = 8, Q35_CTX = 64 };

typedef struct q35_ref {
    int32_t toks_p[NP + NDEC], toks_d[ND + NDEC];
    float *lp, *ld;          /* the CPU's logits per step of P and D */
    float *gp, *gd, *gc;     /* one GPU's P, D and C */
    uint64_t unit_bytes, n_units;
} q35_ref;

/* P, trim(0), D on one session; then C (P in micro-batches of 24) on another. greedy: the
 * reference picks the decode tokens (then C is not run). */
static hm_status q35_run(hm_model *m, q35_ref *r, bool greedy, float *lp, float *ld, float *lc, hm_err *err) {
    hm_session_opts so;
    hm_session_opts_default(&so);
    so.n_ctx = Q35_CTX;
    so.n_threads = 4;
    hm_session *s = NULL;
    hm_status st = hm_session_open(&s, m, &so, err);
    if (st != HM_OK) return st;
    st = gpu_compare_run(s, r->toks_p, NP, NDEC, greedy, lp, TQ35_VOCAB, err);
    if (st == HM_OK) st = hm_session_trim(s, 0, err);
    if (st == HM_OK) st = gpu_compare_run(s, r->toks_d, ND, NDEC, greedy, ld, TQ35_VOCAB, err);
    hm_session_close(s);
    if (st != HM_OK || !lc) return st;
    so.n_ubatch = 24;
    s = NULL;
    if ((st = hm_session_open(&s, m, &so, err)) != HM_OK) return st;
    int32_t tp[NP + NDEC];
    memcpy(tp, r->toks_p, sizeof tp);
    st = gpu_compare_run(s, tp, NP, NDEC, false, lc, TQ35_VOCAB, err);
    hm_session_close(s);
    return st;
}

typedef enum q35_place { Q35_ONE, Q35_TS, Q35_BUDGET } q35_place;
static const char *q35_place_name[] = {"one GPU -ngl 99", "-ts 1,1 -ngl 99", "--vram-budget 0:30%,1:30% lru"};

static void q35_placement(const char *path, const char *label, q35_ref *r, q35_place p, bool quant) {
    hm_placement_opts po;
    hm_placement_opts_default(&po);
    po.n_gpu_layers = 99;
    po.n_ctx = Q35_CTX;
    if (p == Q35_TS) {
        po.tensor_split[0] = po.tensor_split[1] = 1.0f;
        po.n_tensor_split = 2;
    } else if (p == Q35_BUDGET) {
        const int64_t b = (int64_t)((r->n_units * 3 + 9) / 10) * (int64_t)(r->unit_bytes + 3 * 256);
        po.vram_budgets[0] = (hm_gpu_budget){.device = 0, .bytes = b};
        po.vram_budgets[1] = (hm_gpu_budget){.device = 1, .bytes = b};
        po.n_vram_budgets = 2;
        po.policy = "lru";
    }
    hm_model_opts mo;
    memset(&mo, 0, sizeof mo);
    mo.placement = &po;
    hm_err err = {{0}};
    hm_model *m = NULL;
    const char *pn = q35_place_name[p];
    hm_status st = hm_model_open(&m, path, &mo, &err);
    CHECKF(st == HM_OK, "%s %s: open: %s", label, pn, err.msg);
    if (st != HM_OK) return;
    const size_t NV = (size_t)NSTEP * TQ35_VOCAB;
    float *gp = malloc(NV * sizeof(float)), *gd = malloc(NV * sizeof(float)), *gc = malloc(NV * sizeof(float));
    char what[160];
    double wp = -1, wd = -1, wc = -1;
    st = gp && gd && gc ? q35_run(m, r, false, gp, gd, gc, &err) : HM_ERR_NOMEM;
    CHECKF(st == HM_OK, "%s %s: %s", label, pn, err.msg);
    if (st == HM_OK) {
        snprintf(what, sizeof what, "%s %s P", label, pn);
        wp = gpu_compare_logits(what, gp, r->lp, NSTEP, TQ35_VOCAB, quant ? NMSE_Q8 : NMSE_BF16);
        snprintf(what, sizeof what, "%s %s D (after trim 0)", label, pn);
        wd = gpu_compare_logits(what, gd, r->ld, NSTEP, TQ35_VOCAB, quant ? NMSE_Q8 : NMSE_F32_EXACT);
        snprintf(what, sizeof what, "%s %s C (micro-batches of 24)", label, pn);
        wc = gpu_compare_logits(what, gc, r->lp, NSTEP, TQ35_VOCAB, quant ? NMSE_Q8 : NMSE_BF16);
        if (p == Q35_ONE) {
            memcpy(r->gp, gp, NV * sizeof(float));
            memcpy(r->gd, gd, NV * sizeof(float));
            memcpy(r->gc, gc, NV * sizeof(float));
        }
        if (p == Q35_TS) {
            CHECKF(count_diff(gp, r->gp, NV) == 0, "%s %s P: %lld logits differ from one GPU's", label, pn,
                   (long long)count_diff(gp, r->gp, NV));
            CHECKF(count_diff(gd, r->gd, NV) == 0, "%s %s D: %lld logits differ from one GPU's", label, pn,
                   (long long)count_diff(gd, r->gd, NV));
            CHECKF(count_diff(gc, r->gc, NV) == 0, "%s %s C: %lld logits differ from one GPU's", label, pn,
                   (long long)count_diff(gc, r->gc, NV));
        }
    }

    hm_usage u;
    memset(&u, 0, sizeof u);
    st = hm_model_usage(m, &u, &err);
    CHECKF(st == HM_OK, "%s usage: %s", label, err.msg);
    if (st == HM_OK) {
        const int want_gpus = p == Q35_ONE ? 1 : 2;
        CHECKF(u.n_gpus == want_gpus && u.layer_gpu, "%s %s: %d GPUs in the usage, want %d", label, pn,
               (int)u.n_gpus, want_gpus);
        char layers[128] = "";
        int off = 0;
        int kinds[2][2] = {{0, 0}, {0, 0}}; /* [device][recurrent] layers */
        uint64_t hits = 0, misses = 0;
        for (int32_t l = 0; u.layer_gpu && l < Q35_NL; l++) {
            const int dv = (int)u.layer_gpu[l];
            off += snprintf(layers + off, sizeof layers - (size_t)off, "%s%d:%c%d", l ? " " : "", (int)l,
                            tq35_recurrent(l) ? 'D' : 'A', dv);
            CHECKF(dv >= 0 && dv < want_gpus && (l == 0 || dv >= u.layer_gpu[l - 1]),
                   "%s %s: layer %d on device %d (ranges must be contiguous, ascending)", label, pn, (int)l, dv);
            if (dv >= 0 && dv < 2) kinds[dv][tq35_recurrent(l)]++;
            /* rows per layer: P, D and C each (prompt + steps); the last layer only the wanted rows */
            const uint64_t rows = l + 1 < Q35_NL ? (uint64_t)(2 * (NP + NDEC) + ND + NDEC) : (uint64_t)(3 * NSTEP);
            const uint64_t h = u.layer_hits[l], mi = u.layer_misses[l];
            hits += h, misses += mi;
            CHECKF(h + mi == rows * TQ35_K, "%s %s layer %d: %llu hits + %llu misses, want %llu x %d", label, pn,
                   (int)l, (unsigned long long)h, (unsigned long long)mi, (unsigned long long)rows, TQ35_K);
            if (p != Q35_BUDGET)
                CHECKF(mi == 0, "%s %s layer %d: %llu misses", label, pn, (int)l, (unsigned long long)mi);
        }
        if (p == Q35_TS)
            CHECKF(kinds[0][0] > 0 && kinds[0][1] > 0 && kinds[1][0] > 0 && kinds[1][1] > 0,
                   "%s %s: device 0 runs %d attention + %d DeltaNet layers, device 1 %d + %d: want both kinds on "
                   "both", label, pn, kinds[0][0], kinds[0][1], kinds[1][0], kinds[1][1]);
        if (p == Q35_BUDGET)
            CHECKF(u.n_gpus == 2 && u.gpu_slots[0] > 0 && u.gpu_slots[1] > 0 && hits > 0 && misses > 0,
                   "%s %s: slots %lld / %lld, %llu hits, %llu misses", label, pn, (long long)u.gpu_slots[0],
                   (long long)u.gpu_slots[1], (unsigned long long)hits, (unsigned long long)misses);
        fprintf(stderr,
                "%s %-30s layers [%s] (layer:kind device); NMSE P %.3g, D %.3g, C %.3g; slots %lld+%lld (used "
                "%lld+%lld, peer %lld+%lld), %llu hits, %llu misses\n",
                label, pn, layers, wp, wd, wc,
                (long long)u.gpu_slots[0], (long long)u.gpu_slots[1], (long long)u.gpu_slots_used[0],
                (long long)u.gpu_slots_used[1], (long long)u.gpu_peer[0], (long long)u.gpu_peer[1],
                (unsigned long long)hits, (unsigned long long)misses);
    }
    hm_usage_free(&u);

    if (p == Q35_TS && wd >= 0) {
        /* the graph's decode (one graph per device) vs the per-launch path: bit-identical */
        float *gp2 = malloc(NV * sizeof(float)), *gd2 = malloc(NV * sizeof(float));
        setenv("HOTMOE_CUDA_GRAPH", "0", 1);
        hm_status st2 = gp2 && gd2 ? q35_run(m, r, false, gp2, gd2, NULL, &err) : HM_ERR_NOMEM;
        unsetenv("HOTMOE_CUDA_GRAPH");
        CHECKF(st2 == HM_OK, "%s %s without graphs: %s", label, pn, err.msg);
        if (st2 == HM_OK)
            CHECKF(count_diff(gd, gd2, NV) == 0, "%s %s D: graph vs per-launch decode: %lld logits differ", label, pn,
                   (long long)count_diff(gd, gd2, NV));
        free(gp2);
        free(gd2);
    }
    free(gp);
    free(gd);
    free(gc);
    hm_model_close(m);
}

static void qwen35moe_split(void) {
    const int types[2] = {HM_TYPE_F32, HM_TYPE_Q8_0};
    for (int i = 0; i < 2; i++) {
        char path[] = "/tmp/hm_mgpu_q35_XXXXXX";
        int fd = mkstemp(path);
        CHECK(fd >= 0);
        if (fd < 0) continue;
        close(fd);
        hm_err err = {{0}};
        char label[32];
        snprintf(label, sizeof label, "qwen35moe %s", i ? "q8_0" : "f32");
        hm_status st = tq35_write(path, Q35_NL, types[i], "tiny qwen35moe (test_multi_gpu_gpu)", &err);
        CHECKF(st == HM_OK, "%s: write the tiny model: %s", label, err.msg);
        q35_ref r;
        memset(&r, 0, sizeof r);
        const size_t NV = (size_t)NSTEP * TQ35_VOCAB * sizeof(float);
        r.lp = malloc(NV), r.ld = malloc(NV), r.gp = malloc(NV), r.gd = malloc(NV), r.gc = malloc(NV);
        hm_model *m = NULL;
        if (st == HM_OK) st = hm_model_open(&m, path, NULL, &err);
        CHECKF(st == HM_OK, "%s: open on the CPU: %s", label, err.msg);
        if (st == HM_OK && r.lp && r.ld && r.gp && r.gd && r.gc) {
            gpu_compare_prompts(0x9e3779b97f4a7c15ull, TQ35_VOCAB, r.toks_p, NP, r.toks_d, ND);
            st = q35_run(m, &r, true, r.lp, r.ld, NULL, &err);
            CHECKF(st == HM_OK, "%s CPU: %s", label, err.msg);
            gpu_compare_units(m, &r.unit_bytes, &r.n_units, &err);
            hm_model_close(m);
            if (st == HM_OK)
                for (int p = Q35_ONE; p <= Q35_BUDGET; p++) q35_placement(path, label, &r, (q35_place)p, i == 1);
        } else {
            hm_model_close(m);
        }
        free(r.lp), free(r.ld), free(r.gp), free(r.gd), free(r.gc);
        unlink(path);
    }
}

int main(void) {
    if (hm_cuda_device_count() < 2) {
        printf("skipped: fewer than 2 GPUs\n");
        return 77;
    }
    if (!gpu_compare_have_device()) return 77;
    refusals();
    run_model("f32", false);
    run_model("q4_k_m", true);
    qwen35moe_split();
    gemma4_split();
    return test_done();
}
