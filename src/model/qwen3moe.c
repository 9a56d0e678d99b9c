/* qwen3moe.c - the GQA attention + MoE layer, written once, and the four architectures that are
 * that layer: qwen3moe (Qwen3-30B-A3B, Qwen3-235B-A22B, ...), olmoe (allenai OLMoE-1B-7B), llama
 * with experts (Mixtral 8x7B, 8x22B: GGUF arch "llama" as llama.cpp's converter writes Mixtral) and
 * glm4moe (GLM-4.5, GLM-4.5-Air, GLM-4.6), each as llama.cpp's converter writes it.
 *
 * Per layer, for a micro-batch of n tokens (x is the residual stream, [n, n_embd]):
 *   h = rmsnorm(x) * attn_norm
 *   q, k, v = h Wq (+ bq), h Wk (+ bk), h Wv (+ bv)   q: [n, n_head*hd], k/v: [n, n_head_kv*hd]
 *   q, k normed: per head (rmsnorm * q_norm / k_norm over hd), over the whole projection (OLMoE:
 *       the weights are [n_head*hd] / [n_head_kv*hd]) or not at all
 *   RoPE of the first n_rot dims of each head: NEOX pairs (i, i + n_rot/2), or llama.cpp's normal
 *       pairs (2i, 2i + 1) for llama; the per-pair frequency divisors of the file's RoPE scaling
 *       (linear or YaRN, model.h hm_model_rope_scaling) or llama's rope_freqs.weight
 *   k, v -> KV cache; a = causal GQA attention of q, scale attn_mul / sqrt(hd) (llama:
 *       attn_mul * attention.scale when the file has it; attn_mul is YaRN's magnitude factor, 1
 *       without)
 *   x += a Wo (+ bo)
 *   h = rmsnorm(x) * ffn_norm (GLM: post_attention_norm)
 *   p = softmax(h Wr) over n_expert; top-k, renormalised (qwen3moe: norm_topk_prob, which llama.cpp
 *       hard-wires; llama) or not (OLMoE); x += sum_e p_e * down_e(silu(gate_e h) * up_e h)
 *   GLM instead: its first leading_dense_block_count layers a dense FFN, x += down(silu(gate h) *
 *       up h); the others the routed experts plus a shared expert (an ungated SwiGLU of width
 *       expert_shared_count * n_ff_exp), the router sigmoid (unless expert_gating_func says
 *       softmax), the choice on s + exp_probs_b (group-limited when expert_group_count > 1), the
 *       weights s of the chosen (renormalised when expert_weights_norm, times expert_weights_scale)
 * then logits = (rmsnorm(x) * output_norm) Wout, Wout = token_embd when `output` is absent.
 * head_dim comes from attention.key_length and may differ from n_embd / n_head.
 *
 * Why one file with a variant table (gm_variant), not four files over shared helpers: the four are
 * one layer; what differs is which optional tensors a file has and a few keys (the experts' width,
 * the FFN norm's name, RoPE pairing, q/k norm form, routing). Helpers in model.c for the binding
 * and the exec model would still leave four layer descriptions to drift apart; the table leaves
 * one layer, one binding, one exec model and one unload, and an arch of this shape is a row.
 *   - olmoe and llama: the experts' width is feed_forward_length (llama.cpp's n_ff for their
 *     experts), and llama.cpp asserts a full rotation (rope.dimension_count == head dim).
 *   - llama: a dense file (no expert_count, no ffn_gate_inp) or layer is refused: hotmoe runs MoE
 *     models; q/k/v/o biases are optional.
 *   - glm4moe: q/k/v biases and per-head q/k norms are optional (GLM-4.5 355B has the norms);
 *     partial RoPE (GLM-4.5 rotates half of 128). NextN / MTP: block_count counts
 *     nextn_predict_layers extra layers at the end (a draft head for speculative decoding).
 *     llama.cpp loads their tensors but never runs them; neither does this file (they are not
 *     bound; the expert store still lists their units, never routed). M-RoPE files
 *     (rope.dimension_sections, the vision variant) are refused.
 *
 * In the last layer only the rows whose logits are wanted go past the K/V write (a prompt's
 * prefill computes one row there, a micro-batch without wanted logits stops at the write).
 * After each router the layer's routed experts go to the model's expert store (hm_experts_record,
 * O(rows * k)); so the last layer counts only the rows it computes, as llama.cpp's does.
 *
 * The layer is written once (gm_layer_fwd, over exec.h's ops); the executor runs it on the CPU,
 * on the GPU op by op and as a captured CUDA graph, and uses it to upload the dense weights. It
 * owns the session state too (KV cache, activations: sized at open, a pass allocates nothing). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/exec.h"
#include "model.h"
#include "exec/moe.h"

/* ---- the architectures: their differences as data ---- */

typedef enum gm_qk_norm {
    GM_QK_NONE,     /* no q/k norm (llama) */
    GM_QK_HEAD,     /* per head, [hd] weights, required (qwen3moe) */
    GM_QK_HEAD_OPT, /* per head when the file has both, neither else (glm4moe) */
    GM_QK_WHOLE,    /* over the whole projection, [n_head*hd] / [n_head_kv*hd] (olmoe) */
} gm_qk_norm;

typedef struct gm_variant {
    const char *name;     /* general.architecture: the hm_arch of the same name */
    const char *ff_key;   /* the experts' width */
    const char *ffn_norm; /* blk.N.<ffn_norm>.weight: the norm before the FFN */
    gm_qk_norm qk;
    bool full_rope;       /* rope.dimension_count must be the head dim (llama.cpp asserts it) */
    bool rope_norm;       /* normal RoPE pairs (2i, 2i + 1); false: NEOX */
    bool bias_qkv, bias_o; /* optional q/k/v and output biases are bound */
    bool norm_topk;       /* softmax routing's top-k renormalised (GLM: its key says) */
    bool llama;           /* llama's: dense files and layers refused, attention.scale, rope_freqs.weight */
    bool glm;             /* GLM's: leading dense layers, a shared expert, its routing keys, NextN layers */
} gm_variant;

static const gm_variant gm_variants[] = {
    {.name = "qwen3moe", .ff_key = "expert_feed_forward_length", .ffn_norm = "ffn_norm", .qk = GM_QK_HEAD,
     .norm_topk = true},
    {.name = "olmoe", .ff_key = "feed_forward_length", .ffn_norm = "ffn_norm", .qk = GM_QK_WHOLE,
     .full_rope = true},
    {.name = "llama", .ff_key = "feed_forward_length", .ffn_norm = "ffn_norm", .qk = GM_QK_NONE,
     .full_rope = true, .rope_norm = true, .bias_qkv = true, .bias_o = true, .norm_topk = true, .llama = true},
    {.name = "glm4moe", .ff_key = "expert_feed_forward_length", .ffn_norm = "post_attention_norm",
     .qk = GM_QK_HEAD_OPT, .bias_qkv = true, .glm = true},
};

typedef struct gm_layer {
    bool dense;                                /* GLM's leading dense layer: no experts */
    const float *attn_norm, *ffn_norm;         /* [n_embd] */
    const float *q_norm, *k_norm;              /* [hd] each, [nq] and [nkv] (GM_QK_WHOLE), or NULL */
    const float *bq, *bk, *bv, *bo;            /* [nq], [nkv], [nkv], [n_embd] or NULL */
    const float *score_bias;                   /* [n_expert] GLM's exp_probs_b, or NULL */
    hm_mat wq, wk, wv, wo; /* [n_head*hd x n_embd], 2x [n_kv*hd x n_embd], [n_embd x n_head*hd] */
    hm_mat router;         /* [n_expert x n_embd] */
    hm_mat gate, up, down; /* GLM: the dense FFN, or the shared expert */
    hm_moe_weights moe;
} gm_layer;

typedef struct gm_model {
    HM_MOE_HP;                 /* n_layer (GLM: without the NextN layers), n_embd, heads, experts, ... */
    const gm_variant *v;
    int32_t n_nextn, n_dense, n_shared, n_ff, n_ff_sh; /* GLM's (0 for the others) */
    hm_mat tok_embd, output;   /* [n_vocab x n_embd] */
    const float *output_norm;  /* [n_embd] */
    const float *rope_freqs;   /* llama's rope_freqs.weight [n_rot / 2] or NULL (borrowed) */
    gm_layer *layers;          /* [n_layer], owned */
    hm_moe_layer *moe_layers;  /* [n_layer], owned: each layer's router and experts (empty: dense) */
    hm_exec_model xm;          /* what the executor runs (m->xm points here) */
    float *rope_ff;            /* RoPE scaling's per-pair divisors [n_rot / 2], owned; NULL = none */
    float attn_scale;          /* the attention's score scale (YaRN's attn_mul in it) */
} gm_model;

/* ---- the layer ---- */

/* The activations beside x and h: q, k, v, the attention's output; GLM's FFN gate, up, output. */
enum { GM_Q = HM_BUF_ARCH, GM_K, GM_V, GM_ATT, GM_G, GM_U, GM_Y, GM_NBUF };

static hm_status gm_layer_fwd(hm_exec *x, const hm_model *m, int32_t il) {
    const gm_model *g = m->impl;
    const gm_layer *L = &g->layers[il];
    const int64_t nq = (int64_t)g->n_head * g->head_dim, nkv = (int64_t)g->n_head_kv * g->head_dim;
    const bool whole = g->v->qk == GM_QK_WHOLE;
    hm_status st;
#define OP(call) do { if ((st = (call)) != HM_OK) return st; } while (0)
    /* attention block: Q/K/V of every row (the cache needs all K/V rows) */
    OP(hm_op_rmsnorm(x, HM_BUF_X, L->attn_norm, HM_BUF_H));
    const hm_mat *qkv[3] = {&L->wq, &L->wk, &L->wv};
    OP(hm_op_matmul_n(x, HM_BUF_H, qkv, (const hm_buf[3]){GM_Q, GM_K, GM_V}, 3));
    if (L->bq) OP(hm_op_add_bias(x, GM_Q, L->bq, nq));
    if (L->bk) OP(hm_op_add_bias(x, GM_K, L->bk, nkv));
    if (L->bv) OP(hm_op_add_bias(x, GM_V, L->bv, nkv));
    if (whole) {
        OP(hm_op_rmsnorm_w(x, GM_Q, L->q_norm, GM_Q, nq));
        OP(hm_op_rmsnorm_w(x, GM_K, L->k_norm, GM_K, nkv));
    }
    const hm_qk_rope r = {.q = GM_Q, .k = GM_K, .v = GM_V, .q_norm = whole ? NULL : L->q_norm,
                          .k_norm = whole ? NULL : L->k_norm, .rope_ff = g->rope_ff ? g->rope_ff : g->rope_freqs,
                          .n_rot = g->n_rot, .theta = g->theta, .eps = g->eps, .rope_norm = g->v->rope_norm};
    OP(hm_op_qk_norm_rope_kv(x, il, &r));
    OP(hm_op_out_rows(x, il, (const hm_buf[2]){GM_Q, HM_BUF_X}, 2));
    if (hm_exec_done(x)) return HM_OK;
    OP(hm_op_attention(x, il, GM_Q, GM_ATT, g->attn_scale));
    OP(hm_op_matmul(x, GM_ATT, &L->wo, HM_BUF_H));
    if (L->bo) OP(hm_op_add_bias(x, HM_BUF_H, L->bo, g->n_embd));
    /* MoE block: x += attention, h = rmsnorm(x); the routed units straight into the residual */
    OP(hm_op_add_rmsnorm(x, HM_BUF_X, HM_BUF_H, L->ffn_norm, HM_BUF_H));
    if (!g->v->glm) return hm_op_moe(x, il, HM_BUF_H, HM_BUF_X);
    /* GLM: the dense FFN or the shared expert (both an ungated SwiGLU on h), then the routed units */
    const int64_t f = L->dense ? g->n_ff : g->n_ff_sh;
    const hm_mat *gu[2] = {&L->gate, &L->up};
    OP(hm_op_matmul_n(x, HM_BUF_H, gu, (const hm_buf[2]){GM_G, GM_U}, 2));
    OP(hm_op_swiglu(x, GM_G, GM_U, GM_G, f));
    OP(hm_op_matmul(x, GM_G, &L->down, GM_Y));
    if (!L->dense) OP(hm_op_moe(x, il, HM_BUF_H, HM_BUF_X));
    OP(hm_op_add(x, HM_BUF_X, GM_Y));
#undef OP
    return HM_OK;
}

/* What the executor needs besides the layer (exec.h); moe: the routing spec (n_ff included). */
static void gm_exec_model(gm_model *g, const hm_moe_spec *moe) {
    hm_exec_model *xm = &g->xm;
    const int64_t E = g->n_embd, nq = (int64_t)g->n_head * g->head_dim, nkv = (int64_t)g->n_head_kv * g->head_dim;
    const int64_t f = g->n_ff > g->n_ff_sh ? g->n_ff : g->n_ff_sh;
    *xm = (hm_exec_model){.n_layer = g->n_layer, .n_embd = g->n_embd, .n_vocab = g->n_vocab, .eps = g->eps,
                          .tok_embd = &g->tok_embd, .output = &g->output, .output_norm = g->output_norm,
                          .n_buf = g->v->glm ? GM_NBUF : GM_G, .n_head = g->n_head, .n_head_kv = g->n_head_kv,
                          .head_dim = g->head_dim, .n_kv_layer = g->n_layer, .moe_layers = g->moe_layers,
                          .moe = *moe};
    const int64_t w[GM_NBUF] = {[HM_BUF_X] = E, [HM_BUF_H] = E, [GM_Q] = nq, [GM_K] = nkv, [GM_V] = nkv,
                                [GM_ATT] = nq, [GM_G] = f, [GM_U] = f, [GM_Y] = E};
    memcpy(xm->buf_width, w, (size_t)xm->n_buf * sizeof w[0]);
    for (int32_t il = 0; il < g->n_layer; il++) {
        const gm_layer *L = &g->layers[il];
        if (!L->dense)
            g->moe_layers[il] = (hm_moe_layer){.router = &L->router, .experts = &L->moe, .score_bias = L->score_bias};
    }
}

/* ---- load ---- */

#define HP_INT(suffix, req, dflt, dst) \
    do { if ((st = hm_model_hp_int(m, suffix, req, dflt, dst, err)) != HM_OK) goto fail; } while (0)
#define TRY(x) do { if ((st = (x)) != HM_OK) goto fail; } while (0)

static void gm_unload(hm_model *m) {
    gm_model *g = m->impl;
    if (!g) return;
    free(g->layers);
    free(g->moe_layers);
    free(g->rope_ff);
    free(g);
    m->impl = NULL;
}

static hm_status gm_bind_layer(const hm_model *m, gm_model *g, int32_t il, hm_err *err) {
    const gm_variant *v = g->v;
    gm_layer *L = &g->layers[il];
    const int64_t E = g->n_embd, hd = g->head_dim, nq = (int64_t)g->n_head * hd, nkv = (int64_t)g->n_head_kv * hd;
    hm_status st;
    char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s, il), n)
#define B(x) do { if ((st = (x)) != HM_OK) return st; } while (0)
    if (hm_gguf_find_tensor(m->gguf, NAME("attn_qkv.weight")))
        return hm_errf(err, HM_ERR_UNSUPPORTED, "tensor '%s': a fused QKV projection is not supported for %s", n,
                       v->name);
    if (v->llama && !hm_gguf_find_tensor(m->gguf, NAME("ffn_gate_inp.weight")))
        return hm_errf(err, HM_ERR_UNSUPPORTED, "llama: layer %d is dense (no '%s'): only files with experts in "
                       "every layer are supported", il, n);
    B(hm_model_bind_vec(m, NAME("attn_norm.weight"), E, true, &L->attn_norm, err));
    B(hm_model_bind_mat(m, NAME("attn_q.weight"), E, nq, true, &L->wq, err));
    B(hm_model_bind_mat(m, NAME("attn_k.weight"), E, nkv, true, &L->wk, err));
    B(hm_model_bind_mat(m, NAME("attn_v.weight"), E, nkv, true, &L->wv, err));
    if (v->bias_qkv) {
        B(hm_model_bind_vec(m, NAME("attn_q.bias"), nq, false, &L->bq, err));
        B(hm_model_bind_vec(m, NAME("attn_k.bias"), nkv, false, &L->bk, err));
        B(hm_model_bind_vec(m, NAME("attn_v.bias"), nkv, false, &L->bv, err));
    }
    B(hm_model_bind_mat(m, NAME("attn_output.weight"), nq, E, true, &L->wo, err));
    if (v->bias_o) B(hm_model_bind_vec(m, NAME("attn_output.bias"), E, false, &L->bo, err));
    if (v->qk != GM_QK_NONE) {
        const bool whole = v->qk == GM_QK_WHOLE, req = v->qk != GM_QK_HEAD_OPT;
        B(hm_model_bind_vec(m, NAME("attn_q_norm.weight"), whole ? nq : hd, req, &L->q_norm, err));
        B(hm_model_bind_vec(m, NAME("attn_k_norm.weight"), whole ? nkv : hd, req, &L->k_norm, err));
        if (!L->q_norm != !L->k_norm)
            return hm_errf(err, HM_ERR_FORMAT, "layer %d: attn_q_norm and attn_k_norm must both be present or absent",
                           il);
    }
    snprintf(n, sizeof n, "blk.%d.%s.weight", il, v->ffn_norm);
    B(hm_model_bind_vec(m, n, E, true, &L->ffn_norm, err));
    L->dense = il < g->n_dense;
    if (L->dense) {
        B(hm_model_bind_mat(m, NAME("ffn_gate.weight"), E, g->n_ff, true, &L->gate, err));
        B(hm_model_bind_mat(m, NAME("ffn_up.weight"), E, g->n_ff, true, &L->up, err));
        B(hm_model_bind_mat(m, NAME("ffn_down.weight"), g->n_ff, E, true, &L->down, err));
        return HM_OK;
    }
    B(hm_model_bind_mat(m, NAME("ffn_gate_inp.weight"), E, g->n_expert, true, &L->router, err));
    if (v->glm) {
        B(hm_model_bind_vec(m, NAME("exp_probs_b.bias"), g->n_expert, true, &L->score_bias, err));
        B(hm_model_bind_mat(m, NAME("ffn_gate_shexp.weight"), E, g->n_ff_sh, true, &L->gate, err));
        B(hm_model_bind_mat(m, NAME("ffn_up_shexp.weight"), E, g->n_ff_sh, true, &L->up, err));
        B(hm_model_bind_mat(m, NAME("ffn_down_shexp.weight"), g->n_ff_sh, E, true, &L->down, err));
    }
    B(hm_moe_bind(m, il, g->n_expert, E, g->n_ff_exp, HM_MOE_ACT_SILU, false, &L->moe, err));
#undef NAME
#undef B
    return HM_OK;
}

/* GLM's hparams beyond the common ones: NextN, leading dense and shared-expert widths, the routing
 * (into *sp). */
static hm_status glm_hparams(const hm_model *m, gm_model *g, hm_moe_spec *sp, hm_err *err) {
    hm_status st;
    char key[160];
    snprintf(key, sizeof key, "%s.rope.dimension_sections", m->arch_name);
    if (hm_gguf_find_key(m->gguf, key) >= 0)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "key %s: M-RoPE (the vision variant's sections) is not supported", key);
    HP_INT("nextn_predict_layers", false, 0, &g->n_nextn);
    HP_INT("leading_dense_block_count", false, 0, &g->n_dense);
    HP_INT("expert_shared_count", true, 0, &g->n_shared);
    HP_INT("expert_feed_forward_length", true, 0, &g->n_ff_exp);
    HP_INT("feed_forward_length", g->n_dense > 0, 0, &g->n_ff);
    if (g->n_nextn >= g->n_layer || g->n_ff_exp <= 0 || g->n_shared <= 0 || (g->n_dense > 0 && g->n_ff <= 0))
        return hm_errf(err, HM_ERR_FORMAT, "bad hparams: block_count %d, nextn_predict_layers %d, "
                       "expert_feed_forward_length %d, expert_shared_count %d, feed_forward_length %d", g->n_layer,
                       g->n_nextn, g->n_ff_exp, g->n_shared, g->n_ff);
    g->n_layer -= g->n_nextn; /* the NextN layers are not run (see the top) */
    if (g->n_dense > g->n_layer) g->n_dense = g->n_layer;
    g->n_ff_sh = g->n_ff_exp * g->n_shared;

    /* the router: sigmoid unless the file says otherwise (llama.cpp's default for glm4moe) */
    int32_t gating;
    HP_INT("expert_gating_func", false, 2, &gating);
    if (gating == 0) gating = 2;
    if (gating != 1 && gating != 2)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "%s.expert_gating_func = %d: only softmax (1) and sigmoid (2) are "
                       "supported for glm4moe", m->arch_name, gating);
    sp->score = gating == 1 ? HM_ROUTE_SOFTMAX : HM_ROUTE_SIGMOID;
    HP_INT("expert_group_count", false, 0, &sp->n_group);
    HP_INT("expert_group_used_count", false, 0, &sp->topk_group);
    if ((st = hm_model_hp_float(m, "expert_weights_scale", false, 0.0, &sp->routed_scale, err)) != HM_OK) return st;
    snprintf(key, sizeof key, "%s.expert_weights_norm", m->arch_name);
    if (hm_gguf_find_key(m->gguf, key) >= 0 && !hm_gguf_get_bool(m->gguf, key, &sp->norm_topk))
        return hm_errf(err, HM_ERR_FORMAT, "key %s is not a bool", key);
    const hm_route_spec rs = {.n_expert = g->n_expert, .k = g->n_expert_used, .n_group = sp->n_group,
                              .topk_group = sp->topk_group, .score = HM_ROUTE_SIGMOID};
    const char *bad = hm_route_spec_invalid(&rs);
    if (bad)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "glm4moe routing (expert_count %d, expert_used_count %d, "
                       "expert_group_count %d, expert_group_used_count %d): %s", g->n_expert, g->n_expert_used,
                       sp->n_group, sp->topk_group, bad);
    return HM_OK;
fail:
    return st;
}

static hm_status gm_load(hm_model *m, hm_err *err) {
    hm_status st;
    gm_model *g = calloc(1, sizeof *g);
    if (!g) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    m->impl = g;
    for (size_t i = 0; i < sizeof gm_variants / sizeof gm_variants[0]; i++)
        if (strcmp(m->arch->name, gm_variants[i].name) == 0) g->v = &gm_variants[i];
    HM_ASSERT(g->v != NULL);
    const gm_variant *v = g->v;

    int64_t ne = 0;
    if (v->llama && (!hm_gguf_get_int(m->gguf, "llama.expert_count", &ne) || ne <= 0 ||
                     !hm_gguf_find_tensor(m->gguf, "blk.0.ffn_gate_inp.weight"))) {
        st = hm_errf(err, HM_ERR_UNSUPPORTED, "llama: a dense model (no llama.expert_count, no "
                     "blk.0.ffn_gate_inp.weight): hotmoe runs mixture-of-experts models only (Mixtral-style "
                     "llama files with experts)");
        goto fail;
    }
    TRY(hm_model_hp_moe(m, &g->hp, err));
    if (v->full_rope && g->n_rot != g->head_dim) {
        st = hm_errf(err, HM_ERR_UNSUPPORTED, "%s: rope.dimension_count %d != head dim %d", v->name, g->n_rot,
                     g->head_dim);
        goto fail;
    }
    if (g->n_rot <= 0) {
        st = hm_errf(err, HM_ERR_FORMAT, "bad hparams: key_length %d, rope.dimension_count %d", g->head_dim, g->n_rot);
        goto fail;
    }
    hm_moe_spec sp = {.score = HM_ROUTE_SOFTMAX, .norm_topk = v->norm_topk};
    if (v->glm) {
        TRY(glm_hparams(m, g, &sp, err));
    } else {
        /* the key is optional in llama.cpp; without it the experts' tensor gives the width */
        const hm_gguf_tensor *t = hm_gguf_find_tensor(m->gguf, "blk.0.ffn_gate_exps.weight");
        HP_INT(v->ff_key, t == NULL, t && t->n_dims >= 2 ? t->ne[1] : 0, &g->n_ff_exp);
        if (g->n_ff_exp <= 0) {
            st = hm_errf(err, HM_ERR_FORMAT, "bad hparams: %s %d (the experts' width)", v->ff_key, g->n_ff_exp);
            goto fail;
        }
    }
    float kq_scale = 0.0f, attn_mul;
    if (v->llama) { /* llama.cpp's kq_scale: attention.scale, or 1/sqrt(hd) */
        TRY(hm_model_hp_float(m, "attention.scale", false, 0.0, &kq_scale, err));
        if (kq_scale == 0.0f) kq_scale = 1.0f / sqrtf((float)g->head_dim);
    }
    TRY(hm_model_rope_scaling(m, g->n_rot, g->theta, &g->rope_ff, &attn_mul, err));
    g->attn_scale = v->llama ? attn_mul * kq_scale : attn_mul / sqrtf((float)g->head_dim);

    const int64_t E = g->n_embd;
    TRY(hm_model_bind_vocab(m, E, &g->tok_embd, &g->output, &g->n_vocab, err));
    TRY(hm_model_bind_vec(m, "output_norm.weight", E, true, &g->output_norm, err));
    if (v->llama) {
        TRY(hm_model_bind_vec(m, "rope_freqs.weight", g->n_rot / 2, false, &g->rope_freqs, err));
        if (g->rope_freqs && g->rope_ff) {
            st = hm_errf(err, HM_ERR_UNSUPPORTED,
                         "llama: rope_freqs.weight together with %s.rope.scaling is not supported", m->arch_name);
            goto fail;
        }
    }
    g->layers = calloc((size_t)g->n_layer, sizeof *g->layers);
    g->moe_layers = calloc((size_t)g->n_layer, sizeof *g->moe_layers);
    if (!g->layers || !g->moe_layers) {
        st = hm_errf(err, HM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int32_t il = 0; il < g->n_layer; il++) TRY(gm_bind_layer(m, g, il, err));

    sp.n_expert = g->n_expert;
    sp.k = g->n_expert_used;
    sp.n_ff = g->n_ff_exp;
    gm_exec_model(g, &sp);
    m->xm = &g->xm;
    hm_model_info_moe(m, &g->hp);
    hm_log_printf(&m->log, HM_LOG_INFO,
                  "%s: %d layers, n_embd %d, heads %d/%d x %d (rope %d%s%s), experts %d (k %d, n_ff %d, %s%s), "
                  "vocab %d, ctx_train %d, rope %g, eps %g",
                  v->name, g->n_layer, g->n_embd, g->n_head, g->n_head_kv, g->head_dim, g->n_rot,
                  v->rope_norm ? ", normal pairing" : "", g->rope_freqs ? ", rope_freqs" : "", g->n_expert,
                  g->n_expert_used, g->n_ff_exp, sp.score == HM_ROUTE_SOFTMAX ? "softmax" : "sigmoid",
                  sp.norm_topk ? ", renormalised" : "", g->n_vocab, g->n_ctx_train, (double)g->theta, (double)g->eps);
    if (v->glm)
        hm_log_printf(&m->log, HM_LOG_INFO, "%s: +%d NextN layers (not run), %d dense, %d shared, groups %d/%d, "
                      "scale %g", v->name, g->n_nextn, g->n_dense, g->n_shared, sp.n_group, sp.topk_group,
                      (double)sp.routed_scale);
    return HM_OK;
fail:
    gm_unload(m);
    return st;
}

/* The registrations: one row of gm_variants each, the same load, unload and layer. */
#define GM_ARCH(arch_name)                                                                                 \
    {.name = arch_name, .load = gm_load, .unload = gm_unload,                                              \
     .forward_multi = hm_exec_forward_multi, /* several sessions' rows in one pass */                    \
     HM_EXEC_ARCH(gm_layer_fwd)}
const hm_arch hm_arch_qwen3moe = GM_ARCH("qwen3moe");
const hm_arch hm_arch_olmoe = GM_ARCH("olmoe");
const hm_arch hm_arch_llama = GM_ARCH("llama");     /* with experts: Mixtral */
const hm_arch hm_arch_glm4moe = GM_ARCH("glm4moe");
