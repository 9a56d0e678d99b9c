/* gpu_chain.h - a GPU session's chain of per-device states, and the per-step work over it that
 * the GPU forward (exec/exec_cuda.c) does for every arch.
 *
 * A session on the GPU holds one state per device of the placement that runs layers or the output
 * (hm_gpu_chain_links), chained in layer order. Each arch's state struct starts with an
 * hm_gpu_dstate (its FIRST member, so that a pointer to one is a pointer to the other): the device,
 * its layers, the residual stream and the MoE's buffers, which are the same in every arch; what
 * follows it is the arch's own (attention activations, KV layout, recurrent state).
 *
 * A step over the chain (model_gpu.h says why it is laid out so): hm_gpu_chain_begin on every
 * device; per layer the arch's dense ops, the routing into hm_gpu_layer_ids and hm_gpu_moe_step;
 * at a range's end hm_gpu_routing_down then hm_gpu_hand_over to the next device; at the end
 * hm_gpu_chain_record, or hm_gpu_chain_abort on failure. Only built with CUDA. */
#ifndef HM_GPU_CHAIN_H
#define HM_GPU_CHAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/threadpool.h"
#include "model_gpu.h"

struct hm_fwd_batch;

/* The part of an arch's per-device session state that is the same in every arch. */
typedef struct hm_gpu_dstate {
    struct hm_cuda_ctx *c;       /* borrowed: the model's context of this device */
    int32_t dev;                 /* index into m->gpu->dev */
    int32_t l0, l1;              /* the layers it runs */
    bool out;                    /* it computes the output norm and logits */
    struct hm_gpu_dstate *next;  /* the next device's state (higher layers; the first member of the
                                    arch's struct), owned; NULL: the last */
    int32_t n_layer, n_expert;   /* the model's */
    uint16_t *kv;                /* device f16 KV cache of its layers (the arch's layout), owned */
    void *dev_block;             /* device block holding the arch's activations (these among them), owned */
    float *x;                    /* [U, n_embd] residual stream */
    float *h;                    /* [U, n_embd] normed input of a block (the MoE's input) */
    int32_t *sel;                /* [2 * U * k]: prefill, a layer's ids [nr, k], then its weights */
    float *cold;                 /* [U, n_embd] the CPU part's sum, uploaded */
    float *logits;               /* [logit_rows, n_vocab] (the output's device; NULL on the others) */
    int32_t *ints;               /* [3 * U]: tokens, positions, positions of the wanted rows */
    void *scratch;               /* attention and MoE scratch (used one after the other), owned */
    size_t scratch_size;
    void *pin;                   /* pinned host block holding the *_h arrays, owned */
    int32_t *ints_h;             /* [3 * U] what goes up into ints */
    int32_t *sel_h;              /* [2 * U * k] what comes down from sel */
    float *h_h;                  /* [U, n_embd] the normed MoE input, for the CPU part */
    float *cold_h;               /* [U, n_embd] the CPU part's sum */
    int32_t logit_rows;          /* rows of logits per output matmul */
    /* decode (n <= HM_CUDA_MATVEC_MAX_TOK): the MoE routed on the device */
    int32_t dec_cap;             /* min(U, HM_CUDA_MATVEC_MAX_TOK) */
    size_t sel_stride;           /* 2 * dec_cap * k: one layer's ids then weights in sel_all */
    int32_t *sel_all;            /* device [n_layer][sel_stride]: every layer's routing of the step */
    int32_t *sel_all_h;          /* pinned [n_layer][sel_stride]: what comes down (record, cold units) */
    struct hm_cuda_moe_slot *slots;   /* device [n_layer][n_expert]: the hot slices per expert */
    struct hm_cuda_moe_slot *slots_h; /* pinned, what goes up into slots when a slot map changed */
    hm_gpu_moe_host mh;          /* the MoE's host side: work space, tables, events, graph */
} hm_gpu_dstate;

/* For gstate_open: d's device index dev (m's context), layers [l0, l1), out, the model's n_layer
 * and n_expert, logit_rows = min(n_ubatch, logit_rows_max), dec_cap and sel_stride for k routed
 * ids a row; then makes the device current (its error). */
hm_status hm_gpu_dstate_init(hm_gpu_dstate *d, const struct hm_model *m, const struct hm_state_opts *o, int32_t dev,
                             int32_t l0, int32_t l1, bool out, int32_t n_layer, int32_t n_expert,
                             int32_t logit_rows_max, size_t k, hm_err *err);
/* For gstate_open: d's pinned block (hm_gpu_pinned_block) holding ints_h, sel_h, h_h, cold_h,
 * sel_all_h and slots_h for n_ubatch rows of n_embd, k routed ids a row; with extra > 0 also an
 * array of extra 4-byte elements after them (*extra_out; NULL when extra is 0). */
hm_status hm_gpu_dstate_pin(hm_gpu_dstate *d, size_t n_ubatch, size_t n_embd, size_t k, size_t extra,
                            void **extra_out, hm_err *err);
/* Free what d owns (its device made current and synced first: nothing queued may still use it);
 * the device stays current. Not d itself. A d without a context (never opened) frees only mh. */
void hm_gpu_dstate_free(hm_gpu_dstate *d);

/* For state_open: the session's cold units' CPU part (hm_gpu_cold_part_open) and the peer units'
 * buffers (hm_gpu_peer_reserve) for o->n_ubatch rows of k routed ids. */
hm_status hm_gpu_session_cold_open(const struct hm_model *m, struct hm_moe_route *route, hm_scratch *scratch,
                                   int32_t n_expert, int32_t k, int64_t n_embd, int64_t n_ff_exp,
                                   const struct hm_state_opts *o, hm_err *err);

/* Before a step, on every device of the chain from head (each made current in turn): the batch's
 * ints go up (hm_gpu_upload_batch_ints, n_ubatch rows), the hot / cold tables and for decode (dec)
 * the slot table are refreshed (hm_gpu_moe_slots_refresh), no layer recorded yet. */
hm_status hm_gpu_chain_begin(const struct hm_model *m, hm_gpu_dstate *head, int64_t n_ubatch,
                             const struct hm_fwd_batch *b, bool dec, hm_err *err);
/* Where layer il's routing goes on the device: decode (dec) its row of sel_all, prefill sel
 * ([nr * k] ids, then their weights). */
static inline int32_t *hm_gpu_layer_ids(const hm_gpu_dstate *d, int32_t il, bool dec) {
    return dec ? d->sel_all + (size_t)il * d->sel_stride : d->sel;
}
/* Layer il's row of the device slot table. */
static inline struct hm_cuda_moe_slot *hm_gpu_layer_slots(const hm_gpu_dstate *d, int32_t il) {
    return d->slots + (size_t)il * (size_t)d->n_expert;
}
/* The MoE units of layer il (experts mw) on nr rows, its routing already at hm_gpu_layer_ids (k a
 * row): hm_moe_gpu_layer_step with d's buffers, the input d->h, summed into out_dev (route and
 * scratch: the session's CPU part); for decode the layer is marked for the record. next_mw /
 * next_ids: prefill streaming ahead (hm_moe_gpu_buf), NULL for none. */
hm_status hm_gpu_moe_step(const struct hm_model *m, hm_pool *pool, hm_gpu_dstate *d, const struct hm_moe_weights *mw,
                          struct hm_moe_route *route, hm_scratch *scratch, int32_t il, bool dec, int64_t nr, int k,
                          float *out_dev, const struct hm_moe_weights *next_mw, const int32_t *next_ids,
                          hm_err *err);
/* At the end of d's layers: decode, the routing d recorded comes down in one copy (before the
 * hand-over, whose event then covers it); a no-op when none was. */
hm_status hm_gpu_routing_down(hm_gpu_dstate *d, hm_err *err);
/* Hand the first `rows` rows (of n_embd) of the residual from d to d->next (queued on next's
 * stream after everything queued on d's); makes next's device current. */
hm_status hm_gpu_hand_over(hm_gpu_dstate *d, int64_t rows, int64_t n_embd, hm_err *err);
/* Wait for every device of the chain (each made current): nothing may still read a slot. */
hm_status hm_gpu_chain_sync(hm_gpu_dstate *head, hm_err *err);
/* Decode: record the usage counts of the layers each device recorded this step (downloaded, synced). */
void hm_gpu_chain_record(const struct hm_model *m, const hm_gpu_dstate *head);
/* After a failed step: every device idle, every slot table rebuilt next step (hm_gpu_step_abort). */
void hm_gpu_chain_abort(hm_gpu_dstate *head);

/* The last layer's compaction where the arch keeps q and x: rows out_rows[0..n_out) (ascending) of
 * q ([n, nq]) and x ([n, n_embd]) copied to the front, row by row (q's then x's), on c. */
hm_status hm_gpu_compact_qx(struct hm_cuda_ctx *c, float *q, size_t nq, float *x, size_t n_embd,
                            const int32_t *out_rows, int64_t n_out, hm_err *err);

#endif
