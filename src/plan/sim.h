/* sim.h - the policy simulator: drive a store (usually one with a bookkeeping-only fast tier)
 * with routing from a trace file or from a synthetic trace sampled from a profile, so policies
 * can be compared on the same routing. A replay makes exactly the calls the engine makes
 * (hm_experts_record per layer, hm_experts_step_end per step), so hits come out of the store's
 * own counters.
 *
 * The synthetic trace is stationary: each token draws, in each layer independently, k distinct
 * experts, each draw proportional to the layer's profile counts among the experts not yet drawn
 * (a layer with no counts draws uniformly). It has the profile's popularity but no temporal
 * locality, so it favours static placement; a recorded trace (--trace-out) is the fair test for
 * online and lru. */
#ifndef HM_PLAN_SIM_H
#define HM_PLAN_SIM_H

#include <stdint.h>

#include "experts/experts.h"
#include "experts/profile.h"

/* Replay the trace at path into s; its n_layer/n_expert must match the store's units. */
hm_status hm_sim_replay(hm_experts *s, const char *path, hm_err *err);

/* Counts of a trace as a profile (n_layer x n_expert from its header). p owned by the caller.
 * With a model's n_layer / n_expert (0 = unknown) a header of other dimensions is refused before
 * the counts are allocated; without, the header's product must be <= HM_PROFILE_MAX_CELLS. */
hm_status hm_sim_trace_profile(const char *path, int32_t n_layer, int32_t n_expert, hm_profile *p, hm_err *err);

/* A synthetic routing source. */
typedef struct hm_sim_gen hm_sim_gen;
hm_status hm_sim_gen_open(hm_sim_gen **out, const hm_profile *p, int32_t k, uint64_t seed, hm_err *err);
void hm_sim_gen_close(hm_sim_gen *g); /* NULL is a no-op */
/* One token's routing in layer: k distinct expert ids into ids[k]. */
void hm_sim_gen_token(hm_sim_gen *g, int32_t layer, int32_t *ids);

/* Feed n_tokens synthetic decode tokens into s (all layers, one step each). */
hm_status hm_sim_synthetic(hm_experts *s, hm_sim_gen *g, int64_t n_tokens, hm_err *err);

/* Write n_tokens synthetic decode tokens as a trace file. */
hm_status hm_sim_write_trace(hm_sim_gen *g, int64_t n_tokens, const char *path, hm_err *err);

#endif
