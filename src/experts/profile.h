/* profile.h - usage profiles: how often each expert unit was routed, per layer, on a workload.
 *
 * A profile is the input of the static policy and of `hotmoe plan`, and the output of
 * `--profile-out`. On disk it is JSON (docs/PROFILE.md):
 *   - ours, schema "hotmoe.profile.v1": metadata + one dense counts array per layer;
 *   - the seed-1 llama.cpp fork's "llama.cpp.moe_layer_perf.v1" / "llama.cpp.moe_layer_opt_perf.v1":
 *     layers[].hot_experts + cold_experts as [id, count] pairs (or layers[].experts when neither is
 *     present, as that fork's own parser does). Read both; write either (HM_PROFILE_SEED1);
 *   - SGLang's "logical_count" ([layers][experts], or [steps][layers][experts] summed), the form its
 *     --init-expert-location reads and its expert-distribution recorder dumps (profile_sglang.c,
 *     docs/CLUSTER.md): a row per decoder layer, dense layers as zero rows (HM_PROFILE_SGLANG).
 *     PyTorch .pt files are refused with the command that converts them to JSON.
 * Files are written atomically: PATH.tmp.<pid>, fsync, rename (core/file.h: only a regular file,
 * or a symlink to one, is replaced; a FIFO or device is refused; stale temporaries of dead
 * writers are removed).
 *
 * Invariants: counts and hot are [n_layer * n_expert] (row = layer), hot[i] <= counts[i];
 * n_layer, n_expert >= 1. A profile read from a file also has n_layer * n_expert <=
 * HM_PROFILE_MAX_CELLS and counts summing to at most INT64_MAX. Every layer of a profile recorded
 * by the engine has the same total (tokens * k) unless layers are dense. */
#ifndef HM_EXPERTS_PROFILE_H
#define HM_EXPERTS_PROFILE_H

#include <stdint.h>

#include "core/status.h"

#define HM_PROFILE_SCHEMA "hotmoe.profile.v1"
#define HM_PROFILE_MAX_BYTES (256u << 20) /* larger files are refused unread */
#define HM_PROFILE_MAX_CELLS (1 << 22)    /* n_layer * n_expert of a profile (32 MiB of counts) */

typedef enum hm_profile_format {
    HM_PROFILE_HOTMOE = 0, /* hotmoe.profile.v1 */
    HM_PROFILE_SEED1 = 1,  /* llama.cpp.moe_layer_perf.v1 (the seed-1 fork's --moe-hot-cache input) */
    HM_PROFILE_SGLANG = 2, /* {"logical_count": [[...]]}: SGLang's --init-expert-location input */
} hm_profile_format;

typedef struct hm_profile {
    char schema[64]; /* the schema the file was read from ("" when built in memory) */
    char model[256]; /* general.name or file name; "" unknown */
    char arch[64];   /* "qwen3moe"; "" unknown */
    int32_t n_layer, n_expert;
    int32_t k;                 /* experts per token (n_expert_used); 0 unknown */
    uint64_t tokens;           /* tokens routed (prompt + decode) */
    uint64_t prompt_tokens, decode_tokens;
    uint64_t steps;            /* forward passes (ubatches + decode steps) */
    uint64_t unit_bytes;       /* bytes of the largest unit of the model; 0 unknown */
    uint64_t *counts;          /* [n_layer * n_expert] routed (token, unit) selections, owned */
    uint64_t *hot;             /* [n_layer * n_expert] of those, computed from the fast tier; owned */
} hm_profile;

/* Zeroed counts for n_layer x n_expert. p is owned by the caller (hm_profile_free). */
hm_status hm_profile_init(hm_profile *p, int32_t n_layer, int32_t n_expert, hm_err *err);
void hm_profile_free(hm_profile *p); /* NULL-safe, idempotent */

static inline uint64_t hm_profile_count(const hm_profile *p, int32_t layer, int32_t expert) {
    return p->counts[(size_t)layer * (size_t)p->n_expert + (size_t)expert];
}
/* Sum of a layer's counts (its routed slots). */
uint64_t hm_profile_layer_total(const hm_profile *p, int32_t layer);

/* Read a profile in any supported schema from a regular file of at most HM_PROFILE_MAX_BYTES (a
 * FIFO, device or endless stream is refused before it is read: core/file.h). Every number is
 * checked (ids < n_expert, layer ids >= 0 and < 65536, n_layer * n_expert <= HM_PROFILE_MAX_CELLS,
 * the sum of all counts <= INT64_MAX); an error names the file and the field. For seed-1 files
 * n_layer = 1 + the highest layer id, tokens = decode_tokens = the largest layer "calls"; for
 * SGLang's, n_layer = the rows of logical_count (k and tokens 0 unless hotmoe wrote the file). */
hm_status hm_profile_read(hm_profile *p, const char *path, hm_err *err);
/* The same for a model of n_layer x n_expert (0 = unknown): a profile of other dimensions (ours:
 * n_layer and n_expert must equal; seed-1: n_expert equal, every layer id < n_layer; SGLang: both
 * equal) is refused
 * with HM_ERR_ARG before anything is allocated from the file's numbers. */
hm_status hm_profile_read_for(hm_profile *p, const char *path, int32_t n_layer, int32_t n_expert, hm_err *err);
/* Same from a NUL-terminated JSON text; name is used in messages. */
hm_status hm_profile_parse(hm_profile *p, const char *json_text, const char *name, hm_err *err);

/* Write p atomically to path in format fmt (see the top comment for what path may be). */
hm_status hm_profile_write(const hm_profile *p, const char *path, hm_profile_format fmt, hm_err *err);

/* Fraction of routed slots that land on the units for which chosen[layer * n_expert + e] != 0. */
double hm_profile_hit_rate(const hm_profile *p, const uint8_t *chosen);

#endif
