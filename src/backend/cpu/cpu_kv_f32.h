/* cpu_kv_f32.h - an f32 KV cache and causal GQA attention over it: the exact-precision mode
 * (hm_kv_type HM_KV_F32) used to compare with float references (transformers), where the f16
 * cache's rounding (~1e-3 on logits) would hide real differences. Same layout as the CPU
 * backend's f16 cache: element (kv head h, position p, d) at (h * n_ctx + p) * head_dim + d.
 * Plain loops split over (token, head) items; each output is computed by one thread in a fixed
 * order, so results do not depend on the thread count. Not the fast path: decode/prefill speed
 * is the f16 cache's job. */
#ifndef HM_BACKEND_CPU_KV_F32_H
#define HM_BACKEND_CPU_KV_F32_H

#include <stdint.h>

#include "core/threadpool.h"

/* k, v: [n_tok, n_kv_head * head_dim] written at rows pos[t]. */
void hm_kv_f32_write(hm_pool *pool, float *k_cache, float *v_cache, int64_t n_ctx, int n_kv_head,
                     int head_dim, const float *k, const float *v, int64_t n_tok, const int32_t *pos);

/* Scratch floats hm_kv_f32_attention needs. */
size_t hm_kv_f32_scratch_floats(int64_t n_ctx, int n_threads);

/* out[t, h] = softmax_p<=pos[t](scale * q[t,h] . K[p]) V[p], GQA (h / (n_head / n_kv_head)).
 * q, out: [n_tok, n_head * head_dim]; scratch: hm_kv_f32_scratch_floats floats. */
void hm_kv_f32_attention(hm_pool *pool, const float *q, int64_t n_tok, const int32_t *pos,
                         const float *k_cache, const float *v_cache, int64_t n_ctx, int n_head,
                         int n_kv_head, int head_dim, float scale, float *out, float *scratch);

#endif
