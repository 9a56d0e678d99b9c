/* spec_mtp.c - draft-mtp: the target model's own multi-token-prediction head (qwen35moe's nextn
 * block, hm_model.mtp: a one-layer model of the same file, model/qwen35moe.c) drafts, driven as
 * llama.cpp's common_speculative draft-mtp driver drives it:
 *   - process: after every micro-batch the target evaluates (prompt or verify), the head evaluates
 *     the same tokens at the same positions, row i paired with the target's hidden row i - 1
 *     (after the output norm; row 0 with the pending row carried from the batch before, zeros at
 *     the start), which fills its KV cache; no logits;
 *   - accept: after a verify that kept n rows, the pending row is the target's hidden row n - 1;
 *   - draft: the pending token at n_past with the pending row gives the first draft's logits; each
 *     next draft token at the next position is paired with the head's own hidden output (after its
 *     shared_head_norm).
 * Invariants: the head's session holds positions [0, n) with n >= the target's n_past between
 * steps (draft trims it back to n_past; what a draft wrote past it is overwritten by the next
 * process of the verify batch). The head runs on the CPU (the target may be on the GPU: its hidden
 * rows come down) and its experts are not counted in the target's store. */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "exec/exec.h"
#include "model/model.h"
#include "spec.h"

struct hm_spec_mtp {
    hm_session *target;  /* borrowed */
    hm_session *s;       /* the head's session, owned */
    int32_t E, U;
    bool mute;
    float *pending;      /* [E] the hidden row paired with the next token */
    float *rows;         /* [U, E] the target's last micro-batch's hidden rows */
    int32_t n_rows;
    float *inject;       /* [U, E] the head's input rows */
    float *hout;         /* [E] the head's own hidden output (a draft's next input) */
};

static hm_status on_rows(void *ctx, const int32_t *tokens, int32_t pos0, int32_t n, const float *hidden,
                         hm_err *err) {
    hm_spec_mtp *d = ctx;
    if (d->mute) return HM_OK;
    const size_t row = (size_t)d->E * sizeof(float);
    hm_status st;
    if (hm_session_n_past(d->s) < pos0)
        return hm_errf(err, HM_ERR_ARG, "draft-mtp: the head holds %d positions, the target's batch starts at %d",
                       hm_session_n_past(d->s), pos0);
    if ((st = hm_session_trim(d->s, pos0, err)) != HM_OK) return st;
    memcpy(d->inject, d->pending, row);
    if (n > 1) memcpy(d->inject + d->E, hidden, (size_t)(n - 1) * row);
    if ((st = hm_session_eval_rows(d->s, tokens, n, d->inject, NULL, NULL, err)) != HM_OK) return st;
    memcpy(d->rows, hidden, (size_t)n * row);
    d->n_rows = n;
    memcpy(d->pending, hidden + (size_t)(n - 1) * (size_t)d->E, row);
    return HM_OK;
}

hm_status hm_spec_mtp_open(hm_spec_mtp **out, hm_session *target, hm_err *err) {
    *out = NULL;
    hm_model *m = hm_session_model(target);
    if (!m->mtp)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "draft-mtp: %s has no multi-token-prediction layer (%s; it needs a "
                       "qwen35moe or qwen3next file converted with its MTP block: nextn_predict_layers = 1 and "
                       "blk.N.nextn.*)", m->name[0] ? m->name : "the model", m->arch->name);
    if (hm_session_n_past(target) != 0)
        return hm_errf(err, HM_ERR_ARG, "draft-mtp: open it before the target evaluates anything (it holds %d "
                       "positions; the MTP head must see every row)", hm_session_n_past(target));
    hm_spec_mtp *d = calloc(1, sizeof *d);
    if (!d) return hm_errf(err, HM_ERR_NOMEM, "draft-mtp: out of memory");
    hm_status st;
    d->target = target;
    d->E = m->info.n_embd;
    d->U = hm_session_n_ubatch(target);
    hm_session_opts so;
    hm_session_opts_default(&so);
    so.n_ctx = hm_session_n_ctx(target);
    so.n_ubatch = d->U;
    so.n_threads = hm_session_n_threads(target);
    if ((st = hm_session_open(&d->s, m->mtp, &so, err)) != HM_OK) goto fail;
    hm_session_borrow_pool(d->s, target);
    const size_t row = (size_t)d->E * sizeof(float);
    d->pending = hm_malloc_aligned(row);
    d->hout = hm_malloc_aligned(row);
    d->rows = hm_malloc_aligned((size_t)d->U * row);
    d->inject = hm_malloc_aligned((size_t)d->U * row);
    if (!d->pending || !d->hout || !d->rows || !d->inject) {
        st = hm_errf(err, HM_ERR_NOMEM, "draft-mtp: out of memory");
        goto fail;
    }
    memset(d->pending, 0, row); /* llama.cpp's: the first position is paired with zeros */
    if ((st = hm_session_set_rows_hook(target, on_rows, d, err)) != HM_OK) goto fail;
    *out = d;
    return HM_OK;
fail:
    hm_spec_mtp_close(d);
    return st;
}

void hm_spec_mtp_close(hm_spec_mtp *d) {
    if (!d) return;
    hm_session_set_rows_hook(d->target, NULL, NULL, NULL);
    hm_session_close(d->s);
    hm_free_aligned(d->pending);
    hm_free_aligned(d->hout);
    hm_free_aligned(d->rows);
    hm_free_aligned(d->inject);
    free(d);
}

void hm_spec_mtp_accept(hm_spec_mtp *d, int32_t n_keep) {
    if (n_keep >= 1 && n_keep <= d->n_rows)
        memcpy(d->pending, d->rows + (size_t)(n_keep - 1) * (size_t)d->E, (size_t)d->E * sizeof(float));
}

void hm_spec_mtp_mute(hm_spec_mtp *d, bool mute) { d->mute = mute; }

void hm_spec_mtp_reset(hm_spec_mtp *d) {
    memset(d->pending, 0, (size_t)d->E * sizeof(float));
    d->n_rows = 0;
}

hm_status hm_spec_mtp_draft(hm_spec_mtp *d, int32_t tok, int32_t n_past, int32_t n_max, int32_t n_min, float p_min,
                            int32_t *draft, int32_t cap, int32_t *n_draft, float *lg_out, hm_err *err) {
    *n_draft = 0;
    if (n_max > cap) n_max = cap;
    if (n_max <= 0 || n_past + n_max > hm_session_n_ctx(d->s)) return HM_OK;
    if (hm_session_n_past(d->s) < n_past)
        return hm_errf(err, HM_ERR_ARG, "draft-mtp: the head holds %d positions, the target %d",
                       hm_session_n_past(d->s), n_past);
    hm_status st = hm_session_trim(d->s, n_past, err);
    if (st != HM_OK) return st;
    const int32_t nv = hm_session_model(d->s)->info.n_vocab;
    const float *in = d->pending;
    int32_t t = tok, k = 0;
    while (k < n_max) {
        const float *lg;
        if ((st = hm_session_eval_rows(d->s, &t, 1, in, d->hout, &lg, err)) != HM_OK) return st;
        if (lg_out) memcpy(lg_out + (size_t)k * (size_t)nv, lg, (size_t)nv * sizeof(float));
        float p;
        t = hm_spec_top_token(lg, nv, &p);
        if (p < p_min) break;
        draft[k++] = t;
        in = d->hout;
    }
    *n_draft = k < n_min ? 0 : k;
    return HM_OK;
}
