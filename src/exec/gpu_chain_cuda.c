/* gpu_chain_cuda.c - a GPU session's chain of per-device states (gpu_chain.h): the common part of
 * each arch's per-device state (open, pinned block, free) and the per-step work over the chain
 * that the three GPU forwards share (the step's start, a layer's MoE units, the routing's download
 * and record, the residual's hand-over, the failure path). */
#include <stdlib.h>

#include "backend/cuda/cuda_ops.h"
#include "gpu_chain.h"
#include "model/model.h"
#include "moe.h"

hm_status hm_gpu_dstate_init(hm_gpu_dstate *d, const hm_model *m, const hm_state_opts *o, int32_t dev, int32_t l0,
                             int32_t l1, bool out, int32_t n_layer, int32_t n_expert, int32_t logit_rows_max,
                             size_t k, hm_err *err) {
    d->c = m->gpu->dev[dev].ctx;
    d->dev = dev;
    d->l0 = l0;
    d->l1 = l1;
    d->out = out;
    d->n_layer = n_layer;
    d->n_expert = n_expert;
    d->logit_rows = o->n_ubatch < logit_rows_max ? o->n_ubatch : logit_rows_max;
    d->dec_cap = o->n_ubatch < HM_CUDA_MATVEC_MAX_TOK ? o->n_ubatch : HM_CUDA_MATVEC_MAX_TOK;
    d->sel_stride = 2 * (size_t)d->dec_cap * k;
    return hm_cuda_make_current(d->c, err);
}

hm_status hm_gpu_dstate_pin(hm_gpu_dstate *d, size_t n_ubatch, size_t n_embd, size_t k, size_t extra,
                            void **extra_out, hm_err *err) {
    const size_t U = n_ubatch, E = n_embd, NL = (size_t)d->n_layer;
    const size_t NE = (size_t)(d->n_expert > 0 ? d->n_expert : 1); /* a model without experts: one */
    const size_t slot_words = NL * NE * sizeof(hm_cuda_moe_slot) / 4;
    const size_t el[] = {3 * U, 2 * U * k, U * E, U * E, NL * d->sel_stride, slot_words, extra};
    size_t off[sizeof el / sizeof el[0]];
    const size_t n = extra ? 7 : 6;
    hm_status st = hm_gpu_pinned_block(d->c, el, off, n, &d->pin, err);
    if (st != HM_OK) return st;
    char *b = d->pin;
    d->ints_h = (int32_t *)(b + off[0]);
    d->sel_h = (int32_t *)(b + off[1]);
    d->h_h = (float *)(b + off[2]);
    d->cold_h = (float *)(b + off[3]);
    d->sel_all_h = (int32_t *)(b + off[4]);
    d->slots_h = (hm_cuda_moe_slot *)(b + off[5]);
    if (extra_out) *extra_out = extra ? b + off[6] : NULL;
    return HM_OK;
}

void hm_gpu_dstate_free(hm_gpu_dstate *d) {
    if (d->c) {
        hm_err e;
        (void)hm_cuda_make_current(d->c, &e);
        hm_cuda_sync(d->c, &e); /* nothing queued may still use what is freed below */
        hm_cuda_free(d->c, d->kv);
        hm_cuda_free(d->c, d->dev_block);
        hm_cuda_free(d->c, d->scratch);
        hm_cuda_host_free(d->c, d->pin);
    }
    hm_gpu_moe_host_free(&d->mh);
}

hm_status hm_gpu_session_cold_open(const hm_model *m, hm_moe_route *route, hm_scratch *scratch, int32_t n_expert,
                                   int32_t k, int64_t n_embd, int64_t n_ff_exp, const hm_state_opts *o,
                                   hm_err *err) {
    hm_status st = hm_gpu_cold_part_open(route, scratch, n_expert, k, n_embd, n_ff_exp, o, err);
    if (st != HM_OK) return st;
    return hm_gpu_peer_reserve(m, o->n_ubatch, (int64_t)o->n_ubatch * k, n_ff_exp, err);
}

hm_status hm_gpu_chain_begin(const hm_model *m, hm_gpu_dstate *head, int64_t n_ubatch, const hm_fwd_batch *b,
                             bool dec, hm_err *err) {
    for (hm_gpu_dstate *d = head; d; d = d->next) {
        hm_status st = hm_cuda_make_current(d->c, err);
        if (st == HM_OK) st = hm_gpu_upload_batch_ints(d->c, d->ints, d->ints_h, n_ubatch, b, err);
        if (st == HM_OK)
            st = hm_gpu_moe_slots_refresh(m, d->c, d->mh.mw, d->n_layer, d->n_expert, dec, d->mh.seen, d->slots_h,
                                          d->slots, d->mh.all_hot, d->mh.any_hot, err);
        if (st != HM_OK) return st;
        d->mh.n_rec = 0; /* decode: layers whose routing is recorded after the step */
    }
    return HM_OK;
}

hm_status hm_gpu_moe_step(const hm_model *m, hm_pool *pool, hm_gpu_dstate *d, const hm_moe_weights *mw,
                          hm_moe_route *route, hm_scratch *scratch, int32_t il, bool dec, int64_t nr, int k,
                          float *out_dev, const hm_moe_weights *next_mw, const int32_t *next_ids, hm_err *err) {
    const size_t nk = (size_t)nr * (size_t)k;
    const hm_moe_gpu_buf mb = {.x_dev = d->h,
                               .x_host = d->mh.all_hot[il] ? NULL : d->h_h,
                               .out_dev = out_dev,
                               .cold_host = d->cold_h,
                               .cold_dev = d->cold,
                               .scratch_dev = d->scratch,
                               .scratch_dev_size = d->scratch_size,
                               .units = d->mh.units,
                               .next_mw = next_mw,
                               .next_ids = next_ids};
    /* decode: the hot units straight from the device routing (every layer's kept for the record
     * after the step); a host round trip only when the layer may have cold units, and then the hot
     * launch runs while the host computes. Prefill: the layer's one wait */
    int32_t *ids_h = dec ? d->sel_all_h + (size_t)il * d->sel_stride : d->sel_h;
    if (dec) d->mh.rec_n[il] = (int32_t)nk, d->mh.n_rec = il + 1;
    return hm_moe_gpu_layer_step(m, pool, mw, route, scratch, &mb, dec, d->mh.all_hot[il], d->mh.any_hot[il],
                                 hm_gpu_layer_slots(d, il), hm_gpu_layer_ids(d, il, dec), ids_h, nr, k,
                                 d->mh.routed, err);
}

hm_status hm_gpu_routing_down(hm_gpu_dstate *d, hm_err *err) {
    if (d->mh.n_rec <= 0) return HM_OK;
    return hm_cuda_download_async(d->c, d->sel_all_h, d->sel_all, (size_t)d->mh.n_rec * d->sel_stride * sizeof(int32_t),
                                  err);
}

hm_status hm_gpu_hand_over(hm_gpu_dstate *d, int64_t rows, int64_t n_embd, hm_err *err) {
    hm_gpu_dstate *nx = d->next;
    hm_status st = hm_cuda_make_current(nx->c, err);
    if (st != HM_OK) return st;
    return hm_cuda_copy_peer(nx->c, nx->x, d->c, d->x, (size_t)rows * (size_t)n_embd * sizeof(float), d->mh.handoff,
                             err);
}

hm_status hm_gpu_chain_sync(hm_gpu_dstate *head, hm_err *err) {
    for (hm_gpu_dstate *d = head; d; d = d->next) {
        hm_status st = hm_cuda_make_current(d->c, err);
        if (st == HM_OK) st = hm_cuda_sync(d->c, err);
        if (st != HM_OK) return st;
    }
    return HM_OK;
}

void hm_gpu_chain_record(const hm_model *m, const hm_gpu_dstate *head) {
    for (const hm_gpu_dstate *d = head; d; d = d->next)
        hm_gpu_record_routing(m, d->mh.mw, d->sel_all_h, d->sel_stride, d->mh.rec_n, d->mh.n_rec);
}

void hm_gpu_chain_abort(hm_gpu_dstate *head) {
    for (hm_gpu_dstate *d = head; d; d = d->next) {
        hm_err e;
        (void)hm_cuda_make_current(d->c, &e);
        hm_gpu_step_abort(d->c, d->mh.seen, (size_t)d->n_layer * (size_t)d->n_expert);
    }
}

hm_status hm_gpu_compact_qx(hm_cuda_ctx *c, float *q, size_t nq, float *x, size_t n_embd, const int32_t *out_rows,
                            int64_t n_out, hm_err *err) {
    for (int64_t i = 0; i < n_out; i++) {
        const int64_t r = out_rows[i];
        if (r == i) continue;
        hm_status st = hm_cuda_copy(c, q + (size_t)i * nq, q + (size_t)r * nq, nq * sizeof(float), err);
        if (st == HM_OK)
            st = hm_cuda_copy(c, x + (size_t)i * n_embd, x + (size_t)r * n_embd, n_embd * sizeof(float), err);
        if (st != HM_OK) return st;
    }
    return HM_OK;
}
