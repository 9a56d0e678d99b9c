/* fixture.h - shared helpers for the tests that compare our logits with a reference (Hugging Face
 * transformers) fixture directory holding:
 *   model.gguf  the model
 *   tokens.txt  token ids, separated by any non-digit characters (spaces, commas, newlines)
 *   logits.f32  the reference logits, [n_tokens, n_vocab] little-endian f32
 *
 * Typical use:
 *   fixture fx;
 *   static int32_t tok[MAX_TOK];
 *   if (!fixture_open(&fx, DIR, tok, MAX_TOK) || fx.n <= 0) return fixture_skip(&fx);
 *   hm_model *m = fixture_model(&fx, "qwen35moe");
 *   if (!m) return test_done();
 *   size_t got;
 *   float *want = fixture_read_logits(&fx, hm_model_n_vocab(m), &got);
 *   ... fixture_maxdiff / fixture_argmax / fixture_top1_agree ...
 *   free(want);
 *   fixture_close(&fx);
 *
 * Everything is static inline; include after test.h is not required (this includes it). */
#ifndef HM_TEST_FIXTURE_H
#define HM_TEST_FIXTURE_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hotmoe.h"
#include "test.h"

/* A fixture directory: malloc'd paths under the source tree, the open logits file, the token count. */
typedef struct {
    const char *dir; /* as given, e.g. "tests/fixtures/hf_ref/gemma4/" (with the trailing slash) */
    char *gguf, *tokens, *logits;
    FILE *fl; /* logits.f32 opened "rb" (NULL if absent); closed by fixture_read_logits */
    int n;    /* tokens read from tokens.txt, -1 when it cannot be opened */
} fixture;

/* test_src_path(rel) as a malloc'd string (test_src_path's own buffer is static and reused). */
static inline char *fixture_path(const char *rel) {
    const char *p = test_src_path(rel);
    char *s = malloc(strlen(p) + 1);
    strcpy(s, p);
    return s;
}

/* Read up to cap non-negative decimal ids from path into tok (any non-digit separates them; ids past
 * cap are dropped). Returns how many were stored, or -1 when the file cannot be opened. */
static inline int fixture_read_tokens(const char *path, int32_t *tok, int cap) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int n = 0, c;
    long v = -1;
    while ((c = fgetc(f)) != EOF) {
        if (c >= '0' && c <= '9') {
            v = (v < 0 ? 0 : v * 10) + (c - '0');
        } else if (v >= 0) {
            if (n < cap) tok[n++] = (int32_t)v;
            v = -1;
        }
    }
    if (v >= 0 && n < cap) tok[n++] = (int32_t)v;
    fclose(f);
    return n;
}

/* Resolve dir's three files, open logits.f32 (kept open in fx->fl), check model.gguf opens, and read
 * tokens.txt into tok (fx->n). Returns false when model.gguf or logits.f32 cannot be opened or
 * tokens.txt cannot be read (the caller skips); true otherwise, including when tokens.txt holds no
 * ids (fx->n == 0: the caller decides whether that is a skip or a failure). */
static inline bool fixture_open(fixture *fx, const char *dir, int32_t *tok, int cap) {
    char rel[1024];
    fx->dir = dir;
    snprintf(rel, sizeof rel, "%smodel.gguf", dir);
    fx->gguf = fixture_path(rel);
    snprintf(rel, sizeof rel, "%stokens.txt", dir);
    fx->tokens = fixture_path(rel);
    snprintf(rel, sizeof rel, "%slogits.f32", dir);
    fx->logits = fixture_path(rel);
    fx->fl = fopen(fx->logits, "rb");
    FILE *fg = fopen(fx->gguf, "rb");
    fx->n = fixture_read_tokens(fx->tokens, tok, cap);
    if (!fx->fl || !fg || fx->n < 0) {
        if (fg) fclose(fg);
        return false;
    }
    fclose(fg);
    return true;
}

/* Say the fixture is not present and return 77 (ctest's SKIP_RETURN_CODE): `return fixture_skip(&fx);` */
static inline int fixture_skip(const fixture *fx) {
    fprintf(stderr, "fixture %s not present: skipped\n", fx->dir);
    return 77;
}

/* Read the reference logits, n x nv floats, into a malloc'd array (the caller frees it) and close the
 * file. *got is how many floats were read; a short file is a failed check. */
static inline float *fixture_read_logits(fixture *fx, int32_t nv, size_t *got) {
    const size_t cnt = (size_t)fx->n * (size_t)nv;
    float *want = malloc(cnt * sizeof(float));
    *got = fread(want, sizeof(float), cnt, fx->fl);
    fclose(fx->fl);
    fx->fl = NULL;
    CHECKF(*got == cnt, "%s: %zu floats, want %d x %d", fx->logits, *got, fx->n, nv);
    return want;
}

/* Open fx->gguf (a failed check, naming the error, when it does not open) and, when arch is not
 * NULL and the model opened, check that hm_model_arch is arch. Returns the model or NULL. */
static inline hm_model *fixture_model(const fixture *fx, const char *arch) {
    hm_model *m = NULL;
    hm_err err;
    CHECKF(hm_model_open(&m, fx->gguf, NULL, &err) == HM_OK, "%s", err.msg);
    if (m && arch) CHECK(strcmp(hm_model_arch(m), arch) == 0);
    return m;
}

/* Free the paths (the logits file is already closed by fixture_read_logits). */
static inline void fixture_close(fixture *fx) {
    if (fx->fl) fclose(fx->fl);
    free(fx->gguf);
    free(fx->tokens);
    free(fx->logits);
}

/* Running max |a[i] - b[i]| over i < n, starting from d (a NaN difference replaces the running max
 * until a later, larger-or-unordered difference does: `if (!(e <= d)) d = e`). */
static inline double fixture_maxdiff_from(double d, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (!(e <= d)) d = e;
    }
    return d;
}

/* max |a[i] - b[i]| over i < n (rows are contiguous, so n may span several rows). */
static inline double fixture_maxdiff(const float *a, const float *b, size_t n) {
    return fixture_maxdiff_from(0, a, b, n);
}

/* Index of the largest of x[0..n) (the first one on ties). */
static inline int fixture_argmax(const float *x, int32_t n) {
    int a = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[a]) a = i;
    return a;
}

/* How many of rows [0, rows) of got and want (each nv wide) have the same top-1 token. */
static inline int fixture_top1_agree(const float *got, const float *want, int rows, int32_t nv) {
    int agree = 0;
    for (int t = 0; t < rows; t++)
        agree += fixture_argmax(got + (size_t)t * nv, nv) == fixture_argmax(want + (size_t)t * nv, nv);
    return agree;
}

#endif
