/* exec.c - the executor's backend-neutral part: the ops a layer description calls, dispatched to
 * the pass's backend (exec_impl.h), and the session entry points hm_arch points at, which pick the
 * CPU or the GPU path by the model's placement. With HOTMOE_OP_PROFILE=1 in the environment each
 * session times its ops (the backend synchronised around each one: slower, for finding where a
 * pass's time goes) and prints the table to stderr when it closes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/timer.h"
#include "quant/quant.h"

#include "exec_impl.h"

static const char *const op_names[HM_OPP_COUNT] = {
#define X(name) #name,
    HM_OPP_LIST(X)
#undef X
};

static int64_t prof_mark(hm_exec *x) {
    if (x->ops->sync) x->ops->sync(x);
    return hm_time_us();
}

/* Run an op's backend call; timed (synchronised before and after) when the pass profiles. */
#define RUN(op, call)                                                              \
    do {                                                                           \
        if (!x->prof) return (call);                                               \
        const int64_t t0_ = prof_mark(x);                                          \
        const hm_status st_ = (call);                                              \
        x->prof->us[HM_OPP_##op] += prof_mark(x) - t0_;                            \
        x->prof->calls[HM_OPP_##op]++;                                             \
        return st_;                                                                \
    } while (0)

hm_status hm_op_rmsnorm(hm_exec *x, hm_buf in, const float *w, hm_buf out) {
    RUN(rmsnorm, x->ops->rmsnorm(x, in, w, out));
}

hm_status hm_op_matmul_n(hm_exec *x, hm_buf in, const hm_mat *const *ws, const hm_buf *outs, int n) {
    HM_ASSERT(n >= 1 && n <= 4);
    RUN(matmul_n, x->ops->matmul_n(x, in, ws, outs, n));
}

hm_status hm_op_add_rmsnorm(hm_exec *x, hm_buf acc, hm_buf add, const float *w, hm_buf out) {
    RUN(add_rmsnorm, x->ops->add_rmsnorm(x, acc, add, w, out));
}

hm_status hm_op_qk_norm_rope_kv(hm_exec *x, int32_t il, const hm_qk_rope *p) {
    RUN(qk_norm_rope_kv, x->ops->qk_norm_rope_kv(x, il, p));
}

hm_status hm_op_out_rows_w(hm_exec *x, int32_t il, const hm_buf *bufs, const int64_t *widths, int n) {
    if (il != x->xm->n_layer - 1 || x->n_out >= x->n) return HM_OK;
    RUN(out_rows, x->ops->out_rows(x, il, bufs, widths, n));
}

hm_status hm_op_out_rows(hm_exec *x, int32_t il, const hm_buf *bufs, int n) {
    return hm_op_out_rows_w(x, il, bufs, NULL, n);
}

bool hm_exec_done(const hm_exec *x) { return x->done; }

hm_status hm_op_attention(hm_exec *x, int32_t il, hm_buf q, hm_buf out, float scale) {
    RUN(attention, x->ops->attention(x, il, q, out, scale));
}

hm_status hm_op_route(hm_exec *x, int32_t il, hm_buf in) { RUN(route, x->ops->route(x, il, in)); }

hm_status hm_op_experts(hm_exec *x, int32_t il, hm_buf in, hm_buf out) {
    RUN(experts, x->ops->experts(x, il, in, out));
}

hm_status hm_op_moe(hm_exec *x, int32_t il, hm_buf in, hm_buf out) {
    hm_status st = hm_op_route(x, il, in);
    return st == HM_OK ? hm_op_experts(x, il, in, out) : st;
}

hm_status hm_op_add(hm_exec *x, hm_buf acc, hm_buf add) { RUN(add, x->ops->add(x, acc, add)); }

hm_status hm_op_scale(hm_exec *x, hm_buf a, float s, int64_t width) { RUN(scale, x->ops->scale(x, a, s, width)); }

hm_status hm_op_zero(hm_exec *x, hm_buf a, int64_t width) { RUN(zero, x->ops->zero(x, a, width)); }

hm_status hm_op_copy(hm_exec *x, hm_buf src, hm_buf dst, int64_t width) {
    RUN(copy, x->ops->copy(x, src, dst, width));
}

hm_status hm_op_geglu(hm_exec *x, hm_buf g, hm_buf u, hm_buf out, int64_t width) {
    RUN(geglu, x->ops->geglu(x, g, u, out, width));
}

hm_status hm_op_attn_in_ring(hm_exec *x, int32_t il, const hm_ring_in *p) {
    RUN(attn_in_ring, x->ops->attn_in_ring(x, il, p));
}

hm_status hm_op_attention_ring(hm_exec *x, int32_t il, hm_buf q, hm_buf out, float scale) {
    RUN(attention_ring, x->ops->attention_ring(x, il, q, out, scale));
}

hm_status hm_op_split_gate(hm_exec *x, hm_buf mix, hm_buf q, hm_buf gate) {
    RUN(split_gate, x->ops->split_gate(x, mix, q, gate));
}

hm_status hm_op_sigmoid_mul(hm_exec *x, hm_buf a, hm_buf gate, int64_t width) {
    RUN(sigmoid_mul, x->ops->sigmoid_mul(x, a, gate, width));
}

hm_status hm_op_swiglu(hm_exec *x, hm_buf g, hm_buf u, hm_buf out, int64_t width) {
    RUN(swiglu, x->ops->swiglu(x, g, u, out, width));
}

hm_status hm_op_add_sigmoid_scaled(hm_exec *x, hm_buf acc, hm_buf y, hm_buf s) {
    RUN(add_sigmoid_scaled, x->ops->add_sigmoid_scaled(x, acc, y, s));
}

hm_status hm_op_deltanet(hm_exec *x, int32_t il, hm_buf io, const hm_deltanet *p) {
    RUN(deltanet, x->ops->deltanet(x, il, io, p));
}

hm_status hm_op_add_bias(hm_exec *x, hm_buf a, const float *b, int64_t width) {
    RUN(add_bias, x->ops->add_bias(x, a, b, width));
}

hm_status hm_op_rmsnorm_w(hm_exec *x, hm_buf in, const float *w, hm_buf out, int64_t width) {
    RUN(rmsnorm_w, x->ops->rmsnorm_w(x, in, w, out, width));
}

hm_status hm_op_mla_in(hm_exec *x, int32_t il, const hm_mla_in *p) { RUN(mla_in, x->ops->mla_in(x, il, p)); }

hm_status hm_op_matmul_heads(hm_exec *x, const hm_mat_heads *w, const hm_heads_io *io) {
    RUN(matmul_heads, x->ops->matmul_heads(x, w, io));
}

/* A backend without an op of DeepSeek-V4's refuses it, naming it. */
#define DSV4_OP(op, ...)                                                                                     \
    (x->ops->op ? x->ops->op(__VA_ARGS__)                                                                     \
                : hm_errf(x->err, HM_ERR_UNSUPPORTED, "%s: op " #op " is not implemented on this backend",     \
                          x->m->arch->name))

hm_status hm_op_hc_expand(hm_exec *x, hm_buf io) { return DSV4_OP(hc_expand, x, io); }

hm_status hm_op_hc_pre(hm_exec *x, hm_buf in, const hm_hc *p, hm_buf norm, hm_buf mix, hm_buf out) {
    return DSV4_OP(hc_pre, x, in, p, norm, mix, out, false);
}

hm_status hm_op_hc_post(hm_exec *x, hm_buf f, hm_buf res, hm_buf mix, hm_buf out) {
    return DSV4_OP(hc_post, x, f, res, mix, out);
}

hm_status hm_op_hc_head(hm_exec *x, hm_buf in, const hm_hc *p, hm_buf norm, hm_buf mix, hm_buf out) {
    return DSV4_OP(hc_pre, x, in, p, norm, mix, out, true);
}

hm_status hm_op_dsv4_attn(hm_exec *x, int32_t il, const hm_dsv4_attn *p) { return DSV4_OP(dsv4_attn, x, il, p); }

hm_status hm_op_swiglu_clamp(hm_exec *x, hm_buf g, hm_buf u, hm_buf out, int64_t width, float limit) {
    return DSV4_OP(swiglu_clamp, x, g, u, out, width, limit);
}

hm_status hm_op_concat(hm_exec *x, hm_buf a, int64_t wa, hm_buf b, int64_t wb, hm_buf out) {
    return DSV4_OP(concat, x, a, wa, b, wb, out);
}
#undef DSV4_OP

/* ---- session entry points ---- */

/* s->kvl: each layer's K and V in one block, in layer order (a uniform arch's layer with KV slot i
 * at i * 2 * bytes); a sliding layer holds a ring of min(n_ctx, window + n_ubatch) rows (cpu_gemma.h
 * says why W + U - 1 suffice), so its memory does not grow with the context. A row is head_dim
 * values of the cache's type (ggml blocks for q8_0 / q4_0: head_dim must be a multiple of 32). */
static hm_status kv_layout(const hm_exec_model *xm, const hm_state_opts *o, hm_exec_state *s, hm_err *err) {
    const int rt = hm_kv_row_type(o->kv_type);
    if (!(s->kvl = calloc((size_t)xm->n_layer, sizeof *s->kvl))) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    s->ring = o->n_ctx;
    s->kv_row_type = rt;
    size_t at = 0;
    for (int32_t il = 0; il < xm->n_layer; il++) {
        if (hm_exec_kv_slot(xm, il) < 0) continue;
        const hm_attn_layer a = xm->attn_layers ? xm->attn_layers[il]
                                                : (hm_attn_layer){.head_dim = xm->head_dim, .n_head_kv = xm->n_head_kv};
        if (xm->kv_v_is_k ? a.head_dim % hm_type_get(rt)->blck_size != 0 : !hm_cpu_kv_row_ok(rt, a.head_dim))
            return hm_errf(err, HM_ERR_UNSUPPORTED,
                           "a %s KV cache: layer %d's head_dim %d is not a multiple of its block of %lld values "
                           "(use -ctk/-ctv f16)", hm_kv_type_name(o->kv_type), il, a.head_dim,
                           (long long)hm_type_get(rt)->blck_size);
        hm_kv_layer *c = &s->kvl[il];
        c->cap = o->n_ctx;
        if (a.window > 0) {
            s->window = a.window;
            if ((int64_t)a.window + o->n_ubatch < c->cap) c->cap = (int64_t)a.window + o->n_ubatch;
            if (c->cap < s->ring) s->ring = c->cap;
        }
        c->bytes = (size_t)a.n_head_kv * (size_t)c->cap * hm_row_size(rt, a.head_dim);
        c->n_head_kv = a.n_head_kv;
        c->off = at;
        at += (xm->kv_v_is_k ? 1 : 2) * c->bytes; /* V rows read as the K rows: no V block */
    }
    s->kv_bytes = at;
    return HM_OK;
}

hm_status hm_model_kv_bytes(const hm_model *m, int32_t n_ctx, int32_t n_ubatch, hm_kv_type kv_type, uint64_t *bytes,
                            hm_err *err) {
    *bytes = 0;
    if (n_ctx < 1 || n_ubatch < 0) return hm_errf(err, HM_ERR_ARG, "kv bytes: n_ctx %d, n_ubatch %d", n_ctx, n_ubatch);
    if ((unsigned)kv_type >= HM_KV_TYPE_COUNT) return hm_errf(err, HM_ERR_ARG, "kv bytes: KV type %d", (int)kv_type);
    if (!m->xm) return HM_OK; /* an arch without the executor's state keeps no KV here */
    const hm_state_opts o = {.n_ctx = n_ctx, .n_ubatch = n_ubatch ? (n_ubatch < n_ctx ? n_ubatch : n_ctx) : (n_ctx < 512 ? n_ctx : 512),
                             .kv_type = kv_type};
    hm_exec_state s = {0};
    hm_status st = kv_layout(m->xm, &o, &s, err);
    if (st == HM_OK) *bytes = (uint64_t)s.kv_bytes;
    for (int32_t il = 0; st == HM_OK && m->xm->dsv4.hc > 0 && il < m->xm->n_layer; il++) /* V4's own state */
        *bytes += (uint64_t)hm_dsv4_layout(&m->xm->dsv4.dims, m->xm->dsv4.ratio[il], o.n_ctx, o.n_ubatch, NULL, NULL) *
                  sizeof(float);
    free(s.kvl);
    return st;
}

void hm_exec_state_close(void *p) {
    hm_exec_state *s = p;
    if (!s) return;
    if (s->prof) {
        int64_t total = 0;
        for (int i = 0; i < HM_OPP_COUNT; i++) total += s->prof->us[i];
        fprintf(stderr, "op profile (HOTMOE_OP_PROFILE, %s, synchronised): %.1f ms in ops\n", s->arch,
                (double)total / 1e3);
        for (int i = 0; i < HM_OPP_COUNT; i++)
            if (s->prof->calls[i])
                fprintf(stderr, "  %-20s %8lld calls %10.1f ms %5.1f %%\n", op_names[i], (long long)s->prof->calls[i],
                        (double)s->prof->us[i] / 1e3, total ? 100.0 * (double)s->prof->us[i] / (double)total : 0.0);
        free(s->prof);
    }
#ifdef HM_HAVE_CUDA
    hm_exec_gpu_state_close(s);
#endif
    hm_free_aligned(s->rs);
    hm_free_aligned(s->rs_saved);
    hm_free_aligned(s->aux);
    free(s->aux_off);
    free(s->kvl);
    hm_model_state_free(s->kv, s->kv_scratch, s->act, &s->scratch, &s->route);
    free(s);
}

hm_status hm_exec_state_open(const hm_model *m, const hm_state_opts *o, void **out, hm_err *err) {
    *out = NULL;
    const hm_route_spec sp = hm_moe_route_spec(&m->xm->moe);
    const char *bad = m->xm->moe.n_expert > 0 ? hm_route_spec_invalid(&sp) : NULL;
    if (bad) return hm_errf(err, HM_ERR_UNSUPPORTED, "%s: the MoE routing cannot run: %s", m->arch->name, bad);
    hm_exec_state *s = calloc(1, sizeof *s);
    if (!s) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    s->arch = m->arch->name;
    s->recurrent = m->xm->n_rs_layer > 0;
    s->n_layer = m->xm->n_layer;
    s->n_rs = m->xm->n_rs_layer;
    s->kv_v_is_k = m->xm->kv_v_is_k;
    s->rs_floats = s->n_rs > 0 ? hm_exec_rs_floats(&m->xm->dn) : 0;
    s->n_ctx = o->n_ctx;
    s->n_ubatch = o->n_ubatch;
    s->n_threads = o->n_threads;
    s->kv_type = o->kv_type;
    s->saved_pos = -1;
    const char *prof = getenv("HOTMOE_OP_PROFILE");
    if (prof && *prof && strcmp(prof, "0") != 0 && !(s->prof = calloc(1, sizeof *s->prof))) {
        free(s);
        return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    }
    hm_status st = kv_layout(m->xm, o, s, err);
    if (st == HM_OK && m->xm->dsv4.hc > 0) { /* DeepSeek-V4: its own state, the window's ring in it */
        const hm_dsv4_dims *d = &m->xm->dsv4.dims;
        if (o->kv_type != HM_KV_F16)
            st = hm_errf(err, HM_ERR_UNSUPPORTED, "%s: a %s KV cache is not supported (its state is kept as f16 "
                         "values; use -ctk/-ctv f16)", m->arch->name, hm_kv_type_name(o->kv_type));
        s->dsv4 = true;
        s->window = d->window;
        s->ring = (int64_t)d->window + o->n_ubatch < o->n_ctx ? (int64_t)d->window + o->n_ubatch : o->n_ctx;
    }
    if (st != HM_OK) {
        hm_exec_state_close(s);
        return st;
    }
#ifdef HM_HAVE_CUDA
    if (m->gpu) /* the device state instead of the host KV cache and activations */
        st = hm_exec_gpu_state_open(m, o, s, err);
    else
#endif
        st = hm_exec_cpu_state_open(m, o, s, err);
    if (st != HM_OK) {
        hm_exec_state_close(s);
        return st;
    }
    *out = s;
    return HM_OK;
}

/* KV rows past n_keep are overwritten by the next eval; a recurrent state cannot be rewound: it
 * keeps everything (n_keep >= the positions it absorbed) or goes back to empty (n_keep 0). */
hm_status hm_exec_state_trim(void *state, int32_t n_keep, hm_err *err) {
    hm_exec_state *s = state;
    if (s->dsv4) { /* DeepSeek-V4's compressors: back within the current 128-position block only */
        if (n_keep <= 0 || n_keep >= s->n_hi) {
            if (n_keep <= 0) s->n_hi = 0;
            return HM_OK;
        }
        const int64_t q_min = (int64_t)n_keep - s->window + 1; /* the window's ring, as below */
        if (!hm_dsv4_can_trim(n_keep, s->n_hi) || (q_min > 0 && q_min + s->ring < s->n_hi))
            return hm_errf(err, HM_ERR_UNSUPPORTED,
                           "%s: cannot go back to %d positions: the compressed KV state holds only the current "
                           "%d-position block of the %lld evaluated (reset and evaluate the kept prefix again)",
                           s->arch, n_keep, HM_DSV4_BLOCK, (long long)s->n_hi);
        return HM_OK; /* n_hi stays: the rows written past n_keep are gone all the same */
    }
    if (s->ring < s->n_ctx) {
        /* the sliding layers' ring must still hold the window below n_keep: position q sits in row
         * q % ring, intact while no position q + ring has been written since the reset (n_hi only
         * grows: conservative) */
        if (n_keep <= 0) {
            s->n_hi = 0;
            return HM_OK;
        }
        const int64_t q_min = (int64_t)n_keep - s->window + 1;
        if (q_min > 0 && q_min + s->ring < s->n_hi)
            return hm_errf(err, HM_ERR_UNSUPPORTED,
                           "%s: cannot go back to %d positions: the sliding-window cache (%lld rows) has "
                           "overwritten the window below it (positions up to %lld were evaluated)",
                           s->arch, n_keep, (long long)s->ring, (long long)s->n_hi);
        return HM_OK;
    }
    if (!s->recurrent || n_keep >= s->n_pos) return HM_OK;
    if (n_keep == 0) {
#ifdef HM_HAVE_CUDA
        if (s->dev) {
            hm_status st = hm_exec_gpu_state_reset(s, err);
            if (st != HM_OK) return st;
        }
#endif
        if (s->rs) memset(s->rs, 0, s->rs_total * sizeof(float));
        s->n_pos = 0;
        return HM_OK;
    }
    return hm_errf(err, HM_ERR_UNSUPPORTED,
                   "%s: cannot trim to %d of %d positions (a recurrent state cannot be rewound; reset "
                   "and evaluate the kept prefix again)", s->arch, n_keep, s->n_pos);
}

hm_status hm_exec_state_save(void *state, hm_err *err) {
    hm_exec_state *s = state;
    if (s->aux || s->ring < s->n_ctx)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "%s: saving the session state is not supported for its attention state",
                       s->arch);
#ifdef HM_HAVE_CUDA
    if (s->dev) {
        hm_status st = hm_exec_gpu_state_save(s, false, err);
        if (st != HM_OK) return st;
    }
#endif
    if (s->rs) {
        if (!s->rs_saved && !(s->rs_saved = hm_malloc_aligned(s->rs_total * sizeof(float))))
            return hm_errf(err, HM_ERR_NOMEM, "%s: out of memory for a copy of the recurrent state", s->arch);
        memcpy(s->rs_saved, s->rs, s->rs_total * sizeof(float));
    }
    s->saved_pos = s->n_pos;
    return HM_OK;
}

hm_status hm_exec_state_restore(void *state, hm_err *err) {
    hm_exec_state *s = state;
    if (s->saved_pos < 0) return hm_errf(err, HM_ERR_ARG, "%s: restore without a saved state", s->arch);
#ifdef HM_HAVE_CUDA
    if (s->dev) {
        hm_status st = hm_exec_gpu_state_save(s, true, err);
        if (st != HM_OK) return st;
    }
#endif
    if (s->rs) memcpy(s->rs, s->rs_saved, s->rs_total * sizeof(float));
    s->n_pos = s->saved_pos;
    return HM_OK;
}

hm_status hm_exec_forward(const hm_model *m, void *state, hm_pool *pool, const hm_fwd_batch *b, hm_err *err) {
    hm_exec_state *s = state;
    const bool recurrent = m->xm->n_rs_layer > 0;
    if (recurrent && b->pos[0] != s->n_pos)
        return hm_errf(err, HM_ERR_ARG, "%s: batch starts at position %d but the recurrent state holds %d", s->arch,
                       b->pos[0], s->n_pos);
    if (b->inject && m->xm->inject_buf <= 0)
        return hm_errf(err, HM_ERR_ARG, "%s: a batch with inject rows, but the arch takes none", s->arch);
    if (b->hidden && b->n_out > 0 && b->out_rows[b->n_out - 1] - b->out_rows[0] != b->n_out - 1)
        return hm_errf(err, HM_ERR_ARG, "%s: hidden rows wanted with non-contiguous logits rows", s->arch);
    if (b->pos[b->n - 1] + 1 > s->n_hi) s->n_hi = b->pos[b->n - 1] + 1;
    hm_status st;
#ifdef HM_HAVE_CUDA
    if (m->gpu)
        st = hm_exec_gpu_forward(m, s, pool, b, err);
    else
#endif
    {
        const hm_fwd_seq seq = {.state = state, .b = *b};
        st = hm_exec_cpu_forward(m, s, pool, &seq, 1, b->logits, err);
    }
    if (st == HM_OK && recurrent) s->n_pos = b->pos[b->n - 1] + 1;
    return st;
}

/* n bytes of a state's segment (layer il's KV block at byte off of the host layout, or recurrent
 * slot il at byte off) to host (get) or from host (put): the host block itself, or its device. */
static hm_status seg_io(hm_exec_state *s, bool rs, int32_t il, size_t off, void *host, size_t n, bool put,
                        hm_err *err) {
#ifdef HM_HAVE_CUDA
    if (s->dev) return hm_exec_gpu_seg(s, rs, il, off, host, n, put, err);
#endif
    char *p = rs ? (char *)(s->rs + (size_t)il * s->rs_floats) + off : (char *)s->kv + off;
    if (put) memcpy(p, host, n);
    else memcpy(host, p, n);
    return HM_OK;
}

hm_status hm_exec_state_copy(void *dst, const void *src, int32_t p0, int32_t p1, hm_err *err) {
    hm_exec_state *d = dst, *s = (hm_exec_state *)src;
    if (d->kv_bytes != s->kv_bytes || d->kv_row_type != s->kv_row_type || d->n_ctx != s->n_ctx ||
        d->rs_floats != s->rs_floats || d->n_rs != s->n_rs || d->n_layer != s->n_layer || d->ring != s->ring || (d->aux != NULL) != (s->aux != NULL) || p0 < 0 ||
        p1 > s->n_ctx || p0 > p1)
        return hm_errf(err, HM_ERR_ARG, "state copy: the two sessions' states differ in layout (KV %zu vs %zu bytes, "
                       "context %d vs %d) or positions [%d, %d) are out of range", d->kv_bytes, s->kv_bytes, d->n_ctx,
                       s->n_ctx, p0, p1);
    if (s->aux && (s->dev || d->dev))
        return hm_errf(err, HM_ERR_UNSUPPORTED, "%s: its compressed KV state has no device form to copy", s->arch);
    /* one host buffer for the largest segment */
    size_t big = s->rs_floats * sizeof(float);
    for (int32_t il = 0; s->kvl && il < s->n_layer; il++) if (s->kvl[il].bytes > big) big = s->kvl[il].bytes;
    char *buf = big ? malloc(big) : NULL;
    if (big && !buf) return hm_errf(err, HM_ERR_NOMEM, "state copy: out of memory (%zu bytes)", big);
    hm_status st = HM_OK;
    for (int32_t il = 0; st == HM_OK && il < s->n_layer; il++) {
        const hm_kv_layer *c = &s->kvl[il];
        if (!c->bytes) continue;
        const size_t row = c->bytes / (size_t)c->n_head_kv / (size_t)c->cap;
        const bool whole = c->cap < s->n_ctx; /* a ring: positions sit at q % cap */
        for (int kv = 0; st == HM_OK && kv < (s->kv_v_is_k ? 1 : 2); kv++)
            for (int32_t h = 0; st == HM_OK && h < c->n_head_kv; h++) {
                const size_t head = c->off + (size_t)kv * c->bytes + (size_t)h * (size_t)c->cap * row;
                const size_t off = whole ? head : head + (size_t)p0 * row;
                const size_t n = whole ? (size_t)c->cap * row : (size_t)(p1 - p0) * row;
                if (!n) continue;
                st = seg_io(s, false, il, off, buf, n, false, err);
                if (st == HM_OK) st = seg_io(d, false, il, off, buf, n, true, err);
            }
    }
    const size_t rsb = s->rs_floats * sizeof(float);
    for (int32_t r = 0; st == HM_OK && r < s->n_rs; r++) {
        st = seg_io(s, true, r, 0, buf, rsb, false, err);
        if (st == HM_OK) st = seg_io(d, true, r, 0, buf, rsb, true, err);
    }
    if (st == HM_OK && s->aux) memcpy(d->aux, s->aux, s->aux_total * sizeof(float));
    free(buf);
    if (st != HM_OK) return st;
    d->n_pos = s->n_pos;
    if (s->n_hi > d->n_hi) d->n_hi = s->n_hi;
    return HM_OK;
}

hm_status hm_exec_forward_multi(const hm_model *m, void *work, hm_pool *pool, const hm_fwd_seq *seqs, int n_seq,
                                float *logits, hm_err *err) {
    HM_ASSERT(n_seq > 0 && n_seq <= HM_FWD_MAX_SEQ && m->xm->n_rs_layer == 0);
#ifdef HM_HAVE_CUDA
    if (m->gpu) {
        /* no batched pass on the device yet: the sequences one after another on their own
         * states (each unit computes once per sequence instead of once per batch, results as
         * alone); the wanted rows land in sequence order as the batched pass writes them */
        float *lg = logits;
        for (int i = 0; i < n_seq; i++) {
            hm_fwd_batch b = seqs[i].b;
            b.logits = b.n_out ? lg : NULL;
            hm_status st = hm_exec_gpu_forward(m, seqs[i].state, pool, &b, err);
            if (st != HM_OK) return st;
            if (b.n_out) lg += (size_t)b.n_out * (size_t)m->xm->n_vocab;
        }
        return HM_OK;
    }
#endif
    return hm_exec_cpu_forward(m, work, pool, seqs, n_seq, logits, err);
}
