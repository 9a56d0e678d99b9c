/* spm.c - SentencePiece BPE (llama.cpp's "llama" vocabulary): start from one symbol per UTF-8
 * character, repeatedly merge the adjacent pair whose concatenation is the token of highest
 * score (leftmost on ties), then map each symbol to its token or, when it has none, to the
 * <0xNN> tokens of its bytes (or unk). Same heap-with-stale-check scheme as bpe.c. */
#include <string.h>

#include "tokenizer_impl.h"
#include "unicode.h"

typedef struct sym {
    int32_t off, len, prev, next;
} sym;

typedef struct big {
    float score;
    int32_t left, right, size;
} big;

static bool big_before(const big *a, const big *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void push(big *h, int32_t *n, big c) {
    int32_t i = (*n)++;
    while (i > 0) {
        int32_t p = (i - 1) / 2;
        if (!big_before(&c, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static big pop(big *h, int32_t *n) {
    big top = h[0], last = h[--(*n)];
    int32_t i = 0;
    for (;;) {
        int32_t l = 2 * i + 1;
        if (l >= *n) break;
        if (l + 1 < *n && big_before(&h[l + 1], &h[l])) l++;
        if (!big_before(&h[l], &last)) break;
        h[i] = h[l];
        i = l;
    }
    h[i] = last;
    return top;
}

static void try_pair(const hm_tokenizer *t, const char *s, const sym *sy, int32_t l, int32_t r,
                     big *h, int32_t *nh) {
    if (l < 0 || r < 0) return;
    int32_t id = hm_tok_map_find(t, s + sy[l].off, (size_t)(sy[l].len + sy[r].len));
    if (id < 0) return;
    push(h, nh, (big){t->score ? t->score[id] : 0.0f, l, r, sy[l].len + sy[r].len});
}

bool hm_spm_segment(const hm_tokenizer *t, const char *s, size_t n, hm_idvec *out, hm_tok_scratch *sc) {
    if (n == 0) return true;
    size_t heap_cap = 3 * n + 1;
    char *mem = hm_tok_scratch_get(sc, n * sizeof(sym) + heap_cap * sizeof(big) + 16);
    if (!mem) return false;
    sym *sy = (sym *)(void *)mem;
    big *h = (big *)(void *)(sy + n);
    int32_t ns = 0, nh = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = hm_utf8_decode((const unsigned char *)s + i, n - i, &cp);
        sy[ns] = (sym){(int32_t)i, l, ns - 1, -1};
        if (ns > 0) sy[ns - 1].next = ns;
        ns++;
        i += (size_t)l;
    }
    for (int32_t i = 1; i < ns; i++) try_pair(t, s, sy, i - 1, i, h, &nh);
    while (nh > 0) {
        big b = pop(h, &nh);
        sym *l = &sy[b.left], *r = &sy[b.right];
        if (l->len == 0 || r->len == 0 || l->len + r->len != b.size) continue;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) sy[r->next].prev = b.left;
        try_pair(t, s, sy, l->prev, b.left, h, &nh);
        try_pair(t, s, sy, b.left, l->next, h, &nh);
    }
    for (int32_t i = 0; i >= 0; i = sy[i].next) {
        int32_t id = hm_tok_map_find(t, s + sy[i].off, (size_t)sy[i].len);
        if (id >= 0) {
            if (!hm_idvec_push(out, id)) return false;
            continue;
        }
        for (int32_t k = 0; k < sy[i].len; k++) {
            int32_t bid = t->byte_tok[(unsigned char)s[sy[i].off + k]];
            if (bid < 0) bid = t->unk;
            if (bid >= 0 && !hm_idvec_push(out, bid)) return false;
            if (bid == t->unk && t->byte_tok[(unsigned char)s[sy[i].off + k]] < 0) break; /* one unk per symbol */
        }
    }
    return true;
}
