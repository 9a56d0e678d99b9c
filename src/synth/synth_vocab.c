/* synth_vocab.c - tokenizer keys of a synthesised model.
 *
 * Built-in vocabulary (no --tokenizer): a small, valid byte-level BPE in GPT-2's conventions,
 * the way Qwen's GGUF files are laid out, so llama.cpp and hotmoe tokenize any text with it:
 *   ids 0..255    the 256 byte tokens, in GPT-2's bytes_to_unicode order (printable bytes map to
 *                 themselves, the rest to U+0100 + n; id i is the i-th of that list, "!" = 0);
 *   then          one token per merge below, in merge order (type normal);
 *   then          <|endoftext|>, <|im_start|>, <|im_end|> (type control);
 *   up to n_vocab "[PAD<id>]" tokens of type unused, as llama.cpp's converter pads Qwen vocabs.
 * tokenizer.ggml.model "gpt2", pre "qwen2"; bos = pad = <|endoftext|>, eos = <|im_end|>,
 * add_bos_token false (Qwen3's settings); a ChatML chat template.
 *
 * With --tokenizer the tokenizer module's importer writes the real vocabulary, padded to the
 * preset's n_vocab (Qwen3: 151669 tokens padded to 151936 embedding rows). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tokenizer/hf_import.h"
#include "synth_impl.h"

/* Merges as raw byte strings (left, right); each side is a byte or the result of an earlier
 * merge, and every result is new (test_synth checks both). */
static const char *const merges[][2] = {
    {" ", "t"},  {" ", "a"},  {"h", "e"},   {"i", "n"},  {"r", "e"},   {"o", "n"},  {" t", "he"},
    {"e", "r"},  {" ", "s"},  {"a", "t"},   {" ", "w"},  {" ", "o"},   {"e", "n"},  {" ", "c"},
    {"i", "t"},  {"i", "s"},  {"a", "n"},   {"o", "r"},  {"e", "s"},   {" ", "b"},  {"e", "d"},
    {" ", "f"},  {"in", "g"}, {" ", "p"},   {"o", "u"},  {" a", "n"},  {"a", "l"},  {"a", "r"},
    {" t", "o"}, {" ", "m"},  {" o", "f"},  {" ", "in"}, {" ", "d"},   {" ", "h"},  {" an", "d"},
    {"\n", "\n"}, {" ", " "}, {"l", "l"},   {" ", "l"},  {" ", "is"},  {" ", "it"}, {" ", "re"},
    {" ", "I"},  {"o", "m"},  {"t", "h"},   {" ", "th"},  {" w", "h"},  {" ", "S"},  {" ", "T"},
};
#define N_MERGES ((int32_t)(sizeof merges / sizeof merges[0]))

static const char *const specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
#define N_SPECIALS 3

static const char chatml_template[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/* GPT-2's bytes_to_unicode: order[i] = the byte of token i, cp[b] = the code point of byte b. */
static void byte_table(uint8_t order[256], uint32_t cp[256]) {
    int n = 0, extra = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        if (printable) order[n++] = (uint8_t)b, cp[b] = (uint32_t)b;
    }
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        if (!printable) order[n++] = (uint8_t)b, cp[b] = 256u + (uint32_t)extra++;
    }
}

/* UTF-8 of the GPT-2 unicode form of raw bytes s into dst (room for 2 * strlen(s) + 1). */
static void encode(const uint32_t cp[256], const char *s, char *dst) {
    for (; *s; s++) {
        uint32_t c = cp[(unsigned char)*s];
        if (c < 0x80) *dst++ = (char)c;
        else *dst++ = (char)(0xc0 | (c >> 6)), *dst++ = (char)(0x80 | (c & 0x3f));
    }
    *dst = 0;
}

typedef struct vocab {
    char **tok; /* [n] owned strings */
    int32_t *type;
    char **merge; /* [N_MERGES] owned */
    int32_t n;
} vocab;

static void vocab_free(vocab *v) {
    if (v->tok)
        for (int32_t i = 0; i < v->n; i++) free(v->tok[i]);
    if (v->merge)
        for (int32_t i = 0; i < N_MERGES; i++) free(v->merge[i]);
    free(v->tok);
    free(v->type);
    free(v->merge);
}

static int32_t find_tok(const vocab *v, int32_t n, const char *s) {
    for (int32_t i = 0; i < n; i++)
        if (strcmp(v->tok[i], s) == 0) return i;
    return -1;
}

static hm_status build_vocab(vocab *v, int32_t n_vocab, hm_err *err) {
    enum { NORMAL = 1, CONTROL = 3, UNUSED = 5 };
    int32_t n_real = 256 + N_MERGES + N_SPECIALS;
    if (n_vocab < n_real)
        return hm_errf(err, HM_ERR_ARG, "synth: n_vocab %d is smaller than the built-in vocabulary (%d)", n_vocab, n_real);
    memset(v, 0, sizeof *v);
    v->tok = calloc((size_t)n_vocab, sizeof *v->tok);
    v->type = calloc((size_t)n_vocab, sizeof *v->type);
    v->merge = calloc(N_MERGES, sizeof *v->merge);
    if (!v->tok || !v->type || !v->merge) goto oom;
    uint8_t order[256];
    uint32_t cp[256];
    byte_table(order, cp);
    char buf[128];
    for (int i = 0; i < 256; i++, v->n++) {
        char raw[2] = {(char)order[i], 0};
        if (order[i] == 0) { /* encode() stops at NUL: byte 0 maps to U+0100 */
            buf[0] = (char)0xc4, buf[1] = (char)0x80, buf[2] = 0;
        } else {
            encode(cp, raw, buf);
        }
        if (!(v->tok[i] = strdup(buf))) goto oom;
        v->type[i] = NORMAL;
    }
    for (int32_t m = 0; m < N_MERGES; m++, v->n++) {
        char l[32], r[32], joined[64];
        encode(cp, merges[m][0], l);
        encode(cp, merges[m][1], r);
        snprintf(buf, sizeof buf, "%s %s", l, r);
        snprintf(joined, sizeof joined, "%s%s", l, r);
        /* static data: a bad merge list is a bug, caught by test_synth */
        HM_ASSERT(find_tok(v, v->n, l) >= 0 && find_tok(v, v->n, r) >= 0 && find_tok(v, v->n, joined) < 0);
        if (!(v->merge[m] = strdup(buf)) || !(v->tok[v->n] = strdup(joined))) goto oom;
        v->type[v->n] = NORMAL;
    }
    for (int i = 0; i < N_SPECIALS; i++, v->n++) {
        if (!(v->tok[v->n] = strdup(specials[i]))) goto oom;
        v->type[v->n] = CONTROL;
    }
    for (; v->n < n_vocab; v->n++) {
        snprintf(buf, sizeof buf, "[PAD%d]", v->n);
        if (!(v->tok[v->n] = strdup(buf))) goto oom;
        v->type[v->n] = UNUSED;
    }
    return HM_OK;
oom:
    vocab_free(v);
    memset(v, 0, sizeof *v);
    return hm_errf(err, HM_ERR_NOMEM, "synth: out of memory building the vocabulary");
}

static hm_status write_builtin(hm_gguf_writer *w, int32_t n_vocab, hm_err *err) {
    vocab v;
    hm_status st = build_vocab(&v, n_vocab, err);
    if (st) return st;
    uint32_t eot = (uint32_t)(256 + N_MERGES), im_end = eot + 2;
    if (!st) st = hm_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    if (!st) st = hm_gguf_writer_set_str(w, "tokenizer.ggml.pre", "qwen2");
    if (!st) st = hm_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v.tok, (uint64_t)v.n);
    if (!st) st = hm_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", HM_GGUF_I32, v.type, (uint64_t)v.n);
    if (!st) st = hm_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v.merge, N_MERGES);
    if (!st) st = hm_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", im_end);
    if (!st) st = hm_gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", eot);
    if (!st) st = hm_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", eot);
    if (!st) st = hm_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false);
    if (!st) st = hm_gguf_writer_set_str(w, "tokenizer.chat_template", chatml_template);
    vocab_free(&v);
    return st; /* the writer reported the message to err */
}

hm_status hm_synth_write_vocab(hm_gguf_writer *w, int32_t n_vocab, const char *tokenizer_json,
                               const char *tokenizer_config, hm_err *err) {
    if (!tokenizer_json) return write_builtin(w, n_vocab, err);
    hm_hf_import_opts o = {.pad_vocab_to = n_vocab, .pre = NULL};
    int32_t n = 0;
    hm_status st = hm_tokenizer_import_hf(w, tokenizer_json, tokenizer_config, &o, &n, err);
    if (st) return st;
    if (n != n_vocab)
        return hm_errf(err, HM_ERR_ARG, "synth: %s has %d tokens but the preset's vocabulary has %d rows",
                       tokenizer_json, n, n_vocab);
    return HM_OK;
}
