/* deepseek2.c - the DeepSeek-V2/V3 architecture as llama.cpp converts it (`deepseek2`: DeepSeek-V2-Lite,
 * V2, V2.5, V3, R1).
 *
 * Per layer, for a micro-batch of n tokens (x is the residual stream, [n, n_embd]):
 *   h = rmsnorm(x) * attn_norm
 *   q = h Wq, or with a q LoRA (q_lora_rank > 0): rmsnorm(h Wq_a) * q_a_norm, then Wq_b
 *       q: [n, n_head * (nope + n_rot)], per head [q_nope | q_pe]
 *   [c | k_pe] = h Wkv_a_mqa                    [n, kv_lora + n_rot]: the compressed KV and a rope
 *       part shared by every head; c = rmsnorm(c) * kv_a_norm; q_pe and k_pe RoPE'd with
 *       interleaved pairs (2i, 2i+1), ggml's NORM rope (transformers' DeepSeek reorders the pairs
 *       before its rotate-half: the same rotation)
 *   multi-head latent attention in the absorbed form (llama.cpp's with attn_k_b / attn_v_b): the
 *       KV cache holds [c | k_pe] per token (one head of kv_lora + n_rot); per head h,
 *       q_abs = K_b[h] q_nope (K_b[h]: [kv_lora x nope]), scores (q_abs . c + q_pe . k_pe) * scale,
 *       o = sum softmax * c (kv_lora), out_h = V_b[h] o (V_b[h]: [v_dim x kv_lora])
 *   scale = mscale^2 / sqrt(nope + n_rot); with YaRN mscale = 1 + 0.1 yarn_log_multiplier ln(factor)
 *       (the file stores 0.1 x mscale_all_dim; llama.cpp cancels that 0.1) and the rotation keeps
 *       magnitude 1 (llama.cpp divides YaRN's own factor back out for this arch), else 1
 *   x += concat(out_h) Wo
 *   h = rmsnorm(x) * ffn_norm
 *   leading dense layers (il < leading_dense_block_count): x += Wdown(silu(Wgate h) * Wup h)
 *   the others: the routed experts (softmax or sigmoid scores, + exp_probs_b for the choice,
 *       group-limited top-k, optional renormalisation, times expert_weights_scale) plus the
 *       shared experts (one SwiGLU of n_ff_exp * expert_shared_count)
 * then logits = (rmsnorm(x) * output_norm) Wout.
 *
 * Older conversions keep kv_b whole (attn_kv_b [kv_lora, n_head (nope + v)], no key_length_mla:
 * llama.cpp runs them as plain multi-head attention): the same absorbed form runs on them, V_b a
 * strided view into kv_b and K_b its nope rows transposed into an F32 copy made at load (CPU only;
 * the GPU upload takes the split tensors the current converter writes). The layer is written
 * once over exec.h's ops (ds2_layer_fwd); the executor runs it on every backend. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/exec.h"
#include "exec/moe.h"
#include "model.h"

typedef struct ds2_layer {
    const float *attn_norm, *q_a_norm, *kv_a_norm, *ffn_norm; /* [E], [q_lora], [kv_lora], [E] */
    hm_mat wq, wq_a, wq_b; /* [n_head*qk x E] or [q_lora x E] and [n_head*qk x q_lora] */
    hm_mat wkv_a;          /* [(kv_lora + n_rot) x E] */
    hm_mat_heads k_b, v_b; /* n_head x [kv_lora x nope], n_head x [v_dim x kv_lora] */
    hm_mat wo;             /* [E x n_head*v_dim] */
    bool dense;
    hm_mat gate, up, down; /* a dense layer's FFN, or the shared experts */
    hm_mat router;         /* [n_expert x E] */
    const float *probs_b;  /* [n_expert] or NULL */
    hm_moe_weights moe;
} ds2_layer;

typedef struct ds2_model {
    int32_t n_layer, n_embd, n_head, n_vocab, n_ctx_train;
    int32_t q_lora, kv_lora, nope, n_rot, v_dim, n_dense, n_ff, n_ff_exp, n_shared;
    int32_t n_expert, n_expert_used, n_group, topk_group;
    float eps, theta, kq_scale;
    hm_moe_spec spec;
    hm_mat tok_embd, output;
    const float *output_norm;
    ds2_layer *layers;        /* [n_layer], owned */
    hm_moe_layer *moe_layers; /* [n_layer], owned */
    float *rope_ff;           /* [n_rot / 2] YaRN's per-pair divisors, owned; NULL = none */
    float *kb_legacy;         /* [n_layer][n_head][kv_lora][nope] K_b of a file with attn_kv_b, owned; NULL = none */
    bool legacy;              /* attn_kv_b instead of attn_k_b / attn_v_b */
    hm_exec_model xm;
} ds2_model;

/* ---- the layer ---- */

enum { DS_Q = HM_BUF_ARCH, DS_QL, DS_KV, DS_QA, DS_LAT, DS_ATT, DS_TIN, DS_TOUT, DS_G, DS_U, DS_D, DS_NBUF };

static hm_status ds2_layer_fwd(hm_exec *x, const hm_model *m, int32_t il) {
    const ds2_model *d = m->impl;
    const ds2_layer *L = &d->layers[il];
    const int64_t E = d->n_embd, qk = (int64_t)d->nope + d->n_rot, aw = (int64_t)d->kv_lora + d->n_rot;
    hm_status st;
#define OP(call) do { if ((st = (call)) != HM_OK) return st; } while (0)
    OP(hm_op_rmsnorm(x, HM_BUF_X, L->attn_norm, HM_BUF_H));
    if (d->q_lora > 0) {
        OP(hm_op_matmul_n(x, HM_BUF_H, (const hm_mat *const[2]){&L->wq_a, &L->wkv_a}, (const hm_buf[2]){DS_QL, DS_KV}, 2));
        OP(hm_op_rmsnorm_w(x, DS_QL, L->q_a_norm, DS_QL, d->q_lora));
        OP(hm_op_matmul(x, DS_QL, &L->wq_b, DS_Q));
    } else {
        OP(hm_op_matmul_n(x, HM_BUF_H, (const hm_mat *const[2]){&L->wq, &L->wkv_a}, (const hm_buf[2]){DS_Q, DS_KV}, 2));
    }
    const hm_mla_in in = {.q = DS_Q, .qa = DS_QA, .kv = DS_KV, .kv_norm = L->kv_a_norm, .rope_ff = d->rope_ff,
                          .nope = d->nope, .kv_lora = d->kv_lora, .n_rot = d->n_rot, .theta = d->theta, .eps = d->eps};
    OP(hm_op_mla_in(x, il, &in));
    OP(hm_op_out_rows_w(x, il, (const hm_buf[3]){DS_Q, DS_QA, HM_BUF_X},
                        (const int64_t[3]){d->n_head * qk, d->n_head * aw, E}, 3));
    if (hm_exec_done(x)) return HM_OK;
    /* q_nope absorbed into the latent space, attention over the compressed cache, back through V_b */
    OP(hm_op_matmul_heads(x, &L->k_b, &(hm_heads_io){.in = DS_Q, .out = DS_QA, .tin = DS_TIN, .tout = DS_TOUT,
                                                     .in_stride = qk, .out_stride = aw}));
    OP(hm_op_attention(x, il, DS_QA, DS_LAT, d->kq_scale));
    OP(hm_op_matmul_heads(x, &L->v_b, &(hm_heads_io){.in = DS_LAT, .out = DS_ATT, .tin = DS_TIN, .tout = DS_TOUT,
                                                     .in_stride = aw, .out_stride = d->v_dim}));
    OP(hm_op_matmul(x, DS_ATT, &L->wo, HM_BUF_H));
    OP(hm_op_add_rmsnorm(x, HM_BUF_X, HM_BUF_H, L->ffn_norm, HM_BUF_H));
    const int64_t nff = L->dense ? d->n_ff : (int64_t)d->n_ff_exp * d->n_shared;
    if (nff > 0) { /* the dense FFN, or the shared experts (before the routed ones, as qwen35moe.c) */
        OP(hm_op_matmul_n(x, HM_BUF_H, (const hm_mat *const[2]){&L->gate, &L->up}, (const hm_buf[2]){DS_G, DS_U}, 2));
        OP(hm_op_swiglu(x, DS_G, DS_U, DS_G, nff));
        OP(hm_op_matmul(x, DS_G, &L->down, DS_D));
        OP(hm_op_add(x, HM_BUF_X, DS_D));
    }
    if (!L->dense) OP(hm_op_moe(x, il, HM_BUF_H, HM_BUF_X));
#undef OP
    return HM_OK;
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static void ds2_exec_model(ds2_model *d) {
    hm_exec_model *xm = &d->xm;
    const int64_t E = d->n_embd, qk = (int64_t)d->nope + d->n_rot, aw = (int64_t)d->kv_lora + d->n_rot;
    *xm = (hm_exec_model){.n_layer = d->n_layer, .n_embd = d->n_embd, .n_vocab = d->n_vocab, .eps = d->eps,
                          .tok_embd = &d->tok_embd, .output = &d->output, .output_norm = d->output_norm,
                          .n_buf = DS_NBUF, .n_head = d->n_head, .n_head_kv = 1, .head_dim = (int32_t)aw,
                          .n_kv_layer = d->n_layer, .kv_v_is_k = true, .moe_layers = d->moe_layers, .moe = d->spec};
    const int64_t ff = max64(d->n_ff, (int64_t)d->n_ff_exp * d->n_shared);
    const int64_t w[DS_NBUF] = {[HM_BUF_X] = E, [HM_BUF_H] = E, [DS_Q] = d->n_head * qk, [DS_QL] = max64(d->q_lora, 1),
                                [DS_KV] = aw, [DS_QA] = d->n_head * aw, [DS_LAT] = d->n_head * aw,
                                [DS_ATT] = (int64_t)d->n_head * d->v_dim, [DS_TIN] = max64(d->nope, d->kv_lora),
                                [DS_TOUT] = max64(d->kv_lora, d->v_dim), [DS_G] = max64(ff, 1), [DS_U] = max64(ff, 1),
                                [DS_D] = E};
    memcpy(xm->buf_width, w, sizeof w);
    for (int32_t il = 0; il < d->n_layer; il++) {
        const ds2_layer *L = &d->layers[il];
        if (!L->dense)
            d->moe_layers[il] = (hm_moe_layer){.router = &L->router, .experts = &L->moe, .score_bias = L->probs_b};
    }
}

/* ---- load ---- */

static void ds2_unload(hm_model *m) {
    ds2_model *d = m->impl;
    if (!d) return;
    free(d->layers);
    free(d->moe_layers);
    free(d->rope_ff);
    free(d->kb_legacy);
    free(d);
    m->impl = NULL;
}

static hm_status bind_heads(const hm_model *m, const char *name, int64_t ne0, int64_t ne1, int32_t n_head,
                            hm_mat_heads *out, hm_err *err) {
    out->n_head = n_head;
    return hm_model_bind_exps(m, name, ne0, ne1, n_head, true, &out->w, &out->nb2, err);
}

/* A whole kv_b [kv_lora, n_head (nope + v_dim)] (head h: nope K rows, then v_dim V rows): V_b a view
 * (head stride (nope + v_dim) rows), K_b the nope rows transposed into d->kb_legacy. */
static hm_status bind_kv_b(const hm_model *m, ds2_model *d, int32_t il, const char *name, hm_err *err) {
    ds2_layer *L = &d->layers[il];
    const int64_t H = d->n_head, nope = d->nope, lora = d->kv_lora, per = nope + d->v_dim;
    hm_mat kv;
    hm_status st = hm_model_bind_mat(m, name, lora, H * per, true, &kv, err);
    if (st != HM_OK) return st;
    const hm_type_traits *tr = hm_type_get(kv.type);
    if (!tr || !tr->to_float) return hm_errf(err, HM_ERR_UNSUPPORTED, "tensor '%s': type %s", name, hm_type_name(kv.type));
    L->v_b = (hm_mat_heads){.w = {.data = (const char *)kv.data + (size_t)nope * kv.nb1, .type = kv.type, .ne0 = lora,
                                  .ne1 = d->v_dim, .nb1 = kv.nb1},
                            .nb2 = (size_t)per * kv.nb1, .n_head = d->n_head};
    float *kb = d->kb_legacy + (size_t)il * (size_t)(H * lora * nope), row[4096];
    if (lora > 4096) return hm_errf(err, HM_ERR_UNSUPPORTED, "tensor '%s': kv_lora_rank %lld", name, (long long)lora);
    for (int64_t h = 0; h < H; h++)
        for (int64_t j = 0; j < nope; j++) {
            tr->to_float((const char *)kv.data + (size_t)(h * per + j) * kv.nb1, row, lora);
            for (int64_t l = 0; l < lora; l++) kb[(h * lora + l) * nope + j] = row[l];
        }
    L->k_b = (hm_mat_heads){.w = {.data = kb, .type = HM_TYPE_F32, .ne0 = nope, .ne1 = lora, .nb1 = (size_t)nope * 4},
                            .nb2 = (size_t)(lora * nope) * 4, .n_head = d->n_head};
    return HM_OK;
}

static hm_status bind_layer(const hm_model *m, ds2_model *d, int32_t il, hm_err *err) {
    ds2_layer *L = &d->layers[il];
    const int64_t E = d->n_embd, qk = (int64_t)d->nope + d->n_rot, H = d->n_head;
    hm_status st;
    char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s, il), n)
#define TRY(x) do { if ((st = (x)) != HM_OK) return st; } while (0)
    TRY(hm_model_bind_vec(m, NAME("attn_norm.weight"), E, true, &L->attn_norm, err));
    if (d->q_lora > 0) {
        TRY(hm_model_bind_mat(m, NAME("attn_q_a.weight"), E, d->q_lora, true, &L->wq_a, err));
        TRY(hm_model_bind_vec(m, NAME("attn_q_a_norm.weight"), d->q_lora, true, &L->q_a_norm, err));
        TRY(hm_model_bind_mat(m, NAME("attn_q_b.weight"), d->q_lora, H * qk, true, &L->wq_b, err));
    } else {
        TRY(hm_model_bind_mat(m, NAME("attn_q.weight"), E, H * qk, true, &L->wq, err));
    }
    TRY(hm_model_bind_mat(m, NAME("attn_kv_a_mqa.weight"), E, (int64_t)d->kv_lora + d->n_rot, true, &L->wkv_a, err));
    TRY(hm_model_bind_vec(m, NAME("attn_kv_a_norm.weight"), d->kv_lora, true, &L->kv_a_norm, err));
    if (d->legacy) {
        TRY(bind_kv_b(m, d, il, NAME("attn_kv_b.weight"), err));
    } else {
        TRY(bind_heads(m, NAME("attn_k_b.weight"), d->nope, d->kv_lora, d->n_head, &L->k_b, err));
        TRY(bind_heads(m, NAME("attn_v_b.weight"), d->kv_lora, d->v_dim, d->n_head, &L->v_b, err));
    }
    TRY(hm_model_bind_mat(m, NAME("attn_output.weight"), H * d->v_dim, E, true, &L->wo, err));
    TRY(hm_model_bind_vec(m, NAME("ffn_norm.weight"), E, true, &L->ffn_norm, err));
    L->dense = il < d->n_dense;
    if (L->dense) {
        TRY(hm_model_bind_mat(m, NAME("ffn_gate.weight"), E, d->n_ff, true, &L->gate, err));
        TRY(hm_model_bind_mat(m, NAME("ffn_up.weight"), E, d->n_ff, true, &L->up, err));
        TRY(hm_model_bind_mat(m, NAME("ffn_down.weight"), d->n_ff, E, true, &L->down, err));
        return HM_OK;
    }
    TRY(hm_model_bind_mat(m, NAME("ffn_gate_inp.weight"), E, d->n_expert, true, &L->router, err));
    TRY(hm_model_bind_vec(m, NAME("exp_probs_b.bias"), d->n_expert, false, &L->probs_b, err));
    TRY(hm_moe_bind(m, il, d->n_expert, E, d->n_ff_exp, HM_MOE_ACT_SILU, true, &L->moe, err));
    if (d->n_shared > 0) {
        const int64_t sh = (int64_t)d->n_ff_exp * d->n_shared;
        TRY(hm_model_bind_mat(m, NAME("ffn_gate_shexp.weight"), E, sh, true, &L->gate, err));
        TRY(hm_model_bind_mat(m, NAME("ffn_up_shexp.weight"), E, sh, true, &L->up, err));
        TRY(hm_model_bind_mat(m, NAME("ffn_down_shexp.weight"), sh, E, true, &L->down, err));
    }
#undef NAME
#undef TRY
    return HM_OK;
}

/* YaRN's per-pair divisors and the attention scale (see the top of the file). */
static hm_status ds2_rope(hm_model *m, ds2_model *d, hm_err *err) {
    char key[160];
    hm_gguf_str s = {0};
    snprintf(key, sizeof key, "%s.rope.scaling.type", m->arch_name);
    if (m->rope_scaling[0]) s = (hm_gguf_str){.ptr = m->rope_scaling, .len = strlen(m->rope_scaling)};
    else if (!hm_gguf_get_str(m->gguf, key, &s)) s.len = 0;
    const bool yarn = s.len == 4 && memcmp(s.ptr, "yarn", 4) == 0;
    if (s.len && !yarn && !(s.len == 4 && memcmp(s.ptr, "none", 4) == 0))
        return hm_errf(err, HM_ERR_UNSUPPORTED, "%s = %.*s: deepseek2 runs yarn RoPE scaling (or none)", key, (int)s.len,
                       s.ptr);
    float unused, mscale = 1.0f;
    hm_status st = hm_model_rope_scaling(m, d->n_rot, d->theta, &d->rope_ff, &unused, err);
    if (st != HM_OK) return st;
    if (yarn && d->rope_ff) {
        float factor, log_mul;
        if (m->rope_scale > 0) factor = m->rope_scale;
        else if ((st = hm_model_hp_float(m, "rope.scaling.factor", true, 1.0, &factor, err)) != HM_OK) return st;
        if ((st = hm_model_hp_float(m, "rope.scaling.yarn_log_multiplier", false, 0.0, &log_mul, err)) != HM_OK)
            return st;
        mscale = 1.0f + 0.1f * (log_mul / 0.1f) * logf(factor);
    }
    d->kq_scale = mscale * mscale / sqrtf((float)(d->nope + d->n_rot));
    return HM_OK;
}

static hm_status ds2_load(hm_model *m, hm_err *err) {
    hm_status st;
    ds2_model *d = calloc(1, sizeof *d);
    if (!d) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    m->impl = d;
#define HP_INT(suffix, req, dflt, dst) \
    do { if ((st = hm_model_hp_int(m, suffix, req, dflt, dst, err)) != HM_OK) goto fail; } while (0)
#define HP_FLOAT(suffix, req, dflt, dst) \
    do { if ((st = hm_model_hp_float(m, suffix, req, dflt, dst, err)) != HM_OK) goto fail; } while (0)
#define BAD(...) do { st = hm_errf(err, HM_ERR_FORMAT, __VA_ARGS__); goto fail; } while (0)
    int32_t n_kv, key_len, val_len, key_mla, val_mla, gating;
    HP_INT("context_length", false, 0, &d->n_ctx_train);
    HP_INT("embedding_length", true, 0, &d->n_embd);
    HP_INT("block_count", true, 0, &d->n_layer);
    HP_INT("attention.head_count", true, 0, &d->n_head);
    int32_t nextn;
    HP_INT("nextn_predict_layers", false, 0, &nextn);
    if (nextn > 0 && nextn < d->n_layer) { /* the MTP blocks after the trunk: not run (as llama.cpp without MTP) */
        hm_log_printf(&m->log, HM_LOG_INFO, "deepseek2: the last %d of %d blocks are multi-token prediction: skipped",
                      nextn, d->n_layer);
        d->n_layer -= nextn;
    }
    HP_INT("attention.head_count_kv", false, 1, &n_kv);
    HP_INT("attention.q_lora_rank", false, 0, &d->q_lora);
    HP_INT("attention.kv_lora_rank", true, 0, &d->kv_lora);
    HP_INT("attention.key_length", true, 0, &key_len);
    HP_INT("attention.value_length", true, 0, &val_len);
    HP_INT("attention.key_length_mla", false, 0, &key_mla);
    HP_INT("attention.value_length_mla", false, 0, &val_mla);
    HP_INT("rope.dimension_count", true, 0, &d->n_rot);
    HP_INT("leading_dense_block_count", false, 0, &d->n_dense);
    HP_INT("feed_forward_length", d->n_dense > 0, 0, &d->n_ff);
    HP_INT("expert_count", true, 0, &d->n_expert);
    HP_INT("expert_used_count", true, 0, &d->n_expert_used);
    HP_INT("expert_feed_forward_length", true, 0, &d->n_ff_exp);
    HP_INT("expert_shared_count", false, 0, &d->n_shared);
    HP_INT("expert_group_count", false, 0, &d->n_group);
    HP_INT("expert_group_used_count", false, 0, &d->topk_group);
    HP_INT("expert_gating_func", false, 0, &gating);
    HP_FLOAT("rope.freq_base", false, 10000.0, &d->theta);
    HP_FLOAT("attention.layer_norm_rms_epsilon", true, 1e-6, &d->eps);
    float wscale;
    HP_FLOAT("expert_weights_scale", false, 0.0, &wscale);
    bool wnorm = false;
    {
        char key[160];
        snprintf(key, sizeof key, "%s.expert_weights_norm", m->arch_name);
        (void)hm_gguf_get_bool(m->gguf, key, &wnorm);
    }
    if (d->n_embd <= 0 || d->n_layer <= 0 || d->n_head <= 0 || d->kv_lora <= 0 || d->n_rot <= 0 || d->n_rot % 2)
        BAD("bad hparams: embedding_length %d, block_count %d, head_count %d, kv_lora_rank %d, rope.dimension_count %d",
            d->n_embd, d->n_layer, d->n_head, d->kv_lora, d->n_rot);
    d->legacy = key_mla == 0 && val_mla == 0 && hm_gguf_find_tensor(m->gguf, "blk.0.attn_kv_b.weight");
    if (d->legacy) { /* an older conversion: the decompressed head sizes in key_length / value_length */
        if (key_len <= d->n_rot || val_len <= 0)
            BAD("bad hparams: attn_kv_b with key_length %d, value_length %d, rope.dimension_count %d", key_len, val_len,
                d->n_rot);
        key_mla = key_len, val_mla = val_len;
    } else if (n_kv != 1 || key_len != d->kv_lora + d->n_rot || val_len != d->kv_lora || key_mla <= d->n_rot ||
               val_mla <= 0)
        BAD("bad hparams: MLA with head_count_kv %d, key_length %d, value_length %d, kv_lora_rank %d, key_length_mla "
            "%d, value_length_mla %d, rope.dimension_count %d (expected head_count_kv 1, key_length kv_lora_rank + "
            "rope dims, value_length kv_lora_rank)", n_kv, key_len, val_len, d->kv_lora, key_mla, val_mla, d->n_rot);
    d->nope = key_mla - d->n_rot;
    d->v_dim = val_mla;
    if (d->n_dense > d->n_layer) d->n_dense = d->n_layer; /* a cut-down file: every layer dense (llama.cpp alike) */
    if ((d->n_dense > 0 && d->n_ff <= 0) || d->n_ff_exp <= 0)
        BAD("bad hparams: leading_dense_block_count %d, feed_forward_length %d, expert_feed_forward_length %d",
            d->n_dense, d->n_ff, d->n_ff_exp);
    if (gating < 0 || gating > 4) BAD("%s.expert_gating_func = %d is unknown", m->arch_name, gating);
    /* llama.cpp's values: absent (0) is softmax, as DeepSeek-V2 / V2.5 files were written; 3 a softmax
     * over the chosen logits; 4 sqrt(softplus) */
    static const hm_route_score scores[5] = {HM_ROUTE_SOFTMAX, HM_ROUTE_SOFTMAX, HM_ROUTE_SIGMOID, HM_ROUTE_SOFTMAX_TOPK,
                                             HM_ROUTE_SQRT_SOFTPLUS};
    d->spec = (hm_moe_spec){.n_expert = d->n_expert, .k = d->n_expert_used, .n_ff = d->n_ff_exp,
                            .score = scores[gating], .norm_topk = wnorm,
                            .routed_scale = wscale, .n_group = d->n_group, .topk_group = d->topk_group};
    if ((st = ds2_rope(m, d, err)) != HM_OK) goto fail;

    const int64_t E = d->n_embd;
    if ((st = hm_model_bind_vocab(m, E, &d->tok_embd, &d->output, &d->n_vocab, err)) != HM_OK) goto fail;
    if ((st = hm_model_bind_vec(m, "output_norm.weight", E, true, &d->output_norm, err)) != HM_OK) goto fail;
    d->layers = calloc((size_t)d->n_layer, sizeof *d->layers);
    d->moe_layers = calloc((size_t)d->n_layer, sizeof *d->moe_layers);
    if (d->legacy)
        d->kb_legacy = malloc((size_t)d->n_layer * (size_t)d->n_head * (size_t)d->kv_lora * (size_t)d->nope * 4);
    if (!d->layers || !d->moe_layers || (d->legacy && !d->kb_legacy)) {
        st = hm_errf(err, HM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int32_t il = 0; il < d->n_layer; il++)
        if ((st = bind_layer(m, d, il, err)) != HM_OK) goto fail;

    ds2_exec_model(d);
    m->xm = &d->xm;
    hm_model_info *inf = &m->info;
    inf->n_vocab = d->n_vocab;
    inf->n_ctx_train = d->n_ctx_train;
    inf->n_embd = d->n_embd;
    inf->n_layer = d->n_layer;
    inf->n_head = d->n_head;
    inf->n_head_kv = 1;
    inf->head_dim = d->kv_lora + d->n_rot;
    inf->n_expert = d->n_expert;
    inf->n_expert_used = d->n_expert_used;
    inf->n_ff_exp = d->n_ff_exp;
    hm_log_printf(&m->log, HM_LOG_INFO,
                  "deepseek2: %d layers (%d dense), n_embd %d, %d heads, MLA%s q_lora %d kv_lora %d nope %d rope %d v %d, "
                  "experts %d (k %d, n_ff %d, %d shared, %s, groups %d/%d, norm %d, scale %g), vocab %d",
                  d->n_layer, d->n_dense, d->n_embd, d->n_head, d->legacy ? " (from attn_kv_b)" : "", d->q_lora, d->kv_lora, d->nope, d->n_rot, d->v_dim,
                  d->n_expert, d->n_expert_used, d->n_ff_exp, d->n_shared,
                  (const char *[5]){"softmax", "softmax", "sigmoid", "softmax of the chosen", "sqrt-softplus"}[gating],
                  d->n_group, d->topk_group, (int)wnorm, (double)wscale, d->n_vocab);
    return HM_OK;
fail:
    ds2_unload(m);
    return st;
#undef HP_INT
#undef HP_FLOAT
#undef BAD
}

const hm_arch hm_arch_deepseek2 = {
    .name = "deepseek2",
    .load = ds2_load,
    .unload = ds2_unload,
    .forward_multi = hm_exec_forward_multi, /* several sessions' rows in one pass */
    HM_EXEC_ARCH(ds2_layer_fwd),
};
