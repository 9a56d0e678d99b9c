/* bpe.c - byte-level BPE over one pre-tokenized piece: start from one symbol per byte, merge the
 * adjacent pair of lowest rank (leftmost on ties) until none is left. Symbols form a linked list
 * over an array; candidate pairs sit in a binary min-heap keyed by (rank, position) and are
 * checked for staleness when popped, so a piece of n bytes costs O(n log n). */
#include <string.h>

#include "tokenizer_impl.h"

typedef struct cand {
    int32_t rank;
    int32_t pos;    /* left symbol */
    int32_t rpos;   /* right symbol at push time */
    int32_t lid, rid, id; /* ids of the pair at push time, merged id */
} cand;

static bool cand_less(const cand *a, const cand *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(cand *h, int32_t *n, cand c) {
    int32_t i = (*n)++;
    while (i > 0) {
        int32_t p = (i - 1) / 2;
        if (!cand_less(&c, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static cand heap_pop(cand *h, int32_t *n) {
    cand top = h[0], last = h[--(*n)];
    int32_t i = 0;
    for (;;) {
        int32_t l = 2 * i + 1, m = i;
        if (l >= *n) break;
        if (l + 1 < *n && cand_less(&h[l + 1], &h[l])) l++;
        if (!cand_less(&h[l], &last)) break;
        h[m] = h[l];
        i = l;
    }
    h[i] = last;
    return top;
}

bool hm_bpe_piece(const hm_tokenizer *t, const char *s, size_t n, hm_idvec *out, hm_tok_scratch *sc) {
    if (n == 0) return true;
    if (n == 1 || t->pretok->ignore_merges) {
        int32_t id = hm_tok_map_find(t, s, n);
        if (id >= 0) return hm_idvec_push(out, id);
    }
    /* scratch: ids, next, prev (int32 each) + heap (at most 3 pushes per merge + initial) */
    size_t heap_cap = 3 * n + 1;
    char *mem = hm_tok_scratch_get(sc, n * 3 * sizeof(int32_t) + heap_cap * sizeof(cand) + 16);
    if (!mem) return false;
    int32_t *id = (int32_t *)mem, *next = id + n, *prev = next + n;
    cand *heap = (cand *)(void *)(prev + n);
    int32_t nh = 0, nn = (int32_t)n;
    for (int32_t i = 0; i < nn; i++) {
        id[i] = t->byte_tok[(unsigned char)s[i]];
        next[i] = i + 1 < nn ? i + 1 : -1;
        prev[i] = i - 1;
    }
    for (int32_t i = 0; i + 1 < nn; i++) {
        int32_t m, r = id[i] < 0 || id[i + 1] < 0 ? -1 : hm_tok_merge_find(t, id[i], id[i + 1], &m);
        if (r >= 0) heap_push(heap, &nh, (cand){r, i, i + 1, id[i], id[i + 1], m});
    }
    while (nh > 0) {
        cand c = heap_pop(heap, &nh);
        /* stale: the left symbol was merged away or changed, or its neighbour changed */
        if (id[c.pos] != c.lid || next[c.pos] != c.rpos || id[c.rpos] != c.rid) continue;
        id[c.pos] = c.id;
        int32_t nx = next[c.rpos];
        next[c.pos] = nx;
        if (nx >= 0) prev[nx] = c.pos;
        id[c.rpos] = -2; /* dead */
        next[c.rpos] = -3;
        int32_t p = prev[c.pos], m, r;
        if (p >= 0 && (r = hm_tok_merge_find(t, id[p], id[c.pos], &m)) >= 0)
            heap_push(heap, &nh, (cand){r, p, c.pos, id[p], id[c.pos], m});
        if (nx >= 0 && (r = hm_tok_merge_find(t, id[c.pos], id[nx], &m)) >= 0)
            heap_push(heap, &nh, (cand){r, c.pos, nx, id[c.pos], id[nx], m});
    }
    for (int32_t i = 0; i >= 0; i = next[i])
        if (id[i] >= 0 && !hm_idvec_push(out, id[i])) return false;
    return true;
}
