/* bpe_gemma4.c - the gemma4 tokenizer's merge step (llama.cpp's tokenizer.ggml.model "gemma4":
 * SentencePiece-style BPE). A word here is raw UTF-8 with spaces already replaced by U+2581 and
 * no newline mixed with other text (tokenize.c splits on runs of '\n'). Symbols start as one per
 * UTF-8 character (its token, or none when the character is not in the vocabulary); the adjacent
 * pair of lowest merge rank, leftmost on ties, is merged until no ranked pair is left; a symbol
 * with no token is emitted as its bytes' <0xXX> tokens (bytes without one are dropped, as
 * llama.cpp does). Merges are looked up by token ids (vocab.c keys them on the file's text), so
 * a merge whose result is not a token never applies (llama.cpp would apply it and then
 * byte-encode the result; a vocabulary from a Hugging Face BPE model has every result). */
#include <string.h>

#include "tokenizer_impl.h"
#include "unicode.h"

typedef struct g4_cand {
    int32_t rank, pos, rpos, lid, rid, id;
} g4_cand;

static bool g4_less(const g4_cand *a, const g4_cand *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void g4_push(g4_cand *h, int32_t *n, g4_cand c) {
    int32_t i = (*n)++;
    for (; i > 0 && g4_less(&c, &h[(i - 1) / 2]); i = (i - 1) / 2) h[i] = h[(i - 1) / 2];
    h[i] = c;
}

static g4_cand g4_pop(g4_cand *h, int32_t *n) {
    g4_cand top = h[0], last = h[--(*n)];
    int32_t i = 0;
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && g4_less(&h[c + 1], &h[c])) c++;
        if (!g4_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = last;
    return top;
}

static void g4_try(const hm_tokenizer *t, g4_cand *h, int32_t *nh, const int32_t *id, int32_t l, int32_t r) {
    int32_t m, rank;
    if (l < 0 || r < 0 || id[l] < 0 || id[r] < 0 || (rank = hm_tok_merge_find(t, id[l], id[r], &m)) < 0) return;
    g4_push(h, nh, (g4_cand){rank, l, r, id[l], id[r], m});
}

bool hm_g4_word(const hm_tokenizer *t, const char *s, size_t n, hm_idvec *out, hm_tok_scratch *sc) {
    if (n == 0) return true;
    /* per symbol: id, next, prev, byte offset and length (int32 each), then the heap */
    size_t heap_cap = 3 * n + 1;
    char *mem = hm_tok_scratch_get(sc, n * 5 * sizeof(int32_t) + heap_cap * sizeof(g4_cand) + 16);
    if (!mem) return false;
    int32_t *id = (int32_t *)mem, *next = id + n, *prev = next + n, *off = prev + n, *len = off + n;
    g4_cand *heap = (g4_cand *)(void *)(len + n);
    int32_t ns = 0, nh = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = hm_utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (l <= 0) l = 1;
        off[ns] = (int32_t)i;
        len[ns] = l;
        id[ns] = hm_tok_map_find(t, s + i, (size_t)l);
        prev[ns] = ns - 1;
        next[ns] = -1;
        if (ns > 0) next[ns - 1] = ns;
        ns++;
        i += (size_t)l;
    }
    for (int32_t i = 0; i + 1 < ns; i++) g4_try(t, heap, &nh, id, i, i + 1);
    while (nh > 0) {
        g4_cand c = g4_pop(heap, &nh);
        if (id[c.pos] != c.lid || next[c.pos] != c.rpos || id[c.rpos] != c.rid) continue; /* stale */
        id[c.pos] = c.id;
        len[c.pos] += len[c.rpos];
        int32_t nx = next[c.rpos];
        next[c.pos] = nx;
        if (nx >= 0) prev[nx] = c.pos;
        id[c.rpos] = -2;
        next[c.rpos] = -3;
        g4_try(t, heap, &nh, id, prev[c.pos], c.pos);
        g4_try(t, heap, &nh, id, c.pos, nx);
    }
    for (int32_t i = 0; i >= 0; i = next[i]) {
        if (id[i] >= 0) {
            if (!hm_idvec_push(out, id[i])) return false;
            continue;
        }
        for (int32_t k = 0; k < len[i]; k++) { /* byte fallback */
            int32_t b = t->byte_tok[(unsigned char)s[off[i] + k]];
            if (b >= 0 && !hm_idvec_push(out, b)) return false;
        }
    }
    return true;
}
