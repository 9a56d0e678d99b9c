/* inspect.c - `hotmoe inspect`: gather the facts of a GGUF file (hyper-parameters, tokenizer,
 * tensor types, expert units) and print them as a text report; inspect_json.c prints the same
 * facts as one JSON object. Reads metadata and the tensor table only, never the weights, so it
 * is instant on a 17 GB file. */
#include <inttypes.h>
#include <string.h>

#include "inspect_impl.h"

/* ---------------------------------------------------------------- gathering */

bool hm_inspect_is_hparam(const hm_inspect_info *in, const char *key) {
    return in->arch.len && strncmp(key, in->arch.ptr, in->arch.len) == 0 && key[in->arch.len] == '.';
}

const char *hm_inspect_ftype_name(int64_t ftype) {
    /* LLAMA_FTYPE_* of llama.cpp's llama.h (the value of general.file_type) */
    static const char *const names[] = {
        [0] = "F32",      [1] = "F16",      [2] = "Q4_0",     [3] = "Q4_1",     [7] = "Q8_0",
        [8] = "Q5_0",     [9] = "Q5_1",     [10] = "Q2_K",    [11] = "Q3_K_S",  [12] = "Q3_K_M",
        [13] = "Q3_K_L",  [14] = "Q4_K_S",  [15] = "Q4_K_M",  [16] = "Q5_K_S",  [17] = "Q5_K_M",
        [18] = "Q6_K",    [19] = "IQ2_XXS", [20] = "IQ2_XS",  [21] = "Q2_K_S",  [22] = "IQ3_XS",
        [23] = "IQ3_XXS", [24] = "IQ1_S",   [25] = "IQ4_NL",  [26] = "IQ3_S",   [27] = "IQ3_M",
        [28] = "IQ2_S",   [29] = "IQ2_M",   [30] = "IQ4_XS",  [31] = "IQ1_M",   [32] = "BF16",
        [36] = "TQ1_0",   [37] = "TQ2_0",   [38] = "MXFP4_MOE",
    };
    if (ftype < 0 || ftype >= (int64_t)(sizeof names / sizeof names[0]) || !names[ftype]) return "?";
    return names[ftype];
}

hm_gguf_str hm_inspect_token_text(const hm_inspect_info *in, int64_t id) {
    hm_gguf_str s = {"", 0};
    hm_gguf_arr toks;
    if (id < 0 || !hm_gguf_get_arr(in->g, "tokenizer.ggml.tokens", &toks)) return s;
    if (!hm_gguf_arr_str(&toks, (uint64_t)id, &s)) s = (hm_gguf_str){"", 0};
    return s;
}

static int64_t get_int_or(const hm_gguf *g, const char *key, int64_t dflt) {
    int64_t v;
    return hm_gguf_get_int(g, key, &v) ? v : dflt;
}

static int64_t arch_int_or(const hm_inspect_info *in, const char *suffix, int64_t dflt) {
    if (!in->arch.len || in->arch.len > 64) return dflt;
    char key[128];
    snprintf(key, sizeof key, "%.*s.%s", (int)in->arch.len, in->arch.ptr, suffix);
    return get_int_or(in->g, key, dflt);
}

static void gather_tokenizer(hm_inspect_info *in) {
    const hm_gguf *g = in->g;
    hm_gguf_arr a;
    if (!hm_gguf_get_str(g, "tokenizer.ggml.model", &in->tok_model)) in->tok_model.len = 0;
    if (!hm_gguf_get_str(g, "tokenizer.ggml.pre", &in->tok_pre)) in->tok_pre.len = 0;
    in->n_tokens = hm_gguf_get_arr(g, "tokenizer.ggml.tokens", &a) ? (int64_t)a.n : -1;
    in->n_merges = hm_gguf_get_arr(g, "tokenizer.ggml.merges", &a) ? (int64_t)a.n : -1;
    in->bos_id = get_int_or(g, "tokenizer.ggml.bos_token_id", -1);
    in->eos_id = get_int_or(g, "tokenizer.ggml.eos_token_id", -1);
    in->pad_id = get_int_or(g, "tokenizer.ggml.padding_token_id", -1);
    in->has_chat_template = hm_gguf_find_key(g, "tokenizer.chat_template") >= 0;
    if (hm_gguf_get_arr(g, "tokenizer.ggml.token_type", &a)) {
        for (uint64_t i = 0; i < a.n; i++) {
            int64_t t;
            if (!hm_gguf_arr_int(&a, i, &t)) break;
            in->n_token_type[t >= 0 && t < 7 ? t : 7]++;
        }
    }
}

static hm_status gather(hm_inspect_info *in, hm_err *err) {
    const hm_gguf *g = in->g;
    if (!hm_gguf_get_str(g, "general.architecture", &in->arch)) in->arch.len = 0;
    if (!hm_gguf_get_str(g, "general.name", &in->name)) in->name.len = 0;
    in->file_type = get_int_or(g, "general.file_type", -1);
    in->n_embd = arch_int_or(in, "embedding_length", -1);
    gather_tokenizer(in);

    in->n_vocab = in->n_tokens;
    if (in->n_vocab < 0) in->n_vocab = arch_int_or(in, "vocab_size", -1);
    const hm_gguf_tensor *emb = hm_gguf_find_tensor(g, "token_embd.weight");
    if (in->n_vocab < 0 && emb && emb->n_dims == 2) in->n_vocab = emb->ne[1];

    for (int64_t i = 0; i < hm_gguf_n_tensors(g); i++) {
        const hm_gguf_tensor *t = hm_gguf_tensor_at(g, i);
        int b = t->type >= 0 && t->type < HM_TYPE_COUNT && hm_type_get(t->type)->name ? t->type : HM_TYPE_COUNT;
        in->type_count[b]++;
        in->type_bytes[b] += t->nbytes;
        int64_t n = 1;
        for (uint32_t d = 0; d < t->n_dims && d < HM_GGUF_MAX_DIMS; d++) n *= t->ne[d];
        in->n_params += n;
    }
    return hm_units_init(&in->units, g, err);
}

/* ---------------------------------------------------------------- text report */

static const char *fmt_bytes(char *buf, size_t n, uint64_t b) {
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024.0 && u < 4) v /= 1024.0, u++;
    if (u == 0) snprintf(buf, n, "%" PRIu64 " B", b);
    else snprintf(buf, n, "%.2f %s", v, unit[u]);
    return buf;
}

static void print_str(FILE *out, hm_gguf_str s, size_t max) {
    fputc('"', out);
    for (uint64_t i = 0; i < s.len && i < max; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        if (c == '\n') fputs("\\n", out);
        else if (c < 0x20 || c == 0x7f) fprintf(out, "\\x%02x", c);
        else fputc(c, out);
    }
    fputc('"', out);
    if (s.len > max) fprintf(out, "... (%" PRIu64 " bytes)", s.len);
}

static void print_arr(FILE *out, const hm_gguf_arr *a, int depth) {
    const uint64_t show = 8;
    fputc('[', out);
    for (uint64_t i = 0; i < a->n && i < show; i++) {
        if (i) fputs(", ", out);
        int64_t iv;
        double fv;
        hm_gguf_str sv;
        hm_gguf_arr av;
        switch (a->elem_type) {
        case HM_GGUF_F32:
        case HM_GGUF_F64:
            if (hm_gguf_arr_float(a, i, &fv)) fprintf(out, "%g", fv);
            break;
        case HM_GGUF_STRING:
            if (hm_gguf_arr_str(a, i, &sv)) print_str(out, sv, 40);
            break;
        case HM_GGUF_ARRAY:
            if (depth < 2 && hm_gguf_arr_arr(a, i, &av)) print_arr(out, &av, depth + 1);
            else fputs("[...]", out);
            break;
        default:
            if (hm_gguf_arr_int(a, i, &iv)) fprintf(out, "%" PRId64, iv);
            break;
        }
    }
    if (a->n > show) fprintf(out, ", ... %" PRIu64 " items", a->n);
    fputc(']', out);
}

static void print_kv(FILE *out, const hm_gguf *g, int64_t i) {
    int64_t iv;
    double fv;
    bool bv;
    hm_gguf_str sv;
    hm_gguf_arr av;
    switch (hm_gguf_kv_type(g, i)) {
    case HM_GGUF_BOOL:
        if (hm_gguf_kv_bool(g, i, &bv)) fputs(bv ? "true" : "false", out);
        break;
    case HM_GGUF_F32:
    case HM_GGUF_F64:
        if (hm_gguf_kv_float(g, i, &fv)) fprintf(out, "%g", fv);
        break;
    case HM_GGUF_STRING:
        if (hm_gguf_kv_str(g, i, &sv)) print_str(out, sv, 80);
        break;
    case HM_GGUF_ARRAY:
        if (hm_gguf_kv_arr(g, i, &av)) print_arr(out, &av, 0);
        break;
    default:
        if (hm_gguf_kv_int(g, i, &iv)) fprintf(out, "%" PRId64, iv);
        else fputs("?", out);
        break;
    }
}

static void print_token_ref(FILE *out, const hm_inspect_info *in, const char *what, int64_t id) {
    if (id < 0) return;
    fprintf(out, "%s %" PRId64, what, id);
    hm_gguf_str s = hm_inspect_token_text(in, id);
    if (s.len) fputc(' ', out), print_str(out, s, 40);
    fputs("  ", out);
}

static void print_tokenizer(FILE *out, const hm_inspect_info *in) {
    static const char *const tt_names[8] = {"undefined", "normal", "unknown", "control",
                                            "user-defined", "unused", "byte", "other"};
    if (!in->tok_model.len && in->n_tokens < 0) {
        fputs("tokenizer:  none\n", out);
        return;
    }
    fprintf(out, "tokenizer:  %.*s", (int)in->tok_model.len, in->tok_model.ptr);
    if (in->tok_pre.len) fprintf(out, " (pre %.*s)", (int)in->tok_pre.len, in->tok_pre.ptr);
    if (in->n_tokens >= 0) {
        fprintf(out, ", %" PRId64 " tokens", in->n_tokens);
        const char *sep = " (";
        for (int t = 0; t < 8; t++) {
            if (!in->n_token_type[t]) continue;
            fprintf(out, "%s%" PRId64 " %s", sep, in->n_token_type[t], tt_names[t]);
            sep = ", ";
        }
        if (sep[0] == ',') fputc(')', out);
    }
    if (in->n_merges >= 0) fprintf(out, ", %" PRId64 " merges", in->n_merges);
    fputs("\n            ", out);
    print_token_ref(out, in, "bos", in->bos_id);
    print_token_ref(out, in, "eos", in->eos_id);
    print_token_ref(out, in, "pad", in->pad_id);
    fprintf(out, "chat template: %s\n", in->has_chat_template ? "yes" : "no");
}

static void layer_types(const hm_units_layer *l, char *buf, size_t n) {
    buf[0] = 0;
    static const hm_unit_part order[] = {HM_UNIT_GATE, HM_UNIT_UP, HM_UNIT_GATE_UP, HM_UNIT_DOWN};
    size_t len = 0;
    for (size_t k = 0; k < sizeof order / sizeof order[0]; k++) {
        const hm_gguf_tensor *t = l->part[order[k]];
        if (!t) continue;
        int w = snprintf(buf + len, n - len, "%s%s", len ? " / " : "", hm_type_name(t->type));
        if (w < 0 || (size_t)w >= n - len) return;
        len += (size_t)w;
    }
}

static bool same_layer_shape(const hm_units_layer *a, const hm_units_layer *b) {
    if (a->n_expert != b->n_expert || a->unit_bytes != b->unit_bytes) return false;
    for (int p = 0; p < HM_UNIT_NPART; p++) {
        if (!a->part[p] != !b->part[p]) return false;
        if (a->part[p] && a->part[p]->type != b->part[p]->type) return false;
    }
    return true;
}

static void print_experts(FILE *out, const hm_inspect_info *in) {
    const hm_units *u = &in->units;
    char b1[32], b2[32], b3[32];
    if (!u->n_units) {
        fprintf(out, "experts:    none (%s)\n", hm_gguf_n_tensors(in->g) ? "a dense model" : "no tensors");
        return;
    }
    fprintf(out, "experts:    %d layers x %d experts = %" PRIu64 " units, %d used per token\n",
            u->n_layer, u->n_expert, u->n_units, u->n_expert_used);
    fprintf(out, "  %-10s %8s %12s   %s\n", "layers", "experts", "unit bytes", "gate / up / down");
    for (int32_t i = 0; i < u->n_layer;) {
        int32_t j = i + 1;
        while (j < u->n_layer && same_layer_shape(&u->layers[i], &u->layers[j])) j++;
        const hm_units_layer *l = &u->layers[i];
        char range[24], types[96];
        if (j - i == 1) snprintf(range, sizeof range, "%d", i);
        else snprintf(range, sizeof range, "%d-%d", i, j - 1);
        if (l->n_expert) {
            layer_types(l, types, sizeof types);
            fprintf(out, "  %-10s %8d %12s   %s\n", range, l->n_expert,
                    fmt_bytes(b1, sizeof b1, l->unit_bytes), types);
        } else {
            fprintf(out, "  %-10s %8s %12s   dense\n", range, "-", "-");
        }
        i = j;
    }
    double tb = u->tensor_bytes ? (double)u->tensor_bytes : 1.0;
    fprintf(out, "  unit:     %s", fmt_bytes(b1, sizeof b1, u->unit_bytes_max));
    if (u->unit_bytes_min != u->unit_bytes_max)
        fprintf(out, " largest, %s smallest", fmt_bytes(b2, sizeof b2, u->unit_bytes_min));
    fprintf(out, "\n  experts:  %s (%.1f %%)   dense: %s (%.1f %%)\n",
            fmt_bytes(b2, sizeof b2, u->expert_bytes), 100.0 * (double)u->expert_bytes / tb,
            fmt_bytes(b3, sizeof b3, u->dense_bytes), 100.0 * (double)u->dense_bytes / tb);
    if (in->budget >= 0) {
        uint64_t fit = hm_units_fit(u, in->budget);
        int64_t rest = in->budget - (int64_t)u->dense_bytes;
        uint64_t fit2 = hm_units_fit(u, rest);
        fprintf(out, "budget:     %s holds %" PRIu64 " of %" PRIu64 " units (%.1f %%) in slots of %s;\n"
                     "            %" PRIu64 " units (%.1f %%) if the dense weights (%s) share it\n",
                fmt_bytes(b1, sizeof b1, (uint64_t)in->budget), fit, u->n_units,
                100.0 * (double)fit / (double)u->n_units, fmt_bytes(b2, sizeof b2, u->unit_bytes_max),
                fit2, 100.0 * (double)fit2 / (double)u->n_units, fmt_bytes(b3, sizeof b3, u->dense_bytes));
        if (in->kv_ctx > 0) {
            const uint64_t fit3 = hm_units_fit(u, rest - (int64_t)in->kv_bytes);
            fprintf(out, "            %" PRIu64 " units (%.1f %%) if the KV cache of %d positions shares it too\n", fit3,
                    100.0 * (double)fit3 / (double)u->n_units, (int)in->kv_ctx);
        }
    }
    if (in->kv_ctx > 0)
        fprintf(out, "kv cache:   %d positions: %s (%s)\n", (int)in->kv_ctx, fmt_bytes(b1, sizeof b1, in->kv_bytes),
                in->kv_type);
}

static void print_text(const hm_inspect_info *in, FILE *out) {
    const hm_gguf *g = in->g;
    char b1[32], b2[32];
    fprintf(out, "file:       %s (%s, GGUF v%u, %" PRId64 " keys, %" PRId64 " tensors, alignment %" PRIu64 ")\n",
            in->path, fmt_bytes(b1, sizeof b1, hm_gguf_file_size(g)), hm_gguf_version(g), hm_gguf_n_kv(g),
            hm_gguf_n_tensors(g), hm_gguf_alignment(g));
    fprintf(out, "model:      %.*s", (int)in->arch.len, in->arch.len ? in->arch.ptr : "?");
    if (in->name.len) fputc(' ', out), print_str(out, in->name, 80);
    if (in->file_type >= 0)
        fprintf(out, ", file type %" PRId64 " (%s)", in->file_type, hm_inspect_ftype_name(in->file_type));
    if (in->n_params >= 1000000000) fprintf(out, ", %.2f B parameters", (double)in->n_params * 1e-9);
    else if (in->n_params) fprintf(out, ", %.2f M parameters", (double)in->n_params * 1e-6);
    if (in->n_vocab >= 0) fprintf(out, ", n_vocab %" PRId64, in->n_vocab);
    fputc('\n', out);

    bool any = false;
    for (int64_t i = 0; i < hm_gguf_n_kv(g); i++) {
        const char *key = hm_gguf_key(g, i);
        if (!hm_inspect_is_hparam(in, key)) continue;
        if (!any) fputs("hparams:\n", out), any = true;
        fprintf(out, "  %-44s ", key);
        print_kv(out, g, i);
        fputc('\n', out);
    }
    print_tokenizer(out, in);

    fprintf(out, "tensors:    %" PRId64 ", %s", hm_gguf_n_tensors(g), fmt_bytes(b1, sizeof b1, in->units.tensor_bytes));
    if (in->n_params) fprintf(out, " (%.2f bits per weight)", 8.0 * (double)in->units.tensor_bytes / (double)in->n_params);
    fputc('\n', out);
    for (int t = 0; t < HM_INSPECT_NTYPE; t++) {
        if (!in->type_count[t]) continue;
        double share = in->units.tensor_bytes ? 100.0 * (double)in->type_bytes[t] / (double)in->units.tensor_bytes : 0;
        fprintf(out, "  %-8s %6" PRId64 " tensors %12s  %5.1f %%\n", t < HM_TYPE_COUNT ? hm_type_name(t) : "unknown",
                in->type_count[t], fmt_bytes(b2, sizeof b2, in->type_bytes[t]), share);
    }
    print_experts(out, in);
}

/* ---------------------------------------------------------------- entry */

hm_status hm_inspect(const char *path, const hm_inspect_opts *o, FILE *out, hm_err *err) {
    hm_inspect_info in;
    memset(&in, 0, sizeof in);
    in.path = path;
    in.budget = o ? o->budget : -1;
    in.kv_ctx = o ? o->kv_ctx : 0;
    in.kv_bytes = o ? o->kv_bytes : 0;
    in.kv_type = o && o->kv_type ? o->kv_type : "f16";
    hm_gguf *g = NULL;
    hm_status st = hm_gguf_open(&g, path, err);
    if (st) return st;
    in.g = g;
    st = gather(&in, err);
    if (!st) {
        if (o && o->json) st = hm_inspect_print_json(&in, out, err);
        else print_text(&in, out);
    }
    if (!st && (fflush(out) != 0 || ferror(out))) st = hm_errf(err, HM_ERR_IO, "inspect: writing the report failed");
    hm_units_free(&in.units);
    hm_gguf_close(g);
    return st;
}
