/* quant.h - ggml-compatible tensor element types: the one type-traits table.
 *
 * Vocabulary: a row of ne0 elements of type t occupies hm_row_size(t, ne0) bytes and is made of
 * ne0 / blck_size blocks of type_size bytes (ne0 must be a multiple of blck_size).
 *
 * Every type has a scalar reference for each operation; SIMD variants (AVX2, AVX-512), compiled
 * when the build targets them, must agree with the reference (bit-exact for conversions,
 * within float rounding for dot products). The `vec_dot` entry is the fastest variant compiled in;
 * `vec_dot_isa[]` exposes each variant for tests and benchmarks (NULL where not compiled). */
#ifndef HM_QUANT_H
#define HM_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ggml type ids (values are the on-disk GGUF ids). */
typedef enum hm_type {
    HM_TYPE_F32 = 0,
    HM_TYPE_F16 = 1,
    HM_TYPE_Q4_0 = 2,
    HM_TYPE_Q4_1 = 3,
    HM_TYPE_Q5_0 = 6,
    HM_TYPE_Q5_1 = 7,
    HM_TYPE_Q8_0 = 8,
    HM_TYPE_Q8_1 = 9,
    HM_TYPE_Q2_K = 10,
    HM_TYPE_Q3_K = 11,
    HM_TYPE_Q4_K = 12,
    HM_TYPE_Q5_K = 13,
    HM_TYPE_Q6_K = 14,
    HM_TYPE_Q8_K = 15,
    HM_TYPE_IQ2_XXS = 16,
    HM_TYPE_IQ2_XS = 17,
    HM_TYPE_IQ3_XXS = 18,
    HM_TYPE_IQ1_S = 19,
    HM_TYPE_IQ4_NL = 20,
    HM_TYPE_IQ3_S = 21,
    HM_TYPE_IQ2_S = 22,
    HM_TYPE_IQ4_XS = 23,
    HM_TYPE_IQ1_M = 29,
    HM_TYPE_BF16 = 30,
    HM_TYPE_MXFP4 = 39,
    HM_TYPE_COUNT = 40,
} hm_type;

typedef enum hm_isa { HM_ISA_SCALAR = 0, HM_ISA_AVX2, HM_ISA_AVX512, HM_ISA_COUNT } hm_isa;

/* Dequantise n elements (multiple of blck_size) from src to dst. */
typedef void (*hm_to_float_fn)(const void *src, float *dst, int64_t n);
/* Quantise n elements (multiple of blck_size) from src into dst. */
typedef void (*hm_from_float_fn)(const float *src, void *dst, int64_t n);
/* *out = sum_i x[i]*y[i] over n elements; x is a row of this type, y a row of vec_dot_type. */
typedef void (*hm_vec_dot_fn)(int64_t n, float *out, const void *x, const void *y);

typedef struct hm_type_traits {
    const char *name;          /* "q4_K", as ggml names it; NULL for ids we do not know */
    int64_t blck_size;         /* elements per block */
    size_t type_size;          /* bytes per block */
    bool supported;            /* true when it can be computed with: to_float_ref and a scalar vec_dot
                                * (from_float_ref may be NULL: i-quants ggml only quantises with
                                * an importance matrix, see hm_quant_iq_quantize) */
    hm_to_float_fn to_float;   /* dequantisation (fastest variant) */
    hm_to_float_fn to_float_ref;
    hm_from_float_fn from_float;     /* quantisation used at run time (activations) */
    hm_from_float_fn from_float_ref; /* reference quantisation (writing model files) */
    hm_type vec_dot_type;            /* the activation partner type y is quantised to */
    hm_vec_dot_fn vec_dot;           /* fastest compiled variant */
    hm_vec_dot_fn vec_dot_isa[HM_ISA_COUNT];
    /* Each compiled conversion variant, for tests and benchmarks; NULL where a family has no
     * variant for that ISA ([HM_ISA_SCALAR] is the reference when set). */
    hm_to_float_fn to_float_isa[HM_ISA_COUNT];
    hm_from_float_fn from_float_isa[HM_ISA_COUNT];
} hm_type_traits;

/* Traits of type t; a zeroed entry (name NULL) for ids that are not known, NULL if t is out of
 * [0, HM_TYPE_COUNT). Never fails for valid ids. */
const hm_type_traits *hm_type_get(int t);

/* "q4_K" etc., or "unknown". */
const char *hm_type_name(int t);

/* Parse a type name case-insensitively ("q4_k", "Q8_0", "f16"); -1 if unknown. */
int hm_type_from_name(const char *name);

/* Bytes of a row of ne0 elements; 0 if ne0 is not a multiple of the block size, t is unknown,
 * or the size overflows size_t. */
size_t hm_row_size(int t, int64_t ne0);

/* Quantise nrow rows of n_per_row elements (a multiple of 256) of a grid i-quant t (IQ2_XXS,
 * IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) with importance qw[n_per_row]: the same bytes as
 * ggml's quantize_<type>(src, dst, nrow, n_per_row, qw). qw NULL: ggml's own weighting for the
 * types it quantises without an importance matrix, uniform importance for IQ2_XXS, IQ2_XS and
 * IQ1_S (ggml refuses those without one). False if t is not one of these. */
bool hm_quant_iq_quantize(int t, const float *src, void *dst, int64_t nrow, int64_t n_per_row, const float *qw);

/* Quantise nrow rows of n_per_row elements of type t as ggml_quantize_chunk(t, ...) does with
 * importance qw[n_per_row] (llama.cpp's imatrix entry for the matrix): the same bytes. qw NULL:
 * the reference quantiser (the i-quants: as hm_quant_iq_quantize). F32/F16/BF16/Q8_0/MXFP4 ignore
 * qw, as ggml does. False for a type without such a quantiser (hm_quant_weighted_supported) or
 * rows that are not whole blocks (quant_weighted.c). */
bool hm_quant_quantize(int t, const float *src, void *dst, int64_t nrow, int64_t n_per_row, const float *qw);
/* Whether hm_quant_quantize takes an importance vector for type t. */
bool hm_quant_weighted_supported(int t);

/* Which variants this build compiled and this CPU can run. */
bool hm_isa_available(hm_isa isa);

#endif
