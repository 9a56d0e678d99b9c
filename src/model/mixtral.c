/* mixtral.c - Mixtral (8x7B, 8x22B) and other llama-with-experts files: GGUF arch "llama" with
 * expert tensors, as llama.cpp's converter writes Mixtral. A dense llama file (no expert_count, no
 * ffn_gate_inp) is refused: hotmoe runs MoE models.
 *
 * Per layer, for a micro-batch (x: [n, n_embd]):
 *   h = rmsnorm(x) * attn_norm;  q, k, v = h Wq (+ bq), h Wk (+ bk), h Wv (+ bv)  (biases optional)
 *   RoPE with llama.cpp's normal pairing (dims 2i, 2i + 1; not NEOX) over the whole head, with the
 *   file's RoPE scaling or rope_freqs.weight (Llama-3 factors) as per-pair divisors; no q/k norm
 *   a = causal GQA attention, scale attention.scale or 1/sqrt(hd);  x += a Wo (+ bo)
 *   h = rmsnorm(x) * ffn_norm;  p = softmax(h Wr); top-k renormalised;
 *   x += sum_e p_e * down_e(silu(gate_e h) * up_e h)
 * logits = (rmsnorm(x) * output_norm) Wout (Wout = token_embd when output is absent). The experts'
 * width is feed_forward_length (llama.cpp's n_ff for llama's experts). The layer is written once
 * (mx_layer_fwd, over exec.h's ops). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/exec.h"
#include "model.h"
#include "exec/moe.h"

typedef struct mx_layer {
    const float *attn_norm, *ffn_norm;   /* [n_embd] */
    const float *bq, *bk, *bv, *bo;      /* optional biases */
    hm_mat wq, wk, wv, wo, router;
    hm_moe_weights moe;
} mx_layer;

typedef struct mx_model {
    HM_MOE_HP;
    hm_mat tok_embd, output;
    const float *output_norm;
    const float *rope_freqs;   /* rope_freqs.weight [n_rot / 2] or NULL (borrowed) */
    mx_layer *layers;          /* [n_layer], owned */
    hm_moe_layer *moe_layers;  /* [n_layer], owned */
    hm_exec_model xm;
    float *rope_ff;            /* RoPE scaling's per-pair divisors, owned; NULL = none */
    float attn_mul, kq_scale;
} mx_model;

enum { MX_Q = HM_BUF_ARCH, MX_K, MX_V, MX_ATT, MX_NBUF };

static hm_status mx_layer_fwd(hm_exec *x, const hm_model *m, int32_t il) {
    const mx_model *q = m->impl;
    const mx_layer *L = &q->layers[il];
    const int64_t nq = (int64_t)q->n_head * q->head_dim, nkv = (int64_t)q->n_head_kv * q->head_dim;
    hm_status st;
#define OP(call) do { if ((st = (call)) != HM_OK) return st; } while (0)
    OP(hm_op_rmsnorm(x, HM_BUF_X, L->attn_norm, HM_BUF_H));
    const hm_mat *qkv[3] = {&L->wq, &L->wk, &L->wv};
    OP(hm_op_matmul_n(x, HM_BUF_H, qkv, (const hm_buf[3]){MX_Q, MX_K, MX_V}, 3));
    if (L->bq) OP(hm_op_add_bias(x, MX_Q, L->bq, nq));
    if (L->bk) OP(hm_op_add_bias(x, MX_K, L->bk, nkv));
    if (L->bv) OP(hm_op_add_bias(x, MX_V, L->bv, nkv));
    const hm_qk_rope r = {.q = MX_Q, .k = MX_K, .v = MX_V, .rope_ff = q->rope_ff ? q->rope_ff : q->rope_freqs,
                          .n_rot = q->n_rot, .theta = q->theta, .eps = q->eps, .rope_norm = true};
    OP(hm_op_qk_norm_rope_kv(x, il, &r));
    OP(hm_op_out_rows(x, il, (const hm_buf[2]){MX_Q, HM_BUF_X}, 2));
    if (hm_exec_done(x)) return HM_OK;
    OP(hm_op_attention(x, il, MX_Q, MX_ATT, q->attn_mul * q->kq_scale));
    OP(hm_op_matmul(x, MX_ATT, &L->wo, HM_BUF_H));
    if (L->bo) OP(hm_op_add_bias(x, HM_BUF_H, L->bo, q->n_embd));
    OP(hm_op_add_rmsnorm(x, HM_BUF_X, HM_BUF_H, L->ffn_norm, HM_BUF_H));
    OP(hm_op_moe(x, il, HM_BUF_H, HM_BUF_X));
#undef OP
    return HM_OK;
}

static void mx_exec_model(mx_model *q) {
    hm_exec_model *xm = &q->xm;
    const int64_t E = q->n_embd, nq = (int64_t)q->n_head * q->head_dim, nkv = (int64_t)q->n_head_kv * q->head_dim;
    *xm = (hm_exec_model){.n_layer = q->n_layer, .n_embd = q->n_embd, .n_vocab = q->n_vocab, .eps = q->eps,
                          .tok_embd = &q->tok_embd, .output = &q->output, .output_norm = q->output_norm,
                          .n_buf = MX_NBUF, .n_head = q->n_head, .n_head_kv = q->n_head_kv,
                          .head_dim = q->head_dim, .n_kv_layer = q->n_layer, .moe_layers = q->moe_layers,
                          .moe = {.n_expert = q->n_expert, .k = q->n_expert_used, .n_ff = q->n_ff_exp,
                                  .score = HM_ROUTE_SOFTMAX, .norm_topk = true}};
    const int64_t w[MX_NBUF] = {[HM_BUF_X] = E, [HM_BUF_H] = E, [MX_Q] = nq, [MX_K] = nkv, [MX_V] = nkv,
                                [MX_ATT] = nq};
    memcpy(xm->buf_width, w, sizeof w);
    for (int32_t il = 0; il < q->n_layer; il++)
        q->moe_layers[il] = (hm_moe_layer){.router = &q->layers[il].router, .experts = &q->layers[il].moe};
}

#define TRY(x) do { if ((st = (x)) != HM_OK) goto fail; } while (0)

static void mx_unload(hm_model *m) {
    mx_model *q = m->impl;
    if (!q) return;
    free(q->layers);
    free(q->moe_layers);
    free(q->rope_ff);
    free(q);
    m->impl = NULL;
}

static hm_status mx_load(hm_model *m, hm_err *err) {
    hm_status st;
    mx_model *q = calloc(1, sizeof *q);
    if (!q) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    m->impl = q;

    int64_t ne = 0;
    if (!hm_gguf_get_int(m->gguf, "llama.expert_count", &ne) || ne <= 0 ||
        !hm_gguf_find_tensor(m->gguf, "blk.0.ffn_gate_inp.weight")) {
        st = hm_errf(err, HM_ERR_UNSUPPORTED, "llama: a dense model (no llama.expert_count, no "
                     "blk.0.ffn_gate_inp.weight): hotmoe runs mixture-of-experts models only (Mixtral-style "
                     "llama files with experts)");
        goto fail;
    }
    TRY(hm_model_hp_moe(m, &q->hp, err));
    if (q->n_rot != q->head_dim) { /* llama.cpp asserts a full rotation for llama */
        st = hm_errf(err, HM_ERR_UNSUPPORTED, "llama: rope.dimension_count %d != head dim %d", q->n_rot, q->head_dim);
        goto fail;
    }
    {
        const hm_gguf_tensor *g = hm_gguf_find_tensor(m->gguf, "blk.0.ffn_gate_exps.weight");
        TRY(hm_model_hp_int(m, "feed_forward_length", g == NULL, g && g->n_dims >= 2 ? g->ne[1] : 0, &q->n_ff_exp,
                            err));
        if (q->n_ff_exp <= 0) {
            st = hm_errf(err, HM_ERR_FORMAT, "bad hparams: feed_forward_length %d (the experts' width)", q->n_ff_exp);
            goto fail;
        }
    }
    TRY(hm_model_hp_float(m, "attention.scale", false, 0.0, &q->kq_scale, err));
    if (q->kq_scale == 0.0f) q->kq_scale = 1.0f / sqrtf((float)q->head_dim);
    TRY(hm_model_rope_scaling(m, q->n_rot, q->theta, &q->rope_ff, &q->attn_mul, err));

    const int64_t E = q->n_embd, hd = q->head_dim, nq = (int64_t)q->n_head * hd, nkv = (int64_t)q->n_head_kv * hd;
    TRY(hm_model_bind_vocab(m, E, &q->tok_embd, &q->output, &q->n_vocab, err));
    TRY(hm_model_bind_vec(m, "output_norm.weight", E, true, &q->output_norm, err));
    TRY(hm_model_bind_vec(m, "rope_freqs.weight", q->n_rot / 2, false, &q->rope_freqs, err));
    if (q->rope_freqs && q->rope_ff) {
        st = hm_errf(err, HM_ERR_UNSUPPORTED, "llama: rope_freqs.weight together with %s.rope.scaling is not supported",
                     m->arch_name);
        goto fail;
    }
    q->layers = calloc((size_t)q->n_layer, sizeof *q->layers);
    q->moe_layers = calloc((size_t)q->n_layer, sizeof *q->moe_layers);
    if (!q->layers || !q->moe_layers) {
        st = hm_errf(err, HM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int32_t il = 0; il < q->n_layer; il++) {
        mx_layer *L = &q->layers[il];
        char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s, il), n)
        if (hm_gguf_find_tensor(m->gguf, NAME("attn_qkv.weight"))) {
            st = hm_errf(err, HM_ERR_UNSUPPORTED, "tensor '%s': a fused QKV projection is not supported", n);
            goto fail;
        }
        if (!hm_gguf_find_tensor(m->gguf, NAME("ffn_gate_inp.weight"))) {
            st = hm_errf(err, HM_ERR_UNSUPPORTED, "llama: layer %d is dense (no '%s'): only files with experts in "
                         "every layer are supported", il, n);
            goto fail;
        }
        TRY(hm_model_bind_vec(m, NAME("attn_norm.weight"), E, true, &L->attn_norm, err));
        TRY(hm_model_bind_mat(m, NAME("attn_q.weight"), E, nq, true, &L->wq, err));
        TRY(hm_model_bind_mat(m, NAME("attn_k.weight"), E, nkv, true, &L->wk, err));
        TRY(hm_model_bind_mat(m, NAME("attn_v.weight"), E, nkv, true, &L->wv, err));
        TRY(hm_model_bind_vec(m, NAME("attn_q.bias"), nq, false, &L->bq, err));
        TRY(hm_model_bind_vec(m, NAME("attn_k.bias"), nkv, false, &L->bk, err));
        TRY(hm_model_bind_vec(m, NAME("attn_v.bias"), nkv, false, &L->bv, err));
        TRY(hm_model_bind_mat(m, NAME("attn_output.weight"), nq, E, true, &L->wo, err));
        TRY(hm_model_bind_vec(m, NAME("attn_output.bias"), E, false, &L->bo, err));
        TRY(hm_model_bind_vec(m, NAME("ffn_norm.weight"), E, true, &L->ffn_norm, err));
        TRY(hm_model_bind_mat(m, NAME("ffn_gate_inp.weight"), E, q->n_expert, true, &L->router, err));
        TRY(hm_moe_bind(m, il, q->n_expert, E, q->n_ff_exp, HM_MOE_ACT_SILU, false, &L->moe, err));
#undef NAME
    }

    mx_exec_model(q);
    m->xm = &q->xm;
    hm_model_info_moe(m, &q->hp);
    hm_log_printf(&m->log, HM_LOG_INFO,
                  "llama (experts): %d layers, n_embd %d, heads %d/%d x %d, experts %d (k %d, n_ff %d), vocab %d, "
                  "rope %g (normal pairing)%s, eps %g",
                  q->n_layer, q->n_embd, q->n_head, q->n_head_kv, q->head_dim, q->n_expert, q->n_expert_used,
                  q->n_ff_exp, q->n_vocab, (double)q->theta, q->rope_freqs ? " with rope_freqs" : "", (double)q->eps);
    return HM_OK;
fail:
    mx_unload(m);
    return st;
}

const hm_arch hm_arch_llama = {
    .name = "llama",
    .load = mx_load,
    .unload = mx_unload,
    .forward_multi = hm_exec_forward_multi,
    HM_EXEC_ARCH(mx_layer_fwd),
};
