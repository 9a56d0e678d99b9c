/* gemma4.c - the Gemma 4 text architecture (Gemma-4 26B-A4B and its kin), GGUF arch "gemma4" as
 * llama.cpp's converter writes it.
 *
 * Layers are sliding-window (attention.sliding_window_pattern[il] true: head dim key_length_swa,
 * rope.freq_base_swa, rope.dimension_count_swa) or global (key_length, rope.freq_base, and the
 * "proportional" RoPE: NEOX over the whole head with rope_freqs.weight as frequency factors, whose
 * 1e30 entries leave the upper pairs unrotated). Per layer, for a micro-batch (x: [n, n_embd]):
 *   h = rmsnorm(x) * attn_norm;  q = h Wq, k = h Wk, v = h Wv, or v = k when attn_v is absent (K = V)
 *   q, k: per-head rmsnorm * q_norm / k_norm, then RoPE;  v: per-head rmsnorm without weight
 *   attention scale 1 (no 1/sqrt(d): the QK norms take its place); sliding layers see the last W
 *   positions (themselves included), global layers all
 *   x += rmsnorm(att Wo) * post_attention_norm                                      (= attn_out)
 *   m = down(gelu_tanh(gate h2) * up h2), h2 = rmsnorm(x) * ffn_norm               (dense MLP)
 *   MoE layers (ffn_gate_inp present):
 *     m = rmsnorm(m) * post_ffw_norm_1
 *     router on attn_out: logits = Wr (rmsnorm(x) * ffn_gate_inp.scale / sqrt(n_embd)); softmax,
 *     top-k, renormalised, times ffn_down_exps.scale[e];  experts (GELU) on rmsnorm(x) * pre_ffw_norm_2
 *     m += rmsnorm(experts) * post_ffw_norm_2
 *   x += rmsnorm(m) * post_ffw_norm;  x *= layer_output_scale
 * with x0 = token_embd[tok] * sqrt(n_embd) and logits = softcap(Wout (rmsnorm(x) * output_norm)),
 * softcap(l) = c tanh(l / c). Gemma 4's norms multiply by w itself (no 1 + w).
 * The experts are units (layer, e) through hm_moe_compute; a fused ffn_gate_up_exps is split into
 * its gate half (rows 0..n_ff-1 of a slab) and up half.
 *
 * Session state (the executor's, exec/exec.h): per layer a KV cache; global layers hold n_ctx
 * rows, sliding layers a ring of min(n_ctx, W + n_ubatch) rows (position p in row p % cap; see
 * cpu_gemma.h for why W + U - 1 suffices), so the sliding layers' memory does not grow with the
 * context. Not supported (load says so): per-layer input embeddings (E2B/E4B) and shared-KV layers.
 * The layer is written once (g4_layer_fwd, over the executor's ring attention ops); the executor
 * runs it on the CPU and on the GPU (per launch, as the decode graph, and as the upload pass). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/exec.h"
#include "model.h"
#include "exec/moe.h"

typedef struct g4_layer {
    bool swa, moe;
    int32_t hd, n_kv, n_rot, n_ff;
    float theta;
    const float *rope_ff;                         /* [hd/2] global layers, NULL sliding */
    const float *attn_norm, *q_norm, *k_norm, *post_attn_norm; /* [E], [hd], [hd], [E] */
    const float *ffn_norm, *post_ffw_norm;        /* [E] */
    const float *post_ffw_norm_1, *pre_ffw_norm_2, *post_ffw_norm_2, *router_scale; /* [E], MoE only */
    const float *expert_scale;                    /* [n_expert] or NULL */
    float out_scale;                              /* layer_output_scale, 1 when absent */
    hm_mat wq, wk, wv, wo;                        /* wv.data NULL: V = K */
    hm_mat gate, up, down;                        /* dense MLP */
    hm_mat router;                                /* [n_expert x E] */
    hm_moe_weights experts;
} g4_layer;

typedef struct g4_model {
    int32_t n_layer, n_embd, n_head, n_vocab, n_ctx_train, window;
    int32_t n_expert, n_expert_used, n_ff_exp;
    int32_t hd_max, n_kv_max, n_ff_max;
    float eps, softcap, embd_scale;
    hm_mat tok_embd, output;
    const float *output_norm;
    g4_layer *layers; /* [n_layer], owned */
    hm_moe_layer *moe_layers;    /* [n_layer], owned: the MoE layers' router, experts, scale; zeros else */
    hm_attn_layer *attn_layers;  /* [n_layer], owned: head dim, KV heads, window (sliding layers) */
    hm_exec_model xm;            /* what the executor runs (m->xm points here) */
} g4_model;


/* ---- the layer ---- */

/* The activations beside x and h. */
enum {
    G4_Q = HM_BUF_ARCH, G4_K, G4_V, G4_ATT, /* attention, at the widest layer's shape */
    G4_GT, G4_UP,                           /* the dense MLP's gate and up */
    G4_MO,                                  /* a block's output (attention, then MLP + experts) */
    G4_E,                                   /* the experts' sum */
    G4_NBUF
};

static hm_status g4_layer_fwd(hm_exec *x, const hm_model *m, int32_t il) {
    const g4_model *g = m->impl;
    const g4_layer *L = &g->layers[il];
    const int64_t E = g->n_embd, kvw = (int64_t)L->n_kv * L->hd, nq = (int64_t)g->n_head * L->hd;
    hm_status st;
#define OP(call) do { if ((st = (call)) != HM_OK) return st; } while (0)
    /* attention: q, k, v (v = k before the norms when the layer has no attn_v) */
    OP(hm_op_rmsnorm(x, HM_BUF_X, L->attn_norm, HM_BUF_H));
    if (L->wv.data) {
        const hm_mat *ws[3] = {&L->wq, &L->wk, &L->wv};
        OP(hm_op_matmul_n(x, HM_BUF_H, ws, (const hm_buf[3]){G4_Q, G4_K, G4_V}, 3));
    } else {
        const hm_mat *ws[2] = {&L->wq, &L->wk};
        OP(hm_op_matmul_n(x, HM_BUF_H, ws, (const hm_buf[2]){G4_Q, G4_K}, 2));
        OP(hm_op_copy(x, G4_K, G4_V, kvw));
    }
    const hm_ring_in r = {.q = G4_Q, .k = G4_K, .v = G4_V, .q_norm = L->q_norm, .k_norm = L->k_norm,
                          .rope_ff = L->rope_ff, .n_rot = L->n_rot, .theta = L->theta, .eps = g->eps};
    OP(hm_op_attn_in_ring(x, il, &r));
    OP(hm_op_out_rows_w(x, il, (const hm_buf[2]){G4_Q, HM_BUF_X}, (const int64_t[2]){nq, E}, 2));
    if (hm_exec_done(x)) return HM_OK;
    OP(hm_op_attention_ring(x, il, G4_Q, G4_ATT, 1.0f));
    OP(hm_op_matmul(x, G4_ATT, &L->wo, G4_MO));
    OP(hm_op_rmsnorm(x, G4_MO, L->post_attn_norm, G4_MO));
    OP(hm_op_add(x, HM_BUF_X, G4_MO)); /* x = attn_out */
    /* the dense MLP */
    OP(hm_op_rmsnorm(x, HM_BUF_X, L->ffn_norm, HM_BUF_H));
    const hm_mat *gu[2] = {&L->gate, &L->up};
    OP(hm_op_matmul_n(x, HM_BUF_H, gu, (const hm_buf[2]){G4_GT, G4_UP}, 2));
    OP(hm_op_geglu(x, G4_GT, G4_UP, G4_GT, L->n_ff));
    OP(hm_op_matmul(x, G4_GT, &L->down, G4_MO));
    if (L->moe) {
        /* routed on attn_out: rmsnorm(x) * router_scale / sqrt(E); the experts on rmsnorm(x) * pre_ffw_norm_2 */
        OP(hm_op_rmsnorm(x, G4_MO, L->post_ffw_norm_1, G4_MO));
        OP(hm_op_rmsnorm(x, HM_BUF_X, L->router_scale, HM_BUF_H));
        OP(hm_op_scale(x, HM_BUF_H, 1.0f / sqrtf((float)E), E));
        OP(hm_op_route(x, il, HM_BUF_H));
        OP(hm_op_rmsnorm(x, HM_BUF_X, L->pre_ffw_norm_2, HM_BUF_H));
        OP(hm_op_zero(x, G4_E, E));
        OP(hm_op_experts(x, il, HM_BUF_H, G4_E));
        OP(hm_op_rmsnorm(x, G4_E, L->post_ffw_norm_2, G4_E));
        OP(hm_op_add(x, G4_MO, G4_E));
    }
    OP(hm_op_rmsnorm(x, G4_MO, L->post_ffw_norm, G4_MO));
    OP(hm_op_add(x, HM_BUF_X, G4_MO));
    if (L->out_scale != 1.0f) OP(hm_op_scale(x, HM_BUF_X, L->out_scale, E));
#undef OP
    return HM_OK;
}

/* What the executor needs besides the layer (exec.h); after every layer is bound. */
static void g4_exec_model(g4_model *g) {
    hm_exec_model *xm = &g->xm;
    const int64_t E = g->n_embd, nq = (int64_t)g->n_head * g->hd_max, nkv = (int64_t)g->n_kv_max * g->hd_max;
    *xm = (hm_exec_model){.n_layer = g->n_layer, .n_embd = g->n_embd, .n_vocab = g->n_vocab, .eps = g->eps,
                          .tok_embd = &g->tok_embd, .output = &g->output, .output_norm = g->output_norm,
                          .embd_scale = g->embd_scale, .softcap = g->softcap, .n_buf = G4_NBUF,
                          .n_head = g->n_head, .n_head_kv = g->n_kv_max, .head_dim = g->hd_max,
                          .n_kv_layer = g->n_layer, .attn_layers = g->attn_layers, .attn_ring = true,
                          .moe_layers = g->moe_layers,
                          .moe = {.n_expert = g->n_expert, .k = g->n_expert_used, .n_ff = g->n_ff_exp,
                                  .score = HM_ROUTE_SOFTMAX, .norm_topk = true}};
    const int64_t w[G4_NBUF] = {[HM_BUF_X] = E, [HM_BUF_H] = E,   [G4_Q] = nq,  [G4_K] = nkv,
                                [G4_V] = nkv,   [G4_ATT] = nq,    [G4_GT] = g->n_ff_max, [G4_UP] = g->n_ff_max,
                                [G4_MO] = E,    [G4_E] = E};
    memcpy(xm->buf_width, w, sizeof w);
    for (int32_t il = 0; il < g->n_layer; il++) {
        const g4_layer *L = &g->layers[il];
        g->attn_layers[il] = (hm_attn_layer){.head_dim = L->hd, .n_head_kv = L->n_kv, .window = L->swa ? g->window : 0};
        if (L->moe)
            g->moe_layers[il] = (hm_moe_layer){.router = &L->router, .experts = &L->experts,
                                               .expert_scale = L->expert_scale};
    }
}

/* ---- load ---- */

/* Layer il's value of an integer key that is either one number or an array of n_layer. */
static hm_status hp_layer_int(const hm_model *m, const char *suffix, bool required, int64_t dflt, int32_t n_layer,
                              int32_t *out, hm_err *err) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", m->arch_name, suffix);
    hm_gguf_arr a;
    if (hm_gguf_get_arr(m->gguf, key, &a)) {
        if (a.n != (uint64_t)n_layer)
            return hm_errf(err, HM_ERR_FORMAT, "key %s: %llu entries, expected one per layer (%d)", key,
                           (unsigned long long)a.n, n_layer);
        for (int32_t i = 0; i < n_layer; i++) {
            int64_t v;
            if (!hm_gguf_arr_int(&a, (uint64_t)i, &v))
                return hm_errf(err, HM_ERR_FORMAT, "key %s[%d] is not an integer", key, i);
            char idx[24];
            snprintf(idx, sizeof idx, "[%d]", i);
            hm_status st = hm_model_hp_check(m, suffix, idx, v, err);
            if (st != HM_OK) return st;
            out[i] = (int32_t)v;
        }
        return HM_OK;
    }
    int32_t v;
    hm_status st = hm_model_hp_int(m, suffix, required, dflt, &v, err);
    if (st != HM_OK) return st;
    for (int32_t i = 0; i < n_layer; i++) out[i] = v;
    return HM_OK;
}

static void g4_unload(hm_model *m) {
    g4_model *g = m->impl;
    if (!g) return;
    free(g->layers);
    free(g->moe_layers);
    free(g->attn_layers);
    free(g);
    m->impl = NULL;
}

static int32_t max_i32(int32_t a, int32_t b) { return a > b ? a : b; }

static hm_status bind_layer(const hm_model *m, g4_model *g, int32_t il, hm_err *err) {
    g4_layer *L = &g->layers[il];
    const int64_t E = g->n_embd, hd = L->hd, nq = (int64_t)g->n_head * hd, nkv = (int64_t)L->n_kv * hd;
    hm_status st;
    char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s, il), n)
#define TRY(x) do { if ((st = (x)) != HM_OK) return st; } while (0)
    TRY(hm_model_bind_vec(m, NAME("attn_norm.weight"), E, true, &L->attn_norm, err));
    TRY(hm_model_bind_mat(m, NAME("attn_q.weight"), E, nq, true, &L->wq, err));
    TRY(hm_model_bind_mat(m, NAME("attn_k.weight"), E, nkv, true, &L->wk, err));
    TRY(hm_model_bind_mat(m, NAME("attn_v.weight"), E, nkv, false, &L->wv, err));
    TRY(hm_model_bind_mat(m, NAME("attn_output.weight"), nq, E, true, &L->wo, err));
    TRY(hm_model_bind_vec(m, NAME("attn_q_norm.weight"), hd, true, &L->q_norm, err));
    TRY(hm_model_bind_vec(m, NAME("attn_k_norm.weight"), hd, true, &L->k_norm, err));
    TRY(hm_model_bind_vec(m, NAME("post_attention_norm.weight"), E, true, &L->post_attn_norm, err));
    TRY(hm_model_bind_vec(m, NAME("ffn_norm.weight"), E, true, &L->ffn_norm, err));
    TRY(hm_model_bind_mat(m, NAME("ffn_gate.weight"), E, L->n_ff, true, &L->gate, err));
    TRY(hm_model_bind_mat(m, NAME("ffn_up.weight"), E, L->n_ff, true, &L->up, err));
    TRY(hm_model_bind_mat(m, NAME("ffn_down.weight"), L->n_ff, E, true, &L->down, err));
    TRY(hm_model_bind_vec(m, NAME("post_ffw_norm.weight"), E, true, &L->post_ffw_norm, err));
    const float *os = NULL;
    TRY(hm_model_bind_vec(m, NAME("layer_output_scale.weight"), 1, false, &os, err));
    L->out_scale = os ? os[0] : 1.0f;

    const hm_gguf_tensor *t = hm_gguf_find_tensor(m->gguf, NAME("ffn_gate_inp.weight"));
    L->moe = t != NULL;
    if (!L->moe) return HM_OK;
    if (g->n_expert <= 0)
        return hm_errf(err, HM_ERR_FORMAT, "tensor '%s' present but %s.expert_count is missing", n, m->arch_name);
    TRY(hm_model_bind_mat(m, NAME("ffn_gate_inp.weight"), E, g->n_expert, true, &L->router, err));
    TRY(hm_model_bind_vec(m, NAME("ffn_gate_inp.scale"), E, true, &L->router_scale, err));
    TRY(hm_model_bind_vec(m, NAME("pre_ffw_norm_2.weight"), E, true, &L->pre_ffw_norm_2, err));
    TRY(hm_model_bind_vec(m, NAME("post_ffw_norm_1.weight"), E, true, &L->post_ffw_norm_1, err));
    TRY(hm_model_bind_vec(m, NAME("post_ffw_norm_2.weight"), E, true, &L->post_ffw_norm_2, err));
    TRY(hm_model_bind_vec(m, NAME("ffn_down_exps.scale"), g->n_expert, false, &L->expert_scale, err));
    TRY(hm_moe_bind(m, il, g->n_expert, E, g->n_ff_exp, HM_MOE_ACT_GELU, true, &L->experts, err));
#undef NAME
#undef TRY
    return HM_OK;
}

static hm_status g4_load(hm_model *m, hm_err *err) {
    hm_status st;
    g4_model *g = calloc(1, sizeof *g);
    int32_t *tmp = NULL;
    if (!g) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    m->impl = g;
#define HP_INT(suffix, req, dflt, dst) \
    do { if ((st = hm_model_hp_int(m, suffix, req, dflt, dst, err)) != HM_OK) goto fail; } while (0)
#define HP_FLOAT(suffix, req, dflt, dst) \
    do { if ((st = hm_model_hp_float(m, suffix, req, dflt, dst, err)) != HM_OK) goto fail; } while (0)
    HP_INT("context_length", true, 0, &g->n_ctx_train);
    HP_INT("embedding_length", true, 0, &g->n_embd);
    HP_INT("block_count", true, 0, &g->n_layer);
    HP_INT("attention.head_count", true, 0, &g->n_head);
    HP_INT("attention.sliding_window", true, 0, &g->window);
    if (g->n_embd <= 0 || g->n_layer <= 0 || g->n_head <= 0 || g->window <= 0) {
        st = hm_errf(err, HM_ERR_FORMAT, "bad hparams: embedding_length %d, block_count %d, head_count %d, "
                     "sliding_window %d", g->n_embd, g->n_layer, g->n_head, g->window);
        goto fail;
    }
    {
        int32_t v;
        HP_INT("embedding_length_per_layer_input", false, 0, &v);
        if (v) {
            st = hm_errf(err, HM_ERR_UNSUPPORTED, "%s.embedding_length_per_layer_input = %d: per-layer input "
                         "embeddings (Gemma 4 E2B/E4B) are not supported", m->arch_name, v);
            goto fail;
        }
        HP_INT("attention.shared_kv_layers", false, 0, &v);
        if (v) {
            st = hm_errf(err, HM_ERR_UNSUPPORTED, "%s.attention.shared_kv_layers = %d is not supported",
                         m->arch_name, v);
            goto fail;
        }
    }
    int32_t hd_full, hd_swa, n_rot_full, n_rot_swa;
    if ((st = hm_model_hp_head_dim(m, "", true, 0, &hd_full, err)) != HM_OK ||
        (st = hm_model_hp_head_dim(m, "_swa", false, hd_full, &hd_swa, err)) != HM_OK)
        goto fail;
    HP_INT("rope.dimension_count", false, hd_full, &n_rot_full);
    HP_INT("rope.dimension_count_swa", false, hd_swa, &n_rot_swa);
    if (hd_full <= 0 || hd_swa <= 0 || n_rot_full <= 0 || n_rot_full % 2 || n_rot_full > hd_full || n_rot_swa <= 0 ||
        n_rot_swa % 2 || n_rot_swa > hd_swa) {
        st = hm_errf(err, HM_ERR_FORMAT, "bad hparams: key_length %d / _swa %d, rope.dimension_count %d / _swa %d",
                     hd_full, hd_swa, n_rot_full, n_rot_swa);
        goto fail;
    }
    if ((st = hm_model_rope_scaling_none(m, err)) != HM_OK) goto fail;
    float theta, theta_swa;
    HP_FLOAT("rope.freq_base", false, 1000000.0, &theta);
    HP_FLOAT("rope.freq_base_swa", false, 10000.0, &theta_swa);
    HP_FLOAT("attention.layer_norm_rms_epsilon", false, 1e-6, &g->eps);
    HP_FLOAT("final_logit_softcapping", false, 0.0, &g->softcap);
    if (g->softcap < 0) {
        st = hm_errf(err, HM_ERR_FORMAT, "%s.final_logit_softcapping = %g is negative", m->arch_name,
                     (double)g->softcap);
        goto fail;
    }
    HP_INT("expert_count", false, 0, &g->n_expert);
    HP_INT("expert_used_count", false, 0, &g->n_expert_used);
    if (g->n_expert && (g->n_expert_used <= 0 || g->n_expert_used > g->n_expert)) {
        st = hm_errf(err, HM_ERR_FORMAT, "bad hparams: expert_count %d, expert_used_count %d", g->n_expert,
                     g->n_expert_used);
        goto fail;
    }
    HP_INT("expert_feed_forward_length", g->n_expert > 0, 0, &g->n_ff_exp);

    g->layers = calloc((size_t)g->n_layer, sizeof *g->layers);
    g->moe_layers = calloc((size_t)g->n_layer, sizeof *g->moe_layers);
    g->attn_layers = calloc((size_t)g->n_layer, sizeof *g->attn_layers);
    tmp = calloc((size_t)g->n_layer * 2, sizeof *tmp);
    if (!g->layers || !g->moe_layers || !g->attn_layers || !tmp) {
        st = hm_errf(err, HM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    {
        char key[160];
        snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", m->arch_name);
        hm_gguf_arr a;
        if (!hm_gguf_get_arr(m->gguf, key, &a) || a.elem_type != HM_GGUF_BOOL || a.n != (uint64_t)g->n_layer) {
            st = hm_errf(err, HM_ERR_FORMAT, "key %s: expected a bool array of %d entries (one per layer)", key,
                         g->n_layer);
            goto fail;
        }
        for (int32_t il = 0; il < g->n_layer; il++) g->layers[il].swa = ((const uint8_t *)a.data)[il] != 0;
    }
    if ((st = hp_layer_int(m, "attention.head_count_kv", false, g->n_head, g->n_layer, tmp, err)) != HM_OK) goto fail;
    if ((st = hp_layer_int(m, "feed_forward_length", true, 0, g->n_layer, tmp + g->n_layer, err)) != HM_OK) goto fail;

    const int64_t E = g->n_embd;
    if ((st = hm_model_bind_vocab(m, E, &g->tok_embd, &g->output, &g->n_vocab, err)) != HM_OK) goto fail;
    if ((st = hm_model_bind_vec(m, "output_norm.weight", E, true, &g->output_norm, err)) != HM_OK) goto fail;
    const float *rope_ff = NULL;
    for (int32_t il = 0; il < g->n_layer && !rope_ff; il++)
        if (!g->layers[il].swa &&
            (st = hm_model_bind_vec(m, "rope_freqs.weight", n_rot_full / 2, true, &rope_ff, err)) != HM_OK)
            goto fail;
    g->embd_scale = sqrtf((float)E);

    for (int32_t il = 0; il < g->n_layer; il++) {
        g4_layer *L = &g->layers[il];
        L->hd = L->swa ? hd_swa : hd_full;
        L->n_rot = L->swa ? n_rot_swa : n_rot_full;
        L->theta = L->swa ? theta_swa : theta;
        L->rope_ff = L->swa ? NULL : rope_ff;
        L->n_kv = tmp[il];
        L->n_ff = tmp[g->n_layer + il];
        if (L->n_kv <= 0 || g->n_head % L->n_kv || L->n_ff <= 0) {
            st = hm_errf(err, HM_ERR_FORMAT, "layer %d: bad hparams: head_count %d, head_count_kv %d, "
                         "feed_forward_length %d", il, g->n_head, L->n_kv, L->n_ff);
            goto fail;
        }
        if ((st = bind_layer(m, g, il, err)) != HM_OK) goto fail;
        g->hd_max = max_i32(g->hd_max, L->hd);
        g->n_kv_max = max_i32(g->n_kv_max, L->n_kv);
        g->n_ff_max = max_i32(g->n_ff_max, L->n_ff);
    }
    free(tmp);
    tmp = NULL;

    g4_exec_model(g);
    m->xm = &g->xm;
    hm_model_info *inf = &m->info;
    inf->n_vocab = g->n_vocab;
    inf->n_ctx_train = g->n_ctx_train;
    inf->n_embd = g->n_embd;
    inf->n_layer = g->n_layer;
    inf->n_head = g->n_head;
    inf->n_head_kv = g->layers[0].n_kv;
    inf->head_dim = g->layers[0].hd;
    inf->n_expert = g->n_expert;
    inf->n_expert_used = g->n_expert_used;
    inf->n_ff_exp = g->n_ff_exp;
    hm_log_printf(&m->log, HM_LOG_INFO,
                  "gemma4: %d layers, n_embd %d, heads %d, head dim %d (sliding, window %d) / %d (global), "
                  "experts %d (k %d, n_ff %d), vocab %d, softcap %g",
                  g->n_layer, g->n_embd, g->n_head, hd_swa, g->window, hd_full, g->n_expert, g->n_expert_used,
                  g->n_ff_exp, g->n_vocab, (double)g->softcap);
    return HM_OK;
fail:
    free(tmp);
    g4_unload(m);
    return st;
#undef HP_INT
#undef HP_FLOAT
}

const hm_arch hm_arch_gemma4 = {
    .name = "gemma4",
    .load = g4_load,
    .unload = g4_unload,
    HM_EXEC_ARCH(g4_layer_fwd),
};
