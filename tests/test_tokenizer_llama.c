/* test_tokenizer_llama.c - byte-level BPE pre-tokenizers against llama.cpp's tokenizer.
 *
 * One vocabulary, written as a GGUF once per tokenizer.ggml.pre name: the 256 byte tokens in
 * GPT-2's order, one token per merge of tests/fixtures/llama_tok/merges.txt (learnt across
 * pre-tokenizer boundaries by tools/fixtures/make_bpe_merges.py, so a different split gives other
 * ids), then the special tokens below (control). For every text of tests/data/tokenizer_mixed.json
 * (code, numbers, CJK, emoji, whitespace runs, contractions, other scripts, special tokens) the ids
 * with special-token parsing on and off, the ids of one text with BOS/EOS added as the file says,
 * the text those ids detokenise to (special tokens not rendered, user-defined ones rendered), and
 * the set of end-of-generation tokens must be those llama.cpp gave for the same file
 * (tests/fixtures/llama_tok/<pre>.json: llama_tokenize and llama_vocab_is_eog of llama.cpp
 * d32676d, recorded as tests/fixtures/llama_tok/README.md says). An unknown pre-tokenizer is an
 * error that names it.
 *
 * With HM_LLAMA_MODELS=DIR also llama.cpp's own vocab files with their expected ids.
 *
 * `test_tokenizer_llama --write DIR` writes the GGUF files into DIR and exits (for recording). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "hotmoe.h"
#include "test.h"

/* the tokenizer.ggml.pre names checked (each has a fixture) */
static const char *const pres[] = {"gpt-4o", "llama4",      "glm4",  "chatglm-bpe", "deepseek-v3", "joyai-llm", "deepseek-llm",
                                   "qwen2",  "qwen35",      "llama-bpe", "olmo",    "gpt-2", "default"};

static const char *const specials[] = {
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|start|>", "<|channel|>", "<|message|>", "<|end|>",
    "<|return|>", "<|call|>", "<|constrain|>", "[gMASK]", "<sop>", "<|user|>", "<|assistant|>", "<|system|>",
    "<|observation|>", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"};
#define N_SPEC (sizeof specials / sizeof specials[0])

/* GPT-2's bytes_to_unicode order: the byte of token i */
static void byte_order(uint8_t order[256]) {
    int n = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int b = 0; b < 256; b++) {
            bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
            if (printable == (pass == 0)) order[n++] = (uint8_t)b;
        }
}

static void put_cp(char **o, uint32_t c) {
    if (c < 0x80) *(*o)++ = (char)c;
    else *(*o)++ = (char)(0xc0 | (c >> 6)), *(*o)++ = (char)(0x80 | (c & 0x3f));
}

/* Write the vocabulary with pre-tokenizer `pre` to path. false when the fixture is unreadable. */
static bool write_vocab(const char *path, const char *pre) {
    FILE *f = fopen(test_src_path("tests/fixtures/llama_tok/merges.txt"), "r");
    if (!f) return false;
    size_t cap = 2048, nm = 0;
    char **merges = malloc(cap * sizeof *merges), line[1024];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (!*line) continue;
        if (nm == cap) merges = realloc(merges, (cap *= 2) * sizeof *merges);
        merges[nm++] = strdup(line);
    }
    fclose(f);
    size_t n = 256 + nm + N_SPEC;
    char **toks = calloc(n, sizeof *toks);
    int32_t *types = calloc(n, sizeof *types);
    uint8_t order[256];
    byte_order(order);
    uint32_t cp[256];
    for (int b = 0, extra = 0; b < 256; b++) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        cp[b] = printable ? (uint32_t)b : 256u + (uint32_t)extra++;
    }
    for (int i = 0; i < 256; i++) {
        char buf[4], *o = buf;
        put_cp(&o, cp[order[i]]);
        *o = 0;
        toks[i] = strdup(buf);
        types[i] = 1;
    }
    size_t nt = 256;
    for (size_t m = 0; m < nm; m++) { /* the merged token, "a b" without the space, unless it exists */
        const char *sp = strchr(merges[m], ' ');
        size_t la = (size_t)(sp - merges[m]);
        char *tok = malloc(strlen(merges[m]));
        memcpy(tok, merges[m], la);
        strcpy(tok + la, sp + 1);
        bool dup = false;
        for (size_t k = 0; k < nt && !dup; k++) dup = strcmp(toks[k], tok) == 0;
        if (dup) {
            free(tok);
            continue;
        }
        toks[nt] = tok;
        types[nt++] = 1;
    }
    size_t first_spec = nt;
    for (size_t s = 0; s < N_SPEC; s++) {
        toks[nt] = strdup(specials[s]);
        types[nt++] = 3;
    }
    n = nt;
    hm_gguf_writer *w;
    hm_err err = {{0}};
    CHECK(hm_gguf_writer_open(&w, path, 0, &err) == HM_OK);
    /* the keys llama.cpp's own vocab-only files carry (models/ggml-vocab-gpt-2.gguf) */
    hm_gguf_writer_set_str(w, "general.architecture", "gpt2");
    hm_gguf_writer_set_str(w, "general.name", "hotmoe pre-tokenizer test");
    hm_gguf_writer_set_u32(w, "gpt2.block_count", 1);
    hm_gguf_writer_set_u32(w, "gpt2.context_length", 1024);
    hm_gguf_writer_set_u32(w, "gpt2.embedding_length", 64);
    hm_gguf_writer_set_u32(w, "gpt2.feed_forward_length", 256);
    hm_gguf_writer_set_u32(w, "gpt2.attention.head_count", 1);
    hm_gguf_writer_set_f32(w, "gpt2.attention.layer_norm_epsilon", 1e-5f);
    hm_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    hm_gguf_writer_set_str(w, "tokenizer.ggml.pre", pre);
    hm_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, (uint64_t)n);
    hm_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", HM_GGUF_I32, types, (uint64_t)n);
    hm_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merges, (uint64_t)nm);
    /* bos <｜begin▁of▁sentence｜>, eos <|endoftext|>; add_bos_token absent: the pre's default */
    hm_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)(first_spec + 16));
    hm_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)first_spec);
    /* GLM-4.5's: eot <|user|>, eom <|observation|> */
    hm_gguf_writer_set_u32(w, "tokenizer.ggml.eot_token_id", (uint32_t)(first_spec + 12));
    hm_gguf_writer_set_u32(w, "tokenizer.ggml.eom_token_id", (uint32_t)(first_spec + 15));
    CHECK(hm_gguf_writer_begin_data(w) == HM_OK);
    CHECK(hm_gguf_writer_finish(w) == HM_OK);
    for (size_t i = 0; i < n; i++) free(toks[i]);
    for (size_t m = 0; m < nm; m++) free(merges[m]);
    free(toks);
    free(types);
    free(merges);
    return true;
}

/* ids of text, compared with the fixture's array; returns whether they are identical */
static bool same_ids(const hm_tokenizer *t, const char *text, bool add_bos, bool special, json_t *want,
                     const char *pre, size_t line) {
    hm_tokenize_opts o = {.add_bos = add_bos, .parse_special = special};
    int32_t *ids = NULL;
    size_t n = 0;
    hm_err err = {{0}};
    if (hm_tokenize(t, text, strlen(text), &o, &ids, &n, &err) != HM_OK) {
        CHECKF(0, "%s: text %zu: %s", pre, line, err.msg);
        return false;
    }
    bool ok = json_array_size(want) == n;
    for (size_t i = 0; ok && i < n; i++) ok = json_integer_value(json_array_get(want, i)) == ids[i];
    if (!ok) {
        fprintf(stderr, "%s: text %zu (special %d, bos %d):\n  llama.cpp:", pre, line, special, add_bos);
        for (size_t i = 0; i < json_array_size(want); i++)
            fprintf(stderr, " %lld", (long long)json_integer_value(json_array_get(want, i)));
        fprintf(stderr, "\n  hotmoe:   ");
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
    }
    free(ids);
    return ok;
}

static void check_pre(const char *dir, const char *pre, json_t *texts) {
    char path[512], fix[512];
    snprintf(path, sizeof path, "%s/%s.gguf", dir, pre);
    snprintf(fix, sizeof fix, "tests/fixtures/llama_tok/%s.json", pre);
    CHECK(write_vocab(path, pre));
    json_error_t je;
    json_t *ref = json_load_file(test_src_path(fix), 0, &je);
    CHECKF(ref, "%s: %s", fix, je.text);
    if (!ref) return;
    hm_tokenizer *t = NULL;
    hm_err err = {{0}};
    CHECKF(hm_tokenizer_open(&t, path, &err) == HM_OK, "%s: %s", pre, err.msg);
    if (!t) {
        json_decref(ref);
        return;
    }
    CHECK(hm_tokenizer_pre(t) && *hm_tokenizer_pre(t));
    json_t *ids = json_object_get(ref, "ids"), *plain = json_object_get(ref, "ids_plain");
    CHECK(json_array_size(ids) == json_array_size(texts) && json_array_size(plain) == json_array_size(texts));
    size_t same = 0, same_plain = 0, n_tok = 0;
    for (size_t i = 0; i < json_array_size(texts); i++) {
        const char *s = json_string_value(json_array_get(texts, i));
        n_tok += json_array_size(json_array_get(ids, i));
        same += same_ids(t, s, false, true, json_array_get(ids, i), pre, i);
        same_plain += same_ids(t, s, false, false, json_array_get(plain, i), pre, i);
    }
    CHECKF(same == json_array_size(texts) && same_plain == same, "%s: %zu + %zu of %zu texts", pre, same, same_plain,
           json_array_size(texts));
    /* back to text as a reply streams out (special tokens not rendered, user-defined ones are:
     * gpt-oss's Harmony markers): llama_token_to_piece(special = false) of each id, joined */
    json_t *want_text = json_object_get(ref, "text");
    size_t same_text = 0;
    for (size_t i = 0; i < json_array_size(texts); i++) {
        json_t *ja = json_array_get(ids, i);
        size_t n = json_array_size(ja), len = 0;
        int32_t *v = malloc((n + 1) * sizeof *v);
        for (size_t k = 0; k < n; k++) v[k] = (int32_t)json_integer_value(json_array_get(ja, k));
        char *out = NULL;
        CHECK(hm_detokenize(t, v, n, false, &out, &len, &err) == HM_OK);
        const char *w = json_string_value(json_array_get(want_text, i));
        bool ok = out && w && len == strlen(w) && memcmp(out, w, len) == 0;
        CHECKF(ok, "%s: text %zu detokenised:\n  llama.cpp: %s\n  hotmoe:    %s", pre, i, w ? w : "(none)",
               out ? out : "(none)");
        same_text += ok;
        free(out);
        free(v);
    }
    /* "Hello world" with the file's add_bos (add_special in llama.cpp) */
    hm_tokenize_opts def;
    hm_tokenize_opts_default(t, &def);
    CHECK(same_ids(t, "Hello world", def.add_bos, true, json_object_get(ref, "ids_add_special"), pre, 0));
    /* end of generation: the same tokens */
    json_t *eog = json_object_get(ref, "eog");
    size_t n_eog = 0;
    bool eog_ok = true;
    for (int32_t id = 0; id < hm_tokenizer_n_vocab(t); id++) {
        bool want = false;
        for (size_t k = 0; k < json_array_size(eog); k++) want |= json_integer_value(json_array_get(eog, k)) == id;
        n_eog += want;
        if (want != hm_tokenizer_is_eog(t, id)) {
            size_t l;
            const char *txt = hm_token_text(t, id, &l);
            CHECKF(0, "%s: token %d '%.*s': llama.cpp eog %d, hotmoe %d", pre, id, (int)l, txt, want,
                   hm_tokenizer_is_eog(t, id));
            eog_ok = false;
        }
    }
    fprintf(stderr, "%-13s %zu/%zu texts identical to llama.cpp (%zu tokens), %zu/%zu without special parsing, "
                    "%zu/%zu detokenised alike, %zu eog tokens %s\n", pre, same, json_array_size(texts), n_tok, same_plain,
            json_array_size(texts), same_text, json_array_size(texts), n_eog, eog_ok ? "the same" : "DIFFER");
    hm_tokenizer_close(t);
    json_decref(ref);
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long l = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)l + 1);
    *n = fread(b, 1, (size_t)l, f);
    b[*n] = 0;
    fclose(f);
    return b;
}

/* With HM_LLAMA_MODELS=DIR (a llama.cpp checkout's models/): its real vocabularies that come with
 * expected ids (ggml-vocab-NAME.gguf + .gguf.inp/.gguf.out, what llama.cpp's test-tokenizer-0
 * checks: add_special and parse_special off) must tokenize the same here. */
static void check_llama_vocab_files(const char *dir) {
    static const char *const names[] = {"gpt-2", "deepseek-llm", "llama-spm", "phi-3", "llama-bpe", "qwen2",
                                        "qwen35", "gemma-4", "deepseek-coder", "falcon", "mpt", "starcoder"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        char path[1024], pin[1100], pout[1100];
        snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf", dir, names[k]);
        snprintf(pin, sizeof pin, "%s.inp", path);
        snprintf(pout, sizeof pout, "%s.out", path);
        size_t ni, no;
        char *in = slurp(pin, &ni), *out = slurp(pout, &no);
        hm_tokenizer *t = NULL;
        hm_err err = {{0}};
        bool have = in && out && access(path, R_OK) == 0;
        if (!have || hm_tokenizer_open(&t, path, &err) != HM_OK) {
            fprintf(stderr, "%-14s (llama.cpp vocab) skipped: %s\n", names[k], have ? err.msg : "no file");
            free(in);
            free(out);
            continue;
        }
        static const char sep[] = "\n__ggml_vocab_test__\n";
        size_t n_all = 0, n_same = 0;
        char *p = in, *o = out;
        while (p && *o) {
            char *e = strstr(p, sep), *oe = strchr(o, '\n');
            size_t len = e ? (size_t)(e - p) : strlen(p);
            if (oe) *oe = 0;
            hm_tokenize_opts opt = {.add_bos = false, .parse_special = false};
            int32_t *ids = NULL;
            size_t n = 0;
            bool ok = hm_tokenize(t, p, len, &opt, &ids, &n, &err) == HM_OK;
            char *q = o;
            for (size_t i = 0; ok && i < n; i++) ok = strtol(q, &q, 10) == ids[i];
            while (ok && *q == ' ') q++;
            ok = ok && *q == 0;
            CHECKF(ok, "llama.cpp's ggml-vocab-%s.gguf, text %zu", names[k], n_all);
            n_same += ok;
            n_all++;
            free(ids);
            p = e ? e + sizeof sep - 1 : NULL;
            o = oe ? oe + 1 : o + strlen(o);
        }
        fprintf(stderr, "%-14s (llama.cpp vocab) %zu/%zu texts identical to its .out\n", names[k], n_same, n_all);
        hm_tokenizer_close(t);
        free(in);
        free(out);
    }
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--write") == 0) {
        for (size_t i = 0; i < sizeof pres / sizeof pres[0]; i++) {
            char path[512];
            snprintf(path, sizeof path, "%s/%s.gguf", argv[2], pres[i]);
            if (!write_vocab(path, pres[i])) {
                fprintf(stderr, "cannot read the fixture (set HM_SOURCE_DIR)\n");
                return 1;
            }
        }
        return test_done();
    }
    char dir[] = "/tmp/hm_test_tokllama_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    json_error_t je;
    json_t *texts = json_load_file(test_src_path("tests/data/tokenizer_mixed.json"), 0, &je);
    CHECKF(texts && json_array_size(texts) > 50, "tests/data/tokenizer_mixed.json: %s", je.text);
    for (size_t i = 0; texts && i < sizeof pres / sizeof pres[0]; i++) check_pre(dir, pres[i], texts);
    if (getenv("HM_LLAMA_MODELS")) check_llama_vocab_files(getenv("HM_LLAMA_MODELS"));
    else fprintf(stderr, "set HM_LLAMA_MODELS to a llama.cpp checkout's models/ to check its vocab files too\n");
    /* an unknown pre-tokenizer: refused, naming it and the known ones */
    char path[600];
    snprintf(path, sizeof path, "%s/unknown.gguf", dir);
    CHECK(write_vocab(path, "no-such-pre"));
    hm_tokenizer *t = NULL;
    hm_err err = {{0}};
    CHECK(hm_tokenizer_open(&t, path, &err) == HM_ERR_UNSUPPORTED && !t);
    CHECKF(strstr(err.msg, "'no-such-pre'") && strstr(err.msg, "gpt-4o") && strstr(err.msg, "glm4"), "%s", err.msg);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    json_decref(texts);
    return test_done();
}
