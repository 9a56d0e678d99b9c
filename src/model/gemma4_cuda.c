/* gemma4_cuda.c - the Gemma 4 forward pass on the GPU (CUDA builds only): the dense part, the KV
 * cache and the activations on the device, the HOT expert units in VRAM slots computed there by
 * the grouped kernels (GELU gate), the cold ones by the CPU threads at the same time (moe.h).
 *
 * The layer is gemma4.c's, op for op (see there for the math): scaled embedding; per layer
 * rmsnorm, Q/K/V (V = K's projection on K = V layers), per-head q/k norms, the weightless V norm,
 * proportional/plain NEOX RoPE (cuda_gemma.h), the K/V write into the layer's cache (sliding
 * layers: the same ring of min(n_ctx, W + n_ubatch) rows as the CPU, so state_trim's rule holds
 * unchanged), windowed attention with scale 1, Wo, post-attention norm and residual; the dense
 * GELU MLP; on MoE layers the post_ffw_norm_1, the router on rmsnorm(x) * scale / sqrt(E),
 * softmax/top-k/renorm and the per-expert scale on the device, the experts on
 * rmsnorm(x) * pre_ffw_norm_2, post_ffw_norm_2; post_ffw_norm, residual, layer_output_scale.
 * After the last layer the output norm, the matmul of the wanted rows and the soft-cap.
 * The MoE runs as exec/exec_cuda.c's (see there): prefill (n > 8) with one host wait per layer
 * (routing and, when a unit may be cold, the input come down; hm_moe_forward_gpu), decode
 * (n <= 8) routed on the device through a per-layer slot table (hm_moe_forward_gpu_dev), the cold
 * units overlapping the hot launch (hm_moe_forward_gpu_cold), the routing recorded after the step.
 *
 * Numerics: as exec/exec_cuda.c (exact-f32 matvec for <= 8 rows, bf16 tensor-core matmul above,
 * f16 KV as the CPU's); the Gemma ops are f32 with the CPU's expressions.
 *
 * Memory: everything is sized in state_open (device KV per layer as the CPU's g4_kv table,
 * activations, scratch, pinned buffers); forward allocates nothing. A device that is full makes
 * the model's expert slot pool give up room (hm_model_gpu_make_room) before HM_ERR_NOMEM. The
 * device weights are the model's (m->gpu->arch, uploaded once by g4_gpu_load).
 *
 * Several devices (model_gpu.h, as exec/exec_cuda.c): each layer's weights, KV cache (ring or full)
 * and work run on hm_gpu_layer_dev's device, the embedding with layer 0, the output norm, matmul
 * and soft-cap on the output's device; one device state per device in layer order, the residual
 * rows copied to the next device at the end of a range. One device: the same kernels in the same
 * order as ever. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_gemma.h"
#include "backend/cuda/cuda_ops.h"
#include "core/alloc.h"
#include "gemma4_impl.h"
#include "model.h"
#include "gpu_chain.h"
#include "model_gpu.h"
#include "moe.h"
#include "quant/quant.h"

#define G4_LOGIT_ROWS 64 /* most rows of logits per output matmul (bounds the device logits) */

/* ---- the device weights (m->gpu->arch) ---- */

typedef struct g4_gpu_layer {
    float *attn_norm, *q_norm, *k_norm, *post_attn_norm, *ffn_norm, *post_ffw_norm;
    /* MoE layers only; expert_scale may be NULL */
    float *post_ffw_norm_1, *pre_ffw_norm_2, *post_ffw_norm_2, *router_scale, *expert_scale;
    hm_cuda_mat wq, wk, wv, wo, gate, up, down, router; /* wv.data NULL: V = K */
} g4_gpu_layer;

typedef struct g4_gpu {
    hm_cuda_mat tok_embd, output;
    float *output_norm;
    float *rope_ff[HM_MAX_GPUS]; /* per device index: [n_rot_global / 2] on each device running a
                                    global layer with frequency factors, else NULL */
    g4_gpu_layer *layers; /* [n_layer], owned */
} g4_gpu;

void g4_gpu_unload(hm_model *m) {
    if (!m->gpu || !m->gpu->arch) return;
    g4_gpu *d = m->gpu->arch;
    free(d->layers);
    free(d);
    m->gpu->arch = NULL;
}

static bool hd_ok(int hd) { return hd == 32 || hd == 64 || hd == 128 || hd == 256 || hd == 512; }

hm_status g4_gpu_load(hm_model *m, hm_err *err) {
    const g4_model *q = m->impl;
    hm_gpu *g = m->gpu;
    HM_ASSERT(q && g && !g->arch);
    const g4_layer *moe_l = NULL;
    for (int32_t il = 0; il < q->n_layer; il++) {
        const g4_layer *L = &q->layers[il];
        if (!hd_ok(L->hd))
            return hm_errf(err, HM_ERR_UNSUPPORTED, "layer %d: head_dim %d: the CUDA gemma attention takes 32, 64, "
                           "128, 256 or 512 (run the model on the CPU: drop -ngl / --vram-budget)", il, L->hd);
        if (L->moe && !moe_l) moe_l = L;
    }
    if (q->n_expert > 1024 || q->n_expert_used > 32)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "%d experts, %d used: the CUDA router takes at most 1024 and 32",
                       q->n_expert, q->n_expert_used);
    if (moe_l) g->no_gpu_experts = hm_moe_gpu_unfit(&moe_l->experts); /* the grouped MoE kernels' shapes, types */
    g4_gpu *d = calloc(1, sizeof *d);
    if (!d) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    g->arch = d;
    hm_status st;
    const int64_t E = q->n_embd;
    if (!(d->layers = calloc((size_t)q->n_layer, sizeof *d->layers))) {
        st = hm_errf(err, HM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    /* several devices (model_gpu.h): the embeddings go with layer 0, the output (and its norm) with
     * its own device, each layer's weights (and the frequency factors) with the layer */
    g->up_dev = hm_gpu_layer_dev(g, 0);
    if ((st = hm_gpu_up_mat(g, &q->tok_embd, "token_embd.weight", NULL, &d->tok_embd, err)) != HM_OK) goto fail;
    g->up_dev = hm_gpu_layer_dev(g, q->n_layer);
    if (q->output.data == q->tok_embd.data && g->up_dev == hm_gpu_layer_dev(g, 0))
        d->output = d->tok_embd; /* tied embeddings: one device copy */
    else if ((st = hm_gpu_up_mat(g, &q->output, "output.weight", NULL, &d->output, err)) != HM_OK)
        goto fail;
    if ((st = hm_gpu_up_vec(g, q->output_norm, E, "output_norm.weight", &d->output_norm, err)) != HM_OK) goto fail;
    for (int32_t il = 0; il < q->n_layer; il++) {
        const g4_layer *L = &q->layers[il];
        g->up_dev = hm_gpu_layer_dev(g, il);
        if (L->rope_ff && !d->rope_ff[g->up_dev] &&
            (st = hm_gpu_up_vec(g, L->rope_ff, L->n_rot / 2, "rope_freqs.weight", &d->rope_ff[g->up_dev], err)) !=
                HM_OK)
            goto fail;
    }
    for (int32_t il = 0; il < q->n_layer; il++) {
        const g4_layer *L = &q->layers[il];
        g4_gpu_layer *D = &d->layers[il];
        g->up_dev = hm_gpu_layer_dev(g, il);
        char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s, il), n)
#define VEC(field, len, s) \
    if ((st = hm_gpu_up_vec(g, L->field, len, NAME(s), &D->field, err)) != HM_OK) goto fail
#define MAT(field, s) \
    if ((st = hm_gpu_up_mat(g, &L->field, NAME(s), NULL, &D->field, err)) != HM_OK) goto fail
        VEC(attn_norm, E, "attn_norm.weight");
        VEC(q_norm, L->hd, "attn_q_norm.weight");
        VEC(k_norm, L->hd, "attn_k_norm.weight");
        VEC(post_attn_norm, E, "post_attention_norm.weight");
        VEC(ffn_norm, E, "ffn_norm.weight");
        VEC(post_ffw_norm, E, "post_ffw_norm.weight");
        MAT(wq, "attn_q.weight");
        MAT(wk, "attn_k.weight");
        if (L->wv.data) MAT(wv, "attn_v.weight");
        MAT(wo, "attn_output.weight");
        MAT(gate, "ffn_gate.weight");
        MAT(up, "ffn_up.weight");
        MAT(down, "ffn_down.weight");
        if (L->moe) {
            VEC(post_ffw_norm_1, E, "post_ffw_norm_1.weight");
            VEC(pre_ffw_norm_2, E, "pre_ffw_norm_2.weight");
            VEC(post_ffw_norm_2, E, "post_ffw_norm_2.weight");
            VEC(router_scale, E, "ffn_gate_inp.scale");
            VEC(expert_scale, q->n_expert, "ffn_down_exps.scale");
            MAT(router, "ffn_gate_inp.weight");
        }
#undef NAME
#undef VEC
#undef MAT
    }
    return HM_OK;
fail:
    g4_gpu_unload(m); /* the buffers themselves are m->gpu's (freed at its close) */
    return st;
}

/* ---- session state on the device ----
 *
 * One g4_gstate per device of the placement that runs layers or the output, chained in layer
 * order (s->gpu the first): each holds the KV cache of its own layers [l0, l1) only (the layers'
 * blocks as in s->kvl, sliding rings and full global caches alike, from kv_off0 = s->kvl[l0].off
 * on), and its own activations, tables and handshakes. With one device the chain has one link,
 * over every layer. */

typedef struct g4_gstate {
    hm_gpu_dstate ds;         /* first: the device, its layers, x, h, the MoE's buffers (gpu_chain.h);
                                 ds.kv is the K then V of layers [l0, l1) */
    size_t kv_off0;           /* s->kvl[l0].off: layer il's K is at kv + s->kvl[il].off - kv_off0 */
    float *q, *k, *v, *att;   /* [U, n_head*hd_max], 2x [U, n_kv_max*hd_max], [U, n_head*hd_max] */
    float *gt, *up;           /* [U, n_ff_max] the dense MLP's gate and up */
    float *mo;                /* [U, E] a block's output (attention, then the MLP + experts) */
    float *e;                 /* [U, E] the experts' sum */
    float *rlog;              /* [U, n_expert] router logits */
} g4_gstate;

/* The next device's state of the chain. */
static g4_gstate *nxt(const g4_gstate *g) { return (g4_gstate *)g->ds.next; }

void g4_gpu_state_close(g4_state *s) {
    for (g4_gstate *g = s->gpu, *nx; g; g = nx) {
        nx = nxt(g);
        hm_gpu_dstate_free(&g->ds);
        free(g);
    }
    s->gpu = NULL;
}

/* The device state of device index dev for layers [l0, l1) (and the output when out), linked at
 * once after *last (s's first when *last is NULL; a half-open one is freed with the chain), *last
 * set to it. */
static hm_status gstate_open(const hm_model *m, const hm_state_opts *o, g4_state *s, int32_t dev, int32_t l0,
                             int32_t l1, bool out, g4_gstate **last, hm_err *err) {
    const g4_model *q = m->impl;
    g4_gstate *g = calloc(1, sizeof *g);
    if (!g) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    if (*last) (*last)->ds.next = &g->ds;
    else s->gpu = g;
    *last = g;
    const size_t U = (size_t)o->n_ubatch, E = (size_t)q->n_embd;
    const size_t nq = (size_t)q->n_head * (size_t)q->hd_max, nkv = (size_t)q->n_kv_max * (size_t)q->hd_max;
    const size_t nff = (size_t)q->n_ff_max, K = (size_t)(q->n_expert_used > 0 ? q->n_expert_used : 1);
    const size_t NE = (size_t)(q->n_expert > 0 ? q->n_expert : 1), NL = (size_t)q->n_layer;
    const size_t V = (size_t)q->n_vocab;
    hm_status st =
        hm_gpu_dstate_init(&g->ds, m, o, dev, l0, l1, out, q->n_layer, q->n_expert, G4_LOGIT_ROWS, K, err);
    if (st != HM_OK) return st;
    hm_cuda_ctx *c = g->ds.c;
    const size_t slot_words = NL * NE * sizeof(hm_cuda_moe_slot) / 4;

    /* sizes first: a device that is full makes the expert pool give up room for all of them */
    size_t kv_elems = 0, kv_bytes = 0;
    g->kv_off0 = l0 < l1 ? s->kvl[l0].off : 0;
    for (int32_t il = l0; il < l1; il++) kv_elems += 2 * s->kvl[il].elems;
    if (!hm_mul_ok(kv_elems, 2, &kv_bytes))
        return hm_errf(err, HM_ERR_NOMEM, "gpu: the KV cache for %d positions is too large", o->n_ctx);
    const size_t act_el[] = {U * E, U * E, U * nq, U * nkv, U * nkv, U * nq, U * nff, U * nff, U * E, U * E,
                             U * NE, 2 * U * K, U * E, out ? (size_t)g->ds.logit_rows * V : 0, 3 * U,
                             NL * g->ds.sel_stride, slot_words};
    size_t act_off[sizeof act_el / sizeof act_el[0]];
    const size_t act_bytes = hm_gpu_layout(act_el, act_off, sizeof act_el / sizeof act_el[0]);
    g->ds.scratch_size = hm_cuda_gemma_attention_scratch_size(c, q->hd_max);
    if (q->n_expert > 0) {
        g->ds.scratch_size = hm_gpu_max_sz(g->ds.scratch_size, hm_cuda_moe_scratch_size((int64_t)U, (int64_t)(U * K),
                                                                                        q->n_expert, q->n_ff_exp));
        g->ds.scratch_size = hm_gpu_max_sz(g->ds.scratch_size,
                                           hm_cuda_moe_dev_scratch_size(g->ds.dec_cap, q->n_expert_used, q->n_ff_exp));
    }

    char what[96];
    snprintf(what, sizeof what, "KV cache (%d positions)", o->n_ctx);
    if (kv_bytes && (st = hm_gpu_dev_alloc_on(m, dev, kv_bytes, kv_bytes + act_bytes + g->ds.scratch_size,
                                              (void **)&g->ds.kv, what, err)) != HM_OK)
        return st;
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
        g->gt = (float *)(b + off[6]);
        g->up = (float *)(b + off[7]);
        g->mo = (float *)(b + off[8]);
        g->e = (float *)(b + off[9]);
        g->rlog = (float *)(b + off[10]);
        g->ds.sel = (int32_t *)(b + off[11]);
        g->ds.cold = (float *)(b + off[12]);
        g->ds.logits = out ? (float *)(b + off[13]) : NULL;
        g->ds.ints = (int32_t *)(b + off[14]);
        g->ds.sel_all = (int32_t *)(b + off[15]);
        g->ds.slots = (hm_cuda_moe_slot *)(b + off[16]);
    }
    if ((st = hm_gpu_dev_alloc_on(m, dev, g->ds.scratch_size, g->ds.scratch_size, &g->ds.scratch,
                                  "attention/MoE scratch", err)) != HM_OK)
        return st;
    if ((st = hm_gpu_dstate_pin(&g->ds, U, E, K, 0, NULL, err)) != HM_OK) return st;
    if ((st = hm_gpu_moe_host_open(&g->ds.mh, c, q->n_layer, q->n_expert, err)) != HM_OK) return st;
    for (int32_t il = l0; il < l1; il++)
        g->ds.mh.mw[il] = q->layers[il].moe ? &q->layers[il].experts : NULL;
    if (q->n_expert > 0)
        return hm_moe_graph_open_env(c, g->ds.mh.mw, q->n_layer, g->ds.dec_cap, q->n_expert_used, q->n_embd,
                                     &g->ds.mh.graph, err);
    return HM_OK;
}

hm_status g4_gpu_state_open(const hm_model *m, const hm_state_opts *o, g4_state *s, hm_err *err) {
    const g4_model *q = m->impl;
    const hm_gpu *gpu = m->gpu;
    HM_ASSERT(gpu && gpu->arch && !s->gpu && s->kvl);
    hm_status st = hm_gpu_state_opts_check(o, err);
    if (st != HM_OK) return st;
    s->es = 2;
    /* one state per device that runs layers or the output, in layer order */
    hm_gpu_link links[HM_MAX_GPUS];
    const int32_t n_links = hm_gpu_chain_links(gpu, q->n_layer, links);
    g4_gstate *last = NULL;
    for (int32_t i = 0; i < n_links; i++) {
        const hm_gpu_link L = links[i];
        if ((st = gstate_open(m, o, s, L.dev, L.l0, L.l1, L.out, &last, err)) != HM_OK) goto fail;
    }
    /* the CPU part: the route and the scratch of its MoE op; the peer units' buffers (model_gpu.h) */
    if (q->n_expert > 0 && (st = hm_gpu_session_cold_open(m, &s->route, &s->scratch, q->n_expert, q->n_expert_used,
                                                          q->n_embd, q->n_ff_exp, o, err)) != HM_OK)
        goto fail;
    return HM_OK;
fail:
    g4_gpu_state_close(s); /* the caller frees the rest of s */
    return st;
}

/* ---- forward ---- */

#define CK(call)                               \
    do {                                       \
        if ((st = (call)) != HM_OK) goto fail; \
    } while (0)

/* Layer il's K cache in its device's state g (its V follows, s->kvl[il].elems further). */
static uint16_t *kv_of(const g4_state *s, const g4_gstate *g, int32_t il) {
    return g->ds.kv + (s->kvl[il].off - g->kv_off0);
}

/* The routing of layer il's MoE block on rows nr, into ids_d / w_d ([nr, k] device): routed on
 * rmsnorm(x) * router_scale / sqrt(E), weights scaled per expert; then g->ds.h = the experts' input
 * rmsnorm(x) * pre_ffw_norm_2 and g->e = 0 (what the experts accumulate into). */
static hm_status moe_route(const hm_model *m, g4_gstate *g, int32_t il, int64_t nr, int32_t *ids_d, float *w_d,
                           hm_err *err) {
    const g4_model *q = m->impl;
    const g4_gpu_layer *D = &((const g4_gpu *)m->gpu->arch)->layers[il];
    hm_cuda_ctx *c = g->ds.c;
    const int64_t E = q->n_embd;
    const int K = q->n_expert_used;
    const size_t nk = (size_t)nr * (size_t)K;
    hm_status st;
    if ((st = hm_cuda_rmsnorm(c, g->ds.x, D->router_scale, g->ds.h, nr, E, q->eps, err)) != HM_OK) return st;
    if ((st = hm_cuda_scale(c, g->ds.h, 1.0f / sqrtf((float)E), g->ds.h, nr * E, err)) != HM_OK) return st;
    if ((st = hm_cuda_matmul(c, &D->router, g->ds.h, nr, g->rlog, err)) != HM_OK) return st;
    if ((st = hm_cuda_router(c, g->rlog, nr, q->n_expert, K, true, ids_d, w_d, err)) != HM_OK) return st;
    if (D->expert_scale && (st = hm_cuda_scale_by_id(c, w_d, ids_d, D->expert_scale, (int64_t)nk, err)) != HM_OK)
        return st;
    /* the experts' input (the router's input is consumed: h is free again) */
    if ((st = hm_cuda_rmsnorm(c, g->ds.x, D->pre_ffw_norm_2, g->ds.h, nr, E, q->eps, err)) != HM_OK) return st;
    return hm_cuda_memset(c, g->e, 0, (size_t)(nr * E) * sizeof(float), err);
}

/* The MoE block of layer il on rows nr on its device's state g: g->e = the experts of the input
 * moe_route leaves in g->ds.h (hot on the device, cold on the CPU). */
static hm_status moe_block(const hm_model *m, g4_state *s, g4_gstate *g, hm_pool *pool, int32_t il, int64_t nr,
                           bool dec, hm_err *err) {
    const g4_model *q = m->impl;
    const g4_layer *L = &q->layers[il];
    const int K = q->n_expert_used;
    const size_t nk = (size_t)nr * (size_t)K;
    hm_status st;
    int32_t *ids_d = hm_gpu_layer_ids(&g->ds, il, dec);
    float *w_d = (float *)(ids_d + nk);
    if ((st = moe_route(m, g, il, nr, ids_d, w_d, err)) != HM_OK) return st;
    return hm_gpu_moe_step(m, pool, &g->ds, &L->experts, &s->route, &s->scratch, il, dec, nr, K, g->e, NULL, NULL,
                           err);
}

/* ---- decode as one graph (moe.h, hm_moe_graph): the same ops as g4_gpu_forward's decode path,
 * captured once and replayed (every row wants logits: no compaction); bit-identical to it. The
 * graph's key is the attention's KV split of the sliding and of the global layers. With several
 * devices each has its own graph over its own layers (the embedding in the first's, the output in
 * the output device's), launched in layer order after the residual's hand-over (outside the
 * graphs, ordered by an event). */

/* Layer il's attention input for n rows, both paths: g->ds.h = rmsnorm(x), Q, K and V (K = V on a
 * layer without wv, copied before the norms), the per-head q/k norms and the weightless v norm,
 * RoPE (proportional on global layers), the K/V ring write. */
static hm_status attn_in(const hm_model *m, const g4_state *s, g4_gstate *g, int32_t il, int64_t n,
                         const int32_t *pos_d, hm_err *err) {
    const g4_model *q = m->impl;
    const g4_gpu *d = m->gpu->arch;
    const g4_layer *L = &q->layers[il];
    const g4_gpu_layer *D = &d->layers[il];
    hm_cuda_ctx *c = g->ds.c;
    const int hd = L->hd, nkv = L->n_kv, nh = q->n_head;
    const g4_kv *kl = &s->kvl[il];
    uint16_t *kc = kv_of(s, g, il), *vc = kc + kl->elems;
    const float *ff = L->swa ? NULL : d->rope_ff[g->ds.dev];
    hm_status st;
    if ((st = hm_cuda_rmsnorm(c, g->ds.x, D->attn_norm, g->ds.h, n, q->n_embd, q->eps, err)) != HM_OK) return st;
    if ((st = hm_cuda_matmul(c, &D->wq, g->ds.h, n, g->q, err)) != HM_OK) return st;
    if ((st = hm_cuda_matmul(c, &D->wk, g->ds.h, n, g->k, err)) != HM_OK) return st;
    st = D->wv.data ? hm_cuda_matmul(c, &D->wv, g->ds.h, n, g->v, err)
                    : hm_cuda_copy(c, g->v, g->k, (size_t)(n * nkv * hd) * sizeof(float), err);
    if (st != HM_OK) return st;
    if ((st = hm_cuda_rmsnorm_heads(c, g->q, D->q_norm, n, nh, hd, q->eps, err)) != HM_OK) return st;
    if ((st = hm_cuda_rmsnorm_heads(c, g->k, D->k_norm, n, nkv, hd, q->eps, err)) != HM_OK) return st;
    if ((st = hm_cuda_rmsnorm(c, g->v, NULL, g->v, n * nkv, hd, q->eps, err)) != HM_OK) return st;
    if ((st = hm_cuda_rope_neox_ff(c, g->q, n, nh, hd, L->n_rot, pos_d, L->theta, ff, err)) != HM_OK) return st;
    if ((st = hm_cuda_rope_neox_ff(c, g->k, n, nkv, hd, L->n_rot, pos_d, L->theta, ff, err)) != HM_OK) return st;
    return hm_cuda_kv_write_ring(c, kc, vc, kl->cap, nkv, hd, g->k, g->v, n, pos_d, err);
}

/* After the attention of layer il on n rows, both paths: Wo, the post-attention norm and the
 * residual (x = attn_out), then the dense GELU MLP of rmsnorm(x) * ffn_norm into g->mo. */
static hm_status attn_out_mlp(const hm_model *m, g4_gstate *g, int32_t il, int64_t n, hm_err *err) {
    const g4_model *q = m->impl;
    const g4_layer *L = &q->layers[il];
    const g4_gpu_layer *D = &((const g4_gpu *)m->gpu->arch)->layers[il];
    hm_cuda_ctx *c = g->ds.c;
    const int64_t E = q->n_embd;
    hm_status st;
    if ((st = hm_cuda_matmul(c, &D->wo, g->att, n, g->mo, err)) != HM_OK) return st;
    if ((st = hm_cuda_rmsnorm(c, g->mo, D->post_attn_norm, g->mo, n, E, q->eps, err)) != HM_OK) return st;
    if ((st = hm_cuda_add(c, g->ds.x, g->mo, g->ds.x, n * E, err)) != HM_OK) return st;
    if ((st = hm_cuda_rmsnorm(c, g->ds.x, D->ffn_norm, g->ds.h, n, E, q->eps, err)) != HM_OK) return st;
    if ((st = hm_cuda_matmul(c, &D->gate, g->ds.h, n, g->gt, err)) != HM_OK) return st;
    if ((st = hm_cuda_matmul(c, &D->up, g->ds.h, n, g->up, err)) != HM_OK) return st;
    if ((st = hm_cuda_gelu_mul(c, g->gt, g->up, g->gt, n * L->n_ff, err)) != HM_OK) return st;
    return hm_cuda_matmul(c, &D->down, g->gt, n, g->mo, err);
}

typedef struct g4_step {
    const hm_model *m;
    g4_state *s;
    g4_gstate *g; /* the device whose graph is captured */
    int64_t n, kv_len;
} g4_step;

static hm_status enqueue_step(void *ctx, hm_err *err) {
    const g4_step *p = ctx;
    const hm_model *m = p->m;
    g4_state *s = p->s;
    g4_gstate *g = p->g;
    const int64_t n = p->n;
    const g4_model *q = m->impl;
    const g4_gpu *d = m->gpu->arch;
    hm_cuda_ctx *c = g->ds.c;
    const int64_t E = q->n_embd, U = s->n_ubatch;
    const int nh = q->n_head, K = q->n_expert_used;
    const size_t nk = (size_t)n * (size_t)K;
    const int32_t *tok_d = g->ds.ints, *pos_d = g->ds.ints + U;
    hm_status st;
    if (g == s->gpu) {
        CK(hm_cuda_get_rows(c, &d->tok_embd, tok_d, n, g->ds.x, err));
        CK(hm_cuda_scale(c, g->ds.x, q->embd_scale, g->ds.x, n * E, err));
    }
    for (int32_t il = g->ds.l0; il < g->ds.l1; il++) {
        const g4_layer *L = &q->layers[il];
        const g4_gpu_layer *D = &d->layers[il];
        const int hd = L->hd, nkv = L->n_kv;
        const g4_kv *kl = &s->kvl[il];
        uint16_t *kc = kv_of(s, g, il), *vc = kc + kl->elems;
        CK(attn_in(m, s, g, il, n, pos_d, err));
        CK(hm_cuda_gemma_attention(c, g->q, n, pos_d, p->kv_len, kc, vc, kl->cap, L->swa ? q->window : 0, nh, nkv, hd,
                                   1.0f, g->att, g->ds.scratch, g->ds.scratch_size, err));
        CK(attn_out_mlp(m, g, il, n, err));
        if (L->moe) {
            CK(hm_cuda_rmsnorm(c, g->mo, D->post_ffw_norm_1, g->mo, n, E, q->eps, err));
            int32_t *ids_d = hm_gpu_layer_ids(&g->ds, il, true);
            float *w_d = (float *)(ids_d + nk);
            CK(moe_route(m, g, il, n, ids_d, w_d, err));
            CK(hm_moe_graph_layer(g->ds.mh.graph, m, il, hm_gpu_layer_slots(&g->ds, il), g->ds.mh.any_hot[il], ids_d,
                                  w_d, n, g->ds.h, g->e, g->ds.scratch, g->ds.scratch_size, err));
            CK(hm_cuda_rmsnorm(c, g->e, D->post_ffw_norm_2, g->e, n, E, q->eps, err));
            CK(hm_cuda_add(c, g->mo, g->e, g->mo, n * E, err));
        }
        CK(hm_cuda_rmsnorm(c, g->mo, D->post_ffw_norm, g->mo, n, E, q->eps, err));
        CK(hm_cuda_add(c, g->ds.x, g->mo, g->ds.x, n * E, err));
        if (L->out_scale != 1.0f) CK(hm_cuda_scale(c, g->ds.x, L->out_scale, g->ds.x, n * E, err));
    }
    if (g->ds.out) {
        CK(hm_cuda_rmsnorm(c, g->ds.x, d->output_norm, g->ds.h, n, E, q->eps, err));
        CK(hm_cuda_matmul(c, &d->output, g->ds.h, n, g->ds.logits, err));
        if (q->softcap > 0) CK(hm_cuda_softcap(c, g->ds.logits, n * (int64_t)q->n_vocab, q->softcap, err));
    }
    return HM_OK;
fail:
    return st;
}

static hm_status graph_step(const hm_model *m, g4_state *s, hm_pool *pool, const hm_fwd_batch *b, hm_err *err) {
    const g4_model *q = m->impl;
    const int64_t n = b->n;
    g4_step p = {.m = m, .s = s, .n = n, .kv_len = b->pos[n - 1] + 1};
    hm_status st = HM_OK;
    g4_gstate *g = s->gpu;
    for (;; g = nxt(g)) {
        p.g = g;
        const size_t key = (size_t)hm_cuda_gemma_attention_splits(g->ds.c, n, q->n_head, p.kv_len, q->window) * 4096 +
                           (size_t)hm_cuda_gemma_attention_splits(g->ds.c, n, q->n_head, p.kv_len, 0);
        if ((st = hm_moe_graph_step(g->ds.mh.graph, m, pool, &s->route, &s->scratch, n, key, g->ds.mh.any_hot,
                                    enqueue_step, &p, err)) != HM_OK)
            return st;
        if (!nxt(g)) break;
        if ((st = hm_gpu_hand_over(&g->ds, n, q->n_embd, err)) != HM_OK) return st;
    }
    return hm_cuda_download(g->ds.c, b->logits, g->ds.logits, (size_t)n * (size_t)q->n_vocab * sizeof(float), err);
}

hm_status g4_gpu_forward(const hm_model *m, g4_state *s, hm_pool *pool, const hm_fwd_batch *b, hm_err *err) {
    const g4_model *q = m->impl;
    const g4_gpu *d = m->gpu->arch;
    g4_gstate *g = s->gpu;
    const int64_t E = q->n_embd, n = b->n, n_out = b->n_out, U = s->n_ubatch;
    const int nh = q->n_head;
    HM_ASSERT(g && n > 0 && n <= U && n_out <= n && b->pos[n - 1] < s->n_ctx);
    hm_status st = HM_OK;

    /* per device: tokens, positions and the wanted rows' positions go up in one copy; which MoE
     * layers have no cold unit this step; for decode also the device's slot table, uploaded when
     * a slot map changed (the previous step ended with a sync) */
    const bool dec = n <= HM_CUDA_MATVEC_MAX_TOK && n <= g->ds.dec_cap;
    CK(hm_gpu_chain_begin(m, &g->ds, U, b, dec, err));
    if (dec && g->ds.mh.graph && n_out == n && b->logits && n <= g->ds.logit_rows) {
        CK(hm_cuda_make_current(g->ds.c, err));
        CK(graph_step(m, s, pool, b, err)); /* every flag released, the device idle, when it fails */
        return HM_OK;
    }

    CK(hm_cuda_make_current(g->ds.c, err));
    CK(hm_cuda_get_rows(g->ds.c, &d->tok_embd, g->ds.ints, n, g->ds.x, err));
    CK(hm_cuda_scale(g->ds.c, g->ds.x, q->embd_scale, g->ds.x, n * E, err));
    int64_t nr = n;
    bool last_rows = false; /* the wanted rows' positions instead of all (the last layer on) */
    int64_t kv_len = b->pos[n - 1] + 1;
    bool done_early = false;
    for (;; g = nxt(g)) {
        hm_cuda_ctx *c = g->ds.c;
        const int32_t *pos_d = g->ds.ints + U, *pos = last_rows ? g->ds.ints + 2 * U : pos_d;
        for (int32_t il = g->ds.l0; il < g->ds.l1 && !done_early; il++) {
            const g4_layer *L = &q->layers[il];
            const g4_gpu_layer *D = &d->layers[il];
            const int hd = L->hd, nkv = L->n_kv;
            const size_t nq = (size_t)nh * (size_t)hd;
            const g4_kv *kl = &s->kvl[il];
            uint16_t *kc = kv_of(s, g, il), *vc = kc + kl->elems;

            /* attention block */
            CK(attn_in(m, s, g, il, n, pos_d, err));

            if (il == q->n_layer - 1 && n_out < n) {
                /* last layer: only the wanted rows go on (out_rows ascend: copying forward is safe) */
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
            CK(hm_cuda_gemma_attention(c, g->q, nr, pos, kv_len, kc, vc, kl->cap, L->swa ? q->window : 0, nh, nkv,
                                       hd, 1.0f, g->att, g->ds.scratch, g->ds.scratch_size, err));
            CK(attn_out_mlp(m, g, il, nr, err)); /* x = attn_out; mo = the dense MLP's output */

            if (L->moe) {
                CK(hm_cuda_rmsnorm(c, g->mo, D->post_ffw_norm_1, g->mo, nr, E, q->eps, err));
                CK(moe_block(m, s, g, pool, il, nr, dec, err));
                CK(hm_cuda_rmsnorm(c, g->e, D->post_ffw_norm_2, g->e, nr, E, q->eps, err));
                CK(hm_cuda_add(c, g->mo, g->e, g->mo, nr * E, err));
            }
            CK(hm_cuda_rmsnorm(c, g->mo, D->post_ffw_norm, g->mo, nr, E, q->eps, err));
            CK(hm_cuda_add(c, g->ds.x, g->mo, g->ds.x, nr * E, err));
            if (L->out_scale != 1.0f) CK(hm_cuda_scale(c, g->ds.x, L->out_scale, g->ds.x, nr * E, err));
        }
        CK(hm_gpu_routing_down(&g->ds, err)); /* decode: recorded once the step's work is done */
        if (!nxt(g) || done_early) break;
        CK(hm_gpu_hand_over(&g->ds, nr, E, err));
    }
    if (done_early || n_out == 0) {
        CK(hm_gpu_chain_sync(&s->gpu->ds, err)); /* nothing may still read a slot */
        hm_gpu_chain_record(m, &s->gpu->ds);
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
        if (q->softcap > 0) CK(hm_cuda_softcap(c, g->ds.logits, nc * (int64_t)V, q->softcap, err));
        /* waits for the queued work (the last chunk's wait ends the step's device work: every
         * earlier device's work came before its hand-over, which this stream waited for) */
        CK(hm_cuda_download(c, b->logits + (size_t)r0 * V, g->ds.logits, (size_t)nc * V * sizeof(float), err));
    }
    hm_gpu_chain_record(m, &s->gpu->ds);
    return HM_OK;
fail:
    hm_gpu_chain_abort(&s->gpu->ds);
    return st;
}
