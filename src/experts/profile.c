/* profile.c - read and write usage profiles (see profile.h and docs/PROFILE.md).
 *
 * Reading goes through jansson's tree; every integer is checked for range before it becomes an
 * index. Writing builds the tree, dumps it to PATH.tmp.<pid>, fsyncs and renames, so a reader
 * (or a crash) never sees half a file. */
#include "profile.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SEED1_V1 "llama.cpp.moe_layer_perf.v1"
#define SEED1_OPT_V1 "llama.cpp.moe_layer_opt_perf.v1"
#define MAX_LAYER 65536
#define MAX_EXPERT 65536

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

static hm_status parse_seed1(hm_profile *p, const json_t *root, const char *name, hm_err *err) {
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
        if (li + 1 > n_layer) n_layer = li + 1;
    }
    if (n_layer == 0) return hm_errf(err, HM_ERR_FORMAT, "%s: 'layers' is empty", name);
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

static hm_status parse_ours(hm_profile *p, const json_t *root, const char *name, hm_err *err) {
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

hm_status hm_profile_parse(hm_profile *p, const char *text, const char *name, hm_err *err) {
    memset(p, 0, sizeof *p);
    json_error_t je;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (!root) return hm_errf(err, HM_ERR_FORMAT, "%s: not JSON (line %d: %s)", name, je.line, je.text);
    hm_status st;
    const char *schema = json_string_value(json_object_get(root, "schema"));
    if (!json_is_object(root) || !schema)
        st = hm_errf(err, HM_ERR_FORMAT, "%s: not a profile (no 'schema'; expected %s, %s or %s)", name,
                     HM_PROFILE_SCHEMA, SEED1_V1, SEED1_OPT_V1);
    else if (strcmp(schema, HM_PROFILE_SCHEMA) == 0)
        st = parse_ours(p, root, name, err);
    else if (strcmp(schema, SEED1_V1) == 0 || strcmp(schema, SEED1_OPT_V1) == 0)
        st = parse_seed1(p, root, name, err);
    else
        st = hm_errf(err, HM_ERR_UNSUPPORTED, "%s: unknown profile schema '%s' (expected %s, %s or %s)", name, schema,
                     HM_PROFILE_SCHEMA, SEED1_V1, SEED1_OPT_V1);
    json_decref(root);
    return st;
}

hm_status hm_profile_read(hm_profile *p, const char *path, hm_err *err) {
    memset(p, 0, sizeof *p);
    FILE *f = fopen(path, "rb");
    if (!f) return hm_errf(err, HM_ERR_IO, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    hm_status st = HM_OK;
    for (;;) {
        if (cap - len < 65536) {
            size_t ncap = cap ? cap * 2 : 1 << 20;
            char *nb = ncap > cap ? realloc(buf, ncap + 1) : NULL;
            if (!nb) {
                st = hm_errf(err, HM_ERR_NOMEM, "%s: out of memory reading the file", path);
                goto done;
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        st = hm_errf(err, HM_ERR_IO, "%s: read error", path);
        goto done;
    }
    buf[len] = 0;
    if (strlen(buf) != len) {
        st = hm_errf(err, HM_ERR_FORMAT, "%s: not a JSON text (NUL byte)", path);
        goto done;
    }
    st = hm_profile_parse(p, buf, path, err);
done:
    free(buf);
    fclose(f);
    return st;
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
    json_t *root = fmt == HM_PROFILE_SEED1 ? build_seed1(p) : build_ours(p);
    if (!root) return hm_errf(err, HM_ERR_NOMEM, "%s: out of memory building the profile", path);
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= sizeof tmp) {
        json_decref(root);
        return hm_errf(err, HM_ERR_ARG, "%s: path too long", path);
    }
    hm_status st = HM_OK;
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        st = hm_errf(err, HM_ERR_IO, "%s: %s", tmp, strerror(errno));
        goto done;
    }
    /* compact: one layer per line is not possible with jansson's flags, so write it compact */
    int rc = json_dumpf(root, f, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (rc == 0) rc = fputc('\n', f) == EOF ? -1 : 0;
    if (rc == 0) rc = fflush(f);
    if (rc == 0) rc = fsync(fileno(f));
    if (fclose(f) != 0) rc = -1;
    if (rc != 0) {
        st = hm_errf(err, HM_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
        unlink(tmp);
        goto done;
    }
    if (rename(tmp, path) != 0) {
        st = hm_errf(err, HM_ERR_IO, "%s: rename from %s failed: %s", path, tmp, strerror(errno));
        unlink(tmp);
    }
done:
    json_decref(root);
    return st;
}
