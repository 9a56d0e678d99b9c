/* gguf_write.c - the streaming, atomic GGUF v3 writer.
 *
 * Metadata is serialised into a memory buffer as it is set (it is small: a tokenizer is a few
 * MB); tensors are declared up front so the tensor table (with every offset) can be written at
 * begin_data; tensor bytes then go straight to the file as the caller produces them, in
 * declaration order, each tensor padded to the alignment (the last one too, as ggml does).
 *
 * Invariants: everything goes to PATH.tmp; PATH appears only through rename() after fsync, so
 * a reader never sees a partial file. PATH must be new, a regular file, or a symlink to one (then
 * PATH means its target); a FIFO, device or directory is refused at open (core/file.h). The first failure is sticky; finish/abort remove
 * PATH.tmp unless it was renamed. Declared sizes are validated the same way the reader
 * validates them, so the writer cannot produce a file the reader rejects. */
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <libgen.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/alloc.h"
#include "../core/file.h"
#include "../quant/quant.h"
#include "gguf.h"
#include "gguf_impl.h"

typedef struct wtensor {
    const char *name; /* arena */
    int type;
    uint32_t n_dims;
    int64_t ne[HM_GGUF_MAX_DIMS];
    uint64_t nbytes;
    uint64_t offset; /* relative to the data section (of its split's file), aligned */
    int32_t split;   /* which file of a split model (0 without splits) */
} wtensor;

struct hm_gguf_writer {
    char *path, *tmp; /* owned */
    FILE *f;
    uint32_t alignment;
    hm_status status; /* first failure, sticky */
    hm_err msg;
    hm_err *user_err; /* borrowed, may be NULL */
    hm_arena arena;
    /* metadata, serialised */
    uint8_t *meta;
    size_t meta_len, meta_cap;
    int64_t n_kv;
    hm_strset keys;
    /* tensors */
    wtensor *t;
    int64_t n_t, cap_t;
    hm_strset names;
    uint64_t data_size; /* running end of the data section (aligned) */
    /* streaming state */
    bool begun;
    int64_t cur;          /* tensor being written */
    uint64_t cur_written; /* bytes of it written so far */
    uint64_t pos;         /* bytes written to the file so far */
    /* split output (llama-gguf-split's layout, hm_gguf_writer_set_split): n_split files; path/tmp
     * above are the current split's, sp_path/sp_tmp every split's (owned) */
    uint64_t split_bytes;  /* a split's tensor bytes (soft limit), 0 = none */
    int32_t split_tensors; /* tensors per split, 0 = none */
    bool split;
    int32_t n_split, cur_split, n_opened;
    char **sp_path, **sp_tmp;
};

static hm_status fail(hm_gguf_writer *w, hm_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static hm_status fail(hm_gguf_writer *w, hm_status code, const char *fmt, ...) {
    if (w->status) return w->status;
    va_list ap;
    va_start(ap, fmt);
    hm_verrf(&w->msg, code, fmt, ap);
    va_end(ap);
    if (w->user_err) *w->user_err = w->msg;
    w->status = code;
    return code;
}

const char *hm_gguf_writer_error(const hm_gguf_writer *w) { return w && w->status ? w->msg.msg : ""; }

/* ---- open / abort ---- */

static void writer_free(hm_gguf_writer *w) {
    if (w->sp_path && w->path == w->sp_path[w->cur_split]) { /* path/tmp point at the current split's */
        for (int32_t i = 0; i < w->n_split; i++) free(w->sp_path[i]), free(w->sp_tmp[i]);
        w->path = w->tmp = NULL;
    }
    free(w->sp_path);
    free(w->sp_tmp);
    free(w->path);
    free(w->tmp);
    free(w->meta);
    free(w->t);
    hm_strset_free(&w->keys);
    hm_strset_free(&w->names);
    hm_arena_free(&w->arena);
    free(w);
}

hm_status hm_gguf_writer_open(hm_gguf_writer **out, const char *path, uint32_t alignment, hm_err *err) {
    *out = NULL;
    if (alignment == 0) alignment = HM_GGUF_DEFAULT_ALIGNMENT;
    if (alignment & (alignment - 1))
        return hm_errf(err, HM_ERR_ARG, "%s: alignment %u is not a power of two", path, alignment);
    /* only a regular file (or a link to one: its target) is replaced; a FIFO or a device is refused */
    char *target = NULL;
    hm_status tst = hm_file_replace_target(path, &target, err);
    if (tst != HM_OK) return tst;
    hm_gguf_writer *w = calloc(1, sizeof *w);
    size_t n = strlen(target);
    if (!w || !(w->tmp = malloc(n + 5))) {
        free(target);
        if (w) writer_free(w);
        return hm_errf(err, HM_ERR_NOMEM, "%s: out of memory", path);
    }
    w->path = target;
    memcpy(w->tmp, target, n);
    memcpy(w->tmp + n, ".tmp", 5);
    w->alignment = alignment;
    w->user_err = err;
    int fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || !(w->f = fdopen(fd, "wb"))) {
        int e = errno;
        if (fd >= 0) {
            close(fd);
            unlink(w->tmp);
        }
        hm_status st = hm_errf(err, HM_ERR_IO, "%s: cannot create: %s", w->tmp, strerror(e));
        writer_free(w);
        return st;
    }
    *out = w;
    return HM_OK;
}

void hm_gguf_writer_abort(hm_gguf_writer *w) {
    if (!w) return;
    if (w->f) fclose(w->f);
    unlink(w->tmp);
    for (int32_t i = 0; w->sp_tmp && i < w->n_opened; i++) unlink(w->sp_tmp[i]);
    writer_free(w);
}

/* ---- metadata ---- */

static bool meta_put(hm_gguf_writer *w, const void *p, size_t n) {
    if (n > w->meta_cap - w->meta_len) {
        size_t cap = w->meta_cap ? w->meta_cap : 4096;
        while (cap - w->meta_len < n) {
            if (cap > SIZE_MAX / 2) return false;
            cap *= 2;
        }
        uint8_t *m = realloc(w->meta, cap);
        if (!m) return false;
        w->meta = m;
        w->meta_cap = cap;
    }
    if (n) memcpy(w->meta + w->meta_len, p, n);
    w->meta_len += n;
    return true;
}

static bool meta_u32(hm_gguf_writer *w, uint32_t v) { return meta_put(w, &v, 4); }
static bool meta_u64(hm_gguf_writer *w, uint64_t v) { return meta_put(w, &v, 8); }
static bool meta_str(hm_gguf_writer *w, const char *p, uint64_t len) {
    return meta_u64(w, len) && meta_put(w, p, (size_t)len);
}

static bool fits(hm_gguf_vtype t, const hm_gguf_value *v) {
    switch (t) {
    case HM_GGUF_U8: return v->u <= UINT8_MAX;
    case HM_GGUF_U16: return v->u <= UINT16_MAX;
    case HM_GGUF_U32: return v->u <= UINT32_MAX;
    case HM_GGUF_BOOL: return v->u <= 1;
    case HM_GGUF_I8: return v->i >= INT8_MIN && v->i <= INT8_MAX;
    case HM_GGUF_I16: return v->i >= INT16_MIN && v->i <= INT16_MAX;
    case HM_GGUF_I32: return v->i >= INT32_MIN && v->i <= INT32_MAX;
    default: return true;
    }
}

/* Serialise the value part (type already written by the caller for top-level values). */
static hm_status put_value(hm_gguf_writer *w, const char *key, const hm_gguf_value *v, int depth) {
    hm_gguf_vtype t = v->type;
    bool ok = true;
    if ((unsigned)t >= HM_GGUF_VTYPE_COUNT) return fail(w, HM_ERR_ARG, "%s: key '%s': unknown value type %d", w->path, key, (int)t);
    if (!fits(t, v)) return fail(w, HM_ERR_ARG, "%s: key '%s': value does not fit type %s", w->path, key, hm_gguf_vtype_name(t));
    switch (t) {
    case HM_GGUF_U8: case HM_GGUF_U16: case HM_GGUF_U32: case HM_GGUF_U64: case HM_GGUF_BOOL:
        ok = meta_put(w, &v->u, hm_gguf_vtype_size(t)); /* little-endian: the low bytes come first */
        break;
    case HM_GGUF_I8: case HM_GGUF_I16: case HM_GGUF_I32: case HM_GGUF_I64:
        ok = meta_put(w, &v->i, hm_gguf_vtype_size(t));
        break;
    case HM_GGUF_F32: { /* out-of-range double -> float is undefined in C: saturate to +-inf */
        float f = v->f > FLT_MAX ? INFINITY : v->f < -FLT_MAX ? -INFINITY : (float)v->f;
        ok = meta_put(w, &f, 4);
        break;
    }
    case HM_GGUF_F64: ok = meta_put(w, &v->f, 8); break;
    case HM_GGUF_STRING:
        if (!v->str.ptr && v->str.len) return fail(w, HM_ERR_ARG, "%s: key '%s': NULL string of length %llu", w->path, key, (unsigned long long)v->str.len);
        ok = meta_str(w, v->str.ptr, v->str.len);
        break;
    case HM_GGUF_ARRAY: {
        hm_gguf_vtype et = v->arr.elem_type;
        uint64_t n = v->arr.n;
        if ((unsigned)et >= HM_GGUF_VTYPE_COUNT)
            return fail(w, HM_ERR_ARG, "%s: key '%s': unknown array element type %d", w->path, key, (int)et);
        if (et == HM_GGUF_ARRAY && depth + 1 >= HM_GGUF_MAX_ARRAY_DEPTH)
            return fail(w, HM_ERR_ARG, "%s: key '%s': arrays nested deeper than %d", w->path, key, HM_GGUF_MAX_ARRAY_DEPTH);
        if (n && !v->arr.data) return fail(w, HM_ERR_ARG, "%s: key '%s': NULL array data for %llu elements", w->path, key, (unsigned long long)n);
        if (!meta_u32(w, (uint32_t)et) || !meta_u64(w, n)) break;
        size_t es = hm_gguf_vtype_size(et), bytes;
        if (es) {
            if (n > SIZE_MAX || !hm_mul_ok((size_t)n, es, &bytes))
                return fail(w, HM_ERR_ARG, "%s: key '%s': array of %llu elements is too large", w->path, key, (unsigned long long)n);
            if (et == HM_GGUF_BOOL)
                for (uint64_t i = 0; i < n; i++)
                    if (((const uint8_t *)v->arr.data)[i] > 1)
                        return fail(w, HM_ERR_ARG, "%s: key '%s': bool array element %llu is not 0 or 1", w->path, key, (unsigned long long)i);
            ok = meta_put(w, v->arr.data, bytes);
        } else if (et == HM_GGUF_STRING) {
            const hm_gguf_str *s = v->arr.data;
            for (uint64_t i = 0; i < n && ok; i++) {
                if (!s[i].ptr && s[i].len)
                    return fail(w, HM_ERR_ARG, "%s: key '%s': NULL string element %llu", w->path, key, (unsigned long long)i);
                ok = meta_str(w, s[i].ptr, s[i].len);
            }
        } else {
            const hm_gguf_value *sub = v->arr.data;
            for (uint64_t i = 0; i < n; i++) {
                if (sub[i].type != HM_GGUF_ARRAY)
                    return fail(w, HM_ERR_ARG, "%s: key '%s': element %llu of a nested array has type %s, not array",
                                w->path, key, (unsigned long long)i, hm_gguf_vtype_name(sub[i].type));
                hm_status st = put_value(w, key, &sub[i], depth + 1);
                if (st) return st;
            }
        }
        break;
    }
    default: break;
    }
    if (!ok) return fail(w, HM_ERR_NOMEM, "%s: key '%s': out of memory for metadata", w->path, key);
    return HM_OK;
}

static hm_status add_key(hm_gguf_writer *w, const char *key) {
    if (w->begun) return fail(w, HM_ERR_ARG, "%s: key '%s' set after hm_gguf_writer_begin_data", w->path, key);
    const char *copy = hm_arena_strndup(&w->arena, key, strlen(key));
    if (!copy) return fail(w, HM_ERR_NOMEM, "%s: out of memory", w->path);
    int r = hm_strset_insert(&w->keys, copy, w->n_kv);
    if (r < 0) return fail(w, HM_ERR_NOMEM, "%s: out of memory", w->path);
    if (r == 0) return fail(w, HM_ERR_ARG, "%s: duplicate key '%s'", w->path, key);
    return HM_OK;
}

hm_status hm_gguf_writer_set_value(hm_gguf_writer *w, const char *key, const hm_gguf_value *v) {
    if (w->status) return w->status;
    if (strcmp(key, "general.alignment") == 0 && (v->type != HM_GGUF_U32 || v->u != w->alignment))
        return fail(w, HM_ERR_ARG, "%s: general.alignment must be the u32 %u given to hm_gguf_writer_open", w->path, w->alignment);
    hm_status st = add_key(w, key);
    if (st) return st;
    if (!meta_str(w, key, strlen(key)) || !meta_u32(w, (uint32_t)v->type))
        return fail(w, HM_ERR_NOMEM, "%s: out of memory for metadata", w->path);
    if ((st = put_value(w, key, v, 0))) return st;
    w->n_kv++;
    return HM_OK;
}

hm_status hm_gguf_writer_set_u32(hm_gguf_writer *w, const char *key, uint32_t v) {
    hm_gguf_value x = {.type = HM_GGUF_U32, .u = v};
    return hm_gguf_writer_set_value(w, key, &x);
}
hm_status hm_gguf_writer_set_i32(hm_gguf_writer *w, const char *key, int32_t v) {
    hm_gguf_value x = {.type = HM_GGUF_I32, .i = v};
    return hm_gguf_writer_set_value(w, key, &x);
}
hm_status hm_gguf_writer_set_u64(hm_gguf_writer *w, const char *key, uint64_t v) {
    hm_gguf_value x = {.type = HM_GGUF_U64, .u = v};
    return hm_gguf_writer_set_value(w, key, &x);
}
hm_status hm_gguf_writer_set_f32(hm_gguf_writer *w, const char *key, float v) {
    hm_gguf_value x = {.type = HM_GGUF_F32, .f = v};
    return hm_gguf_writer_set_value(w, key, &x);
}
hm_status hm_gguf_writer_set_bool(hm_gguf_writer *w, const char *key, bool v) {
    hm_gguf_value x = {.type = HM_GGUF_BOOL, .u = v};
    return hm_gguf_writer_set_value(w, key, &x);
}
hm_status hm_gguf_writer_set_str(hm_gguf_writer *w, const char *key, const char *v) {
    hm_gguf_value x = {.type = HM_GGUF_STRING, .str = {v, v ? strlen(v) : 0}};
    return hm_gguf_writer_set_value(w, key, &x);
}

hm_status hm_gguf_writer_set_arr(hm_gguf_writer *w, const char *key, hm_gguf_vtype elem_type, const void *data, uint64_t n) {
    if (w->status) return w->status;
    if (!hm_gguf_vtype_size(elem_type))
        return fail(w, HM_ERR_ARG, "%s: key '%s': hm_gguf_writer_set_arr takes fixed-size element types, not %s",
                    w->path, key, hm_gguf_vtype_name(elem_type));
    hm_gguf_value x = {.type = HM_GGUF_ARRAY, .arr = {elem_type, n, data}};
    return hm_gguf_writer_set_value(w, key, &x);
}

hm_status hm_gguf_writer_set_arr_str(hm_gguf_writer *w, const char *key, const char *const *strs, uint64_t n) {
    if (w->status) return w->status;
    if (n && !strs) return fail(w, HM_ERR_ARG, "%s: key '%s': NULL string array", w->path, key);
    hm_status st = add_key(w, key);
    if (st) return st;
    bool ok = meta_str(w, key, strlen(key)) && meta_u32(w, HM_GGUF_ARRAY) && meta_u32(w, HM_GGUF_STRING) && meta_u64(w, n);
    for (uint64_t i = 0; i < n && ok; i++) {
        if (!strs[i]) return fail(w, HM_ERR_ARG, "%s: key '%s': NULL string element %llu", w->path, key, (unsigned long long)i);
        ok = meta_str(w, strs[i], strlen(strs[i]));
    }
    if (!ok) return fail(w, HM_ERR_NOMEM, "%s: key '%s': out of memory for metadata", w->path, key);
    w->n_kv++;
    return HM_OK;
}

/* ---- tensors ---- */

hm_status hm_gguf_writer_add_tensor(hm_gguf_writer *w, const char *name, int type, uint32_t n_dims, const int64_t *ne) {
    if (w->status) return w->status;
    if (w->begun) return fail(w, HM_ERR_ARG, "%s: tensor '%s' added after hm_gguf_writer_begin_data", w->path, name);
    if (n_dims > HM_GGUF_MAX_DIMS)
        return fail(w, HM_ERR_ARG, "%s: tensor '%s': n_dims %u exceeds %d", w->path, name, n_dims, HM_GGUF_MAX_DIMS);
    const hm_type_traits *tr = hm_type_get(type);
    if (!tr || !tr->name || tr->blck_size <= 0)
        return fail(w, HM_ERR_ARG, "%s: tensor '%s': unknown type id %d", w->path, name, type);
    wtensor t = {.type = type, .n_dims = n_dims};
    int64_t nelem = 1;
    for (int d = 0; d < HM_GGUF_MAX_DIMS; d++) {
        t.ne[d] = (uint32_t)d < n_dims ? ne[d] : 1;
        if (t.ne[d] < 0) return fail(w, HM_ERR_ARG, "%s: tensor '%s': ne[%d] = %lld is negative", w->path, name, d, (long long)t.ne[d]);
        if (__builtin_mul_overflow(nelem, t.ne[d], &nelem))
            return fail(w, HM_ERR_ARG, "%s: tensor '%s': element count overflows int64", w->path, name);
    }
    if (t.ne[0] % tr->blck_size)
        return fail(w, HM_ERR_ARG, "%s: tensor '%s': ne[0] = %lld is not a multiple of the block size %lld of %s",
                    w->path, name, (long long)t.ne[0], (long long)tr->blck_size, tr->name);
    size_t nbytes;
    if (!hm_mul_ok((size_t)(t.ne[0] / tr->blck_size), tr->type_size, &nbytes)) /* before hm_row_size, which does not check */
        return fail(w, HM_ERR_ARG, "%s: tensor '%s': row byte size overflows", w->path, name);
    nbytes = t.ne[0] ? hm_row_size(type, t.ne[0]) : 0;
    for (int d = 1; d < HM_GGUF_MAX_DIMS; d++)
        if (!hm_mul_ok(nbytes, (size_t)t.ne[d], &nbytes)) return fail(w, HM_ERR_ARG, "%s: tensor '%s': byte size overflows", w->path, name);
    t.nbytes = nbytes;
    t.offset = w->data_size;
    if (__builtin_add_overflow(t.offset, t.nbytes, &w->data_size) || w->data_size > UINT64_MAX - w->alignment)
        return fail(w, HM_ERR_ARG, "%s: tensor '%s': data section size overflows", w->path, name);
    w->data_size = hm_align_up(w->data_size, w->alignment);
    if (!(t.name = hm_arena_strndup(&w->arena, name, strlen(name)))) return fail(w, HM_ERR_NOMEM, "%s: out of memory", w->path);
    int r = hm_strset_insert(&w->names, t.name, w->n_t);
    if (r < 0) return fail(w, HM_ERR_NOMEM, "%s: out of memory", w->path);
    if (r == 0) return fail(w, HM_ERR_ARG, "%s: duplicate tensor name '%s'", w->path, name);
    if (w->n_t == w->cap_t) {
        int64_t cap = w->cap_t ? w->cap_t * 2 : 64;
        wtensor *p = realloc(w->t, (size_t)cap * sizeof *p);
        if (!p) return fail(w, HM_ERR_NOMEM, "%s: out of memory", w->path);
        w->t = p;
        w->cap_t = cap;
    }
    w->t[w->n_t++] = t;
    return HM_OK;
}

/* ---- streaming ---- */

static hm_status out(hm_gguf_writer *w, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, w->f) != n) return fail(w, HM_ERR_IO, "%s: write failed at byte %llu: %s", w->tmp, (unsigned long long)w->pos, strerror(errno));
    w->pos += n;
    return HM_OK;
}

static hm_status pad(hm_gguf_writer *w) {
    static const uint8_t zeros[256];
    uint64_t n = hm_align_up(w->pos, w->alignment) - w->pos;
    hm_status st = HM_OK;
    while (n && !st) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        st = out(w, zeros, k);
        n -= k;
    }
    return st;
}

/* Move past tensors that are complete (zero-sized ones need no bytes), padding after each. */
static hm_status advance(hm_gguf_writer *w) {
    while (w->cur < w->n_t && w->cur_written == w->t[w->cur].nbytes) {
        hm_status st = pad(w);
        if (st) return st;
        w->cur++;
        w->cur_written = 0;
    }
    return HM_OK;
}

static hm_status out_kv(hm_gguf_writer *w, const char *key, hm_gguf_vtype type, const void *v, size_t n) {
    uint64_t len = strlen(key);
    uint32_t t = (uint32_t)type;
    hm_status st;
    if ((st = out(w, &len, 8)) || (st = out(w, key, (size_t)len)) || (st = out(w, &t, 4))) return st;
    return out(w, v, n);
}

static hm_status write_header(hm_gguf_writer *w, int32_t s);
static hm_status open_split(hm_gguf_writer *w, int32_t s);

hm_status hm_gguf_writer_set_split(hm_gguf_writer *w, uint64_t max_bytes, int32_t max_tensors) {
    if (w->status) return w->status;
    if (w->begun) return fail(w, HM_ERR_ARG, "%s: hm_gguf_writer_set_split after hm_gguf_writer_begin_data", w->path);
    if (max_tensors < 0) return fail(w, HM_ERR_ARG, "%s: --split-max-tensors %d is negative", w->path, max_tensors);
    size_t n = strlen(w->path);
    if (n <= 5 || strcmp(w->path + n - 5, ".gguf") != 0)
        return fail(w, HM_ERR_ARG, "%s: a split model's name must end in .gguf (the splits are PREFIX-00001-of-0000N.gguf)",
                    w->path);
    w->split_bytes = max_bytes;
    w->split_tensors = max_tensors;
    w->split = max_bytes > 0 || max_tensors > 0;
    return HM_OK;
}

/* Assign tensors to splits by llama-gguf-split's rule (tools/gguf-split: a new split when the
 * tensor bytes so far, each padded to the alignment, would pass the size limit, or every
 * max_tensors tensors; never before the first tensor), offsets relative to each split's data
 * section; then leave PATH.tmp for the splits' own files. */
static hm_status split_plan(hm_gguf_writer *w) {
    int32_t s = 0;
    uint64_t cur = 0, data = 0;
    for (int64_t i = 0; i < w->n_t; i++) {
        wtensor *t = &w->t[i];
        uint64_t nb = hm_align_up(t->nbytes, w->alignment);
        bool cut = w->split_bytes ? (i > 0 && cur + nb > w->split_bytes) : (i > 0 && i % w->split_tensors == 0);
        if (cut) {
            if (s == 65534) return fail(w, HM_ERR_ARG, "%s: more than 65535 splits (split.count is a u16)", w->path);
            s++, cur = 0, data = 0;
        }
        cur += nb;
        t->split = s;
        t->offset = data;
        data += nb;
    }
    if (w->n_t > INT32_MAX) return fail(w, HM_ERR_ARG, "%s: %lld tensors do not fit split.tensors.count (i32)", w->path,
                                        (long long)w->n_t);
    w->n_split = s + 1;
    if (!(w->sp_path = calloc((size_t)w->n_split, sizeof *w->sp_path)) ||
        !(w->sp_tmp = calloc((size_t)w->n_split, sizeof *w->sp_tmp)))
        return fail(w, HM_ERR_NOMEM, "%s: out of memory", w->path);
    size_t n = strlen(w->path) - 5; /* without .gguf */
    for (int32_t i = 0; i < w->n_split; i++) {
        size_t len = n + 32;
        if (!(w->sp_path[i] = malloc(len)) || !(w->sp_tmp[i] = malloc(len + 4)))
            return fail(w, HM_ERR_NOMEM, "%s: out of memory", w->path);
        snprintf(w->sp_path[i], len, "%.*s-%05d-of-%05d.gguf", (int)n, w->path, i + 1, w->n_split);
        snprintf(w->sp_tmp[i], len + 4, "%s.tmp", w->sp_path[i]);
    }
    fclose(w->f);
    w->f = NULL;
    unlink(w->tmp);
    free(w->path), free(w->tmp);
    w->path = w->sp_path[0], w->tmp = w->sp_tmp[0];
    return open_split(w, 0);
}

/* Create split s's PATH.tmp as the current file. */
static hm_status open_split(hm_gguf_writer *w, int32_t s) {
    w->cur_split = s;
    w->path = w->sp_path[s], w->tmp = w->sp_tmp[s];
    w->pos = 0;
    int fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || !(w->f = fdopen(fd, "wb"))) {
        int e = errno;
        if (fd >= 0) close(fd), unlink(w->tmp);
        return fail(w, HM_ERR_IO, "%s: cannot create: %s", w->tmp, strerror(e));
    }
    w->n_opened = s + 1;
    return HM_OK;
}

/* Close the current split (flushed, synced; renamed at finish) and start the next ones up to s. */
static hm_status split_advance(hm_gguf_writer *w, int32_t s) {
    hm_status st;
    while (w->cur_split < s) {
        if (fflush(w->f) != 0 || fsync(fileno(w->f)) != 0) return fail(w, HM_ERR_IO, "%s: flush/fsync failed: %s", w->tmp, strerror(errno));
        int rc = fclose(w->f);
        w->f = NULL;
        if (rc != 0) return fail(w, HM_ERR_IO, "%s: close failed: %s", w->tmp, strerror(errno));
        if ((st = open_split(w, w->cur_split + 1)) || (st = write_header(w, w->cur_split))) return st;
    }
    return HM_OK;
}

hm_status hm_gguf_writer_begin_data(hm_gguf_writer *w) {
    if (w->status) return w->status;
    if (w->begun) return fail(w, HM_ERR_ARG, "%s: hm_gguf_writer_begin_data called twice", w->path);
    if (w->alignment != HM_GGUF_DEFAULT_ALIGNMENT && hm_strset_find(&w->keys, "general.alignment") < 0) {
        hm_status st = hm_gguf_writer_set_u32(w, "general.alignment", w->alignment);
        if (st) return st;
    }
    w->begun = true;
    hm_status st;
    if (w->split && (st = split_plan(w))) return st;
    if ((st = write_header(w, 0))) return st;
    w->cur = 0;
    w->cur_written = 0;
    /* zero-sized leading tensors are complete already; no padding is due for them */
    while (w->cur < w->n_t && w->t[w->cur].nbytes == 0) w->cur++;
    return HM_OK;
}

/* Header, metadata and tensor table of file s (0 without splits) at the start of w->f. */
static hm_status write_header(hm_gguf_writer *w, int32_t s) {
    uint32_t version = 3;
    uint64_t nt = 0, nkv = (uint64_t)w->n_kv;
    for (int64_t i = 0; i < w->n_t; i++) nt += w->t[i].split == s;
    bool align_kv = w->alignment != HM_GGUF_DEFAULT_ALIGNMENT;
    if (w->split) nkv = s == 0 ? nkv + 3 : 3 + (uint64_t)align_kv;
    hm_status st;
    if ((st = out(w, "GGUF", 4)) || (st = out(w, &version, 4)) || (st = out(w, &nt, 8)) || (st = out(w, &nkv, 8)))
        return st;
    if (s == 0) {
        if ((st = out(w, w->meta, w->meta_len))) return st;
        free(w->meta);
        w->meta = NULL;
        w->meta_len = w->meta_cap = 0;
    } else if (align_kv && (st = out_kv(w, "general.alignment", HM_GGUF_U32, &w->alignment, 4))) {
        return st;
    }
    if (w->split) { /* llama-gguf-split's keys: split.no u16 (0-based), split.tensors.count i32, split.count u16 */
        uint16_t no = (uint16_t)s, count = (uint16_t)w->n_split;
        int32_t total = (int32_t)w->n_t;
        /* in llama-gguf-split's order, so the files match its output byte for byte */
        if ((st = out_kv(w, "split.no", HM_GGUF_U16, &no, 2)) || (st = out_kv(w, "split.tensors.count", HM_GGUF_I32, &total, 4)) ||
            (st = out_kv(w, "split.count", HM_GGUF_U16, &count, 2)))
            return st;
    }
    for (int64_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        if (t->split != s) continue;
        uint64_t len = strlen(t->name);
        uint32_t type = (uint32_t)t->type;
        if ((st = out(w, &len, 8)) || (st = out(w, t->name, (size_t)len)) || (st = out(w, &t->n_dims, 4)) ||
            (st = out(w, t->ne, 8 * (size_t)t->n_dims)) || (st = out(w, &type, 4)) || (st = out(w, &t->offset, 8)))
            return st;
    }
    return pad(w);
}

hm_status hm_gguf_writer_write(hm_gguf_writer *w, const void *data, size_t n) {
    if (w->status) return w->status;
    if (!w->begun) return fail(w, HM_ERR_ARG, "%s: tensor data written before hm_gguf_writer_begin_data", w->path);
    const uint8_t *p = data;
    while (n) {
        if (w->cur >= w->n_t)
            return fail(w, HM_ERR_ARG, "%s: %zu bytes written past the end of the declared tensor data", w->path, n);
        const wtensor *t = &w->t[w->cur];
        hm_status st;
        if (t->split > w->cur_split && (st = split_advance(w, t->split))) return st;
        uint64_t room = t->nbytes - w->cur_written;
        size_t k = n < room ? n : (size_t)room;
        st = out(w, p, k);
        if (st) return st;
        w->cur_written += k;
        p += k;
        n -= k;
        if ((st = advance(w))) return st;
    }
    return HM_OK;
}

static void fsync_dir(const char *path) {
    char *copy = strdup(path);
    if (!copy) return;
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd); /* best effort: the rename is durable once the directory is synced */
        close(fd);
    }
    free(copy);
}

hm_status hm_gguf_writer_finish(hm_gguf_writer *w) {
    hm_status st = w->status;
    if (!st && !w->begun) st = hm_gguf_writer_begin_data(w);
    if (!st && w->cur < w->n_t)
        st = fail(w, HM_ERR_ARG, "%s: tensor %lld '%s': %llu of %llu bytes written", w->path, (long long)w->cur,
                  w->t[w->cur].name, (unsigned long long)w->cur_written, (unsigned long long)w->t[w->cur].nbytes);
    if (!st && w->split && w->cur_split < w->n_split - 1) st = split_advance(w, w->n_split - 1); /* zero-byte tails */
    if (!st && (fflush(w->f) != 0 || fsync(fileno(w->f)) != 0))
        st = fail(w, HM_ERR_IO, "%s: flush/fsync failed: %s", w->tmp, strerror(errno));
    if (w->f && fclose(w->f) != 0 && !st) st = fail(w, HM_ERR_IO, "%s: close failed: %s", w->tmp, strerror(errno));
    w->f = NULL;
    /* every split renamed only once all are complete */
    for (int32_t i = 0; !st && w->split && i < w->n_split - 1; i++)
        if (rename(w->sp_tmp[i], w->sp_path[i]) != 0)
            st = fail(w, HM_ERR_IO, "%s: rename to %s failed: %s", w->sp_tmp[i], w->sp_path[i], strerror(errno));
    if (!st && rename(w->tmp, w->path) != 0) st = fail(w, HM_ERR_IO, "%s: rename to %s failed: %s", w->tmp, w->path, strerror(errno));
    if (st) {
        if (w->user_err) *w->user_err = w->msg;
        unlink(w->tmp);
        for (int32_t i = 0; w->sp_tmp && i < w->n_opened; i++) unlink(w->sp_tmp[i]);
    } else {
        fsync_dir(w->path);
    }
    writer_free(w);
    return st;
}
