/* profile_sglang.c - SGLang's expert usage counts as a profile, both ways (docs/CLUSTER.md).
 *
 * SGLang's --init-expert-location takes a JSON (or torch.save) object whose "logical_count" is a
 * [num_layers][num_logical_experts] array of routed-token counts, or [steps][num_layers][experts]
 * as its expert-distribution recorder dumps it (stat mode), which its EPLB sums over the first
 * dimension. num_layers is the model's num_hidden_layers: row i is decoder layer i, the dense
 * layers (DeepSeek's first_k_dense_replace) are rows of zeros. hotmoe's profile rows are GGUF
 * blocks, which are the same decoder layers, so rows map one to one and a dense layer stays a
 * zero row both ways. Only "logical_count" matters to SGLang; hotmoe also writes its own metadata
 * under "hotmoe" (model, arch, k, tokens) and reads it back, so a round trip loses nothing.
 * torch.save files (.pt: a zip of a pickle) are refused with the command that converts them. */
#include "profile_impl.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define SGLANG_NAME "sglang.logical_count"

bool hm_profile_sglang_is(const json_t *root) {
    return json_is_object(root) && json_object_get(root, "logical_count") && !json_object_get(root, "schema");
}

/* One count: a non-negative integer, or a whole non-negative real (a float tensor's tolist()). */
static bool count_value(const json_t *v, uint64_t *out) {
    if (json_is_integer(v) && json_integer_value(v) >= 0) {
        *out = (uint64_t)json_integer_value(v);
        return true;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d >= 0 && d < 9.2e18 && d == (double)(uint64_t)d) {
            *out = (uint64_t)d;
            return true;
        }
    }
    return false;
}

static void meta_u64(const json_t *m, const char *key, uint64_t *dst) {
    json_t *v = json_object_get(m, key);
    if (json_is_integer(v) && json_integer_value(v) >= 0) *dst = (uint64_t)json_integer_value(v);
}

static void meta_str(const json_t *m, const char *key, char *dst, size_t cap) {
    const char *s = json_string_value(json_object_get(m, key));
    if (s) snprintf(dst, cap, "%s", s);
}

hm_status hm_profile_sglang_parse(hm_profile *p, const json_t *root, const char *name, const hm_profile_expect *x,
                                  hm_err *err) {
    memset(p, 0, sizeof *p);
    const json_t *lc = json_object_get(root, "logical_count");
    const json_t *first = json_array_get(lc, 0);
    const bool batched = json_is_array(json_array_get(first, 0)); /* [steps][layers][experts] */
    const json_t *layers0 = batched ? first : lc;
    const json_t *row0 = json_array_get(layers0, 0);
    if (!json_is_array(lc) || !json_is_array(row0) || json_array_size(row0) == 0)
        return hm_errf(err, HM_ERR_FORMAT, "%s: 'logical_count' must be a non-empty array [layers][experts] or "
                       "[steps][layers][experts] of counts", name);
    const size_t n_steps = batched ? json_array_size(lc) : 1;
    const int64_t n_layer = (int64_t)json_array_size(layers0), n_expert = (int64_t)json_array_size(row0);
    if (n_layer > HM_PROFILE_MAX_LAYER || n_expert > HM_PROFILE_MAX_EXPERT)
        return hm_errf(err, HM_ERR_FORMAT, "%s: logical_count is %" PRId64 " layers x %" PRId64 " experts (at most "
                       "%d x %d)", name, n_layer, n_expert, HM_PROFILE_MAX_LAYER, HM_PROFILE_MAX_EXPERT);
    if (x->n_layer && n_layer != x->n_layer)
        return hm_errf(err, HM_ERR_ARG, "%s: logical_count has %" PRId64 " rows but the model has %" PRId64 " layers "
                       "(SGLang keeps one row per decoder layer, num_hidden_layers, dense layers as zero rows)",
                       name, n_layer, x->n_layer);
    hm_status st = hm_profile_check_dims(x, n_layer, n_expert, name, err);
    if (st) return st;
    if ((st = hm_profile_init(p, (int32_t)n_layer, (int32_t)n_expert, err))) return st;
    for (size_t s = 0; s < n_steps; s++) {
        const json_t *ls = batched ? json_array_get(lc, s) : lc;
        if (!json_is_array(ls) || (int64_t)json_array_size(ls) != n_layer) {
            st = hm_errf(err, HM_ERR_FORMAT, "%s: logical_count[%zu] must be %" PRId64 " rows like logical_count[0]",
                         name, s, n_layer);
            goto fail;
        }
        for (int64_t l = 0; l < n_layer; l++) {
            const json_t *row = json_array_get(ls, (size_t)l);
            if (!json_is_array(row) || (int64_t)json_array_size(row) != n_expert) {
                st = batched ? hm_errf(err, HM_ERR_FORMAT, "%s: logical_count[%zu][%" PRId64 "] must be %" PRId64
                                       " counts", name, s, l, n_expert)
                             : hm_errf(err, HM_ERR_FORMAT, "%s: logical_count[%" PRId64 "] must be %" PRId64 " counts",
                                       name, l, n_expert);
                goto fail;
            }
            uint64_t *dst = p->counts + (size_t)l * (size_t)n_expert;
            for (int64_t e = 0; e < n_expert; e++) {
                uint64_t c = 0;
                if (!count_value(json_array_get(row, (size_t)e), &c)) {
                    st = hm_errf(err, HM_ERR_FORMAT, "%s: logical_count: layer %" PRId64 ", expert %" PRId64
                                 " is not a non-negative integer", name, l, e);
                    goto fail;
                }
                if (__builtin_add_overflow(dst[e], c, &dst[e])) {
                    st = hm_errf(err, HM_ERR_FORMAT, "%s: logical_count: layer %" PRId64 ", expert %" PRId64
                                 " overflows", name, l, e);
                    goto fail;
                }
            }
        }
    }
    snprintf(p->schema, sizeof p->schema, "%s", SGLANG_NAME);
    const json_t *m = json_object_get(root, "hotmoe");
    if (json_is_object(m)) {
        uint64_t k = 0;
        meta_u64(m, "k", &k);
        p->k = k <= (uint64_t)n_expert ? (int32_t)k : 0;
        meta_str(m, "model", p->model, sizeof p->model);
        meta_str(m, "arch", p->arch, sizeof p->arch);
        meta_u64(m, "tokens", &p->tokens);
        meta_u64(m, "prompt_tokens", &p->prompt_tokens);
        meta_u64(m, "decode_tokens", &p->decode_tokens);
        meta_u64(m, "steps", &p->steps);
        meta_u64(m, "unit_bytes", &p->unit_bytes);
    }
    return HM_OK;
fail:
    hm_profile_free(p);
    return st;
}

json_t *hm_profile_sglang_build(const hm_profile *p) {
    json_t *root = json_object(), *lc = json_array(), *m = NULL;
    if (!root || !lc) goto oom;
    for (int32_t l = 0; l < p->n_layer; l++) {
        json_t *row = json_array();
        if (!row || json_array_append_new(lc, row)) goto oom;
        for (int32_t e = 0; e < p->n_expert; e++)
            if (json_array_append_new(row, json_integer((json_int_t)hm_profile_count(p, l, e)))) goto oom;
    }
    if (json_object_set_new(root, "logical_count", lc)) {
        lc = NULL;
        goto oom;
    }
    lc = NULL;
    m = json_pack("{s:s, s:s, s:s, s:i, s:i, s:i, s:I, s:I, s:I, s:I, s:I}", "producer", "hotmoe " HOTMOE_VERSION,
                  "model", p->model, "arch", p->arch, "n_layer", p->n_layer, "n_expert", p->n_expert, "k", p->k,
                  "tokens", (json_int_t)p->tokens, "prompt_tokens", (json_int_t)p->prompt_tokens, "decode_tokens",
                  (json_int_t)p->decode_tokens, "steps", (json_int_t)p->steps, "unit_bytes", (json_int_t)p->unit_bytes);
    if (!m || json_object_set_new(root, "hotmoe", m)) goto oom;
    return root;
oom:
    json_decref(lc);
    json_decref(root);
    return NULL;
}

hm_status hm_profile_refuse_torch(const char *buf, size_t len, const char *name, hm_err *err) {
    const char *what = NULL;
    if (len >= 4 && memcmp(buf, "PK\x03\x04", 4) == 0) what = "a zip archive of a pickle";
    else if (len >= 2 && (unsigned char)buf[0] == 0x80 && buf[1] >= 2 && buf[1] <= 5) what = "a bare pickle";
    if (!what) return HM_OK;
    return hm_errf(err, HM_ERR_UNSUPPORTED, "%s is a PyTorch torch.save file (%s), such as SGLang's "
                   "expert_distribution_recorder_*.pt; hotmoe reads no pickles: convert it to JSON with "
                   "`python3 tools/sglang_pt_to_json.py %s OUT.json` (needs torch) and pass OUT.json", name, what, name);
}
