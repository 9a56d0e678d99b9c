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

#include <stdbool.h>
#include <stdint.h>

#include "core/threadpool.h"
#include "cpu_ops.h"

/* The largest d_v hm_cpu_gated_delta_seq accepts (its per-thread work row lives on the stack). */
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

/* Tokens per chunk of the chunked form, and the batch length from which hm_cpu_gated_delta takes
 * it (below: token by token; measured by bench_deltanet, docs/QWEN35MOE.md). */
#define HM_DELTA_CHUNK 64
#define HM_DELTA_CHUNK_MIN 4

/* The gated delta rule over n_tok tokens, per value head h (key head h % n_k_head: qwen35moe's GGUF
 * tiled V-head order; grouped: h / (n_v_head / n_k_head), Qwen3-Next's, where a key head's value
 * heads are adjacent), as this recurrence over the tokens t:
 *   S = exp(g[t,h]) * S;  delta = beta[t,h] * (v_t - S^T k_t);  S += k_t delta^T;  o_t = S^T q_t
 * q, k: rows of n_k_head * d_k (stride qk_stride), already normalised / scaled; v: rows of
 * n_v_head * d_v (stride v_stride); g (log decay, <= 0), beta: [n_tok, n_v_head];
 * state: [n_v_head, d_k, d_v], carried in and out; out: [n_tok, n_v_head * d_v]. Heads are split
 * over the threads.
 * Takes the chunked form (hm_cpu_gated_delta_chunked) when hm_cpu_gated_delta_chunks(n_tok) and
 * scratch is given (hm_cpu_gated_delta_scratch_size bytes for the pool's thread count; borrowed),
 * else the token-by-token one (hm_cpu_gated_delta_seq). The two agree to f32 rounding (~1e-6
 * relative), not bit for bit, so a result depends at that level on how a prompt is cut into
 * micro-batches. */
void hm_cpu_gated_delta(hm_pool *pool, const float *q, const float *k, int64_t qk_stride, const float *v,
                        int64_t v_stride, const float *g, const float *beta, int64_t n_tok, int n_k_head,
                        int n_v_head, bool grouped, int d_k, int d_v, float *state, float *out, hm_scratch *scratch);

/* The recurrence above one token after another: the reference, and the decode path. ~6 d_k d_v
 * flops per token and head, S (d_k d_v floats) read twice and written once per token. */
void hm_cpu_gated_delta_seq(hm_pool *pool, const float *q, const float *k, int64_t qk_stride, const float *v,
                            int64_t v_stride, const float *g, const float *beta, int64_t n_tok, int n_k_head,
                            int n_v_head, bool grouped, int d_k, int d_v, float *state, float *out);

/* The same result by chunks of HM_DELTA_CHUNK tokens (the WY / UT form of fla and transformers'
 * torch_chunk_gated_delta_rule): within a chunk, with G_t the cumulative log decay from the chunk's
 * start and S0 the state before it,
 *   (I + A) U = diag(beta) (V - diag(e^G) K S0),  A[t][j] = beta_t e^(G_t - G_j) k_t.k_j  (j < t)
 *   O = diag(e^G) Q S0 + (Q K^T * e^(G_t - G_j), j <= t) U
 *   S = e^(G_last) S0 + (K * e^(G_last - G_t))^T U
 * so S is read by two [C, d_k] x [d_k, d_v] products and written once per chunk; every exponent
 * is <= 0. Any n_tok >= 0 (the last chunk may be short). scratch: as above, required. */
void hm_cpu_gated_delta_chunked(hm_pool *pool, const float *q, const float *k, int64_t qk_stride, const float *v,
                                int64_t v_stride, const float *g, const float *beta, int64_t n_tok, int n_k_head,
                                int n_v_head, bool grouped, int d_k, int d_v, float *state, float *out,
                                hm_scratch *scratch);

/* Whether hm_cpu_gated_delta (given scratch) takes the chunked form for n_tok tokens: from
 * HM_DELTA_CHUNK_MIN tokens on in AVX-512 builds; never in others, whose plain-loop products make
 * the chunked form slower than the recurrence (it is still there, and tested, in every build). */
bool hm_cpu_gated_delta_chunks(int64_t n_tok);

/* Bytes of scratch hm_cpu_gated_delta(_chunked) needs on a pool of n_threads threads. */
size_t hm_cpu_gated_delta_scratch_size(int d_k, int d_v, int n_threads);

#endif
