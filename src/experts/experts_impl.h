/* experts_impl.h - the store's insides, shared by store.c (table, tiers, counters) and policy.c
 * (placement decisions). Nothing outside src/experts includes it.
 *
 * Units are numbered layer-major: unit index ui = base[layer] + expert. The resident units form
 * a doubly linked list in recency order (head = most recently used), kept by step_end for LRU and
 * harmless for the others.
 *
 * Slot groups: the slot index space [0, n_slots) is split into n_groups contiguous ranges (one
 * range for the single pool). A group's live slots are the first glive[g] of its range; the rest
 * are dead (given up by a shrink) and are never free nor used. */
#ifndef HM_EXPERTS_IMPL_H
#define HM_EXPERTS_IMPL_H

#include "experts.h"
#include "trace.h"

typedef struct hm_cand {
    float value;
    int32_t ui;
} hm_cand;

struct hm_experts {
    const hm_units *units; /* borrowed */
    int32_t n_layer;
    int32_t *base;         /* [n_layer + 1] */
    int64_t n_units;
    hm_unit *u;            /* [n_units] */
    int32_t *slot_map;     /* [n_units] landed hot slot or -1 (layer slices are the slot maps) */
    int64_t n_slots;
    int32_t *slot_unit;    /* [n_slots] unit index or -1 */
    int32_t *free_slots;   /* [n_slots] free slots: one stack per group, group g's at
                              free_slots[goff[g] .. goff[g] + gfree[g]) (top = last) */
    int64_t n_free;        /* all groups' free slots (sum of gfree) */
    int32_t n_groups;      /* >= 1 (one group = the single pool) */
    int64_t *goff;         /* [n_groups + 1] first slot of each group; goff[n_groups] = n_slots */
    int64_t *glive;        /* [n_groups] live slots of each group: the first glive[g] of its range */
    int64_t *gfree;        /* [n_groups] free slots of each group */
    int64_t n_live;        /* sum of glive: the slots policies may use */
    int32_t *layer_group;  /* [n_layer] home group of each layer's units; NULL: one group */
    bool allow_peer;
    hm_tier tier;          /* copy of the caller's (or all-NULL for bookkeeping) */
    hm_policy_opts pol;
    int64_t step;
    int32_t *touched;      /* [n_units] distinct units routed in this step */
    int64_t n_touched;
    int32_t *filling;      /* [n_slots] units whose fill has not landed */
    int64_t n_filling;
    int32_t *prev, *next;  /* [n_units] recency list of resident units */
    int32_t head, tail;
    hm_cand *cand, *vict;  /* [n_units] / [n_slots] scratch for the online policy */
    uint64_t *layer_hits, *layer_misses;
    int32_t *layer_resident;
    uint64_t tokens, prompt_tokens, decode_tokens;
    uint64_t swaps_in, swaps_out, fill_bytes;
    hm_trace_writer *trace;
    uint64_t *seed_counts; /* [n_units] the open-time profile's counts; NULL: none (static uses the live ones) */
    bool elite_chosen;     /* policy elite: the elite is set (from the profile at open, else the first window) */
    int64_t insert_left;   /* units the policy may still admit in this step (pol.max_inserts) */
};

/* The home group of unit ui (0 without groups). */
static inline int32_t hm_experts_home_group(const hm_experts *s, int32_t ui) {
    return s->layer_group ? s->layer_group[s->u[ui].layer] : 0;
}

/* The group whose free slot admit would give ui: its home group when that has a free slot, else
 * (allow_peer) the group with the most free slots (ties: the lower), else -1 (no room). */
static inline int32_t hm_experts_admit_group(const hm_experts *s, int32_t ui) {
    if (s->n_groups <= 1) return s->n_free > 0 ? 0 : -1;
    const int32_t h = hm_experts_home_group(s, ui);
    if (s->gfree[h] > 0) return h;
    if (!s->allow_peer) return -1;
    int32_t best = 0;
    for (int32_t g = 1; g < s->n_groups; g++)
        if (s->gfree[g] > s->gfree[best]) best = g;
    return s->gfree[best] > 0 ? best : -1;
}

/* Whether admit has a slot for ui now (the policies' check before admitting; one group: n_free > 0). */
static inline bool room_for(const hm_experts *s, int32_t ui) {
    if (s->n_groups <= 1 || s->allow_peer) return s->n_free > 0;
    return s->gfree[hm_experts_home_group(s, ui)] > 0;
}

/* Put unit ui into a free slot (room_for must hold) through the tier's fill. */
hm_status hm_experts_admit(hm_experts *s, int32_t ui, hm_err *err);
/* Same into a free slot of group g (it must have one): the static placement's chosen group. */
hm_status hm_experts_admit_to(hm_experts *s, int32_t ui, int32_t g, hm_err *err);
/* The group of slot sl (< n_slots). */
int32_t hm_experts_group_of(const hm_experts *s, int64_t sl);
/* Take unit ui out of its slot (it must hold one and not be pinned); it goes home to RAM. */
void hm_experts_evict(hm_experts *s, int32_t ui);
/* Move resident ui to the head of the recency list. */
void hm_experts_touch(hm_experts *s, int32_t ui);

/* policy.c: the initial placement at open (and at a switch: hm_experts_set_policy), and the
 * decision at each step end (window_end when the scores were just folded). */
hm_status hm_policy_place(hm_experts *s, bool have_profile, hm_err *err);
/* Static placement ranked by counts[ui] (seed_counts or the live counts): residents outside the
 * chosen set leave (unless pinned), the chosen ones missing are filled in rank order. */
hm_status hm_policy_place_static(hm_experts *s, const uint64_t *counts, hm_err *err);
hm_status hm_policy_step(hm_experts *s, bool window_end, hm_err *err);

#endif
