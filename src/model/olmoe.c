/* olmoe.c - the OLMoE architecture (allenai OLMoE-1B-7B), GGUF arch "olmoe" as llama.cpp's
 * converter writes it.
 *
 * Per layer, for a micro-batch (x: [n, n_embd]):
 *   h = rmsnorm(x) * attn_norm;  q, k, v = h Wq, h Wk, h Wv
 *   q = rmsnorm(q) * q_norm and k = rmsnorm(k) * k_norm over the WHOLE projection (n_head * hd
 *   values, not per head: OLMoE's q_norm / k_norm weights are [n_embd]), then NEOX RoPE of every
 *   head dim; a = causal GQA attention, scale 1/sqrt(hd);  x += a Wo
 *   h = rmsnorm(x) * ffn_norm;  p = softmax(h Wr); top-k WITHOUT renormalisation (OLMoE's
 *   norm_topk_prob false); x += sum_e p_e * down_e(silu(gate_e h) * up_e h)
 * logits = (rmsnorm(x) * output_norm) Wout. The expert width is feed_forward_length (llama.cpp
 * uses n_ff for olmoe's experts). The layer is written once (olm_layer_fwd, over exec.h's ops). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/exec.h"
#include "model.h"
#include "exec/moe.h"

typedef struct olm_layer {
    const float *attn_norm, *q_norm, *k_norm, *ffn_norm; /* [n_embd], [nq], [nkv], [n_embd] */
    hm_mat wq, wk, wv, wo, router;
    hm_moe_weights moe;
} olm_layer;

typedef struct olm_model {
    HM_MOE_HP;
    hm_mat tok_embd, output;
    const float *output_norm;
    olm_layer *layers;         /* [n_layer], owned */
    hm_moe_layer *moe_layers;  /* [n_layer], owned */
    hm_exec_model xm;
    float *rope_ff;            /* RoPE scaling's per-pair divisors, owned; NULL = none */
    float attn_mul;
} olm_model;

enum { OLM_Q = HM_BUF_ARCH, OLM_K, OLM_V, OLM_ATT, OLM_NBUF };

static hm_status olm_layer_fwd(hm_exec *x, const hm_model *m, int32_t il) {
    const olm_model *o = m->impl;
    const olm_layer *L = &o->layers[il];
    const int64_t nq = (int64_t)o->n_head * o->head_dim, nkv = (int64_t)o->n_head_kv * o->head_dim;
    hm_status st;
#define OP(call) do { if ((st = (call)) != HM_OK) return st; } while (0)
    OP(hm_op_rmsnorm(x, HM_BUF_X, L->attn_norm, HM_BUF_H));
    const hm_mat *qkv[3] = {&L->wq, &L->wk, &L->wv};
    OP(hm_op_matmul_n(x, HM_BUF_H, qkv, (const hm_buf[3]){OLM_Q, OLM_K, OLM_V}, 3));
    OP(hm_op_rmsnorm_w(x, OLM_Q, L->q_norm, OLM_Q, nq));
    OP(hm_op_rmsnorm_w(x, OLM_K, L->k_norm, OLM_K, nkv));
    const hm_qk_rope r = {.q = OLM_Q, .k = OLM_K, .v = OLM_V, .rope_ff = o->rope_ff, .n_rot = o->n_rot,
                          .theta = o->theta, .eps = o->eps};
    OP(hm_op_qk_norm_rope_kv(x, il, &r)); /* no per-head norms: RoPE and the K/V write */
    OP(hm_op_out_rows(x, il, (const hm_buf[2]){OLM_Q, HM_BUF_X}, 2));
    if (hm_exec_done(x)) return HM_OK;
    OP(hm_op_attention(x, il, OLM_Q, OLM_ATT, o->attn_mul / sqrtf((float)o->head_dim)));
    OP(hm_op_matmul(x, OLM_ATT, &L->wo, HM_BUF_H));
    OP(hm_op_add_rmsnorm(x, HM_BUF_X, HM_BUF_H, L->ffn_norm, HM_BUF_H));
    OP(hm_op_moe(x, il, HM_BUF_H, HM_BUF_X));
#undef OP
    return HM_OK;
}

static void olm_exec_model(olm_model *o) {
    hm_exec_model *xm = &o->xm;
    const int64_t E = o->n_embd, nq = (int64_t)o->n_head * o->head_dim, nkv = (int64_t)o->n_head_kv * o->head_dim;
    *xm = (hm_exec_model){.n_layer = o->n_layer, .n_embd = o->n_embd, .n_vocab = o->n_vocab, .eps = o->eps,
                          .tok_embd = &o->tok_embd, .output = &o->output, .output_norm = o->output_norm,
                          .n_buf = OLM_NBUF, .n_head = o->n_head, .n_head_kv = o->n_head_kv,
                          .head_dim = o->head_dim, .n_kv_layer = o->n_layer, .moe_layers = o->moe_layers,
                          .moe = {.n_expert = o->n_expert, .k = o->n_expert_used, .n_ff = o->n_ff_exp,
                                  .score = HM_ROUTE_SOFTMAX, .norm_topk = false}};
    const int64_t w[OLM_NBUF] = {[HM_BUF_X] = E, [HM_BUF_H] = E, [OLM_Q] = nq, [OLM_K] = nkv, [OLM_V] = nkv,
                                 [OLM_ATT] = nq};
    memcpy(xm->buf_width, w, sizeof w);
    for (int32_t il = 0; il < o->n_layer; il++)
        o->moe_layers[il] = (hm_moe_layer){.router = &o->layers[il].router, .experts = &o->layers[il].moe};
}

#define TRY(x) do { if ((st = (x)) != HM_OK) goto fail; } while (0)

static void olm_unload(hm_model *m) {
    olm_model *o = m->impl;
    if (!o) return;
    free(o->layers);
    free(o->moe_layers);
    free(o->rope_ff);
    free(o);
    m->impl = NULL;
}

static hm_status olm_load(hm_model *m, hm_err *err) {
    hm_status st;
    olm_model *o = calloc(1, sizeof *o);
    if (!o) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    m->impl = o;

    TRY(hm_model_hp_moe(m, &o->hp, err));
    if (o->n_rot != o->head_dim) { /* llama.cpp asserts a full rotation for olmoe */
        st = hm_errf(err, HM_ERR_UNSUPPORTED, "olmoe: rope.dimension_count %d != head dim %d", o->n_rot, o->head_dim);
        goto fail;
    }
    {
        const hm_gguf_tensor *g = hm_gguf_find_tensor(m->gguf, "blk.0.ffn_gate_exps.weight");
        TRY(hm_model_hp_int(m, "feed_forward_length", g == NULL, g && g->n_dims >= 2 ? g->ne[1] : 0, &o->n_ff_exp,
                            err));
        if (o->n_ff_exp <= 0) {
            st = hm_errf(err, HM_ERR_FORMAT, "bad hparams: feed_forward_length %d (the experts' width)", o->n_ff_exp);
            goto fail;
        }
    }
    TRY(hm_model_rope_scaling(m, o->n_rot, o->theta, &o->rope_ff, &o->attn_mul, err));

    const int64_t E = o->n_embd, hd = o->head_dim, nq = (int64_t)o->n_head * hd, nkv = (int64_t)o->n_head_kv * hd;
    TRY(hm_model_bind_vocab(m, E, &o->tok_embd, &o->output, &o->n_vocab, err));
    TRY(hm_model_bind_vec(m, "output_norm.weight", E, true, &o->output_norm, err));
    o->layers = calloc((size_t)o->n_layer, sizeof *o->layers);
    o->moe_layers = calloc((size_t)o->n_layer, sizeof *o->moe_layers);
    if (!o->layers || !o->moe_layers) {
        st = hm_errf(err, HM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int32_t il = 0; il < o->n_layer; il++) {
        olm_layer *L = &o->layers[il];
        char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s ".weight", il), n)
        TRY(hm_model_bind_vec(m, NAME("attn_norm"), E, true, &L->attn_norm, err));
        TRY(hm_model_bind_mat(m, NAME("attn_q"), E, nq, true, &L->wq, err));
        TRY(hm_model_bind_mat(m, NAME("attn_k"), E, nkv, true, &L->wk, err));
        TRY(hm_model_bind_mat(m, NAME("attn_v"), E, nkv, true, &L->wv, err));
        TRY(hm_model_bind_mat(m, NAME("attn_output"), nq, E, true, &L->wo, err));
        TRY(hm_model_bind_vec(m, NAME("attn_q_norm"), nq, true, &L->q_norm, err));
        TRY(hm_model_bind_vec(m, NAME("attn_k_norm"), nkv, true, &L->k_norm, err));
        TRY(hm_model_bind_vec(m, NAME("ffn_norm"), E, true, &L->ffn_norm, err));
        TRY(hm_model_bind_mat(m, NAME("ffn_gate_inp"), E, o->n_expert, true, &L->router, err));
        TRY(hm_moe_bind(m, il, o->n_expert, E, o->n_ff_exp, HM_MOE_ACT_SILU, false, &L->moe, err));
#undef NAME
    }

    olm_exec_model(o);
    m->xm = &o->xm;
    hm_model_info_moe(m, &o->hp);
    hm_log_printf(&m->log, HM_LOG_INFO,
                  "olmoe: %d layers, n_embd %d, heads %d/%d x %d, experts %d (k %d, n_ff %d), vocab %d, rope %g, eps %g",
                  o->n_layer, o->n_embd, o->n_head, o->n_head_kv, o->head_dim, o->n_expert, o->n_expert_used,
                  o->n_ff_exp, o->n_vocab, (double)o->theta, (double)o->eps);
    return HM_OK;
fail:
    olm_unload(m);
    return st;
}

const hm_arch hm_arch_olmoe = {
    .name = "olmoe",
    .load = olm_load,
    .unload = olm_unload,
    .forward_multi = hm_exec_forward_multi,
    HM_EXEC_ARCH(olm_layer_fwd),
};
