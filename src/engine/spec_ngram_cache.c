/* spec_ngram_cache.c - ngram-cache, lookup decoding from n-gram statistics of the history
 * (llama.cpp's common_ngram_cache_draft with its context cache; written from its description):
 * every n-gram of 1..4 tokens of the history (+ the pending token) maps to the counts of the
 * tokens that followed it. A draft token is the most frequent follower of the longest n-gram
 * ending the sequence (+ the draft so far) whose counts pass llama.cpp's "lax" thresholds (at
 * least 2, 2, 1, 1 samples and 66, 50, 50, 50 % for n = 1..4); up to 8 tokens (llama.cpp's fixed
 * n_draft). Ties go to the smaller id (llama.cpp's order is its hash map's). llama.cpp's dynamic
 * and static caches (files) are not read: both empty.
 *
 * Invariants: the table holds the n-grams of seq[0..n_done), the sequence the drafter last saw;
 * the history is only appended to between steps, so each draft only counts the new tokens
 * (O(4) per token; the prefix is compared each step, O(n)); another history rebuilds from empty. Sized at open for n_ctx + 1
 * tokens: drafting never allocates. */
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "spec.h"

#define NG_MAX 4
#define NG_DRAFT 8
static const int32_t min_samples[NG_MAX] = {2, 2, 1, 1}; /* llama.cpp's draft_min_sample_size_lax */
static const int32_t min_percent[NG_MAX] = {66, 50, 50, 50}; /* draft_min_percent_lax */

typedef struct ng_entry {
    int32_t tok[NG_MAX]; /* the n-gram, -1 past its length; tok[0] == -2: empty slot */
    int32_t head;        /* first follower (index into fol), -1 none */
} ng_entry;

typedef struct ng_follower {
    int32_t token, count, next;
} ng_follower;

struct hm_spec_ngcache {
    ng_entry *tab;  /* [cap], open addressing, cap a power of 2 >= 2 * NG_MAX * (n_ctx + 1) */
    uint64_t mask;
    ng_follower *fol; /* [NG_MAX * (n_ctx + 1)] */
    int32_t n_fol, n_done, n_max_seq;
    int32_t *seq;   /* [n_ctx + 1 + NG_DRAFT] the sequence (+ the draft while drafting) */
};

hm_status hm_spec_ngcache_open(hm_spec_ngcache **out, int32_t n_ctx, hm_err *err) {
    *out = NULL;
    hm_spec_ngcache *c = calloc(1, sizeof *c);
    if (!c) return hm_errf(err, HM_ERR_NOMEM, "ngram-cache: out of memory");
    uint64_t cap = 1;
    while (cap < 2ull * NG_MAX * ((uint64_t)n_ctx + 1)) cap <<= 1;
    c->mask = cap - 1;
    c->n_max_seq = n_ctx + 1;
    c->tab = malloc(cap * sizeof *c->tab);
    c->fol = malloc((size_t)NG_MAX * ((size_t)n_ctx + 1) * sizeof *c->fol);
    c->seq = malloc(((size_t)n_ctx + 1 + NG_DRAFT) * sizeof *c->seq);
    if (!c->tab || !c->fol || !c->seq) {
        hm_spec_ngcache_close(c);
        return hm_errf(err, HM_ERR_NOMEM, "ngram-cache: out of memory for a context of %d", n_ctx);
    }
    hm_spec_ngcache_reset(c);
    *out = c;
    return HM_OK;
}

void hm_spec_ngcache_close(hm_spec_ngcache *c) {
    if (!c) return;
    free(c->tab);
    free(c->fol);
    free(c->seq);
    free(c);
}

void hm_spec_ngcache_reset(hm_spec_ngcache *c) {
    for (uint64_t i = 0; i <= c->mask; i++) c->tab[i].tok[0] = -2;
    c->n_fol = 0;
    c->n_done = 0;
}

int32_t hm_spec_ngcache_len(const hm_spec_ngcache *c) { return c->n_done; }

static uint64_t ng_hash(const int32_t *t, int n) {
    uint64_t h = (uint64_t)n * 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < n; i++) h = (h ^ (uint32_t)t[i]) * 11400714819323198485ull;
    return h ^ (h >> 29);
}

/* The slot of n-gram t[0..n): its entry, or the empty slot where it would go. */
static ng_entry *ng_find(const hm_spec_ngcache *c, const int32_t *t, int n) {
    for (uint64_t i = ng_hash(t, n) & c->mask;; i = (i + 1) & c->mask) {
        ng_entry *e = &c->tab[i];
        if (e->tok[0] == -2) return e;
        int k = 0;
        while (k < n && e->tok[k] == t[k]) k++;
        if (k == n && (n == NG_MAX || e->tok[n] == -1)) return e;
    }
}

static void ng_count(hm_spec_ngcache *c, const int32_t *t, int n, int32_t follower) {
    ng_entry *e = ng_find(c, t, n);
    if (e->tok[0] == -2) {
        for (int k = 0; k < NG_MAX; k++) e->tok[k] = k < n ? t[k] : -1;
        e->head = -1;
    }
    for (int32_t f = e->head; f >= 0; f = c->fol[f].next)
        if (c->fol[f].token == follower) {
            c->fol[f].count++;
            return;
        }
    ng_follower *nf = &c->fol[c->n_fol];
    nf->token = follower;
    nf->count = 1;
    nf->next = e->head;
    e->head = c->n_fol++;
}

/* Count the n-grams ending before seq[i] for i in [n_done, n). */
static void ng_update(hm_spec_ngcache *c, int32_t n) {
    for (int32_t i = c->n_done; i < n; i++)
        for (int sz = 1; sz <= NG_MAX && sz <= i; sz++) ng_count(c, c->seq + i - sz, sz, c->seq[i]);
    c->n_done = n;
}

int32_t hm_spec_ngcache_draft(hm_spec_ngcache *c, const int32_t *hist, int32_t n, int32_t tok, int32_t *draft,
                              int32_t cap) {
    if (n + 1 > c->n_max_seq) return 0;
    /* the table's sequence must be a prefix of hist + tok: else start over */
    bool prefix = c->n_done <= n + 1;
    for (int32_t i = 0; prefix && i < c->n_done; i++) prefix = c->seq[i] == (i < n ? hist[i] : tok);
    if (!prefix) hm_spec_ngcache_reset(c);
    if (c->n_done < n) memcpy(c->seq + c->n_done, hist + c->n_done, (size_t)(n - c->n_done) * sizeof *hist);
    c->seq[n] = tok;
    ng_update(c, n + 1);
    const int32_t len = n + 1;
    if (len < 2) return 0;
    int32_t k = 0;
    if (cap > NG_DRAFT) cap = NG_DRAFT;
    while (k < cap) {
        int32_t pick = -1;
        for (int sz = NG_MAX; sz >= 1 && pick < 0; sz--) {
            if (sz > len + k) continue;
            const ng_entry *e = ng_find(c, c->seq + len + k - sz, sz);
            if (e->tok[0] == -2) continue;
            int32_t best = -1, best_n = 0, sum = 0;
            for (int32_t f = e->head; f >= 0; f = c->fol[f].next) {
                const ng_follower *fo = &c->fol[f];
                sum += fo->count;
                if (fo->count > best_n || (fo->count == best_n && fo->token < best)) best = fo->token, best_n = fo->count;
            }
            if (sum < min_samples[sz - 1] || 100 * best_n < min_percent[sz - 1] * sum) continue;
            pick = best;
        }
        if (pick < 0) break;
        c->seq[len + k] = pick; /* the draft extends the lookup, never the counts */
        draft[k++] = pick;
    }
    return k;
}
