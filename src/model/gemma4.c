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
 * Session state: per layer a KV cache; global layers hold n_ctx rows, sliding layers a ring of
 * min(n_ctx, W + n_ubatch) rows (position p in row p % cap; see cpu_gemma.h for why W + U - 1
 * suffices), so the sliding layers' memory does not grow with the context. Activations for one
 * micro-batch are allocated in state_open; forward allocates nothing. Not supported (load says
 * so): per-layer input embeddings (E2B/E4B) and shared-KV layers.
 * With a GPU placement (m->gpu) the same layer runs on the device (gemma4_cuda.c): the hooks below
 * dispatch there, as qwen3moe.c does. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_gemma.h"
#include "core/alloc.h"
#include "gemma4_impl.h"
#include "model.h"
#include "moe.h"
#include "quant/quant.h"

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
    tmp = calloc((size_t)g->n_layer * 2, sizeof *tmp);
    if (!g->layers || !tmp) {
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

/* ---- session state ---- */

static void g4_state_close(void *p) {
    g4_state *s = p;
    if (!s) return;
#ifdef HM_HAVE_CUDA
    g4_gpu_state_close(s);
#endif
    free(s->kvl);
    hm_model_state_free(s->kv, s->att_scratch, s->act, &s->scratch, &s->route);
    free(s);
}

static hm_status g4_state_open(const hm_model *m, const hm_state_opts *o, void **out, hm_err *err) {
    const g4_model *g = m->impl;
    *out = NULL;
    hm_status st = HM_OK;
    g4_state *s = calloc(1, sizeof *s);
    if (!s) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    s->n_ctx = o->n_ctx;
    s->n_ubatch = o->n_ubatch;
    s->es = o->kv_type == HM_KV_F32 ? 4 : 2;
    const size_t U = (size_t)o->n_ubatch, E = (size_t)g->n_embd;
    const size_t nq = (size_t)g->n_head * (size_t)g->hd_max, nkv = (size_t)g->n_kv_max * (size_t)g->hd_max;
    const size_t K = (size_t)(g->n_expert_used > 0 ? g->n_expert_used : 1);

    s->window = g->window;
    s->ring = o->n_ctx;
    if ((int64_t)g->window + o->n_ubatch < s->ring) s->ring = (int64_t)g->window + o->n_ubatch;
    if (!(s->kvl = calloc((size_t)g->n_layer, sizeof *s->kvl))) {
        st = hm_errf(err, HM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    size_t kv_elems = 0;
    int64_t cap_max = 1;
    for (int32_t il = 0; il < g->n_layer; il++) {
        const g4_layer *L = &g->layers[il];
        g4_kv *c = &s->kvl[il];
        c->cap = L->swa ? s->ring : o->n_ctx;
        c->elems = (size_t)L->n_kv * (size_t)c->cap * (size_t)L->hd;
        c->off = kv_elems;
        kv_elems += 2 * c->elems;
        if (c->cap > cap_max) cap_max = c->cap;
    }
#ifdef HM_HAVE_CUDA
    if (m->gpu) { /* the device state instead of the host KV cache and activations */
        if ((st = g4_gpu_state_open(m, o, s, err)) != HM_OK) goto fail;
        *out = s;
        return HM_OK;
    }
#endif
    if ((st = hm_model_kv_alloc(&s->kv, kv_elems, s->es, o->n_ctx, err)) != HM_OK ||
        (st = hm_model_att_scratch_alloc(&s->att_scratch, hm_gemma_attention_scratch_floats(cap_max, o->n_threads),
                                         err)) != HM_OK)
        goto fail;

    const size_t nff = (size_t)g->n_ff_max, nexp = (size_t)(g->n_expert > 0 ? g->n_expert : 1);
    const size_t sizes[] = {U * E, U * E, U * nq, U * nkv, U * nkv, U * nq, U * nff, U * nff,
                            U * E, U * E, U * nexp, U * K, U * E, U * K, U};
    float **dst[] = {&s->x, &s->h, &s->q, &s->k, &s->v, &s->att, &s->g, &s->u, &s->m, &s->e,
                     &s->rlog, &s->rw, &s->hout, (float **)&s->rid, (float **)&s->pos_out};
    _Static_assert(sizeof sizes / sizeof sizes[0] == sizeof dst / sizeof dst[0], "activation table");
    if ((st = hm_model_carve(&s->act, sizes, dst, sizeof sizes / sizeof sizes[0], err)) != HM_OK) goto fail;
    const size_t in_max = hm_model_max_sz(hm_model_max_sz(E, nq), nff);
    size_t sc = hm_cpu_matmul_scratch_size((int64_t)in_max, (int64_t)U, o->n_threads);
    if (g->n_expert > 0) {
        if ((st = hm_moe_route_init(&s->route, g->n_expert, g->n_expert_used, o->n_ubatch, err)) != HM_OK) goto fail;
        sc = hm_model_max_sz(sc, hm_moe_compute_scratch_size(&s->route, g->n_embd, g->n_ff_exp, o->n_threads));
    }
    if ((st = hm_model_scratch_alloc(&s->scratch, sc, err)) != HM_OK) goto fail;
    *out = s;
    return HM_OK;
fail:
    g4_state_close(s);
    return st;
}

static hm_status g4_state_trim(void *state, int32_t n_keep, hm_err *err) {
    /* Rows past n_keep are overwritten before they are read again. But the sliding layers' ring
     * must still hold the window below n_keep: position q sits in row q % ring, intact while no
     * position q + ring has been written since the reset. n_hi only grows (conservative). */
    g4_state *s = state;
    if (n_keep <= 0) {
        s->n_hi = 0;
        return HM_OK;
    }
    const int64_t q_min = (int64_t)n_keep - s->window + 1;
    if (s->ring < s->n_ctx && q_min > 0 && q_min + s->ring < s->n_hi)
        return hm_errf(err, HM_ERR_UNSUPPORTED,
                       "gemma4: cannot go back to %d positions: the sliding-window cache (%lld rows) has "
                       "overwritten the window below it (positions up to %lld were evaluated)",
                       n_keep, (long long)s->ring, (long long)s->n_hi);
    return HM_OK;
}

/* ---- forward ---- */

static hm_status g4_forward(const hm_model *m, void *state, hm_pool *pool, const hm_fwd_batch *b, hm_err *err) {
    const g4_model *g = m->impl;
    g4_state *s = state;
    const int64_t n = b->n, E = g->n_embd;
    const int nh = g->n_head;
    HM_ASSERT(n > 0 && n <= s->n_ubatch && b->n_out <= n);
    HM_ASSERT(b->pos[n - 1] < s->n_ctx);
    const float inv_sqrt_e = 1.0f / sqrtf((float)E);

    if (b->pos[n - 1] + 1 > s->n_hi) s->n_hi = b->pos[n - 1] + 1;
#ifdef HM_HAVE_CUDA
    if (m->gpu) return g4_gpu_forward(m, s, pool, b, err);
#endif
    hm_cpu_get_rows(pool, &g->tok_embd, b->tokens, n, s->x);
    hm_cpu_scale(pool, s->x, g->embd_scale, s->x, n * E);
    int64_t nr = n;
    const int32_t *pos = b->pos;
    for (int32_t il = 0; il < g->n_layer; il++) {
        const g4_layer *L = &g->layers[il];
        const int hd = L->hd, nkv = L->n_kv;
        const g4_kv *c = &s->kvl[il];
        char *kc = (char *)s->kv + c->off * s->es;
        char *vc = kc + c->elems * s->es;

        /* attention */
        hm_cpu_rmsnorm(pool, s->x, L->attn_norm, s->h, n, E, g->eps);
        if (L->wv.data) {
            const hm_mat *ws[3] = {&L->wq, &L->wk, &L->wv};
            float *const ys[3] = {s->q, s->k, s->v};
            hm_cpu_matmul_n(pool, ws, 3, s->h, n, ys, &s->scratch);
        } else {
            const hm_mat *ws[2] = {&L->wq, &L->wk};
            float *const ys[2] = {s->q, s->k};
            hm_cpu_matmul_n(pool, ws, 2, s->h, n, ys, &s->scratch);
            memcpy(s->v, s->k, (size_t)(n * nkv * hd) * sizeof(float)); /* K = V: V is K before norm/RoPE */
        }
        hm_cpu_rmsnorm_heads(pool, s->q, L->q_norm, n, nh, hd, g->eps);
        hm_cpu_rmsnorm_heads(pool, s->k, L->k_norm, n, nkv, hd, g->eps);
        hm_cpu_rmsnorm(pool, s->v, NULL, s->v, n * nkv, hd, g->eps);
        hm_gemma_rope_neox(pool, s->q, n, nh, hd, L->n_rot, b->pos, L->theta, L->rope_ff);
        hm_gemma_rope_neox(pool, s->k, n, nkv, hd, L->n_rot, b->pos, L->theta, L->rope_ff);
        hm_gemma_kv_write(pool, kc, vc, s->es, c->cap, nkv, hd, s->k, s->v, n, b->pos);

        if (il == g->n_layer - 1 && b->n_out < n) {
            /* last layer: only the wanted rows go on (out_rows ascend, so compacting forward is safe) */
            if (b->n_out == 0) break;
            for (int32_t i = 0; i < b->n_out; i++) s->pos_out[i] = b->pos[b->out_rows[i]];
            hm_model_compact_rows(s->q, (int64_t)nh * hd, b->out_rows, b->n_out);
            hm_model_compact_rows(s->x, E, b->out_rows, b->n_out);
            nr = b->n_out;
            pos = s->pos_out;
        }
        hm_gemma_attention(pool, s->q, nr, pos, kc, vc, s->es, c->cap, L->swa ? g->window : 0, nh, nkv, hd, 1.0f,
                           s->att, s->att_scratch);
        hm_cpu_matmul(pool, &L->wo, s->att, nr, s->h, &s->scratch);
        hm_cpu_rmsnorm(pool, s->h, L->post_attn_norm, s->h, nr, E, g->eps);
        hm_cpu_add(pool, s->x, s->h, s->x, nr * E); /* x = attn_out */

        /* dense MLP */
        hm_cpu_rmsnorm(pool, s->x, L->ffn_norm, s->h, nr, E, g->eps);
        {
            const hm_mat *ws[2] = {&L->gate, &L->up};
            float *const ys[2] = {s->g, s->u};
            hm_cpu_matmul_n(pool, ws, 2, s->h, nr, ys, &s->scratch);
        }
        hm_gemma_gelu_mul(pool, s->g, s->u, s->g, nr * L->n_ff);
        hm_cpu_matmul(pool, &L->down, s->g, nr, s->m, &s->scratch);

        if (L->moe) {
            hm_cpu_rmsnorm(pool, s->m, L->post_ffw_norm_1, s->m, nr, E, g->eps);
            /* router on attn_out */
            hm_cpu_rmsnorm(pool, s->x, L->router_scale, s->h, nr, E, g->eps);
            hm_cpu_scale(pool, s->h, inv_sqrt_e, s->h, nr * E);
            hm_cpu_matmul(pool, &L->router, s->h, nr, s->rlog, &s->scratch);
            hm_moe_route_rows(m, il, &s->route, s->rlog, nr, g->n_expert, g->n_expert_used, L->expert_scale, s->rid,
                              s->rw);
            hm_cpu_rmsnorm(pool, s->x, L->pre_ffw_norm_2, s->h, nr, E, g->eps);
            memset(s->e, 0, (size_t)(nr * E) * sizeof(float));
            hm_status mst = hm_moe_forward(m, pool, &L->experts, &s->route, s->h, s->e, &s->scratch,
                                           il + 1 < g->n_layer ? &g->layers[il + 1].router : NULL, err);
            if (mst != HM_OK) return mst;
            hm_cpu_rmsnorm(pool, s->e, L->post_ffw_norm_2, s->e, nr, E, g->eps);
            hm_cpu_add(pool, s->m, s->e, s->m, nr * E);
        }
        hm_cpu_rmsnorm(pool, s->m, L->post_ffw_norm, s->m, nr, E, g->eps);
        hm_cpu_add(pool, s->x, s->m, s->x, nr * E);
        if (L->out_scale != 1.0f) hm_cpu_scale(pool, s->x, L->out_scale, s->x, nr * E);
    }
    if (b->n_out > 0) {
        HM_ASSERT(nr == b->n_out);
        hm_model_logits(pool, s->x, g->output_norm, g->eps, &g->output, b->n_out, E, s->hout, b->logits, &s->scratch);
        if (g->softcap > 0) hm_gemma_softcap(pool, b->logits, (int64_t)b->n_out * g->n_vocab, g->softcap);
    }
    (void)err;
    return HM_OK;
}

const hm_arch hm_arch_gemma4 = {
    .name = "gemma4",
    .load = g4_load,
    .unload = g4_unload,
    .state_open = g4_state_open,
    .state_close = g4_state_close,
    .state_trim = g4_state_trim,
    .forward = g4_forward,
#ifdef HM_HAVE_CUDA
    .gpu_load = g4_gpu_load,
    .gpu_unload = g4_gpu_unload,
    .gpu_multi = true,
#endif
};
