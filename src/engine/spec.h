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

#endif
