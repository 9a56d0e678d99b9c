/* gguf.h - read (mmap) and write GGUF v2/v3 files.
 *
 * Reader invariants: every count, length, offset and shape in the file is bounds-checked
 * against the file size before use; no allocation is sized from an unchecked value; a malformed
 * file yields HM_ERR_FORMAT with a message naming the field and its byte offset. All pointers
 * returned (strings, arrays, tensor data) are borrowed from the mapping and stay valid until
 * hm_gguf_close. Strings in the file are not NUL-terminated: they come back as hm_gguf_str.
 * Supported: v3 and v2 (same layout); v1 (32-bit counts) and big-endian files are rejected.
 * Keys and tensor names must be unique and free of NUL bytes; arrays nest at most
 * HM_GGUF_MAX_ARRAY_DEPTH deep; tensors have n_dims <= 4, a known type id (hm_type_get has its
 * block size), offsets that are multiples of the alignment, and data inside the file (ranges of
 * different tensors are not checked for overlap). Tensor data pointers are aligned to the file's
 * alignment when the image is (mmap: always). A file shrunk by someone else while mapped can
 * still raise SIGBUS on access: that is outside what a reader can check.
 *
 * Writer: streaming (tensor data is written as the caller produces it, in declaration order,
 * never held whole in RAM) and atomic (writes PATH.tmp, fsyncs, renames onto PATH on finish). */
#ifndef HM_GGUF_H
#define HM_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/status.h"

#define HM_GGUF_MAX_DIMS 4
#define HM_GGUF_DEFAULT_ALIGNMENT 32
/* Arrays may nest (array of arrays ...) at most this deep; deeper files are rejected, and the
 * writer refuses to produce them. Bounds the reader's recursion. */
#define HM_GGUF_MAX_ARRAY_DEPTH 8

typedef enum hm_gguf_vtype {
    HM_GGUF_U8 = 0,
    HM_GGUF_I8 = 1,
    HM_GGUF_U16 = 2,
    HM_GGUF_I16 = 3,
    HM_GGUF_U32 = 4,
    HM_GGUF_I32 = 5,
    HM_GGUF_F32 = 6,
    HM_GGUF_BOOL = 7,
    HM_GGUF_STRING = 8,
    HM_GGUF_ARRAY = 9,
    HM_GGUF_U64 = 10,
    HM_GGUF_I64 = 11,
    HM_GGUF_F64 = 12,
    HM_GGUF_VTYPE_COUNT = 13,
} hm_gguf_vtype;

typedef struct hm_gguf_str {
    const char *ptr; /* borrowed, not NUL-terminated */
    uint64_t len;
} hm_gguf_str;

typedef struct hm_gguf hm_gguf;

typedef struct hm_gguf_tensor {
    const char *name;  /* NUL-terminated, owned by the hm_gguf */
    uint32_t n_dims;
    int64_t ne[HM_GGUF_MAX_DIMS]; /* elements per dim, ne[0] contiguous; unused dims are 1 */
    int type;          /* ggml type id (hm_type); may be one we cannot compute */
    uint64_t offset;   /* relative to the data section, as stored */
    uint64_t file_offset; /* absolute byte offset in the file */
    size_t nbytes;     /* checked: file_offset + nbytes <= file size */
    const void *data;  /* borrowed pointer into the mapping */
    int32_t file;      /* which file of a split model holds the data (0: the first; file_offset is
                        * in that file, hm_gguf_file_path names it) */
} hm_gguf_tensor;

/* An array value: n elements of type elem_type (for nested arrays elem_type is HM_GGUF_ARRAY). */
typedef struct hm_gguf_arr {
    hm_gguf_vtype elem_type;
    uint64_t n;
    const void *data; /* borrowed; for fixed-size types a packed little-endian array */
    uint64_t file_offset; /* where the first element starts */
    const hm_gguf *owner;
    int64_t kv_index; /* the kv this array belongs to (nested arrays: the top-level kv) */
    int64_t node;     /* internal: the reader's index of this array, for string/nested access */
} hm_gguf_arr;

/* Name of a value type ("u32", "string", "array"), "unknown" out of range. */
const char *hm_gguf_vtype_name(int t);
/* Bytes of one element of a fixed-size type; 0 for string, array and unknown types. */
size_t hm_gguf_vtype_size(int t);

/* ---- reader ---- */

/* Map and parse PATH. *out owned by the caller, free with hm_gguf_close.
 * A split model (llama.cpp's llama-gguf-split layout: PREFIX-00001-of-0000N.gguf ..., keys
 * split.no / split.count / split.tensors.count, the metadata in the first file) opens from its
 * first file's name: the other files are mapped and checked too (gguf_split.c), and the tensor
 * table is every file's tensors, each with its file. A missing split is HM_ERR_IO naming it; a
 * split of another model (split.no / split.count / split.tensors.count disagreeing) is
 * HM_ERR_FORMAT naming the file and key. */
hm_status hm_gguf_open(hm_gguf **out, const char *path, hm_err *err);
/* Parse an in-memory image (borrowed, must outlive the handle); used by the fuzzer and tests. */
hm_status hm_gguf_open_mem(hm_gguf **out, const void *data, size_t size, hm_err *err);
void hm_gguf_close(hm_gguf *g); /* NULL is a no-op */

uint32_t hm_gguf_version(const hm_gguf *g);
uint64_t hm_gguf_file_size(const hm_gguf *g); /* bytes of all the model's files */
/* Files of the model: 1, or split.count of a split model; file i's path and size (NULL / 0 out of
 * range). File 0 is the one opened, which holds the metadata. */
int32_t hm_gguf_n_files(const hm_gguf *g);
const char *hm_gguf_file_path(const hm_gguf *g, int32_t i);
uint64_t hm_gguf_split_file_size(const hm_gguf *g, int32_t i);
uint64_t hm_gguf_alignment(const hm_gguf *g);
/* Absolute offset of the data section; may lie past the end of a file without tensors. */
uint64_t hm_gguf_data_offset(const hm_gguf *g);
const char *hm_gguf_path(const hm_gguf *g);     /* "" for in-memory images */

/* Key/value pairs, in file order. */
int64_t hm_gguf_n_kv(const hm_gguf *g);
int64_t hm_gguf_find_key(const hm_gguf *g, const char *key); /* index or -1 */
const char *hm_gguf_key(const hm_gguf *g, int64_t i);        /* NUL-terminated, owned by g */
hm_gguf_vtype hm_gguf_kv_type(const hm_gguf *g, int64_t i);

/* Typed getters by key. Return false when the key is absent or has an incompatible type.
 * get_int accepts every integer type (and bool); get_float accepts f32/f64 and integers. */
bool hm_gguf_get_int(const hm_gguf *g, const char *key, int64_t *out);
bool hm_gguf_get_float(const hm_gguf *g, const char *key, double *out);
bool hm_gguf_get_bool(const hm_gguf *g, const char *key, bool *out);
bool hm_gguf_get_str(const hm_gguf *g, const char *key, hm_gguf_str *out);
bool hm_gguf_get_arr(const hm_gguf *g, const char *key, hm_gguf_arr *out);
/* By index, same rules. */
bool hm_gguf_kv_int(const hm_gguf *g, int64_t i, int64_t *out);
bool hm_gguf_kv_float(const hm_gguf *g, int64_t i, double *out);
bool hm_gguf_kv_str(const hm_gguf *g, int64_t i, hm_gguf_str *out);
bool hm_gguf_kv_arr(const hm_gguf *g, int64_t i, hm_gguf_arr *out);
bool hm_gguf_kv_bool(const hm_gguf *g, int64_t i, bool *out);

/* Array element access; index checked, false when out of range or of the wrong type.
 * String elements are O(1) (the reader indexes string arrays at open). */
bool hm_gguf_arr_str(const hm_gguf_arr *a, uint64_t i, hm_gguf_str *out);
bool hm_gguf_arr_int(const hm_gguf_arr *a, uint64_t i, int64_t *out);
bool hm_gguf_arr_float(const hm_gguf_arr *a, uint64_t i, double *out);
bool hm_gguf_arr_arr(const hm_gguf_arr *a, uint64_t i, hm_gguf_arr *out); /* nested arrays */

/* Tensors, in file order. */
int64_t hm_gguf_n_tensors(const hm_gguf *g);
/* Point tensor i's data at data (borrowed: another mapping holding the same bytes, which must
 * outlive g), before anything binds it: two files' identical tensors then occupy memory once. */
void hm_gguf_tensor_alias(hm_gguf *g, int64_t i, const void *data);
const hm_gguf_tensor *hm_gguf_tensor_at(const hm_gguf *g, int64_t i);
const hm_gguf_tensor *hm_gguf_find_tensor(const hm_gguf *g, const char *name); /* NULL if absent */

/* ---- writer ---- */

typedef struct hm_gguf_writer hm_gguf_writer;

/* A metadata value for hm_gguf_writer_set_value: any type, arrays nested to any depth up to
 * HM_GGUF_MAX_ARRAY_DEPTH. Everything it points to is borrowed for the duration of the call. */
typedef struct hm_gguf_value {
    hm_gguf_vtype type;
    union {
        uint64_t u;      /* U8 U16 U32 U64, BOOL (0/1): must fit the type */
        int64_t i;       /* I8 I16 I32 I64: must fit the type */
        double f;        /* F32 F64 */
        hm_gguf_str str; /* STRING (ptr may be NULL when len is 0) */
        struct {
            hm_gguf_vtype elem_type;
            uint64_t n;
            /* fixed-size elem_type: n packed little-endian elements; STRING: hm_gguf_str[n];
             * ARRAY: hm_gguf_value[n], each of type ARRAY */
            const void *data;
        } arr;
    };
} hm_gguf_value;

/* Start writing PATH (via PATH.tmp). PATH must be new, a regular file or a symlink to one (its
 * target is written); a FIFO, a device or a directory is HM_ERR_ARG (core/file.h's rules).
 * alignment 0 = default 32; else a power of two (a
 * non-default alignment is recorded as general.alignment automatically).
 * err (may be NULL) is kept by the writer: every later failure of w is also reported there,
 * including hm_gguf_writer_finish's (after which w is gone), so err must outlive w.
 * The first failure is sticky: later calls return it and finish removes PATH.tmp. */
hm_status hm_gguf_writer_open(hm_gguf_writer **out, const char *path, uint32_t alignment,
                              hm_err *err);
/* Any value type, nested arrays included. Duplicate keys are HM_ERR_ARG. */
hm_status hm_gguf_writer_set_value(hm_gguf_writer *w, const char *key, const hm_gguf_value *v);
/* Metadata; call before hm_gguf_writer_begin_data. Keys are copied. */
hm_status hm_gguf_writer_set_u32(hm_gguf_writer *w, const char *key, uint32_t v);
hm_status hm_gguf_writer_set_i32(hm_gguf_writer *w, const char *key, int32_t v);
hm_status hm_gguf_writer_set_u64(hm_gguf_writer *w, const char *key, uint64_t v);
hm_status hm_gguf_writer_set_f32(hm_gguf_writer *w, const char *key, float v);
hm_status hm_gguf_writer_set_bool(hm_gguf_writer *w, const char *key, bool v);
hm_status hm_gguf_writer_set_str(hm_gguf_writer *w, const char *key, const char *v);
/* Array of fixed-size elements (any scalar vtype); data copied. */
hm_status hm_gguf_writer_set_arr(hm_gguf_writer *w, const char *key, hm_gguf_vtype elem_type,
                                 const void *data, uint64_t n);
hm_status hm_gguf_writer_set_arr_str(hm_gguf_writer *w, const char *key, const char *const *strs,
                                     uint64_t n);
/* Declare a tensor (shape, type); data comes later in the same order. */
hm_status hm_gguf_writer_add_tensor(hm_gguf_writer *w, const char *name, int type, uint32_t n_dims,
                                    const int64_t *ne);
/* Write the model as several files, as llama.cpp's llama-gguf-split does: PATH must end in
 * .gguf; the files are PATH-without-.gguf + -00001-of-0000N.gguf ..., each a complete GGUF with
 * split.no (u16), split.count (u16) and split.tensors.count (i32), the first with all the
 * metadata. A new file starts before a tensor when the tensor bytes of the current one (each
 * padded to the alignment) would pass max_bytes (a soft limit: a file holds at least one tensor),
 * or, with max_bytes 0, every max_tensors tensors. Both 0: one file, PATH. Before begin_data.
 * All the files appear (renamed) at finish, or none. */
hm_status hm_gguf_writer_set_split(hm_gguf_writer *w, uint64_t max_bytes, int32_t max_tensors);
/* Write header, metadata and tensor table; after this only tensor data may be written. */
hm_status hm_gguf_writer_begin_data(hm_gguf_writer *w);
/* Append bytes of the current tensor; may be called many times per tensor. Padding between
 * tensors is inserted automatically once a tensor's bytes are complete. */
hm_status hm_gguf_writer_write(hm_gguf_writer *w, const void *data, size_t n);
/* Check all data was written, fsync, rename PATH.tmp -> PATH, free w. Calls begin_data when it
 * was not called (metadata-only files). Frees w on failure too (PATH.tmp removed, PATH untouched;
 * the message goes to the err given to hm_gguf_writer_open). */
hm_status hm_gguf_writer_finish(hm_gguf_writer *w);
/* Abandon: remove PATH.tmp, free w. NULL is a no-op. */
void hm_gguf_writer_abort(hm_gguf_writer *w);
/* Message of the last failure of w. */
const char *hm_gguf_writer_error(const hm_gguf_writer *w);

#endif
