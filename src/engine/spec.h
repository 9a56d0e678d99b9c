/* spec.h - the engine's speculative decoding internals: the drafters behind hm_spec (hotmoe.h).
 * speculative.c runs the step (draft, verify as one micro-batch, accept, roll back); each drafter
 * is a file of its own: spec_ngram.c (self-speculation from the history), spec_draft.c (a second
 * model). A drafter only proposes tokens; it never touches the target session. */
#ifndef HM_ENGINE_SPEC_H
#define HM_ENGINE_SPEC_H

#include "hotmoe.h"

/* The model a session belongs to (borrowed). */
hm_model *hm_session_model(const hm_session *s);
/* Run s's evals on other's thread pool (same thread count; other must outlive s and their evals
 * must not overlap): a draft session beside its target, so no second pool's workers spin on the
 * cores the first one computes on. A no-op for another thread count. */
void hm_session_borrow_pool(hm_session *s, const hm_session *other);

/* Called by hm_session_eval after each micro-batch of n tokens at positions pos0.. with every row's
 * final hidden state after the output norm (hidden [n, n_embd], valid during the call); an error
 * fails the eval. While a hook is set the last layer runs every row (hm_fwd_batch.hidden). */
typedef hm_status (*hm_session_rows_fn)(void *ctx, const int32_t *tokens, int32_t pos0, int32_t n,
                                        const float *hidden, hm_err *err);
hm_status hm_session_set_rows_hook(hm_session *s, hm_session_rows_fn fn, void *ctx, hm_err *err); /* fn NULL: off */
/* One micro-batch (n <= n_ubatch) with the arch's inject rows (NULL: none) and every row's hidden
 * state out (NULL: not wanted); the last row's logits into *logits when logits is not NULL.
 * Neither counted in an expert store nor hooked: for a drafter's own session. */
hm_status hm_session_eval_rows(hm_session *s, const int32_t *tokens, int32_t n, const float *inject, float *hidden,
                               const float **logits, hm_err *err);
/* Save the session's state (its recurrent state: the KV rows need nothing), and go back to it with
 * n_past positions (the n_past at the save). HM_ERR_UNSUPPORTED for an arch that cannot. */
hm_status hm_session_save(hm_session *s, hm_err *err);
hm_status hm_session_restore(hm_session *s, int32_t n_past, hm_err *err);

/* ngram-simple (llama.cpp's rule): the pattern is hist[n-size_n+1 .. n) followed by tok; its latest
 * earlier occurrence starting at j (1 <= j <= n - size_n - 1; position 0 is never a match) gives
 * the draft hist[j + size_n ..], at most min(size_m, n - j - size_n) tokens, none when that is below
 * size_n or when n <= size_n + size_m + 1. Writes at most cap tokens to draft; returns the count. */
int32_t hm_spec_ngram_simple(const int32_t *hist, int32_t n, int32_t tok, int32_t size_n, int32_t size_m,
                             int32_t *draft, int32_t cap);

/* ngram-cache: n-gram statistics of the history (spec_ngram_cache.c). */
typedef struct hm_spec_ngcache hm_spec_ngcache;
hm_status hm_spec_ngcache_open(hm_spec_ngcache **out, int32_t n_ctx, hm_err *err);
void hm_spec_ngcache_close(hm_spec_ngcache *c);
void hm_spec_ngcache_reset(hm_spec_ngcache *c);
int32_t hm_spec_ngcache_len(const hm_spec_ngcache *c); /* tokens counted */
/* Counts the tokens of hist[0..n) + tok it has not seen (from empty when they are not an extension
 * of what it saw), then drafts up to min(8, cap) tokens into draft; returns the count. */
int32_t hm_spec_ngcache_draft(hm_spec_ngcache *c, const int32_t *hist, int32_t n, int32_t tok, int32_t *draft,
                              int32_t cap);

/* draft-simple: a session of the draft model and the tokens it holds. */
typedef struct hm_spec_drafter hm_spec_drafter;

/* Checks the vocabularies as llama.cpp's common_speculative_are_compatible does (HM_ERR_ARG naming
 * the difference) and opens a session of draft with the target's context, threads and KV type. */
hm_status hm_spec_drafter_open(hm_spec_drafter **out, hm_model *draft, const hm_session *target, hm_err *err);
void hm_spec_drafter_close(hm_spec_drafter *d);
/* Draft greedily after hist[0..n) + tok: the draft session is trimmed to its common prefix with
 * that sequence and evaluates the rest, then one token per draft step; stops at n_max tokens (or
 * cap), or before a token whose probability (softmax over the 10 best logits) is below p_min; a
 * draft shorter than n_min is dropped (0 returned). Returns the count in *n_draft. */
hm_status hm_spec_drafter_draft(hm_spec_drafter *d, const int32_t *hist, int32_t n, int32_t tok, int32_t n_max,
                                int32_t n_min, float p_min, int32_t *draft, int32_t cap, int32_t *n_draft,
                                hm_err *err);

/* The argmax of lg[0..n) and its probability under a softmax over the 10 largest (llama.cpp's draft
 * sampler: top-k 10): what p_min is compared with. */
int32_t hm_spec_top_token(const float *lg, int32_t n, float *p);

/* draft-mtp (spec_mtp.c): the target model's own multi-token-prediction head (hm_model.mtp) in a
 * session of its own (its KV cache), fed the target's hidden rows through the target session's
 * rows hook (installed at open, removed at close). */
typedef struct hm_spec_mtp hm_spec_mtp;
/* HM_ERR_UNSUPPORTED naming the arch when the target's model has no MTP head; HM_ERR_ARG when the
 * target has evaluated positions already (the head must see every row: open before the prompt). */
hm_status hm_spec_mtp_open(hm_spec_mtp **out, hm_session *target, hm_err *err);
void hm_spec_mtp_close(hm_spec_mtp *d);
/* The target kept the first n_keep rows of its last micro-batch: the head's next input is the
 * hidden row n_keep - 1 (the one that gave the pending token). */
void hm_spec_mtp_accept(hm_spec_mtp *d, int32_t n_keep);
/* The target was reset: the next row pairs with zeros again (as at open). */
void hm_spec_mtp_reset(hm_spec_mtp *d);
/* While muted the hook ignores the target's evals (a recurrent target's replay of kept rows). */
void hm_spec_mtp_mute(hm_spec_mtp *d, bool mute);
/* Draft greedily after the pending token tok at position n_past: up to n_max tokens (or cap),
 * stopping before one whose probability (hm_spec_top_token) is below p_min; a draft shorter than
 * n_min is dropped. lg_out (NULL: not wanted; else [n_max, n_vocab]): each draft step's logits (the
 * tests compare them with llama.cpp's). */
hm_status hm_spec_mtp_draft(hm_spec_mtp *d, int32_t tok, int32_t n_past, int32_t n_max, int32_t n_min, float p_min,
                            int32_t *draft, int32_t cap, int32_t *n_draft, float *lg_out, hm_err *err);

#endif
