/* moe_graph_cuda.c - the MoE side of a decode step captured as one CUDA graph (moe.h,
 * hm_moe_graph): per layer, inside the graph, hm_cuda_publish (cold pairs counted on the device
 * from the slot table; routing and input handed to the host only when there are some), the hot
 * units (hm_cuda_moe_dev), hm_cuda_join (waits for the host's cold sum and adds it); outside it,
 * the host's walk over the layers (hm_moe_graph_serve) that computes each layer's cold units on
 * the CPU threads while the GPU runs the hot ones. CUDA builds only.
 *
 * Buffers (owned): pinned host memory (mapped) for each layer's published routing, its input rows
 * and the cold sum, one flag pair per layer on its own cache lines; device words for the step
 * number and each layer's cold-pair count. Per layer, not per step, so that the device may run
 * ahead of the host by any number of layers without reusing a buffer the host still reads. */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_ops.h"
#include "model/model.h"
#include "model_gpu.h"
#include "moe.h"

#define MIB (1024.0 * 1024.0)

struct hm_moe_graph {
    hm_cuda_ctx *c;                /* borrowed */
    int32_t n_layer, dec_cap, k;
    int64_t n_embd;
    const hm_moe_weights **mw;     /* [n_layer] borrowed: each layer's experts */
    uint32_t seq;                  /* the step number the handshakes of this step wait for */
    size_t pub_stride;             /* int32 per layer in pub: count, ids, weights (padded) */
    void *pin;                     /* pinned block, owned: everything below that is host */
    uint32_t *seq_h;               /* what goes up into seq_d */
    int32_t *pub;                  /* [n_layer][pub_stride] */
    float *xh;                     /* [n_layer][dec_cap * n_embd] */
    float *cold;                   /* [n_layer][dec_cap * n_embd] */
    uint32_t *flags;               /* [n_layer][2][16]: published / cold sum ready */
    void *dev;                     /* device block, owned */
    uint32_t *seq_d;
    int32_t *ncold_d;              /* [n_layer] */
    hm_cuda_graph *graph;          /* the captured step, owned; NULL until the first step */
    int64_t graph_n;               /* its key: rows, the caller's key, any_hot per layer */
    size_t graph_key;
    uint8_t *graph_any;            /* [n_layer] */
};

#define FLAG_PUB(mg, il) (&(mg)->flags[(size_t)(il) * 32])
#define FLAG_COLD(mg, il) (&(mg)->flags[(size_t)(il) * 32 + 16])

static size_t al256(size_t b) { return (b + 255) & ~(size_t)255; }

void hm_moe_graph_close(hm_moe_graph *mg) {
    if (!mg) return;
    hm_cuda_graph_destroy(mg->graph);
    hm_cuda_host_free(mg->c, mg->pin);
    hm_cuda_free(mg->c, mg->dev);
    free(mg->graph_any);
    free(mg->mw);
    free(mg);
}

hm_status hm_moe_graph_open(hm_cuda_ctx *c, const hm_moe_weights *const *mw, int32_t n_layer, int32_t dec_cap,
                            int32_t k, int64_t n_embd, hm_moe_graph **out, hm_err *err) {
    *out = NULL;
    HM_ASSERT(c && mw && n_layer > 0 && dec_cap > 0 && k > 0 && n_embd > 0);
    if ((int64_t)dec_cap * k > 256)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "gpu: %d rows x %d experts per step exceed the decode graph's 256 "
                       "pairs", dec_cap, k);
    hm_moe_graph *mg = calloc(1, sizeof *mg);
    if (!mg) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    mg->c = c;
    mg->n_layer = n_layer;
    mg->dec_cap = dec_cap;
    mg->k = k;
    mg->n_embd = n_embd;
    mg->mw = malloc((size_t)n_layer * sizeof *mg->mw);
    mg->graph_any = calloc((size_t)n_layer, 1);
    if (!mg->mw || !mg->graph_any) {
        hm_moe_graph_close(mg);
        return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    }
    memcpy(mg->mw, mw, (size_t)n_layer * sizeof *mg->mw);
    const size_t NL = (size_t)n_layer, dE = (size_t)dec_cap * (size_t)n_embd;
    mg->pub_stride = (1 + 2 * (size_t)dec_cap * (size_t)k + 15) & ~(size_t)15;
    const size_t o_pub = 256, o_xh = o_pub + al256(NL * mg->pub_stride * 4), o_cold = o_xh + al256(NL * dE * 4),
                 o_flags = o_cold + al256(NL * dE * 4), pin_bytes = o_flags + al256(NL * 32 * 4);
    hm_status st;
    hm_err e;
    if ((st = hm_cuda_host_alloc(c, pin_bytes, &mg->pin, &e)) != HM_OK) {
        hm_moe_graph_close(mg);
        return hm_errf(err, st, "gpu: cannot allocate %.1f MiB of pinned host memory for the decode graph: %s",
                       (double)pin_bytes / MIB, e.msg);
    }
    memset(mg->pin, 0, pin_bytes);
    char *p = mg->pin;
    mg->seq_h = (uint32_t *)p;
    mg->pub = (int32_t *)(p + o_pub);
    mg->xh = (float *)(p + o_xh);
    mg->cold = (float *)(p + o_cold);
    mg->flags = (uint32_t *)(p + o_flags);
    if ((st = hm_cuda_alloc(c, 256 + al256(NL * 4), &mg->dev, &e)) != HM_OK) {
        hm_moe_graph_close(mg);
        return hm_errf(err, st, "gpu: cannot allocate the decode graph's words on the device: %s", e.msg);
    }
    mg->seq_d = (uint32_t *)mg->dev;
    mg->ncold_d = (int32_t *)((char *)mg->dev + 256);
    *out = mg;
    return HM_OK;
}

hm_status hm_moe_graph_open_env(hm_cuda_ctx *c, const hm_moe_weights *const *mw, int32_t n_layer, int32_t dec_cap,
                                int32_t k, int64_t n_embd, hm_moe_graph **out, hm_err *err) {
    *out = NULL;
    const char *ev = getenv("HOTMOE_CUDA_GRAPH");
    if (ev && strcmp(ev, "0") == 0) return HM_OK;
    return hm_moe_graph_open(c, mw, n_layer, dec_cap, k, n_embd, out, err);
}

hm_status hm_moe_graph_layer(hm_moe_graph *mg, const hm_model *m, int32_t il, const hm_cuda_moe_slot *slots_dev,
                             bool any_hot, const int32_t *ids_dev, const float *w_dev, int64_t n_tok,
                             const float *x_dev, float *out_dev, void *scratch, size_t scratch_size, hm_err *err) {
    HM_ASSERT(il >= 0 && il < mg->n_layer && mg->mw[il] && n_tok >= 1 && n_tok <= mg->dec_cap);
    const size_t dE = (size_t)mg->dec_cap * (size_t)mg->n_embd, nk = (size_t)n_tok * (size_t)mg->k;
    const int64_t nx = n_tok * mg->n_embd;
    hm_status st;
    if ((st = hm_cuda_publish(mg->c, slots_dev, ids_dev, w_dev, (int)nk, x_dev, nx, mg->ncold_d + il,
                              mg->pub + (size_t)il * mg->pub_stride, mg->xh + (size_t)il * dE, FLAG_PUB(mg, il),
                              mg->seq_d, err)) != HM_OK)
        return st;
    if (any_hot) {
        const hm_moe_gpu_buf mb = {.x_dev = x_dev, .out_dev = out_dev, .scratch_dev = scratch,
                                   .scratch_dev_size = scratch_size};
        if ((st = hm_moe_forward_gpu_dev(m, mg->mw[il], slots_dev, ids_dev, w_dev, n_tok, mg->k, &mb, err)) != HM_OK)
            return st;
    }
    return hm_cuda_join(mg->c, mg->ncold_d + il, FLAG_COLD(mg, il), mg->seq_d, mg->cold + (size_t)il * dE, out_dev,
                        nx, err);
}

/* The host's part of a launched step: each layer's cold units, in layer order (see moe.h). */
static hm_status serve(hm_moe_graph *mg, const hm_model *m, hm_pool *pool, hm_moe_route *route, hm_scratch *scratch,
                       int64_t n_tok, hm_err *err) {
    const size_t NL = (size_t)mg->n_layer, dE = (size_t)mg->dec_cap * (size_t)mg->n_embd;
    const size_t nk = (size_t)n_tok * (size_t)mg->k;
    const uint32_t seq = mg->seq;
    hm_status st = HM_OK;
    size_t il = 0;
    hm_pool_hold(pool, true); /* the cold units come at irregular gaps: no worker sleeps in between */
    for (; il < NL; il++) {
        if (!mg->mw[il]) continue; /* a layer without experts publishes nothing */
        if ((st = hm_cuda_host_wait(mg->c, FLAG_PUB(mg, il), seq, err)) != HM_OK) break;
        const int32_t *pub = mg->pub + il * mg->pub_stride;
        if (pub[0] == 0) continue;
        hm_moe_route_build(route, pub + 1, (const float *)(pub + 1 + nk), (int32_t)n_tok);
        st = hm_moe_gpu_cold_host(m, pool, mg->mw[il], route, mg->xh + il * dE, mg->cold + il * dE, scratch, err);
        hm_cuda_host_signal(FLAG_COLD(mg, il), seq); /* also on failure: the device must go on */
        if (st != HM_OK) break;
    }
    hm_pool_hold(pool, false);
    if (st != HM_OK) {
        for (size_t j = il; j < NL; j++) hm_cuda_host_signal(FLAG_COLD(mg, j), seq);
        hm_err e;
        (void)hm_cuda_sync(mg->c, &e); /* the step's device work ends before anything is reused */
    }
    return st;
}

hm_status hm_moe_graph_step(hm_moe_graph *mg, const hm_model *m, hm_pool *pool, hm_moe_route *route,
                            hm_scratch *scratch, int64_t n_tok, size_t key, const uint8_t *any_hot,
                            hm_moe_graph_enqueue_fn enqueue, void *ctx, hm_err *err) {
    const size_t NL = (size_t)mg->n_layer;
    hm_cuda_ctx *c = mg->c;
    hm_status st;
    HM_ASSERT(n_tok >= 1 && n_tok <= mg->dec_cap);
    /* the step number goes up first (the previous step ended with a sync: seq_h is free) */
    *mg->seq_h = ++mg->seq;
    if ((st = hm_cuda_upload_compute(c, mg->seq_d, mg->seq_h, sizeof *mg->seq_h, err)) != HM_OK) return st;
    if (!mg->graph || mg->graph_n != n_tok || mg->graph_key != key || memcmp(mg->graph_any, any_hot, NL)) {
        hm_cuda_graph_destroy(mg->graph);
        mg->graph = NULL;
        if ((st = hm_cuda_capture_begin(c, err)) != HM_OK) return st;
        hm_err e;
        const hm_status est = enqueue(ctx, &e);
        if ((st = hm_cuda_capture_end(c, est == HM_OK, &mg->graph, err)) != HM_OK) return st;
        if (est != HM_OK) {
            if (err) *err = e;
            return est;
        }
        mg->graph_n = n_tok;
        mg->graph_key = key;
        memcpy(mg->graph_any, any_hot, NL);
    }
    if ((st = hm_cuda_graph_launch(c, mg->graph, err)) != HM_OK) return st;
    if ((st = serve(mg, m, pool, route, scratch, n_tok, err)) != HM_OK) return st;
    /* every layer has published: the routing is complete (it only counts; step_end comes later) */
    if (m->experts)
        for (int32_t il = 0; il < mg->n_layer; il++)
            if (mg->mw[il])
                hm_experts_record(m->experts, il, mg->pub + (size_t)il * mg->pub_stride + 1, (int32_t)(n_tok * mg->k));
    return HM_OK;
}
