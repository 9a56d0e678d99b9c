/* exec_cuda.c - the CUDA backend of the executor (CUDA builds only): the arch's one layer
 * description run on the device op by op, and captured as one CUDA graph for decode; the weights
 * are where the upload pass put them (exec_upload_cuda.c: a map from host pointer and device to
 * the device copy). The dense part, the KV cache and the activations live on the device; the HOT
 * expert units in VRAM slots are computed there, the cold ones by the CPU threads at the same time
 * (exec/moe.h, hm_moe_forward_gpu).
 *
 * Per layer the ops queue their launches on the layer's device. The MoE op, two ways:
 *   - prefill (n > 8): the layer's ONE host wait: the routing (ids + weights) and, when some unit
 *     of the layer may be cold, the normed input come down to pinned buffers and the host syncs.
 *     The host records the routing in the store, groups it by unit, queues the hot units' grouped
 *     launch, computes the cold ones, and queues their sum's upload and add. Units of the next
 *     layer predicted on this layer's input may stream ahead (gpu_chain.h, hm_gpu_moe_step).
 *   - decode (n <= 8): the hot units run from the router's device output through a per-layer
 *     table of slot pointers (uploaded at step start when a slot map changed): no host staging.
 *     A layer whose units are ALL hot has no host wait at all; another one downloads its routing
 *     and input, records an event, queues the hot launch and waits for the event only. Every
 *     layer's routing comes down in one copy at the end of the step and is recorded in the store.
 * A decode step whose rows all want logits runs instead as ONE CUDA graph (moe.h, hm_moe_graph):
 * the same description captured once and replayed (captured again when its key changes: the rows,
 * the attention split, the layers with any hot unit), the cold units' host round trip inside it;
 * bit-identical to the per-launch path (same kernels, same order). HOTMOE_CUDA_GRAPH=0 keeps the
 * per-launch path. After the last layer, the output norm and matmul of the wanted rows and the
 * logits' download (a sync); without wanted logits a plain sync: the store refills slots between
 * steps and no queued kernel may still read them then.
 *
 * Numerics (cuda_ops.h): batches of <= 8 rows take the exact-f32 matvec path, larger ones the
 * tensor-core matmul. The KV cache is f16 as the CPU's.
 *
 * Memory: one device state per device of the layer split (gpu_chain.h), each with the KV cache of
 * its own layers and its own activations, sized at open for n_ctx and n_ubatch; when the device is
 * full, the model's expert slot pool gives up chunks of slots for it (hm_gpu_dev_alloc_on). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_dsv4.h"
#include "backend/cuda/cuda_gemma.h"
#include "backend/cuda/cuda_gptoss.h"
#include "backend/cuda/cuda_linattn.h"
#include "core/alloc.h"
#include "backend/cuda/cuda_mla.h"
#include "backend/cuda/cuda_ops.h"
#include "exec_cuda_impl.h"
#include "exec/gpu_chain.h"
#include "exec/model_gpu.h"
#include "quant/quant.h"

/* Most rows of logits computed per output matmul (bounds the device logits buffer). */
#define XG_LOGIT_ROWS 64

/* The largest head dim of the layers. */
static int32_t hd_max(const hm_exec_model *xm) {
    int32_t hd = xm->head_dim;
    for (int32_t il = 0; xm->attn_layers && il < xm->n_layer; il++)
        if (xm->attn_layers[il].head_dim > hd) hd = xm->attn_layers[il].head_dim;
    return hd;
}

/* Whether the head dim is one hm_cuda_attention does not take (the fallback runs it, no scratch). */
static bool attn_any(const hm_exec_model *xm) {
    return xm->head_dim != 64 && xm->head_dim != 128 && xm->head_dim != 256;
}

/* DeepSeek-V4's attention scratch: the indexer's scores of up to DS_IDX_ROWS rows over every
 * compressed row a context has, then n rows' chosen rows and their counts; off[0..1] (NULL: the size
 * only) the byte offsets of sel and n_sel. The attention runs before the MoE on one stream: the
 * device scratch holds both, one after the other. */
#define DS_IDX_ROWS 64
static size_t dsv4_scratch(const hm_dsv4_dims *d, int64_t n, int32_t n_ctx, size_t *off) {
    const int64_t rows = n < DS_IDX_ROWS ? n : DS_IDX_ROWS;
    const size_t sc = ((size_t)rows * (size_t)(n_ctx / 4 + 1) * sizeof(float) + 255) & ~(size_t)255;
    const size_t sel = ((size_t)n * (size_t)d->idx_topk * sizeof(int32_t) + 255) & ~(size_t)255;
    if (off) off[0] = sc, off[1] = sc + sel;
    return sc + sel + (size_t)n * sizeof(int32_t);
}

/* ---- a session's device states ----
 *
 * One hm_xdev per device of the placement that runs layers or the output, chained in layer order
 * (s->dev the first): each holds the KV cache of its own layers [l0, l1) only, and its own
 * activations, tables and handshakes. With one device the chain has one link, over every layer. */

typedef struct hm_xdev {
    hm_gpu_dstate ds;         /* first: the device, its layers, x, h, the MoE's buffers (gpu_chain.h);
                                 ds.kv is [l1 - l0][2][n_head_kv][n_ctx][head_dim] */
    size_t kv_off0;           /* the KV block's byte where its first layer's K starts (s->kvl) */
    int32_t rs0;              /* the recurrent slot of its first layer that has one */
    float *rs;                /* device [its recurrent layers][hm_exec_rs_floats], owned */
    size_t rs_total;          /* floats of rs */
    float *rs_saved;          /* device: hm_exec_gpu_state_save's copy of rs, owned; NULL until then */
    float *buf[HM_EXEC_MAX_BUF]; /* [U, buf_width[i]] the arch's buffers (x and h are ds's) */
    float *rlog;              /* [U, n_expert] router logits */
    int32_t *pred;            /* [2 * U * k]: prefill, the next layer's routing predicted on this
                                 layer's MoE input (for streaming ahead: moe.h, next_ids) */
    int32_t *pred_h;          /* [U * k] the predicted ids, down (in ds.pin) */
    char *aux;                /* DeepSeek-V4: its layers' attention states (hm_cuda_dsv4_layout), owned */
    size_t *aux_off;          /* [l1 - l0] layer l0 + i's bytes from aux on, owned */
} hm_xdev;

static hm_xdev *nxt(const hm_xdev *g) { return (hm_xdev *)g->ds.next; }

void hm_exec_gpu_state_close(hm_exec_state *s) {
    for (hm_xdev *g = s->dev, *nx; g; g = nx) {
        nx = nxt(g);
        hm_gpu_dstate_free(&g->ds); /* syncs its device first */
        if (g->ds.c) hm_cuda_free(g->ds.c, g->rs), hm_cuda_free(g->ds.c, g->aux);
        if (g->ds.c) hm_cuda_free(g->ds.c, g->rs_saved);
        free(g->aux_off);
        free(g);
    }
    s->dev = NULL;
}

/* Zero one device's recurrent state and wait for it. */
static hm_status xdev_reset(hm_xdev *g, hm_err *err) {
    if (!g->rs) return HM_OK;
    hm_status st = hm_cuda_make_current(g->ds.c, err);
    if (st == HM_OK) st = hm_cuda_memset(g->ds.c, g->rs, 0, g->rs_total * sizeof(float), err);
    return st == HM_OK ? hm_cuda_sync(g->ds.c, err) : st;
}

hm_status hm_exec_gpu_seg(hm_exec_state *s, bool rs, int32_t il, size_t off, void *host, size_t n, bool put,
                          hm_err *err) {
    for (hm_xdev *g = s->dev; g; g = nxt(g)) {
        char *p;
        if (rs) {
            const int32_t nr = s->rs_floats ? (int32_t)(g->rs_total / s->rs_floats) : 0;
            if (!g->rs || il < g->rs0 || il >= g->rs0 + nr) continue;
            p = (char *)(g->rs + (size_t)(il - g->rs0) * s->rs_floats) + off;
        } else {
            if (il < g->ds.l0 || il >= g->ds.l1 || !g->ds.kv) continue;
            p = (char *)g->ds.kv + (off - g->kv_off0);
        }
        hm_status st = hm_cuda_make_current(g->ds.c, err);
        if (st != HM_OK) return st;
        if (!put) return hm_cuda_download(g->ds.c, host, p, n, err);
        if ((st = hm_cuda_sync(g->ds.c, err)) != HM_OK) return st; /* nothing queued still reads it */
        return hm_cuda_upload(g->ds.c, p, host, n, err);
    }
    return hm_errf(err, HM_ERR_INTERNAL, "state copy: no device holds %s %d", rs ? "recurrent slot" : "layer", il);
}

hm_status hm_exec_gpu_state_reset(hm_exec_state *s, hm_err *err) {
    for (hm_xdev *g = s->dev; g; g = nxt(g)) {
        hm_status st = xdev_reset(g, err);
        if (st != HM_OK) return st;
    }
    return HM_OK;
}

hm_status hm_exec_gpu_state_save(hm_exec_state *s, bool restore, hm_err *err) {
    for (hm_xdev *g = s->dev; g; g = nxt(g)) {
        if (!g->rs) continue;
        const size_t bytes = g->rs_total * sizeof(float);
        hm_status st = hm_cuda_make_current(g->ds.c, err);
        if (st == HM_OK && !g->rs_saved) {
            if (restore) return hm_errf(err, HM_ERR_ARG, "%s: restore without a saved state", s->arch);
            st = hm_cuda_alloc(g->ds.c, bytes, (void **)&g->rs_saved, err);
        }
        if (st == HM_OK)
            st = restore ? hm_cuda_copy(g->ds.c, g->rs, g->rs_saved, bytes, err)
                         : hm_cuda_copy(g->ds.c, g->rs_saved, g->rs, bytes, err);
        if (st == HM_OK) st = hm_cuda_sync(g->ds.c, err);
        if (st != HM_OK) return st;
    }
    return HM_OK;
}

/* The device state of device index dev for layers [l0, l1) (and the output when out), linked at
 * once after *last (s's first when *last is NULL; a half-open one is freed with the chain), *last
 * set to it. */
static hm_status xdev_open(const hm_model *m, const hm_state_opts *o, int32_t dev, int32_t l0, int32_t l1, bool out,
                           hm_exec_state *s, hm_xdev **last, hm_err *err) {
    const hm_exec_model *xm = m->xm;
    hm_xdev *g = calloc(1, sizeof *g);
    if (!g) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    if (*last) (*last)->ds.next = &g->ds;
    else s->dev = g;
    *last = g;
    const size_t U = (size_t)o->n_ubatch, E = (size_t)xm->n_embd, V = (size_t)xm->n_vocab;
    const size_t K = (size_t)(xm->moe.k > 0 ? xm->moe.k : 1), NE = (size_t)(xm->moe.n_expert > 0 ? xm->moe.n_expert : 1);
    hm_status st = hm_gpu_dstate_init(&g->ds, m, o, dev, l0, l1, out, xm->n_layer, xm->moe.n_expert, XG_LOGIT_ROWS,
                                      K, err);
    if (st != HM_OK) return st;
    hm_cuda_ctx *c = g->ds.c;
    const size_t NL = (size_t)xm->n_layer;
    const size_t slot_words = NL * NE * sizeof(hm_cuda_moe_slot) / 4;

    /* its layers' K/V (s->kvl, from its first layer that has any) and recurrent states [rs0, rs0 + n_rs) */
    int32_t n_rs = 0;
    size_t kv_bytes = 0;
    bool any_kv = false;
    g->rs0 = -1;
    for (int32_t il = l0; il < l1; il++) {
        const int32_t rs = hm_exec_rs_slot(xm, il);
        if (rs >= 0 && n_rs++ == 0) g->rs0 = rs;
        if (s->kvl[il].bytes == 0) continue;
        if (!any_kv) g->kv_off0 = s->kvl[il].off, any_kv = true;
        kv_bytes += (xm->kv_v_is_k ? 1 : 2) * s->kvl[il].bytes;
    }
    /* sizes first: a device that is full makes the expert pool give up room for all of them */
    g->rs_total = hm_exec_rs_floats(&xm->dn) * (size_t)n_rs;
    const size_t rs_bytes = g->rs_total * sizeof(float);
    size_t aux_bytes = 0; /* DeepSeek-V4's attention states of its layers */
    if (xm->dsv4.hc > 0) {
        if (!(g->aux_off = calloc((size_t)(l1 - l0 > 0 ? l1 - l0 : 1), sizeof *g->aux_off)))
            return hm_errf(err, HM_ERR_NOMEM, "out of memory");
        for (int32_t il = l0; il < l1; il++) {
            g->aux_off[il - l0] = aux_bytes;
            aux_bytes += hm_cuda_dsv4_layout(&xm->dsv4.dims, xm->dsv4.ratio[il], o->n_ctx, o->n_ubatch, NULL, NULL);
        }
    }
    /* the arch's buffers, then router logits, sel, cold, logits, ints, sel_all, slots, pred */
    enum { N_MORE = 8 };
    size_t act_el[HM_EXEC_MAX_BUF + N_MORE], act_off[HM_EXEC_MAX_BUF + N_MORE];
    const size_t nb = (size_t)xm->n_buf;
    for (size_t i = 0; i < nb; i++) act_el[i] = U * (size_t)xm->buf_width[i];
    const size_t more[N_MORE] = {U * NE, 2 * U * K, U * E, out ? (size_t)g->ds.logit_rows * V : 0, 3 * U,
                                 NL * g->ds.sel_stride, slot_words, 2 * U * K};
    memcpy(act_el + nb, more, sizeof more);
    const size_t act_bytes = hm_gpu_layout(act_el, act_off, nb + N_MORE);
    /* attention and the grouped MoE run one after the other on one stream: one scratch */
    g->ds.scratch_size = 0;
    if (xm->moe.n_expert > 0)
        g->ds.scratch_size = hm_gpu_max_sz(hm_cuda_moe_scratch_size((int64_t)U, (int64_t)(U * K), xm->moe.n_expert,
                                                                    xm->moe.n_ff),
                                           hm_cuda_moe_dev_scratch_size(g->ds.dec_cap, xm->moe.k, xm->moe.n_ff));
    if (xm->attn_ring) {
        g->ds.scratch_size = hm_gpu_max_sz(g->ds.scratch_size, hm_cuda_gemma_attention_scratch_size(c, hd_max(xm)));
        for (int32_t il = 0; il < xm->n_layer; il++) { /* the flash kernel's KV-split partials, per head dim */
            const hm_attn_layer *a = &xm->attn_layers[il];
            g->ds.scratch_size = hm_gpu_max_sz(g->ds.scratch_size,
                                               hm_cuda_flash_scratch_size(c, (int64_t)U, xm->n_head, a->head_dim,
                                                                          o->n_ctx));
            g->ds.scratch_size = hm_gpu_max_sz(g->ds.scratch_size,
                                               hm_cuda_flash_decode_scratch_size(c, (int64_t)U, xm->n_head,
                                                                                 a->n_head_kv, a->head_dim, o->n_ctx));
        }
    }
    else if (xm->n_kv_layer > 0 && !attn_any(xm))
        g->ds.scratch_size = hm_gpu_max_sz(g->ds.scratch_size,
                                           hm_cuda_attention_scratch_size(c, (int64_t)U, o->n_ctx, xm->n_head,
                                                                          xm->n_head_kv, xm->head_dim));
    if (xm->dsv4.hc > 0)
        g->ds.scratch_size =
            hm_gpu_max_sz(g->ds.scratch_size, dsv4_scratch(&xm->dsv4.dims, (int64_t)U, o->n_ctx, NULL));
    const size_t rest = kv_bytes + rs_bytes + aux_bytes + act_bytes + g->ds.scratch_size;

    /* the KV cache, the recurrent state (zeroed) */
    char what[96];
    snprintf(what, sizeof what, "KV cache (%d positions)", o->n_ctx);
    if (kv_bytes && (st = hm_gpu_dev_alloc_on(m, dev, kv_bytes, rest, (void **)&g->ds.kv, what, err)) != HM_OK)
        return st;
    if (rs_bytes && (st = hm_gpu_dev_alloc_on(m, dev, rs_bytes, rest - kv_bytes, (void **)&g->rs, "recurrent state",
                                              err)) != HM_OK)
        return st;
    if (aux_bytes) {
        if ((st = hm_cuda_make_current(c, err)) != HM_OK ||
            (st = hm_gpu_dev_alloc_on(m, dev, aux_bytes, rest - kv_bytes - rs_bytes, (void **)&g->aux,
                                      "compressed KV state", err)) != HM_OK ||
            (st = hm_cuda_memset(c, g->aux, 0, aux_bytes, err)) != HM_OK)
            return st;
    }
    /* activations: one device block */
    if ((st = hm_gpu_dev_alloc_on(m, dev, act_bytes, act_bytes + g->ds.scratch_size, &g->ds.dev_block, "activations",
                                  err)) != HM_OK)
        return st;
    {
        char *b = g->ds.dev_block;
        const size_t *off = act_off + nb;
        for (size_t i = 0; i < nb; i++) g->buf[i] = (float *)(b + act_off[i]);
        g->ds.x = g->buf[HM_BUF_X];
        g->ds.h = g->buf[HM_BUF_H];
        g->rlog = (float *)(b + off[0]);
        g->ds.sel = (int32_t *)(b + off[1]);
        g->ds.cold = (float *)(b + off[2]);
        g->ds.logits = out ? (float *)(b + off[3]) : NULL;
        g->ds.ints = (int32_t *)(b + off[4]);
        g->ds.sel_all = (int32_t *)(b + off[5]);
        g->ds.slots = (hm_cuda_moe_slot *)(b + off[6]);
        g->pred = (int32_t *)(b + off[7]);
    }
    if ((st = hm_gpu_dev_alloc_on(m, dev, g->ds.scratch_size, g->ds.scratch_size, &g->ds.scratch,
                                  "attention/MoE scratch", err)) != HM_OK)
        return st;
    if ((st = xdev_reset(g, err)) != HM_OK) return st;

    /* pinned host buffers: everything that crosses the bus (and the predicted ids) */
    void *pred_h = NULL;
    if ((st = hm_gpu_dstate_pin(&g->ds, U, E, K, U * K, &pred_h, err)) != HM_OK) return st;
    g->pred_h = pred_h;
    if ((st = hm_gpu_moe_host_open(&g->ds.mh, c, xm->n_layer, xm->moe.n_expert, err)) != HM_OK) return st;
    for (int32_t il = l0; il < l1; il++) g->ds.mh.mw[il] = xm->moe_layers[il].experts;
    if (xm->moe.n_expert == 0) return HM_OK; /* no MoE: no graph (its handshakes are the MoE's) */
    return hm_moe_graph_open_env(c, g->ds.mh.mw, xm->n_layer, g->ds.dec_cap, xm->moe.k, xm->n_embd, &g->ds.mh.graph,
                                 err);
}

hm_status hm_exec_gpu_state_open(const hm_model *m, const hm_state_opts *o, hm_exec_state *s, hm_err *err) {
    const hm_exec_model *xm = m->xm;
    const hm_gpu *gpu = m->gpu;
    HM_ASSERT(gpu && gpu->arch && !s->dev);
    hm_status st = hm_gpu_state_opts_check(o, err);
    if (st != HM_OK) return st;
    if (o->kv_type != HM_KV_F16 && xm->kv_v_is_k)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "%s: the compressed (MLA) KV cache on the GPU is f16 only (not %s "
                       "yet): use -ctk f16, or run on the CPU", m->arch->name, hm_kv_type_name(o->kv_type));
    if (o->kv_type != HM_KV_F16 && !xm->attn_ring && attn_any(xm))
        return hm_errf(err, HM_ERR_UNSUPPORTED, "%s: a %s KV cache on the GPU takes head_dim 64, 128 or 256 (not %d "
                       "yet): use -ctk f16, or run on the CPU", m->arch->name, hm_kv_type_name(o->kv_type),
                       xm->head_dim);
    /* one state per device that runs layers or the output, in layer order */
    hm_gpu_link links[HM_MAX_GPUS];
    const int32_t n_links = hm_gpu_chain_links(gpu, xm->n_layer, links);
    hm_xdev *last = NULL;
    for (int32_t i = 0; i < n_links; i++) {
        const hm_gpu_link L = links[i];
        if ((st = xdev_open(m, o, L.dev, L.l0, L.l1, L.out, s, &last, err)) != HM_OK) goto fail;
    }
    /* the CPU part: the route and the scratch of its MoE op; the peer units' buffers (model_gpu.h) */
    if (xm->moe.n_expert > 0 &&
        (st = hm_gpu_session_cold_open(m, &s->route, &s->scratch, xm->moe.n_expert, xm->moe.k, xm->n_embd,
                                       xm->moe.n_ff, o, err)) != HM_OK)
        goto fail;
    return HM_OK;
fail:
    hm_exec_gpu_state_close(s); /* the caller frees the rest of s */
    return st;
}

/* ---- the compute ops (per-launch and graph) ---- */

typedef struct gpu_pass {
    hm_exec_state *s;
    hm_xdev *g;             /* the device running the current layers */
    const hm_fwd_batch *b;
    bool dec;               /* decode: n <= HM_CUDA_MATVEC_MAX_TOK (routing kept on the device) */
    bool graph;             /* under capture for the decode graph */
    bool out_rows;          /* the last layer kept the wanted rows only */
    const int32_t *pos;     /* device: the carried rows' positions on g */
    int64_t kv_len;
} gpu_pass;

static gpu_pass *gp(hm_exec *x) { return x->be; }

/* Make g the pass's device: its buffers and its copy of the positions. */
static void set_dev(hm_exec *x, hm_xdev *g) {
    gpu_pass *p = gp(x);
    p->g = g;
    memcpy(x->buf, g->buf, sizeof x->buf);
    p->pos = g->ds.ints + (p->out_rows ? 2 : 1) * (size_t)p->s->n_ubatch;
}

/* The device copy of host weight `key` on the pass's device (the upload pass made it). */
static const hm_xw *dw(hm_exec *x, const void *key) {
    const hm_xw *e = hm_xmap_find(x->m->gpu->arch, key, gp(x)->g->ds.dev);
    HM_ASSERT(e);
    return e;
}

static hm_status mm(hm_cuda_ctx *c, const hm_xw *w, const float *in, int64_t n, float *y, hm_err *err) {
    if (w->any) return hm_cuda_matmul_f32_any(c, w->m.data, w->m.ne0, w->m.ne1, w->m.nb1, in, n, y, err);
    return hm_cuda_matmul(c, &w->m, in, n, y, err);
}

static hm_status g_rmsnorm(hm_exec *x, hm_buf in, const float *w, hm_buf out) {
    return hm_cuda_rmsnorm(gp(x)->g->ds.c, x->buf[in], dw(x, w)->v, x->buf[out], x->nr, x->xm->n_embd, x->xm->eps,
                           x->err);
}

static hm_status g_matmul_n(hm_exec *x, hm_buf in, const hm_mat *const *ws, const hm_buf *outs, int n) {
    hm_cuda_ctx *c = gp(x)->g->ds.c;
    const hm_xw *e[4];
    for (int i = 0; i < n; i++) e[i] = dw(x, ws[i]->data);
    int done = 0;
    if (gp(x)->dec && n >= 2 && e[0]->stack >= 0 && e[0]->pos == 0) {
        /* decode: the stacked matrices in one matvec launch (the same kernel per row) */
        const hm_xstack *sk = &((const hm_xmap *)x->m->gpu->arch)->stacks[e[0]->stack];
        int k = 1;
        while (k < n && k < sk->n && k < 3 && e[k]->stack == e[0]->stack && e[k]->pos == k) k++;
        if (k >= 2) {
            float *ys[3];
            int64_t rows[3];
            for (int i = 0; i < k; i++) ys[i] = x->buf[outs[i]], rows[i] = e[i]->m.ne1;
            hm_status st = hm_cuda_matvec_multi(c, &sk->m, x->buf[in], x->nr, k, ys, rows, x->err);
            if (st != HM_OK) return st;
            done = k;
        }
    }
    for (int i = done; i < n; i++) {
        hm_status st = mm(c, e[i], x->buf[in], x->nr, x->buf[outs[i]], x->err);
        if (st != HM_OK) return st;
    }
    return HM_OK;
}

static hm_status g_add_rmsnorm(hm_exec *x, hm_buf acc, hm_buf add, const float *w, hm_buf out) {
    return hm_cuda_add_rmsnorm(gp(x)->g->ds.c, x->buf[acc], x->buf[add], dw(x, w)->v, x->buf[out], x->nr,
                               x->xm->n_embd, x->xm->eps, x->err);
}

/* The device format of a session's KV cache type (f32 is refused at open). */
static hm_cuda_kv cuda_kv(const hm_exec_state *s) {
    return s->kv_type == HM_KV_Q8_0 ? HM_CUDA_KV_Q8_0
           : s->kv_type == HM_KV_Q4_0 ? HM_CUDA_KV_Q4_0
           : s->kv_type == HM_KV_BF16 ? HM_CUDA_KV_BF16
                                      : HM_CUDA_KV_F16;
}

/* Layer il's K and V cache on the pass's device. */
static void kv_of(const hm_exec *x, int32_t il, uint16_t **kc, uint16_t **vc) {
    const gpu_pass *p = x->be;
    const hm_kv_layer *c = &p->s->kvl[il];
    HM_ASSERT(c->bytes > 0 && c->off >= p->g->kv_off0);
    *kc = (uint16_t *)(void *)((char *)p->g->ds.kv + (c->off - p->g->kv_off0));
    *vc = x->xm->kv_v_is_k ? *kc : (uint16_t *)(void *)((char *)*kc + c->bytes);
}

static hm_status g_qk_norm_rope_kv(hm_exec *x, int32_t il, const hm_qk_rope *p) {
    const gpu_pass *ps = gp(x);
    const hm_exec_model *xm = x->xm;
    uint16_t *kc, *vc;
    kv_of(x, il, &kc, &vc);
    const bool q8 = ps->s->kv_type != HM_KV_F16;
    if (p->rope_ff || q8 || p->rope_norm || !p->q_norm || !p->k_norm) {
        /* scaled RoPE (the per-pair frequencies), a quantised cache, the normal pairing or no q/k
         * norm: the unfused ops */
        hm_cuda_ctx *c = ps->g->ds.c;
        const int nh = xm->n_head, nkv = xm->n_head_kv, hd = xm->head_dim;
        float *q = x->buf[p->q], *k = x->buf[p->k];
        const float *ff = p->rope_ff ? dw(x, p->rope_ff)->v : NULL;
        hm_status (*rope)(hm_cuda_ctx *, float *, int64_t, int, int, int, const int32_t *, float, const float *,
                          hm_err *) = p->rope_norm ? hm_cuda_rope_norm_ff : hm_cuda_rope_neox_ff;
        hm_status st;
        if (p->q_norm &&
            (st = hm_cuda_rmsnorm_heads(c, q, dw(x, p->q_norm)->v, x->nr, nh, hd, p->eps, x->err)) != HM_OK)
            return st;
        if (p->k_norm &&
            (st = hm_cuda_rmsnorm_heads(c, k, dw(x, p->k_norm)->v, x->nr, nkv, hd, p->eps, x->err)) != HM_OK)
            return st;
        if ((st = rope(c, q, x->nr, nh, hd, p->n_rot, ps->pos, p->theta, ff, x->err)) != HM_OK) return st;
        if ((st = rope(c, k, x->nr, nkv, hd, p->n_rot, ps->pos, p->theta, ff, x->err)) != HM_OK) return st;
        if (q8)
            return hm_cuda_kv_write_kv(c, cuda_kv(ps->s), kc, vc, ps->s->n_ctx, nkv, hd, k, x->buf[p->v], x->nr, ps->pos,
                                       x->err);
        return hm_cuda_kv_write(c, kc, vc, ps->s->n_ctx, nkv, hd, k, x->buf[p->v], x->nr, ps->pos, x->err);
    }
    return hm_cuda_qk_norm_rope_kv(ps->g->ds.c, x->buf[p->q], x->buf[p->k], x->buf[p->v], dw(x, p->q_norm)->v,
                                   dw(x, p->k_norm)->v, x->nr, xm->n_head, xm->n_head_kv, xm->head_dim, p->n_rot,
                                   ps->pos, p->theta, p->eps, kc, vc, ps->s->n_ctx, x->err);
}

static hm_status g_out_rows(hm_exec *x, int32_t il, const hm_buf *bufs, const int64_t *widths, int n) {
    gpu_pass *p = gp(x);
    const hm_fwd_batch *b = p->b;
    if (x->n_out == 0) {
        x->done = true;
        return HM_OK;
    }
    /* the wanted rows only from here (as the CPU's compaction; out_rows ascend, so copying forward
     * never overwrites a row still to be read) */
    hm_cuda_ctx *c = p->g->ds.c;
    if (x->xm->moe_layers[il].hash) /* the wanted rows' tokens for the hash-routed choice */
        for (int64_t r = 0; r < x->n_out; r++) {
            if (b->out_rows[r] == r) continue;
            int32_t *t = p->g->ds.ints;
            hm_status st = hm_cuda_copy(c, t + r, t + b->out_rows[r], sizeof(int32_t), x->err);
            if (st != HM_OK) return st;
        }
    for (int i = 0; i < n; i++) {
        const size_t w = (size_t)(widths ? widths[i] : x->xm->buf_width[bufs[i]]);
        float *a = x->buf[bufs[i]];
        for (int64_t r = 0; r < x->n_out; r++) {
            if (b->out_rows[r] == r) continue;
            hm_status st = hm_cuda_copy(c, a + (size_t)r * w, a + (size_t)b->out_rows[r] * w, w * sizeof(float), x->err);
            if (st != HM_OK) return st;
        }
    }
    x->nr = x->n_out;
    p->out_rows = true;
    p->pos = p->g->ds.ints + 2 * (size_t)p->s->n_ubatch;
    p->kv_len = b->pos[b->out_rows[x->n_out - 1]] + 1;
    return HM_OK;
}

static hm_status g_attention(hm_exec *x, int32_t il, hm_buf q, hm_buf out, float scale) {
    const gpu_pass *p = gp(x);
    const hm_exec_model *xm = x->xm;
    uint16_t *kc, *vc;
    kv_of(x, il, &kc, &vc);
    if (xm->kv_v_is_k) /* MLA's compressed cache (one head, V = K) */
        return hm_cuda_mla_attention(p->g->ds.c, x->buf[q], x->nr, p->pos, kc, p->s->n_ctx, xm->n_head, xm->head_dim,
                                     scale, x->buf[out], x->err);
    if (attn_any(xm))
        return hm_cuda_attention_any(p->g->ds.c, x->buf[q], x->nr, p->pos, kc, vc, p->s->n_ctx, xm->n_head,
                                     xm->n_head_kv, xm->head_dim, scale, x->buf[out], x->err);
    return hm_cuda_attention_kv(p->g->ds.c, cuda_kv(p->s),
                                x->buf[q], x->nr, p->pos, p->kv_len, kc, vc, p->s->n_ctx, xm->n_head, xm->n_head_kv,
                                xm->head_dim, scale, x->buf[out], p->g->ds.scratch, p->g->ds.scratch_size, x->err);
}

/* Where layer il's routing lives on the pass's device: *w_d the weights after the nr * k ids. */
static int32_t *routing_of(hm_exec *x, int32_t il, float **w_d) {
    int32_t *ids_d = hm_gpu_layer_ids(&gp(x)->g->ds, il, gp(x)->dec);
    *w_d = (float *)(ids_d + (size_t)x->nr * (size_t)x->xm->moe.k);
    return ids_d;
}

/* Layer L's router logits g->rlog (x->nr rows) into ids/w by the spec: the plain spec on the tuned
 * router, every other on the general one (the bias and hash table on the device from the upload
 * pass; the rows' tokens at the front of ds.ints, compacted by g_out_rows where a table needs them). */
static hm_status route_dev(hm_exec *x, const hm_moe_layer *L, int32_t *ids, float *w) {
    hm_xdev *g = gp(x)->g;
    const hm_exec_model *xm = x->xm;
    const hm_route_spec sp = hm_moe_route_spec(&xm->moe);
    if (hm_route_spec_plain(&sp) && !L->score_bias && !L->hash)
        return hm_cuda_router(g->ds.c, g->rlog, x->nr, xm->moe.n_expert, xm->moe.k, xm->moe.norm_topk, ids, w,
                              x->err);
    const float *bias = L->score_bias ? dw(x, L->score_bias)->v : NULL;
    const int32_t *hash = L->hash ? (const int32_t *)dw(x, L->hash)->v : NULL;
    return hm_cuda_route(g->ds.c, &sp, g->rlog, x->nr, bias, hash, g->ds.ints, ids, w, x->err);
}

/* The router's logits of layer L on in into rlog (+ its bias, gpt-oss). */
static hm_status router_logits(hm_exec *x, const hm_moe_layer *L, hm_buf in) {
    hm_xdev *g = gp(x)->g;
    hm_status st = mm(g->ds.c, dw(x, L->router->data), x->buf[in], x->nr, g->rlog, x->err);
    if (st == HM_OK && L->router_bias)
        st = hm_cuda_add_bias(g->ds.c, g->rlog, dw(x, L->router_bias)->v, x->nr, x->xm->moe.n_expert, x->err);
    return st;
}

static hm_status g_add_bias(hm_exec *x, hm_buf a, const float *b, int64_t width) {
    return hm_cuda_add_bias(gp(x)->g->ds.c, x->buf[a], dw(x, b)->v, x->nr, width, x->err);
}

static hm_status g_route(hm_exec *x, int32_t il, hm_buf in) {
    hm_xdev *g = gp(x)->g;
    const hm_exec_model *xm = x->xm;
    const hm_moe_layer *L = &xm->moe_layers[il];
    hm_cuda_ctx *c = g->ds.c;
    const int K = xm->moe.k;
    const size_t nk = (size_t)x->nr * (size_t)K;
    float *w_d;
    int32_t *ids_d = routing_of(x, il, &w_d);
    hm_status st = router_logits(x, L, in);
    if (st == HM_OK) st = route_dev(x, L, ids_d, w_d);
    if (st == HM_OK && L->expert_scale)
        st = hm_cuda_scale_by_id(c, w_d, ids_d, dw(x, L->expert_scale)->v, (int64_t)nk, x->err);
    return st;
}

static hm_status g_experts(hm_exec *x, int32_t il, hm_buf in, hm_buf out) {
    const gpu_pass *p = gp(x);
    hm_xdev *g = p->g;
    const hm_exec_model *xm = x->xm;
    const hm_moe_layer *L = &xm->moe_layers[il];
    hm_cuda_ctx *c = g->ds.c;
    const int K = xm->moe.k;
    const size_t nk = (size_t)x->nr * (size_t)K;
    HM_ASSERT(in == HM_BUF_H); /* the MoE step reads ds.h (gpu_chain.h) */
    float *w_d;
    int32_t *ids_d = routing_of(x, il, &w_d);
    hm_status st;
    if (p->graph)
        return hm_moe_graph_layer(g->ds.mh.graph, x->m, il, hm_gpu_layer_slots(&g->ds, il), g->ds.mh.any_hot[il],
                                  ids_d, w_d, x->nr, x->buf[in], x->buf[out], g->ds.scratch, g->ds.scratch_size,
                                  x->err);
    const hm_moe_weights *next_mw = NULL;
    const int32_t *next_ids = NULL;
    if (!p->dec && il + 1 < g->ds.l1 && xm->moe_layers[il + 1].experts && hm_moe_gpu_streams(x->m, il + 1)) {
        /* prefill streaming ahead: the next layer's router on this layer's input (the residual
         * moves little in one layer), its ids down with this layer's routing */
        const hm_moe_layer *N = &xm->moe_layers[il + 1];
        if ((st = router_logits(x, N, in)) != HM_OK) return st;
        if ((st = route_dev(x, N, g->pred, (float *)(g->pred + nk))) != HM_OK) return st;
        if ((st = hm_cuda_download_async(c, g->pred_h, g->pred, nk * sizeof(int32_t), x->err)) != HM_OK) return st;
        next_mw = N->experts;
        next_ids = g->pred_h;
    }
    return hm_gpu_moe_step(x->m, x->pool, &g->ds, L->experts, &p->s->route, &p->s->scratch, il, p->dec, x->nr, K,
                           x->buf[out], next_mw, next_ids, x->err);
}

static hm_status g_split_gate(hm_exec *x, hm_buf mix, hm_buf q, hm_buf gate) {
    return hm_cuda_split_q_gate(gp(x)->g->ds.c, x->buf[mix], x->nr, x->xm->n_head, x->xm->head_dim, x->buf[q],
                                x->buf[gate], x->err);
}

static hm_status g_sigmoid_mul(hm_exec *x, hm_buf a, hm_buf gate, int64_t width) {
    return hm_cuda_sigmoid_mul(gp(x)->g->ds.c, x->buf[a], x->buf[gate], x->nr * width, x->err);
}

static hm_status g_swiglu(hm_exec *x, hm_buf g, hm_buf u, hm_buf out, int64_t width) {
    return hm_cuda_swiglu(gp(x)->g->ds.c, x->buf[g], x->buf[u], x->buf[out], x->nr * width, x->err);
}

static hm_status g_add_sigmoid_scaled(hm_exec *x, hm_buf acc, hm_buf y, hm_buf s) {
    return hm_cuda_add_sigmoid_scaled(gp(x)->g->ds.c, x->buf[acc], x->buf[y], x->buf[s], x->nr, x->xm->n_embd,
                                      x->err);
}

static hm_status g_deltanet(hm_exec *x, int32_t il, hm_buf io, const hm_deltanet *p) {
    hm_xdev *g = gp(x)->g;
    hm_cuda_ctx *c = g->ds.c;
    const hm_deltanet_spec *d = &x->xm->dn;
    const int64_t n = x->nr, cd = d->conv_dim, vdim = (int64_t)d->n_v * d->d_v, qk = (int64_t)d->n_k * d->d_k;
    const int32_t slot = hm_exec_rs_slot(x->xm, il);
    HM_ASSERT(slot >= g->rs0 && g->rs0 >= 0);
    float *rs = g->rs + (size_t)(slot - g->rs0) * hm_exec_rs_floats(d);
    float *conv_state = rs, *delta_state = rs + (size_t)(d->d_conv - 1) * (size_t)cd;
    float *in = x->buf[io], *mix = x->buf[p->mix], *conv = x->buf[p->conv], *z = x->buf[p->z];
    float *ba = x->buf[p->ba], *aa = x->buf[p->aa], *att = x->buf[p->att];
    hm_err *err = x->err;
    hm_status st;
    /* the gates go in place: aa becomes g, ba beta (grouped: p->beta) */
    if ((st = mm(c, dw(x, p->wqkv->data), in, n, mix, err)) != HM_OK) return st;
    if ((st = mm(c, dw(x, p->wz->data), in, n, z, err)) != HM_OK) return st;
    if ((st = mm(c, dw(x, p->wbeta->data), in, n, ba, err)) != HM_OK) return st;
    if (!p->grouped && (st = mm(c, dw(x, p->walpha->data), in, n, aa, err)) != HM_OK) return st;
    if ((st = hm_cuda_ssm_conv(c, mix, cd, n, cd, dw(x, p->conv_w)->v, d->d_conv, conv_state, conv, err)) != HM_OK)
        return st;
    if ((st = hm_cuda_l2norm_heads(c, conv, cd, n, d->n_k, d->d_k, p->eps, 1.0f / sqrtf((float)d->d_k), err)) != HM_OK)
        return st;
    if ((st = hm_cuda_l2norm_heads(c, conv + qk, cd, n, d->n_k, d->d_k, p->eps, 1.0f, err)) != HM_OK) return st;
    /* grouped: beta and alpha read from the fused rows in ba, beta written to its own buffer */
    const int grp = p->grouped ? d->n_v / d->n_k : 0;
    float *beta = p->grouped ? x->buf[p->beta] : ba;
    if ((st = hm_cuda_delta_gates(c, grp ? ba + grp : aa, ba, dw(x, p->ssm_a)->v, dw(x, p->dt_bias)->v, n, d->n_v, grp,
                                  aa, beta, err)) != HM_OK)
        return st;
    if ((st = hm_cuda_gated_delta(c, conv, conv + qk, cd, conv + 2 * qk, cd, aa, beta, n, d->n_k, d->n_v, p->grouped,
                                  d->d_k, d->d_v, delta_state, att, err)) != HM_OK)
        return st;
    /* gated RMSNorm per value head: rmsnorm(o) * ssm_norm * silu(z) */
    if ((st = hm_cuda_rmsnorm_heads(c, att, dw(x, p->ssm_norm)->v, n, d->n_v, d->d_v, p->eps, err)) != HM_OK) return st;
    if ((st = hm_cuda_swiglu(c, z, att, att, n * vdim, err)) != HM_OK) return st;
    return mm(c, dw(x, p->wout->data), att, n, in, err);
}

static hm_status g_add(hm_exec *x, hm_buf acc, hm_buf add) {
    return hm_cuda_add(gp(x)->g->ds.c, x->buf[acc], x->buf[add], x->buf[acc], x->nr * x->xm->n_embd, x->err);
}

static hm_status g_scale(hm_exec *x, hm_buf a, float sc, int64_t width) {
    return hm_cuda_scale(gp(x)->g->ds.c, x->buf[a], sc, x->buf[a], x->nr * width, x->err);
}

static hm_status g_zero(hm_exec *x, hm_buf a, int64_t width) {
    return hm_cuda_memset(gp(x)->g->ds.c, x->buf[a], 0, (size_t)(x->nr * width) * sizeof(float), x->err);
}

static hm_status g_copy(hm_exec *x, hm_buf src, hm_buf dst, int64_t width) {
    return hm_cuda_copy(gp(x)->g->ds.c, x->buf[dst], x->buf[src], (size_t)(x->nr * width) * sizeof(float), x->err);
}

static hm_status g_geglu(hm_exec *x, hm_buf g, hm_buf u, hm_buf out, int64_t width) {
    return hm_cuda_gelu_mul(gp(x)->g->ds.c, x->buf[g], x->buf[u], x->buf[out], x->nr * width, x->err);
}

static hm_status g_attn_in_ring(hm_exec *x, int32_t il, const hm_ring_in *p) {
    const gpu_pass *ps = gp(x);
    hm_cuda_ctx *c = ps->g->ds.c;
    const hm_attn_layer *a = &x->xm->attn_layers[il];
    const int nh = x->xm->n_head, nkv = a->n_head_kv, hd = a->head_dim;
    float *q = x->buf[p->q], *k = x->buf[p->k], *v = x->buf[p->v];
    const float *ff = p->rope_ff ? dw(x, p->rope_ff)->v : NULL;
    uint16_t *kc, *vc;
    kv_of(x, il, &kc, &vc);
    hm_status st;
    if (!p->no_norm) {
        if ((st = hm_cuda_rmsnorm_heads(c, q, dw(x, p->q_norm)->v, x->nr, nh, hd, p->eps, x->err)) != HM_OK) return st;
        if ((st = hm_cuda_rmsnorm_heads(c, k, dw(x, p->k_norm)->v, x->nr, nkv, hd, p->eps, x->err)) != HM_OK) return st;
        if ((st = hm_cuda_rmsnorm(c, v, NULL, v, x->nr * nkv, hd, p->eps, x->err)) != HM_OK) return st;
    }
    if ((st = hm_cuda_rope_neox_ff(c, q, x->nr, nh, hd, p->n_rot, ps->pos, p->theta, ff, x->err)) != HM_OK) return st;
    if ((st = hm_cuda_rope_neox_ff(c, k, x->nr, nkv, hd, p->n_rot, ps->pos, p->theta, ff, x->err)) != HM_OK) return st;
    if (ps->s->kv_type != HM_KV_F16)
        return hm_cuda_kv_write_kv(c, cuda_kv(ps->s), kc, vc, ps->s->kvl[il].cap, nkv, hd, k, v, x->nr, ps->pos, x->err);
    return hm_cuda_kv_write_ring(c, kc, vc, ps->s->kvl[il].cap, nkv, hd, k, v, x->nr, ps->pos, x->err);
}

static hm_status g_attention_ring(hm_exec *x, int32_t il, hm_buf q, hm_buf out, float scale) {
    const gpu_pass *p = gp(x);
    const hm_attn_layer *a = &x->xm->attn_layers[il];
    uint16_t *kc, *vc;
    kv_of(x, il, &kc, &vc);
    return hm_cuda_gemma_attention_kv_sinks(p->g->ds.c, cuda_kv(p->s), x->buf[q], x->nr, p->pos, p->kv_len, kc, vc,
                                            p->s->kvl[il].cap, a->window, x->xm->n_head, a->n_head_kv, a->head_dim,
                                            scale, a->sinks ? dw(x, a->sinks)->v : NULL, x->buf[out],
                                            p->g->ds.scratch, p->g->ds.scratch_size, x->err);
}

/* The profile's wait (HOTMOE_OP_PROFILE): the current device's queued work. */
static void g_sync(hm_exec *x) { (void)hm_cuda_sync(gp(x)->g->ds.c, x->err); }
static hm_status g_rmsnorm_w(hm_exec *x, hm_buf in, const float *w, hm_buf out, int64_t width) {
    return hm_cuda_rmsnorm(gp(x)->g->ds.c, x->buf[in], w ? dw(x, w)->v : NULL, x->buf[out], x->nr, width, x->xm->eps,
                           x->err);
}

static hm_status g_mla_in(hm_exec *x, int32_t il, const hm_mla_in *p) {
    const gpu_pass *ps = gp(x);
    uint16_t *kc, *vc;
    kv_of(x, il, &kc, &vc);
    return hm_cuda_mla_in(ps->g->ds.c, x->buf[p->q], x->buf[p->qa], x->buf[p->kv], x->nr, x->xm->n_head, p->nope,
                          p->kv_lora, p->n_rot, ps->pos, p->theta, p->rope_ff ? dw(x, p->rope_ff)->v : NULL,
                          dw(x, p->kv_norm)->v, p->eps, kc, ps->s->n_ctx, x->err);
}

/* Per head: its input columns gathered, the head's matrix (a view into the uploaded 3-D tensor),
 * its output columns scattered. */
static hm_status g_matmul_heads(hm_exec *x, const hm_mat_heads *w, const hm_heads_io *io) {
    hm_cuda_ctx *c = gp(x)->g->ds.c;
    const hm_xw *e = dw(x, w->w.data);
    const int64_t k = w->w.ne0, mrows = w->w.ne1, H = w->n_head;
    float *tin = x->buf[io->tin], *tout = x->buf[io->tout];
    for (int64_t h = 0; h < H; h++) {
        hm_xw eh = *e;
        eh.m.data = (const char *)e->m.data + (size_t)h * w->nb2;
        eh.m.ne1 = mrows;
        hm_status st = hm_cuda_copy_strided(c, tin, k, x->buf[io->in] + h * io->in_stride, io->in_stride * H, x->nr,
                                            k, x->err);
        if (st == HM_OK) st = mm(c, &eh, tin, x->nr, tout, x->err);
        if (st == HM_OK)
            st = hm_cuda_copy_strided(c, x->buf[io->out] + h * io->out_stride, io->out_stride * H, tout, mrows, x->nr,
                                      mrows, x->err);
        if (st != HM_OK) return st;
    }
    return HM_OK;
}


/* ---- DeepSeek-V4 (cuda_dsv4.h; the CPU's cpu_dsv4.c step by step) ---- */

static const float *dv(hm_exec *x, const float *host) { return host ? dw(x, host)->v : NULL; }

/* The packed embeddings into hc streams, through ds.cold (free before the first MoE step). */
static hm_status g_hc_expand(hm_exec *x, hm_buf io) {
    hm_xdev *g = gp(x)->g;
    const int64_t E = x->xm->n_embd;
    hm_status st = hm_cuda_copy(g->ds.c, g->ds.cold, x->buf[io], (size_t)(x->nr * E) * sizeof(float), x->err);
    return st == HM_OK ? hm_cuda_dsv4_hc_expand(g->ds.c, g->ds.cold, x->buf[io], x->nr, E, x->xm->dsv4.hc, x->err)
                       : st;
}

static hm_status g_hc_pre(hm_exec *x, hm_buf in, const hm_hc *p, hm_buf norm, hm_buf mix, hm_buf out, bool head) {
    hm_cuda_ctx *c = gp(x)->g->ds.c;
    const hm_dsv4_spec *d = &x->xm->dsv4;
    const int64_t E = x->xm->n_embd, hc = d->hc, w = head ? hc : (2 + hc) * hc;
    hm_status st = hm_cuda_rmsnorm(c, x->buf[in], NULL, x->buf[norm], x->nr, hc * E, x->xm->eps, x->err);
    if (st == HM_OK) st = mm(c, dw(x, p->fn->data), x->buf[norm], x->nr, x->buf[mix], x->err);
    if (st == HM_OK)
        st = hm_cuda_dsv4_hc_mix(c, x->buf[mix], x->nr, (int)hc, head, dv(x, p->scale), dv(x, p->base), d->hc_iters,
                                 d->hc_eps, x->err);
    return st == HM_OK ? hm_cuda_dsv4_hc_reduce(c, x->buf[in], x->buf[mix], w, x->nr, E, (int)hc, x->buf[out], x->err)
                       : st;
}

static hm_status g_hc_post(hm_exec *x, hm_buf f, hm_buf res, hm_buf mix, hm_buf out) {
    return hm_cuda_dsv4_hc_post(gp(x)->g->ds.c, x->buf[f], x->buf[res], x->buf[mix], x->nr, x->xm->n_embd,
                                x->xm->dsv4.hc, x->buf[out], x->err);
}

static hm_status g_swiglu_clamp(hm_exec *x, hm_buf g, hm_buf u, hm_buf out, int64_t width, float limit) {
    hm_cuda_ctx *c = gp(x)->g->ds.c;
    if (limit > 0.0f)
        return hm_cuda_swiglu_clamp(c, x->buf[g], x->buf[u], x->buf[out], x->nr * width, limit, x->err);
    return hm_cuda_swiglu(c, x->buf[g], x->buf[u], x->buf[out], x->nr * width, x->err);
}

/* hm_dsv4_attention on the layer's device state. The compressors advance in chunks of at most
 * HM_DSV4_BLOCK rows (each chunk's ring rows written, then its blocks compressed): the rows a
 * chunk's blocks read are never those its own writes replace (the ring holds 2 x 128 positions),
 * the CPU's row-by-row order in effect. */
static hm_status g_dsv4_attn(hm_exec *x, int32_t il, const hm_dsv4_attn *p) {
    const gpu_pass *ps = gp(x);
    hm_xdev *g = ps->g;
    hm_cuda_ctx *c = g->ds.c;
    const hm_dsv4_dims *d = &x->xm->dsv4.dims;
    const hm_dsv4_lw *w = &p->w;
    const int32_t r = w->ratio;
    const int64_t n = x->nr, H = d->n_head, hd = d->hd, ih = d->idx_heads, ihd = d->idx_hd, n_ctx = ps->s->n_ctx;
    const int32_t *pos = ps->pos, *hpos = ps->b->pos;
    hm_err *err = x->err;
    HM_ASSERT(n == ps->b->n && g->aux && il >= g->ds.l0 && il < g->ds.l1);
    if (hpos[n - 1] - hpos[0] != n - 1) /* the chunked compressors assume consecutive positions */
        return hm_errf(err, HM_ERR_ARG, "%s: the batch's positions %d..%d are not consecutive", x->m->arch->name,
                       hpos[0], hpos[n - 1]);
    hm_cuda_dsv4_state sd;
    hm_cuda_dsv4_layout(d, r, ps->s->n_ctx, ps->s->n_ubatch, g->aux + g->aux_off[il - g->ds.l0], &sd);
    const float *ff = r ? dv(x, d->c_ff) : NULL, *cff = ff; /* the compressed layers only */
    const float ts = powf(w->theta, -2.0f / (float)d->n_rot), cts = powf(d->c_theta, -2.0f / (float)d->n_rot);
    float *h = x->buf[p->h], *qr = x->buf[p->qr], *kv = x->buf[p->kv], *q = x->buf[p->q], *out = x->buf[p->out];
    float *ca = x->buf[p->ca], *cb = x->buf[p->cb], *ia = x->buf[p->ia], *ib = x->buf[p->ib], *iq = x->buf[p->iq];
    hm_status st;
#define T(call) do { if ((st = (call)) != HM_OK) return st; } while (0)
    /* queries: rmsnorm(qr) * q_a_norm, Wq_b, per-head rmsnorm, RoPE of the tails */
    T(hm_cuda_rmsnorm(c, qr, dv(x, w->q_a_norm), qr, n, d->q_lora, d->eps, err));
    T(mm(c, dw(x, w->wq_b->data), qr, n, q, err));
    T(hm_cuda_rmsnorm(c, q, NULL, q, n * H, hd, d->eps, err));
    T(hm_cuda_dsv4_rope_tail(c, q, n, (int)H, (int)hd, d->n_rot, pos, ts, ff, false, err));
    /* the K=V row into the window's ring */
    T(hm_cuda_rmsnorm(c, kv, dv(x, w->kv_norm), kv, n, hd, d->eps, err));
    T(hm_cuda_dsv4_rope_tail(c, kv, n, 1, (int)hd, d->n_rot, pos, ts, ff, false, err));
    T(hm_cuda_dsv4_raw_write(c, kv, n, (int)hd, pos, sd.raw, sd.cap, err));
    if (r > 0) { /* the compressors */
        const int64_t cw = (r == 4 ? 2 : 1) * hd;
        T(mm(c, dw(x, w->c_kv->data), h, n, ca, err));
        T(mm(c, dw(x, w->c_gate->data), h, n, cb, err));
        if (r == 4) {
            T(mm(c, dw(x, w->i_kv->data), h, n, ia, err));
            T(mm(c, dw(x, w->i_gate->data), h, n, ib, err));
        }
        for (int64_t t0 = 0; t0 < n; t0 += HM_DSV4_BLOCK) {
            const int64_t t1 = n - t0 < HM_DSV4_BLOCK ? n : t0 + HM_DSV4_BLOCK;
            T(hm_cuda_dsv4_comp_write(c, ca, cb, dv(x, w->c_ape), t0, t1, cw, r, pos, sd.ckv, sd.csc, err));
            T(hm_cuda_dsv4_compress(c, sd.ckv, sd.csc, cw, r, r == 4, hd, dv(x, w->c_norm), d->n_rot, cts, cff, d->eps,
                                    pos, t0, t1, sd.comp, err));
            if (r == 4) {
                T(hm_cuda_dsv4_comp_write(c, ia, ib, dv(x, w->i_ape), t0, t1, 2 * ihd, 4, pos, sd.ikv, sd.isc, err));
                T(hm_cuda_dsv4_compress(c, sd.ikv, sd.isc, 2 * ihd, 4, true, ihd, dv(x, w->i_norm), d->n_rot, cts, cff,
                                        d->eps, pos, t0, t1, sd.icomp, err));
            }
        }
    }
    size_t off[2];
    dsv4_scratch(d, n, (int32_t)n_ctx, off);
    char *scr = g->ds.scratch;
    HM_ASSERT(dsv4_scratch(d, n, (int32_t)n_ctx, NULL) <= g->ds.scratch_size);
    int32_t *sel = (int32_t *)(void *)(scr + off[0]), *n_sel = (int32_t *)(void *)(scr + off[1]);
    if (r == 4) { /* the indexer: queries from qr (RoPE at the compressed base), head weights from h */
        T(mm(c, dw(x, w->i_qb->data), qr, n, iq, err));
        T(hm_cuda_dsv4_rope_tail(c, iq, n, (int)ih, (int)ihd, d->n_rot, pos, cts, cff, false, err));
        T(mm(c, dw(x, w->i_proj->data), h, n, out, err)); /* out: the head weights for now */
        T(hm_cuda_scale(c, out, 1.0f / sqrtf((float)(ihd * ih)), out, n * ih, err));
        /* the scores in shared memory: every row in one launch; else DS_IDX_ROWS rows' in the scratch */
        const int64_t step = n_ctx / 4 + 1 <= HM_CUDA_DSV4_IDX_SMEM ? n : DS_IDX_ROWS;
        for (int64_t t0 = 0; t0 < n; t0 += step)
            T(hm_cuda_dsv4_index(c, iq, out, sd.icomp, pos, t0, n - t0 < step ? n : t0 + step, (int)ih, (int)ihd,
                                 d->idx_topk, (float *)(void *)scr, n_ctx / 4 + 1, sel, n_sel, err));
    }
    const int64_t max_cmp = r == 4 ? d->idx_topk : r == 128 ? n_ctx / 128 + 1 : 0; /* compressed keys a row */
    const hm_cuda_dsv4_attn a = {.raw = sd.raw, .comp = sd.comp, .sinks = dv(x, w->sinks), .ff = ff, .sel = sel,
                                 .n_sel = n_sel, .cap = sd.cap, .ratio = r, .window = d->window,
                                 .topk = d->idx_topk, .n_head = (int32_t)H, .hd = (int32_t)hd, .n_rot = d->n_rot,
                                 .tscale = ts, .max_keys = (int64_t)d->window + max_cmp};
    T(hm_cuda_dsv4_attention(c, &a, q, n, pos, err));
    /* the grouped low-rank output: group j's heads times its rows of Wo_a */
    const int64_t G = d->o_groups, gd = H * hd / G, L = d->o_lora;
    const hm_xw *e = dw(x, w->wo_a->data);
    for (int64_t j = 0; j < G; j++) {
        hm_xw ej = *e;
        ej.m.data = (const char *)e->m.data + (size_t)(j * L) * e->m.nb1;
        ej.m.ne1 = L;
        T(hm_cuda_copy_strided(c, ca, gd, q + j * gd, H * hd, n, gd, err));
        T(mm(c, &ej, ca, n, cb, err));
        T(hm_cuda_copy_strided(c, out + j * L, G * L, cb, L, n, L, err));
    }
#undef T
    return HM_OK;
}

static const hm_exec_ops cuda_ops = {
    .rmsnorm = g_rmsnorm,
    .matmul_n = g_matmul_n,
    .add_rmsnorm = g_add_rmsnorm,
    .qk_norm_rope_kv = g_qk_norm_rope_kv,
    .out_rows = g_out_rows,
    .attention = g_attention,
    .route = g_route,
    .experts = g_experts,
    .split_gate = g_split_gate,
    .sigmoid_mul = g_sigmoid_mul,
    .swiglu = g_swiglu,
    .add_sigmoid_scaled = g_add_sigmoid_scaled,
    .deltanet = g_deltanet,
    .add = g_add,
    .scale = g_scale,
    .zero = g_zero,
    .copy = g_copy,
    .geglu = g_geglu,
    .attn_in_ring = g_attn_in_ring,
    .attention_ring = g_attention_ring,
    .rmsnorm_w = g_rmsnorm_w,
    .mla_in = g_mla_in,
    .matmul_heads = g_matmul_heads,
    .sync = g_sync,
    .add_bias = g_add_bias,
    .hc_expand = g_hc_expand,
    .hc_pre = g_hc_pre,
    .hc_post = g_hc_post,
    .dsv4_attn = g_dsv4_attn,
    .swiglu_clamp = g_swiglu_clamp,
};

/* ---- the step ---- */

#define CK(call)                                   \
    do {                                           \
        if ((st = (call)) != HM_OK) goto fail;     \
    } while (0)

/* The embeddings of the pass's tokens into x on the first device. */
static hm_status embed(hm_exec *x) {
    const gpu_pass *p = gp(x);
    hm_status st = hm_cuda_get_rows(p->g->ds.c, &dw(x, x->xm->tok_embd->data)->m, p->g->ds.ints, x->n,
                                    x->buf[HM_BUF_X], x->err);
    if (st != HM_OK || !x->xm->embd_scale) return st;
    return hm_cuda_scale(p->g->ds.c, x->buf[HM_BUF_X], x->xm->embd_scale, x->buf[HM_BUF_X], x->n * x->xm->n_embd,
                         x->err);
}

/* logits [rows, n_vocab] = out W (the output matrix), soft-capped when the arch asks. */
static hm_status logits_of(hm_exec *x, const float *in, int64_t rows, float *logits) {
    hm_cuda_ctx *c = gp(x)->g->ds.c;
    hm_status st = mm(c, dw(x, x->xm->output->data), in, rows, logits, x->err);
    if (st != HM_OK || x->xm->softcap <= 0) return st;
    return hm_cuda_softcap(c, logits, rows * (int64_t)x->xm->n_vocab, x->xm->softcap, x->err);
}

/* Floats a row of the residual stream carries between layers (what a hand-over copies): n_embd, or
 * DeepSeek-V4's hc streams of it. */
static int64_t resid_width(const hm_exec_model *xm) {
    return xm->dsv4.hc > 0 ? (int64_t)xm->dsv4.hc * xm->n_embd : xm->n_embd;
}

/* The decode graph's capture callback: the device g's part of the step (moe.h, hm_moe_graph). */
static hm_status enqueue_step(void *ctx, hm_err *err) {
    hm_exec *x = ctx;
    const gpu_pass *p = gp(x);
    hm_xdev *g = p->g;
    const hm_exec_model *xm = x->xm;
    (void)err; /* x->err is err */
    hm_status st;
    if (g == p->s->dev) CK(embed(x));
    for (int32_t il = g->ds.l0; il < g->ds.l1; il++) CK(hm_exec_layer(x, il));
    if (g->ds.out) {
        CK(g_rmsnorm(x, HM_BUF_X, xm->output_norm, HM_BUF_H));
        CK(logits_of(x, x->buf[HM_BUF_H], x->n, g->ds.logits));
    }
    return HM_OK;
fail:
    return st;
}

/* The decode graph's key beside the rows and hot layers: the attention's path and KV split (a
 * captured graph's kernel arguments, which change with kv_len). Ring attention: every layer's
 * (sliding and global layers, their head dims), folded into one value. */
static size_t graph_key(const hm_exec *x, const hm_xdev *g) {
    const gpu_pass *p = x->be;
    const hm_exec_model *xm = x->xm;
    if (xm->kv_v_is_k) return 0; /* the MLA attention: one warp per (row, head), no split */
    if (xm->dsv4.hc > 0) return 0; /* V4's attention: no split; its sizes from n_ctx and the rows only */
    if (xm->attn_ring) {
        size_t key = 0;
        for (int32_t il = 0; il < xm->n_layer; il++) {
            const hm_attn_layer *a = &xm->attn_layers[il];
            key = key * 1000003u + hm_cuda_gemma_attention_key(g->ds.c, x->n, xm->n_head, a->n_head_kv, a->head_dim,
                                                               p->kv_len, a->window, g->ds.scratch_size);
        }
        return key;
    }
    return hm_cuda_attention_key(g->ds.c, x->n, p->kv_len, xm->n_head, xm->n_head_kv, xm->head_dim, g->ds.scratch_size);
}

/* The graph decode over the chain (the first device current): each device's graph, then the
 * residual's hand-over to the next; the logits come down from the last. */
static hm_status graph_step(hm_exec *x) {
    gpu_pass *p = gp(x);
    const hm_exec_model *xm = x->xm;
    hm_exec_state *s = p->s;
    p->graph = true;
    hm_status st;
    for (hm_xdev *g = s->dev;; g = nxt(g)) {
        set_dev(x, g);
        const size_t key = graph_key(x, g);
        if ((st = hm_moe_graph_step(g->ds.mh.graph, x->m, x->pool, &s->route, &s->scratch, x->n, key, g->ds.mh.any_hot,
                                    enqueue_step, x, x->err)) != HM_OK)
            return st;
        if (!nxt(g)) break;
        if ((st = hm_gpu_hand_over(&g->ds, x->n, resid_width(xm), x->err)) != HM_OK) return st;
    }
    return hm_cuda_download(p->g->ds.c, p->b->logits, p->g->ds.logits,
                            (size_t)x->n * (size_t)xm->n_vocab * sizeof(float), x->err);
}

hm_status hm_exec_gpu_forward(const hm_model *m, hm_exec_state *s, hm_pool *pool, const hm_fwd_batch *b,
                              hm_err *err) {
    const hm_exec_model *xm = m->xm;
    hm_xdev *g = s->dev;
    const int64_t E = xm->n_embd, n = b->n, U = s->n_ubatch;
    /* hidden rows: every row goes through the last layer (n_out n), the wanted ones get logits */
    const int64_t n_want = b->n_out, n_out = b->hidden ? n : n_want;
    HM_ASSERT(g && n > 0 && n <= U && n_want <= n && b->pos[n - 1] < s->n_ctx);
    if (b->inject)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "%s: inject rows (an MTP head) on the GPU are not supported",
                       m->arch->name);
    hm_status st = HM_OK;
    gpu_pass p = {.s = s, .b = b, .kv_len = b->pos[n - 1] + 1};
    hm_exec x = {.m = m, .xm = xm, .ops = &cuda_ops, .pool = pool, .err = err, .n = n, .nr = n, .n_out = n_out,
                 .be = &p};

    /* per device: tokens, positions and the wanted rows' positions go up in one copy; which layers
     * have no cold unit this step (the slot map changes only between steps); for decode also the
     * device's slot table, uploaded when a slot map changed (the previous step ended with a sync,
     * so nothing queued still reads it) */
    p.dec = n <= HM_CUDA_MATVEC_MAX_TOK && n <= g->ds.dec_cap;
    CK(hm_gpu_chain_begin(m, &g->ds, U, b, p.dec, err));
    CK(hm_cuda_make_current(g->ds.c, err));
    if (p.dec && g->ds.mh.graph && n_out == n && b->logits && !b->hidden && n <= g->ds.logit_rows) {
        CK(graph_step(&x)); /* every flag released, the device idle, when it fails */
        return HM_OK;
    }

    x.prof = s->prof; /* not in the graph: a capture cannot wait */
    set_dev(&x, g);
    CK(embed(&x));
    for (;; g = nxt(g)) {
        set_dev(&x, g);
        for (int32_t il = g->ds.l0; il < g->ds.l1 && !x.done; il++) CK(hm_exec_layer(&x, il));
        CK(hm_gpu_routing_down(&g->ds, err)); /* decode: recorded once the step's work is done */
        if (!nxt(g) || x.done) break;
        CK(hm_gpu_hand_over(&g->ds, x.nr, resid_width(xm), err));
    }
    if (x.done || n_out == 0) {
        CK(hm_gpu_chain_sync(&s->dev->ds, err));
        hm_gpu_chain_record(m, &s->dev->ds);
        return HM_OK;
    }
    /* x rows 0..n_out-1 are the wanted rows now (compacted, or all rows in order), on the output's
     * device (the last) */
    HM_ASSERT(x.nr == n_out && (b->logits || !n_want) && g->ds.out);
    hm_cuda_ctx *c = g->ds.c;
    CK(g_rmsnorm(&x, HM_BUF_X, xm->output_norm, HM_BUF_H));
    const size_t V = (size_t)xm->n_vocab;
    const float *hrow = x.buf[HM_BUF_H];
    if (b->hidden) { /* every row's normed state down; the wanted rows (contiguous) from the first */
        CK(hm_cuda_download(c, b->hidden, x.buf[HM_BUF_H], (size_t)n * (size_t)E * sizeof(float), err));
        if (n_want) hrow += (size_t)b->out_rows[0] * (size_t)E;
    }
    for (int64_t r0 = 0; r0 < n_want; r0 += g->ds.logit_rows) {
        const int64_t nc = n_want - r0 < g->ds.logit_rows ? n_want - r0 : g->ds.logit_rows;
        CK(logits_of(&x, hrow + (size_t)r0 * (size_t)E, nc, g->ds.logits));
        /* waits for the queued work (the last chunk's wait ends the step's device work: every
         * earlier device's work came before its hand-over, which this stream waited for) */
        CK(hm_cuda_download(c, b->logits + (size_t)r0 * V, g->ds.logits, (size_t)nc * V * sizeof(float), err));
    }
    if (!n_want) CK(hm_gpu_chain_sync(&s->dev->ds, err));
    hm_gpu_chain_record(m, &s->dev->ds);
    return HM_OK;
fail:
    hm_gpu_chain_abort(&s->dev->ds);
    return st;
}
