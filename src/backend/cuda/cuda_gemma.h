/* cuda_gemma.h - CUDA ops that Gemma-4 needs beyond cuda_ops.h, the device twins of
 * backend/cpu/cpu_gemma.h (same contracts, same math): GELU-tanh gating, logit soft-capping, NEOX
 * RoPE with per-pair frequency factors ("proportional" RoPE), the ring-buffer KV write, attention
 * over a (possibly ring) cache with a sliding window for head dims up to 512, and the routing
 * weights' per-expert scale.
 *
 * Conventions as cuda_ops.h: every pointer is a DEVICE pointer, ops enqueue on the context's
 * compute stream and return at once, nothing allocates (attention takes a scratch sized by its
 * *_scratch_size), every output element has one writer in a fixed order: deterministic, f32.
 *
 * Ring-buffer KV (one layer), f16 as the CPU's: k_cache, v_cache: [n_kv_head][cap][head_dim];
 * position p lives in row p % cap (cap >= every position: a plain cache). See cpu_gemma.h for why
 * a sliding layer of window W evaluated in micro-batches of U rows needs cap >= W + U - 1. */
#ifndef HM_BACKEND_CUDA_GEMMA_H
#define HM_BACKEND_CUDA_GEMMA_H

#include "backend/cuda/cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out = gelu_tanh(g) * u, gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
 * out may alias g or u. */
hm_status hm_cuda_gelu_mul(hm_cuda_ctx *c, const float *g, const float *u, float *out, int64_t n,
                           hm_err *err);

/* x = cap * tanh(x / cap), in place; cap > 0. */
hm_status hm_cuda_softcap(hm_cuda_ctx *c, float *x, int64_t n, float cap, hm_err *err);

/* RoPE NEOX in place (i with i + n_rot/2, i < n_rot/2) on x: [n_tok, n_head * head_dim]:
 * angle = pos[t] * theta_base^(-2i/n_rot) / ff[i] in double, cos/sin rounded to f32 (ff: device
 * [n_rot/2] or NULL = ones; a huge ff leaves the pair unrotated). Elements >= n_rot untouched.
 * hm_gemma_rope_neox's semantics. */
hm_status hm_cuda_rope_neox_ff(hm_cuda_ctx *c, float *x, int64_t n_tok, int n_head, int head_dim,
                               int n_rot, const int32_t *pos, float theta_base, const float *ff,
                               hm_err *err);

/* Write n_tok K/V rows (f32 -> f16, round to nearest even) at rows pos[t] % cap.
 *   k, v: [n_tok, n_kv_head * head_dim];  pos: device [n_tok], >= 0. */
hm_status hm_cuda_kv_write_ring(hm_cuda_ctx *c, uint16_t *k_cache, uint16_t *v_cache, int64_t cap,
                                int n_kv_head, int head_dim, const float *k, const float *v,
                                int64_t n_tok, const int32_t *pos, hm_err *err);

/* Scratch bytes of hm_cuda_gemma_attention's exact kernels for heads of head_dim (any n_tok,
 * n_head); a caller adds the flash kernel's (hm_cuda_flash_scratch_size, and for decode
 * hm_cuda_flash_decode_scratch_size of cuda_ops.h), or the flash kernels split less. */
size_t hm_cuda_gemma_attention_scratch_size(const hm_cuda_ctx *c, int head_dim);

/* Causal GQA attention over a ring cache (hm_gemma_attention's contract): query t (position
 * pos[t], its K/V already written) attends to positions max(0, pos[t] - window + 1) .. pos[t]
 * (window 0 = all), read from rows p % cap; q head h uses kv head h / (n_head / n_kv_head);
 * softmax(scale * q.k) in f32. head_dim a power of two in 32 .. 512.
 *   q, out: [n_tok, n_head * head_dim] (out must not alias q);  pos: device [n_tok].
 * kv_len >= max_t pos[t] + 1 (the host knows it) picks the split of each query's KV range over
 * blocks for short batches (flash-decoding; a second launch merges the ranges in order). */
hm_status hm_cuda_gemma_attention(hm_cuda_ctx *c, const float *q, int64_t n_tok, const int32_t *pos,
                                  int64_t kv_len, const uint16_t *k_cache, const uint16_t *v_cache,
                                  int64_t cap, int32_t window, int n_head, int n_kv_head, int head_dim,
                                  float scale, float *out, void *scratch, size_t scratch_size,
                                  hm_err *err);
/* The same over a ring cache of kv's format (cuda_ops.h's hm_cuda_kv): a q8_0 cache (written by
 * hm_cuda_kv_write_q8_0 at rows p % cap) is read dequantised, exactly in the f32 kernel, rounded to
 * f16 once in the flash prefill. head_dim % 32 == 0 for q8_0. */
hm_status hm_cuda_gemma_attention_kv(hm_cuda_ctx *c, hm_cuda_kv kv, const float *q, int64_t n_tok, const int32_t *pos,
                                     int64_t kv_len, const void *k_cache, const void *v_cache, int64_t cap,
                                     int32_t window, int n_head, int n_kv_head, int head_dim, float scale, float *out,
                                     void *scratch, size_t scratch_size, hm_err *err);

/* Whether hm_cuda_gemma_attention runs these arguments on the flash kernel (prefill batches, and
 * decode batches as cuda_ops.h's hm_cuda_attention_flash says), not the exact f32 kernel. */
bool hm_cuda_gemma_attention_flash(const hm_cuda_ctx *c, int64_t n_tok, int64_t kv_len, int32_t window, int head_dim);
/* The path and KV-range split hm_cuda_gemma_attention takes for a batch of n_tok < HM_CUDA_FLASH_MIN_TOK
 * queries with this scratch (kernel arguments of a captured graph: a graph stays valid while this
 * value does). */
size_t hm_cuda_gemma_attention_key(const hm_cuda_ctx *c, int64_t n_tok, int n_head, int n_kv_head, int head_dim,
                                   int64_t kv_len, int32_t window, size_t scratch_size);

/* w[i] *= table[ids[i]], i < n (Gemma's per-expert scale on the routing weights). */
hm_status hm_cuda_scale_by_id(hm_cuda_ctx *c, float *w, const int32_t *ids, const float *table, int64_t n,
                              hm_err *err);

#ifdef __cplusplus
}
#endif
#endif
