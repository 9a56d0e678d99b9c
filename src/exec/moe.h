/* moe.h - expert units and the routing list: the seam between the forward pass and whoever
 * computes experts.
 *
 * An expert unit is (layer, expert e). In GGUF, ffn_{gate,up}_exps are {n_embd, n_ff, n_expert}
 * and ffn_down_exps {n_ff, n_embd, n_expert}: n_expert contiguous slabs, so unit e is three byte
 * ranges, base + e * nb2 for each of the three tensors (hm_moe_unit).
 *
 * A forward pass does, per MoE layer: router logits -> hm_cpu_route (top-k ids + weights per
 * token) -> hm_moe_route_build (the (token, unit, weight) list grouped by unit) ->
 * hm_moe_compute (compute those units, accumulate into out). hm_moe_compute is the one place
 * that decides *how* a unit is computed; today every unit runs through the CPU backend's MoE op,
 * later the expert store hands some units to the GPU or reads them from SSD first. The route is
 * also exactly what usage statistics need (unit ids and token counts).
 *
 * No allocation after hm_moe_route_init: the buffers are sized for n_batch tokens at start. */
#ifndef HM_EXEC_MOE_H
#define HM_EXEC_MOE_H

#include <stdint.h>

#include "backend/cpu/cpu_ops.h"
#include "core/status.h"

/* The gate's activation of an expert: silu(gate) * up (Qwen, the zero default),
 * gelu_tanh(gate) * up (Gemma) or gpt-oss's clamped SwiGLU (cpu_ops.h's HM_CPU_ACT_SWIGLU_OAI). */
typedef enum hm_moe_act { HM_MOE_ACT_SILU = 0, HM_MOE_ACT_GELU = 1, HM_MOE_ACT_SWIGLU_OAI = 2 } hm_moe_act;

/* One layer's expert tensors (borrowed from the mapping). gate/up/down describe expert 0; expert
 * e's slab starts nb2 bytes further per expert. */
typedef struct hm_moe_weights {
    hm_mat gate, up, down;
    size_t gate_nb2, up_nb2, down_nb2;
    int32_t layer;    /* which layer these are: unit (layer, e) is the store's key */
    int32_t n_expert;
    int64_t n_embd, n_ff;
    hm_moe_act act;
    float act_limit;  /* > 0: clamped SwiGLU (DeepSeek-V4's swiglu_limit): silu(min(g, L)) *
                         clamp(u, -L, L); 0: none. The CPU expert kernels implement it. */
    /* per-expert biases (gpt-oss; NULL: none): expert e's are gate_b/up_b + e n_ff, down_b + e n_embd,
     * added to its gate and up outputs before the activation and to its down output before the weight */
    const float *gate_b, *up_b, *down_b;
} hm_moe_weights;

/* Bind layer `layer`'s experts into mw (load): blk.<layer>.ffn_{gate,up,down}_exps.weight,
 * [n_embd, n_ff, n_expert] x2 and [n_ff, n_embd, n_expert], and set mw's sizes and act. With
 * fused_ok a fused ffn_gate_up_exps [n_embd, 2 n_ff, n_expert] is accepted in place of gate and
 * up (slab e: rows 0..n_ff-1 the gate, n_ff..2 n_ff-1 the up projection). Errors name the tensor
 * (hm_model_bind's). */
struct hm_model;
hm_status hm_moe_bind(const struct hm_model *m, int32_t layer, int32_t n_expert, int64_t n_embd, int64_t n_ff,
                      hm_moe_act act, bool fused_ok, hm_moe_weights *mw, hm_err *err);

/* The three matrices of unit e. */
static inline void hm_moe_unit(const hm_moe_weights *w, int32_t e, hm_mat *gate, hm_mat *up, hm_mat *down) {
    *gate = w->gate;
    *up = w->up;
    *down = w->down;
    gate->data = (const char *)w->gate.data + (size_t)e * w->gate_nb2;
    up->data = (const char *)w->up.data + (size_t)e * w->up_nb2;
    down->data = (const char *)w->down.data + (size_t)e * w->down_nb2;
}

/* Job j's matrices and biases: unit e's (its tokens are the caller's to set). */
static inline void hm_moe_job_unit(const hm_moe_weights *w, int32_t e, hm_moe_job *j) {
    hm_moe_unit(w, e, &j->gate, &j->up, &j->down);
    j->gate_b = w->gate_b ? w->gate_b + (size_t)e * (size_t)w->n_ff : NULL;
    j->up_b = w->up_b ? w->up_b + (size_t)e * (size_t)w->n_ff : NULL;
    j->down_b = w->down_b ? w->down_b + (size_t)e * (size_t)w->n_embd : NULL;
}

/* The CPU kernels' name of an expert activation. */
static inline hm_cpu_act hm_moe_cpu_act(hm_moe_act a) {
    return a == HM_MOE_ACT_GELU ? HM_CPU_ACT_GELU : a == HM_MOE_ACT_SWIGLU_OAI ? HM_CPU_ACT_SWIGLU_OAI : HM_CPU_ACT_SILU;
}

/* The routing list of one layer for one micro-batch, grouped by unit: active unit i is expert
 * unit[i]; its tokens are tok[start[i] .. start[i+1]) with weights w[same range], tokens ascending. */
typedef struct hm_moe_route {
    int32_t n_expert, k, cap_tok; /* sizes the buffers were made for */
    int32_t n_units;              /* active units (>= 1 token) this batch */
    int32_t n_tok;
    int32_t *unit;   /* [n_expert] */
    int32_t *start;  /* [n_expert + 1] */
    int32_t *tok;    /* [cap_tok * k] */
    float *w;        /* [cap_tok * k] */
    int32_t *count;  /* [n_expert] work space */
    hm_moe_job *jobs;/* [n_expert] work space for the CPU op */
    /* work space of hm_moe_forward (the SSD tier): */
    int32_t *tier_unit, *tier_ntok; /* [n_expert] the units computed through the RAM tier */
    struct hm_unit_parts *parts;    /* [n_expert] their parts in RAM */
    int32_t *pred;                  /* [n_expert] predicted units of the next layer */
    uint8_t *pred_mark;             /* [n_expert] */
    float *pred_logits;             /* [cap_tok * n_expert] the next layer's router on this input */
} hm_moe_route;

/* Allocate the buffers for up to cap_tok tokens, k experts each, of n_expert. */
hm_status hm_moe_route_init(hm_moe_route *r, int32_t n_expert, int32_t k, int32_t cap_tok, hm_err *err);
void hm_moe_route_free(hm_moe_route *r);

/* Group a router's output (ids, weights: [n_tok, k]) by unit. n_tok <= cap_tok, ids < n_expert. */
void hm_moe_route_build(hm_moe_route *r, const int32_t *ids, const float *weights, int32_t n_tok);

/* A MoE layer's routing step on the CPU, as every arch does it: rid/rw [nr, k] = the routing spec
 * sp on rlog [nr, n_expert] (hm_cpu_route: bias, or hash with the rows' tokens, as there), each
 * weight times expert_scale[e] when given (Gemma 4's per-expert scale; NULL = none), the routed
 * units recorded in m's expert store (usage counts, when it has one), and r built from them for
 * hm_moe_forward. */
struct hm_model;
void hm_moe_route_rows(const struct hm_model *m, int32_t layer, hm_moe_route *r, const hm_route_spec *sp,
                       const float *rlog, int64_t nr, const float *bias, const int32_t *hash,
                       const int32_t *tokens, const float *expert_scale, int32_t *rid, float *rw);

/* Scratch bytes hm_moe_compute needs for this route's capacity. */
size_t hm_moe_compute_scratch_size(const hm_moe_route *r, int64_t n_embd, int64_t n_ff, int n_threads);

/* out[t] += sum over the route's (t, unit, w): w * unit(x[t]).  x, out: [n_tok, n_embd].
 * The tier split goes here and nowhere else: with a fast tier, the layer's units whose entry in
 * hm_experts_slot_map(store, mw->layer) is >= 0 go to the GPU's grouped kernel, the rest run
 * below on the CPU (after an SSD read when the store says so, hm_experts_where). Usage counting
 * is not done here: the forward pass records the router's ids right after routing. */
void hm_moe_compute(hm_pool *pool, const hm_moe_weights *mw, hm_moe_route *r, const float *x,
                    float *out, hm_scratch *scratch);

/* hm_moe_compute through the model's tiers: what a forward pass calls. Without an SSD tier
 * (m->ram NULL) it is exactly hm_moe_compute. With one, the route's units not HOT in VRAM are
 * acquired from the RAM tier (read from the file when they are in no RAM buffer), computed from
 * their RAM copies in the same job order (so the result is bit-identical to the mapping's), and
 * released; if the tier's staging runs out, in several rounds. With m->prefetch and
 * next_router (layer mw->layer + 1's router; NULL / data NULL = none), the next layer's router is
 * applied to x after the first acquire and its predicted units' reads start before the compute.
 * An I/O error fails the call (HM_ERR_IO naming file, unit, offset); nothing stays pinned and the
 * tier stays usable. */
struct hm_model;
hm_status hm_moe_forward(const struct hm_model *m, hm_pool *pool, const hm_moe_weights *mw, hm_moe_route *r,
                         const float *x, float *out, hm_scratch *scratch, const hm_mat *next_router, hm_err *err);

/* Point job j's matrices at unit parts p (a RAM tier copy, tier_ram.h) instead of the file
 * mapping: the same bytes, so the same results. */
struct hm_unit_parts;
void hm_moe_job_from_parts(const hm_moe_weights *mw, const struct hm_unit_parts *p, hm_moe_job *j);

/* out[t] += the first n jobs of r->jobs on x ([r->n_tok, n_embd]), jobs built from the file mapping
 * for the units r->tier_unit[0..n) (tokens r->tier_ntok[0..n)), in that order. Without a RAM tier
 * (m->ram NULL) one CPU MoE call over them. With one, the units are acquired from it (a RAM slot,
 * staging, or a read from the file on SSD: counted in its stats) in rounds as its staging allows,
 * each round's jobs pointed at their RAM copies (hm_moe_job_from_parts), run, and released: the
 * same f32 sums in the same job order as the single call (the CPU op adds into out pair by pair in
 * job order), so bit-identical. What the GPU placement's cold units go through (moe_cuda.c). An
 * I/O error is the tier's HM_ERR_IO (nothing stays pinned; out is then partial). */
hm_status hm_moe_run_cold(const struct hm_model *m, hm_pool *pool, const hm_moe_weights *mw, hm_moe_route *r,
                          int32_t n, const float *x, float *out, hm_scratch *scratch, hm_err *err);

#ifdef HM_HAVE_CUDA
struct hm_cuda_event;
/* ---- the hybrid step (moe_cuda.c, CUDA builds): hot units on the GPU, cold ones on the CPU ----
 *
 * With a GPU placement (m->gpu) the layer's routed units split by the store's slot map: a unit
 * whose slot is >= 0 (landed in VRAM) is HOT and runs in ONE grouped hm_cuda_moe launch over all
 * of them, reading the input on the device and accumulating straight into the device residual;
 * every other unit runs on the CPU threads at the same time (hm_cpu_moe, the jobs built as
 * hm_moe_compute builds them) from a pinned host copy of the input into a pinned host buffer,
 * which then goes up on the compute stream and is added into the residual there. The call returns
 * with everything queued: no sync (the layer's one sync is the caller's routing download before).
 * Results: the hot part is summed per token in unit order on the device, the cold part in job
 * order on the CPU, then added: the same terms as hm_moe_compute in another order (f32
 * rounding only). O(routed units + pairs); no allocation. */
struct hm_cuda_moe_unit;

typedef struct hm_moe_gpu_buf {
    const float *x_dev;   /* [n_tok, n_embd] the MoE input (the normed residual), device */
    const float *x_host;  /* the same rows, pinned host: what the CPU part reads (may be NULL when
                             hm_moe_gpu_all_hot said true: then nothing runs on the CPU) */
    float *out_dev;       /* [n_tok, n_embd] device, accumulated into (the residual) */
    float *cold_host;     /* [cap_tok, n_embd] pinned host: the CPU part's sum (cleared here) */
    float *cold_dev;      /* [cap_tok, n_embd] device: the CPU part's sum on its way to the add */
    void *scratch_dev;    /* hm_cuda_moe's scratch (hm_cuda_moe_scratch_size for cap_tok) */
    size_t scratch_dev_size;
    struct hm_cuda_moe_unit *units; /* [n_expert] host work space */
    /* prefill: the next layer's experts and its routing predicted on this layer's input (n_tok * k
     * ids, host, valid once the caller's routing wait is over), for streaming its heavy cold units
     * ahead (hm_moe_gpu_streams); NULL: none */
    const struct hm_moe_weights *next_mw;
    const int32_t *next_ids;
} hm_moe_gpu_buf;

/* True when every unit of layer mw->layer is HOT now and computable on the GPU (the store's slot
 * map and the kernel's types): the CPU part is then empty for any route, so the caller need not
 * download the input. O(n_expert); valid until the store's next step_end. */
bool hm_moe_gpu_all_hot(const struct hm_model *m, const hm_moe_weights *mw);

/* Why the grouped GPU kernels cannot compute mw's units (a constant string for a warning), or
 * NULL when they can: gate and up of one type, every part's type on the CUDA backend, n_embd a
 * multiple of 32 and of the gate/up block (gpt-oss: 2880), n_ff a multiple of 32 and of the down
 * part's block (Gemma-4 26B-A4B: 704). */
const char *hm_moe_gpu_unfit(const hm_moe_weights *mw);

/* out_dev += the route's units of x (see above). Requires m->gpu, no SSD tier (m->ram NULL).
 * r's tok/w and b->x_host must stay unchanged until the call returns (the kernel's routing tables
 * are staged inside it); cold_host until the compute stream has passed this layer (the next
 * sync). Errors: the CUDA calls' (the residual is then undefined). */
hm_status hm_moe_forward_gpu(const struct hm_model *m, hm_pool *pool, const hm_moe_weights *mw, hm_moe_route *r,
                             const hm_moe_gpu_buf *b, hm_scratch *scratch, hm_err *err);

/* ---- the decode split (n_tok <= 8): hot units routed on the device, cold ones on the host ----
 *
 * hm_moe_gpu_slot_table: bring `slots` ([n_expert] host, the table hm_cuda_moe_dev reads once
 * uploaded) in line with layer mw->layer's slot map, using `seen` ([n_expert], the slots the table
 * was built for; start it at -2 so the first call builds every entry). Entries of experts that are
 * not HOT or not computable on the GPU are NULL. Returns whether any entry changed (then upload
 * it); *all_hot / *any_hot say whether every / some expert of the layer is HOT now. O(n_expert)
 * compares, part() calls only for changed entries; valid until the store's next step_end. */
struct hm_cuda_moe_slot;
bool hm_moe_gpu_slot_table(const struct hm_model *m, const hm_moe_weights *mw, int32_t *seen,
                           struct hm_cuda_moe_slot *slots, bool *all_hot, bool *any_hot);
/* b->out_dev += the layer's HOT pairs, read from the router's device output (ids_dev, w_dev:
 * [n_tok, k]) through slots_dev (the uploaded table); queues two launches, no host work. */
hm_status hm_moe_forward_gpu_dev(const struct hm_model *m, const hm_moe_weights *mw,
                                 const struct hm_cuda_moe_slot *slots_dev, const int32_t *ids_dev,
                                 const float *w_dev, int64_t n_tok, int k, const hm_moe_gpu_buf *b,
                                 hm_err *err);
/* The rest of the step: the route's COLD units on the CPU threads from b->x_host, their sum
 * uploaded and added into b->out_dev (as hm_moe_forward_gpu's CPU part); nothing when none. */
hm_status hm_moe_forward_gpu_cold(const struct hm_model *m, hm_pool *pool, const hm_moe_weights *mw,
                                  hm_moe_route *r, const hm_moe_gpu_buf *b, hm_scratch *scratch,
                                  hm_err *err);
/* Whether a prefill of layer il streams cold units (moe_cuda.c): worth predicting its routing. */
bool hm_moe_gpu_streams(const struct hm_model *m, int32_t il);
/* One MoE layer of a per-launch GPU step (the three archs' forwards), after its router wrote the
 * routing at ids_d (device: nr * k ids, then their nr * k weights) on the layer's device:
 *   - decode (dec): the hot units from ids_d through slots_dev (when any_hot); unless all_hot, the
 *     routing comes down into ids_h and the input (b->x_dev) into b->x_host, the host waits for
 *     that alone (event `routed`) and computes the cold units (hm_moe_forward_gpu_cold) while the
 *     hot launch runs;
 *   - prefill: the routing (and unless all_hot the input) comes down, the host waits for the
 *     device, records the routing in the store and runs hm_moe_forward_gpu.
 * ids_h: pinned, 2 * nr * k words. The decode routing is recorded by the caller after the step. */
hm_status hm_moe_gpu_layer_step(const struct hm_model *m, hm_pool *pool, const hm_moe_weights *mw,
                                hm_moe_route *route, hm_scratch *scratch, const hm_moe_gpu_buf *b, bool dec,
                                bool all_hot, bool any_hot, const struct hm_cuda_moe_slot *slots_dev,
                                const int32_t *ids_d, int32_t *ids_h, int64_t nr, int k,
                                struct hm_cuda_event *routed, hm_err *err);
/* The decode graph's CPU part (cuda_ops.h, hm_cuda_publish / hm_cuda_join): cold_host ([n_tok,
 * n_embd] host) = the sum of the route's COLD units of x_host, computed on the CPU threads; zeros
 * when none. Enqueues nothing on the device: the graph's join adds cold_host. */
hm_status hm_moe_gpu_cold_host(const struct hm_model *m, hm_pool *pool, const hm_moe_weights *mw,
                               hm_moe_route *r, const float *x_host, float *cold_host, hm_scratch *scratch,
                               hm_err *err);

/* ---- a decode step as one CUDA graph (moe_graph_cuda.c) ----
 *
 * The arch captures its whole decode step once (an enqueue callback: every op on the compute
 * stream, per-step values only in device memory) and replays it; hm_moe_graph_step captures again
 * when the rows, the arch's key (e.g. the attention split) or the layers with any VRAM unit change.
 * In the callback each MoE layer calls hm_moe_graph_layer after its router: publish (the device
 * counts the pairs without a VRAM slot; only then routing and input go to mapped host memory),
 * the hot units, join (waits for the host's cold sum and adds it into out). During the replay the
 * host walks the layers in order: waits for each publish, computes that layer's cold units on the
 * CPU threads (hm_moe_gpu_cold_host) while the GPU computes the hot ones, and signals. A layer whose
 * routed units are all in VRAM costs no host round trip. After the step every layer's routing is
 * recorded in the store. On return the device may still run the step's tail (the output matmul):
 * the caller's logits download is the step's sync. On error every flag is released and the device
 * synced before returning. Results equal the per-launch path's (same kernels, same order). */
typedef struct hm_moe_graph hm_moe_graph;
struct hm_cuda_ctx;
/* mw[il]: layer il's experts (borrowed, copied as pointers), NULL for a layer without experts
 * (it must not call hm_moe_graph_layer); at most dec_cap rows a step. */
hm_status hm_moe_graph_open(struct hm_cuda_ctx *c, const hm_moe_weights *const *mw, int32_t n_layer,
                            int32_t dec_cap, int32_t k, int64_t n_embd, hm_moe_graph **out, hm_err *err);
void hm_moe_graph_close(hm_moe_graph *mg); /* NULL is a no-op; call after a device sync */
/* hm_moe_graph_open unless HOTMOE_CUDA_GRAPH=0 in the environment (the per-launch path only): then
 * HM_OK with *out NULL. */
hm_status hm_moe_graph_open_env(struct hm_cuda_ctx *c, const hm_moe_weights *const *mw, int32_t n_layer,
                                int32_t dec_cap, int32_t k, int64_t n_embd, hm_moe_graph **out, hm_err *err);
/* Inside the enqueue callback, after layer il's router (ids_dev, w_dev: [n_tok, k] device):
 * x_dev the MoE input, out_dev the residual accumulated into; any_hot as hm_moe_gpu_slot_table
 * said (the hot launch is left out of the graph when false). */
hm_status hm_moe_graph_layer(hm_moe_graph *mg, const struct hm_model *m, int32_t il,
                             const struct hm_cuda_moe_slot *slots_dev, bool any_hot, const int32_t *ids_dev,
                             const float *w_dev, int64_t n_tok, const float *x_dev, float *out_dev,
                             void *scratch, size_t scratch_size, hm_err *err);
typedef hm_status (*hm_moe_graph_enqueue_fn)(void *ctx, hm_err *err);
/* One decode step of n_tok rows (see above). any_hot: [n_layer]. */
hm_status hm_moe_graph_step(hm_moe_graph *mg, const struct hm_model *m, hm_pool *pool, hm_moe_route *route,
                            hm_scratch *scratch, int64_t n_tok, size_t key, const uint8_t *any_hot,
                            hm_moe_graph_enqueue_fn enqueue, void *ctx, hm_err *err);
#endif

#endif
