/* cuda_gptoss.h - the CUDA op gpt-oss needs beyond cuda_ops.h and cuda_gemma.h: attention with
 * sinks over a ring cache (cuda_gemma.h's attention with one more logit per q head in the softmax's
 * denominator, the contract of backend/cpu hm_cpu_attention_ring_sinks; cuda_gemma.cu and
 * cuda_flash.cu implement it). A projection's bias is cuda_ops.h's hm_cuda_add_bias.
 *
 * Conventions as cuda_ops.h: device pointers, the context's compute stream, no allocation. */
#ifndef HM_BACKEND_CUDA_GPTOSS_H
#define HM_BACKEND_CUDA_GPTOSS_H

#include "backend/cuda/cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* hm_cuda_gemma_attention_kv with sinks[n_head] (device; NULL: none, exactly the plain kernel):
 * out = sum_s e^(x_s - M) v_s / (sum_s e^(x_s - M) + e^(sinks[h] - M)), x_s the scaled scores. */
hm_status hm_cuda_gemma_attention_kv_sinks(hm_cuda_ctx *c, hm_cuda_kv kv, const float *q, int64_t n_tok,
                                           const int32_t *pos, int64_t kv_len, const void *k_cache,
                                           const void *v_cache, int64_t cap, int32_t window, int n_head,
                                           int n_kv_head, int head_dim, float scale, const float *sinks, float *out,
                                           void *scratch, size_t scratch_size, hm_err *err);

#ifdef __cplusplus
}
#endif

#endif
