/* qwen3moe_impl.h - the Qwen3-MoE architecture's internals shared by its CPU forward (qwen3moe.c)
 * and its GPU forward (qwen3moe_cuda.c, CUDA builds only): the bound weights, the session state,
 * and the GPU entry points qwen3moe.c dispatches to when the model has a GPU placement.
 *
 * A session state is one q3_state either way: on the CPU it owns the KV cache and activations;
 * with m->gpu its `g` holds the device KV cache, activations and pinned buffers (qwen3moe_cuda.c)
 * and only the CPU's MoE route and scratch (for the cold units) live in the host fields. */
#ifndef HM_MODEL_QWEN3MOE_IMPL_H
#define HM_MODEL_QWEN3MOE_IMPL_H

#include "model.h"
#include "moe.h"

typedef struct q3_layer {
    const float *attn_norm, *q_norm, *k_norm, *ffn_norm; /* [n_embd], [hd], [hd], [n_embd] */
    hm_mat wq, wk, wv, wo; /* [n_head*hd x n_embd], 2x [n_kv*hd x n_embd], [n_embd x n_head*hd] */
    hm_mat router;         /* [n_expert x n_embd] */
    hm_moe_weights moe;
} q3_layer;

typedef struct q3_model {
    HM_MOE_HP;                 /* n_layer, n_embd, heads, experts, eps, theta, ... (model.h) */
    hm_mat tok_embd, output;   /* [n_vocab x n_embd] */
    const float *output_norm;  /* [n_embd] */
    q3_layer *layers;          /* [n_layer], owned */
} q3_model;

typedef struct q3_state {
    int32_t n_ctx, n_ubatch;
    int n_threads;
    hm_kv_type kv_type;
    size_t kv_layer_elems;  /* n_head_kv * n_ctx * head_dim: one of K or V of one layer */
    size_t kv_elem_size;    /* 2 (f16) or 4 (f32) */
    void *kv;               /* [n_layer][2][n_head_kv][n_ctx][head_dim], owned */
    float *kv_scratch;      /* f32 cache only: attention scores, owned */
    void *act;              /* one block holding the activations below, owned */
    float *x;      /* [U, n_embd] residual stream */
    float *h;      /* [U, n_embd] normed input of a block, then its output */
    float *q;      /* [U, n_head*hd] */
    float *k, *v;  /* [U, n_head_kv*hd] */
    float *att;    /* [U, n_head*hd] */
    float *rlog;   /* [U, n_expert] router logits */
    float *rw;     /* [U, k] routing weights */
    int32_t *rid;  /* [U, k] routed experts */
    float *hout;   /* [U, n_embd] rows whose logits are wanted */
    int32_t *pos_out; /* [U] positions of those rows */
    int32_t *tok_all, *pos_all, *row_out; /* [U] forward_multi: the sequences' tokens, positions and
                                             wanted rows (batch indexes), concatenated */
    hm_moe_route route;
    hm_scratch scratch;
    struct q3_gstate *g;   /* the device state (GPU placement), owned; NULL on the CPU */
} q3_state;

#ifdef HM_HAVE_CUDA
/* qwen3moe_cuda.c. gpu_load / gpu_unload: hm_arch's. q3_gpu_state_open fills s->g (and the host
 * route and scratch the cold units need) for o; q3_gpu_state_close frees s->g (NULL is a no-op).
 * q3_gpu_forward: hm_arch.forward on the device (s opened with the GPU). */
hm_status q3_gpu_load(hm_model *m, hm_err *err);
void q3_gpu_unload(hm_model *m);
hm_status q3_gpu_state_open(const hm_model *m, const hm_state_opts *o, q3_state *s, hm_err *err);
void q3_gpu_state_close(q3_state *s);
hm_status q3_gpu_forward(const hm_model *m, q3_state *s, hm_pool *pool, const hm_fwd_batch *b, hm_err *err);
#endif

#endif
