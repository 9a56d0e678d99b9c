/* profile.c - read and write usage profiles (see profile.h and docs/PROFILE.md): ours and the
 * seed-1 fork's here, SGLang's logical_count in profile_sglang.c (dispatched from here).
 *
 * Reading takes a regular file of at most HM_PROFILE_MAX_BYTES (core/file.h: a FIFO or device is
 * refused before it is read) through jansson's tree; every integer is checked for range before it
 * becomes an index, the dimensions against the model's (when given) before anything is sized from
 * them, and the sum of all counts must fit in int64, so no total or hit rate computed from them
 * overflows. Writing builds the tree and replaces PATH through core/file.h (PATH.tmp.<pid>, fsync,
 * rename; regular files only), so a reader (or a crash) never sees half a file. */
#include "profile_impl.h"

#include "core/file.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SEED1_V1 "llama.cpp.moe_layer_perf.v1"
#define SEED1_OPT_V1 "llama.cpp.moe_layer_opt_perf.v1"
#define MAX_LAYER HM_PROFILE_MAX_LAYER
#define MAX_EXPERT HM_PROFILE_MAX_EXPERT

typedef hm_profile_expect expect;

/* Dimensions from a file, before hm_profile_init allocates 2 x 8 bytes per cell from them. */
hm_status hm_profile_check_dims(const expect *x, int64_t n_layer, int64_t n_expert, const char *name, hm_err *err) {
    if (x->n_expert && n_expert != x->n_expert)
        return hm_errf(err, HM_ERR_ARG, "%s has %lld experts per layer but the model has %lld", name,
                       (long long)n_expert, (long long)x->n_expert);
    if (x->n_layer && n_layer > x->n_layer)
        return hm_errf(err, HM_ERR_ARG, "%s has %lld layers but the model has %lld", name, (long long)n_layer,
                       (long long)x->n_layer);
    if (n_layer * n_expert > HM_PROFILE_MAX_CELLS)
        return hm_errf(err, HM_ERR_FORMAT, "%s: %lld layers x %lld experts is more than the %d units a profile may "
                       "count", name, (long long)n_layer, (long long)n_expert, HM_PROFILE_MAX_CELLS);
    return HM_OK;
}

/* The sum of all counts must fit in int64: every total, hit count and share computed from them
 * (layer totals, hit rates, plan's sums) is then exact in uint64. */
static hm_status check_total(const hm_profile *p, const char *name, hm_err *err) {
    uint64_t total = 0;
    size_t n = (size_t)p->n_layer * (size_t)p->n_expert;
    for (size_t i = 0; i < n; i++)
        if (__builtin_add_overflow(total, p->counts[i], &total) || total > (uint64_t)INT64_MAX)
            return hm_errf(err, HM_ERR_FORMAT, "%s: the counts add up to more than 2^63 (at layer %zu, expert %zu)",
                           name, i / (size_t)p->n_expert, i % (size_t)p->n_expert);
    return HM_OK;
}

hm_status hm_profile_init(hm_profile *p, int32_t n_layer, int32_t n_expert, hm_err *err) {
    memset(p, 0, sizeof *p);
    if (n_layer <= 0 || n_layer > MAX_LAYER || n_expert <= 0 || n_expert > MAX_EXPERT)
        return hm_errf(err, HM_ERR_ARG, "profile: %d layers x %d experts is out of range", n_layer, n_expert);
    size_t n = (size_t)n_layer * (size_t)n_expert;
    p->counts = calloc(n, sizeof *p->counts);
    p->hot = calloc(n, sizeof *p->hot);
    if (!p->counts || !p->hot) {
        hm_profile_free(p);
        return hm_errf(err, HM_ERR_NOMEM, "profile: out of memory for %d x %d counts", n_layer, n_expert);
    }
    p->n_layer = n_layer;
    p->n_expert = n_expert;
    return HM_OK;
}

void hm_profile_free(hm_profile *p) {
    if (!p) return;
    free(p->counts);
    free(p->hot);
    memset(p, 0, sizeof *p);
}

uint64_t hm_profile_layer_total(const hm_profile *p, int32_t layer) {
    uint64_t s = 0;
    const uint64_t *c = p->counts + (size_t)layer * (size_t)p->n_expert;
    for (int32_t e = 0; e < p->n_expert; e++) s += c[e];
    return s;
}

double hm_profile_hit_rate(const hm_profile *p, const uint8_t *chosen) {
    uint64_t hit = 0, all = 0;
    size_t n = (size_t)p->n_layer * (size_t)p->n_expert;
    for (size_t i = 0; i < n; i++) {
        all += p->counts[i];
        if (chosen[i]) hit += p->counts[i];
    }
    return all ? (double)hit / (double)all : 0.0;
}

/* ---- reading ---- */

/* A non-negative JSON integer into *out; false when absent. Negative or non-integer: error. */
static hm_status get_u64(const json_t *obj, const char *key, uint64_t *out, bool *present, const char *name,
                         const char *where, hm_err *err) {
    json_t *v = json_object_get(obj, key);
    *present = v != NULL;
    if (!v) return HM_OK;
    if (json_is_integer(v) && json_integer_value(v) >= 0) {
        *out = (uint64_t)json_integer_value(v);
        return HM_OK;
    }
    if (json_is_real(v) && json_real_value(v) >= 0 && json_real_value(v) < 1.8e19) {
        *out = (uint64_t)json_real_value(v); /* a writer that printed a big count as a double */
        return HM_OK;
    }
    return hm_errf(err, HM_ERR_FORMAT, "%s: %s'%s' must be a non-negative integer", name, where, key);
}

static void get_str(const json_t *obj, const char *key, char *dst, size_t cap) {
    const char *s = json_string_value(json_object_get(obj, key));
    if (s) snprintf(dst, cap, "%s", s);
}

/* [[id, count], ...] pairs of one seed-1 layer into row (n_expert wide); *added when any pair. */
static hm_status add_pairs(const json_t *arr, uint64_t *row, int32_t n_expert, const char *name, int64_t layer,
                           const char *field, bool *added, hm_err *err) {
    if (!json_is_array(arr))
        return hm_errf(err, HM_ERR_FORMAT, "%s: layer %" PRId64 ": '%s' must be an array of [expert_id, count]",
                       name, layer, field);
    size_t i;
    json_t *pair;
    json_array_foreach(arr, i, pair) {
        json_t *id = json_array_get(pair, 0), *cnt = json_array_get(pair, 1);
        if (!json_is_array(pair) || json_array_size(pair) != 2 || !json_is_integer(id) || !json_is_integer(cnt) ||
            json_integer_value(cnt) < 0)
            return hm_errf(err, HM_ERR_FORMAT, "%s: layer %" PRId64 ": %s[%zu] must be [expert_id, count] with "
                           "non-negative integers", name, layer, field, i);
        json_int_t e = json_integer_value(id);
        if (e < 0 || e >= n_expert)
            return hm_errf(err, HM_ERR_FORMAT, "%s: layer %" PRId64 ": %s[%zu]: expert id %" JSON_INTEGER_FORMAT
                           " is out of range [0, %d)", name, layer, field, i, e, n_expert);
        uint64_t c = (uint64_t)json_integer_value(cnt);
        if (__builtin_add_overflow(row[e], c, &row[e]))
            return hm_errf(err, HM_ERR_FORMAT, "%s: layer %" PRId64 ": count of expert %" JSON_INTEGER_FORMAT
                           " overflows", name, layer, e);
        if (c) *added = true;
    }
    return HM_OK;
}

static hm_status layer_index(const json_t *l, size_t i, const char *name, int64_t *out, hm_err *err) {
    json_t *v = json_object_get(l, "layer");
    if (!json_is_object(l) || !json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) >= MAX_LAYER)
        return hm_errf(err, HM_ERR_FORMAT, "%s: layers[%zu] needs an integer 'layer' in [0, %d)", name, i, MAX_LAYER);
    *out = (int64_t)json_integer_value(v);
    return HM_OK;
}

static hm_status parse_seed1(hm_profile *p, const json_t *root, const char *name, const expect *want, hm_err *err) {
    hm_status st;
    bool have;
    uint64_t n_expert = 0, k = 0, updates = 0;
    if ((st = get_u64(root, "n_expert", &n_expert, &have, name, "", err))) return st;
    if (!have || n_expert == 0 || n_expert > MAX_EXPERT)
        return hm_errf(err, HM_ERR_FORMAT, "%s: 'n_expert' must be an integer in [1, %d]", name, MAX_EXPERT);
    if ((st = get_u64(root, "n_expert_used", &k, &have, name, "", err))) return st;
    if (k > n_expert) return hm_errf(err, HM_ERR_FORMAT, "%s: n_expert_used %" PRIu64 " > n_expert", name, k);
    if ((st = get_u64(root, "updates", &updates, &have, name, "", err))) return st;
    json_t *layers = json_object_get(root, "layers");
    if (!json_is_array(layers)) return hm_errf(err, HM_ERR_FORMAT, "%s: 'layers' must be an array", name);
    int64_t n_layer = 0;
    size_t i;
    json_t *l;
    json_array_foreach(layers, i, l) {
        int64_t li = 0;
        if ((st = layer_index(l, i, name, &li, err))) return st;
        if (want->n_layer && li >= want->n_layer)
            return hm_errf(err, HM_ERR_ARG, "%s: layers[%zu] is layer %lld but the model has %lld layers", name, i,
                           (long long)li, (long long)want->n_layer);
        if (li + 1 > n_layer) n_layer = li + 1;
    }
    if (n_layer == 0) return hm_errf(err, HM_ERR_FORMAT, "%s: 'layers' is empty", name);
    if ((st = hm_profile_check_dims(want, n_layer, (int64_t)n_expert, name, err))) return st;
    if ((st = hm_profile_init(p, (int32_t)n_layer, (int32_t)n_expert, err))) return st;
    snprintf(p->schema, sizeof p->schema, "%s", json_string_value(json_object_get(root, "schema")));
    p->k = (int32_t)k;
    p->steps = updates;
    uint64_t max_calls = 0;
    uint64_t *hot = calloc((size_t)n_expert, sizeof *hot), *cold = calloc((size_t)n_expert, sizeof *cold);
    if (!hot || !cold) {
        st = hm_errf(err, HM_ERR_NOMEM, "%s: out of memory", name);
        goto done;
    }
    json_array_foreach(layers, i, l) {
        int64_t li = 0;
        layer_index(l, i, name, &li, NULL);
        memset(hot, 0, (size_t)n_expert * sizeof *hot);
        memset(cold, 0, (size_t)n_expert * sizeof *cold);
        bool branch = false, raw = false;
        json_t *h = json_object_get(l, "hot_experts"), *c = json_object_get(l, "cold_experts");
        json_t *x = json_object_get(l, "experts");
        if (h && (st = add_pairs(h, hot, (int32_t)n_expert, name, li, "hot_experts", &branch, err))) goto done;
        if (c && (st = add_pairs(c, cold, (int32_t)n_expert, name, li, "cold_experts", &branch, err))) goto done;
        if (!branch && x && (st = add_pairs(x, cold, (int32_t)n_expert, name, li, "experts", &raw, err))) goto done;
        /* as the fork does: branch counts win; raw "experts" only when neither branch is present */
        uint64_t *row = p->counts + (size_t)li * n_expert, *hrow = p->hot + (size_t)li * n_expert;
        for (uint64_t e = 0; e < n_expert; e++) {
            if (__builtin_add_overflow(hot[e], cold[e], &row[e])) {
                st = hm_errf(err, HM_ERR_FORMAT, "%s: layer %" PRId64 ": count of expert %" PRIu64 " overflows", name, li, e);
                goto done;
            }
            hrow[e] = hot[e];
        }
        uint64_t calls = 0;
        if ((st = get_u64(l, "calls", &calls, &have, name, "layers[].", err))) goto done;
        if (calls > max_calls) max_calls = calls;
    }
    p->tokens = p->decode_tokens = max_calls;
    st = HM_OK;
done:
    free(hot);
    free(cold);
    if (st) hm_profile_free(p);
    return st;
}

static hm_status parse_ours(hm_profile *p, const json_t *root, const char *name, const expect *want, hm_err *err) {
    hm_status st;
    bool have;
    uint64_t n_layer = 0, n_expert = 0, k = 0;
    if ((st = get_u64(root, "n_layer", &n_layer, &have, name, "", err))) return st;
    if (!have || !n_layer || n_layer > MAX_LAYER)
        return hm_errf(err, HM_ERR_FORMAT, "%s: 'n_layer' must be an integer in [1, %d]", name, MAX_LAYER);
    if ((st = get_u64(root, "n_expert", &n_expert, &have, name, "", err))) return st;
    if (!have || !n_expert || n_expert > MAX_EXPERT)
        return hm_errf(err, HM_ERR_FORMAT, "%s: 'n_expert' must be an integer in [1, %d]", name, MAX_EXPERT);
    if ((st = get_u64(root, "k", &k, &have, name, "", err))) return st;
    if (k > n_expert) return hm_errf(err, HM_ERR_FORMAT, "%s: k %" PRIu64 " > n_expert %" PRIu64, name, k, n_expert);
    if ((st = hm_profile_check_dims(want, (int64_t)n_layer, (int64_t)n_expert, name, err))) return st;
    if (want->n_layer && (int64_t)n_layer != want->n_layer)
        return hm_errf(err, HM_ERR_ARG, "%s has %" PRIu64 " layers but the model has %lld", name, n_layer,
                       (long long)want->n_layer);
    if ((st = hm_profile_init(p, (int32_t)n_layer, (int32_t)n_expert, err))) return st;
    snprintf(p->schema, sizeof p->schema, "%s", HM_PROFILE_SCHEMA);
    get_str(root, "model", p->model, sizeof p->model);
    get_str(root, "arch", p->arch, sizeof p->arch);
    p->k = (int32_t)k;
    struct { const char *key; uint64_t *dst; } nums[] = {
        {"tokens", &p->tokens}, {"prompt_tokens", &p->prompt_tokens}, {"decode_tokens", &p->decode_tokens},
        {"steps", &p->steps},   {"unit_bytes", &p->unit_bytes},
    };
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
        if ((st = get_u64(root, nums[i].key, nums[i].dst, &have, name, "", err))) goto fail;
    json_t *layers = json_object_get(root, "layers");
    if (!json_is_array(layers) || json_array_size(layers) != n_layer) {
        st = hm_errf(err, HM_ERR_FORMAT, "%s: 'layers' must be an array of n_layer = %" PRIu64 " objects", name, n_layer);
        goto fail;
    }
    size_t i;
    json_t *l;
    json_array_foreach(layers, i, l) {
        int64_t li = 0;
        if ((st = layer_index(l, i, name, &li, err))) goto fail;
        if ((uint64_t)li != i) {
            st = hm_errf(err, HM_ERR_FORMAT, "%s: layers[%zu] has 'layer' %" PRId64 " (layers must be in order)", name, i, li);
            goto fail;
        }
        static const char *const keys[2] = {"counts", "hot"};
        for (int w = 0; w < 2; w++) {
            json_t *a = json_object_get(l, keys[w]);
            if (!a && w == 1) continue; /* hot is optional */
            if (!json_is_array(a) || json_array_size(a) != n_expert) {
                st = hm_errf(err, HM_ERR_FORMAT, "%s: layers[%zu].%s must be an array of n_expert = %" PRIu64 " counts",
                             name, i, keys[w], n_expert);
                goto fail;
            }
            uint64_t *row = (w ? p->hot : p->counts) + i * n_expert;
            size_t e;
            json_t *v;
            json_array_foreach(a, e, v) {
                if (!json_is_integer(v) || json_integer_value(v) < 0) {
                    st = hm_errf(err, HM_ERR_FORMAT, "%s: layers[%zu].%s[%zu] must be a non-negative integer", name, i,
                                 keys[w], e);
                    goto fail;
                }
                row[e] = (uint64_t)json_integer_value(v);
            }
        }
        for (uint64_t e = 0; e < n_expert; e++)
            if (p->hot[i * n_expert + e] > p->counts[i * n_expert + e]) {
                st = hm_errf(err, HM_ERR_FORMAT, "%s: layers[%zu]: hot[%" PRIu64 "] > counts[%" PRIu64 "]", name, i, e, e);
                goto fail;
            }
    }
    return HM_OK;
fail:
    hm_profile_free(p);
    return st;
}

static hm_status parse_for(hm_profile *p, const char *text, const char *name, const expect *x, hm_err *err) {
    memset(p, 0, sizeof *p);
    json_error_t je;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (!root) return hm_errf(err, HM_ERR_FORMAT, "%s: not JSON (line %d: %s)", name, je.line, je.text);
    hm_status st;
    const char *schema = json_string_value(json_object_get(root, "schema"));
    if (hm_profile_sglang_is(root))
        st = hm_profile_sglang_parse(p, root, name, x, err);
    else if (json_is_object(root) && !schema && json_object_get(root, "physical_to_logical_map"))
        st = hm_errf(err, HM_ERR_UNSUPPORTED, "%s: SGLang's physical_to_logical_map form is a placement, not usage "
                     "counts: give hotmoe the logical_count form (its expert-distribution recorder's)", name);
    else if (!json_is_object(root) || !schema)
        st = hm_errf(err, HM_ERR_FORMAT, "%s: not a profile (no 'schema'; expected %s, %s or %s, or SGLang's "
                     "'logical_count')", name, HM_PROFILE_SCHEMA, SEED1_V1, SEED1_OPT_V1);
    else if (strcmp(schema, HM_PROFILE_SCHEMA) == 0)
        st = parse_ours(p, root, name, x, err);
    else if (strcmp(schema, SEED1_V1) == 0 || strcmp(schema, SEED1_OPT_V1) == 0)
        st = parse_seed1(p, root, name, x, err);
    else
        st = hm_errf(err, HM_ERR_UNSUPPORTED, "%s: unknown profile schema '%s' (expected %s, %s or %s)", name, schema,
                     HM_PROFILE_SCHEMA, SEED1_V1, SEED1_OPT_V1);
    json_decref(root);
    if (!st && (st = check_total(p, name, err))) hm_profile_free(p);
    return st;
}

hm_status hm_profile_parse(hm_profile *p, const char *text, const char *name, hm_err *err) {
    const expect x = {0, 0};
    return parse_for(p, text, name, &x, err);
}

hm_status hm_profile_read_for(hm_profile *p, const char *path, int32_t n_layer, int32_t n_expert, hm_err *err) {
    memset(p, 0, sizeof *p);
    char *buf = NULL;
    size_t len = 0;
    hm_status st = hm_file_read_all(path, HM_PROFILE_MAX_BYTES, &buf, &len, err);
    if (st) return st;
    st = hm_profile_refuse_torch(buf, len, path, err); /* a .pt says how to convert it */
    if (st == HM_OK && strlen(buf) != len) {
        st = hm_errf(err, HM_ERR_FORMAT, "%s: not a JSON text (NUL byte)", path);
    } else if (st == HM_OK) {
        const expect x = {n_layer > 0 ? n_layer : 0, n_expert > 0 ? n_expert : 0};
        st = parse_for(p, buf, path, &x, err);
    }
    free(buf);
    return st;
}

hm_status hm_profile_read(hm_profile *p, const char *path, hm_err *err) {
    return hm_profile_read_for(p, path, 0, 0, err);
}

/* ---- writing ---- */

#define TRY_JSON(x)            \
    do {                       \
        if ((x) != 0) goto oom; \
    } while (0)

static json_t *build_ours(const hm_profile *p) {
    json_t *root = json_object(), *layers = json_array();
    if (!root || !layers) goto oom;
    TRY_JSON(json_object_set_new(root, "schema", json_string(HM_PROFILE_SCHEMA)));
    TRY_JSON(json_object_set_new(root, "model", json_string(p->model)));
    TRY_JSON(json_object_set_new(root, "arch", json_string(p->arch)));
    TRY_JSON(json_object_set_new(root, "n_layer", json_integer(p->n_layer)));
    TRY_JSON(json_object_set_new(root, "n_expert", json_integer(p->n_expert)));
    TRY_JSON(json_object_set_new(root, "k", json_integer(p->k)));
    TRY_JSON(json_object_set_new(root, "tokens", json_integer((json_int_t)p->tokens)));
    TRY_JSON(json_object_set_new(root, "prompt_tokens", json_integer((json_int_t)p->prompt_tokens)));
    TRY_JSON(json_object_set_new(root, "decode_tokens", json_integer((json_int_t)p->decode_tokens)));
    TRY_JSON(json_object_set_new(root, "steps", json_integer((json_int_t)p->steps)));
    TRY_JSON(json_object_set_new(root, "unit_bytes", json_integer((json_int_t)p->unit_bytes)));
    for (int32_t l = 0; l < p->n_layer; l++) {
        json_t *lo = json_object(), *c = json_array(), *h = json_array();
        if (!lo || !c || !h) {
            json_decref(lo), json_decref(c), json_decref(h);
            goto oom;
        }
        bool any_hot = false;
        for (int32_t e = 0; e < p->n_expert; e++) {
            size_t i = (size_t)l * (size_t)p->n_expert + (size_t)e;
            json_array_append_new(c, json_integer((json_int_t)p->counts[i]));
            json_array_append_new(h, json_integer((json_int_t)p->hot[i]));
            any_hot |= p->hot[i] != 0;
        }
        json_object_set_new(lo, "layer", json_integer(l));
        json_object_set_new(lo, "total", json_integer((json_int_t)hm_profile_layer_total(p, l)));
        json_object_set_new(lo, "counts", c);
        if (any_hot) json_object_set_new(lo, "hot", h);
        else json_decref(h);
        TRY_JSON(json_array_append_new(layers, lo));
    }
    TRY_JSON(json_object_set_new(root, "layers", layers));
    return root;
oom:
    json_decref(root);
    return NULL;
}

/* The seed-1 fork's v1: per layer [id, count] pairs of the nonzero counts, split hot/cold by the
 * tier they were computed on, plus the raw "experts" for that fork's older parser. */
static json_t *build_seed1(const hm_profile *p) {
    json_t *root = json_object(), *layers = json_array();
    if (!root || !layers) goto oom;
    TRY_JSON(json_object_set_new(root, "enabled", json_true()));
    TRY_JSON(json_object_set_new(root, "mode", json_string("full")));
    TRY_JSON(json_object_set_new(root, "schema", json_string(SEED1_V1)));
    TRY_JSON(json_object_set_new(root, "n_expert", json_integer(p->n_expert)));
    TRY_JSON(json_object_set_new(root, "n_expert_used", json_integer(p->k)));
    TRY_JSON(json_object_set_new(root, "updates", json_integer((json_int_t)p->steps)));
    TRY_JSON(json_object_set_new(root, "producer", json_string("hotmoe " HOTMOE_VERSION)));
    for (int32_t l = 0; l < p->n_layer; l++) {
        json_t *lo = json_object(), *x = json_array(), *h = json_array(), *c = json_array();
        if (!lo || !x || !h || !c) {
            json_decref(lo), json_decref(x), json_decref(h), json_decref(c);
            goto oom;
        }
        uint64_t hot_total = 0, cold_total = 0;
        for (int32_t e = 0; e < p->n_expert; e++) {
            size_t i = (size_t)l * (size_t)p->n_expert + (size_t)e;
            uint64_t n = p->counts[i], nh = p->hot[i];
            if (n) json_array_append_new(x, json_pack("[iI]", e, (json_int_t)n));
            if (nh) json_array_append_new(h, json_pack("[iI]", e, (json_int_t)nh));
            if (n > nh) json_array_append_new(c, json_pack("[iI]", e, (json_int_t)(n - nh)));
            hot_total += nh;
            cold_total += n - nh;
        }
        json_object_set_new(lo, "layer", json_integer(l));
        json_object_set_new(lo, "calls", json_integer((json_int_t)p->tokens));
        json_object_set_new(lo, "hot_slots_total", json_integer((json_int_t)hot_total));
        json_object_set_new(lo, "cold_slots_total", json_integer((json_int_t)cold_total));
        json_object_set_new(lo, "experts", x);
        json_object_set_new(lo, "hot_experts", h);
        json_object_set_new(lo, "cold_experts", c);
        TRY_JSON(json_array_append_new(layers, lo));
    }
    TRY_JSON(json_object_set_new(root, "layers", layers));
    return root;
oom:
    json_decref(root);
    return NULL;
}

hm_status hm_profile_write(const hm_profile *p, const char *path, hm_profile_format fmt, hm_err *err) {
    json_t *root = fmt == HM_PROFILE_SEED1    ? build_seed1(p)
                   : fmt == HM_PROFILE_SGLANG ? hm_profile_sglang_build(p)
                                              : build_ours(p);
    if (!root) return hm_errf(err, HM_ERR_NOMEM, "%s: out of memory building the profile", path);
    hm_file_replace r;
    hm_status st = hm_file_replace_open(&r, path, err);
    if (st) {
        json_decref(root);
        return st;
    }
    /* compact: one layer per line is not possible with jansson's flags, so write it compact */
    int rc = json_dumpf(root, r.f, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (rc == 0) rc = fputc('\n', r.f) == EOF ? -1 : 0;
    json_decref(root);
    if (rc != 0) {
        st = hm_errf(err, HM_ERR_IO, "%s: write failed: %s", r.tmp, strerror(errno));
        hm_file_replace_abort(&r);
        return st;
    }
    return hm_file_replace_commit(&r, err);
}
