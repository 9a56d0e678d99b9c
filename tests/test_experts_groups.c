/* test_experts_groups.c - slot groups in the expert store (experts.h: n_groups, one slot budget per
 * GPU, issue 11):
 *
 *   1. static placement with and without peer equals hm_gpu_plan_place_units (src/exec/gpu_split.c,
 *      an independent implementation of the same rule) on random rankings, group sizes and layer
 *      splits, at open and again after a switch to lru and back (residents in the wrong group move);
 *   2. random walks (400 steps) of lru / online / static x peer / no peer x three group layouts,
 *      with a slow fake tier (fills land 0-3 steps later), random pins and a per-group shrink in the
 *      middle: after every step the invariants (every unit in at most one slot, no unit in a dead
 *      slot, no group over its live slots, without peer every resident at home, the per-group
 *      stats and get_stats agree with a recount from the unit table), hits counted here from the
 *      residency seen before each record, and "no room" whenever lru / online left a routed unit
 *      out (so the free slots the store keeps are the ones it can use);
 *      two placements checked by hand: lru's peers, online's window swaps in a full group;
 *   3. hm_experts_shrink_group with pinned units: the HM_ERR_ARG case leaves the store unchanged,
 *      the success moves the pinned unit into its group below keep, dead slots stay unused;
 *   4. bad group options are HM_ERR_ARG (never a crash) and leave *out NULL. */
#include <stdlib.h>
#include <string.h>

#include "experts/experts.h"
#include "exec/gpu_split.h"
#include "test.h"

enum { MAX_SLOTS = 1024, MAX_UNITS = 1024 };

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(uint32_t n) { /* 0..n-1 */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)((rng_state >> 33) % n);
}

/* ---- a slow fake tier: fills land 0-3 steps later; fills into a dead slot are counted ---- */

typedef struct slow_tier {
    int64_t now;
    int64_t ready_at[MAX_SLOTS];
    int64_t dead_from[HM_MAX_GPUS]; /* slots >= dead_from[g] of group g are dead (set by the test) */
    int64_t off[HM_MAX_GPUS + 1];
    int32_t ng;
    const int32_t *layer_group;
    bool peer;
    int bad;  /* fills into a dead slot, or (no peer) outside the unit's home group */
    int64_t fills;
} slow_tier;

static int32_t tier_group(const slow_tier *t, int32_t slot) {
    int32_t g = 0;
    while (g + 1 < t->ng && slot >= t->off[g + 1]) g++;
    return g;
}

static hm_status st_fill(void *ctx, const hm_unit_ref *u, int32_t slot, hm_err *err) {
    slow_tier *t = ctx;
    (void)err;
    HM_ASSERT(slot >= 0 && slot < MAX_SLOTS);
    const int32_t g = tier_group(t, slot);
    if (slot >= t->off[g] + t->dead_from[g] || (!t->peer && g != t->layer_group[u->layer])) t->bad++;
    t->ready_at[slot] = t->now + rnd(4);
    t->fills++;
    return HM_OK;
}

static bool st_ready(void *ctx, int32_t slot) {
    slow_tier *t = ctx;
    return t->now >= t->ready_at[slot];
}

/* ---- opening a grouped store ---- */

static hm_experts *open_groups(hm_units *u, int32_t ng, const int64_t *gslots, const int32_t *lgroup, bool peer,
                               const hm_policy_opts *pol, const hm_profile *p, const hm_tier *tier) {
    hm_err err = {{0}};
    hm_experts_opts o;
    hm_experts_opts_default(&o);
    int64_t sum = 0;
    for (int32_t g = 0; g < ng; g++) sum += gslots[g];
    o.hot_slots = sum;
    o.policy = *pol;
    o.profile = p;
    o.hot_tier = tier;
    o.n_groups = ng;
    o.group_slots = gslots;
    o.layer_group = lgroup;
    o.allow_peer = peer;
    hm_experts *s = NULL;
    hm_status st = hm_experts_open(&s, u, &o, &err);
    CHECKF(st == HM_OK, "%s", err.msg);
    return s;
}

/* The invariants, recounted from the unit table. live[g]: the live slots the test expects. */
static void check_invariants(const hm_experts *s, const hm_units *u, int32_t ng, const int64_t *gslots,
                             const int64_t *live, const int32_t *lgroup, bool peer, const char *what) {
    int64_t off[HM_MAX_GPUS + 1] = {0}, used[HM_MAX_GPUS] = {0}, npeer[HM_MAX_GPUS] = {0}, total_live = 0, n_used = 0;
    for (int32_t g = 0; g < ng; g++) off[g + 1] = off[g] + gslots[g], total_live += live[g];
    static int32_t seen[MAX_SLOTS];
    for (int64_t i = 0; i < off[ng]; i++) seen[i] = -1;
    int bad = 0;
    CHECK(hm_experts_n_groups(s) == ng);
    for (int32_t g = 0; g < ng; g++)
        for (int64_t sl = off[g]; sl < off[g + 1]; sl++)
            if (hm_experts_slot_group(s, sl) != g) bad++;
    CHECKF(bad == 0, "%s: slot groups", what);
    for (int32_t l = 0; l < u->n_layer; l++) {
        const int32_t *map = hm_experts_slot_map(s, l);
        int32_t res = 0;
        for (int32_t e = 0; e < u->layers[l].n_expert; e++) {
            const hm_unit *x = hm_experts_unit(s, l, e);
            const int32_t sl = x->hot_slot;
            if (x->home == HM_TIER_HOT) {
                res++;
                if (sl < 0 || x->filling || map[e] != sl) bad++;
            } else if (map[e] != -1) {
                bad++;
            }
            if (sl < 0) continue;
            if (sl >= off[ng] || seen[sl] >= 0) { /* out of the index space, or two units in one slot */
                CHECKF(0, "%s: unit %d/%d in slot %d (held by %d)", what, l, e, sl, sl < off[ng] ? seen[sl] : -2);
                continue;
            }
            seen[sl] = l * 10000 + e;
            int32_t g = 0;
            while (g + 1 < ng && sl >= off[g + 1]) g++;
            CHECKF(sl < off[g] + live[g], "%s: unit %d/%d in dead slot %d of group %d", what, l, e, sl, g);
            CHECKF(peer || g == lgroup[l], "%s: unit %d/%d (home %d) in group %d without peer", what, l, e,
                   lgroup[l], g);
            used[g]++, n_used++;
            npeer[g] += g != lgroup[l];
        }
        hm_experts_stats st;
        hm_experts_get_stats(s, &st);
        if (st.layer_resident[l] != res) bad++;
    }
    CHECKF(bad == 0, "%s: %d residency mismatches", what, bad);
    for (int32_t g = 0; g < ng; g++) {
        int64_t a, b, c;
        hm_experts_group_stats(s, g, &a, &b, &c);
        CHECKF(a == live[g] && b == used[g] && c == npeer[g] && used[g] <= live[g],
               "%s: group %d stats %lld %lld %lld, recount %lld %lld %lld", what, g, (long long)a, (long long)b,
               (long long)c, (long long)live[g], (long long)used[g], (long long)npeer[g]);
    }
    hm_experts_stats st;
    hm_experts_get_stats(s, &st);
    CHECKF(st.n_slots == total_live && st.n_used == n_used, "%s: stats %lld/%lld, recount %lld/%lld", what,
           (long long)st.n_used, (long long)st.n_slots, (long long)n_used, (long long)total_live);
}

/* ---- 1. static = hm_gpu_plan_place_units ---- */

typedef struct rk {
    uint64_t count;
    int32_t ui;
} rk;

static int cmp_rk(const void *a, const void *b) { /* count descending, unit index ascending */
    const rk *x = a, *y = b;
    if (x->count != y->count) return x->count > y->count ? -1 : 1;
    return (x->ui > y->ui) - (x->ui < y->ui);
}

/* Compare the store's placement with the plan's: dev[k] for the k-th ranked unit. */
static void compare_static(const hm_experts *s, const rk *r, int64_t n, const int32_t *dev, const uint8_t *pf,
                           int32_t n_expert, const int32_t *lgroup, const char *what) {
    int bad = 0;
    static uint8_t ranked_unit[MAX_UNITS];
    memset(ranked_unit, 0, sizeof ranked_unit);
    for (int64_t k = 0; k < n; k++) {
        const int32_t l = r[k].ui / n_expert, e = r[k].ui % n_expert;
        const hm_unit *x = hm_experts_unit(s, l, e);
        const int32_t g = x->hot_slot >= 0 ? hm_experts_slot_group(s, x->hot_slot) : -1;
        ranked_unit[r[k].ui] = 1;
        if (g != dev[k] || (g >= 0 && (g != lgroup[l]) != (pf[k] != 0))) {
            if (bad++ < 5)
                fprintf(stderr, "%s: rank %lld unit %d/%d: store group %d, plan %d (peer %d)\n", what, (long long)k, l,
                        e, g, dev[k], pf[k]);
        }
    }
    const hm_units *u = hm_experts_units(s);
    for (int32_t l = 0; l < u->n_layer; l++) /* units the ranking left out (count 0) stay out */
        for (int32_t e = 0; e < n_expert; e++)
            if (!ranked_unit[l * n_expert + e] && hm_experts_unit(s, l, e)->hot_slot >= 0) bad++;
    CHECKF(bad == 0, "%s: %d units placed differently from hm_gpu_plan_place_units", what, bad);
}

static void test_static_equals_plan(void) {
    hm_err err = {{0}};
    for (int trial = 0; trial < 60; trial++) {
        const int32_t n_layer = 2 + (int32_t)rnd(9), n_expert = 4 + (int32_t)rnd(13), ng = 2 + (int32_t)rnd(3);
        hm_units u;
        CHECK(hm_units_init_geom(&u, n_layer, n_expert, 2, 1000, &err) == HM_OK);
        /* a contiguous layer split (a group may get no layer), slots per group (some 0) */
        hm_gpu_plan plan;
        memset(&plan, 0, sizeof plan);
        plan.n_dev = ng, plan.n_layer = n_layer, plan.output_dev = ng - 1;
        int32_t lgroup[64], at = 0;
        int64_t gslots[HM_MAX_GPUS];
        for (int32_t g = 0; g < ng; g++) {
            int32_t take = g == ng - 1 ? n_layer - at : (int32_t)rnd((uint32_t)(n_layer - at + 1));
            plan.layer_begin[g] = at, plan.layer_end[g] = at + take;
            for (int32_t l = at; l < at + take; l++) lgroup[l] = g;
            at += take;
            gslots[g] = rnd(4) == 0 ? 0 : (int64_t)rnd((uint32_t)(n_layer * n_expert / ng + 4));
        }
        hm_profile p;
        CHECK(hm_profile_init(&p, n_layer, n_expert, &err) == HM_OK);
        const int64_t nu = (int64_t)n_layer * n_expert;
        rk r[MAX_UNITS];
        int64_t n = 0;
        const uint32_t span = 1 + rnd(40); /* small spans make ties */
        for (int64_t ui = 0; ui < nu; ui++) {
            p.counts[ui] = rnd(5) == 0 ? 0 : rnd(span) + 1;
            if (p.counts[ui]) r[n++] = (rk){p.counts[ui], (int32_t)ui};
        }
        qsort(r, (size_t)n, sizeof *r, cmp_rk);
        int32_t unit_layer[MAX_UNITS], dev[MAX_UNITS];
        uint8_t pf[MAX_UNITS];
        for (int64_t k = 0; k < n; k++) unit_layer[k] = r[k].ui / n_expert;
        for (int peer = 0; peer < 2; peer++) {
            int64_t used[HM_MAX_GPUS];
            const int64_t placed = hm_gpu_plan_place_units(&plan, gslots, unit_layer, n, peer, dev, pf, used);
            hm_policy_opts pol;
            hm_policy_opts_default(&pol);
            pol.kind = HM_POLICY_STATIC;
            hm_experts *s = open_groups(&u, ng, gslots, lgroup, peer, &pol, &p, NULL);
            if (!s) continue;
            char what[96];
            snprintf(what, sizeof what, "trial %d (%d layers x %d, %d groups, peer %d)", trial, n_layer, n_expert, ng,
                     peer);
            compare_static(s, r, n, dev, pf, n_expert, lgroup, what);
            check_invariants(s, &u, ng, gslots, gslots, lgroup, peer, what);
            hm_experts_stats st;
            hm_experts_get_stats(s, &st);
            CHECKF(st.n_used == placed, "%s: %lld placed, plan %lld", what, (long long)st.n_used, (long long)placed);
            /* lru moves units around (peer ones too), a switch back re-plans the same placement */
            CHECK(hm_experts_set_policy(s, HM_POLICY_LRU, NULL, &err) == HM_OK);
            for (int step = 0; step < 30; step++) {
                int32_t ids[4];
                const int32_t l = (int32_t)rnd((uint32_t)n_layer);
                for (int i = 0; i < 4; i++) ids[i] = (int32_t)rnd((uint32_t)n_expert);
                hm_experts_record(s, l, ids, 4);
                CHECK(hm_experts_step_end(s, 2, false, &err) == HM_OK);
            }
            CHECKF(hm_experts_set_policy(s, HM_POLICY_STATIC, NULL, &err) == HM_OK, "%s", err.msg);
            strcat(what, " after lru");
            compare_static(s, r, n, dev, pf, n_expert, lgroup, what);
            check_invariants(s, &u, ng, gslots, gslots, lgroup, peer, what);
            hm_experts_close(s);
        }
        hm_profile_free(&p);
        hm_units_free(&u);
    }
}

/* ---- 2. random walks ---- */

typedef struct layout {
    int32_t ng;
    int64_t slots[3];
    int32_t (*home)(int32_t l);
} layout;

static int32_t home_halves(int32_t l) { return l < 3 ? 0 : 1; }  /* 6 layers: 3 + 3 */
static int32_t home_mod3(int32_t l) { return l % 3; }            /* interleaved, 3 groups */
static int32_t home_skew(int32_t l) { return l == 5 ? 1 : 0; }   /* group 1 is home of one layer */

static void walk(hm_policy_kind kind, bool peer, const layout *ly, int li) {
    hm_err err = {{0}};
    enum { NL = 6, NE = 16, K = 2 };
    hm_units u;
    CHECK(hm_units_init_geom(&u, NL, NE, K, 1000, &err) == HM_OK);
    int32_t lgroup[NL];
    for (int32_t l = 0; l < NL; l++) lgroup[l] = ly->home(l);
    slow_tier t;
    memset(&t, 0, sizeof t);
    t.ng = ly->ng, t.layer_group = lgroup, t.peer = peer;
    int64_t live[3];
    for (int32_t g = 0; g < ly->ng; g++) {
        t.off[g + 1] = t.off[g] + ly->slots[g];
        t.dead_from[g] = live[g] = ly->slots[g];
    }
    hm_tier tier = {.name = "slow", .ctx = &t, .fill = st_fill, .ready = st_ready};
    /* skewed routing: expert e of layer l weighs (e * 7 + l * 3) % NE + 1 squared */
    uint32_t w[NL][NE], wsum[NL] = {0};
    for (int32_t l = 0; l < NL; l++)
        for (int32_t e = 0; e < NE; e++) {
            uint32_t x = (uint32_t)((e * 7 + l * 3) % NE + 1);
            wsum[l] += w[l][e] = x * x;
        }
    hm_profile p;
    CHECK(hm_profile_init(&p, NL, NE, &err) == HM_OK);
    for (int32_t l = 0; l < NL; l++)
        for (int32_t e = 0; e < NE; e++) p.counts[l * NE + e] = w[l][e];
    hm_policy_opts pol;
    hm_policy_opts_default(&pol);
    pol.kind = kind;
    pol.window = 4;
    pol.admit_misses = 1;
    pol.update_rate = 0.2f;
    hm_experts *s = open_groups(&u, ly->ng, ly->slots, lgroup, peer, &pol, kind == HM_POLICY_STATIC ? &p : NULL, &tier);
    if (!s) {
        hm_profile_free(&p);
        hm_units_free(&u);
        return;
    }
    char what[96];
    uint64_t hits = 0, routed = 0;
    int32_t pinned[8][2];
    int n_pinned = 0, shrink_ok = 0;
    for (int step = 0; step < 400; step++) {
        snprintf(what, sizeof what, "%s peer %d layout %d step %d", hm_policy_name(kind), peer, li, step);
        const int32_t n_tok = 1 + (int32_t)rnd(3);
        static uint8_t routed_now[NL][NE];
        memset(routed_now, 0, sizeof routed_now);
        for (int32_t l = 0; l < NL; l++) {
            int32_t ids[3 * K];
            for (int32_t i = 0; i < n_tok * K; i++) {
                uint32_t x = rnd(wsum[l]);
                int32_t e = 0;
                while (x >= w[l][e]) x -= w[l][e++];
                ids[i] = e;
                routed_now[l][e] = 1;
            }
            for (int32_t i = 0; i < n_tok * K; i++) /* hits: HOT at the time of the record */
                hits += hm_experts_unit(s, l, ids[i])->home == HM_TIER_HOT;
            routed += (uint64_t)(n_tok * K);
            hm_experts_record(s, l, ids, n_tok * K);
        }
        t.now++;
        CHECKF(hm_experts_step_end(s, n_tok, false, &err) == HM_OK, "%s: %s", what, err.msg);
        check_invariants(s, &u, ly->ng, ly->slots, live, lgroup, peer, what);
        /* a routed unit left out by lru / online: its group (no peer) or the pool (peer) is full */
        if (kind != HM_POLICY_STATIC) {
            int bad = 0;
            for (int32_t l = 0; l < NL; l++)
                for (int32_t e = 0; e < NE; e++) {
                    const hm_unit *x = hm_experts_unit(s, l, e);
                    if (!routed_now[l][e] || x->hot_slot >= 0) continue;
                    int64_t a, b, full = 1;
                    if (peer) {
                        for (int32_t g = 0; g < ly->ng; g++) hm_experts_group_stats(s, g, &a, &b, NULL), full &= a == b;
                    } else {
                        hm_experts_group_stats(s, lgroup[l], &a, &b, NULL);
                        full = a == b;
                    }
                    if (!full) bad++;
                }
            CHECKF(bad == 0, "%s: %d routed units left out with room for them", what, bad);
        }
        /* pins: a pinned resident stays resident */
        for (int i = 0; i < n_pinned; i++)
            CHECKF(hm_experts_unit(s, pinned[i][0], pinned[i][1])->hot_slot >= 0, "%s: pinned unit left", what);
        if (step % 37 == 5 && n_pinned < 8) {
            int32_t l = (int32_t)rnd(NL), e = (int32_t)rnd(NE);
            if (hm_experts_unit(s, l, e)->hot_slot >= 0 && !hm_experts_unit(s, l, e)->pin) {
                hm_experts_pin(s, l, e);
                pinned[n_pinned][0] = l, pinned[n_pinned][1] = e, n_pinned++;
            }
        }
        if (step % 53 == 20 && n_pinned > 0) {
            n_pinned--;
            hm_experts_unpin(s, pinned[n_pinned][0], pinned[n_pinned][1]);
        }
        if (step == 200 || step == 300) { /* a group gives up slots between steps */
            const int32_t g = (int32_t)rnd((uint32_t)ly->ng);
            const int64_t keep = live[g] > 0 ? (int64_t)rnd((uint32_t)live[g]) : 0;
            hm_status st = hm_experts_shrink_group(s, g, keep, &err);
            CHECKF(st == HM_OK || (st == HM_ERR_ARG && strstr(err.msg, "pinned")), "%s: shrink: %s", what, err.msg);
            if (st == HM_OK) {
                live[g] = keep < live[g] ? keep : live[g];
                t.dead_from[g] = live[g];
                shrink_ok++;
            }
            check_invariants(s, &u, ly->ng, ly->slots, live, lgroup, peer, what);
        }
    }
    hm_experts_stats st;
    hm_experts_get_stats(s, &st);
    CHECKF(st.hits == hits && st.hits + st.misses == routed, "%s: hits %llu (counted %llu), +misses %llu of %llu",
           what, (unsigned long long)st.hits, (unsigned long long)hits, (unsigned long long)(st.hits + st.misses),
           (unsigned long long)routed);
    CHECKF(st.hits > 0 && st.hits < routed, "%s: %llu hits of %llu", what, (unsigned long long)st.hits,
           (unsigned long long)routed);
    CHECKF(t.bad == 0, "%s: %d fills into a dead slot or outside the home group", what, t.bad);
    CHECK(t.fills > 0);
    (void)shrink_ok;
    hm_experts_close(s);
    hm_profile_free(&p);
    hm_units_free(&u);
}

static void test_random_walks(void) {
    const layout ly[3] = {
        {2, {10, 14, 0}, home_halves},
        {3, {8, 0, 13}, home_mod3},
        {2, {12, 9, 0}, home_skew},
    };
    const hm_policy_kind kinds[3] = {HM_POLICY_LRU, HM_POLICY_ONLINE, HM_POLICY_STATIC};
    for (int k = 0; k < 3; k++)
        for (int peer = 0; peer < 2; peer++)
            for (int li = 0; li < 3; li++) walk(kinds[k], peer, &ly[li], li);
}

/* The peer flag is used: with peer a unit whose home group is full sits in another one. */
static void test_peer_used(void) {
    hm_err err = {{0}};
    hm_units u;
    CHECK(hm_units_init_geom(&u, 2, 8, 1, 1000, &err) == HM_OK);
    const int64_t gs[2] = {2, 4};
    const int32_t lg[2] = {0, 1};
    hm_policy_opts pol;
    hm_policy_opts_default(&pol);
    pol.kind = HM_POLICY_LRU;
    for (int peer = 0; peer < 2; peer++) {
        hm_experts *s = open_groups(&u, 2, gs, lg, peer, &pol, NULL, NULL);
        if (!s) continue;
        /* layer 0 routes 4 distinct experts in one step: 2 fit at home, 2 more only as peers */
        const int32_t ids[4] = {0, 1, 2, 3};
        hm_experts_record(s, 0, ids, 4);
        CHECK(hm_experts_step_end(s, 4, true, &err) == HM_OK);
        int64_t a, b, c;
        hm_experts_group_stats(s, 0, &a, &b, &c);
        CHECK(a == 2 && b == 2 && c == 0);
        hm_experts_group_stats(s, 1, &a, &b, &c);
        CHECKF(a == 4 && b == (peer ? 2 : 0) && c == b, "peer %d: group 1 %lld %lld %lld", peer, (long long)a,
               (long long)b, (long long)c);
        /* layer 1 routes 4: 0 and 1 take group 1's free slots. Then no peer: group 1's LRU residents
         * (the peers 0/2, 0/3) go for 1/2 and 1/3, all four at home. Peer: the global LRU tail goes
         * (0/0, then 0/1, in group 0) and 1/2, 1/3 take those slots as peers (home is full). */
        const int32_t ids1[4] = {0, 1, 2, 3};
        hm_experts_record(s, 1, ids1, 4);
        CHECK(hm_experts_step_end(s, 4, true, &err) == HM_OK);
        hm_experts_group_stats(s, 1, &a, &b, &c);
        CHECKF(b == 4 && c == (peer ? 2 : 0), "peer %d: group 1 after its layer: %lld used, %lld peer", peer,
               (long long)b, (long long)c);
        hm_experts_group_stats(s, 0, &a, &b, &c);
        CHECKF(b == 2 && c == (peer ? 2 : 0), "peer %d: group 0 after layer 1: %lld used, %lld peer", peer,
               (long long)b, (long long)c);
        for (int32_t e = 0; e < 4; e++) {
            const int32_t sl = hm_experts_unit(s, 1, e)->hot_slot;
            CHECK(peer && e >= 2 ? (sl >= 0 && sl < 2) : sl >= 2);
        }
        CHECK(peer ? hm_experts_unit(s, 0, 0)->hot_slot < 0 && hm_experts_unit(s, 0, 3)->hot_slot >= 2
                   : hm_experts_unit(s, 0, 0)->hot_slot >= 0 && hm_experts_unit(s, 0, 3)->hot_slot < 0);
        hm_experts_close(s);
    }
    hm_units_free(&u);
}

/* online without peer: a full group swaps at window ends even while another group has free slots
 * nobody of its own layers wants (the single pool's "no swaps while a slot is free" is per group) */
static void test_online_full_group(void) {
    hm_err err = {{0}};
    hm_units u;
    CHECK(hm_units_init_geom(&u, 2, 8, 2, 1000, &err) == HM_OK);
    const int64_t gs[2] = {2, 8};
    const int32_t lg[2] = {0, 1};
    hm_policy_opts pol;
    hm_policy_opts_default(&pol);
    pol.kind = HM_POLICY_ONLINE;
    pol.window = 4;
    pol.admit_misses = 1;
    pol.update_rate = 1.0f;
    hm_experts *s = open_groups(&u, 2, gs, lg, false, &pol, NULL, NULL);
    if (!s) return;
    const int32_t a[2] = {0, 1}, b[2] = {2, 3};
    hm_experts_record(s, 0, a, 2); /* 0/0 and 0/1 fill group 0 */
    CHECK(hm_experts_step_end(s, 1, false, &err) == HM_OK);
    for (int step = 1; step < 12; step++) { /* then only 0/2 and 0/3 are routed */
        hm_experts_record(s, 0, b, 2);
        CHECK(hm_experts_step_end(s, 1, false, &err) == HM_OK);
    }
    CHECK(hm_experts_unit(s, 0, 2)->hot_slot >= 0 && hm_experts_unit(s, 0, 3)->hot_slot >= 0);
    CHECK(hm_experts_unit(s, 0, 0)->hot_slot < 0 && hm_experts_unit(s, 0, 1)->hot_slot < 0);
    int64_t n, used;
    hm_experts_group_stats(s, 1, &n, &used, NULL);
    CHECK(n == 8 && used == 0);
    hm_experts_close(s);
    hm_units_free(&u);
}

/* ---- 3. shrink_group with pinned units ---- */

static void test_shrink_group(void) {
    hm_err err = {{0}};
    hm_units u;
    CHECK(hm_units_init_geom(&u, 2, 8, 1, 1000, &err) == HM_OK);
    const int64_t gs[2] = {4, 4};
    const int32_t lg[2] = {0, 1};
    hm_policy_opts pol;
    hm_policy_opts_default(&pol);
    pol.kind = HM_POLICY_LRU;
    hm_experts *s = open_groups(&u, 2, gs, lg, false, &pol, NULL, NULL);
    if (!s) return;
    const int32_t ids[4] = {0, 1, 2, 3};
    hm_experts_record(s, 0, ids, 4); /* group 0's slots 0..3 pop in order: expert e in slot e */
    hm_experts_record(s, 1, ids, 4);
    CHECK(hm_experts_step_end(s, 4, true, &err) == HM_OK);
    for (int32_t e = 0; e < 4; e++) CHECK(hm_experts_unit(s, 0, e)->hot_slot == e);
    CHECK(hm_experts_shrink(s, 2, &err) == HM_ERR_ARG && strstr(err.msg, "group")); /* the pool has groups */
    CHECK(hm_experts_shrink_group(s, 2, 1, &err) == HM_ERR_ARG);
    CHECK(hm_experts_shrink_group(s, -1, 1, &err) == HM_ERR_ARG);
    CHECK(hm_experts_shrink_group(s, 0, -1, &err) == HM_ERR_ARG);
    hm_experts_pin(s, 0, 3);
    /* slot 3 holds a pinned unit, the group has no free slot below 3: refused, nothing moves */
    CHECK(hm_experts_shrink_group(s, 0, 3, &err) == HM_ERR_ARG && strstr(err.msg, "pinned"));
    for (int32_t e = 0; e < 4; e++) CHECK(hm_experts_unit(s, 0, e)->hot_slot == e);
    const int64_t live0[2] = {4, 4};
    check_invariants(s, &u, 2, gs, live0, lg, false, "refused shrink");
    /* between steps only */
    const int32_t one[1] = {5};
    hm_experts_record(s, 0, one, 1);
    CHECK(hm_experts_shrink_group(s, 0, 1, &err) == HM_ERR_ARG && strstr(err.msg, "between steps"));
    CHECK(hm_experts_step_end(s, 1, false, &err) == HM_OK); /* 5 takes the LRU of group 0: expert 0 */
    CHECK(hm_experts_unit(s, 0, 5)->hot_slot == 0 && hm_experts_unit(s, 0, 0)->hot_slot < 0);
    /* policy none empties the groups but the pinned unit; group 0 then keeps 1 slot: 3 moves to 0 */
    CHECK(hm_experts_set_policy(s, HM_POLICY_NONE, NULL, &err) == HM_OK);
    CHECKF(hm_experts_shrink_group(s, 0, 1, &err) == HM_OK, "%s", err.msg);
    CHECK(hm_experts_unit(s, 0, 3)->hot_slot == 0 && hm_experts_unit(s, 0, 3)->home == HM_TIER_HOT);
    const int64_t live1[2] = {1, 4};
    check_invariants(s, &u, 2, gs, live1, lg, false, "shrunk group 0");
    CHECK(hm_experts_shrink_group(s, 0, 3, &err) == HM_OK); /* growing is a no-op */
    check_invariants(s, &u, 2, gs, live1, lg, false, "no-op shrink");
    /* lru: layer 0 has no room (its one slot pinned), layer 1 fills its 4 slots and nothing lands in
     * group 0's dead slots 1..3 */
    CHECK(hm_experts_set_policy(s, HM_POLICY_LRU, NULL, &err) == HM_OK);
    for (int step = 0; step < 20; step++) {
        int32_t a[2] = {(int32_t)rnd(8), (int32_t)rnd(8)};
        hm_experts_record(s, 0, a, 2);
        hm_experts_record(s, 1, a, 2);
        CHECK(hm_experts_step_end(s, 2, false, &err) == HM_OK);
        check_invariants(s, &u, 2, gs, live1, lg, false, "after shrink");
    }
    /* group 1 to zero; then the pinned unit's group to zero is refused (no slot below 0) */
    CHECK(hm_experts_shrink_group(s, 1, 0, &err) == HM_OK);
    const int64_t live2[2] = {1, 0};
    check_invariants(s, &u, 2, gs, live2, lg, false, "group 1 gone");
    CHECK(hm_experts_shrink_group(s, 0, 0, &err) == HM_ERR_ARG);
    hm_experts_unpin(s, 0, 3);
    CHECK(hm_experts_shrink_group(s, 0, 0, &err) == HM_OK);
    const int64_t live3[2] = {0, 0};
    check_invariants(s, &u, 2, gs, live3, lg, false, "all gone");
    hm_experts_close(s);

    /* a pinned peer unit (home group 1, in group 0) moves within group 0 */
    hm_policy_opts_default(&pol);
    pol.kind = HM_POLICY_LRU;
    const int64_t gs2[2] = {4, 1};
    s = open_groups(&u, 2, gs2, lg, true, &pol, NULL, NULL);
    if (!s) return;
    const int32_t i1[3] = {0, 1, 2};
    hm_experts_record(s, 1, i1, 3); /* 0 at home (slot 4), 1 and 2 peers in group 0's slots 0 and 1 */
    CHECK(hm_experts_step_end(s, 3, true, &err) == HM_OK);
    CHECK(hm_experts_unit(s, 1, 0)->hot_slot == 4 && hm_experts_unit(s, 1, 1)->hot_slot == 0 &&
          hm_experts_unit(s, 1, 2)->hot_slot == 1);
    hm_experts_pin(s, 1, 2);
    CHECKF(hm_experts_shrink_group(s, 0, 1, &err) == HM_ERR_ARG, "slot 0 is taken: no free slot below 1");
    CHECKF(hm_experts_shrink_group(s, 0, 3, &err) == HM_OK, "%s", err.msg); /* 1 stays: slot 3 dies */
    /* policy none frees slot 0 (1/1 leaves); the pinned peer 1/2 moves from slot 1 to slot 0 */
    CHECK(hm_experts_set_policy(s, HM_POLICY_NONE, NULL, &err) == HM_OK);
    CHECKF(hm_experts_shrink_group(s, 0, 1, &err) == HM_OK, "%s", err.msg);
    CHECK(hm_experts_unit(s, 1, 2)->hot_slot == 0 && hm_experts_unit(s, 1, 1)->hot_slot < 0);
    int64_t a, b, c;
    hm_experts_group_stats(s, 0, &a, &b, &c);
    CHECK(a == 1 && b == 1 && c == 1);
    const int64_t live4[2] = {1, 1};
    check_invariants(s, &u, 2, gs2, live4, lg, true, "peer shrink");
    hm_experts_unpin(s, 1, 2);
    hm_experts_close(s);
    hm_units_free(&u);
}

/* ---- 4. bad options ---- */

static void test_bad_opts(void) {
    hm_err err = {{0}};
    hm_units u;
    CHECK(hm_units_init_geom(&u, 3, 4, 1, 1000, &err) == HM_OK);
    const int64_t gs[2] = {3, 2}, neg[2] = {-1, 6};
    const int32_t lg[3] = {0, 1, 1}, lg_hi[3] = {0, 2, 1}, lg_lo[3] = {-1, 0, 1};
    struct {
        int64_t hot;
        int32_t ng;
        const int64_t *gs;
        const int32_t *lg;
        const char *what;
    } cases[] = {
        {6, 2, gs, lg, "sum 5, pool 6"},
        {4, 2, gs, lg, "sum 5, pool 4"},
        {-1, 2, gs, lg, "budget-sized pool with groups"},
        {5, 2, gs, lg_hi, "home group 2 of 2"},
        {5, 2, gs, lg_lo, "home group -1"},
        {5, 2, NULL, lg, "no group slots"},
        {5, 2, gs, NULL, "no layer groups"},
        {5, 2, NULL, NULL, "no arrays"},
        {5, 2, neg, lg, "negative group slots"},
        {5, -1, gs, lg, "negative group count"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        hm_experts_opts o;
        hm_experts_opts_default(&o);
        o.policy.kind = HM_POLICY_LRU;
        o.hot_slots = cases[i].hot;
        o.n_groups = cases[i].ng;
        o.group_slots = cases[i].gs;
        o.layer_group = cases[i].lg;
        hm_experts *s = (hm_experts *)&o; /* must come back NULL */
        err.msg[0] = 0;
        hm_status st = hm_experts_open(&s, &u, &o, &err);
        CHECKF(st == HM_ERR_ARG && s == NULL && err.msg[0], "%s: status %d", cases[i].what, (int)st);
        hm_experts_close(st == HM_OK ? s : NULL);
    }
    /* n_groups 1 with arrays is the single pool; queries without groups */
    hm_experts_opts o;
    hm_experts_opts_default(&o);
    o.policy.kind = HM_POLICY_LRU;
    o.hot_slots = 5;
    o.n_groups = 1;
    o.group_slots = gs;
    o.layer_group = lg_hi;
    hm_experts *s = NULL;
    CHECKF(hm_experts_open(&s, &u, &o, &err) == HM_OK, "%s", err.msg);
    if (s) {
        int64_t a, b, c;
        CHECK(hm_experts_n_groups(s) == 1 && hm_experts_slot_group(s, 4) == 0);
        hm_experts_group_stats(s, 0, &a, &b, &c);
        CHECK(a == 5 && b == 0 && c == 0);
        hm_experts_group_stats(s, 1, &a, &b, &c);
        CHECK(a == 0 && b == 0 && c == 0);
        CHECK(hm_experts_shrink_group(s, 0, 3, &err) == HM_OK);
        hm_experts_stats st;
        hm_experts_get_stats(s, &st);
        CHECK(st.n_slots == 3);
        hm_experts_close(s);
    }
    hm_units_free(&u);
}

int main(void) {
    test_static_equals_plan();
    test_random_walks();
    test_peer_used();
    test_online_full_group();
    test_shrink_group();
    test_bad_opts();
    return test_done();
}
