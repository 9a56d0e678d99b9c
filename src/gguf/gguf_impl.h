/* gguf_impl.h - internals shared by the GGUF reader and writer: a string hash set (duplicate
 * keys / tensor names, O(1) lookups) and a string arena (NUL-terminated copies of names).
 *
 * Both hold only borrowed pointers to strings that outlive them (arena copies). */
#ifndef HM_GGUF_IMPL_H
#define HM_GGUF_IMPL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "../core/status.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF code reads and writes little-endian values with memcpy"
/* ---- split models (gguf_read.c / gguf_split.c) ---- */

typedef struct hm_gguf hm_gguf;
/* hm_gguf_open without looking for splits: one file. */
hm_status hm_gguf_open_one(hm_gguf **out, const char *path, hm_err *err);
/* After g's own parse: when g is the first of a split model, open the others and adopt them. */
hm_status hm_gguf_splits_load(hm_gguf *g, hm_err *err);
/* Append part's tensors to g's table with file index file; g takes ownership of part on success. */
hm_status hm_gguf_adopt_split(hm_gguf *g, hm_gguf *part, int32_t file, hm_err *err);

#endif

/* ---- string hash set: key -> index, open addressing, power-of-two capacity ---- */

typedef struct hm_strslot {
    const char *key; /* borrowed; NULL = empty */
    int64_t idx;
} hm_strslot;

typedef struct hm_strset {
    hm_strslot *slots;
    size_t cap; /* power of two or 0 */
    size_t n;
} hm_strset;

static inline uint64_t hm_strhash(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static inline void hm_strset_free(hm_strset *s) {
    free(s->slots);
    s->slots = NULL;
    s->cap = s->n = 0;
}

static inline int64_t hm_strset_find(const hm_strset *s, const char *key) {
    if (!s->cap) return -1;
    for (size_t i = hm_strhash(key) & (s->cap - 1);; i = (i + 1) & (s->cap - 1)) {
        if (!s->slots[i].key) return -1;
        if (strcmp(s->slots[i].key, key) == 0) return s->slots[i].idx;
    }
}

static inline bool hm_strset_grow_(hm_strset *s, size_t cap) {
    hm_strslot *slots = calloc(cap, sizeof *slots);
    if (!slots) return false;
    for (size_t j = 0; j < s->cap; j++) {
        if (!s->slots[j].key) continue;
        size_t i = hm_strhash(s->slots[j].key) & (cap - 1);
        while (slots[i].key) i = (i + 1) & (cap - 1);
        slots[i] = s->slots[j];
    }
    free(s->slots);
    s->slots = slots;
    s->cap = cap;
    return true;
}

/* Insert key -> idx. Returns 1 when inserted, 0 when key is already present (set unchanged),
 * -1 when out of memory. */
static inline int hm_strset_insert(hm_strset *s, const char *key, int64_t idx) {
    if ((s->n + 1) * 2 > s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        if (cap < s->cap || !hm_strset_grow_(s, cap)) return -1;
    }
    size_t i = hm_strhash(key) & (s->cap - 1);
    for (; s->slots[i].key; i = (i + 1) & (s->cap - 1))
        if (strcmp(s->slots[i].key, key) == 0) return 0;
    s->slots[i].key = key;
    s->slots[i].idx = idx;
    s->n++;
    return 1;
}

/* ---- string arena: NUL-terminated copies that live until hm_arena_free ---- */

typedef struct hm_arena_chunk {
    struct hm_arena_chunk *next;
    size_t used, cap;
    char data[];
} hm_arena_chunk;

typedef struct hm_arena {
    hm_arena_chunk *head;
} hm_arena;

/* Copy n bytes of s plus a NUL; NULL when out of memory (or n + 1 overflows). */
static inline char *hm_arena_strndup(hm_arena *a, const char *s, size_t n) {
    if (n == SIZE_MAX) return NULL;
    hm_arena_chunk *c = a->head;
    if (!c || c->cap - c->used < n + 1) {
        size_t cap = n + 1 > 65536 ? n + 1 : 65536;
        if (cap > SIZE_MAX - sizeof *c) return NULL;
        c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->used = 0;
        c->cap = cap;
        c->next = a->head;
        a->head = c;
    }
    char *p = c->data + c->used;
    if (n) memcpy(p, s, n);
    p[n] = '\0';
    c->used += n + 1;
    return p;
}

static inline void hm_arena_free(hm_arena *a) {
    while (a->head) {
        hm_arena_chunk *next = a->head->next;
        free(a->head);
        a->head = next;
    }
}

/* ---- split models (gguf_read.c / gguf_split.c) ---- */

typedef struct hm_gguf hm_gguf;
/* hm_gguf_open without looking for splits: one file. */
hm_status hm_gguf_open_one(hm_gguf **out, const char *path, hm_err *err);
/* After g's own parse: when g is the first of a split model, open the others and adopt them. */
hm_status hm_gguf_splits_load(hm_gguf *g, hm_err *err);
/* Append part's tensors to g's table with file index file; g takes ownership of part on success. */
hm_status hm_gguf_adopt_split(hm_gguf *g, hm_gguf *part, int32_t file, hm_err *err);

#endif
