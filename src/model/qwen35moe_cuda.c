/* qwen35moe_cuda.c - the Qwen3.5-MoE forward pass on the GPU (CUDA builds only), as
 * qwen3moe_cuda.c does it for qwen3moe: the dense part, the KV cache of the attention layers, the
 * DeltaNet layers' recurrent state (conv window + delta state S) and the activations on the device;
 * the HOT expert units in VRAM slots computed there, the cold ones by the CPU threads at the same
 * time (moe.h: hm_moe_forward_gpu for prefill, hm_moe_forward_gpu_dev + _cold for decode).
 *
 * The layer is qwen35moe_fwd.c's, op for op (the math is in qwen35moe.c's header):
 *   DeltaNet: qkv / z / beta / alpha matmuls, causal conv + SiLU (state carried), L2 norm of q
 *     (scaled 1/sqrt(d_k)) and k, the gates, the delta rule token by token (cuda_linattn.h), the
 *     gated RMSNorm (per-head rmsnorm * ssm_norm, then silu(z) *), the out matmul;
 *   attention: [q | gate] matmul and split, K, V, per-head norms + partial NEOX rotary + K/V write
 *     (one fused launch), causal GQA attention, * sigmoid(gate), Wo;
 *   then x += mixer; h = rmsnorm(x) * post_norm (one fused launch); the router and the shared
 *     expert (SwiGLU, scaled by sigmoid(h . w_sh), added into x), then the routed units.
 * The MoE step is qwen3moe_cuda.c's: prefill (n > 8) downloads the routing (and the input when a
 * unit of the layer may be cold), syncs once, records it and splits hot / cold; decode (n <= 8)
 * routes the hot units on the device through a per-layer slot table, with a host round trip only
 * for a layer that may have cold units, and records every layer's routing after the step.
 * In the last layer only the wanted rows go on past the token mixer (as the CPU does).
 *
 * Numerics (cuda_ops.h): batches of <= 8 rows take the exact-f32 matvec path (decode: the CPU's
 * results up to summation order; the delta rule is the CPU's token-by-token order); larger ones
 * the bf16 tensor-core matmul. The KV cache is f16 as the CPU's default. A matrix the CUDA
 * kernels do not take because of its width (ne0 not a multiple of 32: tiny test models) runs
 * through the exact f32 fallback when it is F32; attention of a head_dim other than 64 / 128 / 256
 * through the plain fallback (cuda_linattn.h).
 *
 * With --ram-budget (m->ram) the cold units go through the RAM tier inside moe_cuda.c, as for
 * qwen3moe. Memory: sized in state_open for n_ctx and n_ubatch; forward allocates nothing. A device that is
 * full makes the model's expert slot pool give up room (hm_model_gpu_make_room), as for qwen3moe.
 *
 * Several GPUs (model_gpu.h, as qwen3moe_cuda.c): each device holds the weights of its layer range
 * (the embeddings with layer 0, the output with its own device) and a session state of its own
 * (the KV cache of its attention layers, the recurrent state of its DeltaNet layers, activations,
 * slot tables, decode graph); the forward runs the ranges device after device and copies the
 * residual across at each boundary. One device: the single-device path, the same kernels in the
 * same order. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_linattn.h"
#include "backend/cuda/cuda_ops.h"
#include "core/alloc.h"
#include "model.h"
#include "gpu_chain.h"
#include "model_gpu.h"
#include "moe.h"
#include "quant/quant.h"
#include "qwen35moe.h"

#define Q35_LOGIT_ROWS 64 /* most rows of logits per output matmul */

/* ---- the device weights (m->gpu->arch) ---- */

/* A device matrix; any: F32 of a width the CUDA matmul does not take (the f32 fallback runs it). */
typedef struct q35_gmat {
    hm_cuda_mat m;
    bool any;
} q35_gmat;

typedef struct q35_gpu_layer {
    float *attn_norm, *post_norm;
    q35_gmat wq, wk, wv, wo;          /* attention */
    float *q_norm, *k_norm;
    q35_gmat wqkv, wz, wbeta, walpha, wout; /* DeltaNet */
    float *conv_w, *dt_bias, *ssm_a, *ssm_norm;
    q35_gmat router, sh_gate, sh_up, sh_down, sh_inp;
} q35_gpu_layer;

typedef struct q35_gpu {
    hm_cuda_mat tok_embd;
    q35_gmat output;
    float *output_norm;
    bool attn_any;           /* head_dim is not one hm_cuda_attention takes: the fallback */
    q35_gpu_layer *layers;   /* [n_layer], owned */
} q35_gpu;

void q35_gpu_unload(hm_model *m) {
    if (!m->gpu || !m->gpu->arch) return;
    q35_gpu *d = m->gpu->arch;
    free(d->layers);
    free(d);
    m->gpu->arch = NULL;
}

/* Upload matrix w (tensor `name`); F32 rows the CUDA kernels do not take go to the fallback (any). */
static hm_status up_mat(hm_gpu *g, const hm_mat *w, const char *name, q35_gmat *out, hm_err *err) {
    return hm_gpu_up_mat(g, w, name, &out->any, &out->m, err);
}

hm_status q35_gpu_load(hm_model *m, hm_err *err) {
    const q35_model *q = m->impl;
    hm_gpu *g = m->gpu;
    HM_ASSERT(q && g && !g->arch);
    if (q->n_attn > 0 && q->head_dim > 256)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "head_dim %d: the CUDA attention takes at most 256 (run the model "
                       "on the CPU: drop -ngl / --vram-budget)", q->head_dim);
    if (q->n_recr > 0 && (q->d_k > 1024 || q->d_v > 1024 || q->n_v > 65535))
        return hm_errf(err, HM_ERR_UNSUPPORTED, "DeltaNet heads %d x (%d, %d): the CUDA delta rule takes d_k, d_v "
                       "<= 1024 (run the model on the CPU)", q->n_v, q->d_k, q->d_v);
    if (q->n_expert > 1024 || q->n_expert_used > 32)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "%d experts, %d used: the CUDA router takes at most 1024 and 32",
                       q->n_expert, q->n_expert_used);
    g->no_gpu_experts = hm_moe_gpu_unfit(&q->layers[0].moe); /* the grouped MoE kernels' shapes and types */

    q35_gpu *d = calloc(1, sizeof *d);
    if (!d) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    g->arch = d;
    hm_status st;
    const int64_t E = q->n_embd, hd = q->head_dim, nv = q->n_v;
    d->attn_any = hd != 64 && hd != 128 && hd != 256;
    if (!(d->layers = calloc((size_t)q->n_layer, sizeof *d->layers))) {
        st = hm_errf(err, HM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    /* several devices (model_gpu.h): the embeddings go with layer 0, the output with its own
     * device, each layer's weights with the layer */
    g->up_dev = hm_gpu_layer_dev(g, 0);
    {
        q35_gmat te;
        if ((st = up_mat(g, &q->tok_embd, "token_embd.weight", &te, err)) != HM_OK) goto fail;
        if (te.any) {
            st = hm_errf(err, HM_ERR_UNSUPPORTED, "tensor 'token_embd.weight': rows of %lld elements do not fit the "
                         "CUDA row lookup (a multiple of 32)", (long long)E);
            goto fail;
        }
        d->tok_embd = te.m;
        g->up_dev = hm_gpu_layer_dev(g, q->n_layer);
        if (q->output.data == q->tok_embd.data && g->up_dev == hm_gpu_layer_dev(g, 0))
            d->output = te; /* tied embeddings: one device copy */
        else if ((st = up_mat(g, &q->output, "output.weight", &d->output, err)) != HM_OK)
            goto fail;
    }
    if ((st = hm_gpu_up_vec(g, q->output_norm, E, "output_norm.weight", &d->output_norm, err)) != HM_OK) goto fail;
    for (int32_t il = 0; il < q->n_layer; il++) {
        const q35_layer *L = &q->layers[il];
        q35_gpu_layer *D = &d->layers[il];
        g->up_dev = hm_gpu_layer_dev(g, il);
        char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s, il), n)
#define UPM(field, s) do { if ((st = up_mat(g, &L->field, NAME(s), &D->field, err)) != HM_OK) goto fail; } while (0)
#define UPV(field, len, s) \
    do { if ((st = hm_gpu_up_vec(g, L->field, len, NAME(s), &D->field, err)) != HM_OK) goto fail; } while (0)
        UPV(attn_norm, E, "attn_norm.weight");
        UPV(post_norm, E, "post_attention_norm.weight");
        if (L->recurrent) {
            UPM(wqkv, "attn_qkv.weight");
            UPM(wz, "attn_gate.weight");
            UPM(wbeta, "ssm_beta.weight");
            UPM(walpha, "ssm_alpha.weight");
            UPM(wout, "ssm_out.weight");
            UPV(conv_w, (int64_t)q->d_conv * q->conv_dim, "ssm_conv1d.weight");
            UPV(dt_bias, nv, "ssm_dt.bias");
            UPV(ssm_a, nv, "ssm_a");
            UPV(ssm_norm, q->d_v, "ssm_norm.weight");
        } else {
            UPM(wq, "attn_q.weight");
            UPM(wk, "attn_k.weight");
            UPM(wv, "attn_v.weight");
            UPM(wo, "attn_output.weight");
            UPV(q_norm, hd, "attn_q_norm.weight");
            UPV(k_norm, hd, "attn_k_norm.weight");
        }
        UPM(router, "ffn_gate_inp.weight");
        UPM(sh_gate, "ffn_gate_shexp.weight");
        UPM(sh_up, "ffn_up_shexp.weight");
        UPM(sh_down, "ffn_down_shexp.weight");
        UPM(sh_inp, "ffn_gate_inp_shexp.weight");
#undef UPV
#undef UPM
#undef NAME
    }
    return HM_OK;
fail:
    q35_gpu_unload(m); /* the buffers themselves are m->gpu's (freed at its close) */
    return st;
}

/* ---- session state on the device ----
 *
 * One q35_gstate per device of the placement that runs layers or the output, chained in layer
 * order (s->dev the first): each holds the KV cache of its own attention layers and the recurrent
 * state of its own DeltaNet layers in [l0, l1) only (a layer's index there: its L->slot minus the
 * device's first slot of that kind), and its own activations, tables and handshakes. With one
 * device the chain has one link, over every layer. */

typedef struct q35_gstate {
    hm_gpu_dstate ds;         /* first: the device, its layers, x, h, the MoE's buffers (gpu_chain.h);
                                 ds.kv is [its attention layers][2][n_head_kv][n_ctx][hd] */
    int32_t attn0, recr0;     /* the L->slot of its first attention / DeltaNet layer */
    size_t kv_layer_elems;    /* n_head_kv * n_ctx * head_dim */
    float *rs;                /* device [its DeltaNet layers][rs_layer]: conv window then S, owned */
    size_t rs_layer, rs_total;/* floats per DeltaNet layer, in all */
    float *mix;               /* [U, max(2 nq, conv_dim)]: [q | gate] per head, or the DeltaNet qkv */
    float *q, *gate, *k, *v;  /* [U, nq] x2, [U, nkv] x2 */
    float *att;               /* [U, max(nq, n_v d_v)] */
    float *conv, *z;          /* [U, conv_dim], [U, n_v d_v] */
    float *ba, *aa;           /* [U, n_v]: beta logits then beta; alpha then g */
    float *rlog;              /* [U, n_expert] */
    float *shg, *shu, *sho, *shs; /* [U, n_ff_sh] x2, [U, n_embd], [U] the shared expert */
} q35_gstate;

/* The next device's state of the chain. */
static q35_gstate *nxt(const q35_gstate *g) { return (q35_gstate *)g->ds.next; }

void q35_gpu_state_close(q35_state *s) {
    for (q35_gstate *g = s->dev, *nx; g; g = nx) {
        nx = nxt(g);
        hm_gpu_dstate_free(&g->ds); /* syncs its device first */
        if (g->ds.c) hm_cuda_free(g->ds.c, g->rs);
        free(g);
    }
    s->dev = NULL;
}

/* Zero one device's recurrent state and wait for it. */
static hm_status gstate_reset(q35_gstate *g, hm_err *err) {
    if (!g->rs) return HM_OK;
    hm_status st = hm_cuda_make_current(g->ds.c, err);
    if (st == HM_OK) st = hm_cuda_memset(g->ds.c, g->rs, 0, g->rs_total * sizeof(float), err);
    return st == HM_OK ? hm_cuda_sync(g->ds.c, err) : st;
}

hm_status q35_gpu_state_reset(q35_state *s, hm_err *err) {
    for (q35_gstate *g = s->dev; g; g = nxt(g)) {
        hm_status st = gstate_reset(g, err);
        if (st != HM_OK) return st;
    }
    return HM_OK;
}

/* The device state of device index dev for layers [l0, l1) (and the output when out), linked at
 * once after *last (s's first when *last is NULL; a half-open one is freed with the chain), *last
 * set to it. */
static hm_status gstate_open(const hm_model *m, const hm_state_opts *o, int32_t dev, int32_t l0, int32_t l1, bool out,
                             q35_state *s, q35_gstate **last, hm_err *err) {
    const q35_model *q = m->impl;
    const q35_gpu *d = m->gpu->arch;
    q35_gstate *g = calloc(1, sizeof *g);
    if (!g) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    if (*last) (*last)->ds.next = &g->ds;
    else s->dev = g;
    *last = g;
    hm_status st = hm_gpu_dstate_init(&g->ds, m, o, dev, l0, l1, out, q->n_layer, q->n_expert, Q35_LOGIT_ROWS,
                                      (size_t)q->n_expert_used, err);
    if (st != HM_OK) return st;
    hm_cuda_ctx *c = g->ds.c;
    /* its layers of each kind: the slots [attn0, attn0 + n_attn) and [recr0, recr0 + n_recr) */
    int32_t n_attn = 0, n_recr = 0;
    g->attn0 = g->recr0 = -1;
    for (int32_t il = 0; il < q->n_layer; il++) {
        const q35_layer *L = &q->layers[il];
        if (il < l0) continue;
        if (il >= l1) break;
        if (L->recurrent) {
            if (n_recr++ == 0) g->recr0 = L->slot;
        } else if (n_attn++ == 0) {
            g->attn0 = L->slot;
        }
    }
    const size_t U = (size_t)o->n_ubatch, E = (size_t)q->n_embd, hd = (size_t)q->head_dim;
    const size_t nq = (size_t)q->n_head * hd, nkv = (size_t)q->n_head_kv * hd, K = (size_t)q->n_expert_used;
    const size_t nv = (size_t)q->n_v, vdim = nv * (size_t)q->d_v, cd = (size_t)q->conv_dim;
    const size_t V = (size_t)q->n_vocab, NL = (size_t)q->n_layer, NE = (size_t)q->n_expert, FS = (size_t)q->n_ff_sh;
    const size_t slot_words = NL * NE * sizeof(hm_cuda_moe_slot) / 4;

    /* sizes first: a full device makes the expert pool give up room for all of them */
    g->kv_layer_elems = nkv * (size_t)o->n_ctx;
    size_t kv_bytes = 0;
    if (!hm_mul_ok(g->kv_layer_elems, 2u * (size_t)n_attn * 2u, &kv_bytes))
        return hm_errf(err, HM_ERR_NOMEM, "gpu: the KV cache for %d positions is too large", o->n_ctx);
    g->rs_layer = (size_t)(q->d_conv - 1) * cd + nv * (size_t)q->d_k * (size_t)q->d_v;
    g->rs_total = g->rs_layer * (size_t)n_recr;
    const size_t rs_bytes = g->rs_total * sizeof(float);
    const size_t act_el[] = {U * E,  U * E,      U * hm_gpu_max_sz(2 * nq, cd), U * nq, U * nq, U * nkv, U * nkv,
                             U * hm_gpu_max_sz(nq, vdim), U * cd, U * vdim, U * nv, U * nv, U * NE, 2 * U * K,
                             U * FS, U * FS,     U * E,  U,      U * E,  out ? (size_t)g->ds.logit_rows * V : 0, 3 * U,
                             NL * g->ds.sel_stride, slot_words};
    enum { N_ACT = sizeof act_el / sizeof act_el[0] };
    size_t act_off[N_ACT];
    const size_t act_bytes = hm_gpu_layout(act_el, act_off, N_ACT);
    g->ds.scratch_size = hm_gpu_max_sz(hm_cuda_moe_scratch_size((int64_t)U, (int64_t)(U * K), q->n_expert, q->n_ff_exp),
                                       hm_cuda_moe_dev_scratch_size(g->ds.dec_cap, q->n_expert_used, q->n_ff_exp));
    if (n_attn > 0 && !d->attn_any)
        g->ds.scratch_size = hm_gpu_max_sz(g->ds.scratch_size, hm_cuda_attention_scratch_size(c, (int64_t)U, o->n_ctx,
                                                                                              q->n_head, q->n_head_kv,
                                                                                              q->head_dim));
    const size_t rest = kv_bytes + rs_bytes + act_bytes + g->ds.scratch_size;

    char what[96];
    snprintf(what, sizeof what, "KV cache (%d positions)", o->n_ctx);
    if (kv_bytes && (st = hm_gpu_dev_alloc_on(m, dev, kv_bytes, rest, (void **)&g->ds.kv, what, err)) != HM_OK)
        return st;
    if (rs_bytes && (st = hm_gpu_dev_alloc_on(m, dev, rs_bytes, rest - kv_bytes, (void **)&g->rs, "recurrent state",
                                              err)) != HM_OK)
        return st;
    if ((st = hm_gpu_dev_alloc_on(m, dev, act_bytes, act_bytes + g->ds.scratch_size, &g->ds.dev_block, "activations",
                                  err)) != HM_OK)
        return st;
    {
        char *b = g->ds.dev_block;
        float **f[] = {&g->ds.x,   &g->ds.h,  &g->mix, &g->q,   &g->gate, &g->k,   &g->v,    &g->att,
                       &g->conv, &g->z, &g->ba,  &g->aa,  &g->rlog, NULL,    &g->shg,  &g->shu,
                       &g->sho, &g->shs, &g->ds.cold, &g->ds.logits};
        for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
            if (f[i]) *f[i] = (float *)(b + act_off[i]);
        if (!out) g->ds.logits = NULL;
        g->ds.sel = (int32_t *)(b + act_off[13]);
        g->ds.ints = (int32_t *)(b + act_off[20]);
        g->ds.sel_all = (int32_t *)(b + act_off[21]);
        g->ds.slots = (hm_cuda_moe_slot *)(b + act_off[22]);
    }
    if ((st = hm_gpu_dev_alloc_on(m, dev, g->ds.scratch_size, g->ds.scratch_size, &g->ds.scratch,
                                  "attention/MoE scratch", err)) != HM_OK)
        return st;
    if ((st = gstate_reset(g, err)) != HM_OK) return st;

    if ((st = hm_gpu_dstate_pin(&g->ds, U, E, K, 0, NULL, err)) != HM_OK) return st;
    if ((st = hm_gpu_moe_host_open(&g->ds.mh, c, q->n_layer, q->n_expert, err)) != HM_OK) return st;
    for (int32_t il = l0; il < l1; il++)
        g->ds.mh.mw[il] = &q->layers[il].moe;
    return hm_moe_graph_open_env(c, g->ds.mh.mw, q->n_layer, g->ds.dec_cap, q->n_expert_used, q->n_embd,
                                 &g->ds.mh.graph, err);
}

hm_status q35_gpu_state_open(const hm_model *m, const hm_state_opts *o, q35_state *s, hm_err *err) {
    const q35_model *q = m->impl;
    const hm_gpu *gpu = m->gpu;
    HM_ASSERT(gpu && gpu->arch && !s->dev);
    hm_status st = hm_gpu_state_opts_check(o, err);
    if (st != HM_OK) return st;
    s->kv_elem_size = 2;
    s->kv_layer_elems = (size_t)q->n_head_kv * (size_t)q->head_dim * (size_t)o->n_ctx;
    /* one state per device that runs layers or the output, in layer order */
    hm_gpu_link links[HM_MAX_GPUS];
    const int32_t n_links = hm_gpu_chain_links(gpu, q->n_layer, links);
    q35_gstate *last = NULL;
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
    q35_gpu_state_close(s); /* the caller frees the rest of s */
    return st;
}

/* ---- forward ---- */

#define CK(call)                               \
    do {                                       \
        if ((st = (call)) != HM_OK) goto fail; \
    } while (0)

static hm_status mm(hm_cuda_ctx *c, const q35_gmat *w, const float *x, int64_t n, float *y, hm_err *err) {
    if (w->any) return hm_cuda_matmul_f32_any(c, w->m.data, w->m.ne0, w->m.ne1, w->m.nb1, x, n, y, err);
    return hm_cuda_matmul(c, &w->m, x, n, y, err);
}

/* Keep rows rows[0..n_out) of the device array a ([n, w]), compacted to the front (rows ascend). */
static hm_status compact(hm_cuda_ctx *c, float *a, int64_t w, const int32_t *rows, int32_t n_out, hm_err *err) {
    for (int32_t i = 0; i < n_out; i++) {
        if (rows[i] == i) continue;
        hm_status st = hm_cuda_copy(c, a + (size_t)i * (size_t)w, a + (size_t)rows[i] * (size_t)w,
                                    (size_t)w * sizeof(float), err);
        if (st != HM_OK) return st;
    }
    return HM_OK;
}

/* Attention layer L's K and V cache in its device's state. */
static void kv_of(const q35_gstate *g, const q35_layer *L, uint16_t **kc, uint16_t **vc) {
    *kc = g->ds.kv + (size_t)(L->slot - g->attn0) * 2 * g->kv_layer_elems;
    *vc = *kc + g->kv_layer_elems;
}

/* DeltaNet token mixer of layer L over n rows: g->ds.h in, g->ds.h out; the layer's state advanced. */
static hm_status deltanet(const q35_model *q, const q35_gpu_layer *D, const q35_layer *L, q35_gstate *g, int64_t n,
                          hm_err *err) {
    hm_cuda_ctx *c = g->ds.c;
    const int64_t cd = q->conv_dim, nv = q->n_v, vdim = nv * q->d_v, qk = (int64_t)q->n_k * q->d_k;
    float *rs = g->rs + (size_t)(L->slot - g->recr0) * g->rs_layer;
    float *conv_state = rs, *delta_state = rs + (size_t)(q->d_conv - 1) * (size_t)cd;
    hm_status st;
    CK(mm(c, &D->wqkv, g->ds.h, n, g->mix, err));
    CK(mm(c, &D->wz, g->ds.h, n, g->z, err));
    CK(mm(c, &D->wbeta, g->ds.h, n, g->ba, err));
    CK(mm(c, &D->walpha, g->ds.h, n, g->aa, err));
    CK(hm_cuda_ssm_conv(c, g->mix, cd, n, cd, D->conv_w, q->d_conv, conv_state, g->conv, err));
    CK(hm_cuda_l2norm_heads(c, g->conv, cd, n, q->n_k, q->d_k, q->eps, 1.0f / sqrtf((float)q->d_k), err));
    CK(hm_cuda_l2norm_heads(c, g->conv + qk, cd, n, q->n_k, q->d_k, q->eps, 1.0f, err));
    CK(hm_cuda_delta_gates(c, g->aa, g->ba, D->ssm_a, D->dt_bias, n, q->n_v, g->aa, g->ba, err));
    CK(hm_cuda_gated_delta(c, g->conv, g->conv + qk, cd, g->conv + 2 * qk, cd, g->aa, g->ba, n, q->n_k, q->n_v,
                           q->d_k, q->d_v, delta_state, g->att, err));
    /* gated RMSNorm per value head: rmsnorm(o) * ssm_norm * silu(z) */
    CK(hm_cuda_rmsnorm_heads(c, g->att, D->ssm_norm, n, q->n_v, q->d_v, q->eps, err));
    CK(hm_cuda_swiglu(c, g->z, g->att, g->att, n * vdim, err));
    CK(mm(c, &D->wout, g->att, n, g->ds.h, err));
fail:
    return st;
}

/* ---- decode as one graph (moe.h, hm_moe_graph): the same ops as the decode branch of
 * q35_gpu_forward below, captured once and replayed (every row wants logits: no compaction);
 * bit-identical to the per-launch path. With several devices each has its own graph over its own
 * layers, launched in layer order after the residual's hand-over (outside the graphs, ordered by
 * an event). */

/* The MoE block's input side for n rows, both paths: x += the mixer's output (g->ds.h), g->ds.h =
 * rmsnorm(x) * post_norm, the router's logits into g->rlog, and the shared expert (gated by the
 * sigmoid of its own logit) added into x. */
static hm_status moe_in(const q35_model *q, const q35_gpu_layer *D, q35_gstate *g, int64_t n, hm_err *err) {
    hm_cuda_ctx *c = g->ds.c;
    hm_status st;
    if ((st = hm_cuda_add_rmsnorm(c, g->ds.x, g->ds.h, D->post_norm, g->ds.h, n, q->n_embd, q->eps, err)) != HM_OK)
        return st;
    if ((st = mm(c, &D->router, g->ds.h, n, g->rlog, err)) != HM_OK) return st;
    if ((st = mm(c, &D->sh_gate, g->ds.h, n, g->shg, err)) != HM_OK) return st;
    if ((st = mm(c, &D->sh_up, g->ds.h, n, g->shu, err)) != HM_OK) return st;
    if ((st = mm(c, &D->sh_inp, g->ds.h, n, g->shs, err)) != HM_OK) return st;
    if ((st = hm_cuda_swiglu(c, g->shg, g->shu, g->shg, n * q->n_ff_sh, err)) != HM_OK) return st;
    if ((st = mm(c, &D->sh_down, g->shg, n, g->sho, err)) != HM_OK) return st;
    return hm_cuda_add_sigmoid_scaled(c, g->ds.x, g->sho, g->shs, n, q->n_embd, err);
}

typedef struct q35_step {
    const hm_model *m;
    q35_state *s;
    q35_gstate *g; /* the device whose graph is captured */
    int64_t n, kv_len;
} q35_step;

static hm_status enqueue_step(void *ctx, hm_err *err) {
    const q35_step *p = ctx;
    const hm_model *m = p->m;
    q35_state *s = p->s;
    q35_gstate *g = p->g;
    const int64_t n = p->n;
    const q35_model *q = m->impl;
    const q35_gpu *d = m->gpu->arch;
    hm_cuda_ctx *c = g->ds.c;
    const int64_t E = q->n_embd, U = s->n_ubatch;
    const int hd = q->head_dim, nh = q->n_head, nkv = q->n_head_kv, K = q->n_expert_used;
    const size_t nq = (size_t)nh * (size_t)hd, nk = (size_t)n * (size_t)K;
    const float scale = 1.0f / sqrtf((float)hd);
    const int32_t *tok_d = g->ds.ints, *pos_d = g->ds.ints + U;
    hm_status st;
    if (g == s->dev) CK(hm_cuda_get_rows(c, &d->tok_embd, tok_d, n, g->ds.x, err));
    for (int32_t il = g->ds.l0; il < g->ds.l1; il++) {
        const q35_layer *L = &q->layers[il];
        const q35_gpu_layer *D = &d->layers[il];
        CK(hm_cuda_rmsnorm(c, g->ds.x, D->attn_norm, g->ds.h, n, E, q->eps, err));
        if (L->recurrent) {
            CK(deltanet(q, D, L, g, n, err));
        } else {
            uint16_t *kc, *vc;
            kv_of(g, L, &kc, &vc);
            CK(mm(c, &D->wq, g->ds.h, n, g->mix, err));
            CK(mm(c, &D->wk, g->ds.h, n, g->k, err));
            CK(mm(c, &D->wv, g->ds.h, n, g->v, err));
            CK(hm_cuda_split_q_gate(c, g->mix, n, nh, hd, g->q, g->gate, err));
            CK(hm_cuda_qk_norm_rope_kv(c, g->q, g->k, g->v, D->q_norm, D->k_norm, n, nh, nkv, hd, q->n_rot, pos_d,
                                       q->theta, q->eps, kc, vc, s->n_ctx, err));
            if (d->attn_any)
                CK(hm_cuda_attention_any(c, g->q, n, pos_d, kc, vc, s->n_ctx, nh, nkv, hd, scale, g->att, err));
            else
                CK(hm_cuda_attention(c, g->q, n, pos_d, p->kv_len, kc, vc, s->n_ctx, nh, nkv, hd, scale, g->att,
                                     g->ds.scratch, g->ds.scratch_size, err));
            CK(hm_cuda_sigmoid_mul(c, g->att, g->gate, n * (int64_t)nq, err));
            CK(mm(c, &D->wo, g->att, n, g->ds.h, err));
        }
        CK(moe_in(q, D, g, n, err));
        int32_t *ids_d = hm_gpu_layer_ids(&g->ds, il, true);
        float *w_d = (float *)(ids_d + nk);
        CK(hm_cuda_router(c, g->rlog, n, q->n_expert, K, true, ids_d, w_d, err));
        CK(hm_moe_graph_layer(g->ds.mh.graph, m, il, hm_gpu_layer_slots(&g->ds, il), g->ds.mh.any_hot[il], ids_d, w_d,
                              n, g->ds.h, g->ds.x, g->ds.scratch, g->ds.scratch_size, err));
    }
    if (g->ds.out) {
        CK(hm_cuda_rmsnorm(c, g->ds.x, d->output_norm, g->ds.h, n, E, q->eps, err));
        CK(mm(c, &d->output, g->ds.h, n, g->ds.logits, err));
    }
    return HM_OK;
fail:
    return st;
}

/* The graph decode over the chain (the first device current): each device's graph, then the
 * residual's hand-over to the next; the logits come down from the last. */
static hm_status graph_step(const hm_model *m, q35_state *s, hm_pool *pool, const hm_fwd_batch *b, hm_err *err) {
    const q35_model *q = m->impl;
    const int64_t n = b->n;
    q35_step p = {.m = m, .s = s, .n = n, .kv_len = b->pos[n - 1] + 1};
    hm_status st = HM_OK;
    q35_gstate *g = s->dev;
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

hm_status q35_gpu_forward(const hm_model *m, q35_state *s, hm_pool *pool, const hm_fwd_batch *b, hm_err *err) {
    const q35_model *q = m->impl;
    const q35_gpu *d = m->gpu->arch;
    q35_gstate *g = s->dev;
    const int64_t E = q->n_embd, n = b->n, n_out = b->n_out, U = s->n_ubatch;
    const int hd = q->head_dim, nh = q->n_head, nkv = q->n_head_kv, K = q->n_expert_used;
    const size_t nq = (size_t)nh * (size_t)hd;
    const float scale = 1.0f / sqrtf((float)hd);
    HM_ASSERT(g && n > 0 && n <= U && n_out <= n && b->pos[n - 1] < s->n_ctx);
    hm_status st = HM_OK;

    /* per device: the batch's ints go up, which layers have no cold unit, the decode slot table */
    const bool dec = n <= HM_CUDA_MATVEC_MAX_TOK && n <= g->ds.dec_cap;
    CK(hm_gpu_chain_begin(m, &g->ds, U, b, dec, err));
    if (dec && g->ds.mh.graph && n_out == n && b->logits && n <= g->ds.logit_rows) {
        CK(hm_cuda_make_current(g->ds.c, err));
        CK(graph_step(m, s, pool, b, err)); /* every flag released, the device idle, when it fails */
        return HM_OK;
    }

    CK(hm_cuda_make_current(g->ds.c, err));
    CK(hm_cuda_get_rows(g->ds.c, &d->tok_embd, g->ds.ints, n, g->ds.x, err));
    int64_t nr = n;
    int64_t kv_len = b->pos[n - 1] + 1;
    bool done_early = false;
    for (;; g = nxt(g)) {
        hm_cuda_ctx *c = g->ds.c;
        const int32_t *pos_d = g->ds.ints + U, *pos_out_d = g->ds.ints + 2 * U;
        for (int32_t il = g->ds.l0; il < g->ds.l1 && !done_early; il++) {
            const q35_layer *L = &q->layers[il];
            const q35_gpu_layer *D = &d->layers[il];
            const bool last = il == q->n_layer - 1 && n_out < n;
            CK(hm_cuda_rmsnorm(c, g->ds.x, D->attn_norm, g->ds.h, n, E, q->eps, err));
            if (L->recurrent) {
                CK(deltanet(q, D, L, g, n, err));
                if (last) {
                    if (n_out == 0) {
                        done_early = true;
                        break;
                    }
                    CK(compact(c, g->ds.x, E, b->out_rows, (int32_t)n_out, err));
                    CK(compact(c, g->ds.h, E, b->out_rows, (int32_t)n_out, err));
                    nr = n_out;
                }
            } else {
                uint16_t *kc, *vc;
                kv_of(g, L, &kc, &vc);
                const int32_t *pos = pos_d;
                CK(mm(c, &D->wq, g->ds.h, n, g->mix, err));
                CK(mm(c, &D->wk, g->ds.h, n, g->k, err));
                CK(mm(c, &D->wv, g->ds.h, n, g->v, err));
                CK(hm_cuda_split_q_gate(c, g->mix, n, nh, hd, g->q, g->gate, err));
                /* per-head norms, partial NEOX rotary of q and k, the K/V write: one launch */
                CK(hm_cuda_qk_norm_rope_kv(c, g->q, g->k, g->v, D->q_norm, D->k_norm, n, nh, nkv, hd, q->n_rot, pos_d,
                                           q->theta, q->eps, kc, vc, s->n_ctx, err));
                if (last) {
                    if (n_out == 0) {
                        done_early = true;
                        break;
                    }
                    CK(compact(c, g->q, (int64_t)nq, b->out_rows, (int32_t)n_out, err));
                    CK(compact(c, g->gate, (int64_t)nq, b->out_rows, (int32_t)n_out, err));
                    CK(compact(c, g->ds.x, E, b->out_rows, (int32_t)n_out, err));
                    nr = n_out;
                    pos = pos_out_d;
                    kv_len = b->pos[b->out_rows[n_out - 1]] + 1;
                }
                if (d->attn_any)
                    CK(hm_cuda_attention_any(c, g->q, nr, pos, kc, vc, s->n_ctx, nh, nkv, hd, scale, g->att, err));
                else
                    CK(hm_cuda_attention(c, g->q, nr, pos, kv_len, kc, vc, s->n_ctx, nh, nkv, hd, scale, g->att,
                                         g->ds.scratch, g->ds.scratch_size, err));
                CK(hm_cuda_sigmoid_mul(c, g->att, g->gate, nr * (int64_t)nq, err));
                CK(mm(c, &D->wo, g->att, nr, g->ds.h, err));
            }

            /* MoE block: x += mixer, h = rmsnorm(x) * post_norm, router logits, the shared expert
             * into x; then the units */
            CK(moe_in(q, D, g, nr, err));

            /* decode: the hot units from the device routing, a host round trip only for a layer
             * that may have cold units; prefill: the layer's one wait (moe.h) */
            const size_t nk = (size_t)nr * (size_t)K;
            int32_t *ids_d = hm_gpu_layer_ids(&g->ds, il, dec);
            CK(hm_cuda_router(c, g->rlog, nr, q->n_expert, K, true, ids_d, (float *)(ids_d + nk), err));
            CK(hm_gpu_moe_step(m, pool, &g->ds, &L->moe, &s->route, &s->scratch, il, dec, nr, K, g->ds.x, NULL, NULL,
                               err));
        }
        CK(hm_gpu_routing_down(&g->ds, err)); /* decode: recorded once the step's work is done */
        if (!nxt(g) || done_early) break;
        CK(hm_gpu_hand_over(&g->ds, nr, E, err));
    }
    if (done_early || n_out == 0) {
        CK(hm_gpu_chain_sync(&s->dev->ds, err)); /* nothing may still read a slot, the state is complete */
        hm_gpu_chain_record(m, &s->dev->ds);
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
        CK(mm(c, &d->output, g->ds.h + (size_t)r0 * (size_t)E, nc, g->ds.logits, err));
        /* waits for the queued work (the last chunk's wait ends the step's device work: every
         * earlier device's work came before its hand-over, which this stream waited for) */
        CK(hm_cuda_download(c, b->logits + (size_t)r0 * V, g->ds.logits, (size_t)nc * V * sizeof(float), err));
    }
    hm_gpu_chain_record(m, &s->dev->ds);
    return HM_OK;
fail:
    hm_gpu_chain_abort(&s->dev->ds);
    return st;
}
