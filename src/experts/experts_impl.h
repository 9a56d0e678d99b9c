/* experts_impl.h - the store's insides, shared by store.c (table, tiers, counters) and policy.c
 * (placement decisions). Nothing outside src/experts includes it.
 *
 * Units are numbered layer-major: unit index ui = base[layer] + expert. The resident units form
 * a doubly linked list in recency order (head = most recently used), kept by step_end for LRU and
 * harmless for the others. */
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
    int32_t *free_slots;   /* stack of free slots */
    int64_t n_free;
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
};

/* Put unit ui into a free slot (there must be one) through the tier's fill. */
hm_status hm_experts_admit(hm_experts *s, int32_t ui, hm_err *err);
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
