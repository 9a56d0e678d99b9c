/* experts.h - the expert store: the unit table, the tiers units live in, the usage counters and
 * the policy that moves units between tiers. The forward pass talks to it with three calls:
 *
 *   after each MoE layer's router:   hm_experts_record(s, layer, ids, n_tok * k);
 *   to compute a unit:               hm_experts_where(s, layer, e, &loc)  (or the layer's slot map)
 *   after each forward step:         hm_experts_step_end(s, n_tok, is_prompt, err);
 *
 * Tiers. Every unit has exactly one home tier: HOT (a slot in the fast tier's pool - VRAM once the
 * GPU issue plugs a tier in; a bookkeeping-only pool in simulations), RAM (the file mapping today;
 * RAM slots once the SSD tier exists) or SSD. The fast tier is an hm_tier: a table of functions
 * that fill a slot with a unit (possibly asynchronously), tell when a fill has landed, and say
 * where a part of the unit in a slot lives. A unit whose fill has not landed is still computed
 * from RAM (hm_experts_where says RAM) and counts as a miss.
 *
 * Threads and the hot path. One thread writes a store: the one that drives the forward pass (it
 * calls record between layers and step_end between steps). record touches only that layer's
 * slice of the unit table: O(n) counter bumps, no lock, no allocation. Several sessions that share
 * one store must serialise their steps (the engine runs one step at a time), or keep their own
 * store per session. Readers on other threads (the server's /experts page) may read the counters
 * as racy snapshots of monotone values; residency they must read between steps.
 *
 * Policies (policy.c) act only inside step_end, never inside a layer: static (placement from a
 * profile at open, never changes), online (decayed frequency + recency, admission after N misses,
 * hysteresis, at most update_rate x slots swaps per window, one global pool so slots move between
 * layers), lru (every missed unit is admitted at step end, the least recently used goes). The
 * policy may be switched between steps (hm_experts_set_policy), which re-plans residency once.
 *
 * Invariants: a unit holds at most one hot slot and a slot at most one unit; a pinned unit is
 * never evicted; a barred unit is never admitted; hits[l] + misses[l] = ids recorded for layer l;
 * sum of counts = the same. */
#ifndef HM_EXPERTS_EXPERTS_H
#define HM_EXPERTS_EXPERTS_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"
#include "profile.h"
#include "units.h"

typedef enum hm_tier_id {
    HM_TIER_SSD = 0,  /* only in the file; read into a RAM slot when routed (issue 6) */
    HM_TIER_RAM = 1,  /* computed by the CPU from host memory (the file mapping today) */
    HM_TIER_HOT = 2,  /* in a slot of the fast tier (VRAM; computed by the GPU) */
} hm_tier_id;

const char *hm_tier_name(hm_tier_id t); /* "ssd", "ram", "hot" */

/* What the store knows about a unit when it asks a tier to hold it. */
typedef struct hm_unit_ref {
    int32_t layer, expert;
    uint64_t bytes;
    const void *src[HM_UNIT_NPART]; /* its parts in the file mapping (NULL when absent/no file) */
    uint64_t part_bytes[HM_UNIT_NPART];
} hm_unit_ref;

/* Unit (layer, expert) of a unit table as a tier's fill takes it: its parts in the file mapping. */
hm_unit_ref hm_unit_ref_of(const hm_units *units, int32_t layer, int32_t expert);

/* A fast tier: a pool of n_slots slots of slot_bytes each, owned by whoever made it (the CUDA
 * backend); the store borrows it. Function pointers may be NULL: fill NULL = nothing to copy
 * (simulation), ready NULL = fills land at once, part NULL = no data to point at. */
typedef struct hm_tier {
    const char *name; /* "vram", "sim" */
    void *ctx;
    /* Start copying u into slot (async allowed). Errors leave the unit where it was. */
    hm_status (*fill)(void *ctx, const hm_unit_ref *u, int32_t slot, hm_err *err);
    bool (*ready)(void *ctx, int32_t slot);
    /* The slot's copy of part p, in the tier's address space (a device pointer for VRAM). */
    const void *(*part)(void *ctx, int32_t slot, hm_unit_part p);
} hm_tier;

typedef enum hm_policy_kind {
    HM_POLICY_NONE = 0, /* no fast tier use: everything stays in RAM */
    HM_POLICY_STATIC,
    HM_POLICY_ONLINE,
    HM_POLICY_LRU,
    HM_POLICY_ELITE,    /* a static elite share of the slots, the rest online */
    HM_POLICY_COUNT,
} hm_policy_kind;

/* The policies, one table (policy.c): what the CLI, the server, plan and the docs list. A policy
 * places units at open (from a profile, when places_from_profile) and at step ends (step; NULL:
 * never moves a unit). Entries are in hm_policy_kind order. */
struct hm_experts;
typedef struct hm_policy_def {
    hm_policy_kind kind;
    const char *name;         /* "none", "static", "online", "lru" */
    const char *what;         /* one line for help texts and docs */
    bool places_from_profile; /* at open, the top units of the profile */
    hm_status (*step)(struct hm_experts *s, bool window_end, hm_err *err);
} hm_policy_def;
/* The table; *n its entries. */
const hm_policy_def *hm_policy_defs(int *n);
const char *hm_policy_name(hm_policy_kind k);     /* the table's name, "unknown" out of range */
int hm_policy_from_name(const char *name);        /* its kind, -1 if unknown */
/* buf = the names for a message, "static, online, lru, none" (from the table, "none" last;
 * skip_none leaves it out); returns buf. */
const char *hm_policy_names(char *buf, size_t cap, bool skip_none);

typedef struct hm_policy_opts {
    hm_policy_kind kind;
    bool static_per_layer;  /* static: the same number of slots in each layer (default: global) */
    bool warm_start;        /* online/lru: start from the static placement when there is a profile */
    int32_t window;         /* online: steps per window (16) */
    float decay;            /* online: score *= decay at each window end (0.7) */
    int32_t admit_misses;   /* online: misses before a unit may enter (2) */
    float hysteresis;       /* online: a newcomer must beat its victim by this fraction (0.25) */
    float update_rate;      /* online: at most update_rate * slots swaps per window (0.005) */
    float recency;          /* online: value bonus for a unit routed in the current window (1.0) */
    float elite_pct;        /* elite: share of the slots (0..100) holding the elite (60) */
    int32_t max_inserts;    /* online/lru/elite: at most this many units enter per step; 0 = no cap */
} hm_policy_opts;

void hm_policy_opts_default(hm_policy_opts *o); /* kind NONE and the defaults above */

typedef struct hm_experts_opts {
    int64_t hot_slots;          /* slots in the fast pool; < 0: hot_budget / units->unit_bytes_max */
    int64_t hot_budget;         /* bytes for the fast pool when hot_slots < 0 */
    hm_policy_opts policy;
    const hm_profile *profile;  /* borrowed during open only; static needs it */
    const hm_tier *hot_tier;    /* borrowed, must outlive the store; NULL = bookkeeping only */
    /* Slot groups (several GPUs, one slot budget each). The slot index space is split into
     * contiguous groups: group g owns slots [off_g, off_g + group_slots[g]), off_g the sum of the
     * earlier groups. Each layer's units have a home group (the device running that layer's
     * attention); they go there first, and with allow_peer into another group when it is full
     * (a "peer" unit). With groups the pool is not clamped to the unit count. */
    int32_t n_groups;            /* 0 or 1: one pool (today's behaviour, byte-identical). >1: slot groups */
    const int64_t *group_slots;  /* [n_groups] (borrowed during open) slots of each group; their sum is the
                                    pool (hot_slots must equal it, else HM_ERR_ARG) */
    const int32_t *layer_group;  /* [n_layer] (borrowed during open) the home group of each layer's units */
    bool allow_peer;             /* a unit may take a slot outside its home group when that one is full */
} hm_experts_opts;

void hm_experts_opts_default(hm_experts_opts *o); /* 0 slots, policy none */

/* One unit's entry in the table. Read-only outside the store. */
typedef struct hm_unit {
    int32_t layer, expert;
    uint64_t bytes;
    uint8_t home;        /* hm_tier_id it is computed from now */
    uint8_t filling;     /* a fill into hot_slot is in flight (home stays RAM until it lands) */
    uint8_t barred;      /* kept out of the fast tier by its owner (hm_experts_bar): never admitted */
    uint8_t elite;       /* policy elite: one of the elite, never a victim of the online part */
    int32_t hot_slot;    /* -1: none */
    int32_t ram_slot;    /* -1: the file mapping (RAM slots come with the SSD tier) */
    int32_t pin;         /* > 0: must not be evicted */
    uint64_t count;      /* routed (token, unit) selections since open */
    uint64_t hits;       /* of those, while it was HOT */
    uint32_t win;        /* selections in the current policy window */
    uint32_t misses;     /* selections while not HOT since it last left the pool */
    float score;         /* decayed frequency (folded at each window end) */
    int64_t last_step;   /* last step it was routed in; -1 never */
} hm_unit;

typedef struct hm_experts hm_experts;

/* Build the unit table for units (borrowed: must outlive the store; a geometry-only table from
 * hm_units_init_geom is fine) and place units by the policy. STATIC without a profile, or a
 * profile whose n_layer / n_expert differ from units, is HM_ERR_ARG naming both. *out owned by
 * the caller (hm_experts_close). */
hm_status hm_experts_open(hm_experts **out, const hm_units *units, const hm_experts_opts *o, hm_err *err);
void hm_experts_close(hm_experts *s); /* NULL is a no-op; closes a trace being written (errors lost:
                                        * hm_experts_trace_close reports them) */

/* Hot path: the routed experts of one layer for one micro-batch, ids [n] (token-major
 * [n_tok][k], each < the layer's n_expert). Bumps count/win/last_step and hits or misses. */
void hm_experts_record(hm_experts *s, int32_t layer, const int32_t *ids, int32_t n);

/* Between steps: n_tok tokens went through (prompt or decode). Runs the policy (swaps via the
 * tier's fill), lands finished fills, writes the trace's step record. An error from the tier
 * leaves the unit in RAM and is returned (the store stays usable). */
hm_status hm_experts_step_end(hm_experts *s, int32_t n_tok, bool prompt, hm_err *err);

/* Between steps: make every fill that has landed (the tier's ready() says so) HOT now, as
 * step_end does first. For the caller that waited for a tier's fills (at open, before step 0). */
void hm_experts_land(hm_experts *s);

/* Where to compute unit (layer, expert) from. */
typedef struct hm_unit_loc {
    hm_tier_id tier;                 /* HOT: the fast tier's slot; RAM: the CPU from data[] */
    int32_t slot;                    /* hot slot, -1 for RAM */
    const void *data[HM_UNIT_NPART]; /* parts in that tier's address space (NULL when absent) */
} hm_unit_loc;
void hm_experts_where(const hm_experts *s, int32_t layer, int32_t expert, hm_unit_loc *loc);

/* The layer's landed hot slot of each expert, -1 where it is not HOT: [n_expert], borrowed, valid
 * until the next step_end (what a grouped GPU kernel takes). */
const int32_t *hm_experts_slot_map(const hm_experts *s, int32_t layer);

const hm_unit *hm_experts_unit(const hm_experts *s, int32_t layer, int32_t expert);
const hm_units *hm_experts_units(const hm_experts *s); /* the table it was opened on (borrowed) */
void hm_experts_pin(hm_experts *s, int32_t layer, int32_t expert);
void hm_experts_unpin(hm_experts *s, int32_t layer, int32_t expert);

/* Between steps: bar unit (layer, expert) from the fast tier, or lift the bar. No policy admits a
 * barred unit (static placement, lru, online, a switch's re-plan); a barred unit that holds a slot
 * keeps it until its owner evicts it (the bar only stops admissions). For exclusive tiers: the
 * RAM tier's inner store bars the units that hold a VRAM slot (tier_ram.h). O(1). */
void hm_experts_bar(hm_experts *s, int32_t layer, int32_t expert, bool barred);

typedef struct hm_experts_stats {
    int32_t n_layer;
    int64_t n_slots, n_used;     /* fast pool size (live slots: a shrunk group's dead ones excluded)
                                    and slots holding a unit */
    int64_t steps;
    uint64_t tokens, prompt_tokens, decode_tokens;
    uint64_t hits, misses;       /* all layers */
    const uint64_t *layer_hits;  /* [n_layer], borrowed */
    const uint64_t *layer_misses;
    const int32_t *layer_resident; /* [n_layer] units HOT now */
    uint64_t swaps_in, swaps_out, fill_bytes;
    int64_t elite_units;         /* policy elite: units of the elite holding a slot (0 otherwise) */
} hm_experts_stats;
void hm_experts_get_stats(const hm_experts *s, hm_experts_stats *out);
/* Slot groups (hm_experts_opts.n_groups). Policies with groups: a unit is admitted into a free
 * slot of its home group, else (allow_peer) of the group with the most free slots (ties: the lower
 * group), else not at all. lru without peer evicts the least recently used evictable resident of
 * the unit's home group; online pairs each candidate with the lowest-valued resident whose slot it
 * may take; static places its ranked units as hm_gpu_plan_place_units (src/exec/gpu_split.h)
 * does: home groups first, the rest of the hot set (peer) to the group with the most room. */
int32_t hm_experts_n_groups(const hm_experts *s);                 /* 1 without groups */
int32_t hm_experts_slot_group(const hm_experts *s, int64_t slot); /* group of a slot (0 without groups) */
/* Per group: live slots, slots holding a unit, of those the units whose home is another group.
 * Any pointer may be NULL; g out of range gives zeros. */
void hm_experts_group_stats(const hm_experts *s, int32_t g, int64_t *slots, int64_t *used, int64_t *peer);
/* Give up the slots of group g past its first keep_slots (as hm_experts_shrink does for the single
 * pool: units in them are evicted or, if pinned, moved into a free slot of the same group below keep;
 * HM_ERR_ARG when that is impossible; the slots become dead: never free, never used again).
 * hm_experts_shrink(s, keep) without groups stays as it is; with groups it is HM_ERR_ARG (use the
 * per-group one). Without groups, g = 0 is hm_experts_shrink. */
hm_status hm_experts_shrink_group(hm_experts *s, int32_t g, int64_t keep_slots, hm_err *err);

/* Forget hits/misses (counts and scores stay): to measure after a warm-up. */
void hm_experts_reset_stats(hm_experts *s);

/* The counters as a profile (counts, hot = hits, token split). p owned by the caller. */
hm_status hm_experts_to_profile(const hm_experts *s, hm_profile *p, const char *model, const char *arch,
                                hm_err *err);

/* Switch the policy between steps (after a step_end, before the next record; HM_ERR_ARG with
 * "between steps" otherwise, and for options out of range; the store is unchanged on error).
 * opts NULL keeps the tuning in force; kind always wins over opts->kind. Residency is re-planned
 * at once: static re-seeds from the profile the store was opened with, or from the live counts
 * when it had none (the same ranking as at open; residents that stay are not copied again, the
 * others are evicted and the missing ones filled); online and lru keep the residents and go on
 * from the live counters (scores, misses, recency); none empties the pool. Pinned units stay. A
 * fill error from the tier leaves the rest in RAM and is returned (the new policy is in force). */
hm_status hm_experts_set_policy(hm_experts *s, hm_policy_kind kind, const hm_policy_opts *opts, hm_err *err);
hm_policy_kind hm_experts_policy(const hm_experts *s);

/* Between steps (HM_ERR_ARG with "between steps" otherwise): give up the fast pool's slots >=
 * keep_slots, so their owner (the VRAM tier) can free them. Their units go home to RAM (evicted:
 * swaps_out counts them, layer_resident and the slot map drop them; a fill in flight into such a
 * slot is forgotten); a pinned unit there moves to a free slot < keep_slots through the tier's
 * fill (it is computed from RAM until that fill lands: hm_experts_land); with more pinned units
 * there than free slots below keep_slots it is HM_ERR_ARG and the store is unchanged. Counts,
 * hits/misses, scores and the policy stay; the policy goes on with the smaller pool (static is
 * not re-planned: its units past the new count stay in RAM). keep_slots >= the current count is
 * a no-op. A fill error while moving a pinned unit is returned (the moves made so far stand, the
 * pool keeps its size). */
hm_status hm_experts_shrink(hm_experts *s, int64_t keep_slots, hm_err *err);

/* Start writing every record/step_end to a trace file (trace.h). */
hm_status hm_experts_trace_out(hm_experts *s, const char *path, hm_err *err);
/* Flush and close the trace being written: HM_ERR_IO naming the file and the cause for the first
 * write error since hm_experts_trace_out (a full disk shows only here, buffers being flushed at
 * close). HM_OK when none is being written. hm_experts_close drops this status: call this first
 * to learn whether the trace is complete. */
hm_status hm_experts_trace_close(hm_experts *s, hm_err *err);

#endif
