/* test_qwen3moe_gpu.c - the qwen3moe forward pass on the GPU (dense part, KV and hot experts on the
 * device, cold experts on the CPU at the same time) against the CPU engine, through the public API.
 *
 * Models: two synths of the tiny qwen3moe preset (4 layers, n_embd 256, 16 experts, k 4): F32 and
 * Q4_K_M. For each, the CPU engine (verified against transformers and llama.cpp) runs two
 * sequences and keeps its logits per step:
 *   P: a 40-token prompt (the GPU's prefill path: n > 8 rows take the bf16 tensor-core matmul)
 *      then 8 decode steps;
 *   D: a 6-token prompt (n <= 8: the exact-f32 matvec path throughout) then 8 decode steps.
 * The decode tokens are the CPU's greedy picks, fed identically to every run. Then each placement
 * (-ngl 99 plus: (a) --cpu-moe, (b) --n-cpu-moe 2, (c) --vram-budget ~30 % of the units with a
 * static placement from the CPU run's profile, and with lru (units move between steps, fills
 * land mid-run), (d) nothing else: every unit on the GPU) runs P and D on the GPU and each step's
 * logits must match the CPU's:
 *   - NMSE = sum (g - c)^2 / sum c^2 below a bound derived from the numerics (below), and
 *   - the same argmax, unless the CPU's logits of the two picks are closer than
 *     max(GPU_COMPARE_NEAR_TIE x max |logit|, 4 x the step's rms logit difference): a near-tie the
 *     allowed rounding may break either way (then either may win). (gpu_compare.h's rule.)
 * Bounds. F32 weights: the CPU's dot products are f32 x f32; the GPU's matvec is exact f32 dequant
 * with f32 accumulation: only summation order, expf/rsqrt and a rare f16 KV rounding flip differ
 * (relative ~1e-6 per op: NMSE ~1e-12), so D is held to NMSE_F32_EXACT = 1e-7. P's prefill rounds
 * weights and activations to bf16 (2^-9 relative, ~0.2 % per matmul output; a near-tie in a
 * router may swap one of a token's experts, which moves that row by ~0.3 % of the residual since
 * the synth's embedding dominates it): NMSE_BF16 = 1e-4 (10x over that estimate squared).
 * Q4_K_M: the CPU quantises activations to Q8_K / Q8_0 for its dot products (0.6 % rms rounding
 * per element) while the GPU keeps them f32 (or bf16 in prefill): the CPU's own rounding
 * dominates, NMSE_Q8 = 3e-4 for both runs. The same holds for the low-bit files (q2_k, q3_k_m:
 * Q2_K / Q3_K take the int8 paths as the K-quants do; iq4_nl, q4_1, q5_1: the GPU decodes their
 * weights exactly (f32 paths), the CPU rounds activations to their dot partner, Q8_0 / Q8_1).
 * Store stats (hm_model_usage): per layer hits + misses = the rows that layer computed x k;
 * (a) no hits, (d) no misses, (b) hits exactly on layers >= 2 (all of them, no misses there);
 * (c) static: hits and misses both > 0, lru: units swapped in during the run.
 * Steps of <= 8 rows (D, and every decode step) take the decode MoE: hot units routed on the device
 * through the slot table, no host round trip in a layer whose units are all HOT ((d), layers >= 2
 * of (b)), one that the hot launch overlaps elsewhere ((a), (b)'s first layers, (c)), the routing
 * recorded after the step: the usage checks above hold for it as for the prefill path. Stacked
 * q|k(|v) weights are used by both models (F32: all three; Q4_K_M: q|k, v apart when Q6_K).
 * (e) 30 % static again with HOTMOE_PREFILL_STREAM=all: P's prefill layers copy every cold unit
 * the streaming pool holds up to the GPU and compute it there (docs/ENGINE.md), the next layer's
 * predicted ones a layer ahead: the same bounds, and hm_model_usage counts streamed units, units
 * streamed ahead and those of them the real routing used.
 * (f) lru with --mlock and HOTMOE_PREFILL_STREAM=ahead (the cost model, a layer ahead): the file's
 * expert bytes are registered with CUDA and the swaps copied straight from them (hm_model_usage's
 * gpu_pinned_bytes, gpu_direct_fills): the same bounds as (c).
 * Also: two GPU sessions through hm_batch_eval equal each alone; an f32 KV cache with the GPU is
 * HM_ERR_UNSUPPORTED; under (d) q8_0 and bf16 KV caches (-ctk) on the GPU against the CPU's cache of
 * the type (run_kv_quant says the bound). Decode steps of one row run as one CUDA graph (the cold units' handshakes
 * inside it); D again with HOTMOE_CUDA_GRAPH=0 (the per-launch path) must give bit-identical
 * logits under every placement that does not move units between runs (all but lru).
 * YaRN: the transformers fixture with YaRN RoPE scaling (tests/fixtures/qwen3moe_yarn, when
 * present; test_qwen3moe_hf checks the CPU on it) on the GPU with -ngl 99: its 48 tokens as one
 * batch and one at a time (the decode graph), the scaled RoPE through the unfused rope ops, against
 * transformers' logits within the f16 cache's bound of 1e-2, top-1 agreeing. The context opens with
 * HOTMOE_CUDA_EXACT=1 (exact f32 matmuls): this random fixture's routers have near-ties that the
 * batch's bf16 matmuls flip (measured: max |d| 1.26 and 2 top-1 misses in the batch with them, 0.007
 * one at a time), which would hide what is checked here, the RoPE.
 * Exits 77 ("skipped: no GPU") without a CUDA device. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"
#include "gguf/gguf.h"
#include "gpu_compare.h"
#include "hotmoe.h"
#include "test.h"

#define NP 40       /* prompt P */
#define ND 6        /* prompt D (matvec path) */
#define NDEC 8      /* decode steps after each prompt */
#define NSTEP (1 + NDEC)
#define N_CPU_MOE 2
#define NMSE_F32_EXACT 1e-7
#define NMSE_BF16 1e-4
#define NMSE_Q8 3e-4

typedef struct ref {
    int32_t n_vocab, n_layer, k;
    int32_t toks_p[NP + NDEC], toks_d[ND + NDEC];
    float *lp, *ld; /* [NSTEP][n_vocab] the CPU's logits per step of P and D */
    uint64_t unit_bytes, n_units;
    uint64_t exps_span; /* bytes from the first *_exps tensor's data to the last one's end, from the file */
} ref;

/* The span of the file's expert tensors (what --mlock registers with CUDA), found from the tensor
 * names, independently of the unit table; 0 when the file does not open. */
static uint64_t exps_span(const char *path) {
    hm_gguf *g = NULL;
    hm_err e;
    if (hm_gguf_open(&g, path, &e) != HM_OK) return 0;
    const char *a = NULL, *b = NULL;
    for (int64_t i = 0; i < hm_gguf_n_tensors(g); i++) {
        const hm_gguf_tensor *t = hm_gguf_tensor_at(g, i);
        if (!strstr(t->name, "_exps")) continue;
        const char *s = t->data, *end = s + t->nbytes;
        if (!a || s < a) a = s;
        if (!b || end > b) b = end;
    }
    hm_gguf_close(g);
    return a ? (uint64_t)(b - a) : 0;
}

static hm_session *open_session(hm_model *m, hm_kv_type kv, hm_err *err) {
    hm_session_opts so;
    hm_session_opts_default(&so);
    so.n_ctx = 64;
    so.n_threads = 4;
    so.kv_type = kv;
    hm_session *s = NULL;
    return hm_session_open(&s, m, &so, err) == HM_OK ? s : NULL;
}

/* Run prompt toks[0..np) then NDEC single tokens toks[np..], logits per step into out
 * ([NSTEP][V]). greedy: the CPU reference picks toks[np + i] = argmax of step i's logits. */
static hm_status run_seq(hm_model *m, int32_t *toks, int32_t np, bool greedy, float *out, int32_t V, hm_err *err) {
    return gpu_compare_run_fresh(m, 64, 0, toks, np, NDEC, greedy, out, V, err);
}

/* -ctk q8_0 (and bf16) end to end: P and D (the CPU reference's tokens) on a q8_0 KV cache, the GPU's
 * (-ngl 99: the device's write, the decode kernels and the flash prefill reading it) against the CPU
 * engine's own cache of the type. Both quantise their K/V rows with the same reference arithmetic,
 * but the rows come from each backend's matmuls: a code that lies on a rounding boundary may flip
 * between them, moving that value by one step (q8_0: 1/127 of its block's largest value, ~0.8 %;
 * bf16: 2^-8 of it, a bf16 rounding), so both sequences are held to NMSE_BF16 (Q4_K_M: NMSE_Q8,
 * the CPU's activation rounding dominating as for f16). */
static void run_kv_quant(const char *path, const char *label, const ref *r, hm_model *mg, bool quant, hm_kv_type kv) {
    hm_err err = {{0}};
    hm_model *mc = NULL;
    CHECKF(hm_model_open(&mc, path, NULL, &err) == HM_OK, "%s q8_0: CPU open: %s", label, err.msg);
    if (!mc) return;
    const int32_t V = r->n_vocab;
    float *c8 = malloc((size_t)NSTEP * (size_t)V * sizeof(float)), *g8 = malloc((size_t)NSTEP * (size_t)V * sizeof(float));
    for (int seq = 0; seq < 2; seq++) {
        int32_t toks[NP + NDEC];
        const int32_t np = seq == 0 ? NP : ND;
        hm_status st = HM_OK;
        for (int side = 0; side < 2 && st == HM_OK; side++) {
            memcpy(toks, seq == 0 ? r->toks_p : r->toks_d, (size_t)(np + NDEC) * sizeof(int32_t));
            hm_session *s = open_session(side ? mg : mc, kv, &err);
            CHECKF(s != NULL, "%s q8_0 session (%s): %s", label, side ? "GPU" : "CPU", err.msg);
            if (!s) {
                st = HM_ERR_ARG;
                break;
            }
            st = gpu_compare_run(s, toks, np, NDEC, false, side ? g8 : c8, V, &err);
            CHECKF(st == HM_OK, "%s q8_0 run (%s): %s", label, side ? "GPU" : "CPU", err.msg);
            hm_session_close(s);
        }
        if (st != HM_OK) continue;
        char what[96];
        snprintf(what, sizeof what, "%s -ngl 99 -ctk %s %s", label, hm_kv_type_name(kv),
                 seq == 0 ? "P (prefill)" : "D (decode)");
        const double w = gpu_compare_logits(what, g8, c8, NSTEP, V, quant ? NMSE_Q8 : NMSE_BF16);
        fprintf(stderr, "%s: NMSE vs the CPU's cache of the type %.3g\n", what, w);
    }
    free(c8);
    free(g8);
    hm_model_close(mc);
}

typedef enum place { P_CPU_MOE, P_N_CPU_MOE, P_STATIC, P_LRU, P_ALL, P_STREAM, P_MLOCK } place;
static const char *place_name[] = {"--cpu-moe", "--n-cpu-moe 2", "--vram-budget 30% static", "--vram-budget 30% lru",
                                   "-ngl 99 (all experts on the GPU)", "30% static, every cold unit streamed",
                                   "30% lru --mlock, streamed, ahead"};

static void run_placement(const char *path, const char *label, const ref *r, place p, const char *profile,
                          bool quant) {
    hm_placement_opts po;
    hm_placement_opts_default(&po);
    po.n_gpu_layers = 99;
    po.n_ctx = 64;
    /* slots for ~30 % of the units (a slot is the largest unit, parts rounded up to 256 bytes) */
    const int64_t budget = (int64_t)((r->n_units * 3 + 9) / 10) * (int64_t)(r->unit_bytes + 3 * 256);
    switch (p) {
    case P_CPU_MOE: po.cpu_moe = true; break;
    case P_N_CPU_MOE: po.n_cpu_moe = N_CPU_MOE; break;
    case P_STATIC:
    case P_STREAM:
        po.vram_budget = budget;
        po.profile = profile;
        po.policy = "static";
        break;
    case P_MLOCK: po.mlock = true; /* fall through */
    case P_LRU:
        po.vram_budget = budget;
        po.policy = "lru";
        break;
    case P_ALL: break;
    }
    char what[160];
    hm_model_opts mo;
    memset(&mo, 0, sizeof mo);
    mo.placement = &po;
    hm_err err = {{0}};
    hm_model *m = NULL;
    /* the streaming mode is read at open: "all" streams every cold unit of a prefill layer that the
     * pool holds (else the cost model decides, which may stream some or none of these tiny units).
     * Off for --n-cpu-moe: its batch-eval check below wants each unit computed in the same place
     * whatever the batch (streaming picks by the batch's token counts) */
    if (p == P_STREAM) setenv("HOTMOE_PREFILL_STREAM", "all", 1);
    if (p == P_MLOCK) setenv("HOTMOE_PREFILL_STREAM", "ahead", 1);
    if (p == P_N_CPU_MOE) setenv("HOTMOE_PREFILL_STREAM", "0", 1);
    hm_status st = hm_model_open(&m, path, &mo, &err);
    unsetenv("HOTMOE_PREFILL_STREAM");
    CHECKF(st == HM_OK, "%s %s: open: %s", label, place_name[p], err.msg);
    if (st != HM_OK) return;
    const int32_t V = r->n_vocab;
    float *g = malloc((size_t)NSTEP * (size_t)V * sizeof(float));
    int32_t tp[NP + NDEC], td[ND + NDEC];
    memcpy(tp, r->toks_p, sizeof tp);
    memcpy(td, r->toks_d, sizeof td);

    snprintf(what, sizeof what, "%s %s P (prefill %d)", label, place_name[p], NP);
    st = run_seq(m, tp, NP, false, g, V, &err);
    CHECKF(st == HM_OK, "%s: %s", what, err.msg);
    double wp = st == HM_OK ? gpu_compare_logits(what, g, r->lp, NSTEP, V, quant ? NMSE_Q8 : NMSE_BF16) : -1;
    snprintf(what, sizeof what, "%s %s D (prompt %d)", label, place_name[p], ND);
    st = run_seq(m, td, ND, false, g, V, &err);
    CHECKF(st == HM_OK, "%s: %s", what, err.msg);
    double wd = st == HM_OK ? gpu_compare_logits(what, g, r->ld, NSTEP, V, quant ? NMSE_Q8 : NMSE_F32_EXACT) : -1;

    /* the store: every routed (row, unit) counted once, as a hit or a miss, where it ran */
    hm_usage u;
    memset(&u, 0, sizeof u);
    st = hm_model_usage(m, &u, &err);
    CHECKF(st == HM_OK, "%s usage: %s", label, err.msg);
    uint64_t hits = 0, misses = 0;
    for (int32_t l = 0; st == HM_OK && l < r->n_layer; l++) {
        /* rows a layer computed: both prompts and every decode step; the last layer only the
         * wanted rows (one per eval) */
        const uint64_t rows = l + 1 < r->n_layer ? (uint64_t)(NP + ND + 2 * NDEC) : (uint64_t)(2 * NSTEP);
        const uint64_t h = u.layer_hits[l], mi = u.layer_misses[l];
        hits += h;
        misses += mi;
        CHECKF(h + mi == rows * (uint64_t)r->k, "%s %s layer %d: %llu hits + %llu misses, want %llu x %d", label,
               place_name[p], l, (unsigned long long)h, (unsigned long long)mi, (unsigned long long)rows, r->k);
        if (p == P_CPU_MOE) CHECKF(h == 0, "%s --cpu-moe layer %d: %llu hits", label, l, (unsigned long long)h);
        if (p == P_ALL) CHECKF(mi == 0, "%s -ngl 99 layer %d: %llu misses", label, l, (unsigned long long)mi);
        if (p == P_N_CPU_MOE)
            CHECKF(l >= N_CPU_MOE ? mi == 0 : h == 0, "%s --n-cpu-moe %d layer %d: %llu hits, %llu misses", label,
                   N_CPU_MOE, l, (unsigned long long)h, (unsigned long long)mi);
    }
    if (st == HM_OK) {
        if (p == P_STATIC || p == P_STREAM)
            CHECKF(hits > 0 && misses > 0, "%s static: %llu hits, %llu misses", label, (unsigned long long)hits,
                   (unsigned long long)misses);
        /* P's prefill (40 rows) streamed its cold units: computed on the GPU, counted as misses;
         * layers 1..3 got units copied ahead from the routing predicted one layer early, some of
         * which their real routing used */
        if (p == P_STREAM)
            CHECKF(u.stream_units > 0 && u.stream_bytes >= u.stream_units * r->unit_bytes / 2 && u.stream_ahead > 0 &&
                       u.stream_ahead_used > 0 && u.stream_ahead_used <= u.stream_ahead,
                   "%s streaming: %llu units, %llu bytes, %llu ahead, %llu of them used", label,
                   (unsigned long long)u.stream_units, (unsigned long long)u.stream_bytes,
                   (unsigned long long)u.stream_ahead, (unsigned long long)u.stream_ahead_used);
        /* --mlock: the file's expert bytes registered, swaps (and streamed units) copied straight from
         * them (not every swap need have been copied: a fill overtaken by a newer one of its slot
         * is dropped) */
        if (p == P_MLOCK)
            CHECKF(r->exps_span > 0 && u.gpu_pinned_bytes == r->exps_span && u.gpu_direct_fills > 0 && u.swaps_in > 0,
                   "%s --mlock: %llu bytes pinned (the *_exps tensors' span: %llu), %llu direct fills, %llu swaps in",
                   label, (unsigned long long)u.gpu_pinned_bytes, (unsigned long long)r->exps_span,
                   (unsigned long long)u.gpu_direct_fills, (unsigned long long)u.swaps_in);
        if (p == P_LRU || p == P_MLOCK) CHECKF(u.swaps_in > 0 && hits > 0, "%s lru: %llu swaps in, %llu hits", label,
                               (unsigned long long)u.swaps_in, (unsigned long long)hits);
        CHECKF(p == P_CPU_MOE ? u.vram_slots == 0 : u.vram_slots > 0, "%s %s: %lld VRAM slots", label,
               place_name[p], (long long)u.vram_slots);
        fprintf(stderr, "%s %-34s NMSE P %.3g, D %.3g; %lld slots, %llu hits, %llu misses, %llu swaps in, %llu "
                "streamed (%llu ahead, %llu used)\n", label, place_name[p], wp, wd, (long long)u.vram_slots,
                (unsigned long long)hits, (unsigned long long)misses, (unsigned long long)u.swaps_in,
                (unsigned long long)u.stream_units, (unsigned long long)u.stream_ahead,
                (unsigned long long)u.stream_ahead_used);
    }
    hm_usage_free(&u);
    if (p != P_LRU && p != P_MLOCK && wd >= 0) {
        /* decode steps run as one CUDA graph with the cold units' handshakes inside it; the
         * per-launch path (HOTMOE_CUDA_GRAPH=0) runs the same kernels in the same order: the
         * logits of every step must be bit-identical (lru moves units between the runs) */
        float *g2 = malloc((size_t)NSTEP * (size_t)V * sizeof(float));
        memcpy(td, r->toks_d, sizeof td);
        snprintf(what, sizeof what, "%s %s D (prompt %d)", label, place_name[p], ND);
        setenv("HOTMOE_CUDA_GRAPH", "0", 1);
        hm_status st2 = run_seq(m, td, ND, false, g2, V, &err);
        unsetenv("HOTMOE_CUDA_GRAPH");
        CHECKF(st2 == HM_OK, "%s without graphs: %s", what, err.msg);
        if (st2 == HM_OK && g2) {
            int64_t ndiff = 0;
            for (size_t i = 0; i < (size_t)NSTEP * (size_t)V; i++) ndiff += g[i] != g2[i];
            CHECKF(ndiff == 0, "%s: graph vs per-launch decode: %lld of %lld logits differ", what, (long long)ndiff,
                   (long long)NSTEP * V);
        }
        free(g2);
    }

    if (p == P_ALL) {
        /* the device state refuses an f32 KV cache */
        hm_session *s = open_session(m, HM_KV_F32, &err);
        CHECKF(!s, "%s: an f32 KV cache with the GPU opened", label);
        hm_session_close(s);
        run_kv_quant(path, label, r, m, quant, HM_KV_Q8_0);
        run_kv_quant(path, label, r, m, quant, HM_KV_BF16);
    }
    if (p == P_N_CPU_MOE) {
        /* two sessions in one hm_batch_eval equal each alone (hot and cold units both in play) */
        hm_session *a = open_session(m, HM_KV_F16, &err), *b = open_session(m, HM_KV_F16, &err);
        hm_session *a1 = open_session(m, HM_KV_F16, &err), *b1 = open_session(m, HM_KV_F16, &err);
        CHECK(a && b && a1 && b1);
        if (a && b && a1 && b1) {
            hm_session *ss[2] = {a, b};
            const int32_t *tk[2] = {r->toks_p, r->toks_d};
            const int32_t nn[2] = {12, 5};
            const float *lb[2] = {NULL, NULL}, *la = NULL;
            st = hm_batch_eval(ss, tk, nn, 2, lb, &err);
            CHECKF(st == HM_OK, "%s batch eval: %s", label, err.msg);
            for (int i = 0; st == HM_OK && i < 2; i++) {
                CHECK(hm_session_eval(i ? b1 : a1, tk[i], nn[i], false, &la, &err) == HM_OK);
                double md = 0;
                for (int32_t j = 0; j < V; j++) md = fmax(md, fabs((double)lb[i][j] - (double)la[j]));
                CHECKF(md == 0, "%s batch eval sequence %d vs alone: max difference %.3g", label, i, md);
            }
        }
        hm_session_close(a);
        hm_session_close(b);
        hm_session_close(a1);
        hm_session_close(b1);
    }
    free(g);
    hm_model_close(m);
}

static void run_model(const char *type, bool quant) {
    char path[] = "/tmp/hm_q3gpu_XXXXXX", prof[64];
    if (!gpu_compare_synth(path, "qwen3moe", "tiny", type, 11)) return;
    snprintf(prof, sizeof prof, "%s.profile.json", path);
    char label[32];
    snprintf(label, sizeof label, "tiny %s", type);

    ref r;
    memset(&r, 0, sizeof r);
    hm_err err = {{0}};
    hm_model *m = gpu_compare_open_cpu(path, label, &r.n_vocab, &r.n_layer, &r.k, &r.unit_bytes, &r.n_units, &err);
    if (m) {
        gpu_compare_ref_pd(m, label, 0x2545f4914f6cdd1dull, r.n_vocab, r.toks_p, NP, r.toks_d, ND, NDEC, &r.lp, &r.ld,
                           &err);
        r.exps_span = exps_span(path);
        CHECKF(hm_model_profile_save(m, prof, HM_PROFILE_FMT_HOTMOE, &err) == HM_OK, "profile: %s", err.msg);
        hm_model_close(m);
        if (!test_failures_)
            for (int p = P_CPU_MOE; p <= P_MLOCK; p++) run_placement(path, label, &r, (place)p, prof, quant);
    }
    free(r.lp);
    free(r.ld);
    unlink(path);
    unlink(prof);
}

static void check_yarn_fixture(void) {
    fixture fx;
    static int32_t tok[256];
    if (!fixture_open(&fx, "tests/fixtures/qwen3moe_yarn/", tok, 256)) {
        fixture_skip(&fx);
        return;
    }
    hm_placement_opts po;
    hm_placement_opts_default(&po);
    po.n_gpu_layers = 99;
    hm_model_opts mo;
    hm_model_opts_default(&mo);
    mo.placement = &po;
    hm_model *m = NULL;
    hm_err err;
    setenv("HOTMOE_CUDA_EXACT", "1", 1); /* read when the device context opens */
    CHECKF(hm_model_open(&m, fx.gguf, &mo, &err) == HM_OK, "yarn fixture on the GPU: %s", err.msg);
    unsetenv("HOTMOE_CUDA_EXACT");
    const int n = fx.n;
    const int32_t nv = m ? hm_model_n_vocab(m) : 0;
    size_t got = 0;
    float *want = m ? fixture_read_logits(&fx, nv, &got) : NULL;
    hm_session *s = NULL;
    if (m && got == (size_t)n * (size_t)nv) {
        hm_session_opts so;
        hm_session_opts_default(&so);
        so.n_ctx = n;
        so.n_threads = 2;
        CHECKF(hm_session_open(&s, m, &so, &err) == HM_OK, "%s", err.msg);
    }
    if (s) {
        const float *lg = NULL;
        CHECKF(hm_session_eval(s, tok, n, true, &lg, &err) == HM_OK, "%s", err.msg);
        const double db = lg ? fixture_maxdiff(lg, want, (size_t)n * (size_t)nv) : 1e9;
        const int agree = lg ? fixture_top1_agree(lg, want, n, nv) : 0;
        hm_session_reset(s);
        double dd = 0;
        for (int t = 0; t < n; t++) {
            CHECK(hm_session_eval(s, &tok[t], 1, false, &lg, &err) == HM_OK);
            if (lg) dd = fixture_maxdiff_from(dd, lg, want + (size_t)t * nv, (size_t)nv);
        }
        printf("yarn fixture, -ngl 99: batch max |d| %.3g (top-1 %d/%d), one at a time max |d| %.3g\n", db, agree, n,
               dd);
        CHECKF(db < 1e-2 && agree == n, "yarn on the GPU, batch: max |d| %g, top-1 %d/%d", db, agree, n);
        CHECKF(dd < 1e-2, "yarn on the GPU, one at a time: max |d| %g", dd);
        hm_session_close(s);
    }
    free(want);
    hm_model_close(m);
    fixture_close(&fx);
}

int main(void) {
    if (!gpu_compare_have_device()) return 77;
    check_yarn_fixture();
    run_model("f32", false);
    run_model("q4_k_m", true);
    /* the low-bit files (Q2_K / Q3_K on the int8 paths, the others on the f32 decoders; the CPU
     * rounds activations to Q8_K / Q8_1 / Q8_0 as for Q4_K_M: the same NMSE_Q8 bound) */
    run_model("q2_k", true);
    run_model("q3_k_m", true);
    run_model("iq4_nl", true);
    run_model("q4_1", true);
    run_model("q5_1", true);
    return test_done();
}
