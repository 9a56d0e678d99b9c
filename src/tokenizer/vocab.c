/* vocab.c - build a hm_tokenizer from the tokenizer.* keys of a GGUF file: token texts and
 * pieces, the lookup maps, BPE merges, special tokens, pre-tokenizer regexes, special ids.
 * Load time is dominated by hashing ~150k tokens and ~150k merges (tens of ms). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/status.h"
#include "tokenizer_impl.h"
#include "unicode.h"

static uint32_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ULL;
    return (uint32_t)(h ^ (h >> 32));
}

/* key bytes of token id in the map: BPE uses pieces, SPM uses file text */
static const char *map_key(const hm_tokenizer *t, int32_t id, size_t *n) {
    if (t->kind == HM_VOCAB_BPE) {
        *n = t->piece_len[id];
        return t->piece + t->piece_off[id];
    }
    *n = t->text_len[id];
    return t->text + t->text_off[id];
}

int32_t hm_tok_map_find(const hm_tokenizer *t, const char *s, size_t n) {
    for (uint32_t i = hash_bytes(s, n) & t->map_mask;; i = (i + 1) & t->map_mask) {
        int32_t id = t->map[i];
        if (id < 0) return -1;
        size_t kn;
        const char *k = map_key(t, id, &kn);
        if (kn == n && memcmp(k, s, n) == 0) return id;
    }
}

/* insert unless a token with the same key is there already (the lower id wins) */
static void map_insert(hm_tokenizer *t, int32_t id) {
    size_t n;
    const char *s = map_key(t, id, &n);
    for (uint32_t i = hash_bytes(s, n) & t->map_mask;; i = (i + 1) & t->map_mask) {
        int32_t o = t->map[i];
        if (o < 0) { t->map[i] = id; return; }
        size_t kn;
        const char *k = map_key(t, o, &kn);
        if (kn == n && memcmp(k, s, n) == 0) return;
    }
}

static uint32_t pow2_at_least(uint64_t n) {
    uint32_t p = 16;
    while (p < n) p <<= 1;
    return p;
}

void hm_tokenizer_close(hm_tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->n_rx; i++) pcre2_code_free(t->rx[i]);
    free(t->text);
    free(t->text_off);
    free(t->text_len);
    free(t->piece);
    free(t->piece_off);
    free(t->piece_len);
    free(t->type);
    free(t->score);
    free(t->map);
    free(t->merges);
    free(t->spec);
    free(t->chat_template);
    free(t);
}

/* A special token id: absent -> -1; present, it must be an integer in [0, n_vocab) (an id past
 * the vocabulary would index the token tables), else HM_ERR_FORMAT naming the key. */
static hm_status get_id(const hm_gguf *g, const char *key, int32_t n_vocab, int32_t *out, hm_err *err) {
    int64_t v;
    *out = -1;
    if (!hm_gguf_get_int(g, key, &v)) {
        if (hm_gguf_find_key(g, key) >= 0)
            return hm_errf(err, HM_ERR_FORMAT, "%s: key %s is not an integer", hm_gguf_path(g), key);
        return HM_OK;
    }
    if (v < 0 || v >= n_vocab)
        return hm_errf(err, HM_ERR_FORMAT, "%s: key %s = %lld is not a token id (tokenizer.ggml.tokens has %d)",
                       hm_gguf_path(g), key, (long long)v, n_vocab);
    *out = (int32_t)v;
    return HM_OK;
}

/* GPT-2 byte-level decoding of a token's text: each code point of the map becomes its byte;
 * code points outside the map (never produced by byte-level BPE) are kept as UTF-8. */
static size_t bytelevel_decode(const char *s, size_t n, char *out, const int16_t *cp_byte) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = hm_utf8_decode((const unsigned char *)s + i, n - i, &cp);
        int b = cp < 324 ? cp_byte[cp] : -1;
        if (b >= 0) out[o++] = (char)b;
        else { memcpy(out + o, s + i, (size_t)l); o += (size_t)l; }
        i += (size_t)l;
    }
    return o;
}

/* SentencePiece pieces: U+2581 -> ' ', <0xNN> byte tokens -> the byte */
static size_t spm_decode(const char *s, size_t n, int type, char *out) {
    if (type == HM_TT_BYTE && n == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>') {
        char hex[3] = {s[3], s[4], 0};
        out[0] = (char)strtol(hex, NULL, 16);
        return 1;
    }
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        if (i + 3 <= n && memcmp(s + i, "\xe2\x96\x81", 3) == 0) { out[o++] = ' '; i += 3; }
        else out[o++] = s[i++];
    }
    return o;
}

static int cmp_spec(const void *a, const void *b, void *ctx) {
    const hm_tokenizer *t = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    unsigned char fx = (unsigned char)t->text[t->text_off[x]], fy = (unsigned char)t->text[t->text_off[y]];
    if (fx != fy) return fx < fy ? -1 : 1;
    if (t->text_len[x] != t->text_len[y]) return t->text_len[x] > t->text_len[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

static const char *const eog_texts[] = {"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>",
                                        "<end_of_turn>", "<|end|>", "<|return|>", "<|call|>", "<|end_of_text|>",
                                        "<｜end▁of▁sentence｜>"};

/* gpt-oss's o200k_harmony vocabulary, as llama.cpp loads it: the Harmony markers <|start|>,
 * <|channel|>, <|message|> and <|constrain|> are user-defined (detokenised as text, so a reply's
 * channels can be parsed), and when <|return|> and <|call|> end generation <|end|> does not (it
 * closes the analysis message; the final one follows) and is user-defined too. */
static void harmony_tokens(hm_tokenizer *t) {
    static const char *const markers[] = {"<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"};
    int32_t end = -1;
    bool ret = false, call = false;
    for (int i = 0; i < t->n_eog; i++) {
        int32_t id = t->eog[i];
        const char *s = t->text + t->text_off[id];
        uint32_t l = t->text_len[id];
        ret |= l == 10 && memcmp(s, "<|return|>", 10) == 0;
        call |= l == 8 && memcmp(s, "<|call|>", 8) == 0;
        if (l == 7 && memcmp(s, "<|end|>", 7) == 0) end = id;
    }
    for (uint32_t k = t->spec_start['<']; k < t->spec_start['<' + 1]; k++) {
        int32_t id = t->spec[k];
        for (size_t m = 0; m < sizeof markers / sizeof markers[0]; m++)
            if (t->text_len[id] == strlen(markers[m]) && memcmp(t->text + t->text_off[id], markers[m], t->text_len[id]) == 0)
                t->type[id] = HM_TT_USER_DEFINED;
    }
    if (ret && call && end >= 0) {
        int j = 0;
        for (int i = 0; i < t->n_eog; i++)
            if (t->eog[i] != end) t->eog[j++] = t->eog[i];
        t->n_eog = j;
        t->type[end] = HM_TT_USER_DEFINED;
    }
}

hm_status hm_tokenizer_from_gguf(hm_tokenizer **out, const hm_gguf *g, hm_err *err) {
    *out = NULL;
    const char *path = hm_gguf_path(g);
    hm_status st = HM_OK;
    hm_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return hm_errf(err, HM_ERR_NOMEM, "out of memory");

    hm_gguf_str s;
    if (!hm_gguf_get_str(g, "tokenizer.ggml.model", &s)) {
        st = hm_errf(err, HM_ERR_FORMAT, "%s: no tokenizer (key tokenizer.ggml.model missing)", path);
        goto fail;
    }
    if (s.len == 4 && memcmp(s.ptr, "gpt2", 4) == 0) t->kind = HM_VOCAB_BPE;
    else if (s.len == 5 && memcmp(s.ptr, "llama", 5) == 0) t->kind = HM_VOCAB_SPM;
    else if (s.len == 6 && memcmp(s.ptr, "gemma4", 6) == 0) t->kind = HM_VOCAB_GEMMA4;
    else {
        st = hm_errf(err, HM_ERR_UNSUPPORTED,
                     "%s: tokenizer.ggml.model '%.*s' not supported (gpt2 = byte-level BPE, llama = "
                     "SentencePiece, gemma4)", path, (int)(s.len > 40 ? 40 : s.len), s.ptr);
        goto fail;
    }
    memcpy(t->model, s.ptr, s.len);

    hm_gguf_arr toks, types, scores, merges;
    if (!hm_gguf_get_arr(g, "tokenizer.ggml.tokens", &toks) || toks.elem_type != HM_GGUF_STRING ||
        toks.n == 0 || toks.n > INT32_MAX / 2) {
        st = hm_errf(err, HM_ERR_FORMAT, "%s: tokenizer.ggml.tokens missing or not a string array", path);
        goto fail;
    }
    int32_t n = t->n_vocab = (int32_t)toks.n;
    bool have_types = hm_gguf_get_arr(g, "tokenizer.ggml.token_type", &types);
    if (have_types && types.n != toks.n) {
        st = hm_errf(err, HM_ERR_FORMAT, "%s: tokenizer.ggml.token_type has %llu entries, tokens %d",
                     path, (unsigned long long)types.n, n);
        goto fail;
    }
    bool have_scores = hm_gguf_get_arr(g, "tokenizer.ggml.scores", &scores);
    if (have_scores && scores.n != toks.n) {
        st = hm_errf(err, HM_ERR_FORMAT, "%s: tokenizer.ggml.scores has %llu entries, tokens %d", path,
                     (unsigned long long)scores.n, n);
        goto fail;
    }

    /* texts */
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        if (!hm_gguf_arr_str(&toks, (uint64_t)i, &s) || s.len > 65536) {
            st = hm_errf(err, HM_ERR_FORMAT, "%s: tokenizer.ggml.tokens[%d] unreadable or too long", path, i);
            goto fail;
        }
        total += s.len;
    }
    t->text = malloc(total + 1);
    t->piece = malloc(total + 1); /* decoding never lengthens */
    t->text_off = malloc((size_t)n * sizeof *t->text_off);
    t->text_len = malloc((size_t)n * sizeof *t->text_len);
    t->piece_off = malloc((size_t)n * sizeof *t->piece_off);
    t->piece_len = malloc((size_t)n * sizeof *t->piece_len);
    t->type = malloc((size_t)n);
    if (t->kind == HM_VOCAB_SPM) t->score = calloc((size_t)n, sizeof *t->score);
    if (!t->text || !t->piece || !t->text_off || !t->text_len || !t->piece_off || !t->piece_len ||
        !t->type || (t->kind == HM_VOCAB_SPM && !t->score)) {
        st = hm_errf(err, HM_ERR_NOMEM, "out of memory for %d tokens", n);
        goto fail;
    }
    int16_t cp_byte[324];
    for (int i = 0; i < 324; i++) cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) cp_byte[hm_byte_to_cp((uint8_t)b)] = (int16_t)b;
    size_t off = 0, poff = 0;
    for (int32_t i = 0; i < n; i++) {
        hm_gguf_arr_str(&toks, (uint64_t)i, &s);
        int64_t ty = HM_TT_NORMAL;
        if (have_types && !hm_gguf_arr_int(&types, (uint64_t)i, &ty)) {
            st = hm_errf(err, HM_ERR_FORMAT, "%s: tokenizer.ggml.token_type[%d] not an integer", path, i);
            goto fail;
        }
        if (ty < 1 || ty > 6) ty = HM_TT_NORMAL;
        t->type[i] = (uint8_t)ty;
        if (have_scores) {
            double sc = 0;
            if (!hm_gguf_arr_float(&scores, (uint64_t)i, &sc) || isnan(sc)) {
                st = hm_errf(err, HM_ERR_FORMAT, "%s: tokenizer.ggml.scores[%d] is not a number", path, i);
                goto fail;
            }
            if (t->score) t->score[i] = (float)sc;
        }
        memcpy(t->text + off, s.ptr, s.len);
        t->text_off[i] = (uint32_t)off;
        t->text_len[i] = (uint32_t)s.len;
        size_t pl;
        if (ty == HM_TT_CONTROL || ty == HM_TT_USER_DEFINED || ty == HM_TT_UNKNOWN) {
            memcpy(t->piece + poff, s.ptr, s.len);
            pl = s.len;
        } else if (t->kind == HM_VOCAB_BPE) {
            pl = bytelevel_decode(s.ptr, s.len, t->piece + poff, cp_byte);
        } else {
            pl = spm_decode(s.ptr, s.len, (int)ty, t->piece + poff);
        }
        t->piece_off[i] = (uint32_t)poff;
        t->piece_len[i] = (uint32_t)pl;
        if (pl > t->max_piece) t->max_piece = (uint32_t)pl;
        off += s.len;
        poff += pl;
    }

    /* map */
    t->map_mask = pow2_at_least((uint64_t)n * 2) - 1;
    t->map = malloc(((size_t)t->map_mask + 1) * sizeof *t->map);
    if (!t->map) { st = hm_errf(err, HM_ERR_NOMEM, "out of memory"); goto fail; }
    memset(t->map, 0xff, ((size_t)t->map_mask + 1) * sizeof *t->map);
    for (int32_t i = 0; i < n; i++) {
        int ty = t->type[i];
        if (ty == HM_TT_NORMAL || (t->kind != HM_VOCAB_BPE && ty == HM_TT_USER_DEFINED)) map_insert(t, i);
    }
    for (int b = 0; b < 256; b++) {
        if (t->kind == HM_VOCAB_BPE) {
            char c = (char)b;
            t->byte_tok[b] = hm_tok_map_find(t, &c, 1);
        } else {
            t->byte_tok[b] = -1;
        }
    }
    if (t->kind != HM_VOCAB_BPE) /* <0xNN> tokens */
        for (int32_t i = 0; i < n; i++)
            if (t->type[i] == HM_TT_BYTE && t->piece_len[i] == 1)
                t->byte_tok[(unsigned char)t->piece[t->piece_off[i]]] = i;

    /* BPE without its merges would tokenize every text into single bytes: refuse it */
    if ((t->kind == HM_VOCAB_BPE || t->kind == HM_VOCAB_GEMMA4) &&
        (!hm_gguf_get_arr(g, "tokenizer.ggml.merges", &merges) || merges.n == 0)) {
        st = hm_errf(err, HM_ERR_FORMAT, "%s: tokenizer.ggml.merges is missing or empty (a %s vocabulary needs its "
                     "BPE merges)", path, t->model);
        goto fail;
    }

    /* merges: "left right" in the byte-level encoding, rank = index */
    if (t->kind == HM_VOCAB_BPE && hm_gguf_get_arr(g, "tokenizer.ggml.merges", &merges) &&
        merges.n > 0) {
        if (merges.elem_type != HM_GGUF_STRING || merges.n > INT32_MAX / 4) {
            st = hm_errf(err, HM_ERR_FORMAT, "%s: tokenizer.ggml.merges is not a string array", path);
            goto fail;
        }
        t->merge_mask = pow2_at_least(merges.n * 2) - 1;
        t->merges = malloc(((size_t)t->merge_mask + 1) * sizeof *t->merges);
        char *buf = malloc(65536 * 2 + 2);
        if (!t->merges || !buf) {
            free(buf);
            st = hm_errf(err, HM_ERR_NOMEM, "out of memory");
            goto fail;
        }
        memset(t->merges, 0xff, ((size_t)t->merge_mask + 1) * sizeof *t->merges);
        for (uint64_t r = 0; r < merges.n; r++) {
            if (!hm_gguf_arr_str(&merges, r, &s) || s.len > 65536) {
                free(buf);
                st = hm_errf(err, HM_ERR_FORMAT, "%s: tokenizer.ggml.merges[%llu] unreadable", path,
                             (unsigned long long)r);
                goto fail;
            }
            const char *sp = memchr(s.ptr, ' ', s.len);
            if (!sp || sp == s.ptr) continue; /* malformed: ignored, as it can never apply */
            size_t la = bytelevel_decode(s.ptr, (size_t)(sp - s.ptr), buf, cp_byte);
            size_t lb = bytelevel_decode(sp + 1, s.len - (size_t)(sp - s.ptr) - 1, buf + la, cp_byte);
            int32_t a = hm_tok_map_find(t, buf, la), b = hm_tok_map_find(t, buf + la, lb);
            int32_t c = hm_tok_map_find(t, buf, la + lb);
            if (a < 0 || b < 0 || c < 0) continue;
            uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
            for (uint32_t i = hm_tok_hash64(key) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
                if (t->merges[i].key == key) break; /* duplicate: the first (lower rank) wins */
                if (t->merges[i].key == UINT64_MAX) {
                    t->merges[i] = (hm_merge_slot){key, (int32_t)r, c};
                    t->n_merges++;
                    break;
                }
            }
        }
        free(buf);
    }

    /* gemma4 merges: "left right" in the file's text (U+2581 spaces), split at the first space
     * after the first byte as llama.cpp does */
    if (t->kind == HM_VOCAB_GEMMA4 && hm_gguf_get_arr(g, "tokenizer.ggml.merges", &merges) && merges.n > 0) {
        if (merges.elem_type != HM_GGUF_STRING || merges.n > INT32_MAX / 4) {
            st = hm_errf(err, HM_ERR_FORMAT, "%s: tokenizer.ggml.merges is not a string array", path);
            goto fail;
        }
        t->merge_mask = pow2_at_least(merges.n * 2) - 1;
        t->merges = malloc(((size_t)t->merge_mask + 1) * sizeof *t->merges);
        char *buf = malloc(65536 * 2 + 2);
        if (!t->merges || !buf) {
            free(buf);
            st = hm_errf(err, HM_ERR_NOMEM, "out of memory");
            goto fail;
        }
        memset(t->merges, 0xff, ((size_t)t->merge_mask + 1) * sizeof *t->merges);
        for (uint64_t r = 0; r < merges.n; r++) {
            if (!hm_gguf_arr_str(&merges, r, &s) || s.len > 65536 || s.len < 2) continue;
            const char *sp = memchr(s.ptr + 1, ' ', s.len - 1);
            if (!sp) continue;
            size_t la = (size_t)(sp - s.ptr), lb = s.len - la - 1;
            memcpy(buf, s.ptr, la);
            memcpy(buf + la, sp + 1, lb);
            int32_t a = hm_tok_map_find(t, buf, la), b = hm_tok_map_find(t, buf + la, lb);
            int32_t c = hm_tok_map_find(t, buf, la + lb);
            if (a < 0 || b < 0 || c < 0) continue;
            uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
            for (uint32_t i = hm_tok_hash64(key) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
                if (t->merges[i].key == key) break;
                if (t->merges[i].key == UINT64_MAX) {
                    t->merges[i] = (hm_merge_slot){key, (int32_t)r, c};
                    t->n_merges++;
                    break;
                }
            }
        }
        free(buf);
    }

    /* special tokens */
    int32_t n_spec = 0;
    for (int32_t i = 0; i < n; i++)
        n_spec += (t->type[i] == HM_TT_CONTROL || t->type[i] == HM_TT_USER_DEFINED) && t->text_len[i] > 0;
    t->spec = malloc(((size_t)n_spec + 1) * sizeof *t->spec);
    if (!t->spec) { st = hm_errf(err, HM_ERR_NOMEM, "out of memory"); goto fail; }
    n_spec = 0;
    for (int32_t i = 0; i < n; i++)
        if ((t->type[i] == HM_TT_CONTROL || t->type[i] == HM_TT_USER_DEFINED) && t->text_len[i] > 0)
            t->spec[n_spec++] = i;
    qsort_r(t->spec, (size_t)n_spec, sizeof *t->spec, cmp_spec, t);
    {
        uint32_t k = 0;
        for (int b = 0; b < 256; b++) {
            t->spec_start[b] = k;
            while (k < (uint32_t)n_spec && (unsigned char)t->text[t->text_off[t->spec[k]]] == b) k++;
        }
        t->spec_start[256] = k;
    }

    /* pre-tokenizer */
    if (t->kind == HM_VOCAB_BPE) {
        const char *pre = "default";
        size_t pre_len = 7;
        if (hm_gguf_get_str(g, "tokenizer.ggml.pre", &s)) { pre = s.ptr; pre_len = s.len; }
        t->pretok = hm_pretok_find(pre, pre_len);
        if (!t->pretok) {
            char known[256];
            size_t k = 0;
            known[0] = 0;
            for (size_t i = 0; hm_pretok_at(i) && k < sizeof known; i++)
                k += (size_t)snprintf(known + k, sizeof known - k, "%s%s", i ? ", " : "", hm_pretok_at(i)->name);
            st = hm_errf(err, HM_ERR_UNSUPPORTED, "%s: tokenizer.ggml.pre '%.*s' not supported (known: %s)", path,
                         (int)(pre_len > 40 ? 40 : pre_len), pre, known);
            goto fail;
        }
        snprintf(t->pre, sizeof t->pre, "%s", t->pretok->name);
        for (int i = 0; i < HM_PRETOK_MAX_REGEX && t->pretok->regex[i]; i++) {
            int ec;
            PCRE2_SIZE eo;
            t->rx[i] = pcre2_compile((PCRE2_SPTR)t->pretok->regex[i], PCRE2_ZERO_TERMINATED,
                                     PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &ec, &eo, NULL);
            if (!t->rx[i]) {
                PCRE2_UCHAR msg[128];
                pcre2_get_error_message(ec, msg, sizeof msg);
                st = hm_errf(err, HM_ERR_INTERNAL, "pre-tokenizer %s regex %d at %zu: %s", t->pre, i,
                             (size_t)eo, (const char *)msg);
                goto fail;
            }
            t->n_rx = i + 1;
            pcre2_jit_compile(t->rx[i], PCRE2_JIT_COMPLETE); /* falls back to the interpreter */
        }
    }

    /* special ids and flags */
    int32_t eom = -1;
    if ((st = get_id(g, "tokenizer.ggml.bos_token_id", n, &t->bos, err)) != HM_OK ||
        (st = get_id(g, "tokenizer.ggml.eos_token_id", n, &t->eos, err)) != HM_OK ||
        (st = get_id(g, "tokenizer.ggml.eot_token_id", n, &t->eot, err)) != HM_OK ||
        (st = get_id(g, "tokenizer.ggml.eom_token_id", n, &eom, err)) != HM_OK ||
        (st = get_id(g, "tokenizer.ggml.padding_token_id", n, &t->pad, err)) != HM_OK ||
        (st = get_id(g, "tokenizer.ggml.unknown_token_id", n, &t->unk, err)) != HM_OK)
        goto fail;
    bool b;
    /* without the key: SentencePiece and Llama 3's BPE add BOS, other BPE vocabularies not (llama.cpp) */
    t->add_bos = hm_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b)
                     ? b : t->kind == HM_VOCAB_SPM || (t->pretok && strcmp(t->pretok->name, "llama-bpe") == 0);
    if (t->kind == HM_VOCAB_GEMMA4) t->add_bos = true; /* llama.cpp forces it for gemma4 (its PR 21500) */
    t->add_eos = hm_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &b) && b;
    t->add_space_prefix = hm_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &b)
                              ? b : t->kind == HM_VOCAB_SPM;
    if (t->kind == HM_VOCAB_GEMMA4) t->add_space_prefix = false; /* llama.cpp: BPE vocabularies never */
    if (t->eos >= 0) t->eog[t->n_eog++] = t->eos;
    if (t->eot >= 0 && t->eot != t->eos) t->eog[t->n_eog++] = t->eot;
    if (eom >= 0 && eom != t->eos && eom != t->eot) t->eog[t->n_eog++] = eom; /* GLM's <|observation|> */
    for (size_t i = 0; i < sizeof eog_texts / sizeof eog_texts[0]; i++) {
        size_t l = strlen(eog_texts[i]);
        const uint32_t *start = &t->spec_start[(unsigned char)eog_texts[i][0]];
        for (uint32_t k = start[0]; k < start[1]; k++) {
            int32_t id = t->spec[k];
            if (t->text_len[id] == l && memcmp(t->text + t->text_off[id], eog_texts[i], l) == 0 &&
                t->n_eog < HM_MAX_EOG) {
                bool dup = false;
                for (int j = 0; j < t->n_eog; j++) dup |= t->eog[j] == id;
                if (!dup) t->eog[t->n_eog++] = id;
            }
        }
    }
    harmony_tokens(t);
    if (hm_gguf_get_str(g, "tokenizer.chat_template", &s)) {
        t->chat_template = malloc(s.len + 1);
        if (!t->chat_template) { st = hm_errf(err, HM_ERR_NOMEM, "out of memory"); goto fail; }
        memcpy(t->chat_template, s.ptr, s.len);
        t->chat_template[s.len] = 0;
    }
    *out = t;
    return HM_OK;
fail:
    hm_tokenizer_close(t);
    return st;
}

hm_status hm_tokenizer_open(hm_tokenizer **out, const char *path, hm_err *err) {
    *out = NULL;
    hm_gguf *g = NULL;
    hm_status st = hm_gguf_open(&g, path, err);
    if (st != HM_OK) return st;
    st = hm_tokenizer_from_gguf(out, g, err);
    hm_gguf_close(g);
    return st;
}

int32_t hm_tokenizer_n_vocab(const hm_tokenizer *t) { return t->n_vocab; }
int32_t hm_tokenizer_bos(const hm_tokenizer *t) { return t->bos; }
int32_t hm_tokenizer_eos(const hm_tokenizer *t) { return t->eos; }
bool hm_tokenizer_add_bos(const hm_tokenizer *t) { return t->add_bos; }
const char *hm_tokenizer_model(const hm_tokenizer *t) { return t->model; }
const char *hm_tokenizer_pre(const hm_tokenizer *t) { return t->pre; }
const char *hm_tokenizer_chat_template(const hm_tokenizer *t) { return t->chat_template; }

bool hm_tokenizer_is_eog(const hm_tokenizer *t, int32_t id) {
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return true;
    return false;
}

int hm_token_type(const hm_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab ? t->type[id] : 0;
}

const char *hm_token_piece(const hm_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) { *len = 0; return ""; }
    *len = t->piece_len[id];
    return t->piece + t->piece_off[id];
}

const char *hm_token_text(const hm_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) { *len = 0; return ""; }
    *len = t->text_len[id];
    return t->text + t->text_off[id];
}
