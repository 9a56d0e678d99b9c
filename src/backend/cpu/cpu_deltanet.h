/* cpu_deltanet.h - CPU ops of linear-attention layers (Gated DeltaNet, Qwen3-Next / Qwen3.5):
 * the causal depthwise conv with its rolling state, per-head L2 normalisation, and the gated
 * delta rule recurrence.
 *
 * Vocabulary as in cpu_ops.h: activations row-major f32, [n_tok, n] = n_tok rows of n floats;
 * a row stride (floats) is given where an op reads a slice of a wider row.
 *
 * State layouts (one layer, one sequence; the caller owns them, zeroed = empty history):
 *   conv state: [K-1][C]  the last K-1 input rows (oldest first)
 *   delta state: [n_v_head][d_k][d_v]  S of each value head, S[i][j] for key dim i, value dim j
 *
 * Determinism: each output element is computed by one thread in a fixed order; results do not
 * depend on the thread count. */
#ifndef HM_BACKEND_CPU_DELTANET_H
#define HM_BACKEND_CPU_DELTANET_H

#include <stdint.h>

#include "core/threadpool.h"

/* The largest d_v hm_cpu_gated_delta accepts (its per-thread work rows live on the stack). */
#define HM_DELTA_MAX_DV 1024

/* Causal depthwise conv over time + SiLU, continuing from `state`:
 *   out[t][c] = silu(sum_{j<K} w[c][j] * in(t - (K-1) + j)[c]),  in(s < 0) = state row K-1+s.
 * x: [n_tok, C] (row stride x_stride floats); w: [C, K]; state: [K-1, C], replaced by the last
 * K-1 input rows; out: [n_tok, C] (must not alias x or state). */
void hm_cpu_ssm_conv(hm_pool *pool, const float *x, int64_t x_stride, int64_t n_tok, int64_t C,
                     const float *w, int K, float *state, float *out);

/* In place, for each token t and head h: x[t, h*d .. h*d+d) *= scale / sqrt(sum(x^2) + eps)
 * (transformers' l2norm: rsqrt of the sum plus eps). Rows are x_stride floats apart. */
void hm_cpu_l2norm_heads(hm_pool *pool, float *x, int64_t x_stride, int64_t n_tok, int n_head, int d,
                         float eps, float scale);

/* The gated delta rule over n_tok tokens, one token after another, per value head h (key head
 * h % n_k_head: the GGUF's tiled V-head order):
 *   S = exp(g[t,h]) * S;  delta = beta[t,h] * (v_t - S^T k_t);  S += k_t delta^T;  o_t = S^T q_t
 * q, k: rows of n_k_head * d_k (stride qk_stride), already normalised / scaled; v: rows of
 * n_v_head * d_v (stride v_stride); g, beta: [n_tok, n_v_head]; state: [n_v_head, d_k, d_v];
 * out: [n_tok, n_v_head * d_v]. Heads are split over the threads. Cost: ~6 d_k d_v flops per
 * token and head, the state staying in cache; a chunked (matrix) form would do prefill in GEMMs. */
void hm_cpu_gated_delta(hm_pool *pool, const float *q, const float *k, int64_t qk_stride, const float *v,
                        int64_t v_stride, const float *g, const float *beta, int64_t n_tok, int n_k_head,
                        int n_v_head, int d_k, int d_v, float *state, float *out);

#endif
