/* test_tier_exclusive.c - the three tiers together (VRAM slots, RAM slots, SSD) with exclusive
 * caching, on a tiny synthesised model (4 layers x 16 experts, k 4) and random skewed routing:
 *
 *   - the VRAM store's tier is a slow fake: a fill lands 0-3 steps after it started (as the CUDA
 *     tier's copier), so units sit in VRAM slots with their copy still in flight;
 *   - each step does what the GPU path does: record the routes in the VRAM store, compute the
 *     units whose VRAM copy has landed "on the GPU" (not touched here), acquire every other routed
 *     unit through the RAM tier (its bytes must equal the file's), release, then the VRAM store's
 *     step end and the RAM tier's (tier_ram.h); now and then the VRAM pool shrinks between steps
 *     (hm_experts_shrink: units leave VRAM outside a step end, as when a session needs the room).
 *
 * After every step end, for every unit:
 *   - its VRAM copy landed -> no RAM buffer at all (hm_ram_tier_where 0);
 *   - it holds a VRAM slot still filling -> no RAM slot it did not already hold (never admitted);
 *   - it left VRAM since the last check -> with RAM policy none, no RAM slot (SSD-only); counted
 *     in vram_demoted_ram + vram_demoted_ssd, and exactly vram_demoted_ram of them in a RAM slot
 *     (placed after the RAM policy's step, so the policy never evicts one just read).
 * And for the whole run: no file read is ever issued for a unit whose VRAM copy has landed (the
 * tier's read hook checks at the moment of the read); the RAM tier's read_bytes equals the sum of
 * the 4096-aligned spans of the parts the hook saw (counted here from the unit table, not from the
 * tier); reads = misses + policy fill reads + prefetch reads; acquired = the routes computed from
 * RAM here, and their hits + misses add up. Policies: VRAM lru / online x RAM none / lru / online
 * / static (profile from a first pass), with prefetch on in one run. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "experts/tier_ram.h"
#include "gguf/gguf.h"
#include "hotmoe_tools.h"
#include "test.h"

enum { N_STEP = 400, MAX_SLOTS = 64 };

static char tmpdir[256], model_path[512];
static hm_gguf *g;
static hm_units units;
static size_t slot_bytes;

/* ---- the slow VRAM tier: fills land `delay` steps later ---- */

typedef struct slow_vram {
    int64_t now;
    int64_t ready_at[MAX_SLOTS];
    uint64_t x; /* rng for the delays */
} slow_vram;

static hm_status sv_fill(void *ctx, const hm_unit_ref *u, int32_t slot, hm_err *err) {
    slow_vram *v = ctx;
    (void)u, (void)err;
    HM_ASSERT(slot >= 0 && slot < MAX_SLOTS);
    v->x = v->x * 6364136223846793005ull + 1442695040888963407ull;
    v->ready_at[slot] = v->now + (int64_t)((v->x >> 33) % 4);
    return HM_OK;
}

static bool sv_ready(void *ctx, int32_t slot) {
    slow_vram *v = ctx;
    return v->now >= v->ready_at[slot];
}

/* ---- the read hook: what the RAM tier asks of the file ---- */

typedef struct reads {
    const hm_experts *vram;
    uint64_t bytes;  /* aligned spans of every part read, from the unit table */
    uint64_t parts;
    int bad;         /* reads of a unit whose VRAM copy had landed */
} reads;

static uint64_t part_span(int32_t l, int32_t e, int p) {
    uint64_t fsz = hm_gguf_file_size(g);
    uint64_t off = hm_units_offset(&units, l, e, (hm_unit_part)p), len = units.layers[l].slab_bytes[p];
    uint64_t s0 = off / 4096 * 4096, s1 = (off + len + 4095) / 4096 * 4096;
    return (s1 < fsz ? s1 : fsz) - s0;
}

static int on_read(void *ctx, int32_t l, int32_t e, hm_unit_part part, uint64_t off, uint64_t len) {
    reads *r = ctx;
    (void)off, (void)len;
    r->bytes += part_span(l, e, (int)part);
    r->parts++;
    if (r->vram && hm_experts_unit(r->vram, l, e)->home == HM_TIER_HOT) r->bad++;
    return 0;
}

static bool same_as_file(int32_t l, int32_t e, const hm_unit_parts *pp) {
    const hm_units_layer *L = &units.layers[l];
    for (int p = 0; p < HM_UNIT_NPART; p++) {
        if (!L->part[p]) {
            if (pp->p[p]) return false;
            continue;
        }
        const char *ref = (const char *)L->part[p]->data + (size_t)e * L->slab_bytes[p];
        if (!pp->p[p] || memcmp(ref, pp->p[p], L->slab_bytes[p]) != 0) return false;
    }
    return true;
}

/* Skewed routing: k distinct experts of 16 per token, low ids far more often. */
static int route(uint64_t *x, int32_t *ids, int k) {
    int n = 0;
    while (n < k) {
        *x = *x * 6364136223846793005ull + 1442695040888963407ull;
        int32_t e = (int32_t)((*x >> 33) % 16);
        if (e >= 8 && ((*x >> 20) & 3)) e %= 5;
        bool dup = false;
        for (int j = 0; j < n; j++) dup |= ids[j] == e;
        if (!dup) ids[n++] = e;
    }
    return n;
}

typedef struct run_cfg {
    hm_policy_kind vram_kind, ram_kind;
    int64_t vram_slots;
    int32_t ram_slots, ram_stage;
    bool prefetch, shrink;
    const hm_profile *profile; /* RAM static */
} run_cfg;

static const char *kind_name(hm_policy_kind k) { return hm_policy_name(k); }

static void run(const run_cfg *c, hm_profile *counts_out) {
    char what[96];
    snprintf(what, sizeof what, "vram %s x %lld, ram %s (%d slots + %d staging)%s%s", kind_name(c->vram_kind),
             (long long)c->vram_slots, kind_name(c->ram_kind), c->ram_slots, c->ram_stage,
             c->prefetch ? ", prefetch" : "", c->shrink ? ", shrink" : "");
    slow_vram sv;
    memset(&sv, 0, sizeof sv);
    sv.x = 99;
    hm_tier vt = {.name = "slow", .ctx = &sv, .fill = sv_fill, .ready = sv_ready, .part = NULL};
    hm_experts_opts vo;
    hm_experts_opts_default(&vo);
    vo.hot_slots = c->vram_slots;
    vo.policy.kind = c->vram_kind;
    vo.policy.window = 4;
    vo.hot_tier = &vt;
    hm_experts *v = NULL;
    hm_err err = {{0}};
    CHECKF(hm_experts_open(&v, &units, &vo, &err) == HM_OK, "%s: %s", what, err.msg);
    reads rd = {.vram = v};
    hm_ram_tier_opts ro;
    hm_ram_tier_opts_default(&ro);
    ro.budget = (int64_t)((size_t)(c->ram_slots + c->ram_stage) * slot_bytes);
    ro.n_stage = c->ram_stage;
    ro.policy.kind = c->ram_kind;
    ro.policy.window = 4;
    ro.profile = c->profile;
    ro.vram = v;
    ro.io.fault = on_read;
    ro.io.fault_ctx = &rd;
    hm_ram_tier *t = NULL;
    if (v) CHECKF(hm_ram_tier_open(&t, model_path, &units, &ro, &err) == HM_OK, "%s: %s", what, err.msg);
    if (!v || !t) {
        hm_ram_tier_close(t);
        hm_experts_close(v);
        return;
    }
    const int32_t NL = units.n_layer, NE = units.n_expert, K = 4;
    const size_t NU = (size_t)NL * (size_t)NE;
    uint8_t *prev_vram = calloc(NU, 1), *prev_ram = calloc(NU, 1);
    for (int32_t l = 0; l < NL; l++) /* the state after open (static placements) */
        for (int32_t e = 0; e < NE; e++) {
            const size_t ui = (size_t)l * (size_t)NE + (size_t)e;
            prev_vram[ui] = hm_experts_unit(v, l, e)->hot_slot >= 0;
            prev_ram[ui] = hm_ram_tier_where(t, l, e) == 2;
        }
    uint64_t x = 4242, acq = 0, left_total = 0;
    int fails = 0;
    for (int stp = 0; stp < N_STEP && fails < 5; stp++) {
        const int n_tok = 1 + stp % 3;
        for (int32_t l = 0; l < NL; l++) {
            int32_t ids[3 * 4], cold[16], ntok[16], nc = 0;
            for (int tk = 0; tk < n_tok; tk++) route(&x, ids + tk * K, K);
            hm_experts_record(v, l, ids, n_tok * K);
            if (counts_out)
                for (int i = 0; i < n_tok * K; i++) counts_out->counts[(size_t)l * (size_t)NE + (size_t)ids[i]]++;
            /* the layer's distinct units not landed in VRAM: the CPU computes them from RAM */
            const int32_t *smap = hm_experts_slot_map(v, l);
            for (int i = 0; i < n_tok * K; i++) {
                if (smap[ids[i]] >= 0) continue;
                int j = 0;
                while (j < nc && cold[j] != ids[i]) j++;
                if (j == nc) cold[nc] = ids[i], ntok[nc++] = 0;
                ntok[j]++;
            }
            for (int32_t done = 0; done < nc;) {
                hm_unit_parts pp[16];
                int32_t nr = 0;
                hm_status st = hm_ram_tier_acquire(t, l, cold + done, ntok + done, nc - done, pp, &nr, &err);
                CHECKF(st == HM_OK && nr > 0, "%s step %d layer %d: %s", what, stp, l, err.msg);
                if (st != HM_OK || nr <= 0) break;
                for (int32_t i = 0; i < nr; i++)
                    CHECKF(same_as_file(l, cold[done + i], &pp[i]), "%s: unit (%d, %d) bytes", what, l, cold[done + i]);
                hm_ram_tier_release(t, l, cold + done, nr);
                done += nr;
            }
            acq += (uint64_t)nc;
            if (c->prefetch && l + 1 < NL) { /* a guess for the next layer: the 3 most skewed ids */
                const int32_t guess[3] = {0, 1, (int32_t)(stp % 5)};
                hm_ram_tier_prefetch(t, l + 1, guess, 3);
            }
        }
        sv.now++;
        CHECKF(hm_experts_step_end(v, n_tok, n_tok > 1, &err) == HM_OK, "%s: %s", what, err.msg);
        if (c->shrink && stp % 97 == 50) { /* units leave VRAM between steps: half the pool, then back */
            hm_experts_stats es;
            hm_experts_get_stats(v, &es);
            CHECK(hm_experts_shrink(v, es.n_slots / 2, &err) == HM_OK);
        }
        hm_ram_tier_stats sb;
        hm_ram_tier_get_stats(t, &sb);
        CHECKF(hm_ram_tier_step_end(t, n_tok, n_tok > 1, &err) == HM_OK, "%s: %s", what, err.msg);
        hm_ram_tier_stats sa;
        hm_ram_tier_get_stats(t, &sa);
        /* the invariants at this step end */
        uint64_t left = 0, left_in_ram = 0;
        for (int32_t l = 0; l < NL; l++)
            for (int32_t e = 0; e < NE; e++) {
                const size_t ui = (size_t)l * (size_t)NE + (size_t)e;
                const hm_unit *vu = hm_experts_unit(v, l, e);
                const int where = hm_ram_tier_where(t, l, e);
                const bool in = vu->hot_slot >= 0;
                if (vu->home == HM_TIER_HOT && where != 0) {
                    CHECKF(0, "%s step %d: unit (%d, %d) landed in VRAM and still in RAM (%d)", what, stp, l, e, where);
                    fails++;
                }
                if (in && vu->home != HM_TIER_HOT && where == 2 && !prev_ram[ui]) {
                    CHECKF(0, "%s step %d: unit (%d, %d) filling VRAM and admitted to a RAM slot", what, stp, l, e);
                    fails++;
                }
                if (prev_vram[ui] && !in) {
                    left++;
                    left_in_ram += where == 2;
                    if (c->ram_kind == HM_POLICY_NONE && where == 2) {
                        CHECKF(0, "%s step %d: unit (%d, %d) left VRAM into a RAM slot with policy none", what, stp,
                               l, e);
                        fails++;
                    }
                }
                prev_vram[ui] = in;
                prev_ram[ui] = where == 2;
            }
        const uint64_t dr = sa.vram_demoted_ram - sb.vram_demoted_ram, ds = sa.vram_demoted_ssd - sb.vram_demoted_ssd;
        CHECKF(dr + ds == left, "%s step %d: %llu units left VRAM, demoted %llu to RAM + %llu to SSD", what, stp,
               (unsigned long long)left, (unsigned long long)dr, (unsigned long long)ds);
        CHECKF(left_in_ram == dr, "%s step %d: %llu demoted to RAM, %llu in a RAM slot", what, stp,
               (unsigned long long)dr, (unsigned long long)left_in_ram);
        left_total += left;
    }
    hm_ram_tier_drain(t); /* every read issued has landed: read_bytes is final */
    hm_ram_tier_stats s;
    hm_ram_tier_get_stats(t, &s);
    CHECKF(rd.bad == 0, "%s: %d reads of units whose VRAM copy had landed", what, rd.bad);
    CHECKF(s.read_bytes == rd.bytes && s.read_bytes > 0, "%s: read_bytes %llu, the reads' spans %llu", what,
           (unsigned long long)s.read_bytes, (unsigned long long)rd.bytes);
    CHECKF(s.reads == s.miss + s.fill_reads + s.prefetch_reads, "%s: %llu reads = %llu misses + %llu fills + %llu "
           "prefetches", what, (unsigned long long)s.reads, (unsigned long long)s.miss,
           (unsigned long long)s.fill_reads, (unsigned long long)s.prefetch_reads);
    CHECKF(s.acquired == acq && s.hit_slot + s.hit_stage + s.hit_prefetch + s.miss == acq,
           "%s: acquired %llu, routes from RAM %llu", what, (unsigned long long)s.acquired, (unsigned long long)acq);
    hm_experts_stats es;
    hm_experts_get_stats(v, &es);
    fprintf(stderr, "%-58s VRAM hits %llu misses %llu swaps %llu/%llu; left VRAM %llu (to RAM %llu, SSD %llu); "
            "released %llu; RAM acquired %llu (slot %llu, stage %llu, prefetch %llu, read %llu); reads %llu "
            "(fills %llu), %.2f MiB\n", what, (unsigned long long)es.hits, (unsigned long long)es.misses,
            (unsigned long long)es.swaps_in, (unsigned long long)es.swaps_out, (unsigned long long)left_total,
            (unsigned long long)s.vram_demoted_ram, (unsigned long long)s.vram_demoted_ssd,
            (unsigned long long)s.vram_released, (unsigned long long)s.acquired, (unsigned long long)s.hit_slot,
            (unsigned long long)s.hit_stage, (unsigned long long)s.hit_prefetch, (unsigned long long)s.miss,
            (unsigned long long)s.reads, (unsigned long long)s.fill_reads, (double)s.read_bytes / (1 << 20));
    CHECKF(s.vram_demoted_ram + s.vram_demoted_ssd == left_total, "%s: demotions", what);
    CHECKF(es.swaps_out > 0 && left_total > 0 && s.vram_released > 0, "%s: the VRAM pool never moved", what);
    if (c->ram_kind != HM_POLICY_NONE) CHECKF(s.hit_slot > 0, "%s: no RAM slot hit", what);
    hm_ram_tier_close(t);
    hm_experts_close(v);
    free(prev_vram), free(prev_ram);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/hm_test_tier_excl_%d", (int)getpid());
    mkdir(tmpdir, 0700);
    snprintf(model_path, sizeof model_path, "%s/tiny.gguf", tmpdir);
    hm_synth_opts so = {.arch = "qwen3moe", .preset = "tiny", .type = "q4_k_m", .seed = 3, .out_path = model_path,
                        .n_threads = 1};
    hm_err err = {{0}};
    if (hm_synth(&so, &err) != HM_OK || hm_gguf_open(&g, model_path, &err) != HM_OK ||
        hm_units_init(&units, g, &err) != HM_OK) {
        fprintf(stderr, "setup: %s\n", err.msg);
        return 1;
    }
    slot_bytes = hm_ssd_slot_bytes(&units);
    CHECK(units.n_layer == 4 && units.n_expert == 16);
    /* a first pass gives the routing's counts: the static RAM placement's profile */
    hm_profile p;
    CHECK(hm_profile_init(&p, units.n_layer, units.n_expert, &err) == HM_OK);
    const run_cfg first = {HM_POLICY_LRU, HM_POLICY_NONE, 12, 0, 6, false, false, NULL};
    run(&first, &p);
    const run_cfg cfgs[] = {
        {HM_POLICY_LRU, HM_POLICY_LRU, 12, 8, 4, false, true, NULL},
        {HM_POLICY_LRU, HM_POLICY_ONLINE, 8, 16, 4, false, false, NULL},
        {HM_POLICY_ONLINE, HM_POLICY_ONLINE, 12, 8, 4, true, true, NULL},
        {HM_POLICY_ONLINE, HM_POLICY_LRU, 16, 6, 6, true, false, NULL},
        {HM_POLICY_ONLINE, HM_POLICY_STATIC, 16, 10, 4, false, true, &p},
        {HM_POLICY_LRU, HM_POLICY_STATIC, 12, 10, 4, true, false, &p},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) run(&cfgs[i], NULL);
    hm_profile_free(&p);
    hm_units_free(&units);
    hm_gguf_close(g);
    unlink(model_path);
    rmdir(tmpdir);
    return test_done();
}
