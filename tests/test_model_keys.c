/* test_model_keys.c - header values that later size, index or divide are refused at load, with
 * an error naming the key.
 *
 * Starts from the smallest model of each arch (fuzz/corpus/model/ARCH.gguf, tools/make_fuzz_seeds.py;
 * each loads and its tokenizer opens, checked first so a broken copy cannot pass for a refusal),
 * copies it with one or two keys replaced or removed (the project's GGUF reader and writer; the
 * tensors byte for byte), and opens the copy with hm_model_open and hm_tokenizer_open. Each case
 * says which of the two must refuse it; the message must name the key (for a per-layer array,
 * with the index). Cases: special token ids past the vocabulary or negative, a token list longer
 * than the embedding, a BPE vocabulary without merges, non-finite or out-of-range floats (RMS
 * epsilon, RoPE bases, the logit soft cap, token scores), integers past their caps (layers,
 * experts, DeltaNet sizes whose products overflow int32, a per-layer feed-forward length). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "hotmoe.h"
#include "test.h"

static char tmpdir[256];

enum { WANT_MODEL = 1, WANT_TOK = 2 }; /* who must refuse */

typedef struct change {
    const char *key;
    hm_gguf_value v; /* type HM_GGUF_VTYPE_COUNT: remove the key */
} change;

#define REMOVE ((hm_gguf_value){.type = HM_GGUF_VTYPE_COUNT})
#define U32(x) ((hm_gguf_value){.type = HM_GGUF_U32, .u = (x)})
#define I32(x) ((hm_gguf_value){.type = HM_GGUF_I32, .i = (x)})
#define F32(x) ((hm_gguf_value){.type = HM_GGUF_F32, .f = (x)})

/* One kv of g as a writer value; string arrays through strs (caller frees). */
static bool kv_value(const hm_gguf *g, int64_t i, hm_gguf_value *v, hm_gguf_str **strs) {
    *strs = NULL;
    memset(v, 0, sizeof *v);
    v->type = hm_gguf_kv_type(g, i);
    switch (v->type) {
    case HM_GGUF_STRING: return hm_gguf_kv_str(g, i, &v->str);
    case HM_GGUF_F32:
    case HM_GGUF_F64: return hm_gguf_kv_float(g, i, &v->f);
    case HM_GGUF_I8:
    case HM_GGUF_I16:
    case HM_GGUF_I32:
    case HM_GGUF_I64: return hm_gguf_kv_int(g, i, &v->i);
    case HM_GGUF_ARRAY: {
        hm_gguf_arr a;
        if (!hm_gguf_kv_arr(g, i, &a)) return false;
        v->arr.elem_type = a.elem_type;
        v->arr.n = a.n;
        v->arr.data = a.data;
        if (a.elem_type == HM_GGUF_STRING) {
            *strs = calloc(a.n + 1, sizeof **strs);
            for (uint64_t k = 0; k < a.n; k++)
                if (!hm_gguf_arr_str(&a, k, &(*strs)[k])) return false;
            v->arr.data = *strs;
        }
        return a.elem_type != HM_GGUF_ARRAY;
    }
    default: {
        int64_t x;
        if (!hm_gguf_kv_int(g, i, &x)) return false;
        v->u = (uint64_t)x;
        return true;
    }
    }
}

/* Copy src to dst with the changes applied (a change of a key src lacks adds it). */
static bool copy_with(const char *src, const char *dst, const change *ch, int n_ch) {
    hm_gguf *g = NULL;
    hm_err err = {{0}};
    if (hm_gguf_open(&g, src, &err) != HM_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return false;
    }
    hm_gguf_writer *w = NULL;
    bool ok = hm_gguf_writer_open(&w, dst, 0, &err) == HM_OK;
    for (int64_t i = 0; ok && i < hm_gguf_n_kv(g); i++) {
        const char *key = hm_gguf_key(g, i);
        int c = -1;
        for (int k = 0; k < n_ch; k++)
            if (strcmp(ch[k].key, key) == 0) c = k;
        if (c >= 0) continue;
        hm_gguf_value v;
        hm_gguf_str *strs;
        ok = kv_value(g, i, &v, &strs) && hm_gguf_writer_set_value(w, key, &v) == HM_OK;
        free(strs);
    }
    for (int k = 0; ok && k < n_ch; k++)
        if (ch[k].v.type != HM_GGUF_VTYPE_COUNT) ok = hm_gguf_writer_set_value(w, ch[k].key, &ch[k].v) == HM_OK;
    for (int64_t i = 0; ok && i < hm_gguf_n_tensors(g); i++) {
        const hm_gguf_tensor *t = hm_gguf_tensor_at(g, i);
        ok = hm_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne) == HM_OK;
    }
    ok = ok && hm_gguf_writer_begin_data(w) == HM_OK;
    for (int64_t i = 0; ok && i < hm_gguf_n_tensors(g); i++) {
        const hm_gguf_tensor *t = hm_gguf_tensor_at(g, i);
        ok = hm_gguf_writer_write(w, t->data, t->nbytes) == HM_OK;
    }
    if (ok) ok = hm_gguf_writer_finish(w) == HM_OK;
    else hm_gguf_writer_abort(w);
    if (!ok) fprintf(stderr, "copy_with %s: %s\n", src, err.msg);
    hm_gguf_close(g);
    return ok;
}

static const char *seed(const char *arch) {
    static char p[4096];
    snprintf(p, sizeof p, "%s", test_src_path("fuzz/corpus/model/"));
    snprintf(p + strlen(p), sizeof p - strlen(p), "%s.gguf", arch);
    return p;
}

/* Copy the seed of arch with the changes; who (WANT_*) must fail with a message naming want. */
static void refuse(const char *arch, const change *ch, int n_ch, int who, const char *want) {
    char dst[512];
    snprintf(dst, sizeof dst, "%s/%s.gguf", tmpdir, arch);
    char src[4096];
    snprintf(src, sizeof src, "%s", seed(arch));
    if (!copy_with(src, dst, ch, n_ch)) {
        CHECKF(false, "%s: cannot write the copy for %s", arch, want);
        return;
    }
    hm_err err = {{0}};
    hm_model *m = NULL;
    hm_status st = hm_model_open(&m, dst, NULL, &err);
    if (who & WANT_MODEL)
        CHECKF(st == HM_ERR_FORMAT && strstr(err.msg, want), "%s, %s: model open gave %s '%s'", arch, want,
               hm_status_name(st), st ? err.msg : "");
    hm_model_close(m);
    hm_tokenizer *t = NULL;
    memset(&err, 0, sizeof err);
    st = hm_tokenizer_open(&t, dst, &err);
    if (who & WANT_TOK)
        CHECKF(st == HM_ERR_FORMAT && strstr(err.msg, want), "%s, %s: tokenizer open gave %s '%s'", arch, want,
               hm_status_name(st), st ? err.msg : "");
    hm_tokenizer_close(t);
    unlink(dst);
}

#define REFUSE(arch, who, key, val) \
    do { const change c_[1] = {{key, val}}; refuse(arch, c_, 1, who, key); } while (0)

/* The unchanged copy of every seed loads: the harness itself is sound. */
static void test_seeds_load(void) {
    static const char *const archs[] = {"qwen3moe", "qwen35moe", "gemma4"};
    for (int i = 0; i < 3; i++) {
        char dst[512];
        snprintf(dst, sizeof dst, "%s/same.gguf", tmpdir);
        char src[4096];
        snprintf(src, sizeof src, "%s", seed(archs[i]));
        CHECKF(copy_with(src, dst, NULL, 0), "%s: copy", archs[i]);
        hm_err err = {{0}};
        hm_model *m = NULL;
        CHECKF(hm_model_open(&m, dst, NULL, &err) == HM_OK, "%s: %s", archs[i], err.msg);
        hm_model_close(m);
        hm_tokenizer *t = NULL;
        CHECKF(hm_tokenizer_open(&t, dst, &err) == HM_OK, "%s tokenizer: %s", archs[i], err.msg);
        hm_tokenizer_close(t);
        unlink(dst);
    }
}

static void test_token_ids(void) {
    /* the qwen3moe seed has 8 tokens */
    REFUSE("qwen3moe", WANT_MODEL | WANT_TOK, "tokenizer.ggml.bos_token_id", U32(8));
    REFUSE("qwen3moe", WANT_MODEL | WANT_TOK, "tokenizer.ggml.eos_token_id", U32(0xffffffffu));
    REFUSE("qwen3moe", WANT_MODEL | WANT_TOK, "tokenizer.ggml.eos_token_id", I32(-1));
    REFUSE("qwen3moe", WANT_TOK, "tokenizer.ggml.eot_token_id", U32(9));
    REFUSE("qwen3moe", WANT_TOK, "tokenizer.ggml.padding_token_id", U32(1000));
    REFUSE("qwen3moe", WANT_TOK, "tokenizer.ggml.unknown_token_id", I32(-5));
    REFUSE("gemma4", WANT_MODEL | WANT_TOK, "tokenizer.ggml.bos_token_id", U32(10));
    REFUSE("qwen35moe", WANT_MODEL | WANT_TOK, "tokenizer.ggml.bos_token_id", U32(1u << 31));
    /* a token list longer than the embedding: the tokenizer's ids would index past it */
    const char *toks[9] = {"a", "b", "c", "\xc4\xa0", "ab", "abc", "\xc4\xa0" "a", "<|end|>", "x"};
    hm_gguf_str s[9];
    for (int i = 0; i < 9; i++) s[i] = (hm_gguf_str){toks[i], strlen(toks[i])};
    const int32_t ty[9] = {1, 1, 1, 1, 1, 1, 1, 3, 1};
    const change c[2] = {
        {"tokenizer.ggml.tokens", {.type = HM_GGUF_ARRAY, .arr = {HM_GGUF_STRING, 9, s}}},
        {"tokenizer.ggml.token_type", {.type = HM_GGUF_ARRAY, .arr = {HM_GGUF_I32, 9, ty}}},
    };
    refuse("qwen3moe", c, 2, WANT_MODEL, "tokenizer.ggml.tokens");
}

static void test_merges(void) {
    REFUSE("qwen3moe", WANT_TOK, "tokenizer.ggml.merges", REMOVE);
    REFUSE("qwen35moe", WANT_TOK, "tokenizer.ggml.merges", REMOVE);
    REFUSE("gemma4", WANT_TOK, "tokenizer.ggml.merges", REMOVE);
    const change c[1] = {{"tokenizer.ggml.merges", {.type = HM_GGUF_ARRAY, .arr = {HM_GGUF_STRING, 0, NULL}}}};
    refuse("qwen3moe", c, 1, WANT_TOK, "tokenizer.ggml.merges");
    float sc[10] = {0};
    sc[4] = NAN;
    const change d[1] = {{"tokenizer.ggml.scores", {.type = HM_GGUF_ARRAY, .arr = {HM_GGUF_F32, 10, sc}}}};
    refuse("gemma4", d, 1, WANT_TOK, "tokenizer.ggml.scores[4]");
}

static void test_floats(void) {
    static const char *const bad_names[] = {"nan", "inf", "-inf", "0", "-1"};
    const double bad[] = {NAN, INFINITY, -INFINITY, 0.0, -1.0};
    for (int i = 0; i < 5; i++) {
        fprintf(stderr, "float value %s\n", bad_names[i]);
        REFUSE("qwen3moe", WANT_MODEL, "qwen3moe.attention.layer_norm_rms_epsilon", F32(bad[i]));
        REFUSE("qwen3moe", WANT_MODEL, "qwen3moe.rope.freq_base", F32(bad[i]));
        REFUSE("qwen35moe", WANT_MODEL, "qwen35moe.rope.freq_base", F32(bad[i]));
        REFUSE("gemma4", WANT_MODEL, "gemma4.rope.freq_base", F32(bad[i]));
        REFUSE("gemma4", WANT_MODEL, "gemma4.rope.freq_base_swa", F32(bad[i]));
        REFUSE("gemma4", WANT_MODEL, "gemma4.attention.layer_norm_rms_epsilon", F32(bad[i]));
    }
    REFUSE("gemma4", WANT_MODEL, "gemma4.final_logit_softcapping", F32(INFINITY));
    REFUSE("gemma4", WANT_MODEL, "gemma4.final_logit_softcapping", F32(NAN));
    REFUSE("qwen3moe", WANT_MODEL, "qwen3moe.attention.layer_norm_rms_epsilon", F32(2.0));
}

static void test_ints(void) {
    REFUSE("qwen3moe", WANT_MODEL, "qwen3moe.block_count", U32(1u << 20));
    REFUSE("qwen3moe", WANT_MODEL, "qwen3moe.expert_count", U32(1u << 20));
    REFUSE("qwen3moe", WANT_MODEL, "qwen3moe.embedding_length", U32(1u << 30));
    REFUSE("qwen3moe", WANT_MODEL, "qwen3moe.attention.head_count", U32(0));
    REFUSE("qwen3moe", WANT_MODEL, "qwen3moe.context_length", I32(-1));
    /* 2 * group_count * state_size would overflow int32 */
    REFUSE("qwen35moe", WANT_MODEL, "qwen35moe.ssm.state_size", U32(1u << 17));
    REFUSE("qwen35moe", WANT_MODEL, "qwen35moe.ssm.group_count", U32(1u << 17));
    REFUSE("qwen35moe", WANT_MODEL, "qwen35moe.ssm.conv_kernel", U32(1u << 30));
    REFUSE("gemma4", WANT_MODEL, "gemma4.attention.sliding_window", U32(0));
    const int32_t ff[2] = {8, 1 << 30};
    const change c[1] = {{"gemma4.feed_forward_length", {.type = HM_GGUF_ARRAY, .arr = {HM_GGUF_I32, 2, ff}}}};
    refuse("gemma4", c, 1, WANT_MODEL, "gemma4.feed_forward_length[1]");
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/hm_test_keys_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_seeds_load();
    test_token_ids();
    test_merges();
    test_floats();
    test_ints();
    rmdir(tmpdir);
    return test_done();
}
