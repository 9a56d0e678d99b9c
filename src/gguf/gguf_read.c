/* gguf_read.c - the GGUF v2/v3 reader: mmap (or borrow) the image, parse header, metadata and
 * tensor table once at open, then answer lookups without further parsing.
 *
 * Invariants kept while parsing:
 *  - the cursor never passes the end of the image: every read first checks that the bytes it
 *    needs are left (take()), so a truncated file fails at the first field that does not fit;
 *  - nothing is allocated from an unchecked count: a count n of elements that take at least m
 *    bytes each is rejected when n > bytes_left / m, so every allocation is bounded by a small
 *    multiple of the file size;
 *  - arithmetic on file values (offsets, byte sizes, element counts) is overflow-checked;
 *  - every tensor's [file_offset, file_offset + nbytes) lies inside the image, and no two of
 *    these ranges share a byte;
 *  - arrays nest at most HM_GGUF_MAX_ARRAY_DEPTH deep, so the recursion is bounded.
 * After a successful open the handle is read-only, so concurrent readers are safe. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/alloc.h"
#include "../quant/quant.h"
#include "gguf.h"
#include "gguf_impl.h"

/* One array value, top-level or nested. */
typedef struct arr_node {
    hm_gguf_vtype elem_type;
    uint64_t n;
    uint64_t off;  /* file offset of the first element */
    uint64_t *idx; /* STRING: file offset of each element; ARRAY: node id of each; else NULL */
} arr_node;

typedef union num {
    uint64_t u; /* unsigned types and bool */
    int64_t i;  /* signed types */
    double f;   /* f32, f64 */
} num;

typedef struct kv {
    const char *key; /* arena */
    hm_gguf_vtype type;
    uint64_t off; /* file offset of the key */
    num v;
    hm_gguf_str str; /* STRING */
    int64_t node;    /* ARRAY */
} kv;

struct hm_gguf {
    const uint8_t *base;
    size_t size;
    void *map; /* owned mapping, NULL for in-memory images */
    const char *path;  /* arena; "" for memory images */
    const char *label; /* for messages: path or "<memory>" */
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;
    int64_t n_kv;
    kv *kvs;
    int64_t n_tensors;
    hm_gguf_tensor *tensors;
    arr_node *nodes;
    int64_t n_nodes, cap_nodes;
    hm_strset keys, names;
    hm_arena arena;
    /* a split model (gguf_split.c): the other files, each a whole parsed GGUF whose tensors were
     * appended to this table (their names and data stay theirs); n_parts 0 for one file */
    hm_gguf **parts;   /* [n_parts], owned; parts[i] is split i + 1 */
    int32_t n_parts;
};

/* ---- value types ---- */

static const char *const vtype_names[HM_GGUF_VTYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};
static const uint8_t vtype_sizes[HM_GGUF_VTYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *hm_gguf_vtype_name(int t) {
    return t >= 0 && t < HM_GGUF_VTYPE_COUNT ? vtype_names[t] : "unknown";
}

size_t hm_gguf_vtype_size(int t) { return t >= 0 && t < HM_GGUF_VTYPE_COUNT ? vtype_sizes[t] : 0; }

static bool is_int_type(hm_gguf_vtype t) {
    return t == HM_GGUF_U8 || t == HM_GGUF_I8 || t == HM_GGUF_U16 || t == HM_GGUF_I16 ||
           t == HM_GGUF_U32 || t == HM_GGUF_I32 || t == HM_GGUF_U64 || t == HM_GGUF_I64 ||
           t == HM_GGUF_BOOL;
}

/* Decode one fixed-size value of type t at p (which has vtype_sizes[t] readable bytes). */
static num decode(hm_gguf_vtype t, const uint8_t *p) {
    num v = {0};
    switch (t) {
    case HM_GGUF_U8: v.u = p[0]; break;
    case HM_GGUF_BOOL: v.u = p[0] != 0; break;
    case HM_GGUF_I8: v.i = (int8_t)p[0]; break;
    case HM_GGUF_U16: { uint16_t x; memcpy(&x, p, 2); v.u = x; break; }
    case HM_GGUF_I16: { int16_t x; memcpy(&x, p, 2); v.i = x; break; }
    case HM_GGUF_U32: { uint32_t x; memcpy(&x, p, 4); v.u = x; break; }
    case HM_GGUF_I32: { int32_t x; memcpy(&x, p, 4); v.i = x; break; }
    case HM_GGUF_U64: memcpy(&v.u, p, 8); break;
    case HM_GGUF_I64: memcpy(&v.i, p, 8); break;
    case HM_GGUF_F32: { float x; memcpy(&x, p, 4); v.f = x; break; }
    case HM_GGUF_F64: memcpy(&v.f, p, 8); break;
    default: break;
    }
    return v;
}

static bool num_int(hm_gguf_vtype t, num v, int64_t *out) {
    if (!is_int_type(t)) return false;
    bool is_signed = t == HM_GGUF_I8 || t == HM_GGUF_I16 || t == HM_GGUF_I32 || t == HM_GGUF_I64;
    if (is_signed) {
        *out = v.i;
    } else {
        if (v.u > (uint64_t)INT64_MAX) return false;
        *out = (int64_t)v.u;
    }
    return true;
}

static bool num_float(hm_gguf_vtype t, num v, double *out) {
    if (t == HM_GGUF_F32 || t == HM_GGUF_F64) {
        *out = v.f;
        return true;
    }
    if (t == HM_GGUF_U64) { /* representable even above INT64_MAX */
        *out = (double)v.u;
        return true;
    }
    int64_t i;
    if (!num_int(t, v, &i)) return false;
    *out = (double)i;
    return true;
}

/* ---- the cursor ---- */

typedef struct cur {
    hm_gguf *g;
    size_t pos; /* invariant: pos <= g->size */
    hm_err *err;
} cur;

static size_t left(const cur *c) { return c->g->size - c->pos; }

static hm_status vtake(cur *c, size_t n, const uint8_t **p, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));
static hm_status vtake(cur *c, size_t n, const uint8_t **p, const char *fmt, va_list ap) {
    if (n <= left(c)) {
        *p = c->g->base + c->pos;
        c->pos += n;
        return HM_OK;
    }
    char what[256];
    vsnprintf(what, sizeof what, fmt, ap);
    return hm_errf(c->err, HM_ERR_FORMAT, "%s: truncated at byte %zu reading %s (%zu bytes needed, file size %zu)",
                   c->g->label, c->pos, what, n, c->g->size);
}

static hm_status rd_u32(cur *c, uint32_t *v, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static hm_status rd_u32(cur *c, uint32_t *v, const char *fmt, ...) {
    const uint8_t *p = NULL;
    va_list ap;
    va_start(ap, fmt);
    hm_status st = vtake(c, 4, &p, fmt, ap);
    va_end(ap);
    if (st == HM_OK) memcpy(v, p, 4);
    return st;
}

static hm_status rd_u64(cur *c, uint64_t *v, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static hm_status rd_u64(cur *c, uint64_t *v, const char *fmt, ...) {
    const uint8_t *p = NULL;
    va_list ap;
    va_start(ap, fmt);
    hm_status st = vtake(c, 8, &p, fmt, ap);
    va_end(ap);
    if (st == HM_OK) memcpy(v, p, 8);
    return st;
}

/* A string: u64 length, then that many bytes. what names it in messages ("kv 3 key"). */
static hm_status rd_str(cur *c, hm_gguf_str *s, const char *what) {
    uint64_t len;
    size_t at = c->pos;
    hm_status st = rd_u64(c, &len, "%s length", what);
    if (st) return st;
    if (len > left(c))
        return hm_errf(c->err, HM_ERR_FORMAT,
                       "%s: %s length %llu (at byte %zu) exceeds the %zu bytes left in the file (size %zu)",
                       c->g->label, what, (unsigned long long)len, at, left(c), c->g->size);
    s->ptr = (const char *)c->g->base + c->pos;
    s->len = len;
    c->pos += (size_t)len;
    return HM_OK;
}

/* NUL-terminated arena copy of a name; names with NUL bytes inside are rejected. */
static hm_status copy_name(cur *c, hm_gguf_str s, size_t at, const char *what, const char **out) {
    if (memchr(s.ptr, '\0', (size_t)s.len))
        return hm_errf(c->err, HM_ERR_FORMAT, "%s: %s at byte %zu contains a NUL byte", c->g->label, what, at);
    *out = hm_arena_strndup(&c->g->arena, s.ptr, (size_t)s.len);
    if (!*out) return hm_errf(c->err, HM_ERR_NOMEM, "%s: out of memory copying %s", c->g->label, what);
    return HM_OK;
}

/* ---- arrays ---- */

static hm_status new_node(cur *c, int64_t *id) {
    hm_gguf *g = c->g;
    if (g->n_nodes == g->cap_nodes) {
        size_t cap = g->cap_nodes ? (size_t)g->cap_nodes * 2 : 16, bytes;
        if (!hm_mul_ok(cap, sizeof *g->nodes, &bytes)) return hm_errf(c->err, HM_ERR_NOMEM, "%s: too many arrays", g->label);
        arr_node *n = realloc(g->nodes, bytes);
        if (!n) return hm_errf(c->err, HM_ERR_NOMEM, "%s: out of memory for arrays", g->label);
        g->nodes = n;
        g->cap_nodes = (int64_t)cap;
    }
    *id = g->n_nodes++;
    memset(&g->nodes[*id], 0, sizeof g->nodes[*id]);
    return HM_OK;
}

/* An array value at the cursor: u32 element type, u64 count, elements. ctx names the kv. */
static hm_status parse_array(cur *c, const char *ctx, int depth, int64_t *out) {
    hm_gguf *g = c->g;
    uint32_t et;
    uint64_t n;
    hm_status st;
    size_t at = c->pos;
    if ((st = rd_u32(c, &et, "%s array element type (depth %d)", ctx, depth))) return st;
    if (et >= HM_GGUF_VTYPE_COUNT)
        return hm_errf(c->err, HM_ERR_FORMAT, "%s: %s: unknown array element type %u at byte %zu", g->label, ctx, et, at);
    if (et == HM_GGUF_ARRAY && depth + 1 >= HM_GGUF_MAX_ARRAY_DEPTH)
        return hm_errf(c->err, HM_ERR_FORMAT, "%s: %s: arrays nested deeper than %d at byte %zu",
                       g->label, ctx, HM_GGUF_MAX_ARRAY_DEPTH, at);
    size_t count_at = c->pos;
    if ((st = rd_u64(c, &n, "%s array count (depth %d)", ctx, depth))) return st;
    /* smallest encoding of one element: strings are a u64 length, arrays a u32 type + u64 count */
    size_t min_elem = et == HM_GGUF_STRING ? 8 : et == HM_GGUF_ARRAY ? 12 : vtype_sizes[et];
    if (n > left(c) / min_elem)
        return hm_errf(c->err, HM_ERR_FORMAT,
                       "%s: %s: array count %llu (at byte %zu) of %s elements needs at least %llu bytes per element, "
                       "only %zu bytes left in the file",
                       g->label, ctx, (unsigned long long)n, count_at, vtype_names[et],
                       (unsigned long long)min_elem, left(c));
    int64_t id = -1;
    if ((st = new_node(c, &id))) return st;
    g->nodes[id].elem_type = (hm_gguf_vtype)et;
    g->nodes[id].n = n;
    g->nodes[id].off = c->pos;
    if (et != HM_GGUF_STRING && et != HM_GGUF_ARRAY) {
        c->pos += (size_t)n * min_elem; /* checked above */
        *out = id;
        return HM_OK;
    }
    if (n == 0) {
        *out = id;
        return HM_OK;
    }
    /* n <= file size / 8, so this allocation is bounded by the file size */
    uint64_t *idx = malloc((size_t)n * sizeof *idx);
    if (!idx) return hm_errf(c->err, HM_ERR_NOMEM, "%s: %s: out of memory indexing %llu array elements", g->label, ctx, (unsigned long long)n);
    g->nodes[id].idx = idx; /* owned by the node from here on, freed at close */
    char what[300];
    for (uint64_t i = 0; i < n; i++) {
        if (et == HM_GGUF_STRING) {
            idx[i] = c->pos;
            uint64_t len;
            size_t sat = c->pos;
            if ((st = rd_u64(c, &len, "%s array element %llu string length", ctx, (unsigned long long)i))) return st;
            if (len > left(c))
                return hm_errf(c->err, HM_ERR_FORMAT,
                               "%s: %s: array element %llu string length %llu (at byte %zu) exceeds the %zu bytes left in the file",
                               g->label, ctx, (unsigned long long)i, (unsigned long long)len, sat, left(c));
            c->pos += (size_t)len;
        } else {
            int64_t child;
            snprintf(what, sizeof what, "%s[%llu]", ctx, (unsigned long long)i);
            if ((st = parse_array(c, what, depth + 1, &child))) return st;
            idx[i] = (uint64_t)child;
        }
    }
    *out = id;
    return HM_OK;
}

static int cmp_by_offset(const void *a, const void *b) {
    const hm_gguf_tensor *x = *(const hm_gguf_tensor *const *)a, *y = *(const hm_gguf_tensor *const *)b;
    return x->file_offset < y->file_offset ? -1 : x->file_offset > y->file_offset;
}

/* No two tensors' data may share a byte: a writer never produces that, and a tensor aliasing
 * another's bytes (one written as Q4_K, read as F32) loads as garbage. Empty tensors take none. */
static hm_status check_overlap(hm_gguf *g, hm_err *err) {
    if (g->n_tensors < 2) return HM_OK;
    const hm_gguf_tensor **by = malloc((size_t)g->n_tensors * sizeof *by);
    if (!by) return hm_errf(err, HM_ERR_NOMEM, "%s: out of memory checking the tensor data ranges", g->label);
    size_t n = 0;
    for (int64_t i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].nbytes) by[n++] = &g->tensors[i];
    qsort(by, n, sizeof *by, cmp_by_offset);
    hm_status st = HM_OK;
    for (size_t i = 1; i < n && !st; i++) {
        const hm_gguf_tensor *a = by[i - 1], *b = by[i];
        if (a->file_offset + a->nbytes > b->file_offset)
            st = hm_errf(err, HM_ERR_FORMAT, "%s: tensors '%s' (data [%llu, %llu)) and '%s' (data from %llu) overlap",
                         g->label, a->name, (unsigned long long)a->file_offset,
                         (unsigned long long)(a->file_offset + a->nbytes), b->name, (unsigned long long)b->file_offset);
    }
    free(by);
    return st;
}

/* ---- header, metadata, tensor table ---- */

static hm_status parse_kv(cur *c, int64_t i) {
    hm_gguf *g = c->g;
    kv *e = &g->kvs[i];
    hm_status st;
    hm_gguf_str key;
    char what[320];
    e->off = c->pos;
    snprintf(what, sizeof what, "kv %lld key", (long long)i);
    if ((st = rd_str(c, &key, what))) return st;
    if ((st = copy_name(c, key, (size_t)e->off, what, &e->key))) return st;
    int r = hm_strset_insert(&g->keys, e->key, i);
    if (r < 0) return hm_errf(c->err, HM_ERR_NOMEM, "%s: out of memory indexing keys", g->label);
    if (r == 0)
        return hm_errf(c->err, HM_ERR_FORMAT, "%s: kv %lld at byte %llu: duplicate key '%s' (first is kv %lld)",
                       g->label, (long long)i, (unsigned long long)e->off, e->key,
                       (long long)hm_strset_find(&g->keys, e->key));
    snprintf(what, sizeof what, "kv %lld '%s'", (long long)i, e->key);
    uint32_t t;
    size_t tat = c->pos;
    if ((st = rd_u32(c, &t, "%s value type", what))) return st;
    if (t >= HM_GGUF_VTYPE_COUNT)
        return hm_errf(c->err, HM_ERR_FORMAT, "%s: %s: unknown value type %u at byte %zu", g->label, what, t, tat);
    e->type = (hm_gguf_vtype)t;
    e->node = -1;
    if (t == HM_GGUF_STRING) {
        char sw[340];
        snprintf(sw, sizeof sw, "%s string value", what);
        return rd_str(c, &e->str, sw);
    }
    if (t == HM_GGUF_ARRAY) return parse_array(c, what, 0, &e->node);
    size_t vs = vtype_sizes[t];
    if (vs > left(c))
        return hm_errf(c->err, HM_ERR_FORMAT, "%s: truncated at byte %zu reading %s %s value (%zu bytes needed, file size %zu)",
                       g->label, c->pos, what, vtype_names[t], vs, g->size);
    e->v = decode(e->type, g->base + c->pos);
    c->pos += vs;
    return HM_OK;
}

static hm_status parse_tensor_info(cur *c, int64_t i) {
    hm_gguf *g = c->g;
    hm_gguf_tensor *t = &g->tensors[i];
    hm_status st;
    hm_gguf_str name;
    char what[320];
    size_t at = c->pos;
    snprintf(what, sizeof what, "tensor %lld name", (long long)i);
    if ((st = rd_str(c, &name, what))) return st;
    if ((st = copy_name(c, name, at, what, &t->name))) return st;
    int r = hm_strset_insert(&g->names, t->name, i);
    if (r < 0) return hm_errf(c->err, HM_ERR_NOMEM, "%s: out of memory indexing tensor names", g->label);
    if (r == 0)
        return hm_errf(c->err, HM_ERR_FORMAT, "%s: tensor %lld at byte %zu: duplicate tensor name '%s' (first is tensor %lld)",
                       g->label, (long long)i, at, t->name, (long long)hm_strset_find(&g->names, t->name));
    snprintf(what, sizeof what, "tensor %lld '%s'", (long long)i, t->name);
    size_t dat = c->pos;
    if ((st = rd_u32(c, &t->n_dims, "%s n_dims", what))) return st;
    if (t->n_dims > HM_GGUF_MAX_DIMS)
        return hm_errf(c->err, HM_ERR_FORMAT, "%s: %s: n_dims %u at byte %zu exceeds %d",
                       g->label, what, t->n_dims, dat, HM_GGUF_MAX_DIMS);
    int64_t nelem = 1;
    for (int d = 0; d < HM_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t ne;
        size_t nat = c->pos;
        if ((st = rd_u64(c, &ne, "%s ne[%u]", what, d))) return st;
        if (ne > (uint64_t)INT64_MAX)
            return hm_errf(c->err, HM_ERR_FORMAT, "%s: %s: ne[%u] = %llu at byte %zu is negative as int64",
                           g->label, what, d, (unsigned long long)ne, nat);
        t->ne[d] = (int64_t)ne;
        if (__builtin_mul_overflow(nelem, t->ne[d], &nelem))
            return hm_errf(c->err, HM_ERR_FORMAT, "%s: %s: element count (product of ne[0..%u], ne[%u] at byte %zu) overflows int64",
                           g->label, what, d, d, nat);
    }
    uint32_t type;
    size_t tat = c->pos;
    if ((st = rd_u32(c, &type, "%s type", what))) return st;
    const hm_type_traits *tr = hm_type_get((int)type);
    if (type >= HM_TYPE_COUNT || !tr || !tr->name || tr->blck_size <= 0)
        return hm_errf(c->err, HM_ERR_FORMAT, "%s: %s: unknown type id %u at byte %zu", g->label, what, type, tat);
    t->type = (int)type;
    if (t->ne[0] % tr->blck_size)
        return hm_errf(c->err, HM_ERR_FORMAT, "%s: %s: ne[0] = %lld is not a multiple of the block size %lld of type %s",
                       g->label, what, (long long)t->ne[0], (long long)tr->blck_size, tr->name);
    size_t nbytes;
    /* hm_row_size does not check (ne0 / blck) * type_size for overflow; do it first */
    if (!hm_mul_ok((size_t)(t->ne[0] / tr->blck_size), tr->type_size, &nbytes))
        return hm_errf(c->err, HM_ERR_FORMAT, "%s: %s: row byte size (ne[0] = %lld of type %s) overflows",
                       g->label, what, (long long)t->ne[0], tr->name);
    nbytes = t->ne[0] ? hm_row_size(t->type, t->ne[0]) : 0;
    if (t->ne[0] && !nbytes) /* hm_row_size returns 0 only when it cannot size the row */
        return hm_errf(c->err, HM_ERR_FORMAT, "%s: %s: cannot size a row of type %s", g->label, what, tr->name);
    for (int d = 1; d < HM_GGUF_MAX_DIMS; d++)
        if (!hm_mul_ok(nbytes, (size_t)t->ne[d], &nbytes))
            return hm_errf(c->err, HM_ERR_FORMAT, "%s: %s: byte size (ne product x type size) overflows", g->label, what);
    t->nbytes = nbytes;
    size_t oat = c->pos;
    if ((st = rd_u64(c, &t->offset, "%s offset", what))) return st;
    if (t->offset % g->alignment)
        return hm_errf(c->err, HM_ERR_FORMAT, "%s: %s: offset %llu at byte %zu is not a multiple of the alignment %llu",
                       g->label, what, (unsigned long long)t->offset, oat, (unsigned long long)g->alignment);
    return HM_OK;
}

static hm_status check_alignment(cur *c) {
    hm_gguf *g = c->g;
    g->alignment = HM_GGUF_DEFAULT_ALIGNMENT;
    int64_t i = hm_strset_find(&g->keys, "general.alignment");
    if (i < 0) return HM_OK;
    const kv *e = &g->kvs[i];
    if (e->type != HM_GGUF_U32)
        return hm_errf(c->err, HM_ERR_FORMAT, "%s: general.alignment (kv %lld at byte %llu) has type %s, expected u32",
                       g->label, (long long)i, (unsigned long long)e->off, vtype_names[e->type]);
    if (e->v.u == 0 || (e->v.u & (e->v.u - 1)))
        return hm_errf(c->err, HM_ERR_FORMAT, "%s: general.alignment (kv %lld at byte %llu) = %llu is not a non-zero power of two",
                       g->label, (long long)i, (unsigned long long)e->off, (unsigned long long)e->v.u);
    g->alignment = e->v.u;
    return HM_OK;
}

static hm_status parse(hm_gguf *g, hm_err *err) {
    cur c = {.g = g, .pos = 0, .err = err};
    hm_status st;
    if (g->size < 4 || memcmp(g->base, "GGUF", 4) != 0) {
        if (g->size < 4)
            return hm_errf(err, HM_ERR_FORMAT, "%s: truncated at byte 0 reading magic (4 bytes needed, file size %zu)",
                           g->label, g->size);
        return hm_errf(err, HM_ERR_FORMAT, "%s: bad magic at byte 0 (%02x %02x %02x %02x), not a GGUF file", g->label,
                       g->base[0], g->base[1], g->base[2], g->base[3]);
    }
    c.pos = 4;
    if ((st = rd_u32(&c, &g->version, "version"))) return st;
    if (g->version == 1)
        return hm_errf(err, HM_ERR_FORMAT, "%s: GGUF version 1 (at byte 4) is not supported: it used 32-bit counts; "
                       "re-convert the model to GGUF v3", g->label);
    if (g->version != 2 && g->version != 3) {
        if ((g->version & 0xffffu) == 0)
            return hm_errf(err, HM_ERR_FORMAT, "%s: version field at byte 4 is 0x%08x: a big-endian GGUF, which is not supported",
                           g->label, g->version);
        return hm_errf(err, HM_ERR_FORMAT, "%s: unsupported GGUF version %u at byte 4 (2 and 3 are supported)", g->label, g->version);
    }
    uint64_t n_tensors, n_kv;
    if ((st = rd_u64(&c, &n_tensors, "n_tensors"))) return st;
    if ((st = rd_u64(&c, &n_kv, "n_kv"))) return st;
    /* smallest kv: key length (8) + type (4) + a one-byte value; smallest tensor info: name
     * length (8) + n_dims (4) + type (4) + offset (8) */
    if (n_kv > left(&c) / 13)
        return hm_errf(err, HM_ERR_FORMAT, "%s: n_kv %llu at byte 16 needs at least 13 bytes per kv, only %zu left in the file",
                       g->label, (unsigned long long)n_kv, left(&c));
    if (n_tensors > left(&c) / 24)
        return hm_errf(err, HM_ERR_FORMAT, "%s: n_tensors %llu at byte 8 needs at least 24 bytes per tensor, only %zu left in the file",
                       g->label, (unsigned long long)n_tensors, left(&c));
    if (n_kv * 13 + n_tensors * 24 > left(&c)) /* no overflow: both terms are <= left */
        return hm_errf(err, HM_ERR_FORMAT, "%s: n_kv %llu and n_tensors %llu (bytes 8..24) need more than the %zu bytes left",
                       g->label, (unsigned long long)n_kv, (unsigned long long)n_tensors, left(&c));
    g->n_kv = (int64_t)n_kv;
    g->n_tensors = (int64_t)n_tensors;
    if (n_kv && !(g->kvs = calloc((size_t)n_kv, sizeof *g->kvs)))
        return hm_errf(err, HM_ERR_NOMEM, "%s: out of memory for %llu kvs", g->label, (unsigned long long)n_kv);
    if (n_tensors && !(g->tensors = calloc((size_t)n_tensors, sizeof *g->tensors)))
        return hm_errf(err, HM_ERR_NOMEM, "%s: out of memory for %llu tensors", g->label, (unsigned long long)n_tensors);
    for (int64_t i = 0; i < g->n_kv; i++)
        if ((st = parse_kv(&c, i))) return st;
    if ((st = check_alignment(&c))) return st;
    for (int64_t i = 0; i < g->n_tensors; i++)
        if ((st = parse_tensor_info(&c, i))) return st;
    g->data_offset = hm_align_up(c.pos, g->alignment); /* pos <= size < 2^63, alignment <= 2^31 */
    if (g->n_tensors && g->data_offset > g->size)
        return hm_errf(err, HM_ERR_FORMAT, "%s: truncated: the data section starts at byte %llu (tensor table ends at %zu, "
                       "alignment %llu) but the file size is %zu",
                       g->label, (unsigned long long)g->data_offset, c.pos, (unsigned long long)g->alignment, g->size);
    for (int64_t i = 0; i < g->n_tensors; i++) {
        hm_gguf_tensor *t = &g->tensors[i];
        uint64_t start, end;
        if (__builtin_add_overflow(g->data_offset, t->offset, &start) || __builtin_add_overflow(start, (uint64_t)t->nbytes, &end))
            return hm_errf(err, HM_ERR_FORMAT, "%s: tensor %lld '%s': data offset %llu + %zu bytes past end of file (size %zu)",
                           g->label, (long long)i, t->name, (unsigned long long)t->offset, t->nbytes, g->size);
        if (end > g->size)
            return hm_errf(err, HM_ERR_FORMAT, "%s: tensor %lld '%s': data [%llu, %llu) past end of file (size %zu)",
                           g->label, (long long)i, t->name, (unsigned long long)start, (unsigned long long)end, g->size);
        t->file_offset = start;
        t->data = g->base + start;
    }
    return check_overlap(g, err);
}

/* ---- open / close ---- */

void hm_gguf_close(hm_gguf *g) {
    if (!g) return;
    for (int32_t i = 0; i < g->n_parts; i++) hm_gguf_close(g->parts[i]);
    free(g->parts);
    if (g->map) munmap(g->map, g->size);
    for (int64_t i = 0; i < g->n_nodes; i++) free(g->nodes[i].idx);
    free(g->nodes);
    free(g->kvs);
    free(g->tensors);
    hm_strset_free(&g->keys);
    hm_strset_free(&g->names);
    hm_arena_free(&g->arena);
    free(g);
}

static hm_status finish_open(hm_gguf *g, hm_gguf **out, hm_err *err) {
    hm_status st = parse(g, err);
    if (st) {
        hm_gguf_close(g);
        return st;
    }
    *out = g;
    return HM_OK;
}

hm_status hm_gguf_open_mem(hm_gguf **out, const void *data, size_t size, hm_err *err) {
    *out = NULL;
    if (!data && size) return hm_errf(err, HM_ERR_ARG, "hm_gguf_open_mem: NULL data of size %zu", size);
    hm_gguf *g = calloc(1, sizeof *g);
    if (!g) return hm_errf(err, HM_ERR_NOMEM, "<memory>: out of memory");
    static const uint8_t empty[1];
    g->base = data ? data : empty;
    g->size = size;
    g->path = "";
    g->label = "<memory>";
    return finish_open(g, out, err);
}

hm_status hm_gguf_open_one(hm_gguf **out, const char *path, hm_err *err) {
    *out = NULL;
    hm_gguf *g = calloc(1, sizeof *g);
    if (!g) return hm_errf(err, HM_ERR_NOMEM, "%s: out of memory", path);
    static const uint8_t empty[1];
    g->base = empty;
    g->path = g->label = hm_arena_strndup(&g->arena, path, strlen(path));
    if (!g->path) {
        free(g);
        return hm_errf(err, HM_ERR_NOMEM, "%s: out of memory", path);
    }
    /* O_NONBLOCK: opening a FIFO without a writer would otherwise block before fstat can refuse it */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        int e = errno;
        if (fd >= 0) close(fd);
        hm_gguf_close(g);
        return hm_errf(err, HM_ERR_IO, "%s: cannot open: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        hm_gguf_close(g);
        return hm_errf(err, HM_ERR_IO, "%s: not a regular file", path);
    }
    g->size = (size_t)sb.st_size;
    if (g->size) {
        /* shared, not private: the same pages for reading, and the NVIDIA driver can page-lock a
         * shared file mapping (--mlock's cudaHostRegister) but never returns on a private one */
        void *m = mmap(NULL, g->size, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            g->size = 0;
            hm_gguf_close(g);
            return hm_errf(err, HM_ERR_IO, "%s: mmap of %lld bytes failed: %s", path, (long long)sb.st_size, strerror(e));
        }
        g->map = m;
        g->base = m;
    }
    close(fd);
    return finish_open(g, out, err);
}

hm_status hm_gguf_open(hm_gguf **out, const char *path, hm_err *err) {
    hm_status st = hm_gguf_open_one(out, path, err);
    if (st == HM_OK && (st = hm_gguf_splits_load(*out, err)) != HM_OK) {
        hm_gguf_close(*out);
        *out = NULL;
    }
    return st;
}

hm_status hm_gguf_adopt_split(hm_gguf *g, hm_gguf *part, int32_t file, hm_err *err) {
    if (g->n_parts == INT32_MAX || part->n_tensors > INT64_MAX - g->n_tensors)
        return hm_errf(err, HM_ERR_FORMAT, "%s: too many splits or tensors", g->label);
    hm_gguf **parts = realloc(g->parts, (size_t)(g->n_parts + 1) * sizeof *parts);
    if (!parts) return hm_errf(err, HM_ERR_NOMEM, "%s: out of memory", g->label);
    g->parts = parts;
    hm_gguf_tensor *t = realloc(g->tensors, (size_t)(g->n_tensors + part->n_tensors + 1) * sizeof *t);
    if (!t) return hm_errf(err, HM_ERR_NOMEM, "%s: out of memory for the tensors of %s", g->label, part->label);
    g->tensors = t;
    for (int64_t i = 0; i < part->n_tensors; i++) {
        hm_gguf_tensor *x = &g->tensors[g->n_tensors];
        *x = part->tensors[i]; /* name and data stay part's, which g now owns */
        x->file = file;
        int r = hm_strset_insert(&g->names, x->name, g->n_tensors);
        if (r < 0) return hm_errf(err, HM_ERR_NOMEM, "%s: out of memory indexing tensor names", g->label);
        if (r == 0)
            return hm_errf(err, HM_ERR_FORMAT, "%s: tensor '%s' is in two splits (split %d and an earlier one)",
                           part->label, x->name, file + 1);
        g->n_tensors++;
    }
    g->parts[g->n_parts++] = part;
    return HM_OK;
}

int32_t hm_gguf_n_files(const hm_gguf *g) { return 1 + g->n_parts; }

const char *hm_gguf_file_path(const hm_gguf *g, int32_t i) {
    if (i == 0) return g->path;
    return i > 0 && i <= g->n_parts ? g->parts[i - 1]->path : NULL;
}

uint64_t hm_gguf_split_file_size(const hm_gguf *g, int32_t i) {
    if (i == 0) return g->size;
    return i > 0 && i <= g->n_parts ? g->parts[i - 1]->size : 0;
}

/* ---- accessors ---- */

uint32_t hm_gguf_version(const hm_gguf *g) { return g->version; }
uint64_t hm_gguf_file_size(const hm_gguf *g) {
    uint64_t n = g->size;
    for (int32_t i = 0; i < g->n_parts; i++) n += g->parts[i]->size;
    return n;
}
uint64_t hm_gguf_alignment(const hm_gguf *g) { return g->alignment; }
uint64_t hm_gguf_data_offset(const hm_gguf *g) { return g->data_offset; }
const char *hm_gguf_path(const hm_gguf *g) { return g->path; }

int64_t hm_gguf_n_kv(const hm_gguf *g) { return g->n_kv; }
int64_t hm_gguf_find_key(const hm_gguf *g, const char *key) { return hm_strset_find(&g->keys, key); }

static const kv *kv_at(const hm_gguf *g, int64_t i) { return i >= 0 && i < g->n_kv ? &g->kvs[i] : NULL; }

const char *hm_gguf_key(const hm_gguf *g, int64_t i) {
    const kv *e = kv_at(g, i);
    return e ? e->key : NULL;
}

hm_gguf_vtype hm_gguf_kv_type(const hm_gguf *g, int64_t i) {
    const kv *e = kv_at(g, i);
    return e ? e->type : HM_GGUF_VTYPE_COUNT;
}

bool hm_gguf_kv_int(const hm_gguf *g, int64_t i, int64_t *out) {
    const kv *e = kv_at(g, i);
    return e && num_int(e->type, e->v, out);
}

bool hm_gguf_kv_float(const hm_gguf *g, int64_t i, double *out) {
    const kv *e = kv_at(g, i);
    return e && num_float(e->type, e->v, out);
}

bool hm_gguf_kv_bool(const hm_gguf *g, int64_t i, bool *out) {
    const kv *e = kv_at(g, i);
    if (!e || e->type != HM_GGUF_BOOL) return false;
    *out = e->v.u != 0;
    return true;
}

bool hm_gguf_kv_str(const hm_gguf *g, int64_t i, hm_gguf_str *out) {
    const kv *e = kv_at(g, i);
    if (!e || e->type != HM_GGUF_STRING) return false;
    *out = e->str;
    return true;
}

static void fill_arr(const hm_gguf *g, int64_t node, int64_t kv_index, hm_gguf_arr *out) {
    const arr_node *n = &g->nodes[node];
    out->elem_type = n->elem_type;
    out->n = n->n;
    out->data = g->base + n->off;
    out->file_offset = n->off;
    out->owner = g;
    out->kv_index = kv_index;
    out->node = node;
}

bool hm_gguf_kv_arr(const hm_gguf *g, int64_t i, hm_gguf_arr *out) {
    const kv *e = kv_at(g, i);
    if (!e || e->type != HM_GGUF_ARRAY) return false;
    fill_arr(g, e->node, i, out);
    return true;
}

bool hm_gguf_get_int(const hm_gguf *g, const char *key, int64_t *out) { return hm_gguf_kv_int(g, hm_gguf_find_key(g, key), out); }
bool hm_gguf_get_float(const hm_gguf *g, const char *key, double *out) { return hm_gguf_kv_float(g, hm_gguf_find_key(g, key), out); }
bool hm_gguf_get_bool(const hm_gguf *g, const char *key, bool *out) { return hm_gguf_kv_bool(g, hm_gguf_find_key(g, key), out); }
bool hm_gguf_get_str(const hm_gguf *g, const char *key, hm_gguf_str *out) { return hm_gguf_kv_str(g, hm_gguf_find_key(g, key), out); }
bool hm_gguf_get_arr(const hm_gguf *g, const char *key, hm_gguf_arr *out) { return hm_gguf_kv_arr(g, hm_gguf_find_key(g, key), out); }

/* The node behind a, or NULL when a is not a live array of its owner. */
static const arr_node *arr_node_of(const hm_gguf_arr *a, uint64_t i) {
    if (!a || !a->owner || a->node < 0 || a->node >= a->owner->n_nodes) return NULL;
    const arr_node *n = &a->owner->nodes[a->node];
    return i < n->n ? n : NULL;
}

bool hm_gguf_arr_str(const hm_gguf_arr *a, uint64_t i, hm_gguf_str *out) {
    const arr_node *n = arr_node_of(a, i);
    if (!n || n->elem_type != HM_GGUF_STRING) return false;
    const uint8_t *p = a->owner->base + n->idx[i];
    memcpy(&out->len, p, 8);
    out->ptr = (const char *)p + 8;
    return true;
}

static bool arr_num(const hm_gguf_arr *a, uint64_t i, num *v) {
    const arr_node *n = arr_node_of(a, i);
    if (!n || !vtype_sizes[n->elem_type]) return false;
    *v = decode(n->elem_type, a->owner->base + n->off + i * vtype_sizes[n->elem_type]);
    return true;
}

bool hm_gguf_arr_int(const hm_gguf_arr *a, uint64_t i, int64_t *out) {
    num v;
    return arr_num(a, i, &v) && num_int(a->owner->nodes[a->node].elem_type, v, out);
}

bool hm_gguf_arr_float(const hm_gguf_arr *a, uint64_t i, double *out) {
    num v;
    return arr_num(a, i, &v) && num_float(a->owner->nodes[a->node].elem_type, v, out);
}

bool hm_gguf_arr_arr(const hm_gguf_arr *a, uint64_t i, hm_gguf_arr *out) {
    const arr_node *n = arr_node_of(a, i);
    if (!n || n->elem_type != HM_GGUF_ARRAY) return false;
    fill_arr(a->owner, (int64_t)n->idx[i], a->kv_index, out);
    return true;
}

int64_t hm_gguf_n_tensors(const hm_gguf *g) { return g->n_tensors; }

void hm_gguf_tensor_alias(hm_gguf *g, int64_t i, const void *data) {
    if (i >= 0 && i < g->n_tensors) g->tensors[i].data = data;
}

const hm_gguf_tensor *hm_gguf_tensor_at(const hm_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

const hm_gguf_tensor *hm_gguf_find_tensor(const hm_gguf *g, const char *name) {
    return hm_gguf_tensor_at(g, hm_strset_find(&g->names, name));
}
