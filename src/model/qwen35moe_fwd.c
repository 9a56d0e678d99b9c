/* qwen35moe_fwd.c - the Qwen3.5-MoE forward pass over one micro-batch (the math is in
 * qwen35moe.c's header comment).
 *
 * DeltaNet layers run every token of the batch through the causal conv and the gated delta rule
 * (hm_cpu_gated_delta: chunks of 64 tokens in matrix form for a prefill batch, the per-token
 * recurrence for decode and short batches) and leave their conv window and delta state for the
 * next call. In the last layer only the rows whose logits are wanted go
 * on past the token mixer (attention: past the K/V write; DeltaNet: past the state update), as in
 * qwen3moe.c. Nothing here allocates. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_deltanet.h"
#include "qwen35moe.h"

static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
static float softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); } /* torch's threshold */

/* DeltaNet token mixer: h [n, E] in -> h [n, E] out; updates the layer's conv and delta state. */
static void deltanet(const q35_model *q, const q35_layer *L, q35_state *s, hm_pool *pool, int64_t n) {
    const int64_t cd = q->conv_dim, nv = q->n_v, vdim = nv * q->d_v, qk = (int64_t)q->n_k * q->d_k;
    float *rs = s->rs + (size_t)L->slot * s->rs_layer;
    float *conv_state = rs, *delta_state = rs + (size_t)(q->d_conv - 1) * (size_t)cd;

    const hm_mat *ws[4] = {&L->wqkv, &L->wz, &L->wbeta, &L->walpha};
    float *const ys[4] = {s->mix, s->z, s->ba, s->aa};
    hm_cpu_matmul_n(pool, ws, 4, s->h, n, ys, &s->scratch);
    hm_cpu_ssm_conv(pool, s->mix, cd, n, cd, L->conv_w, q->d_conv, conv_state, s->conv);
    hm_cpu_l2norm_heads(pool, s->conv, cd, n, q->n_k, q->d_k, q->eps, 1.0f / sqrtf((float)q->d_k));
    hm_cpu_l2norm_heads(pool, s->conv + qk, cd, n, q->n_k, q->d_k, q->eps, 1.0f);
    for (int64_t t = 0; t < n; t++)
        for (int64_t h = 0; h < nv; h++) {
            const size_t i = (size_t)(t * nv + h);
            s->g[i] = L->ssm_a[h] * softplusf(s->aa[i] + L->dt_bias[h]);
            s->beta[i] = sigmoidf(s->ba[i]);
        }
    hm_cpu_gated_delta(pool, s->conv, s->conv + qk, cd, s->conv + 2 * qk, cd, s->g, s->beta, n, q->n_k, q->n_v,
                       q->d_k, q->d_v, delta_state, s->att, &s->scratch);
    /* gated RMSNorm per value head: rmsnorm(o) * ssm_norm * silu(z) */
    hm_cpu_rmsnorm(pool, s->att, L->ssm_norm, s->att, n * nv, q->d_v, q->eps);
    hm_cpu_swiglu(pool, s->z, s->att, s->att, n * vdim);
    hm_cpu_matmul(pool, &L->wout, s->att, n, s->h, &s->scratch);
}

hm_status hm_q35_forward(const hm_model *m, void *state, hm_pool *pool, const hm_fwd_batch *b, hm_err *err) {
    const q35_model *q = m->impl;
    q35_state *s = state;
    const int64_t n = b->n, E = q->n_embd;
    const int hd = q->head_dim, nh = q->n_head, nkv = q->n_head_kv;
    const int64_t nq = (int64_t)nh * hd;
    HM_ASSERT(n > 0 && n <= s->n_ubatch && b->n_out <= n);
    HM_ASSERT(b->pos[n - 1] < s->n_ctx);
    if (b->pos[0] != s->n_pos)
        return hm_errf(err, HM_ERR_ARG, "qwen35moe: batch starts at position %d but the recurrent state holds %d",
                       b->pos[0], s->n_pos);
#ifdef HM_HAVE_CUDA
    if (m->gpu) { /* the device forward (qwen35moe_cuda.c) */
        hm_status st = q35_gpu_forward(m, s, pool, b, err);
        if (st == HM_OK) s->n_pos = b->pos[n - 1] + 1;
        return st;
    }
#endif
    const float scale = 1.0f / sqrtf((float)hd);

    hm_cpu_get_rows(pool, &q->tok_embd, b->tokens, n, s->x);
    int64_t nr = n;
    const int32_t *pos = b->pos;
    for (int32_t il = 0; il < q->n_layer; il++) {
        const q35_layer *L = &q->layers[il];
        const bool last = il == q->n_layer - 1 && b->n_out < n;
        hm_cpu_rmsnorm(pool, s->x, L->attn_norm, s->h, n, E, q->eps);
        if (L->recurrent) {
            deltanet(q, L, s, pool, n);
            if (last) {
                if (b->n_out == 0) break;
                hm_model_compact_rows(s->x, E, b->out_rows, b->n_out);
                hm_model_compact_rows(s->h, E, b->out_rows, b->n_out);
                nr = b->n_out;
            }
        } else {
            char *vc, *kc = hm_model_kv_layer(s->kv, s->kv_layer_elems, s->kv_elem_size, L->slot, &vc);
            const hm_mat *ws[3] = {&L->wq, &L->wk, &L->wv};
            float *const ys[3] = {s->mix, s->k, s->v};
            hm_cpu_matmul_n(pool, ws, 3, s->h, n, ys, &s->scratch);
            for (int64_t t = 0; t < n; t++) /* split per head [q | gate] */
                for (int h = 0; h < nh; h++) {
                    const float *src = s->mix + (size_t)t * (size_t)(2 * nq) + (size_t)h * (size_t)(2 * hd);
                    memcpy(s->q + (size_t)(t * nq + h * hd), src, (size_t)hd * sizeof(float));
                    memcpy(s->gate + (size_t)(t * nq + h * hd), src + hd, (size_t)hd * sizeof(float));
                }
            hm_cpu_rmsnorm_heads(pool, s->q, L->q_norm, n, nh, hd, q->eps);
            hm_cpu_rmsnorm_heads(pool, s->k, L->k_norm, n, nkv, hd, q->eps);
            hm_cpu_rope_neox(pool, s->q, n, nh, hd, q->n_rot, b->pos, q->theta);
            hm_cpu_rope_neox(pool, s->k, n, nkv, hd, q->n_rot, b->pos, q->theta);
            hm_model_kv_write(pool, s->kv_type, kc, vc, s->n_ctx, nkv, hd, s->k, s->v, n, b->pos);
            if (last) {
                if (b->n_out == 0) break;
                for (int32_t i = 0; i < b->n_out; i++) s->pos_out[i] = b->pos[b->out_rows[i]];
                hm_model_compact_rows(s->q, nq, b->out_rows, b->n_out);
                hm_model_compact_rows(s->gate, nq, b->out_rows, b->n_out);
                hm_model_compact_rows(s->x, E, b->out_rows, b->n_out);
                nr = b->n_out;
                pos = s->pos_out;
            }
            hm_model_attention(pool, s->kv_type, s->q, nr, pos, kc, vc, s->n_ctx, nh, nkv, hd, scale, s->att,
                               s->kv_scratch, &s->scratch);
            for (int64_t i = 0; i < nr * nq; i++) s->att[i] *= sigmoidf(s->gate[i]);
            hm_cpu_matmul(pool, &L->wo, s->att, nr, s->h, &s->scratch);
        }
        hm_cpu_add(pool, s->x, s->h, s->x, nr * E);

        /* MoE block: the dense shared expert (sigmoid-gated) and the routed units, both into x */
        hm_cpu_rmsnorm(pool, s->x, L->post_norm, s->h, nr, E, q->eps);
        const hm_mat *ws[4] = {&L->router, &L->sh_gate, &L->sh_up, &L->sh_inp};
        float *const ys[4] = {s->rlog, s->shg, s->shu, s->shs};
        hm_cpu_matmul_n(pool, ws, 4, s->h, nr, ys, &s->scratch);
        hm_cpu_swiglu(pool, s->shg, s->shu, s->shg, nr * q->n_ff_sh);
        hm_cpu_matmul(pool, &L->sh_down, s->shg, nr, s->sho, &s->scratch);
        for (int64_t t = 0; t < nr; t++) {
            const float gsh = sigmoidf(s->shs[t]);
            float *xr = s->x + (size_t)(t * E);
            const float *so = s->sho + (size_t)(t * E);
            for (int64_t i = 0; i < E; i++) xr[i] += gsh * so[i];
        }
        hm_moe_route_rows(m, il, &s->route, s->rlog, nr, q->n_expert, q->n_expert_used, NULL, s->rid, s->rw);
        hm_status mst = hm_moe_forward(m, pool, &L->moe, &s->route, s->h, s->x, &s->scratch,
                                       il + 1 < q->n_layer ? &q->layers[il + 1].router : NULL, err);
        if (mst != HM_OK) return mst;
    }
    s->n_pos = b->pos[n - 1] + 1;
    if (b->n_out > 0) {
        HM_ASSERT(nr == b->n_out);
        hm_model_logits(pool, s->x, q->output_norm, q->eps, &q->output, b->n_out, E, s->hout, b->logits, &s->scratch);
    }
    return HM_OK;
}
