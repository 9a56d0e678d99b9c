/* pp.h - the engine's prompt-processing model internals (hotmoe.h's hm_pp_*): what session.c asks
 * of ppmodel.c. session.c runs the copy's forward passes on the session's own state; ppmodel.c
 * checks that the two files are one model, and turns the copy's measured routing into the main
 * model's expert store's steps (the warm hand-over). */
#ifndef HM_ENGINE_PP_H
#define HM_ENGINE_PP_H

#include "hotmoe.h"

typedef struct hm_pp hm_pp;

/* A session's attachment of o->model to main (checked: hm_model_check_same, the same hm_arch, both
 * on the CPU). *out owned by the session (hm_pp_close). n_ubatch: the session's micro-batch. */
hm_status hm_pp_open(hm_pp **out, hm_model *main, const hm_pp_opts *o, int32_t n_ubatch, hm_err *err);
void hm_pp_close(hm_pp *p); /* NULL is a no-op */
hm_model *hm_pp_model(const hm_pp *p);
/* The copy evaluates in a session of its own whose state is copied over (a GPU placement, or
 * hm_pp_opts.copy_state); false: on the main session's state itself. */
bool hm_pp_copies(const hm_pp *p);
const hm_pp_opts *hm_pp_get_opts(const hm_pp *p);
hm_pp_stats *hm_pp_stats_of(hm_pp *p);

/* Before a run of the copy's steps: remember its store's counts (deltas are taken from here). */
void hm_pp_begin(hm_pp *p);
/* After one step of the copy (its store's step already ended): the step's routing, per unit, into
 * main's store as one prompt step of n_tok tokens (the policy runs there: VRAM fills start on the
 * tier's copier while the copy goes on), and the units routed for the first time read ahead in
 * main's mapping. A tier error is a warning in main's log, as a step's is. */
void hm_pp_step(hm_pp *p, hm_model *main, int32_t n_tok);
/* Between the copy's steps, done of total tokens evaluated: with VRAM slots and an adaptive policy
 * (online, lru, elite), the residency is re-planned from the counts once half-way through a run of
 * at least 4 steps (so the prompt's hot set is copied up while the copy computes the rest): a
 * switch to static (its placement from the live counts, or from the store's profile) and back. */
void hm_pp_progress(hm_pp *p, hm_model *main, int32_t done, int32_t total, int32_t n_ubatch);
/* After a run of the copy's steps: the residency re-planned as hm_pp_progress does (again: the second
 * half's counts too); with main's SSD tier (--ram-budget), the run's most routed units of each
 * layer are read into RAM in the background (staging, spread over the layers). */
void hm_pp_end(hm_pp *p, hm_model *main);

#endif
