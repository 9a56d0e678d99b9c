/* qwen35moe.h - model-internal: the Qwen3.5-MoE weights and session state shared by
 * qwen35moe.c (load, state) and qwen35moe_fwd.c (forward). See qwen35moe.c for the math. */
#ifndef HM_MODEL_QWEN35MOE_H
#define HM_MODEL_QWEN35MOE_H

#include "model.h"
#include "moe.h"

typedef struct q35_layer {
    bool recurrent;         /* Gated DeltaNet (else gated full attention) */
    int32_t slot;           /* index among the layers of its kind (KV slot / recurrent slot) */
    const float *attn_norm, *post_norm; /* [n_embd], stored as 1 + w */
    /* full attention */
    hm_mat wq;              /* [2 * n_head * hd x n_embd]: per head [q | gate] */
    hm_mat wk, wv;          /* [n_head_kv * hd x n_embd] */
    hm_mat wo;              /* [n_embd x n_head * hd] */
    const float *q_norm, *k_norm; /* [hd] */
    /* Gated DeltaNet */
    hm_mat wqkv;            /* [2 * n_k * d_k + n_v * d_v x n_embd] */
    hm_mat wz;              /* [n_v * d_v x n_embd] (attn_gate) */
    hm_mat wbeta, walpha;   /* [n_v x n_embd] */
    const float *conv_w;    /* [conv_dim, K] */
    const float *dt_bias, *ssm_a; /* [n_v]; ssm_a = -exp(A_log) */
    const float *ssm_norm;  /* [d_v] (plain w) */
    hm_mat wout;            /* [n_embd x n_v * d_v] */
    /* MoE */
    hm_mat router;          /* [n_expert x n_embd] */
    hm_moe_weights moe;
    hm_mat sh_gate, sh_up;  /* [n_ff_sh x n_embd] */
    hm_mat sh_down;         /* [n_embd x n_ff_sh] */
    hm_mat sh_inp;          /* [1 x n_embd]: the shared expert's sigmoid gate */
} q35_layer;

typedef struct q35_model {
    HM_MOE_HP;               /* n_layer, n_embd, heads, experts, eps, theta, ... (model.h) */
    int32_t n_ff_sh;         /* the shared expert's */
    int32_t d_conv, n_k, n_v, d_k, d_v, conv_dim; /* DeltaNet shape */
    int32_t n_attn, n_recr;  /* layers of each kind */
    hm_mat tok_embd, output; /* [n_vocab x n_embd] */
    const float *output_norm;
    q35_layer *layers;       /* owned */
} q35_model;

typedef struct q35_state {
    int32_t n_ctx, n_ubatch, n_pos; /* n_pos: positions the recurrent state has absorbed */
    int n_threads;
    hm_kv_type kv_type;
    size_t kv_layer_elems, kv_elem_size;
    void *kv;             /* [n_attn][2][n_head_kv][n_ctx][hd], owned */
    float *kv_scratch;    /* f32 cache only, owned */
    float *rs;            /* [n_recr][conv (K-1)*conv_dim + delta n_v*d_k*d_v], owned */
    size_t rs_layer;      /* floats per recurrent layer */
    size_t rs_total;      /* floats of rs */
    void *act;            /* owns the activations below */
    float *x, *h;         /* [U, n_embd] */
    float *mix;           /* [U, max(2*n_head*hd, conv_dim)]: q+gate, or the DeltaNet qkv */
    float *q, *gate;      /* [U, n_head*hd] */
    float *k, *v;         /* [U, n_head_kv*hd] */
    float *att;           /* [U, max(n_head*hd, n_v*d_v)] */
    float *conv;          /* [U, conv_dim] */
    float *z;             /* [U, n_v*d_v] */
    float *ba, *aa, *g, *beta; /* [U, n_v] */
    float *rlog;          /* [U, n_expert] */
    float *rw;            /* [U, k] */
    int32_t *rid;         /* [U, k] */
    float *shg, *shu;     /* [U, n_ff_sh] */
    float *sho;           /* [U, n_embd] */
    float *shs;           /* [U] shared-expert gate logits */
    float *hout;          /* [U, n_embd] */
    int32_t *pos_out;     /* [U] */
    hm_moe_route route;
    hm_scratch scratch;
    struct q35_gstate *dev; /* the device state (GPU placement), owned; NULL on the CPU; the first of a
                             chain, one per device of a layer split (qwen35moe_cuda.c). With it the
                             host KV cache, recurrent state and activations above are not
                             allocated: only route and scratch (the cold expert units) are */
} q35_state;

/* qwen35moe_fwd.c */
hm_status hm_q35_forward(const hm_model *m, void *state, hm_pool *pool, const hm_fwd_batch *b, hm_err *err);

#ifdef HM_HAVE_CUDA
/* qwen35moe_cuda.c (CUDA builds). gpu_load / gpu_unload: hm_arch's. q35_gpu_state_open fills s->dev
 * (and the host route and scratch the cold units need) for o; q35_gpu_state_close frees s->dev
 * (NULL is a no-op); q35_gpu_state_reset zeroes the device recurrent state (state_trim to 0).
 * q35_gpu_forward: the forward on the device (s opened with the GPU; the caller checked that the
 * batch continues the recurrent state and advances s->n_pos after it). */
hm_status q35_gpu_load(hm_model *m, hm_err *err);
void q35_gpu_unload(hm_model *m);
hm_status q35_gpu_state_open(const hm_model *m, const hm_state_opts *o, q35_state *s, hm_err *err);
void q35_gpu_state_close(q35_state *s);
hm_status q35_gpu_state_reset(q35_state *s, hm_err *err);
hm_status q35_gpu_forward(const hm_model *m, q35_state *s, hm_pool *pool, const hm_fwd_batch *b, hm_err *err);
#endif

#endif
