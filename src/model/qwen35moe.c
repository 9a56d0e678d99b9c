/* qwen35moe.c - the Qwen3.5-MoE architecture (Qwen3.5/3.6-35B-A3B, ...): hparams, tensor
 * binding, per-session state. The forward pass is qwen35moe_fwd.c.
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
 * Session state: a KV cache for the attention layers only and, per DeltaNet layer, the conv
 * window (last K-1 inputs) and the delta state S [n_v][d_k][d_v] (f32). A recurrent state cannot
 * be rewound: state_trim keeps everything (n_keep >= positions seen) or resets to empty
 * (n_keep == 0); anything between is HM_ERR_UNSUPPORTED and the caller must re-prefill.
 * With a GPU placement (m->gpu) the state lives on the device instead (qwen35moe_cuda.c): the
 * arch's gpu_load uploads the dense weights, state_open the device state, forward runs there. */
#include "qwen35moe.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_deltanet.h"
#include "core/alloc.h"
#include "kv_f32.h"
#include "quant/quant.h"

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

static void q35_unload(hm_model *m) {
    q35_model *q = m->impl;
    if (!q) return;
    free(q->layers);
    free(q);
    m->impl = NULL;
}

static hm_status q35_load(hm_model *m, hm_err *err) {
    hm_status st;
    q35_model *q = calloc(1, sizeof *q);
    if (!q) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    m->impl = q;

    TRY(hm_model_hp_moe(m, &q->hp, err));
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

    const int64_t E = q->n_embd, hd = q->head_dim, nq = (int64_t)q->n_head * hd, nkv = (int64_t)q->n_head_kv * hd;
    const int64_t vdim = (int64_t)q->n_v * q->d_v;
    TRY(hm_model_bind_vocab(m, E, &q->tok_embd, &q->output, &q->n_vocab, err));
    TRY(hm_model_bind_vec(m, "output_norm.weight", E, true, &q->output_norm, err));

    if (!(q->layers = calloc((size_t)q->n_layer, sizeof *q->layers))) {
        st = hm_errf(err, HM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int32_t il = 0; il < q->n_layer; il++) {
        q35_layer *L = &q->layers[il];
        char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s, il), n)
        L->recurrent = (il + 1) % interval != 0;
        L->slot = L->recurrent ? q->n_recr++ : q->n_attn++;
        TRY(hm_model_bind_vec(m, NAME("attn_norm.weight"), E, true, &L->attn_norm, err));
        TRY(hm_model_bind_vec(m, NAME("post_attention_norm.weight"), E, true, &L->post_norm, err));
        if (L->recurrent) {
            TRY(hm_model_bind_mat(m, NAME("attn_qkv.weight"), E, q->conv_dim, true, &L->wqkv, err));
            TRY(hm_model_bind_mat(m, NAME("attn_gate.weight"), E, vdim, true, &L->wz, err));
            TRY(hm_model_bind_mat(m, NAME("ssm_beta.weight"), E, q->n_v, true, &L->wbeta, err));
            TRY(hm_model_bind_mat(m, NAME("ssm_alpha.weight"), E, q->n_v, true, &L->walpha, err));
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
    }

    hm_model_info_moe(m, &q->hp);
    hm_log_printf(&m->log, HM_LOG_INFO,
                  "qwen35moe: %d layers (%d DeltaNet, %d attention), n_embd %d, heads %d/%d x %d (rope %d), "
                  "DeltaNet k %dx%d v %dx%d conv %d, experts %d (k %d, n_ff %d, shared %d), vocab %d",
                  q->n_layer, q->n_recr, q->n_attn, q->n_embd, q->n_head, q->n_head_kv, q->head_dim, q->n_rot,
                  q->n_k, q->d_k, q->n_v, q->d_v, q->d_conv, q->n_expert, q->n_expert_used, q->n_ff_exp, q->n_ff_sh,
                  q->n_vocab);
    return HM_OK;
fail:
    q35_unload(m);
    return st;
}

/* ---- session state ---- */

static void q35_state_close(void *p) {
    q35_state *s = p;
    if (!s) return;
#ifdef HM_HAVE_CUDA
    q35_gpu_state_close(s);
#endif
    hm_free_aligned(s->rs);
    hm_model_state_free(s->kv, s->kv_scratch, s->act, &s->scratch, &s->route);
    free(s);
}

static hm_status q35_state_open(const hm_model *m, const hm_state_opts *o, void **out, hm_err *err) {
    const q35_model *q = m->impl;
    *out = NULL;
    hm_status st = HM_OK;
    q35_state *s = calloc(1, sizeof *s);
    if (!s) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    s->n_ctx = o->n_ctx;
    s->n_ubatch = o->n_ubatch;
    s->n_threads = o->n_threads;
    s->kv_type = o->kv_type;
#ifdef HM_HAVE_CUDA
    if (m->gpu) { /* the device state instead of the host caches and activations */
        if ((st = q35_gpu_state_open(m, o, s, err)) != HM_OK) goto fail;
        *out = s;
        return HM_OK;
    }
#endif
    const size_t U = (size_t)o->n_ubatch, E = (size_t)q->n_embd, hd = (size_t)q->head_dim;
    const size_t nq = (size_t)q->n_head * hd, nkv = (size_t)q->n_head_kv * hd, K = (size_t)q->n_expert_used;
    const size_t nv = (size_t)q->n_v, vdim = nv * (size_t)q->d_v, cd = (size_t)q->conv_dim;

    s->kv_elem_size = o->kv_type == HM_KV_F32 ? 4 : 2;
    s->kv_layer_elems = (size_t)q->n_head_kv * (size_t)o->n_ctx * hd;
    if (q->n_attn > 0)
        TRY(hm_model_kv_alloc(&s->kv, s->kv_layer_elems, 2u * (size_t)q->n_attn * s->kv_elem_size, o->n_ctx, err));
    s->rs_layer = (size_t)(q->d_conv - 1) * cd + nv * (size_t)q->d_k * (size_t)q->d_v;
    const size_t rs_bytes = s->rs_layer * (size_t)q->n_recr * sizeof(float);
    if (rs_bytes && !(s->rs = hm_malloc_aligned(rs_bytes))) {
        st = hm_errf(err, HM_ERR_NOMEM, "cannot allocate the recurrent state (%.1f MiB)", (double)rs_bytes / (1 << 20));
        goto fail;
    }
    if (s->rs) memset(s->rs, 0, rs_bytes);
    s->rs_total = s->rs_layer * (size_t)q->n_recr;

    const size_t mix = hm_model_max_sz(2 * nq, cd), att = hm_model_max_sz(nq, vdim);
    const size_t sizes[] = {U * E, U * E, U * mix, U * nq, U * nq, U * nkv, U * nkv,
                            U * att, U * cd, U * vdim, U * nv, U * nv, U * nv, U * nv,
                            U * (size_t)q->n_expert, U * K, U * K, U * (size_t)q->n_ff_sh, U * (size_t)q->n_ff_sh,
                            U * E, U, U * E, U};
    float **dst[] = {&s->x, &s->h, &s->mix, &s->q, &s->gate, &s->k, &s->v, &s->att, &s->conv, &s->z, &s->ba,
                     &s->aa, &s->g, &s->beta, &s->rlog, &s->rw, (float **)&s->rid, &s->shg, &s->shu, &s->sho,
                     &s->shs, &s->hout, (float **)&s->pos_out};
    _Static_assert(sizeof sizes / sizeof sizes[0] == sizeof dst / sizeof dst[0], "activation table");
    if ((st = hm_model_carve(&s->act, sizes, dst, sizeof sizes / sizeof sizes[0], err)) != HM_OK) goto fail;
    if (o->kv_type == HM_KV_F32 && q->n_attn > 0)
        TRY(hm_model_att_scratch_alloc(&s->kv_scratch, hm_kv_f32_scratch_floats(o->n_ctx, o->n_threads), err));
    if ((st = hm_moe_route_init(&s->route, q->n_expert, q->n_expert_used, o->n_ubatch, err)) != HM_OK) goto fail;

    size_t in_max = hm_model_max_sz(hm_model_max_sz(E, nq), hm_model_max_sz(vdim, (size_t)q->n_ff_sh));
    size_t sc = hm_cpu_matmul_scratch_size((int64_t)in_max, (int64_t)U, o->n_threads);
    sc = hm_model_max_sz(sc,
                         hm_cpu_attention_scratch_size((int64_t)U, o->n_ctx, q->n_head, q->head_dim, o->n_threads));
    sc = hm_model_max_sz(sc, hm_moe_compute_scratch_size(&s->route, q->n_embd, q->n_ff_exp, o->n_threads));
    if (q->n_recr > 0) sc = hm_model_max_sz(sc, hm_cpu_gated_delta_scratch_size(q->d_k, q->d_v, o->n_threads));
    TRY(hm_model_scratch_alloc(&s->scratch, sc, err));
    *out = s;
    return HM_OK;
fail:
    q35_state_close(s);
    return st;
}

static hm_status q35_state_trim(void *state, int32_t n_keep, hm_err *err) {
    q35_state *s = state;
    if (n_keep >= s->n_pos) return HM_OK; /* nothing to forget */
    if (n_keep == 0) {                    /* back to empty: KV rows are overwritten, the recurrent state is zeroed */
#ifdef HM_HAVE_CUDA
        if (s->dev) {
            hm_status st = q35_gpu_state_reset(s, err);
            if (st != HM_OK) return st;
        }
#endif
        if (s->rs) memset(s->rs, 0, s->rs_total * sizeof(float));
        s->n_pos = 0;
        return HM_OK;
    }
    return hm_errf(err, HM_ERR_UNSUPPORTED,
                   "qwen35moe: cannot trim to %d of %d positions (a recurrent state cannot be rewound; reset "
                   "and evaluate the kept prefix again)", n_keep, s->n_pos);
}

const hm_arch hm_arch_qwen35moe = {
    .name = "qwen35moe",
    .load = q35_load,
    .unload = q35_unload,
    .state_open = q35_state_open,
    .state_close = q35_state_close,
    .state_trim = q35_state_trim,
    .forward = hm_q35_forward,
#ifdef HM_HAVE_CUDA
    .gpu_load = q35_gpu_load,
    .gpu_unload = q35_gpu_unload,
    .gpu_multi = true,
#endif
};
