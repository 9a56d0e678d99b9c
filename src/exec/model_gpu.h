/* model_gpu.h - a model's GPU placement: the CUDA device contexts, the VRAM expert slot pools (the
 * expert store's hot tier) and the arch's device copies of its dense weights.
 *
 * What goes where (as llama.cpp's `-ngl 99`, plus expert placement):
 *   - dense weights (embeddings, attention, norms, routers, output) and each session's KV cache
 *     and activations: on the device, uploaded by the arch's gpu_load / state_open;
 *   - expert units: HOT ones in slots of gpu->vram (computed there in one grouped launch per
 *     layer), the rest computed by the CPU threads from RAM at the same time (exec/moe_cuda.c).
 * How many slots, from the placement options (hm_model_gpu_open):
 *   --cpu-moe without a budget: none;  --n-cpu-moe N without a budget: every unit of layers >= N
 *   (layer placement, exactly llama.cpp's split);  -ngl alone: every unit;  --vram-budget B: B
 *   bytes of slots, placed by the policy;  --vram-budget auto (-1): free VRAM after the dense
 *   weights, the KV cache for the context asked for and the activations, minus --vram-reserve.
 * A pool that does not fit comes up smaller with a warning (never an abort); a session opened later
 * whose device state does not fit takes room from the pool (hm_model_gpu_make_room), again with a
 * warning.
 *
 * Several GPUs (issue 11; gpu_split.h is the plan): with a per-device --vram-budget or -ts, the
 * layers are split over the devices as llama.cpp's -ts does (contiguous ranges; by free VRAM
 * without -ts) and each device holds the dense weights, KV cache and activations of its own
 * layers plus a slot pool of its own budget (-ngl alone / --n-cpu-moe: the units of its own
 * layers). The store sees one slot numbering, device after device (slot groups, experts.h): a
 * unit goes to the slots of the device that runs its layer while they last, then (unless
 * --no-peer-experts) to a free slot of another device: a PEER unit, computed there from the
 * layer's input rows sent over through pinned host memory, its sum sent back and added with the
 * CPU's cold sum (moe_cuda.c; only when enough tokens route to it: HM_PEER_MIN_TOK). The forward runs the layers device after device and copies the
 * residual across at each range boundary. A one-device plan is today's single-device path
 * exactly.
 *
 * Lifetime: opened in hm_model_experts_open before the store (which borrows gpu->hot), closed in
 * hm_model_experts_close after it. Only built with CUDA (model_gpu_cuda.c); without it, asking
 * for the GPU is HM_ERR_UNSUPPORTED "built without CUDA". */
#ifndef HM_EXEC_MODEL_GPU_H
#define HM_EXEC_MODEL_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/cpu_ops.h"
#include "core/status.h"
#include "experts/experts.h"
#include "hotmoe.h"

struct hm_model;
struct hm_cuda_ctx;
struct hm_vram_tier;
struct hm_cuda_mat;
struct hm_cuda_moe_slot;
struct hm_moe_weights;
struct hm_moe_route;
struct hm_state_opts;
struct hm_fwd_batch;

/* One device of the placement. */
typedef struct hm_gpu_dev {
    struct hm_cuda_ctx *ctx;    /* owned */
    struct hm_vram_tier *vram;  /* owned; NULL when this device has no expert slots */
    hm_tier hot;                /* vram's own view (its slot numbers start at 0) */
    int32_t ordinal;            /* the CUDA device number */
    int64_t slot0;              /* its slots are the store's [slot0, slot0 + n_slots) */
    int64_t n_slots;            /* expert slots in vram (fewer after hm_model_gpu_make_room) */
    uint64_t dense_bytes;       /* device bytes of the dense weights uploaded to it */
    /* Peer units (units of other devices' layers in its slots; moe_cuda.c): their layer's input
     * rows come up into peer_x, the grouped launch sums into peer_out, which comes down into
     * peer_out_h. Sized by hm_gpu_peer_reserve; owned. */
    float *peer_x, *peer_out;   /* device [peer_rows, n_embd] */
    void *peer_scratch;         /* the grouped launch's scratch */
    size_t peer_scratch_size;
    float *peer_out_h;          /* pinned [peer_rows, n_embd] */
    int64_t peer_rows;          /* rows they hold (0: none) */
    /* Prefill streaming (moe_cuda.c): a few slots outside the store, not counted in the budget,
     * into which a prefill layer's heaviest cold units are copied while the CPU computes the
     * rest; they then run on this device in a second grouped launch. Two halves: layer il uses
     * half il & 1, so the next layer's predicted units can go up into the other half while this
     * layer computes. NULL: no streaming. */
    struct hm_vram_tier *stream;/* owned */
    hm_tier stream_t;           /* its view */
    int32_t stream_half;        /* slots in each half */
    int32_t stream_layer[2];    /* the layer whose units each half holds (-1: none) */
    int32_t stream_n[2];        /* slots of each half in use (from its start) */
    int32_t *stream_expert;     /* [2 * stream_half] owned: the expert in each used slot */
    int64_t stream_busy_until;  /* hm_time_us when its copier should be done with what is queued
                                   (the cost model's rate): the backlog new copies wait behind */
} hm_gpu_dev;

typedef struct hm_gpu_alloc {
    void *p;
    int32_t dev;
} hm_gpu_alloc;

typedef struct hm_gpu {
    struct hm_cuda_ctx *ctx;    /* dev[0].ctx: THE device of a one-device placement (the archs
                                   without gpu_multi use only this one) */
    int32_t n_dev;              /* devices of the placement (1 unless a layer split is asked for) */
    hm_gpu_dev dev[HM_MAX_GPUS];
    int32_t *layer_dev;         /* [n_layer + 1] owned: the device (index into dev) running each layer's
                                   dense part, attention and KV cache; [n_layer]: the output's */
    int32_t up_dev;             /* for gpu_load: the device hm_gpu_upload_* put buffers on (0) */
    bool peer_units;            /* the store may place a unit on another device than its layer's */
    struct hm_cuda_moe_unit *peer_work; /* [2 * n_expert] owned: a layer's peer units as found and
                                           then grouped by device (moe_cuda.c) */
    int32_t *peer_work_dev;     /* [n_expert] owned: the device of each found one */
    int32_t stream_mode;        /* prefill streaming: 0 off, 1 by the cost model and a layer ahead,
                                   2 every cold unit the slots hold (and ahead), 3 the cost model
                                   without streaming ahead (HOTMOE_PREFILL_STREAM=0 / ahead / all /
                                   layer or unset) */
    uint64_t stream_units, stream_bytes; /* streamed so far (ahead or not) */
    uint64_t stream_ahead, stream_ahead_used; /* copied ahead from a prediction; of them, routed */
    bool peer_on;               /* every pair of devices reads the other's memory directly */
    hm_tier hot;                /* the store's view of every device's slots (store slot numbers) */
    void *arch;                 /* the arch's device weights: gpu_load sets, gpu_unload frees */
    hm_gpu_alloc *allocs;       /* device buffers of hm_gpu_upload_*, freed at close */
    int32_t n_allocs, cap_allocs;
    uint64_t dense_bytes;       /* device bytes of the dense weights uploaded, all devices */
    int64_t n_slots;            /* expert slots, all devices */
    uint64_t slot_bytes;
    const void *pinned;         /* --mlock (no SSD tier): the mapping's expert bytes registered
                                   with CUDA (the VRAM tiers copy straight from them); NULL: none */
    uint64_t pinned_bytes;
    int32_t n_cpu_moe;          /* layer placement: units of layers >= this are all HOT; -1 = off */
    const char *no_gpu_experts; /* set by gpu_load when the GPU kernels cannot compute this model's
                                   expert units (why: hm_moe_gpu_unfit, e.g. "an expert tensor type
                                   the CUDA kernels do not compute"): then no slots are taken and every unit runs on the CPU */
} hm_gpu;

/* Device index of layer il's dense part (il = n_layer: the output's). */
static inline int32_t hm_gpu_layer_dev(const hm_gpu *g, int32_t il) { return g->layer_dev[il]; }
/* Device index holding store slot `slot` (>= 0), -1 for none (a slot given up). */
int32_t hm_gpu_slot_dev(const hm_gpu *g, int64_t slot);
/* Whether store slot `slot` is on the device that runs layer il (a unit there is computed by the
 * layer's own device with its other hot units; in another device's slot it is a peer unit). */
static inline bool hm_gpu_slot_local(const hm_gpu *g, int32_t il, int64_t slot) {
    const hm_gpu_dev *d = &g->dev[g->layer_dev[il]];
    return slot >= d->slot0 && slot < d->slot0 + d->n_slots;
}
/* For state_open (several devices with peer units): make each device's peer buffers hold a layer
 * of `rows` rows (n_pairs routed pairs, n_ff the expert width); they only grow. HM_ERR_NOMEM naming
 * the device when its memory (after giving up slots: hm_gpu_dev_alloc_on) or pinned memory is
 * short. A no-op without peer units. */
hm_status hm_gpu_peer_reserve(const struct hm_model *m, int64_t rows, int64_t n_pairs, int64_t n_ff, hm_err *err);
/* Block until every device's slot fills so far have landed (HM_ERR_CUDA on a copy failure). */
hm_status hm_model_gpu_wait_fills(const struct hm_model *m, hm_err *err);

/* Decide the placement, open the device, let the arch upload its dense weights and size the slot
 * pool (m->gpu set on success; untouched when o asks for no GPU). Call before the store opens;
 * *slots_out = the slots the store gets, *layer_from = the layer placement's first GPU layer or -1. */
hm_status hm_model_gpu_open(struct hm_model *m, const hm_placement_opts *o, int64_t *slots_out,
                            int32_t *layer_from, hm_err *err);
void hm_model_gpu_close(struct hm_model *m); /* NULL gpu is a no-op */

/* For an arch's state_open when a device allocation of its session state failed on device index
 * dev: give VRAM back from that device's expert slot pool so that `bytes` (the state still to allocate) fit, plus a margin.
 * Shrinks by whole chunks of slots (hm_vram_tier_chunk_slots), the store first (hm_experts_shrink:
 * the units in the slots that go run on the CPU from then on), then the tier, which frees the
 * chunks; warns once per call naming the slots and GiB given up. The pool and the store are the
 * model's, shared by its sessions: call between evals only (on the engine thread, as state_open
 * runs). m is const for the arch's sake; its gpu and store change through their pointers.
 * HM_ERR_NOMEM when the pool has no slot left to give, or when even the whole pool would not make
 * room (then nothing is given up: the sessions that fit keep it); the store's HM_ERR_ARG when
 * pinned units cannot move out of the way; HM_OK when slots were given up (the caller retries). */
hm_status hm_model_gpu_make_room(const struct hm_model *m, int32_t dev, uint64_t bytes, hm_err *err);

/* For an arch's gpu_load: copy a host matrix / f32 vector to the device (a buffer owned by g, freed
 * at close; counted in dense_bytes). *out's data is the device copy; nb1 kept. HM_ERR_NOMEM naming
 * the bytes when the device is full. */
hm_status hm_gpu_upload_mat(hm_gpu *g, const hm_mat *w, struct hm_cuda_mat *out, hm_err *err);
hm_status hm_gpu_upload_vec(hm_gpu *g, const float *v, int64_t n, float **out, hm_err *err);
/* (These and hm_gpu_up_* below go to device index g->up_dev: an arch with gpu_multi sets it to
 * hm_gpu_layer_dev(g, il) before layer il's uploads.) */

/* ---- helpers of the GPU forward (exec/exec_cuda.c) ---- */

/* When st is an error: prefix err's message with "tensor '<name>': ". Returns st. */
hm_status hm_gpu_name_err(hm_status st, const char *name, hm_err *err);

/* For gpu_load: upload weight matrix w (GGUF tensor `name`) as hm_gpu_upload_mat does (the device
 * copy is g's). A type the CUDA kernels do not compute, or rows that are not a multiple of 32
 * elements and of the type's alignment, is HM_ERR_UNSUPPORTED naming the tensor; with f32_any
 * non-NULL such rows are taken when w is F32 (then *f32_any = true: only the exact f32 fallback
 * matmul may read it), *f32_any = false otherwise. Upload errors are prefixed with the name. */
hm_status hm_gpu_up_mat(hm_gpu *g, const hm_mat *w, const char *name, bool *f32_any,
                        struct hm_cuda_mat *out, hm_err *err);
/* For gpu_load: hm_gpu_upload_vec (a NULL v uploads nothing: *out NULL), errors naming `name`. */
hm_status hm_gpu_up_vec(hm_gpu *g, const float *v, int64_t n, const char *name, float **out, hm_err *err);

/* For state_open: n bytes of device memory (256 when n is 0) for `what` on device index dev
 * (hm_gpu_dev_alloc: device 0), *out owned by the caller (hm_cuda_free). When the device is full,
 * that device's expert slot pool gives up room for `rest`
 * bytes (this allocation and the state's later ones, so that one warning covers the state) and it
 * tries again, until the pool is empty: then HM_ERR_NOMEM naming `what`, the MiB and the free
 * VRAM. Other sessions of the model keep working with the smaller pool. *out NULL on error. */
hm_status hm_gpu_dev_alloc_on(const struct hm_model *m, int32_t dev, size_t n, size_t rest, void **out,
                              const char *what, hm_err *err);
static inline hm_status hm_gpu_dev_alloc(const struct hm_model *m, size_t n, size_t rest, void **out,
                                         const char *what, hm_err *err) {
    return hm_gpu_dev_alloc_on(m, 0, n, rest, out, what, err);
}

/* Offsets off[i] of n arrays of elems[i] 4-byte elements in one block, each 256-byte aligned;
 * returns the block's bytes. */
size_t hm_gpu_layout(const size_t *elems, size_t *off, size_t n);

static inline size_t hm_gpu_max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* For state_open: one pinned host block (hm_cuda_host_alloc; *out owned, hm_cuda_host_free) for n
 * arrays laid out by hm_gpu_layout (off[] filled). HM_ERR_NOMEM naming the MiB on failure. */
hm_status hm_gpu_pinned_block(struct hm_cuda_ctx *c, const size_t *elems, size_t *off, size_t n, void **out,
                              hm_err *err);

/* The host side of a device state's MoE, the same in every arch's per-device session state
 * (hm_gpu_dstate in gpu_chain.h, which every arch's per-device state starts with, holds it as `mh`). */
typedef struct hm_gpu_moe_host {
    struct hm_cuda_moe_unit *units;   /* [n_expert] hot-unit work space, owned */
    uint8_t *all_hot, *any_hot;       /* [n_layer] per forward (hm_gpu_moe_slots_refresh), owned */
    int32_t *seen;                    /* [n_layer][n_expert] the slot each entry of the host slot table
                                         was built for (-2: not built), owned */
    int32_t *rec_n;                   /* [n_layer] decode: ids each layer routed (for the record), owned */
    int32_t n_rec;                    /* per decode forward: layers [0, n_rec) are recorded */
    const struct hm_moe_weights **mw; /* [n_layer] the experts of this device's MoE layers (borrowed;
                                         NULL for the others: skipped by the tables, the graph and the
                                         record), the array owned; the arch fills it after open */
    struct hm_cuda_event *routed;     /* a mixed layer's routing has come down, owned */
    struct hm_cuda_event *handoff;    /* recorded when the residual goes to the next device, owned */
    struct hm_moe_graph *graph;       /* decode as one CUDA graph (moe.h), owned; NULL with
                                         HOTMOE_CUDA_GRAPH=0 or before the arch opens it */
} hm_gpu_moe_host;

/* For state_open: allocate h's arrays for n_layer layers of n_expert experts (seen all -2, mw all
 * NULL) and its two events on c. HM_ERR_NOMEM / HM_ERR_CUDA; on failure what was made stays in h
 * for hm_gpu_moe_host_free. */
hm_status hm_gpu_moe_host_open(hm_gpu_moe_host *h, struct hm_cuda_ctx *c, int32_t n_layer, int32_t n_expert,
                               hm_err *err);
/* Free what h holds (the events, the graph, the arrays); the device must be idle. Zeroes h. */
void hm_gpu_moe_host_free(hm_gpu_moe_host *h);

/* One link of a session's chain of per-device states: device index dev runs layers [l0, l1) and,
 * when out, the output (a device with the output only has l0 = l1 = n_layer). */
typedef struct hm_gpu_link {
    int32_t dev, l0, l1;
    bool out;
} hm_gpu_link;
/* The links of g's placement for n_layer layers, in layer order (devices that run nothing are
 * left out); returns their count (<= g->n_dev). */
int32_t hm_gpu_chain_links(const hm_gpu *g, int32_t n_layer, hm_gpu_link *links);

/* For forward, before a step: per MoE layer il (mw[il] its experts, NULL for a layer without:
 * then all_hot and any_hot 0) all_hot[il] = no unit of it is cold now; for decode (dec) also
 * any_hot[il] and the host slot table slots_h ([n_layer][n_expert], rebuilt where seen says a slot
 * map changed: hm_moe_gpu_slot_table), whose changed layers' range goes up into the device table
 * slots (queued on the compute stream; the previous step ended with a sync, so nothing queued
 * still reads it). Errors are the upload's. */
hm_status hm_gpu_moe_slots_refresh(const struct hm_model *m, struct hm_cuda_ctx *c,
                                   const struct hm_moe_weights *const *mw, int32_t n_layer, int32_t n_expert,
                                   bool dec, int32_t *seen, struct hm_cuda_moe_slot *slots_h,
                                   struct hm_cuda_moe_slot *slots, uint8_t *all_hot, uint8_t *any_hot,
                                   hm_err *err);

/* Decode: record the usage counts of layers 0..n_rec-1 that have experts (mw[il] non-NULL) from
 * their routing, sel_all_h + il * sel_stride with rec_n[il] ids (downloaded and synced). They only
 * count, so after the step is as good as per layer: the session's step_end comes later. */
void hm_gpu_record_routing(const struct hm_model *m, const struct hm_moe_weights *const *mw,
                           const int32_t *sel_all_h, size_t sel_stride, const int32_t *rec_n, int32_t n_rec);

/* For state_open: what every GPU session state refuses before it allocates: an f32 KV cache
 * (HM_ERR_UNSUPPORTED, the device KV cache is f16) and more than 65535 rows a pass (HM_ERR_ARG). */
hm_status hm_gpu_state_opts_check(const struct hm_state_opts *o, hm_err *err);

/* For state_open: the cold units' CPU part of a session, route (hm_moe_route_init for n_ubatch
 * rows) and the scratch of its MoE op (owned by the caller: hm_free_aligned; unset when none is
 * needed). HM_ERR_NOMEM naming the MiB. */
hm_status hm_gpu_cold_part_open(struct hm_moe_route *route, hm_scratch *scratch, int32_t n_expert, int32_t k,
                                int64_t n_embd, int64_t n_ff_exp, const struct hm_state_opts *o, hm_err *err);

/* For forward: the batch's tokens, positions and the wanted rows' positions go up in one copy,
 * through the pinned ints_h ([3 * n_ubatch]) into the device ints (the same layout); queued on the
 * compute stream. */
hm_status hm_gpu_upload_batch_ints(struct hm_cuda_ctx *c, int32_t *ints, int32_t *ints_h, int64_t n_ubatch,
                                   const struct hm_fwd_batch *b, hm_err *err);

/* A forward's failure path: wait for the queued work (best effort: nothing queued may outlive the
 * step, the store refills slots next) and mark all n entries of seen unbuilt (-2), since the device
 * slot table may not have gone up: it is rebuilt whole next step. */
void hm_gpu_step_abort(struct hm_cuda_ctx *c, int32_t *seen, size_t n);

#endif
