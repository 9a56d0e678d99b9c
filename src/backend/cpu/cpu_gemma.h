/* cpu_gemma.h - CPU ops that Gemma-style models need beyond cpu_ops.h: GELU (tanh form), logit
 * soft-capping, NEOX RoPE with per-pair frequency factors (Gemma 4's "proportional" RoPE), a KV
 * cache that may be a ring buffer (sliding-window layers) with attention over it, and the routed
 * experts with a GELU gate.
 *
 * Same conventions as cpu_ops.h: row-major f32 activations, every op takes the engine's pool
 * (NULL = calling thread) and splits its work ith/nth; each output element is computed by one
 * thread in a fixed order, so results do not depend on the thread count; nothing allocates.
 *
 * Ring-buffer KV (one layer): k_cache, v_cache: [n_kv_head][cap][head_dim] of f16 or f32;
 * position p lives in row p % cap. A full cache is the case cap >= every position (row = p). A
 * sliding layer of window W evaluated in micro-batches of up to U tokens needs cap >= W + U - 1:
 * then writing a batch never overwrites a row that one of its own queries still reads. */
#ifndef HM_BACKEND_CPU_GEMMA_H
#define HM_BACKEND_CPU_GEMMA_H

#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/cpu_ops.h"

/* out = gelu_tanh(g) * u, gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 * (PyTorch's gelu approximate="tanh"). out may alias g or u. */
void hm_gemma_gelu_mul(hm_pool *pool, const float *g, const float *u, float *out, int64_t n);

/* x = cap * tanh(x / cap), in place (cap > 0). */
void hm_gemma_softcap(hm_pool *pool, float *x, int64_t n, float cap);

/* RoPE, NEOX pairing (i with i + n_rot/2, i < n_rot/2), in place on x: [n_tok, n_head * head_dim];
 * angle = pos[t] * theta_base^(-2i/n_rot) / ff[i] (ff: [n_rot/2] or NULL = ones; a huge ff leaves
 * the pair unrotated). Elements n_rot..head_dim-1 are left as is. ggml_rope_ext's semantics. */
void hm_gemma_rope_neox(hm_pool *pool, float *x, int64_t n_tok, int n_head, int head_dim, int n_rot,
                        const int32_t *pos, float theta_base, const float *ff);

/* Write n_tok K/V rows (f32 in, f16 or f32 in the cache: elem_size 2 or 4) at rows pos[t] % cap.
 *   k, v: [n_tok, n_kv_head * head_dim]. */
void hm_gemma_kv_write(hm_pool *pool, void *k_cache, void *v_cache, size_t elem_size, int64_t cap,
                       int n_kv_head, int head_dim, const float *k, const float *v, int64_t n_tok,
                       const int32_t *pos);

/* Scratch floats for hm_gemma_attention over a cache of cap rows on n_threads (and, for the tiled
 * prefill path it sends f16 batches to, at least hm_cpu_attn_tiled_scratch_floats of the layer's
 * shape: the caller takes the larger). */
size_t hm_gemma_attention_scratch_floats(int64_t cap, int n_threads);

/* Causal GQA attention: query t (position pos[t], its K/V written) attends to positions
 * max(0, pos[t] - window + 1) .. pos[t] (window 0 = all), read from rows p % cap; q head h uses kv
 * head h / (n_head / n_kv_head). softmax(scale * q.k) in f32 with max subtraction.
 *   q, out: [n_tok, n_head * head_dim] (out must not alias q); scratch: see above. */
void hm_gemma_attention(hm_pool *pool, const float *q, int64_t n_tok, const int32_t *pos,
                        const void *k_cache, const void *v_cache, size_t elem_size, int64_t cap,
                        int32_t window, int n_head, int n_kv_head, int head_dim, float scale,
                        float *out, float *scratch);

/* Scratch bytes for hm_gemma_moe (up to n_batch tokens). */
size_t hm_gemma_moe_scratch_size(int64_t n_batch, int64_t n_embd, int64_t n_ff, int n_threads);

/* As hm_cpu_moe with a GELU-tanh gate: out[t] += sum over jobs j, pairs i with tok = t:
 * w_i * down_j(gelu_tanh(gate_j(x_t)) * up_j(x_t)). x, out: [n_batch, n_embd]; jobs in order, each
 * job's tokens gathered, computed with the matmul op, then added in pair order (deterministic). */
void hm_gemma_moe(hm_pool *pool, const hm_moe_job *jobs, int n_jobs, const float *x, int64_t n_batch,
                  int64_t n_embd, int64_t n_ff, float *out, hm_scratch *scratch);

#endif
