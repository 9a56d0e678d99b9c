/* gptoss.c - OpenAI's gpt-oss (gpt-oss-20b, gpt-oss-120b; llama.cpp's `gpt-oss` GGUF arch).
 *
 * Per layer, for a micro-batch of n tokens (x is the residual stream, [n, n_embd]):
 *   h = rmsnorm(x) * attn_norm
 *   q, k, v = h Wq + bq, h Wk + bk, h Wv + bv     (no per-head norms)
 *   q, k: NEOX RoPE over the whole head (YaRN from the GGUF's rope.scaling keys: per-pair divisors,
 *   and its magnitude factor on the attention logits, model.h hm_model_rope_scaling)
 *   k, v -> the layer's KV cache: sliding layers (by default the even ones: attention.
 *   sliding_window_pattern, period 2) keep a ring of the last `sliding_window` positions, the
 *   others every position
 *   a = causal GQA attention, scale 1/sqrt(hd), with the layer's sinks: one learned logit per q
 *   head in the softmax's denominator (attn_sinks.weight)
 *   x += a Wo + bo
 *   h = rmsnorm(x) * post_attention_norm
 *   logits l = h Wr + br; the k largest; weights = softmax over those k logits
 *   x += sum_e w_e (down_e(swiglu_oai(gate_e h + bg_e, up_e h + bu_e)) + bd_e)
 *   with swiglu_oai(g, u) = g' sigmoid(1.702 g') (u' + 1), g' = min(g, 7), u' = clamp(u, -7, 7)
 * then logits = (rmsnorm(x) * output_norm) Wout.
 * The experts are usually MXFP4 (llama.cpp's conversion keeps the checkpoint's blocks), the rest
 * F32/BF16/Q8_0. The layer is written once (gpt_layer_fwd, over exec.h's ops); the executor runs
 * it on every backend (the experts' clamped SwiGLU and biases are fields of their hm_moe_weights,
 * which the CPU and CUDA expert kernels read). The Harmony chat format is not here (the server does
 * not know it yet), nor the o200k pre-tokenizer ("gpt-4o": the vocabulary refuses it by name). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/exec.h"
#include "model.h"
#include "exec/moe.h"

typedef struct gpt_layer {
    const float *attn_norm, *post_norm;  /* [n_embd] */
    const float *bq, *bk, *bv, *bo;      /* [n_head*hd], [n_kv*hd] x2, [n_embd] */
    const float *sinks;                  /* [n_head] */
    hm_mat wq, wk, wv, wo;
    hm_mat router;                       /* [n_expert x n_embd] */
    const float *router_b;               /* [n_expert] */
    hm_moe_weights moe;                  /* clamped SwiGLU, with biases */
    bool swa;
} gpt_layer;

typedef struct gpt_model {
    HM_MOE_HP;                   /* n_layer, n_embd, heads, experts, eps, theta, ... (model.h) */
    int32_t window;              /* the sliding layers' */
    float theta_swa;
    hm_mat tok_embd, output;     /* [n_vocab x n_embd] */
    const float *output_norm;    /* [n_embd] */
    gpt_layer *layers;           /* [n_layer], owned */
    hm_moe_layer *moe_layers;    /* [n_layer], owned */
    hm_attn_layer *attn_layers;  /* [n_layer], owned */
    hm_exec_model xm;
    float *rope_ff, *rope_ff_swa; /* YaRN's per-pair divisors [hd / 2], owned; NULL: none */
    float attn_mul, attn_mul_swa; /* its factor on the attention logits (1 without) */
} gpt_model;

/* ---- the layer ---- */

enum { GPT_Q = HM_BUF_ARCH, GPT_K, GPT_V, GPT_ATT, GPT_NBUF };

static hm_status gpt_layer_fwd(hm_exec *x, const hm_model *m, int32_t il) {
    const gpt_model *g = m->impl;
    const gpt_layer *L = &g->layers[il];
    const int64_t hd = g->head_dim, nq = (int64_t)g->n_head * hd, nkv = (int64_t)g->n_head_kv * hd;
    hm_status st;
#define OP(call) do { if ((st = (call)) != HM_OK) return st; } while (0)
    OP(hm_op_rmsnorm(x, HM_BUF_X, L->attn_norm, HM_BUF_H));
    const hm_mat *qkv[3] = {&L->wq, &L->wk, &L->wv};
    OP(hm_op_matmul_n(x, HM_BUF_H, qkv, (const hm_buf[3]){GPT_Q, GPT_K, GPT_V}, 3));
    OP(hm_op_add_bias(x, GPT_Q, L->bq, nq));
    OP(hm_op_add_bias(x, GPT_K, L->bk, nkv));
    OP(hm_op_add_bias(x, GPT_V, L->bv, nkv));
    const hm_ring_in r = {.q = GPT_Q, .k = GPT_K, .v = GPT_V, .no_norm = true, .n_rot = g->n_rot,
                          .rope_ff = L->swa ? g->rope_ff_swa : g->rope_ff, .theta = L->swa ? g->theta_swa : g->theta};
    OP(hm_op_attn_in_ring(x, il, &r));
    OP(hm_op_out_rows_w(x, il, (const hm_buf[2]){GPT_Q, HM_BUF_X}, (const int64_t[2]){nq, g->n_embd}, 2));
    if (hm_exec_done(x)) return HM_OK;
    const float mul = L->swa ? g->attn_mul_swa : g->attn_mul;
    OP(hm_op_attention_ring(x, il, GPT_Q, GPT_ATT, mul / sqrtf((float)hd)));
    OP(hm_op_matmul(x, GPT_ATT, &L->wo, HM_BUF_H));
    OP(hm_op_add_bias(x, HM_BUF_H, L->bo, g->n_embd));
    OP(hm_op_add_rmsnorm(x, HM_BUF_X, HM_BUF_H, L->post_norm, HM_BUF_H));
    OP(hm_op_moe(x, il, HM_BUF_H, HM_BUF_X));
#undef OP
    return HM_OK;
}

static void gpt_exec_model(gpt_model *g) {
    hm_exec_model *xm = &g->xm;
    const int64_t E = g->n_embd, nq = (int64_t)g->n_head * g->head_dim, nkv = (int64_t)g->n_head_kv * g->head_dim;
    *xm = (hm_exec_model){.n_layer = g->n_layer, .n_embd = g->n_embd, .n_vocab = g->n_vocab, .eps = g->eps,
                          .tok_embd = &g->tok_embd, .output = &g->output, .output_norm = g->output_norm,
                          .n_buf = GPT_NBUF, .n_head = g->n_head, .n_head_kv = g->n_head_kv,
                          .head_dim = g->head_dim, .n_kv_layer = g->n_layer, .attn_layers = g->attn_layers,
                          .attn_ring = true, .moe_layers = g->moe_layers,
                          .moe = {.n_expert = g->n_expert, .k = g->n_expert_used, .n_ff = g->n_ff_exp,
                                  .score = HM_ROUTE_SOFTMAX_TOPK, .norm_topk = false}};
    const int64_t w[GPT_NBUF] = {[HM_BUF_X] = E, [HM_BUF_H] = E, [GPT_Q] = nq, [GPT_K] = nkv, [GPT_V] = nkv,
                                 [GPT_ATT] = nq};
    memcpy(xm->buf_width, w, sizeof w);
    for (int32_t il = 0; il < g->n_layer; il++) {
        const gpt_layer *L = &g->layers[il];
        g->attn_layers[il] = (hm_attn_layer){.head_dim = g->head_dim, .n_head_kv = g->n_head_kv,
                                             .window = L->swa ? g->window : 0, .sinks = L->sinks};
        g->moe_layers[il] = (hm_moe_layer){.router = &L->router, .experts = &L->moe, .router_bias = L->router_b};
    }
}

/* ---- load ---- */

#define HP_INT(suffix, req, dflt, dst) \
    do { if ((st = hm_model_hp_int(m, suffix, req, dflt, dst, err)) != HM_OK) goto fail; } while (0)
#define TRY(x) do { if ((st = (x)) != HM_OK) goto fail; } while (0)

static void gpt_unload(hm_model *m) {
    gpt_model *g = m->impl;
    if (!g) return;
    free(g->layers);
    free(g->moe_layers);
    free(g->attn_layers);
    free(g->rope_ff);
    free(g->rope_ff_swa);
    free(g);
    m->impl = NULL;
}

/* An F32 tensor of ne0 x ne1 (the experts' biases: one row of ne0 per expert). */
static hm_status bind_f32_2d(const hm_model *m, const char *name, int64_t ne0, int64_t ne1, const float **out,
                             hm_err *err) {
    const int64_t ne[2] = {ne0, ne1};
    const hm_gguf_tensor *t = NULL;
    hm_status st = hm_model_bind(m, name, HM_BIND_F32, 2, ne, true, &t, err);
    *out = t ? (const float *)t->data : NULL;
    return st;
}

static hm_status bind_layer(const hm_model *m, gpt_model *g, int32_t il, hm_err *err) {
    gpt_layer *L = &g->layers[il];
    const int64_t E = g->n_embd, hd = g->head_dim, nq = (int64_t)g->n_head * hd, nkv = (int64_t)g->n_head_kv * hd;
    const int64_t F = g->n_ff_exp, NE = g->n_expert;
    hm_status st;
    char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s, il), n)
#define B(x) do { if ((st = (x)) != HM_OK) return st; } while (0)
    B(hm_model_bind_vec(m, NAME("attn_norm.weight"), E, true, &L->attn_norm, err));
    B(hm_model_bind_vec(m, NAME("post_attention_norm.weight"), E, true, &L->post_norm, err));
    B(hm_model_bind_mat(m, NAME("attn_q.weight"), E, nq, true, &L->wq, err));
    B(hm_model_bind_mat(m, NAME("attn_k.weight"), E, nkv, true, &L->wk, err));
    B(hm_model_bind_mat(m, NAME("attn_v.weight"), E, nkv, true, &L->wv, err));
    B(hm_model_bind_mat(m, NAME("attn_output.weight"), nq, E, true, &L->wo, err));
    B(hm_model_bind_vec(m, NAME("attn_q.bias"), nq, true, &L->bq, err));
    B(hm_model_bind_vec(m, NAME("attn_k.bias"), nkv, true, &L->bk, err));
    B(hm_model_bind_vec(m, NAME("attn_v.bias"), nkv, true, &L->bv, err));
    B(hm_model_bind_vec(m, NAME("attn_output.bias"), E, true, &L->bo, err));
    B(hm_model_bind_vec(m, NAME("attn_sinks.weight"), g->n_head, true, &L->sinks, err));
    B(hm_model_bind_mat(m, NAME("ffn_gate_inp.weight"), E, NE, true, &L->router, err));
    B(hm_model_bind_vec(m, NAME("ffn_gate_inp.bias"), NE, true, &L->router_b, err));
    B(hm_moe_bind(m, il, g->n_expert, E, F, HM_MOE_ACT_SWIGLU_OAI, false, &L->moe, err));
    B(bind_f32_2d(m, NAME("ffn_gate_exps.bias"), F, NE, &L->moe.gate_b, err));
    B(bind_f32_2d(m, NAME("ffn_up_exps.bias"), F, NE, &L->moe.up_b, err));
    B(bind_f32_2d(m, NAME("ffn_down_exps.bias"), E, NE, &L->moe.down_b, err));
#undef NAME
#undef B
    return HM_OK;
}

static hm_status gpt_load(hm_model *m, hm_err *err) {
    hm_status st;
    gpt_model *g = calloc(1, sizeof *g);
    if (!g) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    m->impl = g;

    TRY(hm_model_hp_moe(m, &g->hp, err));
    HP_INT("expert_feed_forward_length", true, 0, &g->n_ff_exp);
    HP_INT("attention.sliding_window", true, 0, &g->window);
    TRY(hm_model_hp_float(m, "rope.freq_base_swa", false, g->theta, &g->theta_swa, err));
    if (g->n_ff_exp <= 0 || g->window <= 0 || g->n_rot != g->head_dim) {
        st = hm_errf(err, HM_ERR_FORMAT, "bad hparams: expert_feed_forward_length %d, sliding_window %d, "
                     "rope.dimension_count %d (gpt-oss rotates the whole head of %d)", g->n_ff_exp, g->window,
                     g->n_rot, g->head_dim);
        goto fail;
    }
    /* the sliding layers: a period p (llama.cpp's default 2: layer il slides when il % p < p - 1) */
    int32_t period = 2;
    {
        char key[160];
        snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", m->arch_name);
        hm_gguf_arr a;
        if (hm_gguf_get_arr(m->gguf, key, &a)) {
            st = hm_errf(err, HM_ERR_UNSUPPORTED, "key %s: a per-layer array; gpt-oss takes a period", key);
            goto fail;
        }
        HP_INT("attention.sliding_window_pattern", false, 2, &period);
        if (period < 0) {
            st = hm_errf(err, HM_ERR_FORMAT, "key %s = %d", key, period);
            goto fail;
        }
    }
    TRY(hm_model_rope_scaling(m, g->n_rot, g->theta, &g->rope_ff, &g->attn_mul, err));
    TRY(hm_model_rope_scaling(m, g->n_rot, g->theta_swa, &g->rope_ff_swa, &g->attn_mul_swa, err));

    const int64_t E = g->n_embd;
    TRY(hm_model_bind_vocab(m, E, &g->tok_embd, &g->output, &g->n_vocab, err));
    TRY(hm_model_bind_vec(m, "output_norm.weight", E, true, &g->output_norm, err));
    g->layers = calloc((size_t)g->n_layer, sizeof *g->layers);
    g->moe_layers = calloc((size_t)g->n_layer, sizeof *g->moe_layers);
    g->attn_layers = calloc((size_t)g->n_layer, sizeof *g->attn_layers);
    if (!g->layers || !g->moe_layers || !g->attn_layers) {
        st = hm_errf(err, HM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int32_t il = 0; il < g->n_layer; il++) {
        g->layers[il].swa = period == 0 || il % period < period - 1;
        TRY(bind_layer(m, g, il, err));
    }

    gpt_exec_model(g);
    m->xm = &g->xm;
    hm_model_info_moe(m, &g->hp);
    hm_log_printf(&m->log, HM_LOG_INFO,
                  "gpt-oss: %d layers, n_embd %d, heads %d/%d x %d, window %d (period %d), experts %d (k %d, "
                  "n_ff %d), vocab %d, ctx_train %d, rope %g, eps %g",
                  g->n_layer, g->n_embd, g->n_head, g->n_head_kv, g->head_dim, g->window, period, g->n_expert,
                  g->n_expert_used, g->n_ff_exp, g->n_vocab, g->n_ctx_train, (double)g->theta, (double)g->eps);
    return HM_OK;
fail:
    gpt_unload(m);
    return st;
}

const hm_arch hm_arch_gptoss = {
    .name = "gpt-oss",
    .load = gpt_load,
    .unload = gpt_unload,
    HM_EXEC_ARCH(gpt_layer_fwd),
};
