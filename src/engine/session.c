/* session.c - sessions: a position counter over an arch's state (KV cache), a thread pool (the
 * model's shared one when the thread count matches, model.h), and the logits buffers. Evaluation splits a batch into micro-batches of at most
 * n_ubatch tokens and asks the arch for logits only where the caller wants them.
 *
 * Invariants: 0 <= n_past <= n_ctx; the state holds positions [0, n_past); the last-token logits
 * buffer and every per-ubatch array are allocated at open, so a decode step (n = 1, last logits)
 * allocates nothing. The all-positions buffer grows only when a larger logits_all batch arrives.
 * Each micro-batch is one step of the model's expert store (step_end after its forward); evals of
 * one model's sessions never overlap (model->busy), since they share that store. */
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/timer.h"
#include "engine/pp.h"
#include "engine/spec.h"
#include "exec/exec.h"
#include "model/model.h"

struct hm_session {
    hm_model *model;  /* borrowed */
    hm_pool *pool;    /* the model's shared pool (pool_shared) or owned */
    bool pool_shared;
    bool pool_borrowed; /* another session's pool (hm_session_borrow_pool): neither closed nor counted */
    void *state;      /* owned, by model->arch */
    int32_t n_ctx, n_ubatch, n_past, n_threads;
    hm_kv_type kv_type;
    int32_t *pos;     /* [n_ubatch] */
    int32_t *rows;    /* [n_ubatch] = 0, 1, ... */
    float *logits_last; /* [n_vocab] */
    float *logits_all;  /* [cap_all, n_vocab] */
    int32_t cap_all;
    /* hm_session_set_rows_hook: called after each micro-batch with its hidden rows (draft-mtp) */
    hm_session_rows_fn rows_fn;
    void *rows_ctx;
    float *hidden;      /* [n_ubatch, n_embd] while a hook is set, owned */
    hm_pp *pp;          /* the prompt-processing copy attached (hm_session_set_pp), owned; NULL: none */
    hm_session *pp_sess; /* hm_pp_copies: the copy's own session, owned (NULL otherwise) */
    int32_t pp_synced;  /* pp_sess holds s's positions [0, pp_synced) exactly; -1: unknown */
    hm_pp *warm_pp;     /* a copy's session: whose hand-over its steps feed (borrowed), and into which */
    hm_model *warm_to;  /* main model's store; NULL both for any other session */
};

static const char *const kv_names[HM_KV_TYPE_COUNT] = {"f16", "f32", "q8_0", "q4_0", "bf16"};

const char *hm_kv_type_name(hm_kv_type t) { return (unsigned)t < HM_KV_TYPE_COUNT ? kv_names[t] : "?"; }

hm_status hm_kv_type_parse(const char *name, hm_kv_type *out, hm_err *err) {
    for (int i = 0; i < HM_KV_TYPE_COUNT; i++)
        if (name && !strcmp(name, kv_names[i])) {
            *out = (hm_kv_type)i;
            return HM_OK;
        }
    return hm_errf(err, HM_ERR_ARG, "KV cache type '%s': expected f16, f32, bf16, q8_0 or q4_0", name ? name : "");
}

void hm_session_opts_default(hm_session_opts *o) {
    memset(o, 0, sizeof *o);
    o->kv_type = HM_KV_F16;
}

static void pool_lock(hm_model *m) {
    while (atomic_exchange_explicit(&m->pool_lock, 1, memory_order_acquire)) sched_yield();
}
static void pool_unlock(hm_model *m) { atomic_store_explicit(&m->pool_lock, 0, memory_order_release); }

/* The model's pool when free or of s's thread count (shared, counted), else a pool of s's own. */
static hm_status pool_acquire(hm_session *s, hm_err *err) {
    hm_model *m = s->model;
    hm_status st = HM_OK;
    pool_lock(m);
    if (m->pool_refs == 0 || m->pool_threads == s->n_threads) {
        if (m->pool_refs == 0 && (st = hm_pool_open(&m->pool, s->n_threads, err)) == HM_OK)
            m->pool_threads = s->n_threads;
        if (st == HM_OK) {
            m->pool_refs++;
            s->pool = m->pool;
            s->pool_shared = true;
        }
    } else {
        st = hm_pool_open(&s->pool, s->n_threads, err);
    }
    pool_unlock(m);
    return st;
}

static void pool_release(hm_session *s) {
    if (!s->pool) return;
    if (s->pool_borrowed) {
        s->pool = NULL;
        return;
    }
    if (!s->pool_shared) {
        hm_pool_close(s->pool);
        return;
    }
    hm_model *m = s->model;
    pool_lock(m);
    if (--m->pool_refs == 0) {
        hm_pool_close(m->pool);
        m->pool = NULL;
        m->pool_threads = 0;
    }
    pool_unlock(m);
    s->pool = NULL;
}

hm_status hm_session_open(hm_session **out, hm_model *m, const hm_session_opts *opts, hm_err *err) {
    *out = NULL;
    hm_session_opts o;
    if (opts) o = *opts;
    else hm_session_opts_default(&o);
    if (o.n_ctx < 0 || o.n_threads < 0 || o.n_ubatch < 0)
        return hm_errf(err, HM_ERR_ARG, "session: negative n_ctx/n_threads/n_ubatch");
    if ((unsigned)o.kv_type >= HM_KV_TYPE_COUNT)
        return hm_errf(err, HM_ERR_ARG, "session: unknown KV cache type %d", (int)o.kv_type);
    if (o.n_ctx == 0) {
        o.n_ctx = m->info.n_ctx_train > 0 && m->info.n_ctx_train < 4096 ? m->info.n_ctx_train : 4096;
    }
    if (o.n_threads == 0) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        o.n_threads = nc > 0 ? (int32_t)nc : 1;
    }
    if (o.n_threads > 512) return hm_errf(err, HM_ERR_ARG, "session: %d threads is too many", o.n_threads);
    if (o.n_ubatch == 0) o.n_ubatch = 512;
    if (o.n_ubatch > o.n_ctx) o.n_ubatch = o.n_ctx;

    hm_session *s = calloc(1, sizeof *s);
    if (!s) return hm_errf(err, HM_ERR_NOMEM, "session: out of memory");
    s->model = m;
    s->n_ctx = o.n_ctx;
    s->n_ubatch = o.n_ubatch;
    s->n_threads = o.n_threads;
    s->kv_type = o.kv_type;
    hm_status st = pool_acquire(s, err);
    if (st != HM_OK) goto fail;
    hm_state_opts so = {.n_ctx = o.n_ctx, .n_ubatch = o.n_ubatch, .n_threads = o.n_threads, .kv_type = o.kv_type};
    if ((st = m->arch->state_open(m, &so, &s->state, err)) != HM_OK) goto fail;
    s->pos = hm_malloc_aligned((size_t)o.n_ubatch * sizeof(int32_t));
    s->rows = hm_malloc_aligned((size_t)o.n_ubatch * sizeof(int32_t));
    s->logits_last = hm_malloc_aligned((size_t)m->info.n_vocab * sizeof(float));
    if (!s->pos || !s->rows || !s->logits_last) {
        st = hm_errf(err, HM_ERR_NOMEM, "session: out of memory");
        goto fail;
    }
    for (int32_t i = 0; i < o.n_ubatch; i++) s->rows[i] = i;
    *out = s;
    return HM_OK;
fail:
    hm_session_close(s);
    return st;
}

void hm_session_close(hm_session *s) {
    if (!s) return;
    if (s->state) s->model->arch->state_close(s->state);
    hm_session_close(s->pp_sess);
    hm_pp_close(s->pp);
    pool_release(s);
    hm_free_aligned(s->pos);
    hm_free_aligned(s->rows);
    hm_free_aligned(s->logits_last);
    hm_free_aligned(s->logits_all);
    hm_free_aligned(s->hidden);
    free(s);
}

/* The evaluation of hm_session_eval with the forward passes of fm: s's own model, or the attached
 * prompt-processing copy (then each step of the copy's store is handed over to s's model's, pp.h). */
static hm_status eval_with(hm_session *s, hm_model *fm, const int32_t *tokens, int32_t n, bool logits_all,
                           const float **logits, hm_err *err) {
    if (logits) *logits = NULL;
    const int32_t n_vocab = s->model->info.n_vocab;
    if (n <= 0) return hm_errf(err, HM_ERR_ARG, "eval: %d tokens (need at least 1)", n);
    if (n > s->n_ctx - s->n_past)
        return hm_errf(err, HM_ERR_ARG, "eval: %d tokens do not fit the context (%d of %d positions used)", n,
                       s->n_past, s->n_ctx);
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= n_vocab)
            return hm_errf(err, HM_ERR_ARG, "eval: token %d at index %d is outside the vocabulary [0, %d)",
                           tokens[i], i, n_vocab);
    if (logits_all && n > s->cap_all) {
        size_t bytes;
        if (!hm_mul_ok((size_t)n, (size_t)n_vocab * sizeof(float), &bytes))
            return hm_errf(err, HM_ERR_NOMEM, "eval: logits for %d tokens overflow", n);
        float *p = hm_malloc_aligned(bytes);
        if (!p) return hm_errf(err, HM_ERR_NOMEM, "eval: cannot allocate logits for %d tokens (%.1f MiB)", n,
                               (double)bytes / (1 << 20));
        hm_free_aligned(s->logits_all);
        s->logits_all = p;
        s->cap_all = n;
    }
    if (atomic_exchange(&s->model->busy, 1))
        return hm_errf(err, HM_ERR_ARG, "eval: another session of this model is evaluating (sessions of one model "
                       "share its expert store: evaluate them one at a time)");
    if (fm != s->model) {
        if (atomic_exchange(&fm->busy, 1)) {
            atomic_store(&s->model->busy, 0);
            return hm_errf(err, HM_ERR_ARG, "eval: another session is evaluating the prompt-processing model");
        }
    }
    /* the warm hand-over: the copy's steps into the main model's store (on s's state, or from its own session) */
    hm_pp *wp = fm != s->model ? s->pp : s->warm_pp;
    hm_model *wm = fm != s->model ? s->model : s->warm_to;
    if (wp) hm_pp_begin(wp);
    s->pp_synced = -1; /* s's state changes: a copy's session no longer holds what it holds */
    for (int32_t i0 = 0; i0 < n; i0 += s->n_ubatch) {
        int32_t nb = n - i0 < s->n_ubatch ? n - i0 : s->n_ubatch;
        for (int32_t j = 0; j < nb; j++) s->pos[j] = s->n_past + j;
        hm_fwd_batch b = {.tokens = tokens + i0, .pos = s->pos, .n = nb, .hidden = s->rows_fn ? s->hidden : NULL};
        if (logits_all) {
            b.out_rows = s->rows;
            b.n_out = nb;
            b.logits = s->logits_all + (size_t)i0 * (size_t)n_vocab;
        } else if (i0 + nb == n) {
            b.out_rows = s->rows + nb - 1;
            b.n_out = 1;
            b.logits = s->logits_last;
        }
        hm_status st = fm->arch->forward(fm, s->state, s->pool, &b, err);
        if (st != HM_OK) {
            if (fm != s->model) atomic_store(&fm->busy, 0);
            atomic_store(&s->model->busy, 0);
            return st;
        }
        s->n_past += nb;
        if (fm->experts) {
            /* the step boundary: the policy may move units now, never inside a layer. A tier error
             * leaves units in RAM and the logits are good, so it is a warning, not a failure. */
            hm_err serr;
            if (hm_experts_step_end(fm->experts, nb, n > 1, &serr) != HM_OK)
                hm_log_printf(&fm->log, HM_LOG_WARN, "expert store: %s", serr.msg);
            hm_model_experts_tick(fm, nb);
            /* the SSD tier after the VRAM store: exclusivity, then its RAM policy */
            if (fm->ram && hm_ram_tier_step_end(fm->ram, nb, n > 1, &serr) != HM_OK)
                hm_log_printf(&fm->log, HM_LOG_WARN, "RAM tier: %s", serr.msg);
        }
        if (wp) { /* the main store sees the step; half-way, its VRAM residency is re-planned */
            hm_pp_step(wp, wm, nb);
            hm_pp_progress(wp, wm, i0 + nb, n, s->n_ubatch);
        }
        if (s->rows_fn && (st = s->rows_fn(s->rows_ctx, tokens + i0, s->n_past - nb, nb, s->hidden, err)) != HM_OK) {
            atomic_store(&s->model->busy, 0);
            return st;
        }
    }
    if (wp) hm_pp_end(wp, wm);
    if (fm != s->model) atomic_store(&fm->busy, 0);
    atomic_store(&s->model->busy, 0);
    if (logits) *logits = logits_all ? s->logits_all : s->logits_last;
    return HM_OK;
}

hm_status hm_session_set_rows_hook(hm_session *s, hm_session_rows_fn fn, void *ctx, hm_err *err) {
    if (fn && !s->hidden &&
        !(s->hidden = hm_malloc_aligned((size_t)s->n_ubatch * (size_t)s->model->info.n_embd * sizeof(float))))
        return hm_errf(err, HM_ERR_NOMEM, "session: out of memory for the hidden rows");
    s->rows_fn = fn;
    s->rows_ctx = ctx;
    return HM_OK;
}

hm_status hm_session_eval_rows(hm_session *s, const int32_t *tokens, int32_t n, const float *inject, float *hidden,
                               const float **logits, hm_err *err) {
    if (logits) *logits = NULL;
    if (n < 1 || n > s->n_ubatch || n > s->n_ctx - s->n_past)
        return hm_errf(err, HM_ERR_ARG, "eval rows: %d tokens (1..%d, %d of %d positions used)", n, s->n_ubatch,
                       s->n_past, s->n_ctx);
    for (int32_t j = 0; j < n; j++) s->pos[j] = s->n_past + j;
    hm_fwd_batch b = {.tokens = tokens, .pos = s->pos, .n = n, .inject = inject, .hidden = hidden};
    if (logits) {
        b.out_rows = s->rows + n - 1;
        b.n_out = 1;
        b.logits = s->logits_last;
    }
    if (atomic_exchange(&s->model->busy, 1))
        return hm_errf(err, HM_ERR_ARG, "eval rows: another session of this model is evaluating");
    hm_status st = s->model->arch->forward(s->model, s->state, s->pool, &b, err);
    atomic_store(&s->model->busy, 0);
    if (st != HM_OK) return st;
    s->n_past += n;
    if (logits) *logits = s->logits_last;
    return HM_OK;
}

hm_status hm_session_eval(hm_session *s, const int32_t *tokens, int32_t n, bool logits_all,
                          const float **logits, hm_err *err) {
    return eval_with(s, s->model, tokens, n, logits_all, logits, err);
}

/* ---- the prompt-processing copy (pp.h, ppmodel.c) ---- */

hm_status hm_session_set_pp(hm_session *s, const hm_pp_opts *o, hm_err *err) {
    hm_pp *p = NULL;
    hm_session *ps = NULL;
    if (o && o->model) {
        hm_status st = hm_pp_open(&p, s->model, o, s->n_ubatch, err);
        if (st == HM_OK && hm_pp_copies(p)) { /* the copy's own session, with s's options */
            hm_session_opts so = {.n_ctx = s->n_ctx, .n_threads = s->n_threads, .n_ubatch = s->n_ubatch,
                                  .kv_type = s->kv_type};
            if ((st = hm_session_open(&ps, o->model, &so, err)) == HM_OK) {
                hm_session_borrow_pool(ps, s);
                ps->warm_pp = p;
                ps->warm_to = s->model;
            }
        }
        if (st != HM_OK) {
            hm_pp_close(p);
            return st;
        }
    }
    hm_session_close(s->pp_sess);
    hm_pp_close(s->pp);
    s->pp = p;
    s->pp_sess = ps;
    s->pp_synced = -1;
    return HM_OK;
}

/* The copy in its own session: bring it to s's positions (unless it holds them already), evaluate
 * there, copy the new positions into s's state. */
static hm_status eval_pp_copy(hm_session *s, const int32_t *tokens, int32_t n, const float **logits, hm_err *err) {
    hm_session *ps = s->pp_sess;
    hm_status st;
    if (n > s->n_ctx - s->n_past)
        return hm_errf(err, HM_ERR_ARG, "eval: %d tokens do not fit the context (%d of %d positions used)", n,
                       s->n_past, s->n_ctx);
    if (s->pp_synced != s->n_past || ps->n_past != s->n_past) {
        hm_session_reset(ps);
        if (s->n_past > 0 && (st = hm_exec_state_copy(ps->state, s->state, 0, s->n_past, err)) != HM_OK) return st;
        ps->n_past = s->n_past;
    }
    const float *lg = NULL;
    if ((st = hm_session_eval(ps, tokens, n, false, &lg, err)) != HM_OK) {
        ps->n_past = 0;
        s->pp_synced = -1;
        return st;
    }
    if ((st = hm_exec_state_copy(s->state, ps->state, s->n_past, s->n_past + n, err)) != HM_OK) {
        s->pp_synced = -1;
        return st;
    }
    s->n_past += n;
    s->pp_synced = s->n_past;
    memcpy(s->logits_last, lg, (size_t)s->model->info.n_vocab * sizeof(float));
    if (logits) *logits = s->logits_last;
    return HM_OK;
}

hm_status hm_session_save(hm_session *s, hm_err *err) {
    if (!s->model->arch->state_save)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "%s: its session state cannot be saved", s->model->arch->name);
    return s->model->arch->state_save(s->state, err);
}

hm_status hm_session_restore(hm_session *s, int32_t n_past, hm_err *err) {
    if (!s->model->arch->state_restore)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "%s: its session state cannot be restored", s->model->arch->name);
    hm_status st = s->model->arch->state_restore(s->state, err);
    if (st == HM_OK) s->n_past = n_past;
    return st;
}

hm_status hm_session_eval_pp(hm_session *s, const int32_t *tokens, int32_t n, const float **logits, hm_err *err) {
    if (logits) *logits = NULL;
    if (!s->pp) return hm_errf(err, HM_ERR_ARG, "eval: no prompt-processing model is attached to the session");
    const int64_t t0 = hm_time_us();
    hm_status st = s->pp_sess ? eval_pp_copy(s, tokens, n, logits, err)
                              : eval_with(s, hm_pp_model(s->pp), tokens, n, false, logits, err);
    hm_pp_stats *ps = hm_pp_stats_of(s->pp);
    ps->t_pp_s += (double)(hm_time_us() - t0) * 1e-6;
    if (st == HM_OK) ps->tokens_pp += (uint64_t)n;
    return st;
}

hm_status hm_session_prefill(hm_session *s, const int32_t *tokens, int32_t n, const float **logits, hm_err *err) {
    if (!s->pp) return hm_session_eval(s, tokens, n, false, logits, err);
    const hm_pp_opts *o = hm_pp_get_opts(s->pp);
    hm_pp_stats *ps = hm_pp_stats_of(s->pp);
    const int32_t n_pp = n >= o->min_tokens ? n - (o->refresh < n ? o->refresh : n) : 0;
    ps->last_pp = n_pp > 0;
    if (n_pp == 0) {
        ps->prefills_main++;
        return hm_session_eval(s, tokens, n, false, logits, err);
    }
    ps->prefills_pp++;
    if (n > s->n_ctx - s->n_past) /* checked before the copy writes anything */
        return hm_errf(err, HM_ERR_ARG, "eval: %d tokens do not fit the context (%d of %d positions used)", n,
                       s->n_past, s->n_ctx);
    hm_status st = hm_session_eval_pp(s, tokens, n_pp, logits, err);
    if (st != HM_OK || n_pp == n) return st;
    const int64_t t0 = hm_time_us();
    st = hm_session_eval(s, tokens + n_pp, n - n_pp, false, logits, err);
    ps->t_refresh_s += (double)(hm_time_us() - t0) * 1e-6;
    if (st == HM_OK) ps->tokens_refresh += (uint64_t)(n - n_pp);
    return st;
}

void hm_session_pp_stats(const hm_session *s, hm_pp_stats *out) {
    if (s->pp) *out = *hm_pp_stats_of(s->pp);
    else memset(out, 0, sizeof *out);
}

/* Arguments of one sequence of a batched eval (as hm_session_eval checks them). */
static hm_status check_seq(const hm_session *s, const int32_t *tokens, int32_t n, int i, hm_err *err) {
    const int32_t n_vocab = s->model->info.n_vocab;
    if (!tokens || n <= 0) return hm_errf(err, HM_ERR_ARG, "batch eval: sequence %d has %d tokens (need at least 1)", i, n);
    if (n > s->n_ctx - s->n_past)
        return hm_errf(err, HM_ERR_ARG, "batch eval: sequence %d: %d tokens do not fit the context (%d of %d positions "
                       "used)", i, n, s->n_past, s->n_ctx);
    for (int32_t j = 0; j < n; j++)
        if (tokens[j] < 0 || tokens[j] >= n_vocab)
            return hm_errf(err, HM_ERR_ARG, "batch eval: sequence %d: token %d at index %d is outside the vocabulary "
                           "[0, %d)", i, tokens[j], j, n_vocab);
    return HM_OK;
}

hm_status hm_batch_eval(hm_session *const *sessions, const int32_t *const *tokens, const int32_t *n_tokens, int n_seq,
                        const float **logits, hm_err *err) {
    if (!sessions || !tokens || !n_tokens || n_seq < 1 || n_seq > HM_BATCH_MAX_SEQ)
        return hm_errf(err, HM_ERR_ARG, "batch eval: %d sequences (need 1..%d and non-NULL arrays)", n_seq,
                       HM_BATCH_MAX_SEQ);
    if (logits)
        for (int i = 0; i < n_seq; i++) logits[i] = NULL;
    if (!sessions[0]) return hm_errf(err, HM_ERR_ARG, "batch eval: session 0 is NULL");
    if (n_seq == 1) return hm_session_eval(sessions[0], tokens[0], n_tokens[0], false, logits, err);
    hm_session *s0 = sessions[0];
    hm_model *m = s0->model;
    if (!m->arch->forward_multi)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "batch eval: architecture %s evaluates one session at a time",
                       m->arch->name);
    for (int i = 0; i < n_seq; i++) {
        const hm_session *si = sessions[i];
        if (!si) return hm_errf(err, HM_ERR_ARG, "batch eval: session %d is NULL", i);
        if (si->model != m) return hm_errf(err, HM_ERR_ARG, "batch eval: session %d belongs to another model", i);
        for (int j = 0; j < i; j++)
            if (sessions[j] == si) return hm_errf(err, HM_ERR_ARG, "batch eval: session %d is also session %d", i, j);
        if (si->n_threads != s0->n_threads)
            return hm_errf(err, HM_ERR_ARG, "batch eval: session %d has %d threads, session 0 has %d (the batch runs "
                           "on session 0's pool)", i, si->n_threads, s0->n_threads);
        hm_status st = check_seq(si, tokens[i], n_tokens[i], i, err);
        if (st != HM_OK) return st;
    }
    const int32_t n_vocab = m->info.n_vocab;
    if (n_seq > s0->cap_all) { /* the batch's logits land in session 0's all-rows buffer first */
        float *p = hm_malloc_aligned((size_t)n_seq * (size_t)n_vocab * sizeof(float));
        if (!p) return hm_errf(err, HM_ERR_NOMEM, "batch eval: cannot allocate logits for %d sequences", n_seq);
        hm_free_aligned(s0->logits_all);
        s0->logits_all = p;
        s0->cap_all = n_seq;
    }
    if (atomic_exchange(&m->busy, 1))
        return hm_errf(err, HM_ERR_ARG, "batch eval: another session of this model is evaluating");
    int32_t done[HM_BATCH_MAX_SEQ] = {0}, take[HM_BATCH_MAX_SEQ];
    int idx[HM_BATCH_MAX_SEQ];
    hm_fwd_seq seqs[HM_BATCH_MAX_SEQ];
    for (;;) {
        /* one forward: the sequences' next pieces in order, up to session 0's n_ubatch rows */
        int ns = 0;
        int32_t used = 0;
        bool prompt = false;
        for (int i = 0; i < n_seq && used < s0->n_ubatch; i++) {
            hm_session *si = sessions[i];
            int32_t t = n_tokens[i] - done[i];
            if (t == 0) continue;
            if (t > s0->n_ubatch - used) t = s0->n_ubatch - used;
            if (t > si->n_ubatch) t = si->n_ubatch;
            for (int32_t j = 0; j < t; j++) si->pos[j] = si->n_past + j;
            const bool last = done[i] + t == n_tokens[i];
            seqs[ns] = (hm_fwd_seq){.state = si->state,
                                    .b = {.tokens = tokens[i] + done[i], .pos = si->pos, .n = t,
                                          .out_rows = last ? si->rows + t - 1 : NULL, .n_out = last ? 1 : 0}};
            take[ns] = t;
            idx[ns++] = i;
            used += t;
            prompt |= n_tokens[i] > 1;
        }
        if (ns == 0) break;
        hm_status st = m->arch->forward_multi(m, s0->state, s0->pool, seqs, ns, s0->logits_all, err);
        if (st != HM_OK) {
            atomic_store(&m->busy, 0);
            return st;
        }
        for (int k = 0, o = 0; k < ns; k++) {
            hm_session *si = sessions[idx[k]];
            si->n_past += take[k];
            si->pp_synced = -1;
            done[idx[k]] += take[k];
            if (seqs[k].b.n_out)
                memcpy(si->logits_last, s0->logits_all + (size_t)o++ * (size_t)n_vocab, (size_t)n_vocab * sizeof(float));
        }
        if (m->experts) { /* one step of the store per forward, as hm_session_eval's ubatches */
            hm_err serr;
            if (hm_experts_step_end(m->experts, used, prompt, &serr) != HM_OK)
                hm_log_printf(&m->log, HM_LOG_WARN, "expert store: %s", serr.msg);
            hm_model_experts_tick(m, used);
            if (m->ram && hm_ram_tier_step_end(m->ram, used, prompt, &serr) != HM_OK)
                hm_log_printf(&m->log, HM_LOG_WARN, "RAM tier: %s", serr.msg);
        }
    }
    atomic_store(&m->busy, 0);
    if (logits)
        for (int i = 0; i < n_seq; i++) logits[i] = sessions[i]->logits_last;
    return HM_OK;
}

int32_t hm_session_n_past(const hm_session *s) { return s->n_past; }
int32_t hm_session_n_ctx(const hm_session *s) { return s->n_ctx; }
int32_t hm_session_n_threads(const hm_session *s) { return s->n_threads; }

void hm_session_reset(hm_session *s) {
    s->model->arch->state_trim(s->state, 0, NULL);
    s->n_past = 0;
    s->pp_synced = -1;
}

hm_status hm_session_trim(hm_session *s, int32_t n_keep, hm_err *err) {
    if (n_keep < 0 || n_keep > s->n_past)
        return hm_errf(err, HM_ERR_ARG, "trim: n_keep %d outside [0, %d]", n_keep, s->n_past);
    hm_status st = s->model->arch->state_trim(s->state, n_keep, err);
    if (st == HM_OK) s->n_past = n_keep;
    s->pp_synced = -1;
    return st;
}

int32_t hm_session_n_ubatch(const hm_session *s) { return s->n_ubatch; }
hm_model *hm_session_model(const hm_session *s) { return s->model; }

void hm_session_borrow_pool(hm_session *s, const hm_session *other) {
    if (s->n_threads != other->n_threads || s->pool == other->pool) return;
    pool_release(s);
    s->pool = other->pool;
    s->pool_shared = false;
    s->pool_borrowed = true;
}
