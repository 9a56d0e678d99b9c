/* inspect_json.c - `hotmoe inspect --json`: the facts of inspect_impl.h as one JSON object
 * (jansson), for scripts and tests. Top-level fields a script can rely on: arch, n_layer,
 * n_expert, n_expert_used, n_vocab, n_units, unit_bytes (the largest unit; see units.h),
 * expert_bytes, dense_bytes, tensor_bytes, and budget_bytes / units_in_budget /
 * budget_fraction when a budget was given; kv_ctx / kv_bytes (and units_in_budget_after_dense_and_kv)
 * with -c. Values absent from the file are null. */
#include <jansson.h>
#include <string.h>

#include "inspect_impl.h"

/* Set key to v (a new reference, stolen); false when v is NULL (out of memory). */
static bool put(json_t *obj, const char *key, json_t *v) {
    return v && json_object_set_new(obj, key, v) == 0;
}

static json_t *jint_or_null(int64_t v) { return v >= 0 ? json_integer(v) : json_null(); }
static json_t *jstr(hm_gguf_str s) { return json_stringn(s.ptr ? s.ptr : "", s.len); }
static json_t *jstr_or_null(hm_gguf_str s) { return s.len ? jstr(s) : json_null(); }

static json_t *arr_to_json(const hm_gguf_arr *a, int depth);

static json_t *arr_elem_to_json(const hm_gguf_arr *a, uint64_t i, int depth) {
    int64_t iv;
    double fv;
    hm_gguf_str sv;
    hm_gguf_arr av;
    switch (a->elem_type) {
    case HM_GGUF_F32:
    case HM_GGUF_F64: return hm_gguf_arr_float(a, i, &fv) ? json_real(fv) : json_null();
    case HM_GGUF_STRING: return hm_gguf_arr_str(a, i, &sv) ? jstr(sv) : json_null();
    case HM_GGUF_BOOL: return hm_gguf_arr_int(a, i, &iv) ? json_boolean(iv) : json_null();
    case HM_GGUF_ARRAY:
        return depth < HM_GGUF_MAX_ARRAY_DEPTH && hm_gguf_arr_arr(a, i, &av) ? arr_to_json(&av, depth + 1) : json_null();
    default: return hm_gguf_arr_int(a, i, &iv) ? json_integer(iv) : json_null();
    }
}

static json_t *arr_to_json(const hm_gguf_arr *a, int depth) {
    json_t *arr = json_array();
    for (uint64_t i = 0; arr && i < a->n; i++) {
        if (json_array_append_new(arr, arr_elem_to_json(a, i, depth)) != 0) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}

static json_t *kv_to_json(const hm_gguf *g, int64_t i) {
    int64_t iv;
    double fv;
    bool bv;
    hm_gguf_str sv;
    hm_gguf_arr av;
    switch (hm_gguf_kv_type(g, i)) {
    case HM_GGUF_BOOL: return hm_gguf_kv_bool(g, i, &bv) ? json_boolean(bv) : json_null();
    case HM_GGUF_F32:
    case HM_GGUF_F64: return hm_gguf_kv_float(g, i, &fv) ? json_real(fv) : json_null();
    case HM_GGUF_STRING: return hm_gguf_kv_str(g, i, &sv) ? jstr(sv) : json_null();
    case HM_GGUF_ARRAY: return hm_gguf_kv_arr(g, i, &av) ? arr_to_json(&av, 1) : json_null();
    default: return hm_gguf_kv_int(g, i, &iv) ? json_integer(iv) : json_null();
    }
}

static json_t *hparams_json(const hm_inspect_info *in) {
    json_t *o = json_object();
    for (int64_t i = 0; o && i < hm_gguf_n_kv(in->g); i++) {
        const char *key = hm_gguf_key(in->g, i);
        if (hm_inspect_is_hparam(in, key) && !put(o, key, kv_to_json(in->g, i))) {
            json_decref(o);
            return NULL;
        }
    }
    return o;
}

static json_t *tokenizer_json(const hm_inspect_info *in) {
    static const char *const tt_names[8] = {"undefined", "normal", "unknown", "control",
                                            "user_defined", "unused", "byte", "other"};
    json_t *o = json_object(), *types = json_object();
    if (!put(o, "token_types", types)) { /* o owns types from here */
        json_decref(o);
        return NULL;
    }
    bool ok = put(o, "model", jstr_or_null(in->tok_model));
    ok = ok && put(o, "pre", jstr_or_null(in->tok_pre));
    ok = ok && put(o, "n_tokens", jint_or_null(in->n_tokens));
    ok = ok && put(o, "n_merges", jint_or_null(in->n_merges));
    ok = ok && put(o, "bos_token_id", jint_or_null(in->bos_id));
    ok = ok && put(o, "eos_token_id", jint_or_null(in->eos_id));
    ok = ok && put(o, "padding_token_id", jint_or_null(in->pad_id));
    ok = ok && put(o, "has_chat_template", json_boolean(in->has_chat_template));
    for (int t = 0; ok && t < 8; t++)
        if (in->n_token_type[t]) ok = put(types, tt_names[t], json_integer(in->n_token_type[t]));
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *tensors_json(const hm_inspect_info *in) {
    json_t *o = json_object(), *by = json_object();
    bool ok = put(o, "count", json_integer(hm_gguf_n_tensors(in->g)));
    ok = ok && put(o, "bytes", json_integer((json_int_t)in->units.tensor_bytes));
    ok = ok && put(o, "n_params", json_integer(in->n_params));
    if (!ok || !put(o, "by_type", by)) { /* o owns by from here */
        if (!ok) json_decref(by);
        json_decref(o);
        return NULL;
    }
    for (int t = 0; ok && t < HM_INSPECT_NTYPE; t++) {
        if (!in->type_count[t]) continue;
        json_t *e = json_pack("{sIsI}", "count", (json_int_t)in->type_count[t], "bytes", (json_int_t)in->type_bytes[t]);
        ok = put(by, t < HM_TYPE_COUNT ? hm_type_name(t) : "unknown", e);
    }
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *layers_json(const hm_units *u) {
    json_t *arr = json_array();
    for (int32_t i = 0; arr && i < u->n_layer; i++) {
        const hm_units_layer *l = &u->layers[i];
        json_t *o = json_pack("{sisisI}", "layer", i, "n_expert", l->n_expert, "unit_bytes", (json_int_t)l->unit_bytes);
        json_t *parts = json_object();
        bool ok = o && parts;
        for (int p = 0; ok && p < HM_UNIT_NPART; p++) {
            const hm_gguf_tensor *t = l->part[p];
            if (!t) continue;
            ok = put(parts, hm_unit_part_name((hm_unit_part)p),
                     json_pack("{sssIsI}", "type", hm_type_name(t->type), "slab_bytes", (json_int_t)l->slab_bytes[p],
                               "offset", (json_int_t)t->file_offset));
        }
        if (ok) ok = put(o, "parts", parts); /* steals parts, even on failure */
        else json_decref(parts);
        if (!ok) json_decref(o);
        if (!ok || json_array_append_new(arr, o) != 0) { /* append steals o */
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}

hm_status hm_inspect_print_json(const hm_inspect_info *in, FILE *out, hm_err *err) {
    const hm_units *u = &in->units;
    json_t *o = json_object();
    bool ok = o != NULL;
    ok = ok && put(o, "file", json_string(in->path));
    ok = ok && put(o, "file_bytes", json_integer((json_int_t)hm_gguf_file_size(in->g)));
    ok = ok && put(o, "gguf_version", json_integer(hm_gguf_version(in->g)));
    ok = ok && put(o, "arch", jstr_or_null(in->arch));
    ok = ok && put(o, "name", jstr_or_null(in->name));
    ok = ok && put(o, "file_type", jint_or_null(in->file_type));
    ok = ok && put(o, "file_type_name", in->file_type >= 0 ? json_string(hm_inspect_ftype_name(in->file_type)) : json_null());
    ok = ok && put(o, "n_layer", json_integer(u->n_layer));
    ok = ok && put(o, "n_embd", jint_or_null(in->n_embd));
    ok = ok && put(o, "n_expert", json_integer(u->n_expert));
    ok = ok && put(o, "n_expert_used", json_integer(u->n_expert_used));
    ok = ok && put(o, "n_vocab", jint_or_null(in->n_vocab));
    ok = ok && put(o, "n_units", json_integer((json_int_t)u->n_units));
    ok = ok && put(o, "unit_bytes", json_integer((json_int_t)u->unit_bytes_max));
    ok = ok && put(o, "unit_bytes_min", json_integer((json_int_t)u->unit_bytes_min));
    ok = ok && put(o, "expert_bytes", json_integer((json_int_t)u->expert_bytes));
    ok = ok && put(o, "dense_bytes", json_integer((json_int_t)u->dense_bytes));
    ok = ok && put(o, "tensor_bytes", json_integer((json_int_t)u->tensor_bytes));
    if (in->budget >= 0) {
        uint64_t fit = hm_units_fit(u, in->budget);
        ok = ok && put(o, "budget_bytes", json_integer(in->budget));
        ok = ok && put(o, "units_in_budget", json_integer((json_int_t)fit));
        ok = ok && put(o, "budget_fraction", json_real(u->n_units ? (double)fit / (double)u->n_units : 0.0));
        ok = ok && put(o, "units_in_budget_after_dense",
                       json_integer((json_int_t)hm_units_fit(u, in->budget - (int64_t)u->dense_bytes)));
        if (in->kv_ctx > 0)
            ok = ok && put(o, "units_in_budget_after_dense_and_kv",
                           json_integer((json_int_t)hm_units_fit(u, in->budget - (int64_t)u->dense_bytes -
                                                                       (int64_t)in->kv_bytes)));
    }
    if (in->kv_ctx > 0) {
        ok = ok && put(o, "kv_ctx", json_integer(in->kv_ctx));
        ok = ok && put(o, "kv_bytes", json_integer((json_int_t)in->kv_bytes));
        ok = ok && put(o, "kv_type", json_string(in->kv_type));
    }
    ok = ok && put(o, "hparams", hparams_json(in));
    ok = ok && put(o, "tokenizer", tokenizer_json(in));
    ok = ok && put(o, "tensors", tensors_json(in));
    ok = ok && put(o, "layers", layers_json(u));
    if (!ok) {
        json_decref(o);
        return hm_errf(err, HM_ERR_NOMEM, "inspect: out of memory building the JSON report");
    }
    int rc = json_dumpf(o, out, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    json_decref(o);
    if (rc != 0 || fputc('\n', out) == EOF) return hm_errf(err, HM_ERR_IO, "inspect: writing the JSON report failed");
    return HM_OK;
}
