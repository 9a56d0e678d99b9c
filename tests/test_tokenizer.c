/* test_tokenizer.c - the tokenizer on hand-built vocabularies (no fixtures): byte-level BPE merge
 * order and tie-breaking, pre-tokenizer choice, special tokens, the streaming UTF-8 holdback,
 * UTF-8 repair, NFC, and SentencePiece merges by score with byte fallback. Every expected id list
 * is derived by hand in the comments. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "hotmoe.h"
#include "test.h"
#include "tokenizer/unicode.h"

static char tmpdir[] = "/tmp/hm_test_tok_XXXXXX";

/* byte-level encoding of raw bytes s (GPT-2 map), into a static-ish buffer owned by the caller */
static char *bl(const char *s) {
    char *o = malloc(strlen(s) * 2 + 1);
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) n += (size_t)hm_utf8_encode(hm_byte_to_cp(*p), o + n);
    o[n] = 0;
    return o;
}

static int ids_eq(const int32_t *got, size_t n, const int32_t *want, size_t m) {
    if (n != m) return 0;
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i]) return 0;
    return 1;
}

static void check_tok(const hm_tokenizer *t, const char *text, bool special, const int32_t *want, size_t m,
                      int line) {
    hm_tokenize_opts o = {.add_bos = false, .parse_special = special};
    int32_t *ids = NULL;
    size_t n = 0;
    hm_err err = {{0}};
    CHECK(hm_tokenize(t, text, strlen(text), &o, &ids, &n, &err) == HM_OK);
    CHECKF(ids_eq(ids, n, want, m), "line %d: '%s' gave %zu ids (first %d)", line, text, n, n ? ids[0] : -1);
    free(ids);
}
#define TOK(t, text, special, ...)                                                          \
    do {                                                                                    \
        const int32_t want_[] = {__VA_ARGS__};                                              \
        check_tok(t, text, special, want_, sizeof want_ / sizeof want_[0], __LINE__);       \
    } while (0)

/* Write a gpt2 vocabulary: raw tokens (byte-level encoded here unless special), merges of raw
 * "left right". */
static const char *write_bpe(const char *name, const char *pre, const char *const *raw, const int32_t *types,
                             int n, const char *const *merges_raw, int nm) {
    static char path[256];
    snprintf(path, sizeof path, "%s/%s.gguf", tmpdir, name);
    hm_gguf_writer *w;
    hm_err err;
    CHECK(hm_gguf_writer_open(&w, path, 0, &err) == HM_OK);
    char **toks = calloc((size_t)n, sizeof *toks), **merges = calloc((size_t)nm + 1, sizeof *merges);
    for (int i = 0; i < n; i++) toks[i] = types[i] == 1 ? bl(raw[i]) : strdup(raw[i]);
    for (int i = 0; i < nm; i++) {
        const char *sp = strchr(merges_raw[i], ' ');
        char left[64];
        memcpy(left, merges_raw[i], (size_t)(sp - merges_raw[i]));
        left[sp - merges_raw[i]] = 0;
        char *a = bl(left), *b = bl(sp + 1);
        merges[i] = malloc(strlen(a) + strlen(b) + 2);
        sprintf(merges[i], "%s %s", a, b);
        free(a);
        free(b);
    }
    hm_gguf_writer_set_str(w, "general.architecture", "vocab-only");
    hm_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    hm_gguf_writer_set_str(w, "tokenizer.ggml.pre", pre);
    hm_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, (uint64_t)n);
    hm_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", HM_GGUF_I32, types, (uint64_t)n);
    hm_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merges, (uint64_t)nm);
    hm_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)(n - 2));
    CHECK(hm_gguf_writer_begin_data(w) == HM_OK);
    CHECK(hm_gguf_writer_finish(w) == HM_OK);
    for (int i = 0; i < n; i++) free(toks[i]);
    for (int i = 0; i < nm; i++) free(merges[i]);
    free(toks);
    free(merges);
    return path;
}

static void test_bpe(void) {
    /* ids:             0    1    2    3    4     5     6      7     8    9    10   11    12 */
    const char *raw[] = {"a", "b", "c", " ", "ab", "bc", "abc", " a", "aa", "1", "2", "3", "12",
                         "<|end|>", "<u>"};
    const int32_t ty[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 4};
    /* ranks: 0 "b c", 1 "a b", 2 "a bc", 3 "  a" (space+a), 4 "ab c", 5 "a a", 6 "1 2" */
    const char *merges[] = {"b c", "a b", "a bc", "  a", "ab c", "a a", "1 2"};
    hm_err err = {{0}};
    hm_tokenizer *t = NULL;
    const char *p = write_bpe("bpe_gpt2", "gpt-2", raw, ty, 15, merges, 7);
    CHECKF(hm_tokenizer_open(&t, p, &err) == HM_OK, "%s", err.msg);
    if (!t) return;
    CHECK(hm_tokenizer_n_vocab(t) == 15);
    CHECK(strcmp(hm_tokenizer_pre(t), "gpt-2") == 0);
    /* "abc": (b,c) rank 0 first -> a bc -> (a,bc) rank 2 -> abc */
    TOK(t, "abc", true, 6);
    /* " abc" is one gpt-2 piece: bytes ' ' a b c; bc (0), then a+bc (2) beats ' '+a (3) -> ' ' abc */
    TOK(t, "abc abc", true, 6, 3, 6);
    /* "aab": (a,b) rank 1 -> a ab; (a,ab) not a merge */
    TOK(t, "aab", true, 0, 4);
    /* "aaa": both (a,a) pairs have rank 5; the leftmost merges first -> aa a */
    TOK(t, "aaa", true, 8, 0);
    /* gpt-2 keeps digit runs together: 123 -> (1,2) -> 12 3 */
    TOK(t, "123", true, 12, 11);
    /* special tokens, leftmost-longest; control needs parse_special, user-defined does not */
    TOK(t, "abc<|end|>abc", true, 6, 13, 6);
    TOK(t, "<u>a", false, 14, 0);
    {
        hm_tokenize_opts o = {.add_bos = false, .parse_special = false};
        int32_t *ids;
        size_t n;
        CHECK(hm_tokenize(t, "<|end|>", 7, &o, &ids, &n, &err) == HM_OK);
        int found = 0;
        for (size_t i = 0; i < n; i++) found |= ids[i] == 13;
        CHECK(!found);
        free(ids);
    }
    CHECK(hm_tokenizer_is_eog(t, 13)); /* eos_token_id = n - 2 */
    /* pieces */
    size_t l;
    const char *s = hm_token_piece(t, 7, &l);
    CHECK(l == 2 && memcmp(s, " a", 2) == 0);
    /* empty input, invalid UTF-8 (bytes without tokens are dropped, never a crash) */
    {
        int32_t *ids;
        size_t n;
        CHECK(hm_tokenize(t, "", 0, NULL, &ids, &n, &err) == HM_OK && n == 0);
        free(ids);
        CHECK(hm_tokenize(t, "a\xff\xfe" "b\xe4", 5, NULL, &ids, &n, &err) == HM_OK);
        free(ids);
    }
    hm_tokenizer_close(t);

    /* same vocabulary with Qwen's pre-tokenizer: digits are split one by one, so no 12 */
    p = write_bpe("bpe_qwen2", "qwen2", raw, ty, 15, merges, 7);
    CHECKF(hm_tokenizer_open(&t, p, &err) == HM_OK, "%s", err.msg);
    if (!t) return;
    TOK(t, "123", true, 9, 10, 11);
    TOK(t, "abc abc", true, 6, 3, 6);
    hm_tokenizer_close(t);

    /* every known pre-tokenizer compiles and splits mixed text without trouble */
    const char *pres[] = {"qwen2", "qwen35", "llama-bpe", "llama3", "deepseek-llm", "deepseek-v3",
                          "gpt-2", "default"};
    for (size_t i = 0; i < sizeof pres / sizeof pres[0]; i++) {
        p = write_bpe("bpe_pre", pres[i], raw, ty, 15, merges, 7);
        CHECKF(hm_tokenizer_open(&t, p, &err) == HM_OK, "%s: %s", pres[i], err.msg);
        if (!t) continue;
        const char *mixed = "abc 123  \n\n\t x's 你好 café 😀 <|end|> ab\r\n";
        int32_t *ids;
        size_t n;
        CHECK(hm_tokenize(t, mixed, strlen(mixed), NULL, &ids, &n, &err) == HM_OK && n > 0);
        free(ids);
        /* random bytes (mostly invalid UTF-8): must never fail or crash */
        uint32_t rng = 12345u + (uint32_t)i;
        char junk[64];
        int ok = 1;
        for (int k = 0; k < 200; k++) {
            size_t len = (size_t)(k % 64);
            for (size_t b = 0; b < len; b++) {
                rng = rng * 1664525u + 1013904223u;
                junk[b] = (char)(rng >> 24);
            }
            ok &= hm_tokenize(t, junk, len, NULL, &ids, &n, &err) == HM_OK;
            free(ids);
        }
        CHECK(ok);
        hm_tokenizer_close(t);
        t = NULL;
    }

    /* unknown pre-tokenizer: an error naming it */
    p = write_bpe("bpe_bad", "klingon", raw, ty, 15, merges, 7);
    CHECK(hm_tokenizer_open(&t, p, &err) == HM_ERR_UNSUPPORTED && strstr(err.msg, "klingon"));
}

static void test_stream(void) {
    /* vocabulary of single bytes: E4 BD A0 = U+4F60, plus 'a' */
    const char *raw[] = {"\xe4", "\xbd", "\xa0", "a", "x", "y"};
    const int32_t ty[] = {1, 1, 1, 1, 1, 1};
    hm_err err = {{0}};
    hm_tokenizer *t = NULL;
    const char *no_merge[] = {"x q"}; /* never applies ("q" is no token), but a BPE vocabulary needs merges */
    const char *p = write_bpe("bytes", "gpt-2", raw, ty, 6, no_merge, 1);
    CHECKF(hm_tokenizer_open(&t, p, &err) == HM_OK, "%s", err.msg);
    if (!t) return;
    hm_detok *d;
    CHECK(hm_detok_open(&d, t, false, &err) == HM_OK);
    size_t l;
    const char *s = hm_detok_push(d, 0, &l);
    CHECK(l == 0);
    s = hm_detok_push(d, 1, &l);
    CHECK(l == 0);
    s = hm_detok_push(d, 2, &l);
    CHECK(l == 3 && memcmp(s, "\xe4\xbd\xa0", 3) == 0);
    s = hm_detok_push(d, 3, &l);
    CHECK(l == 1 && s[0] == 'a');
    /* E4 then 'a': the held byte can never complete -> U+FFFD, then 'a' */
    s = hm_detok_push(d, 0, &l);
    CHECK(l == 0);
    s = hm_detok_push(d, 3, &l);
    CHECK(l == 4 && memcmp(s, "\xef\xbf\xbd" "a", 4) == 0);
    /* a stray continuation byte is U+FFFD at once */
    s = hm_detok_push(d, 1, &l);
    CHECK(l == 3 && memcmp(s, "\xef\xbf\xbd", 3) == 0);
    /* end of stream inside a character */
    hm_detok_push(d, 0, &l);
    hm_detok_push(d, 1, &l);
    s = hm_detok_flush(d, &l);
    CHECK(l == 3 && memcmp(s, "\xef\xbf\xbd", 3) == 0);
    hm_detok_close(d);
    int32_t ids[] = {3, 0, 1, 2, 3};
    char *out;
    CHECK(hm_detokenize(t, ids, 5, false, &out, &l, &err) == HM_OK);
    CHECK(l == 5 && strcmp(out, "a\xe4\xbd\xa0" "a") == 0);
    free(out);
    hm_tokenizer_close(t);

    /* the byte-level helpers */
    CHECK(hm_utf8_complete_prefix("ab\xe4\xbd", 4) == 2);
    CHECK(hm_utf8_complete_prefix("ab\xe4\xbd\xa0", 5) == 5);
    CHECK(hm_utf8_complete_prefix("ab\xf0\x9f\x98", 5) == 2);
    CHECK(hm_utf8_complete_prefix("ab\xe4" "a", 4) == 4);   /* broken already: nothing to hold */
    CHECK(hm_utf8_complete_prefix("ab\xc0", 3) == 3);       /* invalid lead: nothing to hold */
    CHECK(hm_utf8_complete_prefix("\xed\xa0", 2) == 2);     /* would be a surrogate */
}

static void check_str(const char *got, size_t n, const char *want, int line) {
    CHECKF(got && n == strlen(want) && memcmp(got, want, n) == 0, "line %d", line);
}

static void test_unicode(void) {
    size_t n;
    char *s = hm_utf8_sanitize("a\xff" "b", 3, &n);
    check_str(s, n, "a\xef\xbf\xbd" "b", __LINE__);
    free(s);
    /* truncated 3-byte sequence: one U+FFFD for the maximal subpart */
    s = hm_utf8_sanitize("\xe4\xbd" "c", 3, &n);
    check_str(s, n, "\xef\xbf\xbd" "c", __LINE__);
    free(s);
    /* surrogate ED A0 80: ED alone is a subpart, A0 and 80 are stray: three U+FFFD */
    s = hm_utf8_sanitize("\xed\xa0\x80", 3, &n);
    check_str(s, n, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", __LINE__);
    free(s);
    /* overlong '/' */
    s = hm_utf8_sanitize("\xc0\xaf", 2, &n);
    check_str(s, n, "\xef\xbf\xbd\xef\xbf\xbd", __LINE__);
    free(s);
    CHECK(hm_utf8_valid("\xef\xbf\xbd", 3));
    CHECK(!hm_utf8_valid("\xf4\x90\x80\x80", 4)); /* > U+10FFFF */

    /* NFC: e + acute -> U+00E9 */
    CHECK(!hm_nfc_quick("e\xcc\x81", 3));
    CHECK(hm_nfc_quick("plain ascii and \xc3\xa9", 18));
    s = hm_nfc("e\xcc\x81", 3, &n);
    check_str(s, n, "\xc3\xa9", __LINE__);
    free(s);
    /* Hangul jamo L V T -> one syllable (U+AC01) */
    s = hm_nfc("\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", 9, &n);
    check_str(s, n, "\xea\xb0\x81", __LINE__);
    free(s);
    /* d + dot above (230) + dot below (220): reordered to below first, then composed to U+1E0D,
     * the dot above stays: U+1E0D U+0307 */
    s = hm_nfc("d\xcc\x87\xcc\xa3", 5, &n);
    check_str(s, n, "\xe1\xb8\x8d\xcc\x87", __LINE__);
    free(s);
    /* singleton: OHM SIGN -> GREEK CAPITAL OMEGA */
    s = hm_nfc("\xe2\x84\xa6", 3, &n);
    check_str(s, n, "\xce\xa9", __LINE__);
    free(s);
    /* byte-level map */
    CHECK(hm_byte_to_cp(' ') == 0x120 && hm_cp_to_byte(0x120) == ' ');
    CHECK(hm_byte_to_cp('a') == 'a' && hm_byte_to_cp(0xad) == 0x143);
    for (int b = 0; b < 256; b++) CHECK(hm_cp_to_byte(hm_byte_to_cp((uint8_t)b)) == b);
}

static void test_spm(void) {
    /* 0 <unk>, 1 <s>, 2 </s>, 3..258 <0x00>..<0xFF>, then the pieces with scores */
    const char *pieces[] = {"\xe2\x96\x81", "h", "e", "l", "o", "\xe2\x96\x81h", "ll", "lo", "llo",
                            "\xe2\x96\x81he"};
    const float sc[] = {-1, -2, -3, -4, -5, -6, -1.5f, -8, -0.5f, -0.7f};
    int np = 10, n = 3 + 256 + np;
    char **toks = calloc((size_t)n, sizeof *toks);
    int32_t *ty = calloc((size_t)n, sizeof *ty);
    float *scores = calloc((size_t)n, sizeof *scores);
    toks[0] = strdup("<unk>"); ty[0] = 2;
    toks[1] = strdup("<s>"); ty[1] = 3;
    toks[2] = strdup("</s>"); ty[2] = 3;
    for (int b = 0; b < 256; b++) {
        toks[3 + b] = malloc(8);
        sprintf(toks[3 + b], "<0x%02X>", b);
        ty[3 + b] = 6;
    }
    for (int i = 0; i < np; i++) {
        toks[259 + i] = strdup(pieces[i]);
        ty[259 + i] = 1;
        scores[259 + i] = sc[i];
    }
    char path[256];
    snprintf(path, sizeof path, "%s/spm.gguf", tmpdir);
    hm_gguf_writer *w;
    hm_err err = {{0}};
    CHECK(hm_gguf_writer_open(&w, path, 0, &err) == HM_OK);
    hm_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    hm_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, (uint64_t)n);
    hm_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", HM_GGUF_I32, ty, (uint64_t)n);
    hm_gguf_writer_set_arr(w, "tokenizer.ggml.scores", HM_GGUF_F32, scores, (uint64_t)n);
    hm_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    hm_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    hm_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    CHECK(hm_gguf_writer_begin_data(w) == HM_OK);
    CHECK(hm_gguf_writer_finish(w) == HM_OK);
    for (int i = 0; i < n; i++) free(toks[i]);
    free(toks);
    free(ty);
    free(scores);

    hm_tokenizer *t = NULL;
    CHECKF(hm_tokenizer_open(&t, path, &err) == HM_OK, "%s", err.msg);
    if (!t) return;
    CHECK(hm_tokenizer_add_bos(t)); /* SPM default */
    enum { SP = 259, H, E, L, O, SP_H, LL, LO, LLO, SP_HE };
    /* "hello" -> "▁hello": bigrams ▁h(-6) ll(-1.5) lo(-8); ll wins -> ▁ h e ll o; then ll+o = llo
     * (-0.5) -> ▁ h e llo; then ▁h (-6) -> ▁h e llo; then ▁h+e = ▁he (-0.7); lo is stale */
    TOK(t, "hello", true, SP_HE, LLO);
    /* "hi": ▁h merges, 'i' has no token -> its byte <0x69> */
    TOK(t, "hi", true, SP_H, 3 + 0x69);
    /* a special token, then a space prefix again for the text after it */
    TOK(t, "<s>hello", true, 1, SP_HE, LLO);
    /* BOS added by default options */
    {
        int32_t *ids;
        size_t k;
        CHECK(hm_tokenize(t, "hello", 5, NULL, &ids, &k, &err) == HM_OK);
        CHECK(k == 3 && ids[0] == 1 && ids[1] == SP_HE);
        free(ids);
    }
    size_t l;
    const char *s = hm_token_piece(t, SP_HE, &l);
    CHECK(l == 3 && memcmp(s, " he", 3) == 0);
    s = hm_token_piece(t, 3 + 0x41, &l);
    CHECK(l == 1 && s[0] == 'A');
    hm_tokenizer_close(t);
}

int main(void) {
    if (!mkdtemp(tmpdir)) return 1;
    test_bpe();
    test_stream();
    test_unicode();
    test_spm();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return test_done();
}
