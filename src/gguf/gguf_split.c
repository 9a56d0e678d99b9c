/* gguf_split.c - models written as several GGUF files, as llama.cpp's llama-gguf-split writes them.
 *
 * Layout (llama.cpp tools/gguf-split, src/llama.cpp llama_split_path): N files named
 * PREFIX-%05d-of-%05d.gguf (1-based number, count), each a complete GGUF with its own tensor
 * table and data section; every file has split.no (u16, 0-based), split.count (u16) and
 * split.tensors.count (i32, the tensors of all files); the first also holds all the model's
 * metadata. Invariants after a successful hm_gguf_splits_load: the handle's tensor table is every
 * file's tensors in file order, each carrying its file index; tensor names are unique across
 * files; every file agrees on split.count and split.tensors.count, has its own split.no, and the
 * tensors add up to split.tensors.count. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "gguf_impl.h"

/* key as an integer in [lo, hi]; absent is *present = false */
static hm_status split_key(const hm_gguf *g, const char *key, int64_t lo, int64_t hi, int64_t *v, bool *present,
                           hm_err *err) {
    *present = hm_gguf_find_key(g, key) >= 0;
    if (!*present) return HM_OK;
    if (!hm_gguf_get_int(g, key, v) || *v < lo || *v > hi)
        return hm_errf(err, HM_ERR_FORMAT, "%s: %s is not an integer in [%" PRId64 ", %" PRId64 "]", hm_gguf_path(g), key,
                       lo, hi);
    return HM_OK;
}

hm_status hm_gguf_splits_load(hm_gguf *g, hm_err *err) {
    const char *path = hm_gguf_path(g);
    int64_t count = 1, no = 0, nt = -1;
    bool has_count, has_no, has_nt;
    hm_status st;
    if ((st = split_key(g, "split.count", 0, 99999, &count, &has_count, err)) ||
        (st = split_key(g, "split.no", 0, 99998, &no, &has_no, err)) ||
        (st = split_key(g, "split.tensors.count", 0, INT32_MAX, &nt, &has_nt, err)))
        return st;
    if (!has_count || count <= 1) return HM_OK; /* one file */
    if (!*path) return hm_errf(err, HM_ERR_FORMAT, "<memory>: split.count = %" PRId64 ": a split model needs its files", count);
    char postfix[40];
    snprintf(postfix, sizeof postfix, "-%05d-of-%05d.gguf", (int)no + 1, (int)count);
    size_t n = strlen(path), np = strlen(postfix);
    if (no != 0) {
        if (n > np && strcmp(path + n - np, postfix) == 0)
            return hm_errf(err, HM_ERR_ARG, "%s: split %d of %d; open the first split, %.*s-00001-of-%05d.gguf, which holds "
                           "the metadata", path, (int)no + 1, (int)count, (int)(n - np), path, (int)count);
        return hm_errf(err, HM_ERR_ARG, "%s: split.no = %d of %d; open the model's first split", path, (int)no + 1, (int)count);
    }
    if (n <= np || strcmp(path + n - np, postfix) != 0)
        return hm_errf(err, HM_ERR_FORMAT, "%s: split.count = %d, but the name does not end in '%s': the other splits are "
                       "found by that name (PREFIX-0000i-of-%05d.gguf)", path, (int)count, postfix, (int)count);
    if (has_nt && hm_gguf_n_tensors(g) > nt)
        return hm_errf(err, HM_ERR_FORMAT, "%s: %" PRId64 " tensors, more than split.tensors.count = %" PRId64, path,
                       hm_gguf_n_tensors(g), nt);
    char *sp = malloc(n + 1);
    if (!sp) return hm_errf(err, HM_ERR_NOMEM, "%s: out of memory", path);
    for (int32_t i = 1; i < (int32_t)count && st == HM_OK; i++) {
        snprintf(sp, n + 1, "%.*s-%05d-of-%05d.gguf", (int)(n - np), path, i + 1, (int)count);
        hm_gguf *part = NULL;
        hm_err e2;
        if ((st = hm_gguf_open_one(&part, sp, &e2)) != HM_OK) {
            st = hm_errf(err, st, "split %d of %d of %s: %s", i + 1, (int)count, path, e2.msg);
            break;
        }
        int64_t c2 = 0, no2 = -1, nt2 = -1;
        bool h1, h2, h3;
        if ((st = split_key(part, "split.count", 0, 99999, &c2, &h1, err)) ||
            (st = split_key(part, "split.no", 0, 99998, &no2, &h2, err)) ||
            (st = split_key(part, "split.tensors.count", 0, INT32_MAX, &nt2, &h3, err))) {
        } else if (!h1 || c2 != count) {
            st = hm_errf(err, HM_ERR_FORMAT, "%s: split.count is %s%" PRId64 " but %s's is %" PRId64 ": a split of another model",
                         sp, h1 ? "" : "absent, ", c2, path, count);
        } else if (!h2 || no2 != i) {
            st = hm_errf(err, HM_ERR_FORMAT, "%s: split.no is %s%" PRId64 ", expected %d: a split of another model or renamed",
                         sp, h2 ? "" : "absent, ", no2, i);
        } else if (has_nt && (!h3 || nt2 != nt)) {
            st = hm_errf(err, HM_ERR_FORMAT, "%s: split.tensors.count is %" PRId64 " but %s's is %" PRId64
                         ": a split of another model", sp, nt2, path, nt);
        } else {
            st = hm_gguf_adopt_split(g, part, i, err);
            if (st == HM_OK) part = NULL; /* g owns it */
        }
        hm_gguf_close(part);
    }
    free(sp);
    if (st == HM_OK && has_nt && hm_gguf_n_tensors(g) != nt)
        st = hm_errf(err, HM_ERR_FORMAT, "%s: the %d splits hold %" PRId64 " tensors, split.tensors.count says %" PRId64, path,
                     (int)count, hm_gguf_n_tensors(g), nt);
    return st;
}
