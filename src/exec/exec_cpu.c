/* exec_cpu.c - the CPU backend of the executor: a session's host state (KV cache for n_ctx
 * positions, every activation for one micro-batch, the MoE route and scratch, all sized at open:
 * a pass allocates nothing) and the forward pass over one or several sequences.
 *
 * Several sequences (forward_multi): the batch is their rows concatenated; sequence i owns rows
 * [off[i], off[i] + cnt[i]) (its b.n rows, then after the last layer's hm_op_out_rows its b.n_out
 * wanted rows). Every row-wise op runs once on the whole batch; only the K/V write and attention go
 * sequence by sequence, into and over that sequence's own cache (and with its own scratch). One
 * sequence is the plain single-session forward: no copies then. A recurrent arch (Gated DeltaNet
 * layers) runs one sequence a pass, its state carried in the session's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_deltanet.h"
#include "backend/cpu/cpu_dsv4.h"
#include "backend/cpu/cpu_gemma.h"
#include "backend/cpu/cpu_mla.h"
#include "core/alloc.h"
#include "exec_impl.h"

/* The CPU pass's own context. */
typedef struct cpu_pass {
    hm_exec_state *s;                            /* the work state: activations and scratch */
    const hm_fwd_seq *seqs;
    int n_seq;
    int32_t off[HM_FWD_MAX_SEQ], cnt[HM_FWD_MAX_SEQ]; /* each sequence's rows now */
    const int32_t *pos_in;                       /* [n] every row's position */
    const int32_t *pos;                          /* [nr] the carried rows' positions */
    const int32_t *tok_in;                       /* [n] every row's token */
    const int32_t *tok;                          /* [nr] the carried rows' tokens (hash routing) */
} cpu_pass;

static cpu_pass *cp(hm_exec *x) { return x->be; }

hm_status hm_exec_cpu_state_open(const hm_model *m, const hm_state_opts *o, hm_exec_state *s, hm_err *err) {
    const hm_exec_model *xm = m->xm;
    const size_t U = (size_t)o->n_ubatch, E = (size_t)xm->n_embd;
    const size_t K = (size_t)(xm->moe.k > 0 ? xm->moe.k : 1), NE = (size_t)(xm->moe.n_expert > 0 ? xm->moe.n_expert : 1);
    hm_status st;
    if (s->kv_bytes && (st = hm_model_kv_alloc(&s->kv, s->kv_bytes, o->kv_type, o->n_ctx, err)) != HM_OK)
        return st;
    s->rs_total = hm_exec_rs_floats(&xm->dn) * (size_t)xm->n_rs_layer;
    if (xm->n_rs_layer > 0) {
        const size_t rs_bytes = s->rs_total * sizeof(float);
        if (!(s->rs = hm_malloc_aligned(rs_bytes)))
            return hm_errf(err, HM_ERR_NOMEM, "cannot allocate the recurrent state (%.1f MiB)",
                           (double)rs_bytes / (1 << 20));
        memset(s->rs, 0, rs_bytes);
    }

    /* activations: one block, each array 64-byte aligned; the arch's buffers first */
    size_t sizes[HM_EXEC_MAX_BUF + 8];
    float **dst[HM_EXEC_MAX_BUF + 8];
    size_t n = 0;
    int64_t widest = 0;
    for (int32_t i = 0; i < xm->n_buf; i++) {
        sizes[n] = U * (size_t)xm->buf_width[i];
        dst[n++] = &s->buf[i];
        if (xm->buf_width[i] > widest) widest = xm->buf_width[i];
    }
    const size_t more[] = {U * NE, U * K, U * K, U * E, U, U, U, U, U};
    float **more_dst[] = {&s->rlog,          &s->rw,           (float **)&s->rid,     &s->hout,
                          (float **)&s->pos_out, (float **)&s->tok_all, (float **)&s->pos_all, (float **)&s->row_out,
                          (float **)&s->tok_out};
    _Static_assert(sizeof more / sizeof more[0] == sizeof more_dst / sizeof more_dst[0], "activation table");
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) {
        sizes[n] = more[i];
        dst[n++] = more_dst[i];
    }
    if ((st = hm_model_carve(&s->act, sizes, dst, n, err)) != HM_OK) return st;

    if (xm->kv_v_is_k && xm->n_kv_layer > 0) { /* MLA's compressed cache: its own attention (cpu_mla.h) */
        const size_t fl = hm_cpu_mla_scratch_floats(xm->n_head, xm->head_dim, o->n_threads);
        if ((st = hm_model_att_scratch_alloc(&s->kv_scratch, fl, err)) != HM_OK) return st;
    } else if (xm->attn_ring) { /* the ring attention's scores, for the longest cache */
        int64_t cap_max = 1;
        for (int32_t il = 0; il < xm->n_layer; il++)
            if (s->kvl[il].cap > cap_max) cap_max = s->kvl[il].cap;
        size_t fl = hm_cpu_attention_ring_scratch_floats(cap_max, o->n_threads);
        for (int32_t il = 0; il < xm->n_layer; il++) /* the tiled prefill path's, per layer shape */
            fl = hm_model_max_sz(fl, hm_cpu_attn_tiled_scratch_floats(xm->n_head, xm->attn_layers[il].n_head_kv,
                                                                      xm->attn_layers[il].head_dim, o->n_threads));
        if ((st = hm_model_att_scratch_alloc(&s->kv_scratch, fl, err)) != HM_OK) return st;
    } else if (o->kv_type != HM_KV_F16 && xm->n_kv_layer > 0) { /* the general cache's, and its tiled path's */
        const size_t fl = hm_model_max_sz(hm_cpu_attention_ring_scratch_floats(o->n_ctx, o->n_threads),
                                          hm_cpu_attn_tiled_scratch_floats(xm->n_head, xm->n_head_kv, xm->head_dim,
                                                                           o->n_threads));
        if ((st = hm_model_att_scratch_alloc(&s->kv_scratch, fl, err)) != HM_OK) return st;
    }
    if (xm->dsv4.hc > 0) { /* DeepSeek-V4: each layer's attention state (cpu_dsv4.h; its KV type and
                              window checked and set by hm_exec_state_open) */
        if (!(s->aux_off = calloc((size_t)xm->n_layer, sizeof *s->aux_off))) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
        size_t total = 0;
        for (int32_t il = 0; il < xm->n_layer; il++) {
            s->aux_off[il] = total;
            total += hm_dsv4_layout(&xm->dsv4.dims, xm->dsv4.ratio[il], o->n_ctx, o->n_ubatch, NULL, NULL);
        }
        s->aux_total = total;
        if (!(s->aux = hm_malloc_aligned(total * sizeof(float))))
            return hm_errf(err, HM_ERR_NOMEM, "cannot allocate the compressed KV state (%.1f MiB)",
                           (double)total * sizeof(float) / (1 << 20));
        memset(s->aux, 0, total * sizeof(float));
    }
    if (xm->moe.n_expert > 0 &&
        (st = hm_moe_route_init(&s->route, xm->moe.n_expert, xm->moe.k, o->n_ubatch, err)) != HM_OK)
        return st;

    /* the matmuls' inputs are the buffers (the widest bounds them), then attention, then the MoE */
    size_t sc = hm_cpu_matmul_scratch_size(widest, (int64_t)U, o->n_threads);
    if (!xm->attn_ring && !xm->kv_v_is_k && xm->n_kv_layer > 0)
        sc = hm_model_max_sz(sc, hm_cpu_attention_scratch_size((int64_t)U, o->n_ctx, xm->n_head, xm->head_dim,
                                                               o->n_threads));
    if (xm->moe.n_expert > 0)
        sc = hm_model_max_sz(sc, hm_moe_compute_scratch_size(&s->route, xm->n_embd, xm->moe.n_ff, o->n_threads));
    if (xm->n_rs_layer > 0)
        sc = hm_model_max_sz(sc, hm_cpu_gated_delta_scratch_size(xm->dn.d_k, xm->dn.d_v, o->n_threads));
    if (xm->dsv4.hc > 0)
        sc = hm_model_max_sz(sc, hm_dsv4_scratch_bytes(&xm->dsv4.dims, (int64_t)U, o->n_ctx, o->n_threads));
    return hm_model_scratch_alloc(&s->scratch, sc, err);
}

/* ---- the ops ---- */

static hm_status c_rmsnorm(hm_exec *x, hm_buf in, const float *w, hm_buf out) {
    hm_cpu_rmsnorm(x->pool, x->buf[in], w, x->buf[out], x->nr, x->xm->n_embd, x->xm->eps);
    return HM_OK;
}

static hm_status c_matmul_n(hm_exec *x, hm_buf in, const hm_mat *const *ws, const hm_buf *outs, int n) {
    hm_scratch *sc = &cp(x)->s->scratch;
    if (n == 1) {
        hm_cpu_matmul(x->pool, ws[0], x->buf[in], x->nr, x->buf[outs[0]], sc);
        return HM_OK;
    }
    float *ys[3];
    for (int i = 0; i < n; i++) ys[i] = x->buf[outs[i]];
    hm_cpu_matmul_n(x->pool, ws, n, x->buf[in], x->nr, ys, sc);
    return HM_OK;
}

static hm_status c_add_rmsnorm(hm_exec *x, hm_buf acc, hm_buf add, const float *w, hm_buf out) {
    const int64_t E = x->xm->n_embd;
    hm_cpu_add(x->pool, x->buf[acc], x->buf[add], x->buf[acc], x->nr * E);
    hm_cpu_rmsnorm(x->pool, x->buf[acc], w, x->buf[out], x->nr, E, x->xm->eps);
    return HM_OK;
}

/* Layer il's K cache of a sequence state; *vc its V cache. */
static char *kv_layer(const hm_exec_model *xm, const hm_exec_state *s, int32_t il, char **vc) {
    const hm_kv_layer *c = &s->kvl[il];
    HM_ASSERT(hm_exec_kv_slot(xm, il) >= 0 && c->bytes > 0);
    char *kc = (char *)s->kv + c->off;
    *vc = xm->kv_v_is_k ? kc : kc + c->bytes;
    return kc;
}

static hm_status c_qk_norm_rope_kv(hm_exec *x, int32_t il, const hm_qk_rope *p) {
    const cpu_pass *c = cp(x);
    const hm_exec_model *xm = x->xm;
    const int nh = xm->n_head, nkv = xm->n_head_kv, hd = xm->head_dim;
    float *q = x->buf[p->q], *k = x->buf[p->k], *v = x->buf[p->v];
    if (p->q_norm) hm_cpu_rmsnorm_heads(x->pool, q, p->q_norm, x->nr, nh, hd, p->eps);
    if (p->k_norm) hm_cpu_rmsnorm_heads(x->pool, k, p->k_norm, x->nr, nkv, hd, p->eps);
    if (p->rope_norm) { /* pairs (2i, 2i + 1) */
        hm_cpu_rope_norm(x->pool, q, x->nr, nh, hd, p->n_rot, c->pos, p->theta, p->rope_ff);
        hm_cpu_rope_norm(x->pool, k, x->nr, nkv, hd, p->n_rot, c->pos, p->theta, p->rope_ff);
    } else if (p->rope_ff) { /* scaled RoPE: the per-pair frequencies */
        hm_gemma_rope_neox(x->pool, q, x->nr, nh, hd, p->n_rot, c->pos, p->theta, p->rope_ff);
        hm_gemma_rope_neox(x->pool, k, x->nr, nkv, hd, p->n_rot, c->pos, p->theta, p->rope_ff);
    } else {
        hm_cpu_rope_neox(x->pool, q, x->nr, nh, hd, p->n_rot, c->pos, p->theta);
        hm_cpu_rope_neox(x->pool, k, x->nr, nkv, hd, p->n_rot, c->pos, p->theta);
    }
    for (int i = 0; i < c->n_seq; i++) { /* each sequence's K/V rows into its own cache */
        const hm_exec_state *si = c->seqs[i].state;
        char *vc, *kc = kv_layer(xm, si, il, &vc);
        const size_t ro = (size_t)c->off[i] * (size_t)(nkv * hd);
        hm_model_kv_write(x->pool, si->kv_type, kc, vc, si->n_ctx, nkv, hd, k + ro, v + ro, c->cnt[i],
                          c->seqs[i].b.pos);
    }
    return HM_OK;
}

static hm_status c_out_rows(hm_exec *x, int32_t il, const hm_buf *bufs, const int64_t *widths, int n) {
    (void)il;
    cpu_pass *c = cp(x);
    hm_exec_state *s = c->s;
    /* only the rows whose logits are wanted matter from here on (as llama.cpp's inp_out_ids);
     * row_out ascends, so compacting forward is safe */
    if (x->n_out == 0) {
        x->done = true;
        return HM_OK;
    }
    for (int64_t i = 0; i < x->n_out; i++) {
        s->pos_out[i] = c->pos_in[s->row_out[i]];
        s->tok_out[i] = c->tok_in[s->row_out[i]];
    }
    for (int i = 0; i < n; i++)
        hm_model_compact_rows(x->buf[bufs[i]], widths ? widths[i] : x->xm->buf_width[bufs[i]], s->row_out,
                              (int32_t)x->n_out);
    x->nr = x->n_out;
    c->pos = s->pos_out;
    c->tok = s->tok_out;
    for (int i = 0, o = 0; i < c->n_seq; o += c->cnt[i], i++) {
        c->off[i] = o;
        c->cnt[i] = c->seqs[i].b.n_out;
    }
    return HM_OK;
}

static hm_status c_attention(hm_exec *x, int32_t il, hm_buf qb, hm_buf outb, float scale) {
    const cpu_pass *c = cp(x);
    const hm_exec_model *xm = x->xm;
    const int nh = xm->n_head, nkv = xm->n_head_kv, hd = xm->head_dim;
    for (int i = 0; i < c->n_seq; i++) { /* each sequence's queries over its own cache */
        hm_exec_state *si = c->seqs[i].state;
        if (!c->cnt[i]) continue;
        char *vc, *kc = kv_layer(xm, si, il, &vc);
        if (xm->kv_v_is_k) { /* MLA's compressed one-head cache */
            const size_t ro = (size_t)c->off[i] * (size_t)(nh * hd);
            hm_cpu_mla_attention(x->pool, si->kv_row_type, x->buf[qb] + ro, c->cnt[i], c->pos + c->off[i], kc, nh, hd,
                                 scale, x->buf[outb] + ro, si->kv_scratch);
            continue;
        }
        const size_t ro = (size_t)c->off[i] * (size_t)(nh * hd);
        hm_model_attention(x->pool, si->kv_type, x->buf[qb] + ro, c->cnt[i], c->pos + c->off[i], kc, vc, si->n_ctx,
                           nh, nkv, hd, scale, x->buf[outb] + ro, si->kv_scratch, &si->scratch);
    }
    return HM_OK;
}

/* a[r][i] += b[i] over rows x width */
static void add_rows(float *a, const float *b, int64_t rows, int64_t width) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < width; i++) a[r * width + i] += b[i];
}

static hm_status c_add_bias(hm_exec *x, hm_buf a, const float *b, int64_t width) {
    add_rows(x->buf[a], b, x->nr, width);
    return HM_OK;
}

static hm_status c_route(hm_exec *x, int32_t il, hm_buf in) {
    hm_exec_state *s = cp(x)->s;
    const hm_exec_model *xm = x->xm;
    const hm_moe_layer *L = &xm->moe_layers[il];
    hm_cpu_matmul(x->pool, L->router, x->buf[in], x->nr, s->rlog, &s->scratch);
    if (L->router_bias) add_rows(s->rlog, L->router_bias, x->nr, xm->moe.n_expert);
    const hm_route_spec sp = hm_moe_route_spec(&xm->moe);
    hm_moe_route_rows(x->m, il, &s->route, &sp, s->rlog, x->nr, L->score_bias, L->hash, cp(x)->tok, L->expert_scale,
                      s->rid, s->rw);
    return HM_OK;
}

static hm_status c_experts(hm_exec *x, int32_t il, hm_buf in, hm_buf out) {
    hm_exec_state *s = cp(x)->s;
    const hm_exec_model *xm = x->xm;
    const hm_moe_layer *L = &xm->moe_layers[il];
    const hm_mat *next_router = il + 1 < xm->n_layer ? xm->moe_layers[il + 1].router : NULL;
    return hm_moe_forward(x->m, x->pool, L->experts, &s->route, x->buf[in], x->buf[out], &s->scratch, next_router,
                          x->err);
}

static float sigmoidf(float v) { return 1.0f / (1.0f + expf(-v)); }
static float softplusf(float v) { return v > 20.0f ? v : log1pf(expf(v)); } /* torch's threshold */

static hm_status c_split_gate(hm_exec *x, hm_buf mix, hm_buf qb, hm_buf gate) {
    const int nh = x->xm->n_head, hd = x->xm->head_dim;
    const int64_t nq = (int64_t)nh * hd;
    const float *m = x->buf[mix];
    float *q = x->buf[qb], *g = x->buf[gate];
    for (int64_t t = 0; t < x->nr; t++) /* per head [q | gate] */
        for (int h = 0; h < nh; h++) {
            const float *src = m + (size_t)t * (size_t)(2 * nq) + (size_t)h * (size_t)(2 * hd);
            memcpy(q + (size_t)(t * nq + h * hd), src, (size_t)hd * sizeof(float));
            memcpy(g + (size_t)(t * nq + h * hd), src + hd, (size_t)hd * sizeof(float));
        }
    return HM_OK;
}

static hm_status c_sigmoid_mul(hm_exec *x, hm_buf a, hm_buf gate, int64_t width) {
    float *y = x->buf[a];
    const float *g = x->buf[gate];
    for (int64_t i = 0; i < x->nr * width; i++) y[i] *= sigmoidf(g[i]);
    return HM_OK;
}

static hm_status c_swiglu(hm_exec *x, hm_buf g, hm_buf u, hm_buf out, int64_t width) {
    hm_cpu_swiglu(x->pool, x->buf[g], x->buf[u], x->buf[out], x->nr * width);
    return HM_OK;
}

static hm_status c_add_sigmoid_scaled(hm_exec *x, hm_buf acc, hm_buf yb, hm_buf sb) {
    const int64_t E = x->xm->n_embd;
    for (int64_t t = 0; t < x->nr; t++) {
        const float gsh = sigmoidf(x->buf[sb][t]);
        float *xr = x->buf[acc] + (size_t)(t * E);
        const float *so = x->buf[yb] + (size_t)(t * E);
        for (int64_t i = 0; i < E; i++) xr[i] += gsh * so[i];
    }
    return HM_OK;
}

static hm_status c_deltanet(hm_exec *x, int32_t il, hm_buf io, const hm_deltanet *p) {
    hm_exec_state *s = cp(x)->s;
    const hm_deltanet_spec *d = &x->xm->dn;
    hm_pool *pool = x->pool;
    const int64_t n = x->nr, cd = d->conv_dim, nv = d->n_v, vdim = nv * d->d_v, qk = (int64_t)d->n_k * d->d_k;
    const int32_t slot = hm_exec_rs_slot(x->xm, il);
    HM_ASSERT(slot >= 0);
    float *rs = s->rs + (size_t)slot * hm_exec_rs_floats(d);
    float *conv_state = rs, *delta_state = rs + (size_t)(d->d_conv - 1) * (size_t)cd;
    float *mix = x->buf[p->mix], *conv = x->buf[p->conv], *z = x->buf[p->z], *ba = x->buf[p->ba];
    float *aa = x->buf[p->aa], *g = x->buf[p->g], *beta = x->buf[p->beta], *att = x->buf[p->att];

    const hm_mat *ws[4] = {p->wqkv, p->wz, p->wbeta, p->walpha};
    float *const ys[4] = {mix, z, ba, aa};
    HM_ASSERT(p->grouped == (p->walpha == NULL));
    hm_cpu_matmul_n(pool, ws, p->grouped ? 3 : 4, x->buf[io], n, ys, &s->scratch);
    hm_cpu_ssm_conv(pool, mix, cd, n, cd, p->conv_w, d->d_conv, conv_state, conv);
    hm_cpu_l2norm_heads(pool, conv, cd, n, d->n_k, d->d_k, p->eps, 1.0f / sqrtf((float)d->d_k));
    hm_cpu_l2norm_heads(pool, conv + qk, cd, n, d->n_k, d->d_k, p->eps, 1.0f);
    const int64_t grp = nv / d->n_k; /* grouped: each key head's betas, then its alphas, in rows of 2 nv */
    for (int64_t t = 0; t < n; t++)
        for (int64_t h = 0; h < nv; h++) {
            const size_t i = (size_t)(t * nv + h);
            const size_t ib = p->grouped ? (size_t)(t * 2 * nv + h / grp * 2 * grp + h % grp) : i;
            const float a = p->grouped ? ba[ib + (size_t)grp] : aa[i];
            g[i] = p->ssm_a[h] * softplusf(a + p->dt_bias[h]);
            beta[i] = sigmoidf(ba[ib]);
        }
    hm_cpu_gated_delta(pool, conv, conv + qk, cd, conv + 2 * qk, cd, g, beta, n, d->n_k, d->n_v, p->grouped, d->d_k,
                       d->d_v, delta_state, att, &s->scratch);
    /* gated RMSNorm per value head: rmsnorm(o) * ssm_norm * silu(z) */
    hm_cpu_rmsnorm(pool, att, p->ssm_norm, att, n * nv, d->d_v, p->eps);
    hm_cpu_swiglu(pool, z, att, att, n * vdim);
    hm_cpu_matmul(pool, p->wout, att, n, x->buf[io], &s->scratch);
    return HM_OK;
}

static hm_status c_add(hm_exec *x, hm_buf acc, hm_buf add) {
    hm_cpu_add(x->pool, x->buf[acc], x->buf[add], x->buf[acc], x->nr * x->xm->n_embd);
    return HM_OK;
}

static hm_status c_scale(hm_exec *x, hm_buf a, float sc, int64_t width) {
    hm_cpu_scale(x->pool, x->buf[a], sc, x->buf[a], x->nr * width);
    return HM_OK;
}

static hm_status c_zero(hm_exec *x, hm_buf a, int64_t width) {
    memset(x->buf[a], 0, (size_t)(x->nr * width) * sizeof(float));
    return HM_OK;
}

static hm_status c_copy(hm_exec *x, hm_buf src, hm_buf dst, int64_t width) {
    memcpy(x->buf[dst], x->buf[src], (size_t)(x->nr * width) * sizeof(float));
    return HM_OK;
}

static hm_status c_concat(hm_exec *x, hm_buf a, int64_t wa, hm_buf b, int64_t wb, hm_buf out) {
    const float *pa = x->buf[a], *pb = x->buf[b];
    float *po = x->buf[out];
    HM_ASSERT(out != a && out != b);
    for (int64_t r = 0; r < x->nr; r++) {
        memcpy(po + (size_t)(r * (wa + wb)), pa + (size_t)(r * wa), (size_t)wa * sizeof(float));
        memcpy(po + (size_t)(r * (wa + wb) + wa), pb + (size_t)(r * wb), (size_t)wb * sizeof(float));
    }
    return HM_OK;
}

static hm_status c_geglu(hm_exec *x, hm_buf g, hm_buf u, hm_buf out, int64_t width) {
    hm_gemma_gelu_mul(x->pool, x->buf[g], x->buf[u], x->buf[out], x->nr * width);
    return HM_OK;
}

/* The ring ops run one sequence a pass (an arch with them has no forward_multi). */
static hm_status c_attn_in_ring(hm_exec *x, int32_t il, const hm_ring_in *p) {
    const cpu_pass *c = cp(x);
    HM_ASSERT(c->n_seq == 1);
    const hm_exec_state *s = c->seqs[0].state;
    const hm_attn_layer *a = &x->xm->attn_layers[il];
    const int nh = x->xm->n_head, nkv = a->n_head_kv, hd = a->head_dim;
    float *q = x->buf[p->q], *k = x->buf[p->k], *v = x->buf[p->v];
    char *vc, *kc = kv_layer(x->xm, s, il, &vc);
    if (!p->no_norm) {
        hm_cpu_rmsnorm_heads(x->pool, q, p->q_norm, x->nr, nh, hd, p->eps);
        hm_cpu_rmsnorm_heads(x->pool, k, p->k_norm, x->nr, nkv, hd, p->eps);
        hm_cpu_rmsnorm(x->pool, v, NULL, v, x->nr * nkv, hd, p->eps);
    }
    hm_gemma_rope_neox(x->pool, q, x->nr, nh, hd, p->n_rot, c->pos, p->theta, p->rope_ff);
    hm_gemma_rope_neox(x->pool, k, x->nr, nkv, hd, p->n_rot, c->pos, p->theta, p->rope_ff);
    hm_cpu_kv_write_ring(x->pool, kc, vc, s->kv_row_type, s->kvl[il].cap, nkv, hd, k, v, x->nr, c->pos);
    return HM_OK;
}

static hm_status c_attention_ring(hm_exec *x, int32_t il, hm_buf qb, hm_buf outb, float scale) {
    const cpu_pass *c = cp(x);
    HM_ASSERT(c->n_seq == 1);
    const hm_exec_state *s = c->seqs[0].state;
    const hm_attn_layer *a = &x->xm->attn_layers[il];
    char *vc, *kc = kv_layer(x->xm, s, il, &vc);
    hm_cpu_attention_ring_sinks(x->pool, x->buf[qb], x->nr, c->pos, kc, vc, s->kv_row_type, s->kvl[il].cap,
                                a->window, x->xm->n_head, a->n_head_kv, a->head_dim, scale, a->sinks, x->buf[outb],
                                s->kv_scratch);
    return HM_OK;
}

static hm_status c_rmsnorm_w(hm_exec *x, hm_buf in, const float *w, hm_buf out, int64_t width) {
    hm_cpu_rmsnorm(x->pool, x->buf[in], w, x->buf[out], x->nr, width, x->xm->eps);
    return HM_OK;
}

static hm_status c_mla_in(hm_exec *x, int32_t il, const hm_mla_in *p) {
    const cpu_pass *c = cp(x);
    const int hd = p->kv_lora + p->n_rot;
    float *kv = x->buf[p->kv];
    HM_ASSERT(x->xm->kv_v_is_k && x->xm->n_head_kv == 1 && x->xm->head_dim == hd);
    hm_cpu_mla_in(x->pool, x->buf[p->q], x->buf[p->qa], kv, x->nr, x->xm->n_head, p->nope, p->kv_lora, p->n_rot, c->pos,
                  p->theta, p->rope_ff, p->kv_norm, p->eps);
    for (int i = 0; i < c->n_seq; i++) { /* each sequence's rows into its own cache (V = K: one write) */
        const hm_exec_state *si = c->seqs[i].state;
        char *vc, *kc = kv_layer(x->xm, si, il, &vc);
        hm_cpu_mla_kv_write(x->pool, si->kv_row_type, kc, hd, kv + (size_t)c->off[i] * (size_t)hd, c->cnt[i],
                            c->seqs[i].b.pos);
    }
    return HM_OK;
}

static hm_status c_matmul_heads(hm_exec *x, const hm_mat_heads *w, const hm_heads_io *io) {
    hm_cpu_matmul_heads(x->pool, &w->w, w->nb2, w->n_head, x->buf[io->in], io->in_stride, x->nr, x->buf[io->out],
                        io->out_stride, x->buf[io->tin], x->buf[io->tout], &cp(x)->s->scratch);
    return HM_OK;
}

/* ---- DeepSeek-V4 (one sequence a pass, as the ring ops) ---- */

static hm_status c_hc_expand(hm_exec *x, hm_buf io) {
    hm_dsv4_hc_expand(x->buf[io], x->nr, x->xm->n_embd, x->xm->dsv4.hc);
    return HM_OK;
}

static hm_status c_hc_pre(hm_exec *x, hm_buf in, const hm_hc *p, hm_buf norm, hm_buf mix, hm_buf out, bool head) {
    const hm_dsv4_spec *d = &x->xm->dsv4;
    const int64_t E = x->xm->n_embd, hc = d->hc, w = head ? hc : (2 + hc) * hc;
    hm_cpu_rmsnorm(x->pool, x->buf[in], NULL, x->buf[norm], x->nr, hc * E, x->xm->eps);
    hm_cpu_matmul(x->pool, p->fn, x->buf[norm], x->nr, x->buf[mix], &cp(x)->s->scratch);
    hm_dsv4_hc_mix(x->buf[mix], x->nr, (int)hc, head, p->scale, p->base, d->hc_iters, d->hc_eps);
    hm_dsv4_hc_reduce(x->pool, x->buf[in], x->buf[mix], w, x->nr, E, (int)hc, x->buf[out]);
    return HM_OK;
}

static hm_status c_hc_post(hm_exec *x, hm_buf f, hm_buf res, hm_buf mix, hm_buf out) {
    hm_dsv4_hc_post(x->pool, x->buf[f], x->buf[res], x->buf[mix], x->nr, x->xm->n_embd, x->xm->dsv4.hc,
                    x->buf[out]);
    return HM_OK;
}

static hm_status c_dsv4_attn(hm_exec *x, int32_t il, const hm_dsv4_attn *p) {
    const cpu_pass *c = cp(x);
    HM_ASSERT(c->n_seq == 1);
    hm_exec_state *s = c->seqs[0].state;
    const hm_dsv4_spec *d = &x->xm->dsv4;
    hm_dsv4_state st;
    hm_dsv4_layout(&d->dims, d->ratio[il], s->n_ctx, s->n_ubatch, s->aux + s->aux_off[il], &st);
    hm_dsv4_attention(x->pool, &d->dims, &p->w, &st, x->xm->n_embd, x->buf[p->h], x->buf[p->qr], x->buf[p->kv],
                 x->buf[p->q], x->buf[p->out], x->buf[p->ca], x->buf[p->cb], x->buf[p->ia], x->buf[p->ib],
                 x->buf[p->iq], x->nr, c->pos, &cp(x)->s->scratch);
    return HM_OK;
}

static hm_status c_swiglu_clamp(hm_exec *x, hm_buf g, hm_buf u, hm_buf out, int64_t width, float limit) {
    hm_dsv4_swiglu_clamp(x->pool, x->buf[g], x->buf[u], x->buf[out], x->nr * width, limit);
    return HM_OK;
}

static const hm_exec_ops cpu_ops = {
    .rmsnorm = c_rmsnorm,
    .matmul_n = c_matmul_n,
    .add_rmsnorm = c_add_rmsnorm,
    .qk_norm_rope_kv = c_qk_norm_rope_kv,
    .out_rows = c_out_rows,
    .attention = c_attention,
    .route = c_route,
    .experts = c_experts,
    .split_gate = c_split_gate,
    .sigmoid_mul = c_sigmoid_mul,
    .swiglu = c_swiglu,
    .add_sigmoid_scaled = c_add_sigmoid_scaled,
    .deltanet = c_deltanet,
    .add = c_add,
    .scale = c_scale,
    .zero = c_zero,
    .copy = c_copy,
    .geglu = c_geglu,
    .attn_in_ring = c_attn_in_ring,
    .attention_ring = c_attention_ring,
    .rmsnorm_w = c_rmsnorm_w,
    .mla_in = c_mla_in,
    .matmul_heads = c_matmul_heads,
    .hc_expand = c_hc_expand,
    .hc_pre = c_hc_pre,
    .hc_post = c_hc_post,
    .dsv4_attn = c_dsv4_attn,
    .swiglu_clamp = c_swiglu_clamp,
    .add_bias = c_add_bias,
    .concat = c_concat,
};

/* ---- the pass ---- */

hm_status hm_exec_cpu_forward(const hm_model *m, hm_exec_state *work, hm_pool *pool, const hm_fwd_seq *seqs,
                              int n_seq, float *logits, hm_err *err) {
    const hm_exec_model *xm = m->xm;
    hm_exec_state *s = work;
    HM_ASSERT(n_seq > 0 && n_seq <= HM_FWD_MAX_SEQ);
    cpu_pass c = {.s = s, .seqs = seqs, .n_seq = n_seq};
    int64_t n = 0, n_out = 0;
    for (int i = 0; i < n_seq; i++) {
        const hm_fwd_batch *b = &seqs[i].b;
        const hm_exec_state *si = seqs[i].state;
        HM_ASSERT(b->n > 0 && b->n <= si->n_ubatch && b->n_out <= b->n && n + b->n <= s->n_ubatch);
        HM_ASSERT(b->pos[b->n - 1] < si->n_ctx && si->n_threads == s->n_threads);
        c.off[i] = (int32_t)n;
        c.cnt[i] = b->n;
        if (n_seq > 1) {
            memcpy(s->tok_all + n, b->tokens, (size_t)b->n * sizeof(int32_t));
            memcpy(s->pos_all + n, b->pos, (size_t)b->n * sizeof(int32_t));
        }
        for (int32_t j = 0; j < b->n_out; j++) s->row_out[n_out++] = (int32_t)n + b->out_rows[j];
        n += b->n;
    }
    /* hidden rows (one sequence): the last layer keeps every row, the wanted ones get logits */
    float *hidden = seqs[0].b.hidden;
    HM_ASSERT(!hidden || n_seq == 1);
    const int64_t n_want = n_out;
    if (hidden) n_out = n;
    const int32_t *tokens = n_seq > 1 ? s->tok_all : seqs[0].b.tokens;
    c.pos_in = n_seq > 1 ? s->pos_all : seqs[0].b.pos;
    c.pos = c.pos_in;
    c.tok_in = c.tok = tokens;

    hm_exec x = {.m = m, .xm = xm, .ops = &cpu_ops, .pool = pool, .err = err, .n = n, .nr = n, .n_out = n_out,
                 .be = &c};
    x.prof = work->prof;
    memcpy(x.buf, s->buf, sizeof x.buf);
    hm_cpu_get_rows(pool, xm->tok_embd, tokens, n, x.buf[HM_BUF_X]);
    if (xm->embd_scale) hm_cpu_scale(pool, x.buf[HM_BUF_X], xm->embd_scale, x.buf[HM_BUF_X], n * xm->n_embd);
    if (seqs[0].b.inject) {
        HM_ASSERT(n_seq == 1 && xm->inject_buf > 0);
        memcpy(x.buf[xm->inject_buf], seqs[0].b.inject, (size_t)(n * xm->inject_width) * sizeof(float));
    }
    for (int32_t il = 0; il < xm->n_layer && !x.done; il++) {
        hm_status st = hm_exec_layer(&x, il);
        if (st != HM_OK) return st;
    }
    if (hidden) {
        /* every row normed into hout (= hidden), the wanted rows' logits (contiguous from the first) */
        HM_ASSERT(x.nr == n);
        hm_cpu_rmsnorm(pool, x.buf[HM_BUF_X], xm->output_norm, s->hout, n, xm->n_embd, xm->eps);
        memcpy(hidden, s->hout, (size_t)(n * xm->n_embd) * sizeof(float));
        if (n_want > 0) {
            HM_ASSERT(logits);
            hm_cpu_matmul(pool, xm->output, s->hout + (size_t)s->row_out[0] * (size_t)xm->n_embd, n_want, logits,
                          &s->scratch);
            if (xm->softcap > 0) hm_gemma_softcap(pool, logits, n_want * xm->n_vocab, xm->softcap);
        }
        return HM_OK;
    }
    if (n_out > 0) {
        /* x rows 0..n_out-1 are the wanted rows now (compacted, or all rows in order) */
        HM_ASSERT(x.nr == n_out && logits);
        hm_model_logits(pool, x.buf[HM_BUF_X], xm->output_norm, xm->eps, xm->output, n_out, xm->n_embd, s->hout,
                        logits, &s->scratch);
        if (xm->softcap > 0) hm_gemma_softcap(pool, logits, n_out * xm->n_vocab, xm->softcap);
    }
    return HM_OK;
}
