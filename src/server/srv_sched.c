/* srv_sched.c - the slot scheduler: N slots, each an hm_session (its own KV cache), stepped by one
 * engine thread in rounds.
 *
 * A round: (1) under the lock, free slots whose client went away, give queued tasks to idle
 * slots; (2) without the lock, build one job per active slot (a prefill chunk of at most
 * SRV_PREFILL_CHUNK prompt tokens, or the one token decoded last round), evaluate the jobs
 * (eval_jobs), then sample, detokenize and publish each slot's token. So N requests make
 * progress together and a long prompt never stalls the others for more than one chunk.
 *
 * Batching seam: eval_jobs is the only place that calls the engine. Today it runs one
 * hm_session_eval per job (the engine's thread pool does the math of each); when the engine
 * offers a batched eval over several sessions (N sequences, one forward pass), eval_jobs
 * becomes that one call and nothing else here changes: jobs already carry (session, tokens, n)
 * and receive their logits.
 *
 * Prompt cache: a slot remembers the tokens in its KV cache; a new task goes to the idle slot
 * sharing the longest prefix with its prompt, and only the rest is evaluated.
 *
 * Speculative decoding (serve --spec-type): each slot keeps an hm_spec on its session, opened before
 * anything is evaluated (draft-mtp's head must see every row); its history follows the session
 * (hm_spec_add of each evaluated job, hm_spec_trim with the prompt cache). A slot past its prompt
 * takes one hm_spec_step a round instead of a decode job (alone: its verify batch is its own
 * forward), and emits its picks in order until one ends the task; a request's speculative.n_max,
 * .n_min and .p_min override the server's for it. ignore_eos requests decode plainly (the masked
 * logits are the sampler's input there).
 *
 * Invariants: only the engine thread touches sessions, samplers and detokenizers; slot->task
 * changes only under mu (so /slots and cancel see a consistent picture); every task the
 * scheduler holds ends with done = true and exactly one finish reason. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "server/server.h"

#define SRV_PREFILL_CHUNK 256
#define SRV_RATE_WINDOW_S 10.0

struct srv_slot {
    int id;
    hm_session *sess;   /* owned */
    hm_sampler *smp;    /* owned, per task */
    hm_detok *detok;    /* owned, per task */
    srv_task *task;     /* NULL when idle */
    bool fresh;         /* task just assigned: needs set-up on the engine thread */
    int32_t *cache;     /* [n_ctx] the tokens in the KV cache */
    float *masked;      /* [n_vocab] logits with end-of-generation ids masked (ignore_eos) */
    int32_t n_cache;
    int32_t n_done;     /* prompt tokens of the task in the KV */
    int32_t pp_end;     /* prompt tokens before this go through the prompt-processing copy (0: none) */
    int32_t next_tok;   /* the token to evaluate next round once the prompt is in */
    int32_t n_gen;
    hm_spec *spec;      /* owned; NULL without speculation */
    bool spec_now;      /* this round: a speculative step (run_round) */
    hm_spec_stats spec_st; /* the task's share of spec's counters (for /slots) */
    srv_buf gen;        /* the task's generated text */
    size_t released;    /* bytes of gen handed to the task */
    double t_start;
};

/* One step of one slot for eval_jobs. */
typedef struct srv_job {
    srv_slot *slot;
    const int32_t *tokens;
    int32_t n;
    bool prefill;
    bool pp;             /* a prefill chunk for the prompt-processing copy */
    const float *logits; /* out: [n_vocab] of the last token */
    hm_status st;        /* out */
    double dt;           /* out: seconds */
    hm_err err;
} srv_job;

const char *srv_finish_name(srv_finish f) {
    switch (f) {
    case SRV_FINISH_STOP: return "stop";
    case SRV_FINISH_LENGTH: return "length";
    case SRV_FINISH_CANCEL: return "cancelled";
    case SRV_FINISH_ERROR: return "error";
    default: return NULL;
    }
}

/* ---- tasks ---- */

srv_task *srv_task_new(void) {
    srv_task *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    pthread_cond_init(&t->cv, NULL);
    t->refs = 1;
    t->slot = -1;
    return t;
}

static void task_free(srv_task *t) {
    free(t->prompt);
    for (int i = 0; i < t->n_stop; i++) free(t->stop[i]);
    srv_buf_free(&t->out);
    srv_buf_free(&t->text);
    srv_buf_free(&t->reasoning);
    hm_chat_reply_close(t->reply);
    pthread_cond_destroy(&t->cv);
    free(t);
}

static void task_unref_locked(srv_task *t) {
    if (--t->refs == 0) task_free(t);
}

void srv_task_release(srv_sched *s, srv_task *t) {
    if (!t) return;
    pthread_mutex_lock(&s->mu);
    task_unref_locked(t);
    pthread_mutex_unlock(&s->mu);
}

void srv_sched_submit(srv_sched *s, srv_task *t) {
    pthread_mutex_lock(&s->mu);
    t->refs++;
    t->seq = s->next_seq++;
    if (s->stop) {
        t->done = true;
        t->finish = SRV_FINISH_CANCEL;
        snprintf(t->err, sizeof t->err, "the server is stopping");
        t->refs--;
    } else {
        if (s->q_tail) s->q_tail->next = t;
        else s->q_head = t;
        s->q_tail = t;
        s->n_queued++;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
}

void srv_sched_cancel(srv_sched *s, srv_task *t) {
    pthread_mutex_lock(&s->mu);
    if (!t->done) {
        t->cancelled = true;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
}

/* ---- publishing (engine thread, under mu) ---- */

static void stats_rate_sample(srv_stats *st, double now) {
    int last = (st->rate_i + 15) % 16;
    if (st->rate_t[last] != 0 && now - st->rate_t[last] < 0.5) return;
    st->rate_t[st->rate_i] = now;
    st->rate_n[st->rate_i] = st->n_predicted;
    st->rate_i = (st->rate_i + 1) % 16;
}

static double stats_rate(const srv_stats *st, double now) {
    double t0 = 0;
    uint64_t n0 = 0;
    for (int i = 0; i < 16; i++) {
        if (st->rate_t[i] == 0 || now - st->rate_t[i] > SRV_RATE_WINDOW_S) continue;
        if (t0 == 0 || st->rate_t[i] < t0) {
            t0 = st->rate_t[i];
            n0 = st->rate_n[i];
        }
    }
    if (t0 == 0 || now - t0 < 0.2) return 0;
    return (double)(st->n_predicted - n0) / (now - t0);
}

static json_t *usage_json(const srv_task *t) {
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", (int)t->n_prompt, "completion_tokens", (int)t->n_gen,
                     "total_tokens", (int)(t->n_prompt + t->n_gen), "prompt_tokens_details", "cached_tokens",
                     (int)t->n_cached);
}

/* A stream chunk of the OpenAI format. delta may be NULL (the finishing chunk); reasoning (NULL
 * or not empty) goes out as delta.reasoning_content, as llama-server sends it. */
static json_t *chunk_json_r(const srv_sched *s, const srv_task *t, const char *delta, size_t len,
                            const char *reasoning, size_t rlen, bool first, srv_finish finish) {
    json_t *choice;
    json_t *text = json_stringn(delta ? delta : "", delta ? len : 0);
    if (!text) text = json_string(""); /* the detokenizer promises UTF-8; never send junk */
    const char *fr = srv_finish_name(finish);
    if (t->kind == SRV_TASK_CHAT) {
        json_t *d = json_object();
        if (first) json_object_set_new(d, "role", json_string("assistant"));
        if (delta) json_object_set_new(d, "content", text);
        else json_decref(text);
        json_t *r = reasoning ? json_stringn(reasoning, rlen) : NULL;
        if (r) json_object_set_new(d, "reasoning_content", r);
        choice = json_pack("{s:i, s:o, s:n, s:s?}", "index", 0, "delta", d, "logprobs", "finish_reason", fr);
    } else {
        choice = json_pack("{s:i, s:o, s:n, s:s?}", "index", 0, "text", text, "logprobs", "finish_reason", fr);
    }
    return json_pack("{s:s, s:s, s:I, s:s, s:s, s:[o]}", "id", t->id, "object",
                     t->kind == SRV_TASK_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                     (json_int_t)t->created, "model", s->model_id, "system_fingerprint", "hotmoe-" HOTMOE_VERSION,
                     "choices", choice);
}

static json_t *chunk_json(const srv_sched *s, const srv_task *t, const char *delta, size_t len, bool first,
                          srv_finish finish) {
    return chunk_json_r(s, t, delta, len, NULL, 0, first, finish);
}

static void sse_add(srv_buf *out, json_t *j) {
    char *str = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!str) return;
    srv_buf_str(out, "data: ");
    srv_buf_str(out, str);
    srv_buf_str(out, "\n\n");
    free(str);
}

/* Add released text to the task (and its stream): through the reply splitter when the task has one
 * (final: the reply ends here). A chunk goes out for a token even when the splitter holds all of
 * its text back, so the first one still carries the role. */
static void task_add_text(srv_sched *s, srv_task *t, const char *delta, size_t len, bool first, bool final) {
    if (!t->reply) {
        srv_buf_add(&t->text, delta, len);
        if (t->stream) sse_add(&t->out, chunk_json(s, t, delta, len, first, SRV_FINISH_NONE));
        return;
    }
    hm_chat_reply_part p;
    hm_err err = {{0}};
    if (hm_chat_reply_push(t->reply, delta, len, final, &p, &err) != HM_OK) p = (hm_chat_reply_part){"", "", 0, 0};
    srv_buf_add(&t->text, p.content, p.n_content);
    srv_buf_add(&t->reasoning, p.reasoning, p.n_reasoning);
    if (t->stream && (first || p.n_content || p.n_reasoning))
        sse_add(&t->out, chunk_json_r(s, t, p.content, p.n_content, p.n_reasoning ? p.reasoning : NULL,
                                      p.n_reasoning, first, SRV_FINISH_NONE));
}

/* Hand delta (released text of one token) to the task. */
static void publish_token(srv_sched *s, srv_slot *sl, const char *delta, size_t len, bool final) {
    srv_task *t = sl->task;
    t->n_gen = sl->n_gen;
    task_add_text(s, t, delta, len, sl->n_gen == 1, final);
    pthread_cond_broadcast(&t->cv);
}

/* End the slot's task with reason f and free the slot (under mu). */
static void finish_locked(srv_sched *s, srv_slot *sl, srv_finish f, const char *msg) {
    srv_task *t = sl->task;
    t->finish = f;
    t->n_gen = sl->n_gen;
    t->t_gen_s = sl->t_start > 0 ? srv_now() - sl->t_start - t->t_prompt_s : 0;
    if (msg) snprintf(t->err, sizeof t->err, "%s", msg);
    if (t->stream && f != SRV_FINISH_CANCEL) {
        if (f == SRV_FINISH_ERROR) {
            sse_add(&t->out, srv_error_json(t->err, "server_error", NULL, NULL));
        } else {
            json_t *c = chunk_json(s, t, NULL, 0, sl->n_gen == 0, f);
            json_object_set_new(c, "usage", usage_json(t));
            sse_add(&t->out, c);
            if (t->include_usage) {
                json_t *u = chunk_json(s, t, NULL, 0, false, SRV_FINISH_NONE);
                json_object_set_new(u, "choices", json_array());
                json_object_set_new(u, "usage", usage_json(t));
                sse_add(&t->out, u);
            }
        }
        srv_buf_str(&t->out, "data: [DONE]\n\n");
    }
    if (f == SRV_FINISH_CANCEL) s->stats.n_requests_cancelled++;
    else if (f == SRV_FINISH_ERROR) s->stats.n_requests_failed++;
    else s->stats.n_requests_ok++;
    t->done = true;
    t->slot = -1;
    pthread_cond_broadcast(&t->cv);
    sl->task = NULL;
    sl->fresh = false;
    task_unref_locked(t);
}

static void finish(srv_sched *s, srv_slot *sl, srv_finish f, const char *msg) {
    pthread_mutex_lock(&s->mu);
    finish_locked(s, sl, f, msg);
    pthread_mutex_unlock(&s->mu);
    hm_sampler_close(sl->smp);
    sl->smp = NULL;
    hm_detok_close(sl->detok);
    sl->detok = NULL;
}

/* ---- the engine thread ---- */

static int32_t common_prefix(const int32_t *a, int32_t na, const int32_t *b, int32_t nb) {
    int32_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

/* Queued tasks -> idle slots, each to the idle slot with the longest cached prefix (under mu). */
static void assign_locked(srv_sched *s) {
    while (s->q_head) {
        srv_task *t = s->q_head;
        int best = -1;
        int32_t best_p = -1;
        for (int i = 0; i < s->n_slots; i++) {
            srv_slot *sl = &s->slots[i];
            if (sl->task) continue;
            int32_t p = common_prefix(sl->cache, sl->n_cache, t->prompt, t->n_prompt);
            if (p > best_p) {
                best_p = p;
                best = i;
            }
        }
        if (best < 0) return;
        s->q_head = t->next;
        if (!s->q_head) s->q_tail = NULL;
        t->next = NULL;
        s->n_queued--;
        if (t->cancelled) { /* gave up while queued */
            t->done = true;
            t->finish = SRV_FINISH_CANCEL;
            s->stats.n_requests_cancelled++;
            pthread_cond_broadcast(&t->cv);
            task_unref_locked(t);
            continue;
        }
        srv_slot *sl = &s->slots[best];
        sl->task = t;
        sl->fresh = true;
        t->slot = sl->id;
    }
}

/* Set up a freshly assigned slot (engine thread, no lock): sampler, detokenizer, prompt cache. */
static bool slot_setup(srv_sched *s, srv_slot *sl) {
    srv_task *t = sl->task;
    hm_err err = {{0}};
    sl->fresh = false;
    sl->n_gen = 0;
    sl->gen.len = 0;
    sl->released = 0;
    sl->t_start = srv_now();
    hm_sampler_close(sl->smp); /* left over when the last task ended by cancel under the lock */
    hm_detok_close(sl->detok);
    sl->smp = NULL;
    sl->detok = NULL;
    if (hm_sampler_open(&sl->smp, s->n_vocab, &t->sampling, &err) != HM_OK ||
        hm_detok_open(&sl->detok, s->tok, false, &err) != HM_OK) {
        finish(s, sl, SRV_FINISH_ERROR, err.msg);
        return false;
    }
    int32_t p = common_prefix(sl->cache, sl->n_cache, t->prompt, t->n_prompt);
    if (p >= t->n_prompt) p = t->n_prompt - 1; /* evaluate at least one token for its logits */
    if (p > hm_session_n_past(sl->sess)) p = hm_session_n_past(sl->sess);
    if (hm_session_trim(sl->sess, p, &err) != HM_OK) {
        hm_session_reset(sl->sess);
        p = 0;
    }
    if (sl->spec) {
        hm_spec_trim(sl->spec, p);
        memset(&sl->spec_st, 0, sizeof sl->spec_st);
        const int32_t nx = t->spec_n_max >= 0 ? t->spec_n_max : s->spec.n_max;
        const int32_t nn = t->spec_n_min >= 0 ? t->spec_n_min : s->spec.n_min;
        const float pm = t->spec_p_min >= 0 ? t->spec_p_min : s->spec.p_min;
        if (hm_spec_set_draft(sl->spec, nx, nn, pm, &err) != HM_OK) {
            finish(s, sl, SRV_FINISH_ERROR, err.msg);
            return false;
        }
    }
    sl->n_cache = p;
    sl->n_done = p;
    /* per request, by the length of what is left to evaluate: the copy takes all but the refresh */
    const int32_t left = t->n_prompt - p, keep = s->pp.refresh < left ? s->pp.refresh : left;
    sl->pp_end = s->pp.model && left >= s->pp.min_tokens && left > keep ? t->n_prompt - keep : 0;
    if (sl->pp_end)
        fprintf(stderr, "serve: slot %d: prompt of %d tokens (%d cached): %d prefilled by the prompt-processing "
                        "model, %d by the main model\n", sl->id, t->n_prompt, p, sl->pp_end - p, t->n_prompt - sl->pp_end);
    pthread_mutex_lock(&s->mu);
    t->n_cached = p;
    s->stats.n_requests_pp += sl->pp_end > 0;
    pthread_mutex_unlock(&s->mu);
    return true;
}

/* THE place that runs the model: one evaluation per job today; one batched call later. */
/* All jobs in one hm_batch_eval (one forward pass per micro-batch for every slot). The pass's time
 * is shared among the jobs by their token counts. The per-session loop stays for models whose
 * architecture batches one session only (qwen35moe, gemma4: HM_ERR_UNSUPPORTED, remembered) and
 * for a round with a bad job (HM_ERR_ARG: nothing was evaluated; the loop fails that job alone). */
static void eval_jobs(srv_sched *s, srv_job *jobs, int n_jobs) {
    bool any_pp = false; /* a chunk for the copy runs on its own (another model's pass) */
    for (int i = 0; i < n_jobs; i++) any_pp |= jobs[i].pp;
    if (n_jobs > 1 && n_jobs <= HM_BATCH_MAX_SEQ && !s->no_batch && !any_pp) {
        hm_session *ss[HM_BATCH_MAX_SEQ];
        const int32_t *tp[HM_BATCH_MAX_SEQ];
        int32_t nn[HM_BATCH_MAX_SEQ];
        const float *lg[HM_BATCH_MAX_SEQ];
        int64_t total = 0;
        for (int i = 0; i < n_jobs; i++) {
            ss[i] = jobs[i].slot->sess;
            tp[i] = jobs[i].tokens;
            nn[i] = jobs[i].n;
            total += jobs[i].n;
        }
        hm_err err;
        double t0 = srv_now();
        hm_status st = hm_batch_eval(ss, tp, nn, n_jobs, lg, &err);
        double dt = srv_now() - t0;
        if (st == HM_ERR_UNSUPPORTED) s->no_batch = true;
        if (st != HM_ERR_UNSUPPORTED && st != HM_ERR_ARG) {
            pthread_mutex_lock(&s->mu);
            s->stats.n_batched += st == HM_OK;
            pthread_mutex_unlock(&s->mu);
            for (int i = 0; i < n_jobs; i++) {
                jobs[i].st = st;
                jobs[i].logits = st == HM_OK ? lg[i] : NULL;
                jobs[i].dt = dt * (double)jobs[i].n / (double)total;
                if (st != HM_OK) jobs[i].err = err;
            }
            return;
        }
    }
    for (int i = 0; i < n_jobs; i++) {
        srv_job *j = &jobs[i];
        double t0 = srv_now();
        j->st = j->pp ? hm_session_eval_pp(j->slot->sess, j->tokens, j->n, &j->logits, &j->err)
                      : hm_session_eval(j->slot->sess, j->tokens, j->n, false, &j->logits, &j->err);
        j->dt = srv_now() - t0;
    }
}

static size_t max_stop_len(const srv_task *t) {
    size_t m = 0;
    for (int i = 0; i < t->n_stop; i++) {
        size_t l = strlen(t->stop[i]);
        if (l > m) m = l;
    }
    return m;
}

/* How much of the slot's text can go out now. Returns the new released offset; *stopped when a
 * stop string matched (gen is cut at it). The suffix that could still begin a stop string is
 * held back unless final. */
static size_t release_text(srv_slot *sl, bool final, bool *stopped) {
    const srv_task *t = sl->task;
    *stopped = false;
    size_t len = sl->gen.len;
    if (t->n_stop == 0) return len;
    size_t ms = max_stop_len(t);
    size_t from = sl->released >= ms ? sl->released - ms + 1 : 0;
    size_t cut = len;
    for (int i = 0; i < t->n_stop; i++) {
        size_t sn = strlen(t->stop[i]);
        if (sn == 0 || len < from + sn) continue;
        const char *m = memmem(sl->gen.p + from, len - from, t->stop[i], sn);
        if (m && (size_t)(m - sl->gen.p) < cut) {
            cut = (size_t)(m - sl->gen.p);
            *stopped = true;
        }
    }
    if (*stopped) {
        sl->gen.len = cut;
        sl->gen.p[cut] = 0;
        return cut > sl->released ? cut : sl->released;
    }
    if (final) return len;
    size_t hold = 0;
    for (int i = 0; i < t->n_stop; i++) {
        size_t sn = strlen(t->stop[i]);
        if (sn == 0) continue;
        size_t k = sn - 1 < len - sl->released ? sn - 1 : len - sl->released;
        for (; k > hold; k--)
            if (memcmp(sl->gen.p + len - k, t->stop[i], k) == 0) break;
        if (k > hold) hold = k;
    }
    return len - hold;
}

/* Publish the slot's picked token tok (already given to the sampler when it is not an
 * end-of-generation id); may finish the task. */
static void slot_emit(srv_sched *s, srv_slot *sl, int32_t tok) {
    srv_task *t = sl->task;
    bool eog = hm_tokenizer_is_eog(s->tok, tok);
    size_t plen = 0;
    const char *piece;
    if (!eog) {
        sl->n_gen++;
        piece = hm_detok_push(sl->detok, tok, &plen);
        srv_buf_add(&sl->gen, piece, plen);
    }
    bool last = eog || sl->n_gen >= t->max_tokens;
    if (last) {
        piece = hm_detok_flush(sl->detok, &plen);
        srv_buf_add(&sl->gen, piece, plen);
    }
    bool stopped;
    size_t rel = release_text(sl, last, &stopped);
    size_t from = sl->released;
    sl->released = rel;
    pthread_mutex_lock(&s->mu);
    s->stats.n_predicted += eog ? 0 : 1;
    stats_rate_sample(&s->stats, srv_now());
    if (!eog) publish_token(s, sl, sl->gen.p ? sl->gen.p + from : "", rel - from, last || stopped);
    else if (rel > from || t->reply) /* text held back for a stop string that never came, or by the splitter */
        task_add_text(s, t, sl->gen.p ? sl->gen.p + from : "", rel - from, false, true);
    pthread_mutex_unlock(&s->mu);
    if (eog || stopped) finish(s, sl, SRV_FINISH_STOP, NULL);
    else if (last) finish(s, sl, SRV_FINISH_LENGTH, NULL);
    else sl->next_tok = tok;
}

/* Sample the slot's next token from logits and publish it; may finish the task. */
static void slot_sample(srv_sched *s, srv_slot *sl, const float *logits) {
    srv_task *t = sl->task;
    if (t->ignore_eos && s->n_eog) {
        memcpy(sl->masked, logits, (size_t)s->n_vocab * sizeof(float));
        for (int32_t i = 0; i < s->n_eog; i++) sl->masked[s->eog[i]] = -INFINITY;
        logits = sl->masked;
    }
    int32_t tok = hm_sampler_sample(sl->smp, logits);
    if (!hm_tokenizer_is_eog(s->tok, tok)) hm_sampler_accept(sl->smp, tok);
    slot_emit(s, sl, tok);
}

#define SRV_SPEC_MAX_OUT 64 /* picks of one speculative step (drafts + 1) */

/* One speculative step of a slot past its prompt: draft, verify, emit the picks in order. */
static void slot_spec_step(srv_sched *s, srv_slot *sl) {
    srv_task *t = sl->task;
    int32_t out[SRV_SPEC_MAX_OUT], k = 0, room = t->max_tokens - sl->n_gen;
    if (room > SRV_SPEC_MAX_OUT) room = SRV_SPEC_MAX_OUT;
    if (room < 1) room = 1;
    hm_spec_stats a, b;
    hm_spec_get_stats(sl->spec, &a);
    hm_err err;
    const double t0 = srv_now();
    hm_status st = hm_spec_step(sl->spec, sl->smp, sl->next_tok, room, out, &k, &err);
    const double dt = srv_now() - t0;
    if (st != HM_OK) {
        hm_session_reset(sl->sess);
        hm_spec_trim(sl->spec, 0);
        sl->n_cache = 0;
        finish(s, sl, SRV_FINISH_ERROR, err.msg);
        return;
    }
    hm_spec_get_stats(sl->spec, &b);
    /* the session holds next_tok and every pick but the last */
    sl->cache[sl->n_cache++] = sl->next_tok;
    for (int32_t i = 0; i + 1 < k; i++) sl->cache[sl->n_cache++] = out[i];
    pthread_mutex_lock(&s->mu);
    s->stats.t_predicted_s += dt;
    s->stats.spec_drafted += b.drafted - a.drafted;
    s->stats.spec_accepted += b.accepted - a.accepted;
    s->stats.spec_steps += b.steps_drafted - a.steps_drafted;
    sl->spec_st.drafted += b.drafted - a.drafted;
    sl->spec_st.accepted += b.accepted - a.accepted;
    sl->spec_st.steps_drafted += b.steps_drafted - a.steps_drafted;
    pthread_mutex_unlock(&s->mu);
    for (int32_t i = 0; i < k && sl->task == t; i++) slot_emit(s, sl, out[i]);
}

static void run_round(srv_sched *s, srv_job *jobs) {
    int n_jobs = 0;
    for (int i = 0; i < s->n_slots; i++) {
        srv_slot *sl = &s->slots[i];
        sl->spec_now = false;
        if (!sl->task) continue;
        if (sl->fresh && !slot_setup(s, sl)) continue;
        srv_task *t = sl->task;
        if (sl->spec && !t->ignore_eos && sl->n_done >= t->n_prompt) {
            sl->spec_now = true; /* a speculative step after the jobs */
            continue;
        }
        srv_job *j = &jobs[n_jobs++];
        memset(j, 0, sizeof *j);
        j->slot = sl;
        if (sl->n_done < t->n_prompt) {
            j->prefill = true;
            j->tokens = t->prompt + sl->n_done;
            j->n = t->n_prompt - sl->n_done < SRV_PREFILL_CHUNK ? t->n_prompt - sl->n_done : SRV_PREFILL_CHUNK;
            if (sl->n_done < sl->pp_end) { /* the copy's part ends where the main model's refresh starts */
                j->pp = true;
                if (j->n > sl->pp_end - sl->n_done) j->n = sl->pp_end - sl->n_done;
            }
        } else {
            j->tokens = &sl->next_tok;
            j->n = 1;
        }
    }
    if (n_jobs > 0) eval_jobs(s, jobs, n_jobs);
    for (int i = 0; i < n_jobs; i++) {
        srv_job *j = &jobs[i];
        srv_slot *sl = j->slot;
        if (j->st != HM_OK) {
            hm_session_reset(sl->sess);
            sl->n_cache = 0;
            finish(s, sl, SRV_FINISH_ERROR, j->err.msg);
            continue;
        }
        memcpy(sl->cache + sl->n_cache, j->tokens, (size_t)j->n * sizeof(int32_t));
        sl->n_cache += j->n;
        if (sl->spec && hm_spec_add(sl->spec, j->tokens, j->n, &j->err) != HM_OK) { /* a bug: the history lost */
            hm_session_reset(sl->sess);
            hm_spec_trim(sl->spec, 0);
            sl->n_cache = 0;
            finish(s, sl, SRV_FINISH_ERROR, j->err.msg);
            continue;
        }
        pthread_mutex_lock(&s->mu);
        if (j->prefill) {
            sl->n_done += j->n;
            sl->task->t_prompt_s += j->dt;
            s->stats.n_prompt_tokens += (uint64_t)j->n;
            if (j->pp) s->stats.n_prompt_tokens_pp += (uint64_t)j->n;
            s->stats.t_prompt_s += j->dt;
        } else {
            s->stats.t_predicted_s += j->dt;
        }
        bool ready = sl->n_done >= sl->task->n_prompt;
        pthread_mutex_unlock(&s->mu);
        if (ready) slot_sample(s, sl, j->logits);
    }
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].spec_now && s->slots[i].task) slot_spec_step(s, &s->slots[i]);
}

static void *engine_main(void *arg) {
    srv_sched *s = arg;
    srv_job *jobs = calloc((size_t)s->n_slots, sizeof *jobs);
    pthread_mutex_lock(&s->mu);
    while (jobs) {
        if (s->call_fn) {
            srv_engine_fn fn = s->call_fn;
            void *ca = s->call_arg;
            pthread_mutex_unlock(&s->mu);
            fn(ca);
            pthread_mutex_lock(&s->mu);
            s->call_fn = NULL;
            s->call_done = true;
            pthread_cond_broadcast(&s->call_cv);
        }
        if (s->stop) break;
        for (int i = 0; i < s->n_slots; i++) /* clients that went away free their slot now */
            if (s->slots[i].task && s->slots[i].task->cancelled) finish_locked(s, &s->slots[i], SRV_FINISH_CANCEL, NULL);
        assign_locked(s);
        int n_active = 0;
        for (int i = 0; i < s->n_slots; i++) n_active += s->slots[i].task != NULL;
        if (n_active == 0) {
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        s->stats.n_rounds++;
        pthread_mutex_unlock(&s->mu);
        run_round(s, jobs);
        pthread_mutex_lock(&s->mu);
    }
    /* stopping: every task still held ends as cancelled */
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].task) finish_locked(s, &s->slots[i], SRV_FINISH_CANCEL, "the server is stopping");
    while (s->q_head) {
        srv_task *t = s->q_head;
        s->q_head = t->next;
        t->done = true;
        t->finish = SRV_FINISH_CANCEL;
        pthread_cond_broadcast(&t->cv);
        task_unref_locked(t);
    }
    s->q_tail = NULL;
    s->n_queued = 0;
    s->stop = true;
    pthread_cond_broadcast(&s->call_cv);
    pthread_mutex_unlock(&s->mu);
    free(jobs);
    return NULL;
}

bool srv_sched_call(srv_sched *s, srv_engine_fn fn, void *arg) {
    pthread_mutex_lock(&s->mu);
    while (s->call_fn && !s->stop) pthread_cond_wait(&s->call_cv, &s->mu);
    if (s->stop) {
        pthread_mutex_unlock(&s->mu);
        return false;
    }
    s->call_fn = fn;
    s->call_arg = arg;
    s->call_done = false;
    pthread_cond_signal(&s->cv);
    while (!s->call_done && !s->stop) pthread_cond_wait(&s->call_cv, &s->mu);
    bool ok = s->call_done && s->call_fn == NULL;
    /* call_done belongs to whoever posted last; we are the only poster until call_fn clears */
    if (!ok && s->call_fn == fn) s->call_fn = NULL;
    pthread_mutex_unlock(&s->mu);
    return ok;
}

/* ---- life cycle ---- */

hm_status srv_sched_init(srv_sched *s, hm_model *m, const hm_tokenizer *tok, const char *model_id, int n_slots,
                         int32_t n_ctx, int32_t n_ubatch, int32_t n_threads, hm_kv_type kv_type,
                         const hm_spec_opts *spec, hm_err *err) {
    memset(s, 0, sizeof *s);
    s->model = m;
    s->tok = tok;
    s->model_id = model_id;
    s->n_vocab = hm_model_n_vocab(m);
    s->n_slots = n_slots;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->call_cv, NULL);
    s->slots = calloc((size_t)n_slots, sizeof *s->slots);
    s->eog = malloc((size_t)s->n_vocab * sizeof(int32_t));
    for (int32_t i = 0; s->eog && i < s->n_vocab; i++)
        if (hm_tokenizer_is_eog(tok, i)) s->eog[s->n_eog++] = i;
    if (!s->slots || !s->eog) {
        snprintf(err->msg, sizeof err->msg, "serve: out of memory for %d slots", n_slots);
        return HM_ERR_NOMEM;
    }
    if (spec && spec->type != HM_SPEC_NONE) {
        s->spec = *spec;
        s->spec.stop_ids = s->eog;
        s->spec.n_stop_ids = s->n_eog;
    }
    hm_session_opts so;
    hm_session_opts_default(&so);
    so.n_ctx = n_ctx;
    so.n_ubatch = n_ubatch;
    so.n_threads = n_threads;
    so.kv_type = kv_type;
    for (int i = 0; i < n_slots; i++) {
        srv_slot *sl = &s->slots[i];
        sl->id = i;
        hm_status st = hm_session_open(&sl->sess, m, &so, err);
        if (st != HM_OK) return st;
        s->n_ctx = hm_session_n_ctx(sl->sess);
        sl->cache = malloc((size_t)s->n_ctx * sizeof(int32_t));
        sl->masked = malloc((size_t)s->n_vocab * sizeof(float));
        if (!sl->cache || !sl->masked) {
            snprintf(err->msg, sizeof err->msg, "serve: out of memory for slot %d", i);
            return HM_ERR_NOMEM;
        }
        if (s->spec.type != HM_SPEC_NONE && (st = hm_spec_open(&sl->spec, sl->sess, &s->spec, err)) != HM_OK) return st;
    }
    return HM_OK;
}

hm_status srv_sched_set_pp(srv_sched *s, const hm_pp_opts *o, hm_err *err) {
    for (int i = 0; i < s->n_slots; i++) {
        hm_status st = hm_session_set_pp(s->slots[i].sess, o, err);
        if (st != HM_OK) return st;
    }
    s->pp = *o;
    return HM_OK;
}

hm_status srv_sched_start(srv_sched *s, hm_err *err) {
    if (pthread_create(&s->thread, NULL, engine_main, s) != 0) {
        snprintf(err->msg, sizeof err->msg, "serve: cannot start the engine thread");
        return HM_ERR_INTERNAL;
    }
    s->started = true;
    return HM_OK;
}

void srv_sched_stop(srv_sched *s) {
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->started) pthread_join(s->thread, NULL);
    s->started = false;
}

void srv_sched_free(srv_sched *s) {
    for (int i = 0; s->slots && i < s->n_slots; i++) {
        srv_slot *sl = &s->slots[i];
        hm_spec_close(sl->spec);
        hm_session_close(sl->sess);
        hm_sampler_close(sl->smp);
        hm_detok_close(sl->detok);
        free(sl->cache);
        free(sl->masked);
        srv_buf_free(&sl->gen);
    }
    free(s->slots);
    s->slots = NULL;
    free(s->eog);
    s->eog = NULL;
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->call_cv);
}

/* ---- views ---- */

json_t *srv_sched_slots_json(srv_sched *s) {
    json_t *a = json_array();
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_slots; i++) {
        const srv_slot *sl = &s->slots[i];
        const srv_task *t = sl->task;
        json_t *j = json_pack("{s:i, s:i, s:i, s:b, s:I, s:i, s:i, s:i}", "id", i, "n_ctx", (int)s->n_ctx, "state",
                              t ? 1 : 0, "is_processing", (int)(t != NULL), "id_task",
                              t ? (json_int_t)t->seq : (json_int_t)-1, "n_prompt_tokens", t ? (int)t->n_prompt : 0,
                              "n_decoded", t ? (int)t->n_gen : 0, "n_cached", (int)sl->n_cache);
        if (j && sl->spec) { /* the current (or last) task's speculation */
            hm_spec_opts so;
            hm_spec_get_opts(sl->spec, &so);
            const hm_spec_stats *st = &sl->spec_st;
            json_object_set_new(
                j, "speculative",
                json_pack("{s:s, s:i, s:i, s:f, s:I, s:I, s:I, s:f}", "type", hm_spec_type_name(so.type), "n_max",
                          (int)so.n_max, "n_min", (int)so.n_min, "p_min", (double)so.p_min, "n_drafted",
                          (json_int_t)st->drafted, "n_accepted", (json_int_t)st->accepted, "n_steps",
                          (json_int_t)st->steps_drafted,
                          "acceptance_rate", st->drafted ? (double)st->accepted / (double)st->drafted : 0.0));
        }
        json_array_append_new(a, j);
    }
    pthread_mutex_unlock(&s->mu);
    return a;
}

void srv_sched_counts(srv_sched *s, int *n_busy, int *n_queued) {
    pthread_mutex_lock(&s->mu);
    int b = 0;
    for (int i = 0; i < s->n_slots; i++) b += s->slots[i].task != NULL;
    *n_busy = b;
    *n_queued = s->n_queued;
    pthread_mutex_unlock(&s->mu);
}

static void metric(srv_buf *o, const char *name, const char *type, const char *help, double v) {
    srv_buf_printf(o, "# HELP hotmoe_%s %s\n# TYPE hotmoe_%s %s\nhotmoe_%s %.17g\n", name, help, name, type, name, v);
}

void srv_sched_metrics(srv_sched *s, srv_buf *o) {
    pthread_mutex_lock(&s->mu);
    srv_stats st = s->stats;
    int busy = 0;
    for (int i = 0; i < s->n_slots; i++) busy += s->slots[i].task != NULL;
    int queued = s->n_queued;
    pthread_mutex_unlock(&s->mu);
    double now = srv_now();
    metric(o, "prompt_tokens_total", "counter", "Prompt tokens evaluated (cached prefixes not counted).",
           (double)st.n_prompt_tokens);
    metric(o, "prompt_seconds_total", "counter", "Seconds spent evaluating prompts.", st.t_prompt_s);
    metric(o, "prompt_tokens_pp_total", "counter", "Of the prompt tokens: evaluated by the prompt-processing model.",
           (double)st.n_prompt_tokens_pp);
    metric(o, "requests_pp_total", "counter", "Requests whose prompt the prompt-processing model prefilled.",
           (double)st.n_requests_pp);
    metric(o, "tokens_predicted_total", "counter", "Tokens generated.", (double)st.n_predicted);
    metric(o, "tokens_predicted_seconds_total", "counter", "Seconds spent in decode steps.", st.t_predicted_s);
    metric(o, "prompt_tokens_per_second", "gauge", "Average prompt throughput.",
           st.t_prompt_s > 0 ? (double)st.n_prompt_tokens / st.t_prompt_s : 0);
    metric(o, "predicted_tokens_per_second", "gauge", "Generated tokens per second over the last 10 s, all slots.",
           stats_rate(&st, now));
    metric(o, "requests_processing", "gauge", "Slots busy with a request.", busy);
    metric(o, "requests_deferred", "gauge", "Requests waiting for a free slot.", queued);
    metric(o, "slots_total", "gauge", "Parallel slots (--parallel).", s->n_slots);
    metric(o, "decode_rounds_total", "counter", "Scheduler rounds (one step of every active slot).",
           (double)st.n_rounds);
    metric(o, "batched_rounds_total", "counter",
           "Rounds whose slots were evaluated together in one forward pass (hm_batch_eval).", (double)st.n_batched);
    /* llama-server's speculative counters (its names after our prefix) and the rate */
    metric(o, "spec_decode_num_draft_tokens_total", "counter", "Draft tokens generated.", (double)st.spec_drafted);
    metric(o, "spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted by the target model.",
           (double)st.spec_accepted);
    metric(o, "spec_decode_num_drafts_total", "counter", "Verify steps with a draft.", (double)st.spec_steps);
    metric(o, "spec_decode_acceptance_rate", "gauge", "Accepted / drafted tokens since start (0 without drafts).",
           st.spec_drafted ? (double)st.spec_accepted / (double)st.spec_drafted : 0.0);
    srv_buf_str(o, "# HELP hotmoe_requests_total Finished completion requests by outcome.\n"
                   "# TYPE hotmoe_requests_total counter\n");
    srv_buf_printf(o, "hotmoe_requests_total{outcome=\"ok\"} %llu\n", (unsigned long long)st.n_requests_ok);
    srv_buf_printf(o, "hotmoe_requests_total{outcome=\"cancelled\"} %llu\n", (unsigned long long)st.n_requests_cancelled);
    srv_buf_printf(o, "hotmoe_requests_total{outcome=\"failed\"} %llu\n", (unsigned long long)st.n_requests_failed);
}
