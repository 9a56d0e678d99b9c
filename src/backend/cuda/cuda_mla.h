/* cuda_mla.h - CUDA ops of multi-head latent attention (MLA: DeepSeek-V2/V3, model/deepseek2.c) that
 * cuda_ops.h lacks, each the device twin of a CPU piece (backend/cpu/cpu_mla.h, the ordinary
 * attention over a one-head cache whose V rows are its K rows): the input step and its write of
 * the compressed row into an f16 cache, the attention over that cache, and a strided row copy
 * (the per-head matmuls gather and scatter with it around hm_cuda_matmul).
 *
 * Vocabulary as in cuda_ops.h: every pointer is a DEVICE pointer, activations row-major f32; every
 * op enqueues on the context's compute stream and allocates nothing. Each output element is
 * written by one thread (or one warp reducing in a fixed tree): bit-identical run to run. */
#ifndef HM_BACKEND_CUDA_MLA_H
#define HM_BACKEND_CUDA_MLA_H

#include <stdint.h>

#include "cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* hm_cpu_mla_in's contract (q [n, n_head (nope + n_rot)], qa [n, n_head (kv_lora + n_rot)], kv
 * [n, kv_lora + n_rot]; ff NULL or [n_rot / 2]; kv_norm [kv_lora]; pos [n]), then kv's rows into the
 * f16 cache rows pos[t] of k_cache ([n_ctx, kv_lora + n_rot]). */
hm_status hm_cuda_mla_in(hm_cuda_ctx *c, const float *q, float *qa, float *kv, int64_t n, int n_head, int nope,
                         int kv_lora, int n_rot, const int32_t *pos, float theta, const float *ff,
                         const float *kv_norm, float eps, uint16_t *k_cache, int64_t n_ctx, hm_err *err);

/* Causal attention of q [n, n_head * hd] over the one-head f16 cache [n_ctx, hd] whose V rows are
 * its K rows: out [n, n_head * hd] (the latent sum in each head's first kv_lora values), query t
 * attending to rows 0..pos[t], f32 scores and online softmax; hd <= 1024; one warp per (row, head). */
hm_status hm_cuda_mla_attention(hm_cuda_ctx *c, const float *q, int64_t n, const int32_t *pos, const uint16_t *k_cache,
                                int64_t n_ctx, int n_head, int hd, float scale, float *out, hm_err *err);

/* dst[r * dst_stride + i] = src[r * src_stride + i] for r < rows, i < width (floats). */
hm_status hm_cuda_copy_strided(hm_cuda_ctx *c, float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                               int64_t rows, int64_t width, hm_err *err);

#ifdef __cplusplus
}
#endif
#endif
