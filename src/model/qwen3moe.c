/* qwen3moe.c - the Qwen3-MoE architecture (Qwen3-30B-A3B, Qwen3-235B-A22B, ...).
 *
 * Per layer, for a micro-batch of n tokens (x is the residual stream, [n, n_embd]):
 *   h = rmsnorm(x) * attn_norm
 *   q, k, v = h Wq, h Wk, h Wv            q: [n, n_head*hd], k/v: [n, n_head_kv*hd]
 *   q, k = per-head rmsnorm(q) * q_norm, (k) * k_norm; then RoPE (NEOX pairing i <-> i + n_rot/2)
 *   (with RoPE scaling from the GGUF, linear or YaRN: per-pair frequency divisors, and YaRN's
 *   magnitude factor on the attention scale; model.h hm_model_rope_scaling)
 *   k, v -> KV cache (f16); a = causal GQA attention of q over the cache, scale 1/sqrt(hd)
 *   x += a Wo
 *   h = rmsnorm(x) * ffn_norm
 *   p = softmax(h Wr) over n_expert; top-k; weights renormalised to sum 1 (norm_topk_prob, which
 *       llama.cpp hard-wires for qwen3moe); x += sum_e w_e * down_e(silu(gate_e h) * up_e h)
 * then logits = (rmsnorm(x) * output_norm) Wout, Wout = token_embd when `output` is absent.
 * head_dim comes from attention.key_length and may differ from n_embd / n_head.
 * In the last layer only the rows whose logits are wanted go past the K/V write (a prompt's
 * prefill computes one row there, a micro-batch without wanted logits stops at the write).
 * After each router the layer's routed experts go to the model's expert store (hm_experts_record,
 * O(rows * k)); so the last layer counts only the rows it computes, as llama.cpp's does.
 *
 * The layer is written once (q3_layer_fwd, over exec.h's ops); the executor runs it on the CPU,
 * on the GPU op by op and as a captured CUDA graph, and uses it to upload the dense weights. It
 * owns the session state too (KV cache, activations: sized at open, a pass allocates nothing). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/exec.h"
#include "model.h"
#include "exec/moe.h"

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
    hm_moe_layer *moe_layers;  /* [n_layer], owned: each layer's router and experts, for xm */
    hm_exec_model xm;          /* what the executor runs (m->xm points here) */
    float *rope_ff;            /* RoPE scaling's per-pair divisors [n_rot / 2], owned; NULL = none */
    float attn_mul;            /* YaRN's factor on the attention logits (1 without) */
} q3_model;

/* ---- the layer ---- */

/* The activations beside x and h: q, k, v, the attention's output. */
enum { Q3_Q = HM_BUF_ARCH, Q3_K, Q3_V, Q3_ATT, Q3_NBUF };

static hm_status q3_layer_fwd(hm_exec *x, const hm_model *m, int32_t il) {
    const q3_model *q = m->impl;
    const q3_layer *L = &q->layers[il];
    hm_status st;
#define OP(call) do { if ((st = (call)) != HM_OK) return st; } while (0)
    /* attention block: Q/K/V of every row (the cache needs all K/V rows) */
    OP(hm_op_rmsnorm(x, HM_BUF_X, L->attn_norm, HM_BUF_H));
    const hm_mat *qkv[3] = {&L->wq, &L->wk, &L->wv};
    OP(hm_op_matmul_n(x, HM_BUF_H, qkv, (const hm_buf[3]){Q3_Q, Q3_K, Q3_V}, 3));
    const hm_qk_rope r = {.q = Q3_Q, .k = Q3_K, .v = Q3_V, .q_norm = L->q_norm, .k_norm = L->k_norm,
                          .rope_ff = q->rope_ff, .n_rot = q->n_rot, .theta = q->theta, .eps = q->eps};
    OP(hm_op_qk_norm_rope_kv(x, il, &r));
    OP(hm_op_out_rows(x, il, (const hm_buf[2]){Q3_Q, HM_BUF_X}, 2));
    if (hm_exec_done(x)) return HM_OK;
    OP(hm_op_attention(x, il, Q3_Q, Q3_ATT, q->attn_mul / sqrtf((float)q->head_dim)));
    OP(hm_op_matmul(x, Q3_ATT, &L->wo, HM_BUF_H));
    /* MoE block: x += attention, h = rmsnorm(x); the routed units straight into the residual */
    OP(hm_op_add_rmsnorm(x, HM_BUF_X, HM_BUF_H, L->ffn_norm, HM_BUF_H));
    OP(hm_op_moe(x, il, HM_BUF_H, HM_BUF_X));
#undef OP
    return HM_OK;
}

/* What the executor needs besides the layer (exec.h). */
static void q3_exec_model(q3_model *q) {
    hm_exec_model *xm = &q->xm;
    const int64_t E = q->n_embd, nq = (int64_t)q->n_head * q->head_dim, nkv = (int64_t)q->n_head_kv * q->head_dim;
    *xm = (hm_exec_model){.n_layer = q->n_layer, .n_embd = q->n_embd, .n_vocab = q->n_vocab, .eps = q->eps,
                          .tok_embd = &q->tok_embd, .output = &q->output, .output_norm = q->output_norm,
                          .n_buf = Q3_NBUF, .n_head = q->n_head, .n_head_kv = q->n_head_kv,
                          .head_dim = q->head_dim, .n_kv_layer = q->n_layer, .moe_layers = q->moe_layers,
                          .moe = {.n_expert = q->n_expert, .k = q->n_expert_used, .n_ff = q->n_ff_exp,
                                  .score = HM_ROUTE_SOFTMAX, .norm_topk = true}};
    const int64_t w[Q3_NBUF] = {[HM_BUF_X] = E, [HM_BUF_H] = E, [Q3_Q] = nq, [Q3_K] = nkv, [Q3_V] = nkv,
                                [Q3_ATT] = nq};
    memcpy(xm->buf_width, w, sizeof w);
    for (int32_t il = 0; il < q->n_layer; il++)
        q->moe_layers[il] = (hm_moe_layer){.router = &q->layers[il].router, .experts = &q->layers[il].moe};
}

/* ---- load ---- */

#define HP_INT(suffix, req, dflt, dst) \
    do { if ((st = hm_model_hp_int(m, suffix, req, dflt, dst, err)) != HM_OK) goto fail; } while (0)
#define TRY(x) do { if ((st = (x)) != HM_OK) goto fail; } while (0)

static void q3_unload(hm_model *m) {
    q3_model *q = m->impl;
    if (!q) return;
    free(q->layers);
    free(q->moe_layers);
    free(q->rope_ff);
    free(q);
    m->impl = NULL;
}

static hm_status q3_load(hm_model *m, hm_err *err) {
    hm_status st;
    q3_model *q = calloc(1, sizeof *q);
    if (!q) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    m->impl = q;

    TRY(hm_model_hp_moe(m, &q->hp, err));
    if (q->n_rot <= 0) {
        st = hm_errf(err, HM_ERR_FORMAT, "bad hparams: key_length %d, rope.dimension_count %d", q->head_dim, q->n_rot);
        goto fail;
    }
    {
        /* expert_feed_forward_length is optional in llama.cpp; fall back to the tensor's shape */
        const hm_gguf_tensor *g = hm_gguf_find_tensor(m->gguf, "blk.0.ffn_gate_exps.weight");
        HP_INT("expert_feed_forward_length", false, g && g->n_dims >= 2 ? g->ne[1] : 0, &q->n_ff_exp);
        if (q->n_ff_exp <= 0) {
            st = hm_errf(err, HM_ERR_FORMAT, "missing key %s.expert_feed_forward_length", m->arch_name);
            goto fail;
        }
    }
    TRY(hm_model_rope_scaling(m, q->n_rot, q->theta, &q->rope_ff, &q->attn_mul, err));

    const int64_t E = q->n_embd, hd = q->head_dim, nq = (int64_t)q->n_head * hd, nkv = (int64_t)q->n_head_kv * hd;
    TRY(hm_model_bind_vocab(m, E, &q->tok_embd, &q->output, &q->n_vocab, err));
    TRY(hm_model_bind_vec(m, "output_norm.weight", E, true, &q->output_norm, err));

    q->layers = calloc((size_t)q->n_layer, sizeof *q->layers);
    q->moe_layers = calloc((size_t)q->n_layer, sizeof *q->moe_layers);
    if (!q->layers || !q->moe_layers) {
        st = hm_errf(err, HM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int32_t il = 0; il < q->n_layer; il++) {
        q3_layer *L = &q->layers[il];
        char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s ".weight", il), n)
        TRY(hm_model_bind_vec(m, NAME("attn_norm"), E, true, &L->attn_norm, err));
        TRY(hm_model_bind_mat(m, NAME("attn_q"), E, nq, true, &L->wq, err));
        TRY(hm_model_bind_mat(m, NAME("attn_k"), E, nkv, true, &L->wk, err));
        TRY(hm_model_bind_mat(m, NAME("attn_v"), E, nkv, true, &L->wv, err));
        TRY(hm_model_bind_mat(m, NAME("attn_output"), nq, E, true, &L->wo, err));
        TRY(hm_model_bind_vec(m, NAME("attn_q_norm"), hd, true, &L->q_norm, err));
        TRY(hm_model_bind_vec(m, NAME("attn_k_norm"), hd, true, &L->k_norm, err));
        TRY(hm_model_bind_vec(m, NAME("ffn_norm"), E, true, &L->ffn_norm, err));
        TRY(hm_model_bind_mat(m, NAME("ffn_gate_inp"), E, q->n_expert, true, &L->router, err));
        TRY(hm_moe_bind(m, il, q->n_expert, E, q->n_ff_exp, HM_MOE_ACT_SILU, false, &L->moe, err));
#undef NAME
    }

    q3_exec_model(q);
    m->xm = &q->xm;
    hm_model_info_moe(m, &q->hp);
    hm_log_printf(&m->log, HM_LOG_INFO,
                  "qwen3moe: %d layers, n_embd %d, heads %d/%d x %d, experts %d (k %d, n_ff %d), vocab %d, "
                  "ctx_train %d, rope %g, eps %g",
                  q->n_layer, q->n_embd, q->n_head, q->n_head_kv, q->head_dim, q->n_expert, q->n_expert_used,
                  q->n_ff_exp, q->n_vocab, q->n_ctx_train, (double)q->theta, (double)q->eps);
    return HM_OK;
fail:
    q3_unload(m);
    return st;
}

const hm_arch hm_arch_qwen3moe = {
    .name = "qwen3moe",
    .load = q3_load,
    .unload = q3_unload,
    .forward_multi = hm_exec_forward_multi, /* several sessions' rows in one pass */
    HM_EXEC_ARCH(q3_layer_fwd),
};
