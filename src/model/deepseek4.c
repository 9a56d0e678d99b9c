/* deepseek4.c - DeepSeek-V4 (V4-Flash and its kin), GGUF arch "deepseek4" as llama.cpp's converter
 * writes it.
 *
 * The residual is hc streams of n_embd (hyper-connections). Per layer, for a micro-batch:
 *   h = hc_pre(x; hc_attn_*)        mixes = fn rmsnorm(x) -> pre, post, Sinkhorn comb; h = sum pre x
 *   a = attention(rmsnorm(h) * attn_norm)       (exec.h's hm_op_dsv4_attn, backend/cpu/cpu_dsv4.h):
 *       q = rmsnorm_heads(Wq_b (rmsnorm(h Wq_a) * q_a_norm)), one K=V row rmsnorm(h Wkv) * kv_norm,
 *       RoPE ("normal" pairing) on the last n_rot of each head; keys: the last `window` rows and,
 *       on compressed layers, rows compressed from blocks of 4 (overlapping, the indexer's top-k)
 *       or 128 positions; sinks; output de-roped, per group times Wo_a, then Wo_b
 *   x = post a + comb x             (hc_post)
 *   h = hc_pre(x; hc_ffn_*)
 *   f = shared(rmsnorm(h) * ffn_norm) + experts(same): clamped SwiGLU, sqrt-softplus routing with a
 *       bias (hash-routed layers: experts from the token id), renormalised, times the routed scale
 *   x = post f + comb x
 * with x0 = token_embd[tok] in every stream and logits = Wout (rmsnorm(hc_head(x)) * output_norm).
 * Compressed layers use compress_rope_freq_base for their RoPE (with the file's YaRN frequency
 * correction, whose magnitude factor V4 cancels), the others rope.freq_base unscaled.
 *
 * Session state: each layer's window ring, compressors and compressed rows (the executor's, sized
 * by xm->dsv4, on the CPU or on the layer's device); only one sequence a pass. On CUDA the same
 * description runs (backend/cuda/cuda_dsv4.h: the hyper-connections and the attention; the clamped
 * SwiGLU in the grouped expert kernels), hot experts in VRAM slots and cold ones on the CPU. Not
 * supported (load says so): MTP layers, KV sharing variants, compression ratios other than 0, 4
 * and 128. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/exec.h"
#include "exec/moe.h"
#include "model.h"

typedef struct ds4_layer {
    int32_t ratio;
    float limit_exp, limit_sh;
    const float *attn_norm, *ffn_norm;
    hm_mat wq_a, wkv, wq_b, wo_a, wo_b;
    hm_mat c_kv, c_gate, i_qb, i_proj, i_kv, i_gate;
    hm_mat hc_attn_fn, hc_ffn_fn;
    const float *hc_attn_scale, *hc_attn_base, *hc_ffn_scale, *hc_ffn_base;
    hm_dsv4_attn attn; /* the op's weights and buffers */
    hm_mat router, gate_sh, up_sh, down_sh;
    const float *probs_b;  /* [n_expert] or NULL (hash layers) */
    const int32_t *hash;   /* [n_vocab, k] or NULL */
    hm_moe_weights experts;
} ds4_layer;

typedef struct ds4_model {
    int32_t n_layer, n_embd, n_head, hd, n_vocab, n_ctx_train;
    int32_t n_expert, n_expert_used, n_ff_exp, n_shared, n_hash, hc, hc_iters;
    float eps, theta, routed_scale, hc_eps;
    float *c_ff;             /* [n_rot / 2] the compressed layers' YaRN divisors or NULL, owned */
    hm_dsv4_dims dims;
    hm_mat tok_embd, output, hc_head_fn;
    const float *output_norm, *hc_head_scale, *hc_head_base;
    ds4_layer *layers;       /* [n_layer], owned */
    int32_t *ratio;          /* [n_layer], owned */
    int32_t *kv_slot;        /* [n_layer] all -1: the state is the layers' own (xm->dsv4), owned */
    hm_moe_layer *moe_layers;/* [n_layer], owned */
    hm_exec_model xm;
} ds4_model;

/* ---- the layer ---- */

enum {
    DS_NORM = HM_BUF_ARCH, DS_MIX, DS_QR, DS_KV, DS_Q, DS_ATT, DS_CA, DS_CB, DS_IA, DS_IB, DS_IQ,
    DS_F, DS_Y, DS_SG, DS_SU, DS_NBUF
};

static hm_status ds4_layer_fwd(hm_exec *x, const hm_model *m, int32_t il) {
    const ds4_model *g = m->impl;
    const ds4_layer *L = &g->layers[il];
    const int64_t E = g->n_embd, W = (int64_t)g->hc * E, F = (int64_t)g->n_ff_exp * g->n_shared;
    const hm_hc hc_attn = {&L->hc_attn_fn, L->hc_attn_scale, L->hc_attn_base};
    const hm_hc hc_ffn = {&L->hc_ffn_fn, L->hc_ffn_scale, L->hc_ffn_base};
    hm_status st;
#define OP(call) do { if ((st = (call)) != HM_OK) return st; } while (0)
    if (il == 0) OP(hm_op_hc_expand(x, HM_BUF_X));
    /* attention */
    OP(hm_op_hc_pre(x, HM_BUF_X, &hc_attn, DS_NORM, DS_MIX, HM_BUF_H));
    OP(hm_op_rmsnorm(x, HM_BUF_H, L->attn_norm, HM_BUF_H));
    const hm_mat *qk[2] = {&L->wq_a, &L->wkv};
    OP(hm_op_matmul_n(x, HM_BUF_H, qk, (const hm_buf[2]){DS_QR, DS_KV}, 2));
    OP(hm_op_dsv4_attn(x, il, &L->attn));
    OP(hm_op_matmul(x, DS_ATT, &L->wo_b, DS_F));
    OP(hm_op_hc_post(x, DS_F, HM_BUF_X, DS_MIX, DS_Y));
    OP(hm_op_copy(x, DS_Y, HM_BUF_X, W));
    OP(hm_op_out_rows_w(x, il, (const hm_buf[1]){HM_BUF_X}, (const int64_t[1]){W}, 1));
    if (hm_exec_done(x)) return HM_OK;
    /* shared expert + routed experts */
    OP(hm_op_hc_pre(x, HM_BUF_X, &hc_ffn, DS_NORM, DS_MIX, HM_BUF_H));
    OP(hm_op_rmsnorm(x, HM_BUF_H, L->ffn_norm, HM_BUF_H));
    const hm_mat *gu[2] = {&L->gate_sh, &L->up_sh};
    OP(hm_op_matmul_n(x, HM_BUF_H, gu, (const hm_buf[2]){DS_SG, DS_SU}, 2));
    OP(hm_op_swiglu_clamp(x, DS_SG, DS_SU, DS_SG, F, L->limit_sh));
    OP(hm_op_matmul(x, DS_SG, &L->down_sh, DS_F));
    OP(hm_op_moe(x, il, HM_BUF_H, DS_F));
    OP(hm_op_hc_post(x, DS_F, HM_BUF_X, DS_MIX, DS_Y));
    OP(hm_op_copy(x, DS_Y, HM_BUF_X, W));
    if (il == g->n_layer - 1) { /* the head's reduction: x becomes n_embd wide for the output norm */
        const hm_hc head = {&g->hc_head_fn, g->hc_head_scale, g->hc_head_base};
        OP(hm_op_hc_head(x, HM_BUF_X, &head, DS_NORM, DS_MIX, HM_BUF_H));
        OP(hm_op_copy(x, HM_BUF_H, HM_BUF_X, E));
    }
#undef OP
    return HM_OK;
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* What the executor needs besides the layer (exec.h); after every layer is bound. */
static void ds4_exec_model(ds4_model *g) {
    hm_exec_model *xm = &g->xm;
    const hm_dsv4_dims *d = &g->dims;
    const int64_t E = g->n_embd, hc = g->hc, hd = g->hd, nq = (int64_t)g->n_head * hd;
    *xm = (hm_exec_model){.n_layer = g->n_layer, .n_embd = g->n_embd, .n_vocab = g->n_vocab, .eps = g->eps,
                          .tok_embd = &g->tok_embd, .output = &g->output, .output_norm = g->output_norm,
                          .n_buf = DS_NBUF, .n_head = g->n_head, .n_head_kv = 1, .head_dim = g->hd,
                          .kv_slot = g->kv_slot, .n_kv_layer = 0, .moe_layers = g->moe_layers,
                          .moe = {.n_expert = g->n_expert, .k = g->n_expert_used, .n_ff = g->n_ff_exp,
                                  .score = HM_ROUTE_SQRT_SOFTPLUS, .norm_topk = true,
                                  .routed_scale = g->routed_scale},
                          .dsv4 = {.dims = *d, .hc = g->hc, .hc_iters = g->hc_iters, .hc_eps = g->hc_eps,
                                   .ratio = g->ratio}};
    const int64_t ih = d->idx_heads, ihd = d->idx_hd, F = (int64_t)g->n_ff_exp * g->n_shared;
    const int64_t w[DS_NBUF] = {
        [HM_BUF_X] = hc * E, [HM_BUF_H] = E,  [DS_NORM] = hc * E, [DS_MIX] = (2 + hc) * hc,
        [DS_QR] = d->q_lora, [DS_KV] = hd,    [DS_Q] = nq,        [DS_ATT] = (int64_t)d->o_groups * d->o_lora,
        [DS_CA] = max64(2 * hd, nq / d->o_groups), [DS_CB] = max64(2 * hd, d->o_lora),
        [DS_IA] = 2 * ihd,   [DS_IB] = 2 * ihd, [DS_IQ] = ih * ihd, [DS_F] = E, [DS_Y] = hc * E,
        [DS_SG] = F,         [DS_SU] = F};
    memcpy(xm->buf_width, w, sizeof w);
    for (int32_t il = 0; il < g->n_layer; il++) {
        ds4_layer *L = &g->layers[il];
        g->kv_slot[il] = -1;
        g->moe_layers[il] = (hm_moe_layer){.router = &L->router, .experts = &L->experts, .score_bias = L->probs_b,
                                           .hash = L->hash};
        L->attn.h = HM_BUF_H, L->attn.qr = DS_QR, L->attn.kv = DS_KV, L->attn.q = DS_Q, L->attn.out = DS_ATT;
        L->attn.ca = DS_CA, L->attn.cb = DS_CB, L->attn.ia = DS_IA, L->attn.ib = DS_IB, L->attn.iq = DS_IQ;
    }
}

/* ---- load ---- */

static void ds4_unload(hm_model *m) {
    ds4_model *g = m->impl;
    if (!g) return;
    free(g->layers);
    free(g->ratio);
    free(g->kv_slot);
    free(g->moe_layers);
    free(g->c_ff);
    free(g);
    m->impl = NULL;
}

/* An F32 matrix [ne0, ne1] read as floats (ape). */
static hm_status bind_f32_2d(const hm_model *m, const char *name, int64_t ne0, int64_t ne1, const float **out,
                             hm_err *err) {
    const hm_gguf_tensor *t;
    const int64_t ne[2] = {ne0, ne1};
    hm_status st = hm_model_bind(m, name, HM_BIND_F32, 2, ne, true, &t, err);
    if (st == HM_OK) *out = t->data;
    return st;
}

/* A per-layer array key (int or float) of n_layer entries: element il as a double. */
static hm_status arr_at(const hm_model *m, const char *suffix, int32_t n_layer, bool is_float, double *out,
                        hm_err *err) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", m->arch_name, suffix);
    hm_gguf_arr a;
    if (!hm_gguf_get_arr(m->gguf, key, &a) || a.n < (uint64_t)n_layer)
        return hm_errf(err, HM_ERR_FORMAT, "key %s: expected an array of at least %d entries (one per layer)", key,
                       n_layer);
    for (int32_t i = 0; i < n_layer; i++) {
        int64_t v;
        if (is_float ? !hm_gguf_arr_float(&a, (uint64_t)i, &out[i]) : !hm_gguf_arr_int(&a, (uint64_t)i, &v))
            return hm_errf(err, HM_ERR_FORMAT, "key %s[%d] is not a number", key, i);
        if (!is_float) out[i] = (double)v;
    }
    return HM_OK;
}

static hm_status bind_layer(const hm_model *m, ds4_model *g, int32_t il, hm_err *err) {
    ds4_layer *L = &g->layers[il];
    const hm_dsv4_dims *d = &g->dims;
    const int64_t E = g->n_embd, hd = g->hd, H = g->n_head, nq = H * hd, hcE = (int64_t)g->hc * E;
    const int64_t mix = (2 + (int64_t)g->hc) * g->hc, X = g->n_expert, Fs = (int64_t)g->n_ff_exp * g->n_shared;
    const int32_t r = L->ratio;
    const int64_t coff = r == 4 ? 2 : 1;
    hm_status st;
    char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s, il), n)
#define TRY(x) do { if ((st = (x)) != HM_OK) return st; } while (0)
    hm_dsv4_lw *w = &L->attn.w;
    TRY(hm_model_bind_vec(m, NAME("attn_norm.weight"), E, true, &L->attn_norm, err));
    TRY(hm_model_bind_vec(m, NAME("attn_sinks.weight"), H, true, &w->sinks, err));
    TRY(hm_model_bind_mat(m, NAME("attn_q_a.weight"), E, d->q_lora, true, &L->wq_a, err));
    TRY(hm_model_bind_vec(m, NAME("attn_q_a_norm.weight"), d->q_lora, true, &w->q_a_norm, err));
    TRY(hm_model_bind_mat(m, NAME("attn_q_b.weight"), d->q_lora, nq, true, &L->wq_b, err));
    TRY(hm_model_bind_mat(m, NAME("attn_kv.weight"), E, hd, true, &L->wkv, err));
    TRY(hm_model_bind_vec(m, NAME("attn_kv_a_norm.weight"), hd, true, &w->kv_norm, err));
    TRY(hm_model_bind_mat(m, NAME("attn_output_a.weight"), nq / d->o_groups, (int64_t)d->o_groups * d->o_lora, true,
                          &L->wo_a, err));
    TRY(hm_model_bind_mat(m, NAME("attn_output_b.weight"), (int64_t)d->o_groups * d->o_lora, E, true, &L->wo_b, err));
    TRY(hm_model_bind_mat(m, NAME("hc_attn_fn.weight"), hcE, mix, true, &L->hc_attn_fn, err));
    TRY(hm_model_bind_vec(m, NAME("hc_attn_base.weight"), mix, true, &L->hc_attn_base, err));
    TRY(hm_model_bind_vec(m, NAME("hc_attn_scale.weight"), 3, true, &L->hc_attn_scale, err));
    TRY(hm_model_bind_mat(m, NAME("hc_ffn_fn.weight"), hcE, mix, true, &L->hc_ffn_fn, err));
    TRY(hm_model_bind_vec(m, NAME("hc_ffn_base.weight"), mix, true, &L->hc_ffn_base, err));
    TRY(hm_model_bind_vec(m, NAME("hc_ffn_scale.weight"), 3, true, &L->hc_ffn_scale, err));
    if (r) {
        TRY(hm_model_bind_mat(m, NAME("attn_compressor_kv.weight"), E, coff * hd, true, &L->c_kv, err));
        TRY(hm_model_bind_mat(m, NAME("attn_compressor_gate.weight"), E, coff * hd, true, &L->c_gate, err));
        TRY(bind_f32_2d(m, NAME("attn_compressor_ape.weight"), coff * hd, r, &w->c_ape, err));
        TRY(hm_model_bind_vec(m, NAME("attn_compressor_norm.weight"), hd, true, &w->c_norm, err));
        w->c_kv = &L->c_kv, w->c_gate = &L->c_gate;
    }
    if (r == 4) {
        const int64_t ih = d->idx_heads, ihd = d->idx_hd;
        TRY(hm_model_bind_mat(m, NAME("indexer.proj.weight"), E, ih, true, &L->i_proj, err));
        TRY(hm_model_bind_mat(m, NAME("indexer.attn_q_b.weight"), d->q_lora, ih * ihd, true, &L->i_qb, err));
        TRY(hm_model_bind_mat(m, NAME("indexer_compressor_kv.weight"), E, 2 * ihd, true, &L->i_kv, err));
        TRY(hm_model_bind_mat(m, NAME("indexer_compressor_gate.weight"), E, 2 * ihd, true, &L->i_gate, err));
        TRY(bind_f32_2d(m, NAME("indexer_compressor_ape.weight"), 2 * ihd, 4, &w->i_ape, err));
        TRY(hm_model_bind_vec(m, NAME("indexer_compressor_norm.weight"), ihd, true, &w->i_norm, err));
        w->i_proj = &L->i_proj, w->i_qb = &L->i_qb, w->i_kv = &L->i_kv, w->i_gate = &L->i_gate;
    }
    w->ratio = r;
    w->theta = r ? d->c_theta : g->theta;
    w->wq_b = &L->wq_b, w->wo_a = &L->wo_a;

    TRY(hm_model_bind_mat(m, NAME("ffn_gate_inp.weight"), E, X, true, &L->router, err));
    if (il < g->n_hash) {
        const hm_gguf_tensor *t = hm_gguf_find_tensor(m->gguf, NAME("ffn_gate_tid2eid.weight"));
        if (!t) return hm_errf(err, HM_ERR_FORMAT, "missing tensor '%s' (layer %d is hash-routed)", n, il);
        if (t->type != 26 /* I32 */ || t->n_dims != 2 || t->ne[0] != g->n_expert_used || t->ne[1] != g->n_vocab)
            return hm_errf(err, HM_ERR_FORMAT, "tensor '%s': expected I32 [%d, %d], found type %s [%lld, %lld]", n,
                           g->n_expert_used, g->n_vocab, hm_type_name(t->type), (long long)t->ne[0],
                           (long long)t->ne[1]);
        L->hash = t->data;
        for (int64_t i = 0; i < (int64_t)g->n_expert_used * g->n_vocab; i++)
            if (L->hash[i] < 0 || L->hash[i] >= g->n_expert)
                return hm_errf(err, HM_ERR_FORMAT, "tensor '%s': entry %lld is expert %d, outside 0..%d", n,
                               (long long)i, L->hash[i], g->n_expert - 1);
    } else {
        TRY(hm_model_bind_vec(m, NAME("exp_probs_b.bias"), X, true, &L->probs_b, err));
    }
    TRY(hm_model_bind_vec(m, NAME("ffn_norm.weight"), E, true, &L->ffn_norm, err));
    TRY(hm_model_bind_mat(m, NAME("ffn_gate_shexp.weight"), E, Fs, true, &L->gate_sh, err));
    TRY(hm_model_bind_mat(m, NAME("ffn_up_shexp.weight"), E, Fs, true, &L->up_sh, err));
    TRY(hm_model_bind_mat(m, NAME("ffn_down_shexp.weight"), Fs, E, true, &L->down_sh, err));
    TRY(hm_moe_bind(m, il, g->n_expert, E, g->n_ff_exp, HM_MOE_ACT_SILU, false, &L->experts, err));
    L->experts.act_limit = L->limit_exp;
#undef NAME
#undef TRY
    return HM_OK;
}

static hm_status ds4_load(hm_model *m, hm_err *err) {
    hm_status st;
    double *tmp = NULL;
    ds4_model *g = calloc(1, sizeof *g);
    if (!g) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    m->impl = g;
    hm_dsv4_dims *d = &g->dims;
#define HP_INT(suffix, req, dflt, dst) \
    do { if ((st = hm_model_hp_int(m, suffix, req, dflt, dst, err)) != HM_OK) goto fail; } while (0)
#define HP_FLOAT(suffix, req, dflt, dst) \
    do { if ((st = hm_model_hp_float(m, suffix, req, dflt, dst, err)) != HM_OK) goto fail; } while (0)
#define BAD(...) do { st = hm_errf(err, HM_ERR_FORMAT, __VA_ARGS__); goto fail; } while (0)
#define UNSUP(...) do { st = hm_errf(err, HM_ERR_UNSUPPORTED, __VA_ARGS__); goto fail; } while (0)
    HP_INT("context_length", true, 0, &g->n_ctx_train);
    HP_INT("embedding_length", true, 0, &g->n_embd);
    HP_INT("block_count", true, 0, &g->n_layer);
    HP_INT("attention.head_count", true, 0, &g->n_head);
    if ((st = hm_model_hp_head_dim(m, "", true, 0, &g->hd, err)) != HM_OK) goto fail;
    int32_t n_kv;
    HP_INT("attention.head_count_kv", false, 1, &n_kv);
    if (n_kv != 1) UNSUP("%s.attention.head_count_kv = %d: only the shared K=V head (1) is supported", m->arch_name, n_kv);
    HP_INT("rope.dimension_count", true, 0, &d->n_rot);
    HP_FLOAT("rope.freq_base", false, 10000.0, &g->theta);
    HP_FLOAT("attention.layer_norm_rms_epsilon", false, 1e-6, &g->eps);
    HP_INT("attention.q_lora_rank", true, 0, &d->q_lora);
    HP_INT("attention.sliding_window", true, 0, &d->window);
    HP_INT("attention.output_group_count", true, 0, &d->o_groups);
    HP_INT("attention.output_lora_rank", true, 0, &d->o_lora);
    HP_INT("attention.indexer.head_count", true, 0, &d->idx_heads);
    HP_INT("attention.indexer.key_length", true, 0, &d->idx_hd);
    HP_INT("attention.indexer.top_k", true, 0, &d->idx_topk);
    HP_FLOAT("attention.compress_rope_freq_base", true, 0, &d->c_theta);
    HP_INT("hyper_connection.count", true, 0, &g->hc);
    HP_INT("hyper_connection.sinkhorn_iterations", true, 0, &g->hc_iters);
    HP_FLOAT("hyper_connection.epsilon", true, 0, &g->hc_eps);
    HP_INT("hash_layer_count", false, 0, &g->n_hash);
    HP_INT("expert_count", true, 0, &g->n_expert);
    HP_INT("expert_used_count", true, 0, &g->n_expert_used);
    HP_INT("expert_feed_forward_length", true, 0, &g->n_ff_exp);
    HP_INT("expert_shared_count", true, 0, &g->n_shared);
    HP_FLOAT("expert_weights_scale", false, 1.0, &g->routed_scale);
    {
        int32_t v;
        HP_INT("expert_gating_func", true, 0, &v);
        if (v != 4) UNSUP("%s.expert_gating_func = %d: only sqrt-softplus scoring (4) is supported", m->arch_name, v);
        HP_INT("nextn_predict_layers", false, 0, &v);
        if (v) UNSUP("%s.nextn_predict_layers = %d: MTP layers are not supported", m->arch_name, v);
        bool norm = true;
        char key[160];
        snprintf(key, sizeof key, "%s.expert_weights_norm", m->arch_name);
        if (hm_gguf_get_bool(m->gguf, key, &norm) && !norm)
            UNSUP("%s = false: DeepSeek-V4 renormalises its top-k weights", key);
    }
    d->n_head = g->n_head;
    d->hd = g->hd;
    d->eps = g->eps;
    if (g->n_embd <= 0 || g->n_layer <= 0 || g->n_head <= 0 || g->hd <= 0 || d->n_rot <= 0 || d->n_rot % 2 ||
        d->n_rot > g->hd || d->q_lora <= 0 || d->window <= 0 || d->o_groups <= 0 || g->n_head % d->o_groups ||
        d->o_lora <= 0 || g->hc < 1 || g->hc > 16 || g->hc_iters < 1 || g->n_expert <= 0 || g->n_expert_used <= 0 ||
        g->n_expert_used > g->n_expert || g->n_ff_exp <= 0 || g->n_shared < 1 || g->n_hash > g->n_layer ||
        d->idx_heads <= 0 || d->idx_hd < d->n_rot || d->idx_topk <= 0 || d->c_theta < 1.0f)
        BAD("bad hparams: embedding_length %d, block_count %d, head_count %d, key_length %d, rope.dimension_count %d, "
            "q_lora_rank %d, sliding_window %d, output_group_count %d, output_lora_rank %d, hyper_connection.count %d, "
            "sinkhorn_iterations %d, experts %d (k %d, n_ff %d, shared %d), hash_layer_count %d, indexer %d x %d "
            "top %d, compress_rope_freq_base %g", g->n_embd, g->n_layer, g->n_head, g->hd, d->n_rot, d->q_lora,
            d->window, d->o_groups, d->o_lora, g->hc, g->hc_iters, g->n_expert, g->n_expert_used, g->n_ff_exp,
            g->n_shared, g->n_hash, d->idx_heads, d->idx_hd, d->idx_topk, (double)d->c_theta);
    { /* YaRN (the release's) on the compressed layers only; V4 cancels its magnitude factor */
        float attn_mul;
        if ((st = hm_model_rope_scaling(m, d->n_rot, d->c_theta, &g->c_ff, &attn_mul, err)) != HM_OK) goto fail;
        d->c_ff = g->c_ff;
    }
    if (d->idx_heads > (int64_t)d->o_groups * d->o_lora)
        UNSUP("indexer.head_count %d > output_group_count x output_lora_rank: not supported", d->idx_heads);

    g->layers = calloc((size_t)g->n_layer, sizeof *g->layers);
    g->ratio = calloc((size_t)g->n_layer, sizeof *g->ratio);
    g->kv_slot = calloc((size_t)g->n_layer, sizeof *g->kv_slot);
    g->moe_layers = calloc((size_t)g->n_layer, sizeof *g->moe_layers);
    tmp = calloc((size_t)g->n_layer, sizeof *tmp);
    if (!g->layers || !g->ratio || !g->kv_slot || !g->moe_layers || !tmp) {
        st = hm_errf(err, HM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((st = arr_at(m, "attention.compress_ratios", g->n_layer, false, tmp, err)) != HM_OK) goto fail;
    for (int32_t il = 0; il < g->n_layer; il++) {
        g->ratio[il] = g->layers[il].ratio = (int32_t)tmp[il];
        if (tmp[il] != 0 && tmp[il] != 4 && tmp[il] != 128)
            UNSUP("%s.attention.compress_ratios[%d] = %g: only 0, 4 and 128 are supported", m->arch_name, il, tmp[il]);
    }
    if ((st = arr_at(m, "swiglu_clamp_exp", g->n_layer, true, tmp, err)) != HM_OK) goto fail;
    for (int32_t il = 0; il < g->n_layer; il++) g->layers[il].limit_exp = g->layers[il].limit_sh = (float)tmp[il];
    {
        char key[160];
        hm_gguf_arr a;
        snprintf(key, sizeof key, "%s.swiglu_clamp_shexp", m->arch_name);
        if (hm_gguf_get_arr(m->gguf, key, &a)) {
            if ((st = arr_at(m, "swiglu_clamp_shexp", g->n_layer, true, tmp, err)) != HM_OK) goto fail;
            for (int32_t il = 0; il < g->n_layer; il++) g->layers[il].limit_sh = (float)tmp[il];
        }
    }
    free(tmp);
    tmp = NULL;

    const int64_t E = g->n_embd;
    if ((st = hm_model_bind_vocab(m, E, &g->tok_embd, &g->output, &g->n_vocab, err)) != HM_OK) goto fail;
    if ((st = hm_model_bind_vec(m, "output_norm.weight", E, true, &g->output_norm, err)) != HM_OK) goto fail;
    if ((st = hm_model_bind_mat(m, "output_hc_fn.weight", (int64_t)g->hc * E, g->hc, true, &g->hc_head_fn, err)) ||
        (st = hm_model_bind_vec(m, "output_hc_base.weight", g->hc, true, &g->hc_head_base, err)) ||
        (st = hm_model_bind_vec(m, "output_hc_scale.weight", 1, true, &g->hc_head_scale, err)))
        goto fail;
    for (int32_t il = 0; il < g->n_layer; il++)
        if ((st = bind_layer(m, g, il, err)) != HM_OK) goto fail;

    ds4_exec_model(g);
    m->xm = &g->xm;
    hm_model_info *inf = &m->info;
    inf->n_vocab = g->n_vocab;
    inf->n_ctx_train = g->n_ctx_train;
    inf->n_embd = g->n_embd;
    inf->n_layer = g->n_layer;
    inf->n_head = g->n_head;
    inf->n_head_kv = 1;
    inf->head_dim = g->hd;
    inf->n_expert = g->n_expert;
    inf->n_expert_used = g->n_expert_used;
    inf->n_ff_exp = g->n_ff_exp;
    hm_log_printf(&m->log, HM_LOG_INFO,
                  "deepseek4: %d layers, n_embd %d x %d streams, heads %d x %d (K=V, window %d), experts %d (k %d, "
                  "n_ff %d, %d shared, %d hash layers), vocab %d",
                  g->n_layer, g->n_embd, g->hc, g->n_head, g->hd, d->window, g->n_expert, g->n_expert_used,
                  g->n_ff_exp, g->n_shared, g->n_hash, g->n_vocab);
    return HM_OK;
fail:
    free(tmp);
    ds4_unload(m);
    return st;
#undef HP_INT
#undef HP_FLOAT
#undef BAD
#undef UNSUP
}

/* The executor's paths (CPU, CUDA per-launch and graph); no forward_multi (the attention state is
 * per sequence, one a pass). */
const hm_arch hm_arch_deepseek4 = {
    .name = "deepseek4",
    .load = ds4_load,
    .unload = ds4_unload,
    HM_EXEC_ARCH(ds4_layer_fwd),
};
