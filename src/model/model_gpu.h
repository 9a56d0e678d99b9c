/* model_gpu.h - a model's GPU placement: the CUDA device context, the VRAM expert slot pool (the
 * expert store's hot tier) and the arch's device copies of its dense weights.
 *
 * What goes where (as llama.cpp's `-ngl 99`, plus expert placement):
 *   - dense weights (embeddings, attention, norms, routers, output) and each session's KV cache
 *     and activations: on the device, uploaded by the arch's gpu_load / state_open;
 *   - expert units: HOT ones in slots of gpu->vram (computed there in one grouped launch per
 *     layer), the rest computed by the CPU threads from RAM at the same time (model/moe_cuda.c).
 * How many slots, from the placement options (hm_model_gpu_open):
 *   --cpu-moe without a budget: none;  --n-cpu-moe N without a budget: every unit of layers >= N
 *   (layer placement, exactly llama.cpp's split);  -ngl alone: every unit;  --vram-budget B: B
 *   bytes of slots, placed by the policy;  --vram-budget auto (-1): free VRAM after the dense
 *   weights, the KV cache for the context asked for and the activations, minus --vram-reserve.
 * A pool that does not fit comes up smaller with a warning (never an abort); a session opened later
 * whose device state does not fit takes room from the pool (hm_model_gpu_make_room), again with a
 * warning.
 *
 * Lifetime: opened in hm_model_experts_open before the store (which borrows gpu->hot), closed in
 * hm_model_experts_close after it. Only built with CUDA (model_gpu_cuda.c); without it, asking
 * for the GPU is HM_ERR_UNSUPPORTED "built without CUDA". */
#ifndef HM_MODEL_GPU_H
#define HM_MODEL_GPU_H

#include <stdint.h>

#include "backend/cpu/cpu_ops.h"
#include "core/status.h"
#include "experts/experts.h"
#include "hotmoe.h"

struct hm_model;
struct hm_cuda_ctx;
struct hm_vram_tier;
struct hm_cuda_mat;

typedef struct hm_gpu {
    struct hm_cuda_ctx *ctx;    /* owned */
    struct hm_vram_tier *vram;  /* owned; NULL when there are no expert slots */
    hm_tier hot;                /* the store's view of vram (name "vram") */
    void *arch;                 /* the arch's device weights: gpu_load sets, gpu_unload frees */
    void **allocs;              /* device buffers of hm_gpu_upload_*, freed at close */
    int32_t n_allocs, cap_allocs;
    uint64_t dense_bytes;       /* device bytes of the dense weights uploaded */
    int64_t n_slots;            /* expert slots in vram */
    uint64_t slot_bytes;
    int32_t n_cpu_moe;          /* layer placement: units of layers >= this are all HOT; -1 = off */
    const char *no_gpu_experts; /* set by gpu_load when the GPU kernels cannot compute this model's
                                   expert units (why, e.g. "n_ff 128 is not a multiple of 256"):
                                   then no slots are taken and every unit runs on the CPU */
} hm_gpu;

/* Decide the placement, open the device, let the arch upload its dense weights and size the slot
 * pool (m->gpu set on success; untouched when o asks for no GPU). Call before the store opens;
 * *slots_out = the slots the store gets, *layer_from = the layer placement's first GPU layer or -1. */
hm_status hm_model_gpu_open(struct hm_model *m, const hm_placement_opts *o, int64_t *slots_out,
                            int32_t *layer_from, hm_err *err);
void hm_model_gpu_close(struct hm_model *m); /* NULL gpu is a no-op */

/* For an arch's state_open when a device allocation of its session state failed: give VRAM back
 * from the expert slot pool so that `bytes` (the state still to allocate) fit, plus a margin.
 * Shrinks by whole chunks of slots (hm_vram_tier_chunk_slots), the store first (hm_experts_shrink:
 * the units in the slots that go run on the CPU from then on), then the tier, which frees the
 * chunks; warns once per call naming the slots and GiB given up. The pool and the store are the
 * model's, shared by its sessions: call between evals only (on the engine thread, as state_open
 * runs). m is const for the arch's sake; its gpu and store change through their pointers.
 * HM_ERR_NOMEM when the pool has no slot left to give, or when even the whole pool would not make
 * room (then nothing is given up: the sessions that fit keep it); the store's HM_ERR_ARG when
 * pinned units cannot move out of the way; HM_OK when slots were given up (the caller retries). */
hm_status hm_model_gpu_make_room(const struct hm_model *m, uint64_t bytes, hm_err *err);

/* For an arch's gpu_load: copy a host matrix / f32 vector to the device (a buffer owned by g, freed
 * at close; counted in dense_bytes). *out's data is the device copy; nb1 kept. HM_ERR_NOMEM naming
 * the bytes when the device is full. */
hm_status hm_gpu_upload_mat(hm_gpu *g, const hm_mat *w, struct hm_cuda_mat *out, hm_err *err);
hm_status hm_gpu_upload_vec(hm_gpu *g, const float *v, int64_t n, float **out, hm_err *err);

#endif
