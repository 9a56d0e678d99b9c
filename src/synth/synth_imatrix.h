/* synth_imatrix.h - llama.cpp's importance-matrix files (`synth --imatrix FILE`), read the way
 * llama-quantize reads them, so that the importance each matrix is quantised with is the same.
 *
 * Two forms (detected by the GGUF magic):
 *  - GGUF, as llama-imatrix writes today: per matrix NAME a tensor NAME.in_sum2 (F32, ne0 * n_mat
 *    sums of squared activations, n_mat = 1 or the expert count) and NAME.counts (F32, n_mat
 *    activation counts); keys imatrix.datasets, imatrix.chunk_count, imatrix.chunk_size (all three
 *    required, as llama-quantize requires them). Importance = in_sum2 / count per matrix, 1 where
 *    its count is 0.
 *  - legacy .dat: i32 n_entries; per entry i32 name length, the name, i32 ncall, i32 nval, nval
 *    f32; then optionally i32 chunk count, i32 dataset length, the dataset. Importance =
 *    value / ncall (the values as they are when ncall <= 0).
 * Every value must be finite (llama-quantize refuses the file otherwise). */
#ifndef HM_SYNTH_IMATRIX_H
#define HM_SYNTH_IMATRIX_H

#include <stdbool.h>
#include <stdint.h>

#include "../core/status.h"

typedef struct hm_imatrix hm_imatrix;

/* Read path (either form). *out owned by the caller (hm_imatrix_close). A file that is neither,
 * or a truncated / inconsistent one, is HM_ERR_FORMAT naming the file and the entry. */
hm_status hm_imatrix_open(hm_imatrix **out, const char *path, hm_err *err);
void hm_imatrix_close(hm_imatrix *m); /* NULL-safe */

/* The importance of the matrix named name (a tensor name, "blk.0.ffn_up_exps.weight"): *n values,
 * n_per_row for each of n / n_per_row matrices (the experts of a 3-D tensor, in order); NULL when
 * the file has no entry for it. Borrowed from m. */
const float *hm_imatrix_find(const hm_imatrix *m, const char *name, int64_t *n);

int64_t hm_imatrix_n_entries(const hm_imatrix *m);
const char *hm_imatrix_name(const hm_imatrix *m, int64_t i); /* entry i's name, in file order */
int32_t hm_imatrix_chunk_count(const hm_imatrix *m);
bool hm_imatrix_is_legacy(const hm_imatrix *m);

#endif
