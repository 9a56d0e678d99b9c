/* gemma4_impl.h - the Gemma 4 architecture's internals shared by its CPU forward (gemma4.c) and
 * its GPU forward (gemma4_cuda.c, CUDA builds only): the bound weights, the session state, and
 * the GPU entry points gemma4.c dispatches to when the model has a GPU placement.
 *
 * A session state is one g4_state either way: the ring geometry (ring, kvl, n_hi) is the same; on
 * the CPU it owns the KV cache and activations; with m->gpu its `gpu` holds the device KV cache,
 * activations and pinned buffers (gemma4_cuda.c) and only the CPU's MoE route and scratch (for the
 * cold units) live in the host fields. */
#ifndef HM_MODEL_GEMMA4_IMPL_H
#define HM_MODEL_GEMMA4_IMPL_H

#include "model.h"
#include "moe.h"

typedef struct g4_layer {
    bool swa, moe;
    int32_t hd, n_kv, n_rot, n_ff;
    float theta;
    const float *rope_ff;                         /* [hd/2] global layers, NULL sliding */
    const float *attn_norm, *q_norm, *k_norm, *post_attn_norm; /* [E], [hd], [hd], [E] */
    const float *ffn_norm, *post_ffw_norm;        /* [E] */
    const float *post_ffw_norm_1, *pre_ffw_norm_2, *post_ffw_norm_2, *router_scale; /* [E], MoE only */
    const float *expert_scale;                    /* [n_expert] or NULL */
    float out_scale;                              /* layer_output_scale, 1 when absent */
    hm_mat wq, wk, wv, wo;                        /* wv.data NULL: V = K */
    hm_mat gate, up, down;                        /* dense MLP */
    hm_mat router;                                /* [n_expert x E] */
    hm_moe_weights experts;
} g4_layer;

typedef struct g4_model {
    int32_t n_layer, n_embd, n_head, n_vocab, n_ctx_train, window;
    int32_t n_expert, n_expert_used, n_ff_exp;
    int32_t hd_max, n_kv_max, n_ff_max;
    float eps, softcap, embd_scale;
    hm_mat tok_embd, output;
    const float *output_norm;
    g4_layer *layers; /* [n_layer], owned */
} g4_model;

/* One layer's K then V inside the state's block: [n_kv][cap][hd] each, elements from off. */
typedef struct g4_kv {
    size_t off, elems;
    int64_t cap;
} g4_kv;

typedef struct g4_state {
    int32_t n_ctx, n_ubatch, window;
    int64_t n_hi;         /* 1 + the highest position written since the last reset */
    int64_t ring;         /* the sliding layers' ring rows (n_ctx when they hold everything) */
    g4_kv *kvl;           /* [n_layer], owned */
    size_t es;            /* KV element size: 2 (f16) or 4 (f32) */
    void *kv;             /* every layer's K and V (offsets in g4_layer), owned */
    float *att_scratch;   /* owned */
    void *act;            /* the activations below, one block, owned */
    float *x, *h, *q, *k, *v, *att, *g, *u, *m, *e, *rlog, *rw, *hout;
    int32_t *rid, *pos_out;
    hm_moe_route route;
    hm_scratch scratch;
    struct g4_gstate *gpu; /* the device states (GPU placement: one per device, chained), owned; NULL on the CPU */
} g4_state;

#ifdef HM_HAVE_CUDA
/* gemma4_cuda.c. gpu_load / gpu_unload: hm_arch's. g4_gpu_state_open fills s->gpu (and the host
 * route and scratch the cold units need) for o, s->kvl / s->ring already set; g4_gpu_state_close
 * frees s->gpu (NULL is a no-op). g4_gpu_forward: hm_arch.forward on the device. */
hm_status g4_gpu_load(hm_model *m, hm_err *err);
void g4_gpu_unload(hm_model *m);
hm_status g4_gpu_state_open(const hm_model *m, const hm_state_opts *o, g4_state *s, hm_err *err);
void g4_gpu_state_close(g4_state *s);
hm_status g4_gpu_forward(const hm_model *m, g4_state *s, hm_pool *pool, const hm_fwd_batch *b, hm_err *err);
#endif

#endif
