/* test_gguf.c - the GGUF reader and writer.
 *
 *  - round trip: the writer writes every value type (nested arrays, string arrays) and tensors of
 *    several types and shapes in odd-sized chunks; the reader gives every value back;
 *  - hand-built images (a v2 file and a v3 file whose every offset is derived by hand in the
 *    comments below) check the reader independently of the writer;
 *  - truncation at every byte offset of small valid files gives HM_ERR_FORMAT (run this under
 *    the HOTMOE_SANITIZE build too: copies are exactly sized so ASan sees any over-read);
 *  - corruptions give errors whose message names the field (overlapping tensor data included);
 *  - writer validation and atomicity (abort / failed finish leave neither PATH nor PATH.tmp);
 *  - the fuzz seed corpus opens and the fuzz regression inputs do not crash.
 * `test_gguf --write-corpus DIR` writes the fuzz seed corpus (fuzz/corpus/gguf/). */
#include <dirent.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "quant/quant.h"
#include "test.h"

/* ---- a byte builder for hand-made images ---- */

typedef struct bb {
    uint8_t b[8192];
    size_t n;
} bb;

static void bb_raw(bb *x, const void *p, size_t n) {
    if (x->n + n > sizeof x->b) abort();
    memcpy(x->b + x->n, p, n);
    x->n += n;
}
static void bb_u32(bb *x, uint32_t v) { bb_raw(x, &v, 4); }
static void bb_u64(bb *x, uint64_t v) { bb_raw(x, &v, 8); }
static void bb_u16(bb *x, uint16_t v) { bb_raw(x, &v, 2); }
static void bb_str(bb *x, const char *s) {
    bb_u64(x, strlen(s));
    bb_raw(x, s, strlen(s));
}
static void bb_pad(bb *x, size_t a) {
    while (x->n % a) x->b[x->n++] = 0;
}
static void bb_set_u32(bb *x, size_t at, uint32_t v) { memcpy(x->b + at, &v, 4); }
static void bb_set_u64(bb *x, size_t at, uint64_t v) { memcpy(x->b + at, &v, 8); }

static char tmpdir[256];

static const char *tpath(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    return buf[k];
}

static bool exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

static uint8_t *slurp(const char *p, size_t *n) {
    FILE *f = fopen(p, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(len ? (size_t)len : 1);
    *n = fread(b, 1, (size_t)len, f);
    fclose(f);
    return b;
}

static void spit(const char *p, const void *b, size_t n) {
    FILE *f = fopen(p, "wb");
    if (!f) abort();
    fwrite(b, 1, n, f);
    fclose(f);
}

static bool str_eq(hm_gguf_str s, const char *c, size_t n) { return s.len == n && memcmp(s.ptr, c, n) == 0; }

/* Open an image copied into an exactly-sized buffer; returns the status, message in err. */
static hm_status open_copy(const void *b, size_t n, hm_err *err) {
    uint8_t *c = malloc(n ? n : 1);
    if (n) memcpy(c, b, n);
    hm_gguf *g = NULL;
    err->msg[0] = 0;
    hm_status st = hm_gguf_open_mem(&g, n ? c : NULL, n, err);
    hm_gguf_close(g);
    free(c);
    return st;
}

/* ---- the round-trip file ---- */

typedef struct tdesc {
    const char *name;
    int type;
    uint32_t n_dims;
    int64_t ne[4];
    size_t nbytes; /* derived by hand from the block sizes in DESIGN.md §7 */
} tdesc;

static const tdesc rt_tensors[] = {
    {"token_embd.weight", HM_TYPE_F32, 2, {8, 3, 1, 1}, 8 * 3 * 4},
    {"f16", HM_TYPE_F16, 1, {5, 1, 1, 1}, 10},
    {"blk.0.q8", HM_TYPE_Q8_0, 2, {64, 2, 1, 1}, 2 * 2 * 34},
    {"blk.0.ffn_up_exps.weight", HM_TYPE_Q4_K, 3, {256, 1, 2, 1}, 2 * 144},
    {"bf16.4d", HM_TYPE_BF16, 4, {2, 3, 2, 2}, 24 * 2},
    {"empty", HM_TYPE_F32, 2, {0, 4, 1, 1}, 0},
    {"q6k", HM_TYPE_Q6_K, 1, {256, 1, 1, 1}, 210},
};
#define N_RT (sizeof rt_tensors / sizeof rt_tensors[0])

static uint8_t pattern(size_t t, size_t i) { return (uint8_t)(t * 31 + i * 7 + (i >> 8)); }

static const char *const tokens[] = {"a", "bc", "", "<|im_start|>", "\xc4\xa0the", "\xe4\xbd\xa0\xe5\xa5\xbd"};
#define N_TOK (sizeof tokens / sizeof tokens[0])

/* Writes the round-trip file; alignment 0 = default. */
static hm_status write_rt(const char *path, uint32_t alignment, hm_err *err) {
    hm_gguf_writer *w;
    hm_status st = hm_gguf_writer_open(&w, path, alignment, err);
    if (st) return st;
    hm_gguf_value v;
    v = (hm_gguf_value){.type = HM_GGUF_U8, .u = 200};
    hm_gguf_writer_set_value(w, "v.u8", &v);
    v = (hm_gguf_value){.type = HM_GGUF_I8, .i = -100};
    hm_gguf_writer_set_value(w, "v.i8", &v);
    v = (hm_gguf_value){.type = HM_GGUF_U16, .u = 60000};
    hm_gguf_writer_set_value(w, "v.u16", &v);
    v = (hm_gguf_value){.type = HM_GGUF_I16, .i = -30000};
    hm_gguf_writer_set_value(w, "v.i16", &v);
    hm_gguf_writer_set_u32(w, "v.u32", 4000000000u);
    hm_gguf_writer_set_i32(w, "v.i32", -2000000000);
    hm_gguf_writer_set_f32(w, "v.f32", 1.5f);
    hm_gguf_writer_set_bool(w, "v.bool", true);
    hm_gguf_writer_set_str(w, "general.name", "hello, gguf");
    hm_gguf_writer_set_u64(w, "v.u64", UINT64_MAX - 5);
    v = (hm_gguf_value){.type = HM_GGUF_I64, .i = INT64_MIN + 7};
    hm_gguf_writer_set_value(w, "v.i64", &v);
    v = (hm_gguf_value){.type = HM_GGUF_F64, .f = 3.141592653589793};
    hm_gguf_writer_set_value(w, "v.f64", &v);
    /* binary-safe string */
    v = (hm_gguf_value){.type = HM_GGUF_STRING, .str = {"x\0y", 3}};
    hm_gguf_writer_set_value(w, "v.str0", &v);
    /* fixed-size arrays */
    static const uint8_t au8[] = {1, 2, 3};
    static const int16_t ai16[] = {-5, 5};
    static const float af32[] = {0.5f, -2.0f, 1e30f};
    static const uint64_t au64[] = {0, UINT64_MAX};
    static const uint8_t abool[] = {1, 0, 1};
    static const int64_t ai64[] = {INT64_MIN, -1, INT64_MAX};
    static const double af64[] = {-0.25, 1e300};
    static const int8_t ai8[] = {-128, 127};
    static const uint16_t au16[] = {65535};
    static const uint32_t au32[] = {7, 8, 9, 10};
    static const int32_t ai32[] = {-7, 1 << 30};
    hm_gguf_writer_set_arr(w, "a.u8", HM_GGUF_U8, au8, 3);
    hm_gguf_writer_set_arr(w, "a.i8", HM_GGUF_I8, ai8, 2);
    hm_gguf_writer_set_arr(w, "a.u16", HM_GGUF_U16, au16, 1);
    hm_gguf_writer_set_arr(w, "a.i16", HM_GGUF_I16, ai16, 2);
    hm_gguf_writer_set_arr(w, "a.u32", HM_GGUF_U32, au32, 4);
    hm_gguf_writer_set_arr(w, "a.i32", HM_GGUF_I32, ai32, 2);
    hm_gguf_writer_set_arr(w, "a.f32", HM_GGUF_F32, af32, 3);
    hm_gguf_writer_set_arr(w, "a.bool", HM_GGUF_BOOL, abool, 3);
    hm_gguf_writer_set_arr(w, "a.u64", HM_GGUF_U64, au64, 2);
    hm_gguf_writer_set_arr(w, "a.i64", HM_GGUF_I64, ai64, 3);
    hm_gguf_writer_set_arr(w, "a.f64", HM_GGUF_F64, af64, 2);
    hm_gguf_writer_set_arr(w, "a.empty", HM_GGUF_U32, NULL, 0);
    hm_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, N_TOK);
    static const hm_gguf_str sarr[] = {{"p\0q", 3}, {NULL, 0}, {"zz", 2}};
    v = (hm_gguf_value){.type = HM_GGUF_ARRAY, .arr = {HM_GGUF_STRING, 3, sarr}};
    hm_gguf_writer_set_value(w, "a.str", &v);
    /* nested: [[1, 2], [], [3, 4, 5]] of i32 */
    static const int32_t n0[] = {1, 2}, n2[] = {3, 4, 5};
    const hm_gguf_value inner[] = {
        {.type = HM_GGUF_ARRAY, .arr = {HM_GGUF_I32, 2, n0}},
        {.type = HM_GGUF_ARRAY, .arr = {HM_GGUF_I32, 0, NULL}},
        {.type = HM_GGUF_ARRAY, .arr = {HM_GGUF_I32, 3, n2}},
    };
    v = (hm_gguf_value){.type = HM_GGUF_ARRAY, .arr = {HM_GGUF_ARRAY, 3, inner}};
    hm_gguf_writer_set_value(w, "a.nested", &v);
    /* nested strings: [["ab", "c"], ["d"]] */
    static const hm_gguf_str s0[] = {{"ab", 2}, {"c", 1}}, s1[] = {{"d", 1}};
    const hm_gguf_value sinner[] = {
        {.type = HM_GGUF_ARRAY, .arr = {HM_GGUF_STRING, 2, s0}},
        {.type = HM_GGUF_ARRAY, .arr = {HM_GGUF_STRING, 1, s1}},
    };
    v = (hm_gguf_value){.type = HM_GGUF_ARRAY, .arr = {HM_GGUF_ARRAY, 2, sinner}};
    hm_gguf_writer_set_value(w, "a.nested_str", &v);
    /* three levels: [[[42.5]]] of f64 */
    static const double d42[] = {42.5};
    const hm_gguf_value l2[] = {{.type = HM_GGUF_ARRAY, .arr = {HM_GGUF_F64, 1, d42}}};
    const hm_gguf_value l1[] = {{.type = HM_GGUF_ARRAY, .arr = {HM_GGUF_ARRAY, 1, l2}}};
    v = (hm_gguf_value){.type = HM_GGUF_ARRAY, .arr = {HM_GGUF_ARRAY, 1, l1}};
    hm_gguf_writer_set_value(w, "a.deep", &v);

    for (size_t i = 0; i < N_RT; i++)
        hm_gguf_writer_add_tensor(w, rt_tensors[i].name, rt_tensors[i].type, rt_tensors[i].n_dims, rt_tensors[i].ne);
    if ((st = hm_gguf_writer_begin_data(w))) {
        hm_gguf_writer_abort(w);
        return st;
    }
    /* all tensor bytes as one stream, in chunks of 1..97 bytes that straddle tensor boundaries */
    static uint8_t stream[4096];
    size_t total = 0;
    for (size_t t = 0; t < N_RT; t++)
        for (size_t i = 0; i < rt_tensors[t].nbytes; i++) stream[total++] = pattern(t, i);
    for (size_t off = 0, k = 1; off < total; k = k * 5 % 97 + 1) {
        size_t n = total - off < k ? total - off : k;
        if ((st = hm_gguf_writer_write(w, stream + off, n))) break;
        off += n;
    }
    return hm_gguf_writer_finish(w); /* also reports a failure of the writes above */
}

static void check_arr_i32(const hm_gguf_arr *a, const int32_t *want, uint64_t n) {
    CHECK(a->elem_type == HM_GGUF_I32 && a->n == n);
    for (uint64_t i = 0; i < n && i < a->n; i++) {
        int64_t x = 0;
        CHECK(hm_gguf_arr_int(a, i, &x) && x == want[i]);
    }
    int64_t x;
    CHECK(!hm_gguf_arr_int(a, n, &x));
}

static void check_rt(const char *path, uint64_t alignment) {
    hm_gguf *g = NULL;
    hm_err err = {{0}};
    hm_status st = hm_gguf_open(&g, path, &err);
    CHECKF(st == HM_OK, "%s", err.msg);
    if (st) return;
    CHECK(hm_gguf_version(g) == 3);
    CHECK(hm_gguf_alignment(g) == alignment);
    CHECK(strcmp(hm_gguf_path(g), path) == 0);
    CHECK(hm_gguf_data_offset(g) % alignment == 0);
    CHECK(hm_gguf_n_kv(g) == 30 + (alignment != 32));
    CHECK(hm_gguf_n_tensors(g) == (int64_t)N_RT);

    int64_t i = 0;
    double f = 0;
    bool b = false;
    hm_gguf_str s;
    hm_gguf_arr a, sub, sub2;
    CHECK(hm_gguf_get_int(g, "v.u8", &i) && i == 200);
    CHECK(hm_gguf_get_int(g, "v.i8", &i) && i == -100);
    CHECK(hm_gguf_get_int(g, "v.u16", &i) && i == 60000);
    CHECK(hm_gguf_get_int(g, "v.i16", &i) && i == -30000);
    CHECK(hm_gguf_get_int(g, "v.u32", &i) && i == 4000000000);
    CHECK(hm_gguf_get_int(g, "v.i32", &i) && i == -2000000000);
    CHECK(hm_gguf_get_float(g, "v.f32", &f) && f == 1.5);
    CHECK(!hm_gguf_get_int(g, "v.f32", &i));
    CHECK(hm_gguf_get_bool(g, "v.bool", &b) && b);
    CHECK(hm_gguf_get_int(g, "v.bool", &i) && i == 1);
    CHECK(!hm_gguf_get_bool(g, "v.u8", &b));
    CHECK(hm_gguf_get_str(g, "general.name", &s) && str_eq(s, "hello, gguf", 11));
    CHECK(!hm_gguf_get_str(g, "v.u8", &s));
    CHECK(!hm_gguf_get_int(g, "v.u64", &i)); /* above INT64_MAX */
    CHECK(hm_gguf_get_float(g, "v.u64", &f) && f == (double)(UINT64_MAX - 5));
    CHECK(hm_gguf_get_int(g, "v.i64", &i) && i == INT64_MIN + 7);
    CHECK(hm_gguf_get_float(g, "v.f64", &f) && f == 3.141592653589793);
    CHECK(hm_gguf_get_float(g, "v.i16", &f) && f == -30000.0);
    CHECK(hm_gguf_get_str(g, "v.str0", &s) && str_eq(s, "x\0y", 3));
    CHECK(!hm_gguf_get_int(g, "no.such.key", &i));
    CHECK(hm_gguf_find_key(g, "no.such.key") == -1);
    int64_t k = hm_gguf_find_key(g, "v.u16");
    CHECK(k == 2 && strcmp(hm_gguf_key(g, k), "v.u16") == 0 && hm_gguf_kv_type(g, k) == HM_GGUF_U16);
    CHECK(hm_gguf_key(g, -1) == NULL && hm_gguf_key(g, hm_gguf_n_kv(g)) == NULL);
    CHECK(hm_gguf_kv_type(g, 1000) == HM_GGUF_VTYPE_COUNT);
    CHECK(!hm_gguf_kv_int(g, 1000, &i));

    CHECK(hm_gguf_get_arr(g, "a.u8", &a) && a.elem_type == HM_GGUF_U8 && a.n == 3 &&
          memcmp(a.data, "\1\2\3", 3) == 0);
    CHECK(hm_gguf_arr_int(&a, 2, &i) && i == 3);
    CHECK(!hm_gguf_arr_str(&a, 0, &s) && !hm_gguf_arr_arr(&a, 0, &sub));
    CHECK(hm_gguf_get_arr(g, "a.i8", &a) && hm_gguf_arr_int(&a, 0, &i) && i == -128 && hm_gguf_arr_int(&a, 1, &i) && i == 127);
    CHECK(hm_gguf_get_arr(g, "a.u16", &a) && hm_gguf_arr_int(&a, 0, &i) && i == 65535);
    CHECK(hm_gguf_get_arr(g, "a.i16", &a) && hm_gguf_arr_int(&a, 0, &i) && i == -5 && hm_gguf_arr_float(&a, 1, &f) && f == 5);
    CHECK(hm_gguf_get_arr(g, "a.u32", &a) && a.n == 4 && hm_gguf_arr_int(&a, 3, &i) && i == 10);
    CHECK(hm_gguf_get_arr(g, "a.i32", &a) && hm_gguf_arr_int(&a, 1, &i) && i == 1 << 30);
    CHECK(hm_gguf_get_arr(g, "a.f32", &a) && hm_gguf_arr_float(&a, 2, &f) && f == (double)1e30f && !hm_gguf_arr_int(&a, 0, &i));
    CHECK(hm_gguf_get_arr(g, "a.bool", &a) && a.elem_type == HM_GGUF_BOOL && hm_gguf_arr_int(&a, 0, &i) && i == 1 &&
          hm_gguf_arr_int(&a, 1, &i) && i == 0);
    CHECK(hm_gguf_get_arr(g, "a.u64", &a) && hm_gguf_arr_int(&a, 0, &i) && i == 0 && !hm_gguf_arr_int(&a, 1, &i) &&
          hm_gguf_arr_float(&a, 1, &f) && f == (double)UINT64_MAX);
    CHECK(hm_gguf_get_arr(g, "a.i64", &a) && hm_gguf_arr_int(&a, 0, &i) && i == INT64_MIN && hm_gguf_arr_int(&a, 2, &i) && i == INT64_MAX);
    CHECK(hm_gguf_get_arr(g, "a.f64", &a) && hm_gguf_arr_float(&a, 0, &f) && f == -0.25 && hm_gguf_arr_float(&a, 1, &f) && f == 1e300);
    CHECK(hm_gguf_get_arr(g, "a.empty", &a) && a.n == 0 && a.elem_type == HM_GGUF_U32 && !hm_gguf_arr_int(&a, 0, &i));

    CHECK(hm_gguf_get_arr(g, "tokenizer.ggml.tokens", &a) && a.elem_type == HM_GGUF_STRING && a.n == N_TOK);
    for (uint64_t t = 0; t < N_TOK; t++)
        CHECKF(hm_gguf_arr_str(&a, t, &s) && str_eq(s, tokens[t], strlen(tokens[t])), "token %llu", (unsigned long long)t);
    CHECK(!hm_gguf_arr_str(&a, N_TOK, &s) && !hm_gguf_arr_int(&a, 0, &i));
    CHECK(hm_gguf_get_arr(g, "a.str", &a) && a.n == 3 && hm_gguf_arr_str(&a, 0, &s) && str_eq(s, "p\0q", 3) &&
          hm_gguf_arr_str(&a, 1, &s) && s.len == 0 && hm_gguf_arr_str(&a, 2, &s) && str_eq(s, "zz", 2));

    static const int32_t n0[] = {1, 2}, n2[] = {3, 4, 5};
    CHECK(hm_gguf_get_arr(g, "a.nested", &a) && a.elem_type == HM_GGUF_ARRAY && a.n == 3);
    CHECK(hm_gguf_arr_arr(&a, 0, &sub));
    check_arr_i32(&sub, n0, 2);
    CHECK(hm_gguf_arr_arr(&a, 1, &sub));
    check_arr_i32(&sub, NULL, 0);
    CHECK(hm_gguf_arr_arr(&a, 2, &sub));
    check_arr_i32(&sub, n2, 3);
    CHECK(!hm_gguf_arr_arr(&a, 3, &sub) && !hm_gguf_arr_int(&a, 0, &i));
    CHECK(hm_gguf_get_arr(g, "a.nested_str", &a) && a.n == 2 && hm_gguf_arr_arr(&a, 0, &sub) && sub.n == 2 &&
          hm_gguf_arr_str(&sub, 0, &s) && str_eq(s, "ab", 2) && hm_gguf_arr_str(&sub, 1, &s) && str_eq(s, "c", 1) &&
          hm_gguf_arr_arr(&a, 1, &sub) && sub.n == 1 && hm_gguf_arr_str(&sub, 0, &s) && str_eq(s, "d", 1));
    CHECK(hm_gguf_get_arr(g, "a.deep", &a) && a.n == 1 && hm_gguf_arr_arr(&a, 0, &sub) && sub.elem_type == HM_GGUF_ARRAY &&
          hm_gguf_arr_arr(&sub, 0, &sub2) && sub2.elem_type == HM_GGUF_F64 && hm_gguf_arr_float(&sub2, 0, &f) && f == 42.5);
    if (alignment != 32) CHECK(hm_gguf_get_int(g, "general.alignment", &i) && (uint64_t)i == alignment);

    uint64_t prev_end = 0;
    for (size_t t = 0; t < N_RT; t++) {
        const tdesc *d = &rt_tensors[t];
        const hm_gguf_tensor *x = hm_gguf_tensor_at(g, (int64_t)t);
        CHECK(x && hm_gguf_find_tensor(g, d->name) == x);
        if (!x) continue;
        CHECK(strcmp(x->name, d->name) == 0 && x->type == d->type && x->n_dims == d->n_dims);
        for (int j = 0; j < 4; j++) CHECK(x->ne[j] == d->ne[j]);
        CHECKF(x->nbytes == d->nbytes, "%s: %zu vs %zu", d->name, x->nbytes, d->nbytes);
        CHECK(x->offset % alignment == 0 && x->offset >= prev_end);
        CHECK(x->file_offset == hm_gguf_data_offset(g) + x->offset);
        prev_end = x->offset + x->nbytes;
        bool same = true;
        for (size_t j = 0; j < d->nbytes; j++) same = same && ((const uint8_t *)x->data)[j] == pattern(t, j);
        CHECKF(same, "tensor %s data", d->name);
    }
    CHECK(hm_gguf_find_tensor(g, "nope") == NULL && hm_gguf_tensor_at(g, -1) == NULL && hm_gguf_tensor_at(g, (int64_t)N_RT) == NULL);
    hm_gguf_close(g);
}

static void test_roundtrip(void) {
    hm_err err = {{0}};
    hm_status st = write_rt(tpath("rt.gguf"), 0, &err);
    CHECKF(st == HM_OK, "%s", err.msg);
    CHECK(!exists(tpath("rt.gguf.tmp")));
    check_rt(tpath("rt.gguf"), 32);
    st = write_rt(tpath("rt64.gguf"), 64, &err);
    CHECKF(st == HM_OK, "%s", err.msg);
    check_rt(tpath("rt64.gguf"), 64);

    /* metadata only: finish without begin_data */
    hm_gguf_writer *w;
    CHECK(hm_gguf_writer_open(&w, tpath("meta.gguf"), 0, &err) == HM_OK);
    hm_gguf_writer_set_str(w, "general.architecture", "qwen3moe");
    hm_gguf_value big = {.type = HM_GGUF_F32, .f = -1e300}; /* saturates, never UB */
    hm_gguf_writer_set_value(w, "f32.sat", &big);
    CHECK(hm_gguf_writer_finish(w) == HM_OK);
    hm_gguf *g;
    CHECK(hm_gguf_open(&g, tpath("meta.gguf"), &err) == HM_OK);
    hm_gguf_str s;
    double f = 0;
    CHECK(hm_gguf_n_tensors(g) == 0 && hm_gguf_get_str(g, "general.architecture", &s) && str_eq(s, "qwen3moe", 8));
    CHECK(hm_gguf_get_float(g, "f32.sat", &f) && isinf(f) && f < 0);
    hm_gguf_close(g);
    hm_gguf_close(NULL);
}

/* ---- hand-built images ---- */

/* A v3 image with general.alignment 64. Every offset below is derived by hand:
 *   0  magic, 4 version, 8 n_tensors (2), 16 n_kv (3)                         -> 24
 *   kv 0 at 24: key len 24..32, "general.alignment" (17) 32..49, type 49..53,
 *        u32 value 53..57
 *   kv 1 at 57: key len 57..65, "k" 65..66, type 66..70 (string), len 70..78, "abc" 78..81
 *   kv 2 at 81: key len 81..89, "arr" 89..92, type 92..96 (array), elem type 96..100 (u16),
 *        count 100..108, elements 108..112
 *   tensor 0 at 112: name len 112..120, "w" 120..121, n_dims 121..125 (1), ne[0] 125..133 (32),
 *        type 133..137 (q8_0), offset 137..145 (0)
 *   tensor 1 at 145: name len 145..153, "b" 153..154, n_dims 154..158 (1), ne[0] 158..166 (3),
 *        type 166..170 (f32), offset 170..178 (64)
 *   data section: align_up(178, 64) = 192; w at 192..226 (34 bytes), b at 256..268. */
static void build_hand(bb *x, uint32_t version) {
    x->n = 0;
    bb_raw(x, "GGUF", 4);
    bb_u32(x, version);
    bb_u64(x, 2);
    bb_u64(x, 3);
    bb_str(x, "general.alignment");
    bb_u32(x, HM_GGUF_U32);
    bb_u32(x, 64);
    bb_str(x, "k");
    bb_u32(x, HM_GGUF_STRING);
    bb_str(x, "abc");
    bb_str(x, "arr");
    bb_u32(x, HM_GGUF_ARRAY);
    bb_u32(x, HM_GGUF_U16);
    bb_u64(x, 2);
    bb_u16(x, 0x1234);
    bb_u16(x, 0xfedc);
    bb_str(x, "w");
    bb_u32(x, 1);
    bb_u64(x, 32);
    bb_u32(x, HM_TYPE_Q8_0);
    bb_u64(x, 0);
    bb_str(x, "b");
    bb_u32(x, 1);
    bb_u64(x, 3);
    bb_u32(x, HM_TYPE_F32);
    bb_u64(x, 64);
    bb_pad(x, 64);
    for (int i = 0; i < 34; i++) x->b[x->n++] = (uint8_t)(0xa0 + i);
    bb_pad(x, 64);
    const float fb[3] = {1.0f, -2.0f, 0.5f};
    bb_raw(x, fb, 12);
}

static void test_hand(void) {
    bb x;
    build_hand(&x, 3);
    CHECK(x.n == 268);
    hm_gguf *g = NULL;
    hm_err err = {{0}};
    hm_status st = hm_gguf_open_mem(&g, x.b, x.n, &err);
    CHECKF(st == HM_OK, "%s", err.msg);
    if (st) return;
    CHECK(hm_gguf_version(g) == 3 && hm_gguf_file_size(g) == 268 && hm_gguf_alignment(g) == 64);
    CHECK(hm_gguf_data_offset(g) == 192);
    CHECK(strcmp(hm_gguf_path(g), "") == 0);
    hm_gguf_str s;
    CHECK(hm_gguf_get_str(g, "k", &s) && s.ptr == (const char *)x.b + 78 && s.len == 3);
    hm_gguf_arr a;
    int64_t v;
    CHECK(hm_gguf_get_arr(g, "arr", &a) && a.file_offset == 108 && a.data == x.b + 108 && a.n == 2 && a.kv_index == 2);
    CHECK(hm_gguf_arr_int(&a, 0, &v) && v == 0x1234 && hm_gguf_arr_int(&a, 1, &v) && v == 0xfedc);
    const hm_gguf_tensor *w = hm_gguf_find_tensor(g, "w"), *b = hm_gguf_find_tensor(g, "b");
    CHECK(w && w->file_offset == 192 && w->offset == 0 && w->nbytes == 34 && w->data == x.b + 192 && w->ne[1] == 1);
    CHECK(b && b->file_offset == 256 && b->offset == 64 && b->nbytes == 12 && b->data == x.b + 256);
    float f;
    memcpy(&f, (const uint8_t *)b->data + 4, 4);
    CHECK(f == -2.0f);
    hm_gguf_close(g);

    /* every truncation of it */
    int bad = 0;
    for (size_t n = 0; n < x.n; n++) {
        hm_status t = open_copy(x.b, n, &err);
        if (t != HM_ERR_FORMAT || !err.msg[0]) {
            bad++;
            fprintf(stderr, "hand image truncated to %zu: %s '%s'\n", n, hm_status_name(t), err.msg);
        }
    }
    CHECK(bad == 0);
}

/* v2: same layout as v3 (u64 counts); v1 (u32 counts) is rejected. */
static void test_v2(void) {
    bb x = {.n = 0};
    bb_raw(&x, "GGUF", 4);
    bb_u32(&x, 2);
    bb_u64(&x, 1);
    bb_u64(&x, 2);
    bb_str(&x, "general.architecture");
    bb_u32(&x, HM_GGUF_STRING);
    bb_str(&x, "llama");
    bb_str(&x, "llama.block_count");
    bb_u32(&x, HM_GGUF_U32);
    bb_u32(&x, 7);
    bb_str(&x, "t");
    bb_u32(&x, 2);
    bb_u64(&x, 4);
    bb_u64(&x, 2);
    bb_u32(&x, HM_TYPE_F32);
    bb_u64(&x, 0);
    size_t table_end = x.n;
    bb_pad(&x, 32);
    size_t data = x.n;
    for (int i = 0; i < 8; i++) {
        float f = (float)i;
        bb_raw(&x, &f, 4);
    }
    hm_gguf *g = NULL;
    hm_err err = {{0}};
    hm_status st = hm_gguf_open_mem(&g, x.b, x.n, &err);
    CHECKF(st == HM_OK, "%s", err.msg);
    if (!st) {
        hm_gguf_str s;
        int64_t v;
        CHECK(hm_gguf_version(g) == 2 && hm_gguf_data_offset(g) == data && data == (table_end + 31) / 32 * 32);
        CHECK(hm_gguf_get_str(g, "general.architecture", &s) && str_eq(s, "llama", 5));
        CHECK(hm_gguf_get_int(g, "llama.block_count", &v) && v == 7);
        const hm_gguf_tensor *t = hm_gguf_find_tensor(g, "t");
        CHECK(t && t->ne[0] == 4 && t->ne[1] == 2 && t->nbytes == 32 && t->file_offset == data);
        float f;
        if (t) memcpy(&f, (const uint8_t *)t->data + 28, 4);
        CHECK(t && f == 7.0f);
        hm_gguf_close(g);
    }
    spit(tpath("v2.gguf"), x.b, x.n);
    bb_set_u32(&x, 4, 1);
    st = open_copy(x.b, x.n, &err);
    CHECKF(st == HM_ERR_FORMAT && strstr(err.msg, "version 1"), "%s", err.msg);
}

/* ---- truncation of a small writer-made file at every byte, through memory and the file path ---- */

static hm_status write_small(const char *path, hm_err *err) {
    hm_gguf_writer *w;
    hm_status st = hm_gguf_writer_open(&w, path, 0, err);
    if (st) return st;
    hm_gguf_writer_set_str(w, "general.architecture", "qwen3moe");
    hm_gguf_writer_set_u32(w, "qwen3moe.expert_count", 4);
    hm_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, N_TOK);
    static const int32_t n0[] = {1, 2};
    const hm_gguf_value inner[] = {{.type = HM_GGUF_ARRAY, .arr = {HM_GGUF_I32, 2, n0}}};
    hm_gguf_value v = {.type = HM_GGUF_ARRAY, .arr = {HM_GGUF_ARRAY, 1, inner}};
    hm_gguf_writer_set_value(w, "a.nested", &v);
    const int64_t ne0[] = {3}, ne1[] = {8};
    hm_gguf_writer_add_tensor(w, "a", HM_TYPE_F32, 1, ne0);
    hm_gguf_writer_add_tensor(w, "b", HM_TYPE_F32, 1, ne1); /* 32 bytes: the file ends with it, no padding */
    hm_gguf_writer_begin_data(w);
    const float fa[3] = {1, 2, 3}, fb[8] = {4, 5, 6, 7, 8, 9, 10, 11};
    hm_gguf_writer_write(w, fa, sizeof fa);
    hm_gguf_writer_write(w, fb, sizeof fb);
    return hm_gguf_writer_finish(w);
}

static void test_truncation(void) {
    hm_err err = {{0}};
    const char *p = tpath("small.gguf");
    hm_status st = write_small(p, &err);
    CHECKF(st == HM_OK, "%s", err.msg);
    size_t n = 0;
    uint8_t *b = slurp(p, &n);
    CHECK(b && n > 100);
    if (!b) return;
    CHECK(open_copy(b, n, &err) == HM_OK);
    int bad_mem = 0, bad_file = 0;
    for (size_t len = 0; len < n; len++) {
        hm_status t = open_copy(b, len, &err);
        if (t != HM_ERR_FORMAT || !err.msg[0]) {
            bad_mem++;
            fprintf(stderr, "small.gguf truncated to %zu (memory): %s '%s'\n", len, hm_status_name(t), err.msg);
        }
        const char *tp = tpath("trunc.gguf");
        spit(tp, b, len);
        hm_gguf *g = NULL;
        err.msg[0] = 0;
        t = hm_gguf_open(&g, tp, &err);
        if (t != HM_ERR_FORMAT || !err.msg[0] || g || !strstr(err.msg, tp)) {
            bad_file++;
            fprintf(stderr, "small.gguf truncated to %zu (file): %s '%s'\n", len, hm_status_name(t), err.msg);
        }
        hm_gguf_close(g);
    }
    CHECK(bad_mem == 0);
    CHECK(bad_file == 0);
    unlink(tpath("trunc.gguf"));
    free(b);
    /* the contract's example message: cut the round-trip file inside kv 29's key length */
    b = slurp(tpath("rt.gguf"), &n);
    const uint8_t *k6 = b ? memmem(b, n, "a.deep", 6) : NULL;
    CHECK(k6 != NULL);
    if (k6) {
        size_t at = (size_t)(k6 - b) - 8;
        char want[128];
        snprintf(want, sizeof want, "truncated at byte %zu reading kv 29 key length", at);
        open_copy(b, at + 4, &err);
        CHECKF(strstr(err.msg, want) != NULL, "%s", err.msg);
        open_copy(b, at + 10, &err);
        snprintf(want, sizeof want, "kv 29 key length 6 (at byte %zu) exceeds the 2 bytes left", at);
        CHECKF(strstr(err.msg, want) != NULL, "%s", err.msg);
    }
    free(b);
    hm_gguf *g;
    CHECK(hm_gguf_open(&g, tpath("does-not-exist.gguf"), &err) == HM_ERR_IO && strstr(err.msg, "does-not-exist"));
}

/* ---- corruptions: each message names the field ---- */

static void expect(const bb *x, const char *want1, const char *want2, const char *what) {
    hm_err err = {{0}};
    hm_status st = open_copy(x->b, x->n, &err);
    CHECKF(st == HM_ERR_FORMAT && strstr(err.msg, want1) && (!want2 || strstr(err.msg, want2)),
           "%s: got %s '%s', want '%s'%s%s", what, hm_status_name(st), err.msg, want1, want2 ? " and " : "", want2 ? want2 : "");
}

static void test_corrupt(void) {
    bb x;
#define PATCH32(at, v, w1, w2) do { build_hand(&x, 3); bb_set_u32(&x, at, v); expect(&x, w1, w2, #at " = " #v); } while (0)
#define PATCH64(at, v, w1, w2) do { build_hand(&x, 3); bb_set_u64(&x, at, v); expect(&x, w1, w2, #at " = " #v); } while (0)
    build_hand(&x, 3);
    x.b[0] = 'X';
    expect(&x, "bad magic", NULL, "magic");
    PATCH32(4, 1, "version 1", NULL);
    PATCH32(4, 4, "unsupported GGUF version 4", NULL);
    PATCH32(4, 0x03000000, "big-endian", NULL);
    PATCH64(8, UINT64_MAX, "n_tensors", NULL);
    PATCH64(8, 1000, "n_tensors", NULL);
    PATCH64(16, UINT64_MAX / 2, "n_kv", NULL);
    PATCH64(24, UINT64_MAX, "kv 0 key length", "at byte 24");
    PATCH64(24, 1u << 20, "kv 0 key length", NULL);
    PATCH32(49, HM_GGUF_I32, "general.alignment", "expected u32");
    PATCH32(53, 48, "general.alignment", "power of two");
    PATCH32(53, 0, "general.alignment", "power of two");
    PATCH32(66, 99, "kv 1 'k'", "unknown value type 99");
    PATCH64(70, UINT64_MAX, "kv 1 'k' string value length", "at byte 70");
    PATCH32(96, 13, "kv 2 'arr'", "unknown array element type 13");
    PATCH64(100, UINT64_MAX / 2, "kv 2 'arr'", "array count");
    PATCH64(100, 1000, "kv 2 'arr'", "array count");
    PATCH32(121, 5, "tensor 0 'w'", "n_dims 5");
    PATCH32(133, 99, "tensor 0 'w'", "unknown type id 99");
    PATCH32(133, 4, "tensor 0 'w'", "unknown type id 4");
    PATCH32(133, 1000000, "tensor 0 'w'", "unknown type id");
    PATCH64(125, 33, "tensor 0 'w'", "block size");
    PATCH64(125, (uint64_t)1 << 63, "tensor 0 'w'", "ne[0]");
    PATCH64(158, (uint64_t)1 << 62, "tensor 1 'b'", "row byte size");
    PATCH64(158, ((uint64_t)1 << 62) + 1, "tensor 1 'b'", "row byte size"); /* would wrap to 4 bytes */
    PATCH64(170, 64 * 1000, "tensor 1 'b'", "past end of file");
    PATCH64(170, UINT64_MAX - 63, "tensor 1 'b'", "past end of file");
    PATCH64(170, 32, "tensor 1 'b'", "not a multiple of the alignment");
    /* 'b' moved onto 'w' (Q8_0, 34 bytes at 0): two tensors sharing bytes, named both */
    PATCH64(170, 0, "tensors 'w'", "'b' (data from 192) overlap");
    PATCH64(158, 4, "tensor 1 'b'", "past end of file");
    build_hand(&x, 3);
    x.b[153] = 'w';
    expect(&x, "duplicate tensor name 'w'", NULL, "duplicate tensor");
    build_hand(&x, 3);
    x.b[65] = 0;
    expect(&x, "kv 1 key", "NUL", "NUL in key");

    /* built from scratch: duplicate key, ne product overflow, nesting too deep */
    x.n = 0;
    bb_raw(&x, "GGUF", 4);
    bb_u32(&x, 3);
    bb_u64(&x, 0);
    bb_u64(&x, 2);
    bb_str(&x, "dup");
    bb_u32(&x, HM_GGUF_U8);
    bb_raw(&x, "\1", 1);
    bb_str(&x, "dup");
    bb_u32(&x, HM_GGUF_U8);
    bb_raw(&x, "\2", 1);
    expect(&x, "duplicate key 'dup'", "kv 1", "duplicate key");

    x.n = 0;
    bb_raw(&x, "GGUF", 4);
    bb_u32(&x, 3);
    bb_u64(&x, 1);
    bb_u64(&x, 0);
    bb_str(&x, "big");
    bb_u32(&x, 3);
    bb_u64(&x, (uint64_t)1 << 40);
    bb_u64(&x, (uint64_t)1 << 40);
    bb_u64(&x, 1);
    bb_u32(&x, HM_TYPE_F32);
    bb_u64(&x, 0);
    bb_pad(&x, 32);
    expect(&x, "tensor 0 'big'", "overflows int64", "ne product");

    x.n = 0;
    bb_raw(&x, "GGUF", 4);
    bb_u32(&x, 3);
    bb_u64(&x, 0);
    bb_u64(&x, 1);
    bb_str(&x, "deep");
    bb_u32(&x, HM_GGUF_ARRAY);
    for (int d = 0; d < HM_GGUF_MAX_ARRAY_DEPTH + 1; d++) {
        bb_u32(&x, HM_GGUF_ARRAY);
        bb_u64(&x, 1);
    }
    bb_u32(&x, HM_GGUF_U8);
    bb_u64(&x, 0);
    expect(&x, "kv 0 'deep'", "nested deeper", "nesting");

    /* a huge string-array count is refused before any allocation */
    x.n = 0;
    bb_raw(&x, "GGUF", 4);
    bb_u32(&x, 3);
    bb_u64(&x, 0);
    bb_u64(&x, 1);
    bb_str(&x, "tokenizer.ggml.tokens");
    bb_u32(&x, HM_GGUF_ARRAY);
    bb_u32(&x, HM_GGUF_STRING);
    bb_u64(&x, (uint64_t)1 << 60);
    bb_str(&x, "a");
    expect(&x, "kv 0 'tokenizer.ggml.tokens'", "array count 1152921504606846976", "huge string array");
    /* one string element whose length is huge */
    x.n -= 8 + 8 + 1;
    bb_u64(&x, 1);
    bb_u64(&x, (uint64_t)1 << 62);
    bb_raw(&x, "a", 1);
    expect(&x, "kv 0 'tokenizer.ggml.tokens'", "array element 0 string length 4611686018427387904", "huge string");
#undef PATCH32
#undef PATCH64
}

/* ---- writer validation and atomicity ---- */

static void test_writer(void) {
    hm_err err = {{0}};
    hm_gguf_writer *w;
    const char *p = tpath("atomic.gguf"), *tmp = tpath("atomic.gguf.tmp");
    const int64_t ne[] = {64, 2};

    /* abort mid-data: neither PATH nor PATH.tmp */
    CHECK(hm_gguf_writer_open(&w, p, 0, &err) == HM_OK);
    CHECK(exists(tmp) && !exists(p));
    hm_gguf_writer_set_u32(w, "x", 1);
    hm_gguf_writer_add_tensor(w, "t", HM_TYPE_F32, 2, ne);
    CHECK(hm_gguf_writer_begin_data(w) == HM_OK);
    CHECK(hm_gguf_writer_write(w, "abcd", 4) == HM_OK);
    hm_gguf_writer_abort(w);
    CHECK(!exists(p) && !exists(tmp));
    hm_gguf_writer_abort(NULL);

    /* abort before data */
    CHECK(hm_gguf_writer_open(&w, p, 0, &err) == HM_OK);
    hm_gguf_writer_abort(w);
    CHECK(!exists(p) && !exists(tmp));

    /* finish with missing bytes fails, removes the tmp file, reports through err */
    CHECK(hm_gguf_writer_open(&w, p, 0, &err) == HM_OK);
    hm_gguf_writer_add_tensor(w, "t", HM_TYPE_F32, 2, ne);
    hm_gguf_writer_begin_data(w);
    hm_gguf_writer_write(w, "abcd", 4);
    CHECK(hm_gguf_writer_finish(w) == HM_ERR_ARG);
    CHECKF(strstr(err.msg, "tensor 0 't': 4 of 512 bytes written"), "%s", err.msg);
    CHECK(!exists(p) && !exists(tmp));

    /* too many bytes: sticky error, finish fails */
    static uint8_t big[600];
    CHECK(hm_gguf_writer_open(&w, p, 0, &err) == HM_OK);
    hm_gguf_writer_add_tensor(w, "t", HM_TYPE_F32, 2, ne);
    hm_gguf_writer_begin_data(w);
    CHECK(hm_gguf_writer_write(w, big, sizeof big) == HM_ERR_ARG);
    CHECK(strstr(hm_gguf_writer_error(w), "past the end") != NULL);
    CHECK(hm_gguf_writer_write(w, big, 1) == HM_ERR_ARG);
    CHECK(hm_gguf_writer_finish(w) == HM_ERR_ARG);
    CHECK(!exists(p) && !exists(tmp));

    /* an existing PATH survives an aborted rewrite */
    spit(p, "old", 3);
    CHECK(hm_gguf_writer_open(&w, p, 0, &err) == HM_OK);
    hm_gguf_writer_abort(w);
    size_t n;
    uint8_t *b = slurp(p, &n);
    CHECK(b && n == 3 && memcmp(b, "old", 3) == 0);
    free(b);
    unlink(p);

    /* argument validation */
    struct {
        int what;
        const char *want;
    } cases[] = {
        {0, "duplicate key 'k'"}, {1, "duplicate tensor name 't'"}, {2, "n_dims 5"}, {3, "unknown type id 4"},
        {4, "block size"}, {5, "does not fit type u8"}, {6, "set after"}, {7, "negative"},
        {8, "general.alignment"}, {9, "fixed-size element types"}, {10, "before hm_gguf_writer_begin_data"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        CHECK(hm_gguf_writer_open(&w, p, 0, &err) == HM_OK);
        hm_status st = HM_OK;
        const int64_t ne5[5] = {1, 1, 1, 1, 1}, neg[2] = {4, -1}, odd[1] = {33};
        hm_gguf_value v = {.type = HM_GGUF_U8, .u = 300};
        switch (cases[c].what) {
        case 0: hm_gguf_writer_set_u32(w, "k", 1); st = hm_gguf_writer_set_str(w, "k", "x"); break;
        case 1: hm_gguf_writer_add_tensor(w, "t", HM_TYPE_F32, 1, ne); st = hm_gguf_writer_add_tensor(w, "t", HM_TYPE_F32, 1, ne); break;
        case 2: st = hm_gguf_writer_add_tensor(w, "t", HM_TYPE_F32, 5, ne5); break;
        case 3: st = hm_gguf_writer_add_tensor(w, "t", 4, 1, ne); break;
        case 4: st = hm_gguf_writer_add_tensor(w, "t", HM_TYPE_Q8_0, 1, odd); break;
        case 5: st = hm_gguf_writer_set_value(w, "k", &v); break;
        case 6: hm_gguf_writer_begin_data(w); st = hm_gguf_writer_set_u32(w, "k", 1); break;
        case 7: st = hm_gguf_writer_add_tensor(w, "t", HM_TYPE_F32, 2, neg); break;
        case 8: st = hm_gguf_writer_set_u32(w, "general.alignment", 64); break;
        case 9: st = hm_gguf_writer_set_arr(w, "k", HM_GGUF_STRING, NULL, 0); break;
        case 10: st = hm_gguf_writer_write(w, "x", 1); break;
        }
        CHECKF(st == HM_ERR_ARG && strstr(hm_gguf_writer_error(w), cases[c].want) && strstr(err.msg, cases[c].want),
               "case %d: %s '%s'", cases[c].what, hm_status_name(st), hm_gguf_writer_error(w));
        CHECK(hm_gguf_writer_finish(w) == HM_ERR_ARG);
        CHECK(!exists(p) && !exists(tmp));
    }
    CHECK(hm_gguf_writer_open(&w, p, 48, &err) == HM_ERR_ARG && strstr(err.msg, "power of two"));
    CHECK(hm_gguf_writer_open(&w, tpath("no/such/dir/x.gguf"), 0, &err) == HM_ERR_IO);
}

/* ---- fuzz corpus and regressions ---- */

static int run_dir(const char *rel, bool must_open) {
    DIR *d = opendir(test_src_path(rel));
    if (!d) return -1;
    int count = 0;
    struct dirent *e;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", test_src_path(rel));
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[8192];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        size_t n;
        uint8_t *b = slurp(p, &n);
        if (!b) continue;
        hm_err err = {{0}};
        hm_status st = open_copy(b, n, &err);
        if (must_open)
            CHECKF(st == HM_OK, "%s: %s", p, err.msg);
        else
            CHECKF(st == HM_OK || st == HM_ERR_FORMAT, "%s: %s", p, err.msg);
        free(b);
        count++;
    }
    closedir(d);
    return count;
}

static void test_fuzz_inputs(void) {
    int n = run_dir("fuzz/corpus/gguf", true);
    CHECKF(n >= 5, "seed corpus: %d files", n);
    run_dir("fuzz/regress/gguf", false);
}

/* ---- seed corpus ---- */

static int write_corpus(const char *dir) {
    hm_err err = {{0}};
    snprintf(tmpdir, sizeof tmpdir, "%s", dir);
    if (write_rt(tpath("roundtrip.gguf"), 0, &err) || write_rt(tpath("roundtrip-align64.gguf"), 64, &err) ||
        write_small(tpath("small.gguf"), &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    bb x;
    build_hand(&x, 3);
    spit(tpath("hand-v3.gguf"), x.b, x.n);
    test_v2(); /* writes v2.gguf */
    /* tokenizer-like: tokens, scores, token types, merges */
    hm_gguf_writer *w;
    if (hm_gguf_writer_open(&w, tpath("tokenizer.gguf"), 0, &err)) return 1;
    enum { NT = 300 };
    static char buf[NT][16];
    const char *toks[NT], *merges[NT - 1];
    static char mbuf[NT][40];
    float scores[NT];
    int32_t types[NT];
    for (int i = 0; i < NT; i++) {
        snprintf(buf[i], sizeof buf[i], i < 256 ? "<0x%02X>" : "tok%d", i);
        toks[i] = buf[i];
        scores[i] = -(float)i;
        types[i] = i < 256 ? 6 : 1;
        if (i + 1 < NT) {
            snprintf(mbuf[i], sizeof mbuf[i], "%.15s %s", buf[i], i < 256 ? "t" : "x");
            merges[i] = mbuf[i];
        }
    }
    hm_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    hm_gguf_writer_set_str(w, "tokenizer.ggml.pre", "qwen2");
    hm_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NT);
    hm_gguf_writer_set_arr(w, "tokenizer.ggml.scores", HM_GGUF_F32, scores, NT);
    hm_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", HM_GGUF_I32, types, NT);
    hm_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, NT - 1);
    hm_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    hm_gguf_writer_set_str(w, "tokenizer.chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}");
    if (hm_gguf_writer_finish(w)) return 1;
    printf("wrote the seed corpus into %s\n", dir);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--write-corpus") == 0) return write_corpus(argv[2]);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/hm_test_gguf_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_roundtrip();
    test_hand();
    test_v2();
    test_truncation();
    test_corrupt();
    test_writer();
    test_fuzz_inputs();
    const char *names[] = {"rt.gguf", "rt64.gguf", "meta.gguf", "v2.gguf", "small.gguf"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) unlink(tpath(names[i]));
    rmdir(tmpdir);
    return test_done();
}
