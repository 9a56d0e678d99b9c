/* test_gpu_ram_tier_gpu.c - the three tiers together on the GPU path: VRAM slots (--vram-budget /
 * --n-cpu-moe), a RAM slot pool far below the experts' bytes (--ram-budget) and the file on SSD,
 * with exclusive caching (tier_ram.h), against the same GPU placement without --ram-budget.
 *
 * Models: synths of the tiny qwen3moe preset (4 layers, n_embd 256, 16 experts, k 4: the grouped
 * kernel computes its units), Q4_K_M and F32. The CPU engine runs first (its usage is the static
 * profile; its logits are the reference for the lru case). Sequences, as test_qwen3moe_gpu.c: P a
 * 40-token prompt (the prefill path) then 8 decode steps, D a 6-token prompt (the decode path
 * throughout) then 8 decode steps; the decode tokens are the first run's greedy picks, fed
 * identically to the others.
 *
 * Placements, each run without and then with --ram-budget (8 RAM buffers, about 1/8 of the
 * experts' bytes for Q4_K_M):
 *   static: --vram-budget ~30 % of the units, static from the CPU's profile (placed and landed
 *           at open, never moved): the RAM tier's static placement skips the VRAM units;
 *   ncpu:   -ngl 99 --n-cpu-moe 2 (layers 2, 3 in VRAM; RAM policy none: staging only).
 * Cold units are read from RAM (a RAM slot, or from the file into staging) instead of the file
 * mapping: the same bytes, computed in the same job order, so every step's logits must be
 * BIT-IDENTICAL to the run without --ram-budget, and the VRAM store's per-layer hits and misses
 * equal (the routing is the same). With the budget: bytes read from SSD > 0, and after every step
 * no unit whose VRAM copy has landed has a RAM copy (hm_ram_tier_where 0), no unit is both VRAM
 * and RAM/SSD in hm_model_usage (the homes add up to the units).
 *   lru:    --vram-budget ~30 % lru (units move between steps, their fills land when the copier
 *           is done: which step a unit first runs on the GPU depends on timing, so runs differ by
 *           the GPU's vs the CPU's rounding of a unit): logits against the CPU engine with
 *           test_qwen3moe_gpu.c's bounds (gpu_compare.h), and the exclusivity checks above.
 * Exits 77 ("skipped: no GPU") without a CUDA device. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "experts/tier_ram.h"
#include "gpu_compare.h"
#include "hotmoe.h"
#include "model/model.h"
#include "test.h"

#define NP 40
#define ND 6
#define NDEC 8
#define NSTEP (1 + NDEC)
#define N_RAM_BUF 8
#define NMSE_F32_EXACT 1e-7
#define NMSE_BF16 1e-4
#define NMSE_Q8 3e-4

typedef enum place { P_STATIC, P_NCPU, P_LRU } place;
static const char *place_name[] = {"--vram-budget 30% static", "-ngl 99 --n-cpu-moe 2", "--vram-budget 30% lru"};

typedef struct ref {
    int32_t n_vocab, n_layer, k;
    int32_t toks_p[NP + NDEC], toks_d[ND + NDEC];
    float *lp, *ld; /* [NSTEP][V] the CPU's logits */
    uint64_t unit_bytes, n_units;
} ref;

/* Units whose VRAM copy landed and that still have a RAM buffer (must be 0 after a step). */
static int dual_units(const hm_model *m) {
    if (!m->ram || !m->experts) return 0;
    int n = 0;
    for (int32_t l = 0; l < m->units.n_layer; l++)
        for (int32_t e = 0; e < m->units.layers[l].n_expert; e++)
            if (hm_experts_unit(m->experts, l, e)->home == HM_TIER_HOT && hm_ram_tier_where(m->ram, l, e) != 0) n++;
    return n;
}

/* Prompt toks[0..np) then NDEC single tokens, logits per step into out; greedy picks the tokens.
 * After every step: no unit in VRAM and RAM at once. */
static hm_status run_seq(hm_model *m, const char *what, int32_t *toks, int32_t np, bool greedy, float *out,
                         int32_t V, hm_err *err) {
    hm_session_opts so;
    hm_session_opts_default(&so);
    so.n_ctx = 64;
    so.n_threads = 4;
    hm_session *s = NULL;
    hm_status st = hm_session_open(&s, m, &so, err);
    for (int step = 0; st == HM_OK && step < NSTEP; step++) {
        const float *lg = NULL;
        st = hm_session_eval(s, step == 0 ? toks : toks + np + step - 1, step == 0 ? np : 1, false, &lg, err);
        if (st != HM_OK) break;
        memcpy(out + (size_t)step * (size_t)V, lg, (size_t)V * sizeof(float));
        if (greedy && step < NDEC) toks[np + step] = gpu_compare_argmax(lg, V);
        int d = dual_units(m);
        CHECKF(d == 0, "%s step %d: %d units in VRAM and in RAM", what, step, d);
    }
    hm_session_close(s);
    return st;
}

typedef struct result {
    float *lp, *ld;
    uint64_t *hits, *misses; /* [n_layer] */
    hm_usage u;
    bool ok;
} result;

static void result_free(result *r) {
    free(r->lp), free(r->ld), free(r->hits), free(r->misses);
    hm_usage_free(&r->u);
}

static void run_placement(const char *path, const char *label, ref *r, place p, const char *profile,
                          int64_t ram_budget, bool greedy, result *res) {
    memset(res, 0, sizeof *res);
    hm_placement_opts po;
    hm_placement_opts_default(&po);
    po.n_gpu_layers = 99;
    po.n_ctx = 64;
    po.ram_budget = ram_budget;
    const int64_t budget = (int64_t)((r->n_units * 3 + 9) / 10) * (int64_t)(r->unit_bytes + 3 * 256);
    switch (p) {
    case P_STATIC:
        po.vram_budget = budget;
        po.profile = profile;
        po.policy = "static";
        break;
    case P_NCPU: po.n_cpu_moe = 2; break;
    case P_LRU:
        po.vram_budget = budget;
        po.policy = "lru";
        break;
    }
    char what[200];
    snprintf(what, sizeof what, "%s %s%s", label, place_name[p], ram_budget ? " --ram-budget" : "");
    hm_model_opts mo;
    memset(&mo, 0, sizeof mo);
    mo.placement = &po;
    hm_err err = {{0}};
    hm_model *m = NULL;
    hm_status st = hm_model_open(&m, path, &mo, &err);
    CHECKF(st == HM_OK, "%s: open: %s", what, err.msg);
    if (st != HM_OK) return;
    CHECKF((m->ram != NULL) == (ram_budget > 0), "%s: RAM tier %s", what, m->ram ? "open" : "absent");
    const int32_t V = r->n_vocab;
    res->lp = malloc((size_t)NSTEP * (size_t)V * sizeof(float));
    res->ld = malloc((size_t)NSTEP * (size_t)V * sizeof(float));
    st = run_seq(m, what, r->toks_p, NP, greedy, res->lp, V, &err);
    CHECKF(st == HM_OK, "%s P: %s", what, err.msg);
    if (st == HM_OK) st = run_seq(m, what, r->toks_d, ND, greedy, res->ld, V, &err);
    CHECKF(st == HM_OK, "%s D: %s", what, err.msg);
    if (st == HM_OK) st = hm_model_usage(m, &res->u, &err);
    CHECKF(st == HM_OK, "%s usage: %s", what, err.msg);
    if (st == HM_OK) {
        hm_usage *u = &res->u;
        res->hits = malloc((size_t)r->n_layer * sizeof *res->hits);
        res->misses = malloc((size_t)r->n_layer * sizeof *res->misses);
        memcpy(res->hits, u->layer_hits, (size_t)r->n_layer * sizeof *res->hits);
        memcpy(res->misses, u->layer_misses, (size_t)r->n_layer * sizeof *res->misses);
        CHECKF(u->units[HM_HOME_SSD] + u->units[HM_HOME_RAM] + u->units[HM_HOME_VRAM] == r->n_units,
               "%s: homes %llu + %llu + %llu != %llu units", what, (unsigned long long)u->units[HM_HOME_SSD],
               (unsigned long long)u->units[HM_HOME_RAM], (unsigned long long)u->units[HM_HOME_VRAM],
               (unsigned long long)r->n_units);
        CHECKF(u->vram_slots > 0 && u->units[HM_HOME_VRAM] > 0, "%s: %lld VRAM slots, %llu units in VRAM", what,
               (long long)u->vram_slots, (unsigned long long)u->units[HM_HOME_VRAM]);
        if (ram_budget) {
            hm_ram_tier_stats rs;
            hm_ram_tier_get_stats(m->ram, &rs);
            CHECKF(u->bytes_from_ssd > 0 && u->ram_acquired > 0 && u->units[HM_HOME_SSD] > 0,
                   "%s: %llu bytes from SSD, %llu acquired, %llu units SSD-only", what,
                   (unsigned long long)u->bytes_from_ssd, (unsigned long long)u->ram_acquired,
                   (unsigned long long)u->units[HM_HOME_SSD]);
            CHECKF(rs.pool_bytes * 4 < m->units.expert_bytes, "%s: the RAM pool (%llu bytes) is not far below the "
                   "experts' %llu bytes", what, (unsigned long long)rs.pool_bytes,
                   (unsigned long long)m->units.expert_bytes);
            fprintf(stderr, "%-60s units vram %llu ram %llu ssd %llu; RAM pool %llu KiB (%d slots + %d staging); "
                    "acquired %llu (hits %llu); SSD %llu reads, %.1f KiB/token; left VRAM %llu (RAM %llu)\n", what,
                    (unsigned long long)u->units[HM_HOME_VRAM], (unsigned long long)u->units[HM_HOME_RAM],
                    (unsigned long long)u->units[HM_HOME_SSD], (unsigned long long)(rs.pool_bytes >> 10),
                    rs.n_slots, rs.n_stage, (unsigned long long)u->ram_acquired, (unsigned long long)u->ram_hits,
                    (unsigned long long)u->ssd_reads,
                    u->tokens ? (double)u->bytes_from_ssd / 1024.0 / (double)u->tokens : 0.0,
                    (unsigned long long)(rs.vram_demoted_ram + rs.vram_demoted_ssd),
                    (unsigned long long)rs.vram_demoted_ram);
        }
        res->ok = true;
    }
    hm_model_close(m);
}

static void compare_bits(const char *label, place p, const result *a, const result *b, const ref *r) {
    if (!a->ok || !b->ok) return;
    for (int seq = 0; seq < 2; seq++) {
        const float *x = seq ? a->ld : a->lp, *y = seq ? b->ld : b->lp;
        for (int step = 0; step < NSTEP; step++) {
            const size_t o = (size_t)step * (size_t)r->n_vocab;
            double md = 0;
            for (int32_t i = 0; i < r->n_vocab; i++)
                md = fmax(md, fabs((double)x[o + (size_t)i] - (double)y[o + (size_t)i]));
            CHECKF(!memcmp(x + o, y + o, (size_t)r->n_vocab * sizeof(float)),
                   "%s %s %s step %d: logits with --ram-budget differ from without (max |diff| %.3g)", label,
                   place_name[p], seq ? "D" : "P", step, md);
        }
    }
    for (int32_t l = 0; l < r->n_layer; l++)
        CHECKF(a->hits[l] == b->hits[l] && a->misses[l] == b->misses[l],
               "%s %s layer %d: VRAM hits/misses %llu/%llu without, %llu/%llu with --ram-budget", label,
               place_name[p], l, (unsigned long long)a->hits[l], (unsigned long long)a->misses[l],
               (unsigned long long)b->hits[l], (unsigned long long)b->misses[l]);
    fprintf(stderr, "%s %s: P and D logits bit-identical with and without --ram-budget\n", label, place_name[p]);
}

static void run_model(const char *type, bool quant) {
    char path[] = "/tmp/hm_gpuram_XXXXXX", prof[64];
    if (!gpu_compare_synth(path, "qwen3moe", "tiny", type, 13)) return;
    snprintf(prof, sizeof prof, "%s.profile.json", path);
    char label[32];
    snprintf(label, sizeof label, "tiny %s", type);
    ref r;
    memset(&r, 0, sizeof r);
    hm_err err = {{0}};
    hm_model *m = gpu_compare_open_cpu(path, label, &r.n_vocab, &r.n_layer, &r.k, &r.unit_bytes, &r.n_units, &err);
    if (!m) {
        unlink(path);
        return;
    }
    gpu_compare_ref_pd(m, label, 0x9e3779b97f4a7c15ull, r.n_vocab, r.toks_p, NP, r.toks_d, ND, NDEC, &r.lp, &r.ld,
                       &err);
    const int64_t ram_budget = (int64_t)N_RAM_BUF * (int64_t)hm_ssd_slot_bytes(&m->units);
    CHECKF(hm_model_profile_save(m, prof, HM_PROFILE_FMT_HOTMOE, &err) == HM_OK, "profile: %s", err.msg);
    hm_model_close(m);

    for (int p = P_STATIC; p <= P_NCPU && !test_failures_; p++) {
        result a, b;
        run_placement(path, label, &r, (place)p, prof, 0, false, &a);
        run_placement(path, label, &r, (place)p, prof, ram_budget, false, &b);
        compare_bits(label, (place)p, &a, &b, &r);
        result_free(&a), result_free(&b);
    }
    if (!test_failures_) {
        result c;
        char what[160];
        run_placement(path, label, &r, P_LRU, prof, ram_budget, false, &c);
        if (c.ok) {
            CHECKF(c.u.swaps_in > 0, "%s lru: no unit moved", label);
            snprintf(what, sizeof what, "%s %s --ram-budget P", label, place_name[P_LRU]);
            gpu_compare_logits(what, c.lp, r.lp, NSTEP, r.n_vocab, quant ? NMSE_Q8 : NMSE_BF16);
            snprintf(what, sizeof what, "%s %s --ram-budget D", label, place_name[P_LRU]);
            gpu_compare_logits(what, c.ld, r.ld, NSTEP, r.n_vocab, quant ? NMSE_Q8 : NMSE_F32_EXACT);
        }
        result_free(&c);
    }
    free(r.lp), free(r.ld);
    unlink(path);
    unlink(prof);
}

int main(void) {
    /* the comparison is with and without --ram-budget; prefill streaming, which only the plain
     * mapping has, would make the two differ in which units the GPU computes */
    setenv("HOTMOE_PREFILL_STREAM", "0", 1);
    if (!gpu_compare_have_device()) return 77;
    run_model("q4_k_m", true);
    run_model("f32", false);
    return test_done();
}
