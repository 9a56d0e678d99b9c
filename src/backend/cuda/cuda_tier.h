/* cuda_tier.h - the VRAM expert slot pool: the expert store's hot tier on a CUDA device.
 *
 * n_slots slots of slot_bytes each in device memory, taken in chunks of slots (one cudaMalloc per
 * chunk), so a pool that does not fit whole comes up smaller instead of failing: the caller reads
 * hm_vram_tier_n_slots and warns. A fill copies a unit's parts from host memory (the file mapping,
 * pageable) into a ring of pinned staging buffers with the CPU, then to the slot with an async copy
 * on the context's upload stream; the slot's event says when it landed (ready). A unit larger than
 * one staging buffer goes through it in pieces. While the ring is full a fill waits for its oldest
 * buffer's copy (so the host never overwrites a buffer still being read).
 *
 * Slot layout: a unit's present parts back to back in part order (GATE, UP, DOWN, GATE_UP), each
 * starting at a multiple of 256 bytes; part() returns the device pointer recorded at the slot's
 * last fill (NULL for an absent part). hm_vram_tier_slot_bytes gives the slot size a unit table
 * needs under that layout.
 *
 * Threads: one thread (the engine's) calls fill / ready / part / wait; fills are ordered on the
 * upload stream. Compute that reads a slot must only do so after ready() said true (the store's
 * slot map only lists landed units), and a slot is refilled only between steps, when no queued
 * compute still reads it (the forward pass ends each step with a sync). */
#ifndef HM_BACKEND_CUDA_TIER_H
#define HM_BACKEND_CUDA_TIER_H

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
} hm_vram_tier_opts;

/* Slot size for every unit of u under the layout above: max over layers of the sum of its parts'
 * slab bytes, each rounded up to 256. */
uint64_t hm_vram_tier_slot_bytes(const hm_units *u);

/* Allocate up to o->n_slots slots (fewer when the device runs out: not an error; 0 slots is a valid
 * pool) and the pinned ring (failure to pin is HM_ERR_NOMEM). c is borrowed and must outlive the
 * tier. *out owned by the caller (hm_vram_tier_close). */
hm_status hm_vram_tier_open(hm_vram_tier **out, hm_cuda_ctx *c, const hm_vram_tier_opts *o, hm_err *err);
/* Waits for fills in flight, frees the slots and the ring. NULL is a no-op. */
void hm_vram_tier_close(hm_vram_tier *t);

int64_t hm_vram_tier_n_slots(const hm_vram_tier *t);
uint64_t hm_vram_tier_bytes(const hm_vram_tier *t); /* device bytes of the slots */

/* The store's view: fill / ready / part over this pool (ctx = t). */
void hm_vram_tier_as_hot(hm_vram_tier *t, hm_tier *out);

/* Block until every fill issued so far has landed (HM_ERR_CUDA on a copy failure). */
hm_status hm_vram_tier_wait(hm_vram_tier *t, hm_err *err);

typedef struct hm_vram_tier_stats {
    uint64_t fills, fill_bytes;
    double fill_seconds; /* host time spent inside fill (staging copies and ring waits) */
} hm_vram_tier_stats;
void hm_vram_tier_get_stats(const hm_vram_tier *t, hm_vram_tier_stats *out);

#endif
