/* test_policy_elite.c - the elite policy (a static share of the slots that never churns, the rest
 * online) and the per-step insert cap (GGML_CUDA_MOE_CACHE_INSERTS), on traces small enough to
 * count by hand; plain online on the same trace is the contrast that shows the elite's guard. */
#include <string.h>

#include "experts/experts.h"
#include "test.h"

static hm_experts *open_store(hm_units *u, int32_t n_expert, int32_t k, int64_t slots, const hm_policy_opts *pol,
                              const hm_profile *p) {
    hm_err err = {{0}};
    CHECK(hm_units_init_geom(u, 1, n_expert, k, 1000, &err) == HM_OK);
    hm_experts_opts o;
    hm_experts_opts_default(&o);
    o.hot_slots = slots;
    o.policy = *pol;
    o.profile = p;
    hm_experts *s = NULL;
    CHECKF(hm_experts_open(&s, u, &o, &err) == HM_OK, "%s", err.msg);
    return s;
}

static bool hot(hm_experts *s, int32_t e) { return hm_experts_unit(s, 0, e)->home == HM_TIER_HOT; }

static void step(hm_experts *s, const int32_t *ids, int k) {
    hm_experts_record(s, 0, ids, k);
    CHECK(hm_experts_step_end(s, 1, false, NULL) == HM_OK);
}

/* 8 experts, 4 slots, elite 50 % = 2 units. Profile counts 10 8 1 1 0 0 0 0: the elite is {0, 1},
 * placed at open; the two other slots start empty. Then 64 steps route only 4..7 in turn: the
 * online half takes them (admission after 1 miss, 2-step windows, any rate, no hysteresis), and
 * 0 and 1 stay all along. Plain online warm-started from the same profile holds 0 1 2 3 at open
 * and, on the same trace, swaps 0 and 1 out (their value decays while 4..7 are routed). */
static void test_elite_profile(void) {
    hm_err err = {{0}};
    hm_profile p;
    CHECK(hm_profile_init(&p, 1, 8, &err) == HM_OK);
    const uint64_t c[8] = {10, 8, 1, 1, 0, 0, 0, 0};
    memcpy(p.counts, c, sizeof c);
    p.k = 1;
    for (int pass = 0; pass < 2; pass++) {
        hm_policy_opts pol;
        hm_policy_opts_default(&pol);
        pol.kind = pass == 0 ? HM_POLICY_ELITE : HM_POLICY_ONLINE;
        pol.warm_start = pass == 1;
        pol.elite_pct = 50;
        pol.admit_misses = 1;
        pol.window = 2;
        pol.update_rate = 1;
        pol.hysteresis = 0;
        hm_units u;
        hm_experts *s = open_store(&u, 8, 1, 4, &pol, &p);
        hm_experts_stats st;
        hm_experts_get_stats(s, &st);
        if (pass == 0) {
            CHECK(hot(s, 0) && hot(s, 1) && st.n_used == 2);
            CHECK(hm_experts_unit(s, 0, 0)->elite && hm_experts_unit(s, 0, 1)->elite && !hm_experts_unit(s, 0, 2)->elite);
            CHECK(st.elite_units == 2);
        } else {
            CHECK(hot(s, 0) && hot(s, 1) && hot(s, 2) && hot(s, 3));
        }
        bool kept = true;
        for (int t = 0; t < 64; t++) {
            const int32_t id = 4 + t % 4;
            step(s, &id, 1);
            kept = kept && hot(s, 0) && hot(s, 1);
        }
        hm_experts_get_stats(s, &st);
        if (pass == 0) {
            CHECK(kept);                      /* the elite never churned */
            CHECK(st.n_used == 4 && st.swaps_out >= 1); /* the online half did */
        } else {
            CHECK(!kept && (!hot(s, 0) || !hot(s, 1))); /* online let them go */
        }
        hm_experts_close(s);
        hm_units_free(&u);
    }
    hm_profile_free(&p);
}

/* No profile: the first window (4 steps: 3 3 3 5) chooses the elite, 2 of 4 slots: {3, 5}. Before
 * it, online fills slots (after 1 miss). Then 0 1 2 4 6 7 in turn for 60 steps: 3 and 5 stay. */
static void test_elite_first_window(void) {
    hm_policy_opts pol;
    hm_policy_opts_default(&pol);
    pol.kind = HM_POLICY_ELITE;
    pol.elite_pct = 50;
    pol.admit_misses = 1;
    pol.window = 4;
    pol.update_rate = 1;
    pol.hysteresis = 0;
    hm_units u;
    hm_experts *s = open_store(&u, 8, 1, 4, &pol, NULL);
    const int32_t first[4] = {3, 3, 3, 5};
    for (int t = 0; t < 4; t++) step(s, &first[t], 1);
    CHECK(hm_experts_unit(s, 0, 3)->elite && hm_experts_unit(s, 0, 5)->elite);
    int n_elite = 0;
    for (int e = 0; e < 8; e++) n_elite += hm_experts_unit(s, 0, e)->elite;
    CHECK(n_elite == 2);
    const int32_t rest[6] = {0, 1, 2, 4, 6, 7};
    bool kept = true;
    for (int t = 0; t < 60; t++) {
        step(s, &rest[t % 6], 1);
        kept = kept && hot(s, 3) && hot(s, 5);
    }
    CHECK(kept);
    hm_experts_stats st;
    hm_experts_get_stats(s, &st);
    CHECK(st.swaps_out >= 1 && st.n_used == 4);
    /* a switch away clears the elite; back to elite with no profile: a new first window */
    CHECK(hm_experts_set_policy(s, HM_POLICY_ONLINE, NULL, NULL) == HM_OK);
    CHECK(!hm_experts_unit(s, 0, 3)->elite);
    hm_experts_close(s);
    hm_units_free(&u);
}

/* The insert cap: lru, 4 slots, one step routing 3 new units (k 3): all 3 enter without a cap,
 * 1 with max_inserts 1; the next step (same 3) admits 1 more. online: the same cap on free slots. */
static void test_insert_cap(void) {
    for (int kind = 0; kind < 2; kind++)
        for (int cap = 0; cap <= 1; cap++) {
            hm_policy_opts pol;
            hm_policy_opts_default(&pol);
            pol.kind = kind == 0 ? HM_POLICY_LRU : HM_POLICY_ONLINE;
            pol.admit_misses = 1;
            pol.max_inserts = cap;
            hm_units u;
            hm_experts *s = open_store(&u, 8, 3, 4, &pol, NULL);
            const int32_t ids[3] = {1, 4, 6};
            step(s, ids, 3);
            hm_experts_stats st;
            hm_experts_get_stats(s, &st);
            CHECKF(st.swaps_in == (cap ? 1u : 3u), "kind %d cap %d: %llu in", kind, cap, (unsigned long long)st.swaps_in);
            step(s, ids, 3);
            hm_experts_get_stats(s, &st);
            CHECK(st.swaps_in == (cap ? 2u : 3u));
            hm_experts_close(s);
            hm_units_free(&u);
        }
    /* out of range is refused */
    hm_policy_opts pol;
    hm_policy_opts_default(&pol);
    pol.kind = HM_POLICY_ELITE;
    pol.elite_pct = 101;
    hm_units u;
    hm_err err = {{0}};
    CHECK(hm_units_init_geom(&u, 1, 8, 1, 1000, &err) == HM_OK);
    hm_experts_opts o;
    hm_experts_opts_default(&o);
    o.hot_slots = 4;
    o.policy = pol;
    hm_experts *s = NULL;
    CHECK(hm_experts_open(&s, &u, &o, &err) == HM_ERR_ARG && strstr(err.msg, "elite"));
    hm_units_free(&u);
}

int main(void) {
    test_elite_profile();
    test_elite_first_window();
    test_insert_cap();
    return test_done();
}
