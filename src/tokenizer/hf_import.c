/* hf_import.c - Hugging Face tokenizer.json (+ tokenizer_config.json) -> GGUF tokenizer keys.
 * See hf_import.h for what is written. Strings handed to the writer are borrowed from the parsed
 * JSON, which lives until the keys are written (the writer copies them). */
#include "hf_import.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pretok.h"

enum { TT_NORMAL = 1, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_UNUSED = 5 };

/* Collect the regexes of Split pre-tokenizers, in order (max HM_PRETOK_MAX_REGEX). Sets
 * *bytelevel_regex when a ByteLevel pre-tokenizer applies its own (GPT-2) regex. */
static void collect_splits(json_t *pt, const char **rx, size_t *n, bool *bytelevel_regex) {
    if (!json_is_object(pt)) return;
    const char *type = json_string_value(json_object_get(pt, "type"));
    if (!type) return;
    if (strcmp(type, "Sequence") == 0) {
        json_t *arr = json_object_get(pt, "pretokenizers");
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) collect_splits(v, rx, n, bytelevel_regex);
    } else if (strcmp(type, "Split") == 0) {
        const char *r = json_string_value(json_object_get(json_object_get(pt, "pattern"), "Regex"));
        if (r && *n < HM_PRETOK_MAX_REGEX) rx[(*n)++] = r;
    } else if (strcmp(type, "ByteLevel") == 0) {
        json_t *ur = json_object_get(pt, "use_regex");
        if (!ur || json_is_true(ur)) *bytelevel_regex = true;
    }
}

static const char *detect_pre(json_t *root) {
    const char *rx[HM_PRETOK_MAX_REGEX];
    size_t n = 0;
    bool bl = false;
    collect_splits(json_object_get(root, "pre_tokenizer"), rx, &n, &bl);
    if (n == 0) return bl ? "gpt-2" : NULL;
    for (size_t i = 0; hm_pretok_at(i); i++) {
        const hm_pretok_def *d = hm_pretok_at(i);
        size_t k = 0;
        while (k < HM_PRETOK_MAX_REGEX && d->regex[k]) k++;
        if (k != n) continue;
        bool same = true;
        for (size_t j = 0; j < n && same; j++) same = strcmp(d->regex[j], rx[j]) == 0;
        if (same) return d->name;
    }
    /* DeepSeek's files spell their character classes with literal characters; recognise them
     * by shape */
    if (n == 3 && strcmp(rx[0], "\\p{N}{1,3}") == 0) return "deepseek-v3";
    /* o200k (GPT-4o, gpt-oss): its original regex; our table holds llama.cpp's form of it */
    if (n == 1 && strstr(rx[0], "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+") &&
        strstr(rx[0], "\\p{N}{1,3}") && strstr(rx[0], "[\\r\\n/]*"))
        return "gpt-4o";
    if (n == 6 && strcmp(rx[0], "[\r\n]") == 0) return "deepseek-llm";
    return NULL;
}

/* id of an added token or vocab entry whose content is s; -1 if none */
static int64_t token_id_of(json_t *vocab, json_t *added, const char *s) {
    size_t i;
    json_t *v;
    json_array_foreach(added, i, v) {
        const char *c = json_string_value(json_object_get(v, "content"));
        if (c && strcmp(c, s) == 0) return json_integer_value(json_object_get(v, "id"));
    }
    json_t *id = json_object_get(vocab, s);
    return json_is_integer(id) ? json_integer_value(id) : -1;
}

/* config value of a special token: a string or {"content": ...} */
static const char *config_token(json_t *cfg, const char *key) {
    json_t *v = json_object_get(cfg, key);
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_object(v)) return json_string_value(json_object_get(v, "content"));
    return NULL;
}

static const char *config_template(json_t *cfg) {
    json_t *t = json_object_get(cfg, "chat_template");
    if (json_is_string(t)) return json_string_value(t);
    size_t i;
    json_t *v;
    json_array_foreach(t, i, v) { /* [{"name": "default", "template": ...}, ...] */
        const char *name = json_string_value(json_object_get(v, "name"));
        if (name && strcmp(name, "default") == 0) return json_string_value(json_object_get(v, "template"));
    }
    return NULL;
}

#define WCHECK(call)                                                                      \
    do {                                                                                  \
        if ((call) != HM_OK) {                                                            \
            st = hm_errf(err, HM_ERR_IO, "%s: writing tokenizer keys: %s", tokenizer_json, \
                         hm_gguf_writer_error(w));                                        \
            goto done;                                                                    \
        }                                                                                 \
    } while (0)

hm_status hm_tokenizer_import_hf(hm_gguf_writer *w, const char *tokenizer_json,
                                 const char *tokenizer_config_json, const hm_hf_import_opts *o,
                                 int32_t *n_vocab_out, hm_err *err) {
    hm_hf_import_opts defaults = {0};
    if (!o) o = &defaults;
    hm_status st = HM_OK;
    json_t *root = NULL, *cfg = NULL;
    const char **tokens = NULL;
    int32_t *types = NULL;
    char **merges = NULL, **pads = NULL;
    size_t n_merges = 0, n_pads = 0;
    json_error_t je;

    root = json_load_file(tokenizer_json, 0, &je);
    if (!root) {
        st = hm_errf(err, HM_ERR_FORMAT, "%s: line %d: %s", tokenizer_json, je.line, je.text);
        goto done;
    }
    if (tokenizer_config_json) {
        cfg = json_load_file(tokenizer_config_json, 0, &je);
        if (!cfg) {
            st = hm_errf(err, HM_ERR_FORMAT, "%s: line %d: %s", tokenizer_config_json, je.line, je.text);
            goto done;
        }
    }
    json_t *model = json_object_get(root, "model");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    json_t *vocab = json_object_get(model, "vocab");
    json_t *jmerges = json_object_get(model, "merges");
    json_t *added = json_object_get(root, "added_tokens");
    if (!mtype || strcmp(mtype, "BPE") != 0) {
        st = hm_errf(err, HM_ERR_UNSUPPORTED, "%s: model.type is '%s'; only byte-level BPE is imported",
                     tokenizer_json, mtype ? mtype : "(missing)");
        goto done;
    }
    if (!json_is_object(vocab) || !json_is_array(jmerges)) {
        st = hm_errf(err, HM_ERR_FORMAT, "%s: model.vocab (object) or model.merges (array) missing",
                     tokenizer_json);
        goto done;
    }
    const char *pre = o->pre ? o->pre : detect_pre(root);
    if (!pre) {
        st = hm_errf(err, HM_ERR_UNSUPPORTED,
                     "%s: pre_tokenizer not recognised (known: qwen2, qwen35, llama-bpe, deepseek-llm, "
                     "deepseek-v3, gpt-2); name one explicitly", tokenizer_json);
        goto done;
    }

    /* ids: model vocab, then added tokens (which may extend or override it) */
    int64_t n = 0;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) > 0x7fffffff) {
            st = hm_errf(err, HM_ERR_FORMAT, "%s: model.vocab['%s'] is not a token id", tokenizer_json, key);
            goto done;
        }
        if (json_integer_value(val) + 1 > n) n = json_integer_value(val) + 1;
    }
    size_t ai;
    json_array_foreach(added, ai, val) {
        json_int_t id = json_integer_value(json_object_get(val, "id"));
        if (!json_is_string(json_object_get(val, "content")) || id < 0 || id > 0x7fffffff) {
            st = hm_errf(err, HM_ERR_FORMAT, "%s: added_tokens[%zu] malformed", tokenizer_json, ai);
            goto done;
        }
        if (id + 1 > n) n = id + 1;
    }
    int64_t n_total = n > o->pad_vocab_to ? n : o->pad_vocab_to;
    tokens = calloc((size_t)n_total, sizeof *tokens);
    types = calloc((size_t)n_total, sizeof *types);
    pads = calloc((size_t)n_total, sizeof *pads);
    if (!tokens || !types || !pads) { st = hm_errf(err, HM_ERR_NOMEM, "out of memory"); goto done; }
    json_object_foreach(vocab, key, val) {
        tokens[json_integer_value(val)] = key;
        types[json_integer_value(val)] = TT_NORMAL;
    }
    json_array_foreach(added, ai, val) {
        json_int_t id = json_integer_value(json_object_get(val, "id"));
        tokens[id] = json_string_value(json_object_get(val, "content"));
        types[id] = json_is_true(json_object_get(val, "special")) ? TT_CONTROL : TT_USER_DEFINED;
    }
    for (int64_t i = 0; i < n_total; i++) {
        if (tokens[i]) continue;
        /* holes and padding: unused placeholder tokens, as llama.cpp's converter writes */
        char buf[32];
        snprintf(buf, sizeof buf, "[PAD%lld]", (long long)i);
        if (!(pads[n_pads] = strdup(buf))) { st = hm_errf(err, HM_ERR_NOMEM, "out of memory"); goto done; }
        tokens[i] = pads[n_pads++];
        types[i] = TT_UNUSED;
    }

    /* merges: "a b" strings or ["a", "b"] pairs */
    size_t nm = json_array_size(jmerges);
    merges = calloc(nm ? nm : 1, sizeof *merges);
    if (!merges) { st = hm_errf(err, HM_ERR_NOMEM, "out of memory"); goto done; }
    for (size_t i = 0; i < nm; i++) {
        json_t *m = json_array_get(jmerges, i);
        const char *a = NULL, *b = NULL;
        if (json_is_string(m)) {
            merges[n_merges] = strdup(json_string_value(m));
        } else if (json_is_array(m) && json_array_size(m) == 2) {
            a = json_string_value(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            if (a && b) {
                size_t la = strlen(a), lb = strlen(b);
                merges[n_merges] = malloc(la + lb + 2);
                if (merges[n_merges]) {
                    memcpy(merges[n_merges], a, la);
                    merges[n_merges][la] = ' ';
                    memcpy(merges[n_merges] + la + 1, b, lb + 1);
                }
            }
        }
        if (!json_is_string(m) && !(a && b)) {
            st = hm_errf(err, HM_ERR_FORMAT, "%s: model.merges[%zu] is not a pair", tokenizer_json, i);
            goto done;
        }
        if (!merges[n_merges]) { st = hm_errf(err, HM_ERR_NOMEM, "out of memory"); goto done; }
        n_merges++;
    }

    WCHECK(hm_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2"));
    WCHECK(hm_gguf_writer_set_str(w, "tokenizer.ggml.pre", pre));
    WCHECK(hm_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, (uint64_t)n_total));
    WCHECK(hm_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", HM_GGUF_I32, types, (uint64_t)n_total));
    WCHECK(hm_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merges, n_merges));
    static const struct { const char *cfg_key, *gguf_key; } ids[] = {
        {"bos_token", "tokenizer.ggml.bos_token_id"},
        {"eos_token", "tokenizer.ggml.eos_token_id"},
        {"pad_token", "tokenizer.ggml.padding_token_id"},
        {"unk_token", "tokenizer.ggml.unknown_token_id"},
    };
    for (size_t i = 0; cfg && i < sizeof ids / sizeof ids[0]; i++) {
        const char *s = config_token(cfg, ids[i].cfg_key);
        if (!s) continue;
        int64_t id = token_id_of(vocab, added, s);
        if (id < 0) {
            st = hm_errf(err, HM_ERR_FORMAT, "%s: %s '%s' is not a token of %s", tokenizer_config_json,
                         ids[i].cfg_key, s, tokenizer_json);
            goto done;
        }
        WCHECK(hm_gguf_writer_set_u32(w, ids[i].gguf_key, (uint32_t)id));
    }
    bool add_bos = cfg && json_is_true(json_object_get(cfg, "add_bos_token"));
    WCHECK(hm_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", add_bos));
    const char *tmpl = cfg ? config_template(cfg) : NULL;
    if (tmpl) WCHECK(hm_gguf_writer_set_str(w, "tokenizer.chat_template", tmpl));
    if (n_vocab_out) *n_vocab_out = (int32_t)n_total;

done:
    for (size_t i = 0; merges && i < n_merges; i++) free(merges[i]);
    for (size_t i = 0; i < n_pads; i++) free(pads[i]);
    free(merges);
    free(pads);
    free(tokens);
    free(types);
    json_decref(root);
    json_decref(cfg);
    return st;
}

hm_status hm_tokenizer_write_vocab_gguf(const char *tokenizer_json, const char *tokenizer_config_json,
                                        const char *out_path, hm_err *err) {
    hm_gguf_writer *w = NULL;
    hm_status st = hm_gguf_writer_open(&w, out_path, 0, err);
    if (st != HM_OK) return st;
    st = hm_gguf_writer_set_str(w, "general.architecture", "vocab-only");
    if (st == HM_OK) st = hm_gguf_writer_set_str(w, "general.name", "tokenizer");
    if (st != HM_OK) {
        st = hm_errf(err, st, "%s: %s", out_path, hm_gguf_writer_error(w));
        hm_gguf_writer_abort(w);
        return st;
    }
    st = hm_tokenizer_import_hf(w, tokenizer_json, tokenizer_config_json, NULL, NULL, err);
    if (st != HM_OK) {
        hm_gguf_writer_abort(w);
        return st;
    }
    if (hm_gguf_writer_begin_data(w) != HM_OK) {
        st = hm_errf(err, HM_ERR_IO, "%s: %s", out_path, hm_gguf_writer_error(w));
        hm_gguf_writer_abort(w);
        return st;
    }
    return hm_gguf_writer_finish(w); /* frees w; a failure is reported in err by the writer */
}
