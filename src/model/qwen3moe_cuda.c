/* qwen3moe_cuda.c - the Qwen3-MoE forward pass on the GPU (CUDA builds only): the dense part, the
 * KV cache and the activations on the device, the HOT expert units in VRAM slots computed there,
 * the cold ones by the CPU threads at the same time (moe.h, hm_moe_forward_gpu).
 *
 * The layer is qwen3moe.c's, op for op (see there). Per layer the device does rmsnorm, Q/K/V,
 * the per-head norms + RoPE + K/V write (one fused launch), attention, Wo, the residual add + FFN
 * norm (one fused launch), the router matmul and softmax/top-k. Then the MoE, two ways:
 *   - prefill (n > 8): the layer's ONE host wait: the routing (ids + weights) and, when some unit
 *     of the layer may be cold, the normed input come down to pinned buffers and the host syncs.
 *     The host records the routing in the store, groups it by unit, queues the hot units' grouped
 *     launch, computes the cold ones, and queues their sum's upload and add.
 *   - decode (n <= 8): the hot units run from the router's device output through a per-layer
 *     table of slot pointers (uploaded at step start when a slot map changed): no host staging.
 *     A layer whose units are ALL hot has no host wait at all; another one downloads its routing
 *     and input, records an event, queues the hot launch and waits for the event only (the GPU
 *     computes the hot units while the host computes the cold ones). Every layer's routing stays
 *     on the device and comes down in one copy at the end of the step, where it is recorded in
 *     the store (it only counts; the session's step_end comes after forward).
 *     A decode step whose rows all want logits runs instead as ONE CUDA graph (moe.h,
 *     hm_moe_graph): the same ops captured once and replayed, the cold units' host round trip
 *     happening inside it through flags in mapped memory, and none at all for a layer whose
 *     routed units are all hot (HOTMOE_CUDA_GRAPH=0 keeps the per-launch path).
 * The next layer's ops are queued behind that without a wait. After the last layer, the output
 * norm and matmul of the wanted rows and the logits' download (a sync); without wanted logits, a
 * plain sync: the store refills slots between steps and no queued kernel may still read them then.
 *
 * Numerics (cuda_ops.h): batches of <= 8 rows take the exact-f32 matvec path (decode: the CPU's
 * results up to summation order); larger ones the bf16 tensor-core matmul (prefill: bf16
 * rounding of weights and activations). The KV cache is f16 as the CPU's.
 *
 * Memory: everything is sized in state_open for n_ctx and n_ubatch (device KV, activations,
 * scratch; pinned host buffers for everything that crosses the bus; the CPU route and scratch
 * for the cold units). forward allocates nothing. When the device state does not fit, the
 * model's expert slot pool gives up whole chunks of slots for it (hm_model_gpu_make_room, a
 * warning); only with the pool empty (or too small to help) is the open HM_ERR_NOMEM. The device
 * weights are the model's (m->gpu->arch, uploaded once by q3_gpu_load); the states borrow them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_ops.h"
#include "core/alloc.h"
#include "model.h"
#include "gpu_chain.h"
#include "model_gpu.h"
#include "moe.h"
#include "quant/quant.h"
#include "qwen3moe_impl.h"

/* Most rows of logits computed per output matmul (bounds the device logits buffer). */
#define Q3_LOGIT_ROWS 64

/* ---- the device weights (m->gpu->arch) ---- */

typedef struct q3_gpu_layer {
    float *attn_norm, *q_norm, *k_norm, *ffn_norm;
    hm_cuda_mat wq, wk, wv, wo, router;
    /* wq|wk (n_qkv 2) or wq|wk|wv (3) stacked in one device matrix when their types and rows
     * match: decode gets them in one matvec launch; wq, wk (, wv) are views into it. 0: apart. */
    hm_cuda_mat wqkv;
    int n_qkv;
} q3_gpu_layer;

typedef struct q3_gpu {
    hm_cuda_mat tok_embd, output;
    float *output_norm;
    q3_gpu_layer *layers; /* [n_layer], owned */
} q3_gpu;

void q3_gpu_unload(hm_model *m) {
    if (!m->gpu || !m->gpu->arch) return;
    q3_gpu *d = m->gpu->arch;
    free(d->layers);
    free(d);
    m->gpu->arch = NULL;
}

/* Upload wq|wk (|wv when it matches too) as one stacked device matrix, D's views into it. Returns
 * HM_OK with D->n_qkv 0 (nothing uploaded) when the types or rows differ. */
static hm_status up_qkv(hm_gpu *g, const q3_layer *L, q3_gpu_layer *D, int32_t il, hm_err *err) {
    const hm_mat *m3[3] = {&L->wq, &L->wk, &L->wv};
    int n = 0;
    while (n < 3 && m3[n]->type == L->wq.type && m3[n]->ne0 == L->wq.ne0 && m3[n]->nb1 == L->wq.nb1 &&
           m3[n]->nb1 == hm_row_size(L->wq.type, L->wq.ne0))
        n++;
    D->n_qkv = 0;
    if (n < 2 || !hm_cuda_type_ok(L->wq.type)) return HM_OK;
    int64_t rows = 0;
    for (int i = 0; i < n; i++) rows += m3[i]->ne1;
    const size_t nb1 = L->wq.nb1;
    char *buf = malloc(nb1 * (size_t)rows);
    if (!buf) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        memcpy(buf + at, m3[i]->data, nb1 * (size_t)m3[i]->ne1);
        at += nb1 * (size_t)m3[i]->ne1;
    }
    const hm_mat cat = {.data = buf, .type = L->wq.type, .ne0 = L->wq.ne0, .ne1 = rows, .nb1 = nb1};
    char name[96];
    snprintf(name, sizeof name, "blk.%d.attn_q|k%s (stacked)", il, n == 3 ? "|v" : "");
    hm_status st = hm_gpu_up_mat(g, &cat, name, NULL, &D->wqkv, err);
    free(buf);
    if (st != HM_OK) return st;
    hm_cuda_mat *views[3] = {&D->wq, &D->wk, &D->wv};
    at = 0;
    for (int i = 0; i < n; i++) {
        *views[i] = D->wqkv;
        views[i]->data = (const char *)D->wqkv.data + at;
        views[i]->ne1 = m3[i]->ne1;
        at += nb1 * (size_t)m3[i]->ne1;
    }
    D->n_qkv = n;
    return HM_OK;
}

hm_status q3_gpu_load(hm_model *m, hm_err *err) {
    const q3_model *q = m->impl;
    hm_gpu *g = m->gpu;
    HM_ASSERT(q && g && !g->arch);
    if (q->head_dim != 64 && q->head_dim != 128 && q->head_dim != 256)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "head_dim %d: the CUDA attention takes 64, 128 or 256 (run the "
                       "model on the CPU: drop -ngl / --vram-budget)", q->head_dim);
    g->no_gpu_experts = hm_moe_gpu_unfit(&q->layers[0].moe); /* the grouped MoE kernels' shapes and types */
    if (q->n_expert > 1024 || q->n_expert_used > 32)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "%d experts, %d used: the CUDA router takes at most 1024 and 32",
                       q->n_expert, q->n_expert_used);
    q3_gpu *d = calloc(1, sizeof *d);
    if (!d) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    g->arch = d;
    hm_status st;
    const int64_t E = q->n_embd, hd = q->head_dim;
    if (!(d->layers = calloc((size_t)q->n_layer, sizeof *d->layers))) {
        st = hm_errf(err, HM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    /* several devices (model_gpu.h): the embeddings go with layer 0, the output with its own
     * device, each layer's weights with the layer */
    g->up_dev = hm_gpu_layer_dev(g, 0);
    if ((st = hm_gpu_up_mat(g, &q->tok_embd, "token_embd.weight", NULL, &d->tok_embd, err)) != HM_OK) goto fail;
    g->up_dev = hm_gpu_layer_dev(g, q->n_layer);
    if (q->output.data == q->tok_embd.data && g->up_dev == hm_gpu_layer_dev(g, 0))
        d->output = d->tok_embd; /* tied embeddings: one device copy */
    else if ((st = hm_gpu_up_mat(g, &q->output, "output.weight", NULL, &d->output, err)) != HM_OK)
        goto fail;
    if ((st = hm_gpu_up_vec(g, q->output_norm, E, "output_norm.weight", &d->output_norm, err)) != HM_OK) goto fail;
    for (int32_t il = 0; il < q->n_layer; il++) {
        const q3_layer *L = &q->layers[il];
        q3_gpu_layer *D = &d->layers[il];
        g->up_dev = hm_gpu_layer_dev(g, il);
        char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s ".weight", il), n)
        if ((st = hm_gpu_up_vec(g, L->attn_norm, E, NAME("attn_norm"), &D->attn_norm, err)) != HM_OK) goto fail;
        if ((st = hm_gpu_up_vec(g, L->q_norm, hd, NAME("attn_q_norm"), &D->q_norm, err)) != HM_OK) goto fail;
        if ((st = hm_gpu_up_vec(g, L->k_norm, hd, NAME("attn_k_norm"), &D->k_norm, err)) != HM_OK) goto fail;
        if ((st = hm_gpu_up_vec(g, L->ffn_norm, E, NAME("ffn_norm"), &D->ffn_norm, err)) != HM_OK) goto fail;
        if ((st = up_qkv(g, L, D, il, err)) != HM_OK) goto fail;
        if (D->n_qkv < 1 && (st = hm_gpu_up_mat(g, &L->wq, NAME("attn_q"), NULL, &D->wq, err)) != HM_OK) goto fail;
        if (D->n_qkv < 2 && (st = hm_gpu_up_mat(g, &L->wk, NAME("attn_k"), NULL, &D->wk, err)) != HM_OK) goto fail;
        if (D->n_qkv < 3 && (st = hm_gpu_up_mat(g, &L->wv, NAME("attn_v"), NULL, &D->wv, err)) != HM_OK) goto fail;
        if ((st = hm_gpu_up_mat(g, &L->wo, NAME("attn_output"), NULL, &D->wo, err)) != HM_OK) goto fail;
        if ((st = hm_gpu_up_mat(g, &L->router, NAME("ffn_gate_inp"), NULL, &D->router, err)) != HM_OK) goto fail;
#undef NAME
    }
    return HM_OK;
fail:
    q3_gpu_unload(m); /* the buffers themselves are m->gpu's (freed at its close) */
    return st;
}

/* ---- session state on the device ----
 *
 * One q3_gstate per device of the placement that runs layers or the output, chained in layer
 * order (s->g the first): each holds the KV cache of its own layers [l0, l1) only, and its own
 * activations, tables and handshakes. With one device the chain has one link, over every layer. */

typedef struct q3_gstate {
    hm_gpu_dstate ds;         /* first: the device, its layers, x, h, the MoE's buffers (gpu_chain.h);
                                 ds.kv is [l1 - l0][2][n_head_kv][n_ctx][head_dim] */
    size_t kv_layer_elems;    /* n_head_kv * n_ctx * head_dim */
    float *q, *k, *v, *att;   /* [U, n_head*hd], 2x [U, n_head_kv*hd], [U, n_head*hd] */
    float *rlog;              /* [U, n_expert] router logits */
    int32_t *pred;            /* [2 * U * k]: prefill, the next layer's routing predicted on this
                                 layer's MoE input (for streaming ahead: moe.h, next_ids) */
    int32_t *pred_h;          /* [U * k] the predicted ids, down (in ds.pin) */
} q3_gstate;

/* The next device's state of the chain. */
static q3_gstate *nxt(const q3_gstate *g) { return (q3_gstate *)g->ds.next; }

void q3_gpu_state_close(q3_state *s) {
    for (q3_gstate *g = s->g, *nx; g; g = nx) {
        nx = nxt(g);
        hm_gpu_dstate_free(&g->ds);
        free(g);
    }
    s->g = NULL;
}

/* The device state of device index dev for layers [l0, l1) (and the output when out), linked at
 * once after *last (s's first when *last is NULL; a half-open one is freed with the chain), *last
 * set to it. */
static hm_status gstate_open(const hm_model *m, const hm_state_opts *o, int32_t dev, int32_t l0, int32_t l1, bool out,
                             q3_state *s, q3_gstate **last, hm_err *err) {
    const q3_model *q = m->impl;
    q3_gstate *g = calloc(1, sizeof *g);
    if (!g) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    if (*last) (*last)->ds.next = &g->ds;
    else s->g = g;
    *last = g;
    const size_t U = (size_t)o->n_ubatch, E = (size_t)q->n_embd, hd = (size_t)q->head_dim;
    const size_t nq = (size_t)q->n_head * hd, nkv = (size_t)q->n_head_kv * hd, K = (size_t)q->n_expert_used;
    const size_t V = (size_t)q->n_vocab;
    hm_status st =
        hm_gpu_dstate_init(&g->ds, m, o, dev, l0, l1, out, q->n_layer, q->n_expert, Q3_LOGIT_ROWS, K, err);
    if (st != HM_OK) return st;
    hm_cuda_ctx *c = g->ds.c;
    const size_t NL = (size_t)q->n_layer, NE = (size_t)q->n_expert;
    const size_t slot_words = NL * NE * sizeof(hm_cuda_moe_slot) / 4;

    /* sizes first: a device that is full makes the expert pool give up room for all of them */
    g->kv_layer_elems = nkv * (size_t)o->n_ctx;
    size_t kv_bytes = 0;
    if (!hm_mul_ok(g->kv_layer_elems, 2u * (size_t)(l1 - l0) * 2u, &kv_bytes))
        return hm_errf(err, HM_ERR_NOMEM, "gpu: the KV cache for %d positions is too large", o->n_ctx);
    const size_t act_el[] = {U * E, U * E, U * nq, U * nkv, U * nkv, U * nq, U * (size_t)q->n_expert, 2 * U * K,
                             U * E, out ? (size_t)g->ds.logit_rows * V : 0, 3 * U, NL * g->ds.sel_stride, slot_words,
                             2 * U * K};
    size_t act_off[sizeof act_el / sizeof act_el[0]];
    const size_t act_bytes = hm_gpu_layout(act_el, act_off, sizeof act_el / sizeof act_el[0]);
    /* attention and the grouped MoE run one after the other on one stream: one scratch */
    g->ds.scratch_size =
        hm_gpu_max_sz(hm_cuda_attention_scratch_size(c, (int64_t)U, o->n_ctx, q->n_head, q->n_head_kv, q->head_dim),
                      hm_cuda_moe_scratch_size((int64_t)U, (int64_t)(U * K), q->n_expert, q->n_ff_exp));
    g->ds.scratch_size =
        hm_gpu_max_sz(g->ds.scratch_size, hm_cuda_moe_dev_scratch_size(g->ds.dec_cap, q->n_expert_used, q->n_ff_exp));

    /* the KV cache */
    char what[96];
    snprintf(what, sizeof what, "KV cache (%d positions)", o->n_ctx);
    if (kv_bytes && (st = hm_gpu_dev_alloc_on(m, dev, kv_bytes, kv_bytes + act_bytes + g->ds.scratch_size,
                                              (void **)&g->ds.kv, what, err)) != HM_OK)
        return st;
    /* activations: one device block */
    if ((st = hm_gpu_dev_alloc_on(m, dev, act_bytes, act_bytes + g->ds.scratch_size, &g->ds.dev_block, "activations",
                                  err)) != HM_OK)
        return st;
    {
        char *b = g->ds.dev_block;
        const size_t *off = act_off;
        g->ds.x = (float *)(b + off[0]);
        g->ds.h = (float *)(b + off[1]);
        g->q = (float *)(b + off[2]);
        g->k = (float *)(b + off[3]);
        g->v = (float *)(b + off[4]);
        g->att = (float *)(b + off[5]);
        g->rlog = (float *)(b + off[6]);
        g->ds.sel = (int32_t *)(b + off[7]);
        g->ds.cold = (float *)(b + off[8]);
        g->ds.logits = out ? (float *)(b + off[9]) : NULL;
        g->ds.ints = (int32_t *)(b + off[10]);
        g->ds.sel_all = (int32_t *)(b + off[11]);
        g->ds.slots = (hm_cuda_moe_slot *)(b + off[12]);
        g->pred = (int32_t *)(b + off[13]);
    }
    if ((st = hm_gpu_dev_alloc_on(m, dev, g->ds.scratch_size, g->ds.scratch_size, &g->ds.scratch,
                                  "attention/MoE scratch", err)) != HM_OK)
        return st;

    /* pinned host buffers: everything that crosses the bus (and the predicted ids) */
    void *pred_h = NULL;
    if ((st = hm_gpu_dstate_pin(&g->ds, U, E, K, U * K, &pred_h, err)) != HM_OK) return st;
    g->pred_h = pred_h;
    if ((st = hm_gpu_moe_host_open(&g->ds.mh, c, q->n_layer, q->n_expert, err)) != HM_OK) return st;
    for (int32_t il = l0; il < l1; il++)
        g->ds.mh.mw[il] = &q->layers[il].moe;
    return hm_moe_graph_open_env(c, g->ds.mh.mw, q->n_layer, g->ds.dec_cap, q->n_expert_used, q->n_embd,
                                 &g->ds.mh.graph, err);
}

hm_status q3_gpu_state_open(const hm_model *m, const hm_state_opts *o, q3_state *s, hm_err *err) {
    const q3_model *q = m->impl;
    const hm_gpu *gpu = m->gpu;
    HM_ASSERT(gpu && gpu->arch && !s->g);
    hm_status st = hm_gpu_state_opts_check(o, err);
    if (st != HM_OK) return st;
    s->kv_elem_size = 2;
    s->kv_layer_elems = (size_t)q->n_head_kv * (size_t)q->head_dim * (size_t)o->n_ctx;
    /* one state per device that runs layers or the output, in layer order */
    hm_gpu_link links[HM_MAX_GPUS];
    const int32_t n_links = hm_gpu_chain_links(gpu, q->n_layer, links);
    q3_gstate *last = NULL;
    for (int32_t i = 0; i < n_links; i++) {
        const hm_gpu_link L = links[i];
        if ((st = gstate_open(m, o, L.dev, L.l0, L.l1, L.out, s, &last, err)) != HM_OK) goto fail;
    }
    /* the CPU part: the route and the scratch of its MoE op; the peer units' buffers (model_gpu.h) */
    if ((st = hm_gpu_session_cold_open(m, &s->route, &s->scratch, q->n_expert, q->n_expert_used, q->n_embd,
                                       q->n_ff_exp, o, err)) != HM_OK)
        goto fail;
    return HM_OK;
fail:
    q3_gpu_state_close(s); /* the caller frees the rest of s */
    return st;
}

/* ---- forward ---- */

#define CK(call)                                   \
    do {                                           \
        if ((st = (call)) != HM_OK) goto fail;     \
    } while (0)

/* Layer il's K and V cache of its device's state. */
static void kv_of(const q3_gstate *g, int32_t il, uint16_t **kc, uint16_t **vc) {
    *kc = g->ds.kv + (size_t)(il - g->ds.l0) * 2 * g->kv_layer_elems;
    *vc = *kc + g->kv_layer_elems;
}

/* ---- decode as one graph (moe.h, hm_moe_graph) ----
 *
 * The step's device work (enqueue_step) is captured once and replayed; hm_moe_graph_step captures
 * it again when its key changes: the rows, the attention's split (its scratch size grows with
 * kv_len in steps of 256 positions) or the layers with any hot unit. Results are bit-identical to
 * the per-launch path: the same kernels in the same order, the cold sum added after the hot units.
 * With several devices each has its own graph over its own layers, launched in layer order after
 * the residual's hand-over (outside the graphs, ordered by an event). */

/* The attention block's input side for n rows, both paths: g->ds.h = rmsnorm(x), Q/K/V (stacked
 * q|k(|v) in one launch when `dec` and the layer has them: the same kernel per row, the same
 * results), then the per-head norms, RoPE of q and k and the K/V write in one launch. */
static hm_status attn_in(const q3_model *q, const q3_gpu_layer *D, q3_state *s, q3_gstate *g, int64_t n, bool dec,
                         const int32_t *pos_d, uint16_t *kc, uint16_t *vc, hm_err *err) {
    hm_cuda_ctx *c = g->ds.c;
    hm_status st;
    if ((st = hm_cuda_rmsnorm(c, g->ds.x, D->attn_norm, g->ds.h, n, q->n_embd, q->eps, err)) != HM_OK) return st;
    if (dec && D->n_qkv >= 2) {
        float *const ys[3] = {g->q, g->k, g->v};
        const int64_t rows[3] = {D->wq.ne1, D->wk.ne1, D->wv.ne1};
        if ((st = hm_cuda_matvec_multi(c, &D->wqkv, g->ds.h, n, D->n_qkv, ys, rows, err)) != HM_OK) return st;
        if (D->n_qkv < 3 && (st = hm_cuda_matmul(c, &D->wv, g->ds.h, n, g->v, err)) != HM_OK) return st;
    } else {
        if ((st = hm_cuda_matmul(c, &D->wq, g->ds.h, n, g->q, err)) != HM_OK) return st;
        if ((st = hm_cuda_matmul(c, &D->wk, g->ds.h, n, g->k, err)) != HM_OK) return st;
        if ((st = hm_cuda_matmul(c, &D->wv, g->ds.h, n, g->v, err)) != HM_OK) return st;
    }
    return hm_cuda_qk_norm_rope_kv(c, g->q, g->k, g->v, D->q_norm, D->k_norm, n, q->n_head, q->n_head_kv,
                                   q->head_dim, q->n_rot, pos_d, q->theta, q->eps, kc, vc, s->n_ctx, err);
}

typedef struct q3_step {
    const hm_model *m;
    q3_state *s;
    q3_gstate *g; /* the device whose graph is captured */
    int64_t n, kv_len;
} q3_step;

static hm_status enqueue_step(void *ctx, hm_err *err) {
    const q3_step *p = ctx;
    const hm_model *m = p->m;
    q3_state *s = p->s;
    q3_gstate *g = p->g;
    const int64_t n = p->n;
    const q3_model *q = m->impl;
    const q3_gpu *d = m->gpu->arch;
    hm_cuda_ctx *c = g->ds.c;
    const int64_t E = q->n_embd, U = s->n_ubatch;
    const int hd = q->head_dim, nh = q->n_head, nkv = q->n_head_kv, K = q->n_expert_used;
    const float scale = 1.0f / sqrtf((float)hd);
    const int32_t *tok_d = g->ds.ints, *pos_d = g->ds.ints + U;
    const size_t nk = (size_t)n * (size_t)K;
    hm_status st;
    if (g == s->g) CK(hm_cuda_get_rows(c, &d->tok_embd, tok_d, n, g->ds.x, err));
    for (int32_t il = g->ds.l0; il < g->ds.l1; il++) {
        const q3_gpu_layer *D = &d->layers[il];
        uint16_t *kc, *vc;
        kv_of(g, il, &kc, &vc);
        CK(attn_in(q, D, s, g, n, true, pos_d, kc, vc, err));
        CK(hm_cuda_attention(c, g->q, n, pos_d, p->kv_len, kc, vc, s->n_ctx, nh, nkv, hd, scale, g->att, g->ds.scratch,
                             g->ds.scratch_size, err));
        CK(hm_cuda_matmul(c, &D->wo, g->att, n, g->ds.h, err));
        CK(hm_cuda_add_rmsnorm(c, g->ds.x, g->ds.h, D->ffn_norm, g->ds.h, n, E, q->eps, err));
        CK(hm_cuda_matmul(c, &D->router, g->ds.h, n, g->rlog, err));
        int32_t *ids_d = hm_gpu_layer_ids(&g->ds, il, true);
        float *w_d = (float *)(ids_d + nk);
        CK(hm_cuda_router(c, g->rlog, n, q->n_expert, K, true, ids_d, w_d, err));
        CK(hm_moe_graph_layer(g->ds.mh.graph, m, il, hm_gpu_layer_slots(&g->ds, il), g->ds.mh.any_hot[il], ids_d, w_d,
                              n, g->ds.h, g->ds.x, g->ds.scratch, g->ds.scratch_size, err));
    }
    if (g->ds.out) {
        CK(hm_cuda_rmsnorm(c, g->ds.x, d->output_norm, g->ds.h, n, E, q->eps, err));
        CK(hm_cuda_matmul(c, &d->output, g->ds.h, n, g->ds.logits, err));
    }
    return HM_OK;
fail:
    return st;
}

static hm_status graph_step(const hm_model *m, q3_state *s, hm_pool *pool, const hm_fwd_batch *b, hm_err *err) {
    const q3_model *q = m->impl;
    const int64_t n = b->n;
    q3_step p = {.m = m, .s = s, .n = n, .kv_len = b->pos[n - 1] + 1};
    hm_status st = HM_OK;
    q3_gstate *g = s->g;
    for (;; g = nxt(g)) {
        p.g = g;
        const size_t key = hm_cuda_attention_scratch_size(g->ds.c, n, p.kv_len, q->n_head, q->n_head_kv, q->head_dim);
        if ((st = hm_moe_graph_step(g->ds.mh.graph, m, pool, &s->route, &s->scratch, n, key, g->ds.mh.any_hot,
                                    enqueue_step, &p, err)) != HM_OK)
            return st;
        if (!nxt(g)) break;
        if ((st = hm_gpu_hand_over(&g->ds, n, q->n_embd, err)) != HM_OK) return st;
    }
    return hm_cuda_download(g->ds.c, b->logits, g->ds.logits, (size_t)n * (size_t)q->n_vocab * sizeof(float), err);
}

hm_status q3_gpu_forward(const hm_model *m, q3_state *s, hm_pool *pool, const hm_fwd_batch *b, hm_err *err) {
    const q3_model *q = m->impl;
    const q3_gpu *d = m->gpu->arch;
    q3_gstate *g = s->g;
    const int64_t E = q->n_embd, n = b->n, n_out = b->n_out, U = s->n_ubatch;
    const int hd = q->head_dim, nh = q->n_head, nkv = q->n_head_kv, K = q->n_expert_used;
    const size_t nq = (size_t)nh * (size_t)hd;
    const float scale = 1.0f / sqrtf((float)hd);
    HM_ASSERT(g && n > 0 && n <= U && n_out <= n && b->pos[n - 1] < s->n_ctx);
    hm_status st = HM_OK;

    /* per device: tokens, positions and the wanted rows' positions go up in one copy; which layers
     * have no cold unit this step (the slot map changes only between steps); for decode also the
     * device's slot table, uploaded when a slot map changed (the previous step ended with a sync,
     * so nothing queued still reads it) */
    const bool dec = n <= HM_CUDA_MATVEC_MAX_TOK && n <= g->ds.dec_cap;
    CK(hm_gpu_chain_begin(m, &g->ds, U, b, dec, err));
    if (dec && g->ds.mh.graph && n_out == n && b->logits) {
        CK(hm_cuda_make_current(g->ds.c, err));
        CK(graph_step(m, s, pool, b, err)); /* every flag released, the device idle, when it fails */
        return HM_OK;
    }

    CK(hm_cuda_make_current(g->ds.c, err));
    CK(hm_cuda_get_rows(g->ds.c, &d->tok_embd, g->ds.ints, n, g->ds.x, err));
    int64_t nr = n;                /* rows carried through the layer (all but in the last layer) */
    bool last_rows = false;        /* the wanted rows' positions instead of all (the last layer on) */
    int64_t kv_len = b->pos[n - 1] + 1;
    bool done_early = false;
    for (;; g = nxt(g)) {
        hm_cuda_ctx *c = g->ds.c;
        const int32_t *pos_d = g->ds.ints + U, *pos = last_rows ? g->ds.ints + 2 * U : pos_d;
        for (int32_t il = g->ds.l0; il < g->ds.l1 && !done_early; il++) {
            const q3_layer *L = &q->layers[il];
            const q3_gpu_layer *D = &d->layers[il];
            uint16_t *kc, *vc;
            kv_of(g, il, &kc, &vc);

            /* attention block: Q/K/V of every row (the cache needs all K/V rows) */
            CK(attn_in(q, D, s, g, n, dec, pos_d, kc, vc, err));

            if (il == q->n_layer - 1 && n_out < n) {
                /* last layer: only the wanted rows go on (as the CPU's compaction; out_rows ascend,
                 * so copying forward never overwrites a row still to be read) */
                if (n_out == 0) {
                    done_early = true;
                    break;
                }
                CK(hm_gpu_compact_qx(c, g->q, nq, g->ds.x, (size_t)E, b->out_rows, n_out, err));
                nr = n_out;
                last_rows = true;
                pos = g->ds.ints + 2 * U;
                kv_len = b->pos[b->out_rows[n_out - 1]] + 1;
            }
            CK(hm_cuda_attention(c, g->q, nr, pos, kv_len, kc, vc, s->n_ctx, nh, nkv, hd, scale, g->att, g->ds.scratch,
                                 g->ds.scratch_size, err));
            CK(hm_cuda_matmul(c, &D->wo, g->att, nr, g->ds.h, err));

            /* MoE block: the residual add and the FFN norm in one launch, route on the device */
            CK(hm_cuda_add_rmsnorm(c, g->ds.x, g->ds.h, D->ffn_norm, g->ds.h, nr, E, q->eps, err));
            CK(hm_cuda_matmul(c, &D->router, g->ds.h, nr, g->rlog, err));
            const size_t nk = (size_t)nr * (size_t)K;
            int32_t *ids_d = hm_gpu_layer_ids(&g->ds, il, dec);
            CK(hm_cuda_router(c, g->rlog, nr, q->n_expert, K, true, ids_d, (float *)(ids_d + nk), err));
            const hm_moe_weights *next_mw = NULL;
            const int32_t *next_ids = NULL;
            if (!dec && il + 1 < g->ds.l1 && hm_moe_gpu_streams(m, il + 1)) {
                /* prefill streaming ahead: the next layer's router on this layer's input (the
                 * residual moves little in one layer), its ids down with this layer's routing */
                CK(hm_cuda_matmul(c, &d->layers[il + 1].router, g->ds.h, nr, g->rlog, err));
                CK(hm_cuda_router(c, g->rlog, nr, q->n_expert, K, true, g->pred, (float *)(g->pred + nk), err));
                CK(hm_cuda_download_async(c, g->pred_h, g->pred, nk * sizeof(int32_t), err));
                next_mw = &q->layers[il + 1].moe;
                next_ids = g->pred_h;
            }
            CK(hm_gpu_moe_step(m, pool, &g->ds, &L->moe, &s->route, &s->scratch, il, dec, nr, K, g->ds.x, next_mw,
                               next_ids, err));
        }
        CK(hm_gpu_routing_down(&g->ds, err)); /* decode: recorded once the step's work is done */
        if (!nxt(g) || done_early) break;
        CK(hm_gpu_hand_over(&g->ds, nr, E, err));
    }
    if (done_early || n_out == 0) {
        CK(hm_gpu_chain_sync(&s->g->ds, err));
        hm_gpu_chain_record(m, &s->g->ds);
        return HM_OK;
    }
    /* x rows 0..n_out-1 are the wanted rows now (compacted above, or all rows in order), on the
     * output's device (the last) */
    HM_ASSERT(nr == n_out && b->logits && g->ds.out);
    hm_cuda_ctx *c = g->ds.c;
    CK(hm_cuda_rmsnorm(c, g->ds.x, d->output_norm, g->ds.h, n_out, E, q->eps, err));
    const size_t V = (size_t)q->n_vocab;
    for (int64_t r0 = 0; r0 < n_out; r0 += g->ds.logit_rows) {
        const int64_t nc = n_out - r0 < g->ds.logit_rows ? n_out - r0 : g->ds.logit_rows;
        CK(hm_cuda_matmul(c, &d->output, g->ds.h + (size_t)r0 * (size_t)E, nc, g->ds.logits, err));
        /* waits for the queued work (the last chunk's wait ends the step's device work: every
         * earlier device's work came before its hand-over, which this stream waited for) */
        CK(hm_cuda_download(c, b->logits + (size_t)r0 * V, g->ds.logits, (size_t)nc * V * sizeof(float), err));
    }
    hm_gpu_chain_record(m, &s->g->ds);
    return HM_OK;
fail:
    hm_gpu_chain_abort(&s->g->ds);
    return st;
}
