/* tier_vram.h - the VRAM expert slot pool: the expert store's hot tier on a CUDA device.
 *
 * n_slots slots of slot_bytes each in device memory, taken in chunks of slots (one cudaMalloc per
 * chunk), so a pool that does not fit whole comes up smaller instead of failing: the caller reads
 * hm_vram_tier_n_slots and warns. The same chunks let a pool give memory back later
 * (hm_vram_tier_shrink: whole chunks from the end) when a session's state needs the room.
 *
 * Fills are asynchronous: fill() only checks the request and queues it (it blocks only while
 * max_queued fills are already waiting). A copier thread of the pool, started at open and joined at
 * close, takes the fills in order: it copies the unit's parts from host memory (the file mapping,
 * pageable) into a ring of pinned staging buffers, then to the slot with async copies on the
 * context's upload stream, and records the slot's event. A unit larger than one staging buffer goes
 * through it in pieces; while the ring is full the copier waits for its oldest buffer's copy. The
 * source pages must stay valid until the fill is ready or the pool is closed (the mapping does).
 *
 * Slot layout: a unit's present parts back to back in part order (GATE, UP, DOWN, GATE_UP), each
 * starting at a multiple of 256 bytes; part() returns the device pointers of the slot's latest
 * fill (set by fill() itself, before the copy ran; NULL for an absent part). ready(slot) is true
 * only once the slot's LATEST fill has been copied: a slot filled again before an earlier fill
 * landed never reports the earlier one (the copier drops a queued fill that a newer fill of the
 * same slot overtook). hm_vram_tier_slot_bytes gives the slot size a unit table needs.
 *
 * Threads: one thread (the engine's) calls fill / ready / part / wait / get_stats; the copier is
 * the pool's own. Compute that reads a slot must only do so after ready() said true (the store's
 * slot map only lists landed units), and a slot is refilled only between steps, when no queued
 * compute still reads it (the forward pass ends each step with a sync). A copy failure (CUDA) is
 * sticky: the copier copies nothing more, the unfinished slots never become ready (the store
 * keeps those units in RAM), and every later fill and wait returns the error. */
#ifndef HM_EXPERTS_TIER_VRAM_H
#define HM_EXPERTS_TIER_VRAM_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/cuda/cuda_ops.h"
#include "core/status.h"
#include "experts/experts.h"
#include "experts/units.h"

typedef struct hm_vram_tier hm_vram_tier;

typedef struct hm_vram_tier_opts {
    int64_t n_slots;      /* wanted (>= 0) */
    uint64_t slot_bytes;  /* bytes of one slot (hm_vram_tier_slot_bytes of the model's units) */
    size_t staging_bytes; /* pinned ring total; 0 = 64 MiB */
    int n_staging;        /* buffers in the ring; 0 = 4 */
    int max_queued;       /* fills waiting for the copier before fill() blocks; 0 = 1024 */
    /* Host memory registered with CUDA (hm_cuda_host_register, for as long as the tier lives):
     * a unit whose parts all lie in [direct, direct + direct_bytes) is copied straight from
     * there (one DMA per part, no staging memcpy); others go through the ring. NULL = none. */
    const void *direct;
    uint64_t direct_bytes;
    /* Threads that memcpy a unit into the staging ring: the copier and copy_threads - 1 helpers
     * (one memcpy thread stages ~5 GB/s, below what a DMA takes). 0 = 4; 1 = the copier alone. */
    int copy_threads;
} hm_vram_tier_opts;

/* Slot size for every unit of u under the layout above: max over layers of the sum of its parts'
 * slab bytes, each rounded up to 256. */
uint64_t hm_vram_tier_slot_bytes(const hm_units *u);

/* Allocate up to o->n_slots slots (fewer when the device runs out: not an error; 0 slots is a valid
 * pool, without a copier) and the pinned ring (failure to pin is HM_ERR_NOMEM), start the copier
 * (it makes the context's device current on its thread). c is borrowed and must outlive the tier.
 * *out owned by the caller (hm_vram_tier_close). */
hm_status hm_vram_tier_open(hm_vram_tier **out, hm_cuda_ctx *c, const hm_vram_tier_opts *o, hm_err *err);
/* Drops the fills still queued, lets the copier finish the unit it is on and joins it, waits for
 * the copies in flight, frees the slots and the ring. NULL is a no-op. */
void hm_vram_tier_close(hm_vram_tier *t);

int64_t hm_vram_tier_n_slots(const hm_vram_tier *t);
uint64_t hm_vram_tier_bytes(const hm_vram_tier *t); /* device bytes of the slots */

/* Slots per chunk: the pool gives memory back only in whole chunks (hm_vram_tier_shrink). */
int64_t hm_vram_tier_chunk_slots(const hm_vram_tier *t);

/* Give device memory back: keep the slots < keep_slots rounded UP to a whole chunk (at most the
 * current count) and free the chunks past them. Waits first until the copier is idle and every
 * fill made so far has been copied (no copy may be in flight into freed memory); a sticky copy
 * error does not stop it. Slots below the new count keep their memory, their device pointers
 * (part) and their readiness; fill() of a slot past it is HM_ERR_ARG. The caller must have
 * stopped using the slots past it (the store evicts their units first: hm_experts_shrink) and no
 * queued compute may still read them (between steps). Engine thread only. Returns the new slot
 * count (>= 0), or a negative hm_status (HM_ERR_ARG for keep_slots < 0). */
int64_t hm_vram_tier_shrink(hm_vram_tier *t, int64_t keep_slots, hm_err *err);

/* The store's view: fill / ready / part over this pool (ctx = t). */
void hm_vram_tier_as_hot(hm_vram_tier *t, hm_tier *out);

/* Block until the queue is drained and every fill made so far has landed (then ready() is true for
 * every slot); HM_ERR_CUDA on a copy failure, now or earlier. */
hm_status hm_vram_tier_wait(hm_vram_tier *t, hm_err *err);

typedef struct hm_vram_tier_stats {
    uint64_t fills, fill_bytes; /* accepted by fill() */
    double fill_seconds;        /* engine time inside fill (checks, queueing, waits for a full queue) */
    double copy_seconds;        /* copier time: staging memcpys, ring waits, queueing the copies */
    uint64_t skipped;           /* queued fills dropped uncopied: a newer fill of their slot came */
    uint64_t queued;            /* fills not yet finished by the copier, now */
    uint64_t direct;            /* fills copied straight from the registered range (opts.direct) */
    uint64_t staged_bytes;      /* bytes of the fills copied through the staging ring */
    double staged_seconds;      /* copier time of those fills: the rate the ring sustains */
} hm_vram_tier_stats;
void hm_vram_tier_get_stats(const hm_vram_tier *t, hm_vram_tier_stats *out);

#endif
