/* qwen3moe.c - the Qwen3-MoE architecture (Qwen3-30B-A3B, Qwen3-235B-A22B, ...).
 *
 * Per layer, for a micro-batch of n tokens (x is the residual stream, [n, n_embd]):
 *   h = rmsnorm(x) * attn_norm
 *   q, k, v = h Wq, h Wk, h Wv            q: [n, n_head*hd], k/v: [n, n_head_kv*hd]
 *   q, k = per-head rmsnorm(q) * q_norm, (k) * k_norm; then RoPE (NEOX pairing i <-> i + n_rot/2)
 *   k, v -> KV cache (f16); a = causal GQA attention of q over the cache, scale 1/sqrt(hd)
 *   x += a Wo
 *   h = rmsnorm(x) * ffn_norm
 *   p = softmax(h Wr) over n_expert; top-k; weights renormalised to sum 1 (norm_topk_prob, which
 *       llama.cpp hard-wires for qwen3moe); x += sum_e w_e * down_e(silu(gate_e h) * up_e h)
 * then logits = (rmsnorm(x) * output_norm) Wout, Wout = token_embd when `output` is absent.
 * head_dim comes from attention.key_length and may differ from n_embd / n_head.
 * In the last layer only the rows whose logits are wanted go past the K/V write (a prompt's
 * prefill computes one row there, a micro-batch without wanted logits stops at the write).
 * After each router the layer's routed experts go to the model's expert store (hm_experts_record,
 * O(rows * k)); so the last layer counts only the rows it computes, as llama.cpp's does.
 *
 * Session state: the KV cache for n_ctx positions and every activation for one micro-batch are
 * allocated in state_open; forward allocates nothing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "kv_f32.h"
#include "model.h"
#include "moe.h"
#include "quant/quant.h"
#include "qwen3moe_impl.h"

/* ---- load ---- */

#define HP_INT(suffix, req, dflt, dst) \
    do { if ((st = hm_model_hp_int(m, suffix, req, dflt, dst, err)) != HM_OK) goto fail; } while (0)
#define TRY(x) do { if ((st = (x)) != HM_OK) goto fail; } while (0)

static void q3_unload(hm_model *m) {
    q3_model *q = m->impl;
    if (!q) return;
    free(q->layers);
    free(q);
    m->impl = NULL;
}

static hm_status q3_load(hm_model *m, hm_err *err) {
    hm_status st;
    q3_model *q = calloc(1, sizeof *q);
    if (!q) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    m->impl = q;

    TRY(hm_model_hp_moe(m, &q->hp, err));
    if (q->n_rot <= 0) {
        st = hm_errf(err, HM_ERR_FORMAT, "bad hparams: key_length %d, rope.dimension_count %d", q->head_dim, q->n_rot);
        goto fail;
    }
    {
        /* expert_feed_forward_length is optional in llama.cpp; fall back to the tensor's shape */
        const hm_gguf_tensor *g = hm_gguf_find_tensor(m->gguf, "blk.0.ffn_gate_exps.weight");
        HP_INT("expert_feed_forward_length", false, g && g->n_dims >= 2 ? g->ne[1] : 0, &q->n_ff_exp);
        if (q->n_ff_exp <= 0) {
            st = hm_errf(err, HM_ERR_FORMAT, "missing key %s.expert_feed_forward_length", m->arch_name);
            goto fail;
        }
    }
    {
        char key[128];
        hm_gguf_str s;
        snprintf(key, sizeof key, "%s.rope.scaling.type", m->arch_name);
        if (hm_gguf_get_str(m->gguf, key, &s) && !(s.len == 4 && memcmp(s.ptr, "none", 4) == 0))
            hm_log_printf(&m->log, HM_LOG_WARN, "%s = %.*s is ignored (plain RoPE is used)", key, (int)s.len, s.ptr);
    }

    const int64_t E = q->n_embd, hd = q->head_dim, nq = (int64_t)q->n_head * hd, nkv = (int64_t)q->n_head_kv * hd;
    TRY(hm_model_bind_vocab(m, E, &q->tok_embd, &q->output, &q->n_vocab, err));
    TRY(hm_model_bind_vec(m, "output_norm.weight", E, true, &q->output_norm, err));

    q->layers = calloc((size_t)q->n_layer, sizeof *q->layers);
    if (!q->layers) {
        st = hm_errf(err, HM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int32_t il = 0; il < q->n_layer; il++) {
        q3_layer *L = &q->layers[il];
        char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s ".weight", il), n)
        TRY(hm_model_bind_vec(m, NAME("attn_norm"), E, true, &L->attn_norm, err));
        TRY(hm_model_bind_mat(m, NAME("attn_q"), E, nq, true, &L->wq, err));
        TRY(hm_model_bind_mat(m, NAME("attn_k"), E, nkv, true, &L->wk, err));
        TRY(hm_model_bind_mat(m, NAME("attn_v"), E, nkv, true, &L->wv, err));
        TRY(hm_model_bind_mat(m, NAME("attn_output"), nq, E, true, &L->wo, err));
        TRY(hm_model_bind_vec(m, NAME("attn_q_norm"), hd, true, &L->q_norm, err));
        TRY(hm_model_bind_vec(m, NAME("attn_k_norm"), hd, true, &L->k_norm, err));
        TRY(hm_model_bind_vec(m, NAME("ffn_norm"), E, true, &L->ffn_norm, err));
        TRY(hm_model_bind_mat(m, NAME("ffn_gate_inp"), E, q->n_expert, true, &L->router, err));
        TRY(hm_moe_bind(m, il, q->n_expert, E, q->n_ff_exp, HM_MOE_ACT_SILU, false, &L->moe, err));
#undef NAME
    }

    hm_model_info_moe(m, &q->hp);
    hm_log_printf(&m->log, HM_LOG_INFO,
                  "qwen3moe: %d layers, n_embd %d, heads %d/%d x %d, experts %d (k %d, n_ff %d), vocab %d, "
                  "ctx_train %d, rope %g, eps %g",
                  q->n_layer, q->n_embd, q->n_head, q->n_head_kv, q->head_dim, q->n_expert, q->n_expert_used,
                  q->n_ff_exp, q->n_vocab, q->n_ctx_train, (double)q->theta, (double)q->eps);
    return HM_OK;
fail:
    q3_unload(m);
    return st;
}

/* ---- session state ---- */

static void q3_state_close(void *p) {
    q3_state *s = p;
    if (!s) return;
#ifdef HM_HAVE_CUDA
    q3_gpu_state_close(s);
#endif
    hm_model_state_free(s->kv, s->kv_scratch, s->act, &s->scratch, &s->route);
    free(s);
}


static hm_status q3_state_open(const hm_model *m, const hm_state_opts *o, void **out, hm_err *err) {
    const q3_model *q = m->impl;
    *out = NULL;
    hm_status st = HM_OK;
    q3_state *s = calloc(1, sizeof *s);
    if (!s) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    s->n_ctx = o->n_ctx;
    s->n_ubatch = o->n_ubatch;
    s->n_threads = o->n_threads;
    s->kv_type = o->kv_type;
#ifdef HM_HAVE_CUDA
    if (m->gpu) { /* the device state instead of the host KV cache and activations */
        if ((st = q3_gpu_state_open(m, o, s, err)) != HM_OK) goto fail;
        *out = s;
        return HM_OK;
    }
#endif
    const size_t U = (size_t)o->n_ubatch, E = (size_t)q->n_embd, hd = (size_t)q->head_dim;
    const size_t nq = (size_t)q->n_head * hd, nkv = (size_t)q->n_head_kv * hd, K = (size_t)q->n_expert_used;

    s->kv_elem_size = o->kv_type == HM_KV_F32 ? 4 : 2;
    s->kv_layer_elems = (size_t)q->n_head_kv * (size_t)o->n_ctx * hd;
    if ((st = hm_model_kv_alloc(&s->kv, s->kv_layer_elems, 2u * (size_t)q->n_layer * s->kv_elem_size, o->n_ctx,
                                err)) != HM_OK)
        goto fail;

    /* activations: one block, each array 64-byte aligned */
    const size_t sizes[] = {U * E, U * E, U * nq, U * nkv, U * nkv, U * nq, U * (size_t)q->n_expert, U * K, U * K,
                            U * E, U,     U,     U,     U};
    float **dst[] = {&s->x,    &s->h,  &s->q,             &s->k,    &s->v,                 &s->att,
                     &s->rlog, &s->rw, (float **)&s->rid, &s->hout, (float **)&s->pos_out, (float **)&s->tok_all,
                     (float **)&s->pos_all, (float **)&s->row_out};
    _Static_assert(sizeof sizes / sizeof sizes[0] == sizeof dst / sizeof dst[0], "activation table");
    if ((st = hm_model_carve(&s->act, sizes, dst, sizeof sizes / sizeof sizes[0], err)) != HM_OK) goto fail;

    if (o->kv_type == HM_KV_F32 &&
        (st = hm_model_att_scratch_alloc(&s->kv_scratch, hm_kv_f32_scratch_floats(o->n_ctx, o->n_threads), err)))
        goto fail;
    if ((st = hm_moe_route_init(&s->route, q->n_expert, q->n_expert_used, o->n_ubatch, err)) != HM_OK) goto fail;

    size_t sc = hm_cpu_matmul_scratch_size((int64_t)hm_model_max_sz(E, nq), (int64_t)U, o->n_threads);
    sc = hm_model_max_sz(sc,
                         hm_cpu_attention_scratch_size((int64_t)U, o->n_ctx, q->n_head, q->head_dim, o->n_threads));
    sc = hm_model_max_sz(sc, hm_moe_compute_scratch_size(&s->route, q->n_embd, q->n_ff_exp, o->n_threads));
    if ((st = hm_model_scratch_alloc(&s->scratch, sc, err)) != HM_OK) goto fail;
    *out = s;
    return HM_OK;
fail:
    q3_state_close(s);
    return st;
}

static hm_status q3_state_trim(void *state, int32_t n_keep, hm_err *err) {
    (void)state;
    (void)n_keep;
    return HM_OK; /* rows past n_keep are overwritten by the next eval */
}

/* ---- forward ---- */

/* Layer il's K cache of a state; *vc its V cache. */
static char *q3_kv_layer(const q3_state *s, int32_t il, char **vc) {
    return hm_model_kv_layer(s->kv, s->kv_layer_elems, s->kv_elem_size, il, vc);
}

/* Batched forward over several sequences (model.h, forward_multi). The batch is the sequences'
 * rows concatenated; sequence i owns rows [off[i], off[i] + cnt[i]) (its b.n rows, then after the
 * last layer's compaction its b.n_out wanted rows). Everything row-wise (norms, matmuls, RoPE with
 * each row's own position, the router, the MoE block) runs once on the whole batch; only the K/V
 * write and attention go sequence by sequence, into and over that sequence's own cache. One
 * sequence is the plain single-session forward (q3_forward): no copies then. */
static hm_status q3_forward_multi(const hm_model *m, void *work, hm_pool *pool, const hm_fwd_seq *seqs, int n_seq,
                                  float *logits, hm_err *err) {
    const q3_model *q = m->impl;
    q3_state *s = work;
    const int64_t E = q->n_embd;
    const int hd = q->head_dim, nh = q->n_head, nkv = q->n_head_kv;
    HM_ASSERT(n_seq > 0 && n_seq <= HM_FWD_MAX_SEQ);
#ifdef HM_HAVE_CUDA
    if (m->gpu) {
        /* no batched pass on the device yet: the sequences one after another on their own
         * states (each unit computes once per sequence instead of once per batch, results as
         * alone); the wanted rows land in sequence order as the batched pass writes them */
        (void)work;
        float *lg = logits;
        for (int i = 0; i < n_seq; i++) {
            hm_fwd_batch b = seqs[i].b;
            b.logits = b.n_out ? lg : NULL;
            hm_status st = q3_gpu_forward(m, seqs[i].state, pool, &b, err);
            if (st != HM_OK) return st;
            if (b.n_out) lg += (size_t)b.n_out * (size_t)q->n_vocab;
        }
        return HM_OK;
    }
#endif
    const float scale = 1.0f / sqrtf((float)hd);
    int32_t off[HM_FWD_MAX_SEQ], cnt[HM_FWD_MAX_SEQ];
    int64_t n = 0, n_out = 0;
    for (int i = 0; i < n_seq; i++) {
        const hm_fwd_batch *b = &seqs[i].b;
        const q3_state *si = seqs[i].state;
        HM_ASSERT(b->n > 0 && b->n <= si->n_ubatch && b->n_out <= b->n && n + b->n <= s->n_ubatch);
        HM_ASSERT(b->pos[b->n - 1] < si->n_ctx && si->n_threads == s->n_threads);
        off[i] = (int32_t)n;
        cnt[i] = b->n;
        if (n_seq > 1) {
            memcpy(s->tok_all + n, b->tokens, (size_t)b->n * sizeof(int32_t));
            memcpy(s->pos_all + n, b->pos, (size_t)b->n * sizeof(int32_t));
        }
        for (int32_t j = 0; j < b->n_out; j++) s->row_out[n_out++] = (int32_t)n + b->out_rows[j];
        n += b->n;
    }
    const int32_t *tokens = n_seq > 1 ? s->tok_all : seqs[0].b.tokens;
    const int32_t *pos_in = n_seq > 1 ? s->pos_all : seqs[0].b.pos; /* [n] every row's position */

    hm_cpu_get_rows(pool, &q->tok_embd, tokens, n, s->x);
    int64_t nr = n;              /* rows carried through the layer (all but in the last layer) */
    const int32_t *pos = pos_in; /* their positions */
    for (int32_t il = 0; il < q->n_layer; il++) {
        const q3_layer *L = &q->layers[il];

        /* attention block: Q/K/V of every token (the cache needs all K/V rows) */
        hm_cpu_rmsnorm(pool, s->x, L->attn_norm, s->h, n, E, q->eps);
        const hm_mat *ws[3] = {&L->wq, &L->wk, &L->wv};
        float *const ys[3] = {s->q, s->k, s->v};
        hm_cpu_matmul_n(pool, ws, 3, s->h, n, ys, &s->scratch);
        hm_cpu_rmsnorm_heads(pool, s->q, L->q_norm, n, nh, hd, q->eps);
        hm_cpu_rmsnorm_heads(pool, s->k, L->k_norm, n, nkv, hd, q->eps);
        hm_cpu_rope_neox(pool, s->q, n, nh, hd, q->n_rot, pos_in, q->theta);
        hm_cpu_rope_neox(pool, s->k, n, nkv, hd, q->n_rot, pos_in, q->theta);
        for (int i = 0; i < n_seq; i++) { /* each sequence's K/V rows into its own cache */
            const q3_state *si = seqs[i].state;
            char *vc, *kc = q3_kv_layer(si, il, &vc);
            const size_t ro = (size_t)off[i] * (size_t)(nkv * hd);
            hm_model_kv_write(pool, si->kv_type, kc, vc, si->n_ctx, nkv, hd, s->k + ro, s->v + ro, cnt[i],
                              seqs[i].b.pos);
        }

        if (il == q->n_layer - 1 && n_out < n) {
            /* last layer: only the rows whose logits are wanted matter from here on (as
             * llama.cpp's inp_out_ids); row_out ascends, so compacting forward is safe */
            if (n_out == 0) break;
            for (int64_t i = 0; i < n_out; i++) s->pos_out[i] = pos_in[s->row_out[i]];
            hm_model_compact_rows(s->q, (int64_t)nh * hd, s->row_out, (int32_t)n_out);
            hm_model_compact_rows(s->x, E, s->row_out, (int32_t)n_out);
            nr = n_out;
            pos = s->pos_out;
            for (int i = 0, o = 0; i < n_seq; o += cnt[i], i++) {
                off[i] = o;
                cnt[i] = seqs[i].b.n_out;
            }
        }
        for (int i = 0; i < n_seq; i++) { /* each sequence's queries over its own cache */
            q3_state *si = seqs[i].state;
            if (!cnt[i]) continue;
            char *vc, *kc = q3_kv_layer(si, il, &vc);
            const size_t ro = (size_t)off[i] * (size_t)(nh * hd);
            hm_model_attention(pool, si->kv_type, s->q + ro, cnt[i], pos + off[i], kc, vc, si->n_ctx, nh, nkv, hd,
                               scale, s->att + ro, si->kv_scratch, &si->scratch);
        }
        hm_cpu_matmul(pool, &L->wo, s->att, nr, s->h, &s->scratch);
        hm_cpu_add(pool, s->x, s->h, s->x, nr * E);

        /* MoE block: route, then compute the routed units straight into the residual */
        hm_cpu_rmsnorm(pool, s->x, L->ffn_norm, s->h, nr, E, q->eps);
        hm_cpu_matmul(pool, &L->router, s->h, nr, s->rlog, &s->scratch);
        hm_moe_route_rows(m, il, &s->route, s->rlog, nr, q->n_expert, q->n_expert_used, NULL, s->rid, s->rw);
        hm_status mst = hm_moe_forward(m, pool, &L->moe, &s->route, s->h, s->x, &s->scratch,
                                       il + 1 < q->n_layer ? &q->layers[il + 1].router : NULL, err);
        if (mst != HM_OK) return mst;
    }
    if (n_out > 0) {
        /* x rows 0..n_out-1 are the wanted rows now (compacted above, or all rows in order) */
        HM_ASSERT(nr == n_out && logits);
        hm_model_logits(pool, s->x, q->output_norm, q->eps, &q->output, n_out, E, s->hout, logits, &s->scratch);
    }
    (void)err;
    return HM_OK;
}

/* One session's micro-batch: the batched forward with one sequence. */
static hm_status q3_forward(const hm_model *m, void *state, hm_pool *pool, const hm_fwd_batch *b, hm_err *err) {
#ifdef HM_HAVE_CUDA
    if (m->gpu) return q3_gpu_forward(m, state, pool, b, err);
#endif
    const hm_fwd_seq seq = {.state = state, .b = *b};
    return q3_forward_multi(m, state, pool, &seq, 1, b->logits, err);
}

const hm_arch hm_arch_qwen3moe = {
    .name = "qwen3moe",
    .load = q3_load,
    .unload = q3_unload,
    .state_open = q3_state_open,
    .state_close = q3_state_close,
    .state_trim = q3_state_trim,
    .forward = q3_forward,
    .forward_multi = q3_forward_multi,
#ifdef HM_HAVE_CUDA
    .gpu_load = q3_gpu_load,
    .gpu_unload = q3_gpu_unload,
    .gpu_multi = true,
#endif
};
