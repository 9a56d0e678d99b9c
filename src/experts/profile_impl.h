/* profile_impl.h - what the profile readers and writers of experts/ share (profile.c: ours and the
 * seed-1 fork's; profile_sglang.c: SGLang's logical_count). Internal to experts/.
 *
 * A reader gets the parsed jansson tree and the geometry the caller expects, checks every number
 * before it sizes or indexes anything, and on failure leaves the profile empty (hm_profile_free). */
#ifndef HM_EXPERTS_PROFILE_IMPL_H
#define HM_EXPERTS_PROFILE_IMPL_H

#include <jansson.h>

#include "profile.h"

#define HM_PROFILE_MAX_LAYER 65536
#define HM_PROFILE_MAX_EXPERT 65536

/* What a reader checks a profile against before sizing anything from it: the model's geometry
 * when known (0 = unknown), else only the caps. */
typedef struct hm_profile_expect {
    int64_t n_layer, n_expert;
} hm_profile_expect;

/* Dimensions from a file against x and HM_PROFILE_MAX_CELLS (n_layer may be below the model's). */
hm_status hm_profile_check_dims(const hm_profile_expect *x, int64_t n_layer, int64_t n_expert, const char *name,
                                hm_err *err);

/* True when root is SGLang's --init-expert-location / recorder form: an object with
 * "logical_count" and no "schema". */
bool hm_profile_sglang_is(const json_t *root);
/* SGLang's logical_count ([layers][experts], or [steps][layers][experts] summed over steps) into
 * p; with a known model the row count must equal its layer count (SGLang keeps a row per decoder
 * layer, dense ones as zeros). */
hm_status hm_profile_sglang_parse(hm_profile *p, const json_t *root, const char *name, const hm_profile_expect *x,
                                  hm_err *err);
/* The tree of p in SGLang's logical_count form (+ hotmoe's metadata under "hotmoe"); NULL when out
 * of memory. Owned by the caller (json_decref). */
json_t *hm_profile_sglang_build(const hm_profile *p);

/* When the head of a file is a PyTorch torch.save archive (a zip, or a bare pickle), an
 * HM_ERR_UNSUPPORTED message naming the format and how to convert it to JSON; else HM_OK. */
hm_status hm_profile_refuse_torch(const char *buf, size_t len, const char *name, hm_err *err);

#endif
