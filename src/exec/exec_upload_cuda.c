/* exec_upload_cuda.c - the upload pass of the executor (CUDA builds only): gpu_load runs each
 * layer's description once with ops that put the weights they name on the layer's device, so no
 * arch writes an upload list. The map it fills (exec_cuda_impl.h) is what the compute ops read.
 *
 * Placement (model_gpu.h, several devices): the embeddings go with layer 0, the output and its
 * norm with the output's device, each layer's weights with the layer; a weight two devices need
 * gets a copy on each, one used twice on a device one copy (tied embeddings). A matmul_n of
 * matrices of one type, width and packed rows is stacked into one device matrix (decode then runs
 * them in one matvec launch, hm_cuda_matvec_multi, bit-identical to one launch each); each matrix
 * is a view into it. Checks of what the CUDA kernels take come first: head dims, the DeltaNet's
 * sizes, the router's expert count, and whether the grouped MoE kernels take the experts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec_cuda_impl.h"
#include "exec/model_gpu.h"
#include "quant/quant.h"

/* ---- the map: (host pointer, device) -> device copy, open addressing ---- */

static size_t xhash(const void *key, int32_t dev) {
    uint64_t h = (uint64_t)(uintptr_t)key * 0x9E3779B97F4A7C15ull ^ (uint64_t)dev * 0xC2B2AE3D27D4EB4Full;
    return (size_t)(h ^ (h >> 29));
}

hm_xw *hm_xmap_find(const hm_xmap *mp, const void *key, int32_t dev) {
    if (!mp->cap) return NULL;
    for (size_t i = xhash(key, dev) & (mp->cap - 1);; i = (i + 1) & (mp->cap - 1)) {
        hm_xw *e = &mp->e[i];
        if (!e->key) return NULL;
        if (e->key == key && e->dev == dev) return e;
    }
}

static hm_status map_grow(hm_xmap *mp, hm_err *err) {
    const size_t cap = mp->cap ? 2 * mp->cap : 256;
    hm_xw *old = mp->e;
    const size_t ocap = mp->cap;
    if (!(mp->e = calloc(cap, sizeof *mp->e))) {
        mp->e = old;
        return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    }
    mp->cap = cap;
    for (size_t i = 0; i < ocap; i++) {
        if (!old[i].key) continue;
        size_t j = xhash(old[i].key, old[i].dev) & (cap - 1);
        while (mp->e[j].key) j = (j + 1) & (cap - 1);
        mp->e[j] = old[i];
    }
    free(old);
    return HM_OK;
}

/* A new entry for (key, dev) (absent), stack -1. */
static hm_status map_add(hm_xmap *mp, const void *key, int32_t dev, hm_xw **out, hm_err *err) {
    if (2 * (mp->n + 1) > mp->cap) {
        hm_status st = map_grow(mp, err);
        if (st != HM_OK) return st;
    }
    size_t i = xhash(key, dev) & (mp->cap - 1);
    while (mp->e[i].key) i = (i + 1) & (mp->cap - 1);
    mp->e[i] = (hm_xw){.key = key, .dev = dev, .stack = -1};
    mp->n++;
    *out = &mp->e[i];
    return HM_OK;
}

static void map_free(hm_xmap *mp) {
    if (!mp) return;
    free(mp->e);
    free(mp->stacks);
    free(mp);
}

/* The GGUF name of the tensor whose data is at `data` (for upload errors). */
static const char *tensor_name(const hm_model *m, const void *data) {
    for (int64_t i = 0; i < hm_gguf_n_tensors(m->gguf); i++) {
        const hm_gguf_tensor *t = hm_gguf_tensor_at(m->gguf, i);
        if (t->data == data) return t->name;
    }
    return "(unnamed)";
}

void hm_exec_gpu_unload(hm_model *m) {
    if (!m->gpu) return;
    map_free(m->gpu->arch);
    m->gpu->arch = NULL;
}

/* ---- the upload pass ---- */

typedef struct up_pass {
    hm_gpu *g;
    hm_xmap *mp;
} up_pass;

static up_pass *upp(hm_exec *x) { return x->be; }

static hm_status up_vec(hm_exec *x, const float *v, int64_t n) {
    up_pass *u = upp(x);
    if (!v || hm_xmap_find(u->mp, v, u->g->up_dev)) return HM_OK;
    float *d = NULL;
    hm_status st = hm_gpu_up_vec(u->g, v, n, tensor_name(x->m, v), &d, x->err);
    if (st != HM_OK) return st;
    hm_xw *e;
    if ((st = map_add(u->mp, v, u->g->up_dev, &e, x->err)) != HM_OK) return st;
    e->v = d;
    return HM_OK;
}

static hm_status up_mat(hm_exec *x, const hm_mat *w) {
    up_pass *u = upp(x);
    if (hm_xmap_find(u->mp, w->data, u->g->up_dev)) return HM_OK;
    hm_cuda_mat d;
    bool any = false;
    hm_status st = hm_gpu_up_mat(u->g, w, tensor_name(x->m, w->data), &any, &d, x->err);
    if (st != HM_OK) return st;
    hm_xw *e;
    if ((st = map_add(u->mp, w->data, u->g->up_dev, &e, x->err)) != HM_OK) return st;
    e->m = d;
    e->any = any;
    return HM_OK;
}

/* ws[0..n) stacked into one device matrix when at least the first two share the type, width and
 * packed rows (and none is uploaded yet); the matching prefix is stacked. Returns how many were. */
static hm_status up_stack(hm_exec *x, const hm_mat *const *ws, int n, int *stacked) {
    up_pass *u = upp(x);
    const hm_mat *w0 = ws[0];
    int k = 0;
    while (k < n && k < 3 && ws[k]->type == w0->type && ws[k]->ne0 == w0->ne0 && ws[k]->nb1 == w0->nb1 &&
           ws[k]->nb1 == hm_row_size(w0->type, w0->ne0) && !hm_xmap_find(u->mp, ws[k]->data, u->g->up_dev))
        k++;
    *stacked = 0;
    if (k < 2 || !hm_cuda_type_ok(w0->type) || w0->ne0 % 32 != 0 || w0->nb1 % hm_cuda_type_align(w0->type) != 0)
        return HM_OK; /* each alone (a width only the f32 fallback takes stays unstacked) */
    int64_t rows = 0;
    for (int i = 0; i < k; i++) rows += ws[i]->ne1;
    const size_t nb1 = w0->nb1;
    char *buf = malloc(nb1 * (size_t)rows);
    if (!buf) return hm_errf(x->err, HM_ERR_NOMEM, "out of memory");
    char name[256];
    size_t at = 0, nl = 0;
    for (int i = 0; i < k; i++) {
        memcpy(buf + at, ws[i]->data, nb1 * (size_t)ws[i]->ne1);
        at += nb1 * (size_t)ws[i]->ne1;
        nl += (size_t)snprintf(name + nl, nl < sizeof name ? sizeof name - nl : 0, "%s%s", i ? "|" : "",
                               tensor_name(x->m, ws[i]->data));
        if (nl >= sizeof name) nl = sizeof name - 1;
    }
    snprintf(name + nl, sizeof name - nl, " (stacked)");
    const hm_mat cat = {.data = buf, .type = w0->type, .ne0 = w0->ne0, .ne1 = rows, .nb1 = nb1};
    hm_cuda_mat d;
    hm_status st = hm_gpu_up_mat(u->g, &cat, name, NULL, &d, x->err);
    free(buf);
    if (st != HM_OK) return st;
    hm_xmap *mp = u->mp;
    if (mp->n_stacks == mp->cap_stacks) {
        const int32_t cap = mp->cap_stacks ? 2 * mp->cap_stacks : 64;
        hm_xstack *ns = realloc(mp->stacks, (size_t)cap * sizeof *ns);
        if (!ns) return hm_errf(x->err, HM_ERR_NOMEM, "out of memory");
        mp->stacks = ns;
        mp->cap_stacks = cap;
    }
    const int32_t si = mp->n_stacks++;
    mp->stacks[si] = (hm_xstack){.m = d, .n = k};
    at = 0;
    for (int i = 0; i < k; i++) {
        hm_xw *e;
        if ((st = map_add(mp, ws[i]->data, u->g->up_dev, &e, x->err)) != HM_OK) return st;
        e->m = d;
        e->m.data = (const char *)d.data + at;
        e->m.ne1 = ws[i]->ne1;
        e->stack = si;
        e->pos = i;
        at += nb1 * (size_t)ws[i]->ne1;
    }
    *stacked = k;
    return HM_OK;
}

static hm_status u_rmsnorm(hm_exec *x, hm_buf in, const float *w, hm_buf out) {
    (void)in, (void)out;
    return up_vec(x, w, x->xm->n_embd);
}

static hm_status u_matmul_n(hm_exec *x, hm_buf in, const hm_mat *const *ws, const hm_buf *outs, int n) {
    (void)in, (void)outs;
    int done = 0;
    hm_status st = n >= 2 ? up_stack(x, ws, n, &done) : HM_OK;
    for (int i = done; i < n && st == HM_OK; i++) st = up_mat(x, ws[i]);
    return st;
}

static hm_status u_add_rmsnorm(hm_exec *x, hm_buf acc, hm_buf add, const float *w, hm_buf out) {
    (void)acc, (void)add, (void)out;
    return up_vec(x, w, x->xm->n_embd);
}

static hm_status u_qk_norm_rope_kv(hm_exec *x, int32_t il, const hm_qk_rope *p) {
    (void)il;
    hm_status st = up_vec(x, p->q_norm, x->xm->head_dim);
    if (st == HM_OK && p->rope_ff) st = up_vec(x, p->rope_ff, p->n_rot / 2);
    return st == HM_OK ? up_vec(x, p->k_norm, x->xm->head_dim) : st;
}

static hm_status u_out_rows(hm_exec *x, int32_t il, const hm_buf *bufs, const int64_t *widths, int n) {
    (void)x, (void)il, (void)bufs, (void)widths, (void)n;
    return HM_OK; /* the pass goes on: every layer's weights are wanted */
}

static hm_status u_attention(hm_exec *x, int32_t il, hm_buf q, hm_buf out, float scale) {
    (void)x, (void)il, (void)q, (void)out, (void)scale;
    return HM_OK;
}

static hm_status u_route(hm_exec *x, int32_t il, hm_buf in) {
    (void)in;
    const hm_moe_layer *L = &x->xm->moe_layers[il];
    hm_status st = up_mat(x, L->router);
    if (st == HM_OK) st = up_vec(x, L->score_bias, x->xm->moe.n_expert);
    if (st == HM_OK) st = up_vec(x, L->router_bias, x->xm->moe.n_expert);
    /* the hash table's int32 ids travel as 4-byte words, as the vectors do */
    if (st == HM_OK) st = up_vec(x, (const float *)L->hash, (int64_t)x->xm->n_vocab * x->xm->moe.k);
    return st == HM_OK ? up_vec(x, L->expert_scale, x->xm->moe.n_expert) : st;
}

static hm_status u_attention_ring(hm_exec *x, int32_t il, hm_buf q, hm_buf out, float scale) {
    (void)q, (void)out, (void)scale;
    return up_vec(x, x->xm->attn_layers[il].sinks, x->xm->n_head);
}

static hm_status u_add_bias(hm_exec *x, hm_buf a, const float *b, int64_t width) {
    (void)a;
    return up_vec(x, b, width);
}

static hm_status u_experts(hm_exec *x, int32_t il, hm_buf in, hm_buf out) {
    (void)in, (void)out;
    /* the units go to the VRAM tier's slots, placed by the store; per-expert biases (gpt-oss) here,
     * whole tensors on the layer's device (moe_cuda.c points each hot unit into them) */
    const hm_moe_weights *mw = x->xm->moe_layers[il].experts;
    if (!mw) return HM_OK;
    hm_status st = up_vec(x, mw->gate_b, (int64_t)mw->n_expert * mw->n_ff);
    if (st == HM_OK) st = up_vec(x, mw->up_b, (int64_t)mw->n_expert * mw->n_ff);
    return st == HM_OK ? up_vec(x, mw->down_b, (int64_t)mw->n_expert * mw->n_embd) : st;
}

static hm_status u_add(hm_exec *x, hm_buf acc, hm_buf add) {
    (void)x, (void)acc, (void)add;
    return HM_OK;
}

static hm_status u_width_op(hm_exec *x, hm_buf a, float s, int64_t width) {
    (void)x, (void)a, (void)s, (void)width;
    return HM_OK;
}

static hm_status u_zero(hm_exec *x, hm_buf a, int64_t width) {
    (void)x, (void)a, (void)width;
    return HM_OK;
}

static hm_status u_copy(hm_exec *x, hm_buf src, hm_buf dst, int64_t width) {
    (void)x, (void)src, (void)dst, (void)width;
    return HM_OK;
}

static hm_status u_attn_in_ring(hm_exec *x, int32_t il, const hm_ring_in *p) {
    const int64_t hd = x->xm->attn_layers[il].head_dim;
    hm_status st = up_vec(x, p->q_norm, hd);
    if (st == HM_OK) st = up_vec(x, p->k_norm, hd);
    if (st == HM_OK) st = up_vec(x, p->rope_ff, p->n_rot / 2);
    return st;
}

static hm_status u_none4(hm_exec *x, hm_buf a, hm_buf b, hm_buf c) {
    (void)x, (void)a, (void)b, (void)c;
    return HM_OK;
}

static hm_status u_sigmoid_mul(hm_exec *x, hm_buf a, hm_buf gate, int64_t width) {
    (void)x, (void)a, (void)gate, (void)width;
    return HM_OK;
}

static hm_status u_swiglu(hm_exec *x, hm_buf g, hm_buf u, hm_buf out, int64_t width) {
    (void)x, (void)g, (void)u, (void)out, (void)width;
    return HM_OK;
}

static hm_status u_deltanet(hm_exec *x, int32_t il, hm_buf io, const hm_deltanet *p) {
    (void)il, (void)io;
    const hm_deltanet_spec *d = &x->xm->dn;
    const hm_mat *ms[5] = {p->wqkv, p->wz, p->wbeta, p->walpha, p->wout};
    for (int i = 0; i < 5; i++) {
        if (!ms[i]) continue; /* walpha of the grouped layout (fused into wbeta) */
        hm_status st = up_mat(x, ms[i]);
        if (st != HM_OK) return st;
    }
    hm_status st = up_vec(x, p->conv_w, (int64_t)d->d_conv * d->conv_dim);
    if (st == HM_OK) st = up_vec(x, p->dt_bias, d->n_v);
    if (st == HM_OK) st = up_vec(x, p->ssm_a, d->n_v);
    if (st == HM_OK) st = up_vec(x, p->ssm_norm, d->d_v);
    return st;
}

static hm_status u_rmsnorm_w(hm_exec *x, hm_buf in, const float *w, hm_buf out, int64_t width) {
    (void)in, (void)out;
    return up_vec(x, w, width);
}

static hm_status u_mla_in(hm_exec *x, int32_t il, const hm_mla_in *p) {
    (void)il;
    hm_status st = up_vec(x, p->kv_norm, p->kv_lora);
    return st == HM_OK ? up_vec(x, p->rope_ff, p->n_rot / 2) : st;
}

/* The heads' matrices as one device matrix of n_head * ne1 rows (each head a view into it). */
static hm_status u_matmul_heads(hm_exec *x, const hm_mat_heads *w, const hm_heads_io *io) {
    (void)io;
    if (w->nb2 != (size_t)w->w.ne1 * w->w.nb1)
        return hm_errf(x->err, HM_ERR_UNSUPPORTED, "per-head matrices that are not packed (a deepseek2 file with "
                       "attn_kv_b: convert it again with a current llama.cpp converter, or run it on the CPU)");
    hm_mat all = w->w;
    all.ne1 = w->w.ne1 * w->n_head;
    return up_mat(x, &all);
}

/* ---- DeepSeek-V4's ---- */

static hm_status u_hc_expand(hm_exec *x, hm_buf io) {
    (void)x, (void)io;
    return HM_OK;
}

static hm_status u_hc_pre(hm_exec *x, hm_buf in, const hm_hc *p, hm_buf norm, hm_buf mix, hm_buf out, bool head) {
    (void)in, (void)norm, (void)mix, (void)out;
    const int64_t hc = x->xm->dsv4.hc;
    hm_status st = up_mat(x, p->fn);
    if (st == HM_OK) st = up_vec(x, p->scale, head ? 1 : 3);
    return st == HM_OK ? up_vec(x, p->base, head ? hc : (2 + hc) * hc) : st;
}

static hm_status u_hc_post(hm_exec *x, hm_buf f, hm_buf res, hm_buf mix, hm_buf out) {
    (void)x, (void)f, (void)res, (void)mix, (void)out;
    return HM_OK;
}

static hm_status u_swiglu_clamp(hm_exec *x, hm_buf g, hm_buf u, hm_buf out, int64_t width, float limit) {
    (void)x, (void)g, (void)u, (void)out, (void)width, (void)limit;
    return HM_OK;
}

/* The attention's matrices (Wo_a whole: the compute op takes each group's rows as a view) and
 * vectors; the compressed layers' RoPE frequencies (the model's, one copy a device). */
static hm_status u_dsv4_attn(hm_exec *x, int32_t il, const hm_dsv4_attn *p) {
    (void)il;
    const hm_dsv4_dims *d = &x->xm->dsv4.dims;
    const hm_dsv4_lw *w = &p->w;
    const int64_t hd = d->hd, ihd = d->idx_hd, coff = w->ratio == 4 ? 2 : 1;
    const hm_mat *ms[8] = {w->wq_b, w->wo_a, w->c_kv, w->c_gate, w->i_qb, w->i_proj, w->i_kv, w->i_gate};
    hm_status st = HM_OK;
    for (int i = 0; i < 8 && st == HM_OK; i++)
        if (ms[i]) st = up_mat(x, ms[i]);
    if (st == HM_OK) st = up_vec(x, w->q_a_norm, d->q_lora);
    if (st == HM_OK) st = up_vec(x, w->kv_norm, hd);
    if (st == HM_OK) st = up_vec(x, w->sinks, d->n_head);
    if (st == HM_OK) st = up_vec(x, w->c_ape, coff * hd * w->ratio);
    if (st == HM_OK) st = up_vec(x, w->c_norm, hd);
    if (st == HM_OK) st = up_vec(x, w->i_ape, 2 * ihd * 4);
    if (st == HM_OK) st = up_vec(x, w->i_norm, ihd);
    if (st == HM_OK && w->ratio > 0) st = up_vec(x, d->c_ff, d->n_rot / 2);
    return st;
}

static const hm_exec_ops upload_ops = {
    .rmsnorm = u_rmsnorm,
    .matmul_n = u_matmul_n,
    .add_rmsnorm = u_add_rmsnorm,
    .qk_norm_rope_kv = u_qk_norm_rope_kv,
    .out_rows = u_out_rows,
    .attention = u_attention,
    .route = u_route,
    .experts = u_experts,
    .split_gate = u_none4,
    .sigmoid_mul = u_sigmoid_mul,
    .swiglu = u_swiglu,
    .add_sigmoid_scaled = u_none4,
    .deltanet = u_deltanet,
    .add = u_add,
    .scale = u_width_op,
    .zero = u_zero,
    .copy = u_copy,
    .geglu = u_swiglu,
    .attn_in_ring = u_attn_in_ring,
    .attention_ring = u_attention_ring,
    .rmsnorm_w = u_rmsnorm_w,
    .mla_in = u_mla_in,
    .matmul_heads = u_matmul_heads,
    .add_bias = u_add_bias,
    .hc_expand = u_hc_expand,
    .hc_pre = u_hc_pre,
    .hc_post = u_hc_post,
    .dsv4_attn = u_dsv4_attn,
    .swiglu_clamp = u_swiglu_clamp,
};

hm_status hm_exec_gpu_load(hm_model *m, hm_err *err) {
    const hm_exec_model *xm = m->xm;
    hm_gpu *g = m->gpu;
    HM_ASSERT(xm && g && !g->arch);
    if (xm->kv_v_is_k && xm->head_dim > 1024)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "a compressed (MLA) KV row of %d values: the CUDA MLA attention takes "
                       "at most 1024 (run the model on the CPU: drop -ngl / --vram-budget)", xm->head_dim);
    if (!xm->attn_ring && !xm->kv_v_is_k && xm->n_kv_layer > 0 && xm->head_dim > 256)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "head_dim %d: the CUDA attention takes at most 256 (run the model "
                       "on the CPU: drop -ngl / --vram-budget)", xm->head_dim);
    for (int32_t il = 0; xm->attn_ring && il < xm->n_layer; il++) {
        const int32_t hd = xm->attn_layers[il].head_dim;
        if (hd != 32 && hd != 64 && hd != 128 && hd != 256 && hd != 512)
            return hm_errf(err, HM_ERR_UNSUPPORTED, "layer %d: head_dim %d: the CUDA ring attention takes 32, 64, "
                           "128, 256 or 512 (run the model on the CPU: drop -ngl / --vram-budget)", il, hd);
    }
    const hm_dsv4_dims *v4 = &xm->dsv4.dims;
    if (xm->dsv4.hc > 0 && (v4->hd > 1024 || v4->idx_hd > 1024 || xm->dsv4.hc > 16))
        return hm_errf(err, HM_ERR_UNSUPPORTED, "DeepSeek-V4 head_dim %d, indexer head %d, %d streams: the CUDA "
                       "kernels take head dims up to 1024 and 16 streams (run the model on the CPU)", v4->hd,
                       v4->idx_hd, xm->dsv4.hc);
    const hm_deltanet_spec *dn = &xm->dn;
    if (xm->n_rs_layer > 0 && (dn->d_k > 1024 || dn->d_v > 1024 || dn->n_v > 65535))
        return hm_errf(err, HM_ERR_UNSUPPORTED, "DeltaNet heads %d x (%d, %d): the CUDA delta rule takes d_k, d_v "
                       "<= 1024 (run the model on the CPU)", dn->n_v, dn->d_k, dn->d_v);
    if (xm->moe.n_expert > 1024 || xm->moe.k > 32)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "%d experts, %d used: the CUDA router takes at most 1024 and 32",
                       xm->moe.n_expert, xm->moe.k);
    for (int32_t il = 0; il < xm->n_layer; il++) /* the grouped MoE kernels' shapes and types */
        if (xm->moe_layers[il].experts) {
            g->no_gpu_experts = hm_moe_gpu_unfit(xm->moe_layers[il].experts);
            break;
        }
    hm_xmap *mp = calloc(1, sizeof *mp);
    if (!mp) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    g->arch = mp;
    up_pass u = {.g = g, .mp = mp};
    hm_exec x = {.m = m, .xm = xm, .ops = &upload_ops, .err = err, .be = &u};
    hm_status st;
    /* the embeddings go with layer 0, the output with its own device, each layer's weights with it */
    g->up_dev = hm_gpu_layer_dev(g, 0);
    if ((st = up_mat(&x, xm->tok_embd)) != HM_OK) goto fail;
    if (hm_xmap_find(mp, xm->tok_embd->data, g->up_dev)->any) {
        st = hm_errf(err, HM_ERR_UNSUPPORTED, "tensor 'token_embd.weight': rows of %d elements do not fit the "
                     "CUDA row lookup (a multiple of 32)", xm->n_embd);
        goto fail;
    }
    g->up_dev = hm_gpu_layer_dev(g, xm->n_layer);
    if ((st = up_mat(&x, xm->output)) != HM_OK) goto fail;
    if ((st = up_vec(&x, xm->output_norm, xm->n_embd)) != HM_OK) goto fail;
    for (int32_t il = 0; il < xm->n_layer; il++) {
        g->up_dev = hm_gpu_layer_dev(g, il);
        if ((st = hm_exec_layer(&x, il)) != HM_OK) goto fail;
    }
    return HM_OK;
fail:
    hm_exec_gpu_unload(m); /* the buffers themselves are m->gpu's (freed at its close) */
    return st;
}
