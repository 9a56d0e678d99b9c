/* tier_ram.h - the RAM tier for models larger than RAM: a fixed pool of RAM slots filled from the
 * model file (tier_ssd.h), the seam the forward pass computes CPU units through, prefetch, and
 * exclusivity with the VRAM tier.
 *
 * Without --ram-budget nothing here is used: expert units are computed from the file mapping.
 * With it, the pool is `budget` bytes, allocated once, 4096-aligned (O_DIRECT), optionally
 * mlocked, cut into buffers of hm_ssd_slot_bytes each. Buffers play two roles:
 *   - policy slots: the units the store's policy (static / online / lru, experts.h) keeps in RAM.
 *     The policy runs in an inner hm_experts whose "fast tier" is this pool, so a unit is HOT
 *     there when it holds a RAM slot; it decides only at step end, never inside a layer.
 *   - staging: where units without a slot are read when routed (or predicted). A staging buffer
 *     keeps its unit until it is reused (least recently used first), so a unit read on demand is
 *     also a cache entry; when the policy admits a unit that is in staging, the buffers swap
 *     roles (no copy, no second read).
 * Units in neither are SSD-only: read when routed.
 *
 * Exclusive tiers: with a VRAM store (opts.vram), a unit that holds a VRAM slot (landed or still
 * filling) is barred from the RAM slots (hm_experts_bar on the inner store: no RAM policy admits
 * it); once its VRAM copy has landed it loses its RAM buffer, slot or staging, at the next step end
 * (unless pinned); a unit that left VRAM, after the RAM policy's step, keeps a RAM slot the policy
 * gave it or takes one the policy left free (a read from the file, counted in the stats), else it
 * is SSD-only until the policy admits it (policy NONE has no slots: always SSD-only). The RAM policy sees only the routes
 * the VRAM tier missed, and the static RAM placement skips units placed in VRAM. A unit whose VRAM
 * fill is in flight is still computed from RAM: it keeps a RAM buffer it had until the fill lands.
 * The VRAM tier's fills copy from the file mapping, not from this pool (not counted here).
 *
 * The forward pass, per MoE layer (one thread, the one that drives the step):
 *   hm_ram_tier_acquire(t, layer, units, n_tok, n, parts, &n_ready, err)   the CPU units of the layer
 *   ... compute them from parts[i] ...
 *   hm_ram_tier_release(t, layer, units, n_ready)
 *   hm_ram_tier_prefetch(t, layer + 1, predicted, k)                       (--prefetch; any time
 *                                                                           before layer+1's acquire)
 * and after the step (after the VRAM store's hm_experts_step_end):
 *   hm_ram_tier_step_end(t, n_tok, prompt, err)
 *
 * Invariants: a unit is reachable through at most one buffer (its slot, else its staging entry);
 * a pinned buffer is never reused, swapped out or evicted; a buffer's pin count equals the inner
 * store's pin of its unit while it is a slot; a read that failed leaves the buffer BAD, re-read on
 * the next acquire. */
#ifndef HM_EXPERTS_TIER_RAM_H
#define HM_EXPERTS_TIER_RAM_H

#include <stdbool.h>
#include <stdint.h>

#include "experts.h"
#include "tier_ssd.h"

typedef struct hm_ram_tier_opts {
    int64_t budget;            /* bytes for every buffer (policy slots + staging) */
    int32_t n_stage;           /* staging buffers; 0 = auto (2 x the largest layer's experts, at most
                                  half the pool; the whole pool with policy NONE) */
    bool mlock;                /* lock the pool in RAM; failure is HM_ERR_IO naming RLIMIT_MEMLOCK */
    hm_policy_opts policy;     /* which units keep a RAM slot; NONE = staging only */
    const hm_profile *profile; /* borrowed during open: static placement, warm starts */
    const hm_experts *vram;    /* borrowed, must outlive the tier: the VRAM store; NULL = none */
    hm_ssd_opts io;
} hm_ram_tier_opts;

void hm_ram_tier_opts_default(hm_ram_tier_opts *o); /* budget 0 (invalid), auto staging, policy NONE */

typedef struct hm_ram_tier hm_ram_tier;

/* Open the pool for the units of the GGUF file at path (units borrowed, must outlive the tier),
 * allocate and (mlock) the buffers, open the file for reads, place units by the policy (static:
 * their reads start here and land in the background). A budget below one staging buffer is
 * HM_ERR_ARG naming the slot size. *out owned by the caller (hm_ram_tier_close). */
hm_status hm_ram_tier_open(hm_ram_tier **out, const char *path, const hm_units *units, const hm_ram_tier_opts *o,
                           hm_err *err);
void hm_ram_tier_close(hm_ram_tier *t); /* NULL is a no-op; waits for reads in flight */

/* The parts of one unit in RAM (borrowed from the pool; valid until the unit is released). */
typedef struct hm_unit_parts {
    const void *p[HM_UNIT_NPART]; /* NULL for parts the layer does not have */
} hm_unit_parts;

/* Make units experts[0 .. n) of layer readable in RAM: reads for all of them are issued first,
 * then waited, so they overlap. Pins each one; parts[i] receives expert[i]'s parts. n_tok[i] is
 * the tokens routed to it (for the policy's counts; NULL = 1 each). Units already in a slot or
 * staging cost nothing; prefetched ones wait only for what is left of their read.
 * *n_ready = how many of the first units are ready: n, unless staging ran out (every staging
 * buffer pinned), then fewer - compute and release those, then acquire the rest. An I/O error is
 * HM_ERR_IO naming the file, unit, part and offset: nothing stays pinned, *n_ready = 0, and the
 * tier stays usable (the failed unit is re-read next time). */
hm_status hm_ram_tier_acquire(hm_ram_tier *t, int32_t layer, const int32_t *experts, const int32_t *n_tok, int32_t n,
                              hm_unit_parts *parts, int32_t *n_ready, hm_err *err);
/* Unpin units acquired (or held) before; each must be pinned. */
void hm_ram_tier_release(hm_ram_tier *t, int32_t layer, const int32_t *experts, int32_t n);

/* One unit in RAM and pinned, without counting it as routed: the source of a VRAM upload (the
 * VRAM tier's fill holds it until its copy landed, then releases it). */
hm_status hm_ram_tier_hold(hm_ram_tier *t, int32_t layer, int32_t expert, hm_unit_parts *parts, hm_err *err);

/* Start reads for units predicted to be routed in layer (the next one) without waiting. Units in
 * VRAM, in RAM or already reading are skipped; staging buffers in use are not taken (a
 * prediction that finds none is dropped). Counts precision and recall against the next acquire
 * of that layer in this step. */
void hm_ram_tier_prefetch(hm_ram_tier *t, int32_t layer, const int32_t *experts, int32_t n);

/* Between steps, after the VRAM store's step end: exclusivity (units landed in VRAM leave RAM),
 * the RAM policy on this step's routes, then units that left VRAM take a RAM slot the policy left
 * free. Errors are a policy fill's (the store stays usable). */
hm_status hm_ram_tier_step_end(hm_ram_tier *t, int32_t n_tok, bool prompt, hm_err *err);

/* Wait for every read in flight (demand, prefetch, policy fills) to land: then read_bytes counts
 * every read issued so far. Between steps or layers; a read that failed leaves its buffer BAD. */
void hm_ram_tier_drain(hm_ram_tier *t);

typedef struct hm_ram_tier_stats {
    int32_t n_buf, n_slots, n_stage; /* buffers = policy slots + staging */
    uint64_t slot_bytes, pool_bytes;
    bool mlocked, uring, direct;
    int32_t queue_depth;
    int64_t n_used;                  /* policy slots holding a unit */
    uint64_t steps, tokens;
    uint64_t acquired;               /* routed unit acquisitions (hold not counted) */
    uint64_t hit_slot;               /* of those: in a policy slot */
    uint64_t hit_stage;              /* in staging from an earlier read */
    uint64_t hit_prefetch;           /* in staging because a prefetch read it (maybe still reading) */
    uint64_t miss;                   /* read on demand */
    uint64_t reads, read_bytes;      /* unit reads from the file and their bytes (aligned spans) */
    uint64_t fill_reads;             /* of the reads: started by the policy (admissions) */
    uint64_t io_errors;
    uint64_t pred;                   /* predicted units (not in VRAM) */
    uint64_t pred_used;              /* predicted and then acquired in that layer */
    uint64_t acq_predicted;          /* acquisitions in layers that had a prediction */
    uint64_t prefetch_reads, prefetch_wasted; /* reads started by prefetch; reused before use */
    uint64_t vram_released;          /* RAM copies dropped because the unit landed in VRAM */
    uint64_t vram_demoted_ram, vram_demoted_ssd; /* units that left VRAM: to a RAM slot / SSD only */
    double wait_us;                  /* time acquire blocked on reads */
} hm_ram_tier_stats;
void hm_ram_tier_get_stats(const hm_ram_tier *t, hm_ram_tier_stats *out);

/* The inner store (policy slots as its HOT tier): counters, per-layer residency. Borrowed. */
const hm_experts *hm_ram_tier_store(const hm_ram_tier *t);
/* Whether unit (layer, expert) is in RAM now: 2 policy slot, 1 staging, 0 SSD only. */
int hm_ram_tier_where(const hm_ram_tier *t, int32_t layer, int32_t expert);

#endif
