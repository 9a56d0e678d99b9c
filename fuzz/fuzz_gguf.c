/* fuzz_gguf.c - libFuzzer target for the GGUF reader.
 *
 * Parses the input with hm_gguf_open_mem and, when it parses, walks everything the reader
 * exposes: every kv through every getter (by index and by key), every array element including
 * nested arrays and string elements, every tensor (its data range is touched at both ends so
 * ASan sees any out-of-bounds pointer). A parse failure must come with a message. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t sink;

static void touch(const void *p, uint64_t n) {
    if (!n) return;
    const volatile uint8_t *b = p;
    sink += b[0] + b[n - 1];
}

static void walk_arr(const hm_gguf_arr *a, size_t size) {
    if (a->file_offset > size) abort();
    size_t es = hm_gguf_vtype_size(a->elem_type);
    if (es && a->n * es > size - a->file_offset) abort();
    for (uint64_t i = 0; i <= a->n; i++) { /* one past the end must be refused */
        int64_t iv;
        double fv;
        hm_gguf_str s;
        hm_gguf_arr sub;
        bool ok_i = hm_gguf_arr_int(a, i, &iv), ok_f = hm_gguf_arr_float(a, i, &fv);
        bool ok_s = hm_gguf_arr_str(a, i, &s), ok_a = hm_gguf_arr_arr(a, i, &sub);
        if (i == a->n && (ok_i || ok_f || ok_s || ok_a)) abort();
        if (ok_i) sink += (uint64_t)iv;
        if (ok_f) sink += (uint64_t)(fv == fv);
        if (ok_s) touch(s.ptr, s.len);
        if (ok_a) walk_arr(&sub, size);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    hm_gguf *g = NULL;
    hm_err err = {{0}};
    hm_status st = hm_gguf_open_mem(&g, data, size, &err);
    if (st != HM_OK) {
        if (g || !err.msg[0] || st != HM_ERR_FORMAT) abort(); /* only format errors are expected */
        return 0;
    }
    sink += hm_gguf_version(g) + hm_gguf_alignment(g) + hm_gguf_data_offset(g) + hm_gguf_file_size(g);
    for (int64_t i = 0; i < hm_gguf_n_kv(g); i++) {
        const char *key = hm_gguf_key(g, i);
        if (!key || hm_gguf_find_key(g, key) != i) abort();
        int64_t iv;
        double fv;
        bool bv;
        hm_gguf_str s;
        hm_gguf_arr a;
        if (hm_gguf_kv_int(g, i, &iv) != hm_gguf_get_int(g, key, &iv)) abort();
        if (hm_gguf_kv_float(g, i, &fv) != hm_gguf_get_float(g, key, &fv)) abort();
        if (hm_gguf_kv_bool(g, i, &bv) != hm_gguf_get_bool(g, key, &bv)) abort();
        if (hm_gguf_kv_str(g, i, &s)) touch(s.ptr, s.len);
        if (hm_gguf_kv_arr(g, i, &a)) walk_arr(&a, size);
        sink += (uint64_t)hm_gguf_kv_type(g, i);
    }
    for (int64_t i = 0; i < hm_gguf_n_tensors(g); i++) {
        const hm_gguf_tensor *t = hm_gguf_tensor_at(g, i);
        if (hm_gguf_find_tensor(g, t->name) != t) abort();
        if (t->n_dims > HM_GGUF_MAX_DIMS || t->file_offset > size || t->nbytes > size - t->file_offset) abort();
        if ((const uint8_t *)t->data != data + t->file_offset) abort();
        touch(t->data, t->nbytes);
    }
    hm_gguf_close(g);
    return 0;
}
