/* qwen35moe.c - the Qwen3.5-MoE architecture (Qwen3.5/3.6-35B-A3B, ...) and its parent Qwen3-Next
 * (qwen3next, Qwen3-Next-80B-A3B): hparams, tensor binding and their one layer description.
 *
 * A hybrid stack: layer il is gated full attention when (il + 1) % full_attention_interval == 0
 * (default 4), else Gated DeltaNet (linear attention with a recurrent state). Every layer ends in
 * a MoE block: routed experts (softmax, top-k, renormalised) plus a dense shared expert scaled by
 * sigmoid(x . ffn_gate_inp_shexp). Per layer, x the residual stream:
 *   h = rmsnorm(x) * attn_norm                      (Qwen3.5 norms are x * (1 + w); the GGUF holds 1 + w)
 *   DeltaNet:  qkv = conv1d_causal(h Wqkv) then silu; q, k L2-normalised per head, q / sqrt(d_k);
 *              g = ssm_a * softplus(h Walpha + dt_bias), beta = sigmoid(h Wbeta);
 *              o = gated delta rule(q, k, v, g, beta) per value head (key head j % n_k);
 *              o = rmsnorm_head(o) * ssm_norm * silu(h Wz);  x += o Wout
 *   attention: [q | gate] = h Wq per head; q, k per-head rmsnorm; partial rotary on the first
 *              n_rot dims (IMROPE, which with text positions is NEOX rotary); causal GQA;
 *              x += (a * sigmoid(gate)) Wo
 *   h = rmsnorm(x) * post_attention_norm;  x += moe(h) + sigmoid(h . w_sh) * shared(h)
 * logits = (rmsnorm(x) * output_norm) Wout.
 *
 * File conventions are llama.cpp's (tools/qwen35moe.py writes them): V heads tiled, ssm_a =
 * -exp(A_log), norms + 1, conv1d [K, conv_dim] (ne order), rope.dimension_sections present.
 *
 * qwen3next is the same layer over another file layout, so this file describes both (one layer,
 * one binding; the difference is data, q35_variant): its keys are qwen3next.*, its rotary NEOX, and
 * its GGUF keeps HF's value-head order (a key head's value heads adjacent: value head j reads key
 * head j / (n_v / n_k)) with beta and alpha in one matrix, ssm_ba [n_embd, 2 n_v] (per key head its
 * n_v / n_k beta rows, then its alpha rows): hm_deltanet.grouped. The legacy ssm_in (q, k, v, z
 * fused per key head) of early conversions is refused.
 *
 * The multi-token-prediction head of both (llama.cpp runs the same graph_mtp for each, qwen3next's
 * with its NEOX rotary) (nextn_predict_layers = 1, llama.cpp's layout: the last
 * block blk.N of block_count = N + 1, a gated-attention block with the MoE, plus nextn.eh_proj
 * [2 n_embd -> n_embd], nextn.enorm, nextn.hnorm and the optional nextn.embed_tokens,
 * shared_head_head, shared_head_norm) is never run by the main forward (its n_layer is N, so the
 * logits are those of the same file without it). It is bound into a second, one-layer hm_model
 * (q->mtp_model, m->mtp) whose layer q35_mtp_fwd is llama.cpp's graph_mtp:
 *   x = eh_proj [rmsnorm(embed(t)) * enorm | rmsnorm(h) * hnorm]   (h: the target's hidden row
 *   after its output norm, injected by the batch); then the gated-attention block and MoE above;
 *   logits = (rmsnorm(x) * shared_head_norm) shared_head_head (absent: output_norm, output).
 * Its session keeps its own KV cache (engine/spec_mtp.c drives it, on the CPU).
 *
 * Session state (the executor's, exec/exec.h): a KV cache for the attention layers only and, per
 * DeltaNet layer, the conv window (last K-1 inputs) and the delta state S [n_v][d_k][d_v] (f32). A
 * recurrent state cannot be rewound: state_trim keeps everything (n_keep >= positions seen) or
 * resets to empty (n_keep == 0); anything between is HM_ERR_UNSUPPORTED and the caller must
 * re-prefill, or go back to the last state_save (a speculative verify's rollback). The layer is written once (q35_layer_fwd); the executor runs it on the CPU and on the
 * GPU (per launch, as the decode graph, and as the upload pass). In the last layer only the rows
 * whose logits are wanted go on past the token mixer (attention: past the K/V write; DeltaNet: past
 * the state update). */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_deltanet.h"
#include "exec/exec.h"
#include "model.h"
#include "exec/moe.h"
#include "quant/quant.h"

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
    hm_mat wbeta, walpha;   /* [n_v x n_embd]; grouped: wbeta ssm_ba [2 n_v x n_embd], walpha unused */
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

/* What tells the two archs apart. */
typedef struct q35_variant {
    const char *name;
    bool grouped;            /* Qwen3-Next's layout: grouped value heads, fused ssm_ba */
} q35_variant;
static const q35_variant q35_variants[] = {{"qwen35moe", false}, {"qwen3next", true}};

typedef struct q35_model {
    HM_MOE_HP;               /* n_layer, n_embd, heads, experts, eps, theta, ... (model.h) */
    bool grouped;            /* q35_variant's */
    int32_t n_ff_sh;         /* the shared expert's */
    int32_t d_conv, n_k, n_v, d_k, d_v, conv_dim; /* DeltaNet shape */
    int32_t n_attn, n_recr;  /* layers of each kind */
    hm_mat tok_embd, output; /* [n_vocab x n_embd] */
    const float *output_norm;
    q35_layer *layers;       /* owned */
    hm_moe_layer *moe_layers;/* [n_layer], owned: each layer's router and experts, for xm */
    int32_t *kv_slot, *rs_slot; /* [n_layer], owned: L->slot in the layer's kind, -1 in the other */
    hm_exec_model xm;        /* what the executor runs (m->xm points here) */
    /* the MTP head (nextn_predict_layers 1; the header): its block, eh_proj [2 E -> E], norms */
    int32_t n_nextn;
    q35_layer mtp_layer;
    hm_mat mtp_eh, mtp_embd, mtp_head; /* embd / head: nextn's own or tok_embd / output */
    const float *mtp_enorm, *mtp_hnorm, *mtp_head_norm;
    hm_moe_layer mtp_moe;
    int32_t mtp_kv_slot;     /* 0 */
    hm_exec_model mtp_xm;
    hm_model mtp_model;      /* a one-layer view of the same file (m->mtp points here) */
} q35_model;


#define HP_INT(suffix, req, dflt, dst) \
    do { if ((st = hm_model_hp_int(m, suffix, req, dflt, dst, err)) != HM_OK) goto fail; } while (0)
#define TRY(x) do { if ((st = (x)) != HM_OK) goto fail; } while (0)

/* ffn_gate_inp_shexp: llama.cpp's converter writes it [n_embd, 1]; a 1-D [n_embd] F32 is accepted too. */
static hm_status bind_shexp_gate(const hm_model *m, const char *name, int64_t E, hm_mat *out, hm_err *err) {
    const hm_gguf_tensor *t = hm_gguf_find_tensor(m->gguf, name);
    if (t && t->n_dims == 1) {
        const float *w;
        hm_status st = hm_model_bind_vec(m, name, E, true, &w, err);
        if (st == HM_OK) *out = hm_mat_make(w, HM_TYPE_F32, E, 1, (size_t)E * sizeof(float));
        return st;
    }
    return hm_model_bind_mat(m, name, E, 1, true, out, err);
}

/* ---- the layer ---- */

/* The activations beside x and h. */
enum {
    Q35_MIX = HM_BUF_ARCH, /* [q | gate] per head, or the DeltaNet qkv */
    Q35_Q, Q35_GATE, Q35_K, Q35_V,
    Q35_ATT,               /* the attention's or the DeltaNet's output */
    Q35_CONV, Q35_Z, Q35_BA, Q35_AA, Q35_G, Q35_BETA, /* DeltaNet */
    Q35_SHG, Q35_SHU, Q35_SHO, Q35_SHS,               /* the shared expert */
    Q35_NBUF,
    Q35_HIN = Q35_NBUF, Q35_CAT,                      /* the MTP head's: the injected hidden row,
                                                         [e_norm | h_norm] */
    Q35_MTP_NBUF
};

/* Layer il (its weights L): the block of the header. */
static hm_status q35_block(hm_exec *x, const q35_model *q, const q35_layer *L, int32_t il) {
    const int64_t nq = (int64_t)q->n_head * q->head_dim;
    hm_status st;
#define OP(call) do { if ((st = (call)) != HM_OK) return st; } while (0)
    OP(hm_op_rmsnorm(x, HM_BUF_X, L->attn_norm, HM_BUF_H));
    if (L->recurrent) {
        const hm_deltanet dn = {.wqkv = &L->wqkv, .wz = &L->wz, .wbeta = &L->wbeta,
                                .walpha = q->grouped ? NULL : &L->walpha, .wout = &L->wout, .conv_w = L->conv_w,
                                .dt_bias = L->dt_bias, .ssm_a = L->ssm_a, .ssm_norm = L->ssm_norm, .eps = q->eps,
                                .grouped = q->grouped, .mix = Q35_MIX, .conv = Q35_CONV,
                                .z = Q35_Z, .ba = Q35_BA, .aa = Q35_AA, .g = Q35_G, .beta = Q35_BETA,
                                .att = Q35_ATT};
        OP(hm_op_deltanet(x, il, HM_BUF_H, &dn));
        OP(hm_op_out_rows(x, il, (const hm_buf[2]){HM_BUF_X, HM_BUF_H}, 2));
        if (hm_exec_done(x)) return HM_OK;
    } else {
        const hm_mat *qkv[3] = {&L->wq, &L->wk, &L->wv};
        OP(hm_op_matmul_n(x, HM_BUF_H, qkv, (const hm_buf[3]){Q35_MIX, Q35_K, Q35_V}, 3));
        OP(hm_op_split_gate(x, Q35_MIX, Q35_Q, Q35_GATE));
        const hm_qk_rope r = {.q = Q35_Q, .k = Q35_K, .v = Q35_V, .q_norm = L->q_norm, .k_norm = L->k_norm,
                              .n_rot = q->n_rot, .theta = q->theta, .eps = q->eps};
        OP(hm_op_qk_norm_rope_kv(x, il, &r));
        OP(hm_op_out_rows(x, il, (const hm_buf[3]){Q35_Q, Q35_GATE, HM_BUF_X}, 3));
        if (hm_exec_done(x)) return HM_OK;
        OP(hm_op_attention(x, il, Q35_Q, Q35_ATT, 1.0f / sqrtf((float)q->head_dim)));
        OP(hm_op_sigmoid_mul(x, Q35_ATT, Q35_GATE, nq));
        OP(hm_op_matmul(x, Q35_ATT, &L->wo, HM_BUF_H));
    }
    /* MoE block: x += mixer, h = rmsnorm(x); the sigmoid-gated shared expert and the routed units
     * into x */
    OP(hm_op_add_rmsnorm(x, HM_BUF_X, HM_BUF_H, L->post_norm, HM_BUF_H));
    const hm_mat *sh[3] = {&L->sh_gate, &L->sh_up, &L->sh_inp};
    OP(hm_op_matmul_n(x, HM_BUF_H, sh, (const hm_buf[3]){Q35_SHG, Q35_SHU, Q35_SHS}, 3));
    OP(hm_op_swiglu(x, Q35_SHG, Q35_SHU, Q35_SHG, q->n_ff_sh));
    OP(hm_op_matmul(x, Q35_SHG, &L->sh_down, Q35_SHO));
    OP(hm_op_add_sigmoid_scaled(x, HM_BUF_X, Q35_SHO, Q35_SHS));
    OP(hm_op_moe(x, il, HM_BUF_H, HM_BUF_X));
#undef OP
    return HM_OK;
}

static hm_status q35_layer_fwd(hm_exec *x, const hm_model *m, int32_t il) {
    const q35_model *q = m->impl;
    return q35_block(x, q, &q->layers[il], il);
}

/* The MTP head (the one layer of q->mtp_model): X holds the token embeddings, Q35_HIN the
 * injected hidden rows. */
static hm_status q35_mtp_fwd(hm_exec *x, const hm_model *m, int32_t il) {
    const q35_model *q = m->impl;
    const int64_t E = q->n_embd;
    hm_status st;
    if ((st = hm_op_rmsnorm(x, HM_BUF_X, q->mtp_enorm, HM_BUF_H)) != HM_OK) return st;
    if ((st = hm_op_rmsnorm(x, Q35_HIN, q->mtp_hnorm, Q35_SHO)) != HM_OK) return st;
    if ((st = hm_op_concat(x, HM_BUF_H, E, Q35_SHO, E, Q35_CAT)) != HM_OK) return st;
    if ((st = hm_op_matmul(x, Q35_CAT, &q->mtp_eh, HM_BUF_X)) != HM_OK) return st;
    return q35_block(x, q, &q->mtp_layer, il);
}

/* What the executor needs besides the layer (exec.h). */
static void q35_exec_model(q35_model *q) {
    hm_exec_model *xm = &q->xm;
    const int64_t E = q->n_embd, hd = q->head_dim, nq = (int64_t)q->n_head * hd, nkv = (int64_t)q->n_head_kv * hd;
    const int64_t nv = q->n_v, vdim = nv * q->d_v, cd = q->conv_dim, fs = q->n_ff_sh;
    *xm = (hm_exec_model){.n_layer = q->n_layer, .n_embd = q->n_embd, .n_vocab = q->n_vocab, .eps = q->eps,
                          .tok_embd = &q->tok_embd, .output = &q->output, .output_norm = q->output_norm,
                          .n_buf = Q35_NBUF, .n_head = q->n_head, .n_head_kv = q->n_head_kv,
                          .head_dim = q->head_dim, .kv_slot = q->kv_slot, .n_kv_layer = q->n_attn,
                          .dn = {.d_conv = q->d_conv, .n_k = q->n_k, .n_v = q->n_v, .d_k = q->d_k, .d_v = q->d_v,
                                 .conv_dim = q->conv_dim},
                          .rs_slot = q->rs_slot, .n_rs_layer = q->n_recr, .moe_layers = q->moe_layers,
                          .moe = {.n_expert = q->n_expert, .k = q->n_expert_used, .n_ff = q->n_ff_exp,
                                  .score = HM_ROUTE_SOFTMAX, .norm_topk = true}};
    const int64_t w[Q35_NBUF] = {[HM_BUF_X] = E,  [HM_BUF_H] = E, [Q35_MIX] = cd > 2 * nq ? cd : 2 * nq,
                                 [Q35_Q] = nq,    [Q35_GATE] = nq, [Q35_K] = nkv, [Q35_V] = nkv,
                                 [Q35_ATT] = nq > vdim ? nq : vdim, [Q35_CONV] = cd, [Q35_Z] = vdim,
                                 [Q35_BA] = q->grouped ? 2 * nv : nv, [Q35_AA] = nv,  [Q35_G] = nv,  [Q35_BETA] = nv,
                                 [Q35_SHG] = fs,  [Q35_SHU] = fs, [Q35_SHO] = E, [Q35_SHS] = 1};
    memcpy(xm->buf_width, w, sizeof w);
    for (int32_t il = 0; il < q->n_layer; il++) {
        const q35_layer *L = &q->layers[il];
        q->moe_layers[il] = (hm_moe_layer){.router = &L->router, .experts = &L->moe};
        q->kv_slot[il] = L->recurrent ? -1 : L->slot;
        q->rs_slot[il] = L->recurrent ? L->slot : -1;
    }
}

/* Layer il's tensors into L (L->recurrent says which token mixer). */
static hm_status bind_layer(const hm_model *m, const q35_model *q, int32_t il, q35_layer *L, hm_err *err) {
    hm_status st;
    const int64_t E = q->n_embd, hd = q->head_dim, nq = (int64_t)q->n_head * hd, nkv = (int64_t)q->n_head_kv * hd;
    const int64_t vdim = (int64_t)q->n_v * q->d_v;
    char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s, il), n)
    TRY(hm_model_bind_vec(m, NAME("attn_norm.weight"), E, true, &L->attn_norm, err));
    TRY(hm_model_bind_vec(m, NAME("post_attention_norm.weight"), E, true, &L->post_norm, err));
    if (L->recurrent) {
        if (hm_gguf_find_tensor(m->gguf, NAME("ssm_in.weight"))) {
            st = hm_errf(err, HM_ERR_UNSUPPORTED, "%s: the legacy fused ssm_in (q, k, v, z per key head) is not "
                         "supported: re-convert with a current convert_hf_to_gguf.py (attn_qkv + attn_gate)", n);
            goto fail;
        }
        TRY(hm_model_bind_mat(m, NAME("attn_qkv.weight"), E, q->conv_dim, true, &L->wqkv, err));
        TRY(hm_model_bind_mat(m, NAME("attn_gate.weight"), E, vdim, true, &L->wz, err));
        if (q->grouped) {
            TRY(hm_model_bind_mat(m, NAME("ssm_ba.weight"), E, 2 * (int64_t)q->n_v, true, &L->wbeta, err));
        } else {
            TRY(hm_model_bind_mat(m, NAME("ssm_beta.weight"), E, q->n_v, true, &L->wbeta, err));
            TRY(hm_model_bind_mat(m, NAME("ssm_alpha.weight"), E, q->n_v, true, &L->walpha, err));
        }
        TRY(hm_model_bind_mat(m, NAME("ssm_out.weight"), vdim, E, true, &L->wout, err));
        const int64_t cne[2] = {q->d_conv, q->conv_dim};
        const hm_gguf_tensor *t;
        TRY(hm_model_bind(m, NAME("ssm_conv1d.weight"), HM_BIND_F32, 2, cne, true, &t, err));
        L->conv_w = (const float *)t->data;
        TRY(hm_model_bind_vec(m, NAME("ssm_dt.bias"), q->n_v, true, &L->dt_bias, err));
        TRY(hm_model_bind_vec(m, NAME("ssm_a"), q->n_v, true, &L->ssm_a, err));
        TRY(hm_model_bind_vec(m, NAME("ssm_norm.weight"), q->d_v, true, &L->ssm_norm, err));
    } else {
        TRY(hm_model_bind_mat(m, NAME("attn_q.weight"), E, 2 * nq, true, &L->wq, err));
        TRY(hm_model_bind_mat(m, NAME("attn_k.weight"), E, nkv, true, &L->wk, err));
        TRY(hm_model_bind_mat(m, NAME("attn_v.weight"), E, nkv, true, &L->wv, err));
        TRY(hm_model_bind_mat(m, NAME("attn_output.weight"), nq, E, true, &L->wo, err));
        TRY(hm_model_bind_vec(m, NAME("attn_q_norm.weight"), hd, true, &L->q_norm, err));
        TRY(hm_model_bind_vec(m, NAME("attn_k_norm.weight"), hd, true, &L->k_norm, err));
    }
    TRY(hm_model_bind_mat(m, NAME("ffn_gate_inp.weight"), E, q->n_expert, true, &L->router, err));
    TRY(hm_moe_bind(m, il, q->n_expert, E, q->n_ff_exp, HM_MOE_ACT_SILU, false, &L->moe, err));
    TRY(bind_shexp_gate(m, NAME("ffn_gate_inp_shexp.weight"), E, &L->sh_inp, err));
    TRY(hm_model_bind_mat(m, NAME("ffn_gate_shexp.weight"), E, q->n_ff_sh, true, &L->sh_gate, err));
    TRY(hm_model_bind_mat(m, NAME("ffn_up_shexp.weight"), E, q->n_ff_sh, true, &L->sh_up, err));
    TRY(hm_model_bind_mat(m, NAME("ffn_down_shexp.weight"), q->n_ff_sh, E, true, &L->sh_down, err));
#undef NAME
    return HM_OK;
fail:
    return st;
}

/* The MTP head: block n_layer (a gated-attention block) and its nextn tensors; the one-layer
 * model over them (the header). */
static const hm_arch q35_mtp_arch = {.name = "MTP head", HM_EXEC_ARCH(q35_mtp_fwd)};

static hm_status bind_mtp(hm_model *m, q35_model *q, hm_err *err) {
    hm_status st;
    const int32_t il = q->n_layer;
    const int64_t E = q->n_embd;
    char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s, il), n)
    q->mtp_layer.recurrent = false;
    TRY(bind_layer(m, q, il, &q->mtp_layer, err));
    TRY(hm_model_bind_mat(m, NAME("nextn.eh_proj.weight"), 2 * E, E, true, &q->mtp_eh, err));
    TRY(hm_model_bind_vec(m, NAME("nextn.enorm.weight"), E, true, &q->mtp_enorm, err));
    TRY(hm_model_bind_vec(m, NAME("nextn.hnorm.weight"), E, true, &q->mtp_hnorm, err));
    q->mtp_embd = q->tok_embd;
    q->mtp_head = q->output;
    q->mtp_head_norm = q->output_norm;
    TRY(hm_model_bind_mat(m, NAME("nextn.embed_tokens.weight"), E, q->n_vocab, false, &q->mtp_embd, err));
    TRY(hm_model_bind_mat(m, NAME("nextn.shared_head_head.weight"), E, q->n_vocab, false, &q->mtp_head, err));
    {
        const float *hn = NULL;
        TRY(hm_model_bind_vec(m, NAME("nextn.shared_head_norm.weight"), E, false, &hn, err));
        if (hn) q->mtp_head_norm = hn;
    }
#undef NAME
    /* the executor's view: the main one's shape, one layer with a KV cache, no recurrent state,
     * the injected hidden row and the concatenation on top */
    hm_exec_model *xm = &q->mtp_xm;
    *xm = q->xm;
    xm->n_layer = 1;
    xm->tok_embd = &q->mtp_embd;
    xm->output = &q->mtp_head;
    xm->output_norm = q->mtp_head_norm;
    xm->n_buf = Q35_MTP_NBUF;
    xm->buf_width[Q35_HIN] = E;
    xm->buf_width[Q35_CAT] = 2 * E;
    q->mtp_kv_slot = 0;
    xm->kv_slot = &q->mtp_kv_slot;
    xm->n_kv_layer = 1;
    xm->rs_slot = NULL;
    xm->n_rs_layer = 0;
    q->mtp_moe = (hm_moe_layer){.router = &q->mtp_layer.router, .experts = &q->mtp_layer.moe};
    xm->moe_layers = &q->mtp_moe;
    xm->inject_buf = Q35_HIN;
    xm->inject_width = E;
    /* the model: the same file and impl, this description, no store, tier or GPU (CPU, from the
     * mapping) */
    hm_model *mm = &q->mtp_model;
    memcpy(mm, m, sizeof *mm);
    mm->arch = &q35_mtp_arch;
    mm->xm = xm;
    mm->experts = NULL;
    mm->ram = NULL;
    mm->gpu = NULL;
    mm->mtp = NULL;
    mm->pool = NULL;
    mm->pool_threads = mm->pool_refs = 0;
    atomic_store(&mm->busy, 0);
    atomic_store(&mm->pool_lock, 0);
    m->mtp = mm;
    return HM_OK;
fail:
    return st;
}

static void q35_unload(hm_model *m) {
    q35_model *q = m->impl;
    if (!q) return;
    free(q->layers);
    free(q->moe_layers);
    free(q->kv_slot);
    free(q->rs_slot);
    free(q);
    m->impl = NULL;
}

static hm_status q35_load(hm_model *m, hm_err *err) {
    hm_status st;
    q35_model *q = calloc(1, sizeof *q);
    if (!q) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    m->impl = q;
    for (size_t i = 0; i < sizeof q35_variants / sizeof q35_variants[0]; i++)
        if (strcmp(m->arch->name, q35_variants[i].name) == 0) q->grouped = q35_variants[i].grouped;

    TRY(hm_model_hp_moe(m, &q->hp, err));
    TRY(hm_model_rope_scaling_none(m, err));
    HP_INT("nextn_predict_layers", false, 0, &q->n_nextn);
    if (q->n_nextn > 0 && (q->n_nextn > 1 || q->n_nextn >= q->n_layer)) {
        st = hm_errf(err, HM_ERR_UNSUPPORTED, "%s.nextn_predict_layers = %d: MTP layers are not supported%s",
                     m->arch->name, q->n_nextn,
                     q->n_nextn > 1 ? " beyond one block (as llama.cpp)" : " (no main layers left)");
        goto fail;
    }
    q->n_layer -= q->n_nextn; /* block_count holds the MTP block after the main ones */
    {
        const hm_gguf_tensor *g = hm_gguf_find_tensor(m->gguf, "blk.0.ffn_gate_exps.weight");
        HP_INT("expert_feed_forward_length", g == NULL, g && g->n_dims >= 2 ? g->ne[1] : 0, &q->n_ff_exp);
        g = hm_gguf_find_tensor(m->gguf, "blk.0.ffn_gate_shexp.weight");
        HP_INT("expert_shared_feed_forward_length", g == NULL, g && g->n_dims >= 2 ? g->ne[1] : 0, &q->n_ff_sh);
    }
    int32_t d_inner, interval;
    HP_INT("ssm.conv_kernel", true, 0, &q->d_conv);
    HP_INT("ssm.state_size", true, 0, &q->d_k);
    HP_INT("ssm.group_count", true, 0, &q->n_k);
    HP_INT("ssm.time_step_rank", true, 0, &q->n_v);
    HP_INT("ssm.inner_size", true, 0, &d_inner);
    HP_INT("full_attention_interval", false, 4, &interval);
    if (q->d_conv <= 0 || q->d_k <= 0 || q->n_k <= 0 || q->n_v <= 0 || d_inner <= 0 || interval <= 0) {
        st = hm_errf(err, HM_ERR_FORMAT, "bad hparams: ssm.conv_kernel %d, ssm.state_size %d, ssm.group_count %d, "
                     "ssm.time_step_rank %d, ssm.inner_size %d and full_attention_interval %d must all be > 0",
                     q->d_conv, q->d_k, q->n_k, q->n_v, d_inner, interval);
        goto fail;
    }
    if (q->n_v % q->n_k || d_inner % q->n_v) {
        st = hm_errf(err, HM_ERR_FORMAT,
                     "bad hparams: ssm.time_step_rank %d must be a multiple of ssm.group_count %d and divide "
                     "ssm.inner_size %d", q->n_v, q->n_k, d_inner);
        goto fail;
    }
    q->d_v = d_inner / q->n_v;
    if (q->d_v > HM_DELTA_MAX_DV) {
        st = hm_errf(err, HM_ERR_UNSUPPORTED, "DeltaNet value head dim %d > %d", q->d_v, HM_DELTA_MAX_DV);
        goto fail;
    }
    q->conv_dim = 2 * q->n_k * q->d_k + q->n_v * q->d_v;

    const int64_t E = q->n_embd;
    TRY(hm_model_bind_vocab(m, E, &q->tok_embd, &q->output, &q->n_vocab, err));
    TRY(hm_model_bind_vec(m, "output_norm.weight", E, true, &q->output_norm, err));

    q->layers = calloc((size_t)q->n_layer, sizeof *q->layers);
    q->moe_layers = calloc((size_t)q->n_layer, sizeof *q->moe_layers);
    q->kv_slot = malloc((size_t)q->n_layer * sizeof *q->kv_slot);
    q->rs_slot = malloc((size_t)q->n_layer * sizeof *q->rs_slot);
    if (!q->layers || !q->moe_layers || !q->kv_slot || !q->rs_slot) {
        st = hm_errf(err, HM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int32_t il = 0; il < q->n_layer; il++) {
        q35_layer *L = &q->layers[il];
        L->recurrent = (il + 1) % interval != 0;
        L->slot = L->recurrent ? q->n_recr++ : q->n_attn++;
        TRY(bind_layer(m, q, il, L, err));
    }
    q35_exec_model(q);
    m->xm = &q->xm;
    hm_model_info_moe(m, &q->hp);
    if (q->n_nextn) TRY(bind_mtp(m, q, err)); /* after the main view: the head's copies it */
    hm_log_printf(&m->log, HM_LOG_INFO,
                  "%s: %d layers (%d DeltaNet, %d attention), n_embd %d, heads %d/%d x %d (rope %d), "
                  "DeltaNet k %dx%d v %dx%d conv %d, experts %d (k %d, n_ff %d, shared %d), vocab %d",
                  m->arch->name, q->n_layer, q->n_recr, q->n_attn, q->n_embd, q->n_head, q->n_head_kv, q->head_dim,
                  q->n_rot, q->n_k, q->d_k, q->n_v, q->d_v, q->d_conv, q->n_expert, q->n_expert_used, q->n_ff_exp,
                  q->n_ff_sh, q->n_vocab);
    return HM_OK;
fail:
    q35_unload(m);
    return st;
}

const hm_arch hm_arch_qwen35moe = {
    .name = "qwen35moe",
    .load = q35_load,
    .unload = q35_unload,
    HM_EXEC_ARCH(q35_layer_fwd),
};

const hm_arch hm_arch_qwen3next = {
    .name = "qwen3next",
    .load = q35_load,
    .unload = q35_unload,
    HM_EXEC_ARCH(q35_layer_fwd),
};
