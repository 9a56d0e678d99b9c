/* speculative.c - speculative decoding on a session (hotmoe.h's hm_spec): a drafter proposes k
 * tokens, the target evaluates [pending token, k drafts] as ONE micro-batch with every row's
 * logits, the caller's sampler picks row by row while its picks equal the drafts, and the rows
 * after the last kept one are trimmed off the KV cache.
 *
 * Invariants: hist[0..n_hist) is what the target session holds (n_hist == its n_past between
 * calls); after a step the target holds tok and every pick but the last, which is the new pending
 * token. The sampler sees exactly plain decoding's calls (one sample + accept per pick, in order,
 * each on the logits of the same history), so only the float rounding of a batched row can make
 * the output differ from decoding without speculation.
 *
 * The expert store counts what is computed: a verify batch's routing is recorded for all its
 * k + 1 rows, rejected drafts included, as one prompt-type step of k + 1 tokens (hm_session_eval's
 * rule for n > 1); a step without a draft is a plain decode step. A recurrent target (qwen35moe)
 * is saved before each verify batch; after a rejection it is restored and the kept rows are
 * evaluated again (their routing counted a second time).
 *
 * The model drafters' length (draft-simple, draft-mtp) follows the measured acceptance: n_cur
 * starts at n_max, grows by one after a step that kept every draft and falls to one past the kept
 * drafts after a rejection, within [max(n_min, 1), n_max]. Only how many tokens are drafted changes,
 * never which token is picked. */
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"
#include "exec/exec.h"
#include "model/model.h"
#include "spec.h"

struct hm_spec {
    hm_session *target;    /* borrowed */
    hm_spec_opts o;        /* stop_ids points at stop below */
    int32_t *stop;         /* [o.n_stop_ids] owned */
    hm_spec_drafter *drafter; /* draft-simple: owned */
    hm_spec_ngcache *ngc;  /* ngram-cache: owned */
    hm_spec_mtp *mtp;      /* draft-mtp: owned */
    bool recurrent;        /* the target's state is saved before a verify and restored after a rejection */
    int32_t n_cur;         /* the model drafters' current length (above) */
    int32_t *hist;         /* [n_ctx] */
    int32_t n_hist, n_ctx;
    int32_t *batch;        /* [n_ubatch]: tok + drafts */
    hm_spec_stats st;
};

static const char *const type_names[] = {"none", "ngram-simple", "draft-simple", "ngram-cache", "draft-mtp"};

int hm_spec_type_from_name(const char *name) {
    for (int i = 0; i < (int)(sizeof type_names / sizeof type_names[0]); i++)
        if (name && !strcmp(name, type_names[i])) return i;
    return -1;
}

const char *hm_spec_type_name(hm_spec_type t) {
    return (unsigned)t < sizeof type_names / sizeof type_names[0] ? type_names[t] : "?";
}

void hm_spec_opts_default(hm_spec_opts *o) {
    memset(o, 0, sizeof *o);
    o->n_max = 3;
    o->n_min = 0;
    o->p_min = 0.0f;
    o->size_n = 12;
    o->size_m = 48;
}

hm_status hm_spec_open(hm_spec **out, hm_session *target, const hm_spec_opts *o, hm_err *err) {
    *out = NULL;
    hm_model *m = hm_session_model(target);
    if (o->type != HM_SPEC_NGRAM_SIMPLE && o->type != HM_SPEC_DRAFT_SIMPLE && o->type != HM_SPEC_NGRAM_CACHE &&
        o->type != HM_SPEC_DRAFT_MTP)
        return hm_errf(err, HM_ERR_ARG, "speculative decoding: unknown type %d", (int)o->type);
    const bool recurrent = m->xm && m->xm->n_rs_layer > 0;
    if (recurrent && (!m->arch->state_save || !m->arch->state_restore))
        return hm_errf(err, HM_ERR_UNSUPPORTED, "speculative decoding: %s keeps a recurrent state that cannot be "
                       "saved and restored around a verify batch; decode without --spec-type", m->arch->name);
    if (o->type == HM_SPEC_NGRAM_SIMPLE && (o->size_n < 1 || o->size_n > 1024 || o->size_m < 1 || o->size_m > 1024))
        return hm_errf(err, HM_ERR_ARG, "ngram-simple: size_n %d / size_m %d outside 1..1024", o->size_n, o->size_m);
    if (o->type == HM_SPEC_DRAFT_SIMPLE || o->type == HM_SPEC_DRAFT_MTP) {
        const char *tn = hm_spec_type_name(o->type);
        if (o->type == HM_SPEC_DRAFT_SIMPLE && !o->draft)
            return hm_errf(err, HM_ERR_ARG, "draft-simple needs a draft model (-md FILE)");
        if (o->n_max < 1 || o->n_min < 0 || o->n_min > o->n_max)
            return hm_errf(err, HM_ERR_ARG, "%s: n_max %d / n_min %d (need 1 <= n_max, 0 <= n_min <= n_max)", tn,
                           o->n_max, o->n_min);
        if (!(o->p_min >= 0.0f && o->p_min <= 1.0f))
            return hm_errf(err, HM_ERR_ARG, "%s: p_min %g outside [0, 1]", tn, (double)o->p_min);
    }
    if (o->n_stop_ids < 0 || (o->n_stop_ids > 0 && !o->stop_ids))
        return hm_errf(err, HM_ERR_ARG, "speculative decoding: %d stop ids", o->n_stop_ids);
    hm_spec *sp = calloc(1, sizeof *sp);
    if (!sp) return hm_errf(err, HM_ERR_NOMEM, "speculative decoding: out of memory");
    hm_status st = HM_OK;
    sp->target = target;
    sp->o = *o;
    sp->recurrent = recurrent;
    sp->n_cur = o->n_max;
    sp->n_ctx = hm_session_n_ctx(target);
    sp->hist = malloc((size_t)sp->n_ctx * sizeof *sp->hist);
    sp->batch = malloc((size_t)hm_session_n_ubatch(target) * sizeof *sp->batch);
    sp->stop = malloc((size_t)(o->n_stop_ids + 1) * sizeof *sp->stop);
    if (!sp->hist || !sp->batch || !sp->stop) {
        st = hm_errf(err, HM_ERR_NOMEM, "speculative decoding: out of memory");
        goto fail;
    }
    if (o->n_stop_ids) memcpy(sp->stop, o->stop_ids, (size_t)o->n_stop_ids * sizeof *sp->stop);
    sp->o.stop_ids = sp->stop;
    if (o->type == HM_SPEC_DRAFT_SIMPLE && (st = hm_spec_drafter_open(&sp->drafter, o->draft, target, err)) != HM_OK)
        goto fail;
    if (o->type == HM_SPEC_NGRAM_CACHE && (st = hm_spec_ngcache_open(&sp->ngc, sp->n_ctx, err)) != HM_OK) goto fail;
    if (o->type == HM_SPEC_DRAFT_MTP && (st = hm_spec_mtp_open(&sp->mtp, target, err)) != HM_OK) goto fail;
    *out = sp;
    return HM_OK;
fail:
    hm_spec_close(sp);
    return st;
}

void hm_spec_close(hm_spec *sp) {
    if (!sp) return;
    hm_spec_drafter_close(sp->drafter);
    hm_spec_ngcache_close(sp->ngc);
    hm_spec_mtp_close(sp->mtp);
    free(sp->hist);
    free(sp->batch);
    free(sp->stop);
    free(sp);
}

hm_status hm_spec_add(hm_spec *sp, const int32_t *tokens, int32_t n, hm_err *err) {
    if (n < 0 || n > sp->n_ctx - sp->n_hist)
        return hm_errf(err, HM_ERR_ARG, "speculative decoding: %d tokens do not fit the history (%d of %d)", n,
                       sp->n_hist, sp->n_ctx);
    if (n) memcpy(sp->hist + sp->n_hist, tokens, (size_t)n * sizeof *tokens);
    sp->n_hist += n;
    return HM_OK;
}

void hm_spec_trim(hm_spec *sp, int32_t n_keep) {
    if (n_keep >= 0 && n_keep < sp->n_hist) sp->n_hist = n_keep;
    if (n_keep == 0 && sp->mtp) hm_spec_mtp_reset(sp->mtp);
}

void hm_spec_get_stats(const hm_spec *sp, hm_spec_stats *st) { *st = sp->st; }

void hm_spec_get_opts(const hm_spec *sp, hm_spec_opts *o) { *o = sp->o; }

hm_status hm_spec_set_draft(hm_spec *sp, int32_t n_max, int32_t n_min, float p_min, hm_err *err) {
    if (n_max < 1 || n_max > 1024 || n_min < 0 || n_min > n_max)
        return hm_errf(err, HM_ERR_ARG, "speculative: n_max %d / n_min %d (need 1 <= n_max <= 1024, 0 <= n_min <= "
                       "n_max)", n_max, n_min);
    if (!(p_min >= 0.0f && p_min <= 1.0f))
        return hm_errf(err, HM_ERR_ARG, "speculative: p_min %g outside [0, 1]", (double)p_min);
    sp->o.n_max = sp->n_cur = n_max;
    sp->o.n_min = n_min;
    sp->o.p_min = p_min;
    return HM_OK;
}

static bool is_stop(const hm_spec *sp, int32_t t) {
    for (int32_t i = 0; i < sp->o.n_stop_ids; i++)
        if (sp->stop[i] == t) return true;
    return false;
}

hm_status hm_spec_step(hm_spec *sp, hm_sampler *smp, int32_t tok, int32_t max_out, int32_t *out, int32_t *n_out,
                       hm_err *err) {
    *n_out = 0;
    hm_session *s = sp->target;
    const int32_t n_past = hm_session_n_past(s);
    if (max_out < 1) return hm_errf(err, HM_ERR_ARG, "speculative step: max_out %d (need >= 1)", max_out);
    if (n_past != sp->n_hist)
        return hm_errf(err, HM_ERR_ARG, "speculative step: the session holds %d positions, the history %d (hm_spec_add "
                       "what is evaluated outside the step)", n_past, sp->n_hist);
    if (n_past >= sp->n_ctx) return hm_errf(err, HM_ERR_ARG, "speculative step: the context is full (%d)", sp->n_ctx);
    /* drafts: at most max_out - 1 (the step's own token comes on top), the micro-batch, the context */
    int32_t cap = max_out - 1;
    if (cap > hm_session_n_ubatch(s) - 1) cap = hm_session_n_ubatch(s) - 1;
    if (cap > sp->n_ctx - n_past - 1) cap = sp->n_ctx - n_past - 1;
    int32_t *b = sp->batch, k = 0;
    b[0] = tok;
    const int64_t t0 = hm_time_us();
    if (cap > 0) {
        if (sp->o.type == HM_SPEC_NGRAM_SIMPLE) {
            k = hm_spec_ngram_simple(sp->hist, sp->n_hist, tok, sp->o.size_n, sp->o.size_m, b + 1, cap);
        } else if (sp->o.type == HM_SPEC_NGRAM_CACHE) {
            k = hm_spec_ngcache_draft(sp->ngc, sp->hist, sp->n_hist, tok, b + 1, cap);
        } else if (sp->o.type == HM_SPEC_DRAFT_MTP) {
            hm_status st = hm_spec_mtp_draft(sp->mtp, tok, n_past, sp->n_cur, sp->o.n_min, sp->o.p_min, b + 1, cap,
                                             &k, NULL, err);
            if (st != HM_OK) return st;
        } else {
            hm_status st = hm_spec_drafter_draft(sp->drafter, sp->hist, sp->n_hist, tok, sp->n_cur, sp->o.n_min,
                                                 sp->o.p_min, b + 1, cap, &k, err);
            if (st != HM_OK) return st;
        }
    }
    const int64_t t1 = hm_time_us();
    sp->st.t_draft_s += (double)(t1 - t0) * 1e-6;
    /* verify: one micro-batch of k + 1 rows (k <= n_ubatch - 1), every row's logits when drafting */
    const float *lg = NULL;
    hm_status st;
    if (sp->recurrent && k > 0 && (st = hm_session_save(s, err)) != HM_OK) return st;
    st = hm_session_eval(s, b, k + 1, k > 0, &lg, err);
    sp->st.t_verify_s += (double)(hm_time_us() - t1) * 1e-6;
    if (st != HM_OK) return st;
    const int32_t nv = hm_session_model(s)->info.n_vocab;
    int32_t n = 0;
    for (int32_t i = 0; i <= k; i++) {
        const int32_t t = hm_sampler_sample(smp, lg + (size_t)i * (size_t)nv);
        hm_sampler_accept(smp, t);
        out[n++] = t;
        if (i == k || t != b[i + 1] || is_stop(sp, t)) break;
    }
    /* the target keeps tok and out[0..n-1); out[n-1] is pending */
    const int64_t t2 = hm_time_us();
    if (n_past + n < hm_session_n_past(s)) {
        if (!sp->recurrent) {
            if ((st = hm_session_trim(s, n_past + n, err)) != HM_OK) return st;
        } else {
            /* back to the saved state, then the kept rows again (the MTP head has seen them) */
            if ((st = hm_session_restore(s, n_past, err)) != HM_OK) return st;
            if (sp->mtp) hm_spec_mtp_mute(sp->mtp, true);
            st = hm_session_eval(s, b, n, false, NULL, err);
            if (sp->mtp) hm_spec_mtp_mute(sp->mtp, false);
            if (st != HM_OK) return st;
        }
    }
    sp->st.t_verify_s += (double)(hm_time_us() - t2) * 1e-6;
    if (sp->mtp) hm_spec_mtp_accept(sp->mtp, n);
    /* the length follows the acceptance (the header) */
    if (k > 0) {
        const int32_t lo = sp->o.n_min > 1 ? sp->o.n_min : 1;
        int32_t nc = n - 1 == k ? sp->n_cur + 1 : n;
        sp->n_cur = nc < lo ? lo : nc > sp->o.n_max ? sp->o.n_max : nc;
    }
    sp->hist[sp->n_hist++] = tok;
    if (n > 1) memcpy(sp->hist + sp->n_hist, out, (size_t)(n - 1) * sizeof *out);
    sp->n_hist += n - 1;
    sp->st.steps++;
    sp->st.steps_drafted += k > 0;
    sp->st.drafted += (uint64_t)k;
    sp->st.accepted += (uint64_t)(n - 1);
    sp->st.tokens += (uint64_t)n;
    *n_out = n;
    return HM_OK;
}
