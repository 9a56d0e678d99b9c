/* tokenizer_impl.h - the hm_tokenizer struct and helpers shared by the files of tokenizer/.
 * Invariants: ids in every table are in [0, n_vocab); map and merge tables are open-addressed
 * with power-of-two sizes at most half full; all strings live in the two arenas. */
#ifndef HM_TOKENIZER_IMPL_H
#define HM_TOKENIZER_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pretok.h"
#include "tokenizer.h"

/* GEMMA4: llama.cpp's "gemma4" vocabulary, BPE over raw UTF-8 with U+2581 spaces (bpe_gemma4.c);
 * keyed, decoded and byte-tokened like SPM. */
typedef enum hm_vocab_kind { HM_VOCAB_BPE = 0, HM_VOCAB_SPM = 1, HM_VOCAB_GEMMA4 = 2 } hm_vocab_kind;

typedef struct hm_merge_slot {
    uint64_t key; /* (left id << 32) | right id; UINT64_MAX = empty */
    int32_t rank;
    int32_t id;   /* the merged token */
} hm_merge_slot;

#define HM_MAX_EOG 16

struct hm_tokenizer {
    hm_vocab_kind kind;
    char model[16];
    char pre[32];
    int32_t n_vocab;

    /* token text as stored in the file, and piece = the bytes it stands for */
    char *text;
    uint32_t *text_off, *text_len;
    char *piece;
    uint32_t *piece_off, *piece_len;
    uint32_t max_piece;
    uint8_t *type;
    float *score; /* SPM only, else NULL */

    /* lookup: BPE: piece bytes of normal tokens -> id; SPM: text of normal/user tokens -> id */
    int32_t *map;
    uint32_t map_mask;
    /* BPE merges */
    hm_merge_slot *merges;
    uint32_t merge_mask;
    int32_t n_merges;
    int32_t byte_tok[256]; /* token of each single byte, -1 if none */

    /* special tokens to match in text: sorted by first byte, then longest first */
    int32_t *spec;
    uint32_t spec_start[257];

    /* pre-tokenizer (BPE) */
    const hm_pretok_def *pretok;
    pcre2_code *rx[HM_PRETOK_MAX_REGEX];
    int n_rx;

    int32_t bos, eos, eot, pad, unk;
    bool add_bos, add_eos, add_space_prefix;
    int32_t eog[HM_MAX_EOG];
    int n_eog;
    char *chat_template; /* owned, NUL-terminated; NULL when the file has none */
};

/* Lookup of bytes s[0..n) in the map; -1 when absent. */
int32_t hm_tok_map_find(const hm_tokenizer *t, const char *s, size_t n);
/* Merge of (a, b): the rank (or -1) and the merged id. */
static inline uint32_t hm_tok_hash64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return (uint32_t)k;
}
static inline int32_t hm_tok_merge_find(const hm_tokenizer *t, int32_t a, int32_t b, int32_t *id) {
    if (!t->merges) return -1;
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    for (uint32_t i = hm_tok_hash64(key) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
        const hm_merge_slot *s = &t->merges[i];
        if (s->key == key) { *id = s->id; return s->rank; }
        if (s->key == UINT64_MAX) return -1;
    }
}

/* A growable id vector. */
typedef struct hm_idvec {
    int32_t *v;
    size_t n, cap;
} hm_idvec;
bool hm_idvec_push(hm_idvec *v, int32_t id);

/* Per-call scratch of the BPE/SPM merge loops (grown on demand, freed by the caller). */
typedef struct hm_tok_scratch {
    void *buf;
    size_t cap;
} hm_tok_scratch;
void *hm_tok_scratch_get(hm_tok_scratch *s, size_t bytes);

/* Append the ids of one pre-tokenized piece (raw bytes). false on allocation failure. */
bool hm_bpe_piece(const hm_tokenizer *t, const char *s, size_t n, hm_idvec *out, hm_tok_scratch *sc);
/* Append the ids of one text segment (already space-escaped to U+2581 and prefixed). */
/* gemma4: append the ids of one word (spaces already U+2581, no newline next to other text). */
bool hm_g4_word(const hm_tokenizer *t, const char *s, size_t n, hm_idvec *out, hm_tok_scratch *sc);
bool hm_spm_segment(const hm_tokenizer *t, const char *s, size_t n, hm_idvec *out, hm_tok_scratch *sc);

#endif
