/* glm4moe.c - the GLM-4.5 MoE architecture (GLM-4.5, GLM-4.5-Air, GLM-4.6), GGUF arch "glm4moe" as
 * llama.cpp's converter writes it.
 *
 * Per layer, for a micro-batch (x: [n, n_embd]):
 *   h = rmsnorm(x) * attn_norm
 *   q, k, v = h Wq + bq, h Wk + bk, h Wv + bv          (biases optional; GLM-4.5 has them)
 *   q, k: per-head rmsnorm * q_norm / k_norm when the file has them (GLM-4.5 355B), then NEOX RoPE
 *   of the first rope.dimension_count dims of each head (partial: GLM-4.5 rotates half of 128)
 *   a = causal GQA attention, scale 1/sqrt(hd);  x += a Wo
 *   h = rmsnorm(x) * post_attention_norm
 *   the first leading_dense_block_count layers: x += down(silu(gate h) * up h)
 *   the others: x += routed experts + shared expert, the router: s = sigmoid(h Wr); the choice on
 *   s + exp_probs_b (group-limited when expert_group_count > 1), the weights s of the chosen
 *   (renormalised when expert_weights_norm, times expert_weights_scale); the shared expert is an
 *   ungated SwiGLU of width expert_shared_count * n_ff_exp
 * logits = (rmsnorm(x) * output_norm) Wout (Wout = token_embd when output is absent).
 *
 * NextN / MTP: block_count counts nextn_predict_layers extra layers at the end (a draft head for
 * speculative decoding). llama.cpp loads their tensors but never runs them; neither does this
 * file (they are not bound; the expert store still lists their units, never routed). The forward
 * runs block_count - nextn_predict_layers layers. M-RoPE files (rope.dimension_sections, the
 * vision variant) are refused. The layer is written once (glm_layer_fwd, over exec.h's ops). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/exec.h"
#include "model.h"
#include "exec/moe.h"

typedef struct glm_layer {
    bool dense;                                        /* a leading dense layer: no experts */
    const float *attn_norm, *post_norm;                /* [n_embd] */
    const float *q_norm, *k_norm;                      /* [hd] or NULL */
    const float *bq, *bk, *bv;                         /* [nq], [nkv], [nkv] or NULL */
    const float *score_bias;                           /* [n_expert] exp_probs_b */
    hm_mat wq, wk, wv, wo;
    hm_mat gate, up, down;                             /* dense FFN, or the shared expert */
    hm_mat router;                                     /* [n_expert x n_embd] */
    hm_moe_weights moe;
} glm_layer;

typedef struct glm_model {
    HM_MOE_HP;                 /* n_layer (without the NextN layers), n_embd, heads, experts, ... */
    int32_t n_nextn, n_dense, n_shared, n_ff, n_ff_sh;
    hm_mat tok_embd, output;
    const float *output_norm;
    glm_layer *layers;         /* [n_layer], owned */
    hm_moe_layer *moe_layers;  /* [n_layer], owned (empty for the dense layers) */
    hm_exec_model xm;
    float *rope_ff;            /* RoPE scaling's per-pair divisors, owned; NULL = none */
    float attn_mul;
} glm_model;

/* ---- the layer ---- */

enum { GLM_Q = HM_BUF_ARCH, GLM_K, GLM_V, GLM_ATT, GLM_G, GLM_U, GLM_Y, GLM_NBUF };

static hm_status glm_layer_fwd(hm_exec *x, const hm_model *m, int32_t il) {
    const glm_model *g = m->impl;
    const glm_layer *L = &g->layers[il];
    const int64_t nq = (int64_t)g->n_head * g->head_dim, nkv = (int64_t)g->n_head_kv * g->head_dim;
    hm_status st;
#define OP(call) do { if ((st = (call)) != HM_OK) return st; } while (0)
    OP(hm_op_rmsnorm(x, HM_BUF_X, L->attn_norm, HM_BUF_H));
    const hm_mat *qkv[3] = {&L->wq, &L->wk, &L->wv};
    OP(hm_op_matmul_n(x, HM_BUF_H, qkv, (const hm_buf[3]){GLM_Q, GLM_K, GLM_V}, 3));
    if (L->bq) OP(hm_op_add_bias(x, GLM_Q, L->bq, nq));
    if (L->bk) OP(hm_op_add_bias(x, GLM_K, L->bk, nkv));
    if (L->bv) OP(hm_op_add_bias(x, GLM_V, L->bv, nkv));
    const hm_qk_rope r = {.q = GLM_Q, .k = GLM_K, .v = GLM_V, .q_norm = L->q_norm, .k_norm = L->k_norm,
                          .rope_ff = g->rope_ff, .n_rot = g->n_rot, .theta = g->theta, .eps = g->eps};
    OP(hm_op_qk_norm_rope_kv(x, il, &r));
    OP(hm_op_out_rows(x, il, (const hm_buf[2]){GLM_Q, HM_BUF_X}, 2));
    if (hm_exec_done(x)) return HM_OK;
    OP(hm_op_attention(x, il, GLM_Q, GLM_ATT, g->attn_mul / sqrtf((float)g->head_dim)));
    OP(hm_op_matmul(x, GLM_ATT, &L->wo, HM_BUF_H));
    OP(hm_op_add_rmsnorm(x, HM_BUF_X, HM_BUF_H, L->post_norm, HM_BUF_H));
    /* the dense FFN or the shared expert (both an ungated SwiGLU on h), then the routed units */
    const int64_t f = L->dense ? g->n_ff : g->n_ff_sh;
    const hm_mat *gu[2] = {&L->gate, &L->up};
    OP(hm_op_matmul_n(x, HM_BUF_H, gu, (const hm_buf[2]){GLM_G, GLM_U}, 2));
    OP(hm_op_swiglu(x, GLM_G, GLM_U, GLM_G, f));
    OP(hm_op_matmul(x, GLM_G, &L->down, GLM_Y));
    if (!L->dense) OP(hm_op_moe(x, il, HM_BUF_H, HM_BUF_X));
    OP(hm_op_add(x, HM_BUF_X, GLM_Y));
#undef OP
    return HM_OK;
}

static void glm_exec_model(glm_model *g, hm_route_score score, bool norm, float scale, int32_t n_group,
                           int32_t topk_group) {
    hm_exec_model *xm = &g->xm;
    const int64_t E = g->n_embd, nq = (int64_t)g->n_head * g->head_dim, nkv = (int64_t)g->n_head_kv * g->head_dim;
    const int64_t f = g->n_ff > g->n_ff_sh ? g->n_ff : g->n_ff_sh;
    *xm = (hm_exec_model){.n_layer = g->n_layer, .n_embd = g->n_embd, .n_vocab = g->n_vocab, .eps = g->eps,
                          .tok_embd = &g->tok_embd, .output = &g->output, .output_norm = g->output_norm,
                          .n_buf = GLM_NBUF, .n_head = g->n_head, .n_head_kv = g->n_head_kv,
                          .head_dim = g->head_dim, .n_kv_layer = g->n_layer, .moe_layers = g->moe_layers,
                          .moe = {.n_expert = g->n_expert, .k = g->n_expert_used, .n_ff = g->n_ff_exp,
                                  .score = score, .norm_topk = norm, .routed_scale = scale, .n_group = n_group,
                                  .topk_group = topk_group}};
    const int64_t w[GLM_NBUF] = {[HM_BUF_X] = E, [HM_BUF_H] = E, [GLM_Q] = nq, [GLM_K] = nkv, [GLM_V] = nkv,
                                 [GLM_ATT] = nq, [GLM_G] = f, [GLM_U] = f, [GLM_Y] = E};
    memcpy(xm->buf_width, w, sizeof w);
    for (int32_t il = 0; il < g->n_layer; il++) {
        const glm_layer *L = &g->layers[il];
        if (!L->dense)
            g->moe_layers[il] = (hm_moe_layer){.router = &L->router, .experts = &L->moe, .score_bias = L->score_bias};
    }
}

/* ---- load ---- */

#define HP_INT(suffix, req, dflt, dst) \
    do { if ((st = hm_model_hp_int(m, suffix, req, dflt, dst, err)) != HM_OK) goto fail; } while (0)
#define TRY(x) do { if ((st = (x)) != HM_OK) goto fail; } while (0)

static void glm_unload(hm_model *m) {
    glm_model *g = m->impl;
    if (!g) return;
    free(g->layers);
    free(g->moe_layers);
    free(g->rope_ff);
    free(g);
    m->impl = NULL;
}

static hm_status bind_layer(const hm_model *m, glm_model *g, int32_t il, hm_err *err) {
    glm_layer *L = &g->layers[il];
    const int64_t E = g->n_embd, hd = g->head_dim, nq = (int64_t)g->n_head * hd, nkv = (int64_t)g->n_head_kv * hd;
    hm_status st;
    char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s, il), n)
#define B(x) do { if ((st = (x)) != HM_OK) return st; } while (0)
    if (hm_gguf_find_tensor(m->gguf, NAME("attn_qkv.weight")))
        return hm_errf(err, HM_ERR_UNSUPPORTED, "tensor '%s': a fused QKV projection is not supported for glm4moe", n);
    B(hm_model_bind_vec(m, NAME("attn_norm.weight"), E, true, &L->attn_norm, err));
    B(hm_model_bind_mat(m, NAME("attn_q.weight"), E, nq, true, &L->wq, err));
    B(hm_model_bind_mat(m, NAME("attn_k.weight"), E, nkv, true, &L->wk, err));
    B(hm_model_bind_mat(m, NAME("attn_v.weight"), E, nkv, true, &L->wv, err));
    B(hm_model_bind_vec(m, NAME("attn_q.bias"), nq, false, &L->bq, err));
    B(hm_model_bind_vec(m, NAME("attn_k.bias"), nkv, false, &L->bk, err));
    B(hm_model_bind_vec(m, NAME("attn_v.bias"), nkv, false, &L->bv, err));
    B(hm_model_bind_mat(m, NAME("attn_output.weight"), nq, E, true, &L->wo, err));
    B(hm_model_bind_vec(m, NAME("attn_q_norm.weight"), hd, false, &L->q_norm, err));
    B(hm_model_bind_vec(m, NAME("attn_k_norm.weight"), hd, false, &L->k_norm, err));
    if (!L->q_norm != !L->k_norm)
        return hm_errf(err, HM_ERR_FORMAT, "layer %d: attn_q_norm and attn_k_norm must both be present or absent", il);
    B(hm_model_bind_vec(m, NAME("post_attention_norm.weight"), E, true, &L->post_norm, err));
    L->dense = il < g->n_dense;
    if (L->dense) {
        B(hm_model_bind_mat(m, NAME("ffn_gate.weight"), E, g->n_ff, true, &L->gate, err));
        B(hm_model_bind_mat(m, NAME("ffn_up.weight"), E, g->n_ff, true, &L->up, err));
        B(hm_model_bind_mat(m, NAME("ffn_down.weight"), g->n_ff, E, true, &L->down, err));
        return HM_OK;
    }
    B(hm_model_bind_mat(m, NAME("ffn_gate_inp.weight"), E, g->n_expert, true, &L->router, err));
    B(hm_model_bind_vec(m, NAME("exp_probs_b.bias"), g->n_expert, true, &L->score_bias, err));
    B(hm_model_bind_mat(m, NAME("ffn_gate_shexp.weight"), E, g->n_ff_sh, true, &L->gate, err));
    B(hm_model_bind_mat(m, NAME("ffn_up_shexp.weight"), E, g->n_ff_sh, true, &L->up, err));
    B(hm_model_bind_mat(m, NAME("ffn_down_shexp.weight"), g->n_ff_sh, E, true, &L->down, err));
    B(hm_moe_bind(m, il, g->n_expert, E, g->n_ff_exp, HM_MOE_ACT_SILU, false, &L->moe, err));
#undef NAME
#undef B
    return HM_OK;
}

static hm_status glm_load(hm_model *m, hm_err *err) {
    hm_status st;
    glm_model *g = calloc(1, sizeof *g);
    if (!g) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    m->impl = g;

    TRY(hm_model_hp_moe(m, &g->hp, err));
    if (g->n_rot <= 0) {
        st = hm_errf(err, HM_ERR_FORMAT, "bad hparams: key_length %d, rope.dimension_count %d", g->head_dim, g->n_rot);
        goto fail;
    }
    char key[160];
    snprintf(key, sizeof key, "%s.rope.dimension_sections", m->arch_name);
    if (hm_gguf_find_key(m->gguf, key) >= 0) {
        st = hm_errf(err, HM_ERR_UNSUPPORTED, "key %s: M-RoPE (the vision variant's sections) is not supported", key);
        goto fail;
    }
    HP_INT("nextn_predict_layers", false, 0, &g->n_nextn);
    HP_INT("leading_dense_block_count", false, 0, &g->n_dense);
    HP_INT("expert_shared_count", true, 0, &g->n_shared);
    HP_INT("expert_feed_forward_length", true, 0, &g->n_ff_exp);
    HP_INT("feed_forward_length", g->n_dense > 0, 0, &g->n_ff);
    if (g->n_nextn >= g->n_layer || g->n_ff_exp <= 0 || g->n_shared <= 0 || (g->n_dense > 0 && g->n_ff <= 0)) {
        st = hm_errf(err, HM_ERR_FORMAT, "bad hparams: block_count %d, nextn_predict_layers %d, "
                     "expert_feed_forward_length %d, expert_shared_count %d, feed_forward_length %d", g->n_layer,
                     g->n_nextn, g->n_ff_exp, g->n_shared, g->n_ff);
        goto fail;
    }
    g->n_layer -= g->n_nextn; /* the NextN layers are not run (see the top) */
    if (g->n_dense > g->n_layer) g->n_dense = g->n_layer;
    g->n_ff_sh = g->n_ff_exp * g->n_shared;

    /* the router: sigmoid unless the file says otherwise (llama.cpp's default for glm4moe) */
    int32_t gating, n_group, topk_group;
    float scale;
    bool norm = false;
    HP_INT("expert_gating_func", false, 2, &gating);
    if (gating == 0) gating = 2;
    if (gating != 1 && gating != 2) {
        st = hm_errf(err, HM_ERR_UNSUPPORTED, "%s.expert_gating_func = %d: only softmax (1) and sigmoid (2) are "
                     "supported for glm4moe", m->arch_name, gating);
        goto fail;
    }
    HP_INT("expert_group_count", false, 0, &n_group);
    HP_INT("expert_group_used_count", false, 0, &topk_group);
    TRY(hm_model_hp_float(m, "expert_weights_scale", false, 0.0, &scale, err));
    snprintf(key, sizeof key, "%s.expert_weights_norm", m->arch_name);
    if (hm_gguf_find_key(m->gguf, key) >= 0 && !hm_gguf_get_bool(m->gguf, key, &norm)) {
        st = hm_errf(err, HM_ERR_FORMAT, "key %s is not a bool", key);
        goto fail;
    }
    {
        const hm_route_spec sp = {.n_expert = g->n_expert, .k = g->n_expert_used, .n_group = n_group,
                                  .topk_group = topk_group, .score = HM_ROUTE_SIGMOID};
        const char *bad = hm_route_spec_invalid(&sp);
        if (bad) {
            st = hm_errf(err, HM_ERR_UNSUPPORTED, "glm4moe routing (expert_count %d, expert_used_count %d, "
                         "expert_group_count %d, expert_group_used_count %d): %s", g->n_expert, g->n_expert_used,
                         n_group, topk_group, bad);
            goto fail;
        }
    }
    TRY(hm_model_rope_scaling(m, g->n_rot, g->theta, &g->rope_ff, &g->attn_mul, err));

    const int64_t E = g->n_embd;
    TRY(hm_model_bind_vocab(m, E, &g->tok_embd, &g->output, &g->n_vocab, err));
    TRY(hm_model_bind_vec(m, "output_norm.weight", E, true, &g->output_norm, err));
    g->layers = calloc((size_t)g->n_layer, sizeof *g->layers);
    g->moe_layers = calloc((size_t)g->n_layer, sizeof *g->moe_layers);
    if (!g->layers || !g->moe_layers) {
        st = hm_errf(err, HM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int32_t il = 0; il < g->n_layer; il++) TRY(bind_layer(m, g, il, err));

    glm_exec_model(g, gating == 1 ? HM_ROUTE_SOFTMAX : HM_ROUTE_SIGMOID, norm, scale, n_group, topk_group);
    m->xm = &g->xm;
    hm_model_info_moe(m, &g->hp);
    hm_log_printf(&m->log, HM_LOG_INFO,
                  "glm4moe: %d layers (+%d NextN, not run; %d dense), n_embd %d, heads %d/%d x %d (rope %d), "
                  "experts %d (k %d, n_ff %d, %d shared, %s, groups %d/%d, scale %g), vocab %d",
                  g->n_layer, g->n_nextn, g->n_dense, g->n_embd, g->n_head, g->n_head_kv, g->head_dim, g->n_rot,
                  g->n_expert, g->n_expert_used, g->n_ff_exp, g->n_shared, gating == 1 ? "softmax" : "sigmoid",
                  n_group, topk_group, (double)scale, g->n_vocab);
    return HM_OK;
fail:
    glm_unload(m);
    return st;
}

const hm_arch hm_arch_glm4moe = {
    .name = "glm4moe",
    .load = glm_load,
    .unload = glm_unload,
    .forward_multi = hm_exec_forward_multi,
    HM_EXEC_ARCH(glm_layer_fwd),
};
