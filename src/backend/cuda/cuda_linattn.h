/* cuda_linattn.h - CUDA ops of the Qwen3.5-MoE (qwen35moe) forward that cuda_ops.h lacks: the
 * Gated DeltaNet token mixer (causal depthwise conv with its rolling state + SiLU, per-head L2
 * norm, the decay / beta gates, the gated delta rule recurrence), the gated attention's q|gate
 * split and sigmoid gate, the shared expert's sigmoid-scaled add, and two plain fallbacks for
 * shapes the main kernels refuse (an f32 matmul of any width, causal attention of any head_dim up
 * to 256). Each mirrors a CPU op (backend/cpu/cpu_deltanet.h, exec/exec_cpu.c) expression
 * for expression; results differ from the CPU's by f32 rounding and summation order only.
 *
 * Vocabulary as in cuda_ops.h: every pointer is a DEVICE pointer, activations row-major f32,
 * [n_tok, n] = n_tok rows of n floats, a row stride (floats) where an op reads a slice of a wider
 * row. Every op enqueues on the context's compute stream and returns; nothing allocates.
 * Determinism: each output element is written by one thread in a fixed order, no atomics: results
 * are bit-identical run to run.
 *
 * State layouts (one DeltaNet layer, one sequence), as the CPU's:
 *   conv state: [K-1][C] the last K-1 input rows (oldest first);
 *   delta state: [n_v][d_k][d_v] S of each value head. */
#ifndef HM_BACKEND_CUDA_LINATTN_H
#define HM_BACKEND_CUDA_LINATTN_H

#include <stdbool.h>
#include <stdint.h>

#include "cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Causal depthwise conv over time + SiLU, continuing from `state` (hm_cpu_ssm_conv's contract):
 *   out[t][c] = silu(sum_{j<K} w[c][j] * in(t - (K-1) + j)[c]),  in(s < 0) = state row K-1+s;
 * state is replaced by the last K-1 input rows. x: [n_tok, C] (row stride x_stride); w: [C, K];
 * out: [n_tok, C] (must not alias x or state). One thread per channel walks the tokens. */
hm_status hm_cuda_ssm_conv(hm_cuda_ctx *c, const float *x, int64_t x_stride, int64_t n_tok, int64_t C,
                           const float *w, int K, float *state, float *out, hm_err *err);

/* In place, for each token t and head h: x[t, h*d .. h*d+d) *= scale / sqrt(sum(x^2) + eps).
 * Rows x_stride floats apart. One warp per (token, head). */
hm_status hm_cuda_l2norm_heads(hm_cuda_ctx *c, float *x, int64_t x_stride, int64_t n_tok, int n_head, int d,
                               float eps, float scale, hm_err *err);

/* The DeltaNet gates, per token t and value head h (i = t * n_v + h):
 *   g[i] = ssm_a[h] * softplus(alpha[i] + dt_bias[h])   (softplus(x) = x above 20, torch's threshold)
 *   beta[i] = sigmoid(b[i]).
 * g, beta: [n_tok, n_v]; ssm_a, dt_bias: [n_v]. grp 0: alpha, b [n_tok, n_v], g may alias alpha,
 * beta b. grp > 0 (Qwen3-Next's fused ssm_ba): b the rows of 2 n_v that hold, per key head, its grp
 * betas then its grp alphas, alpha = b + grp; no aliasing. */
hm_status hm_cuda_delta_gates(hm_cuda_ctx *c, const float *alpha, const float *b, const float *ssm_a,
                              const float *dt_bias, int64_t n_tok, int n_v, int grp, float *g, float *beta,
                              hm_err *err);

/* The gated delta rule over n_tok tokens, token by token (hm_cpu_gated_delta_seq's contract): per
 * value head h (key head h % n_k_head; grouped: h / (n_v_head / n_k_head)),
 *   S = exp(g[t,h]) S;  delta = beta[t,h] (v_t - S^T k_t);  S += k_t delta^T;  o_t = S^T q_t.
 * q, k: rows of n_k_head * d_k (stride qk_stride); v: rows of n_v_head * d_v (stride v_stride);
 * g, beta: [n_tok, n_v_head]; state: [n_v_head, d_k, d_v] in and out; out: [n_tok, n_v_head * d_v].
 * Blocks of (head, 32 value columns); a column of S lives in registers (d_k 16 and 32: one thread;
 * 64 and 128: two threads, half the key rows each), for other d_k <= 1024 one thread reads and
 * writes it in memory; d_v <= 1024. Token by token: right for decode, a first form for prefill. */
hm_status hm_cuda_gated_delta(hm_cuda_ctx *c, const float *q, const float *k, int64_t qk_stride, const float *v,
                              int64_t v_stride, const float *g, const float *beta, int64_t n_tok, int n_k_head,
                              int n_v_head, bool grouped, int d_k, int d_v, float *state, float *out, hm_err *err);

/* The gated attention's projection split: mix [n_tok, n_head * 2 * hd] holds per head [q | gate];
 * q, gate: [n_tok, n_head * hd]. */
hm_status hm_cuda_split_q_gate(hm_cuda_ctx *c, const float *mix, int64_t n_tok, int n_head, int hd, float *q,
                               float *gate, hm_err *err);

/* x[i] *= sigmoid(gate[i]), i < n (the gated attention's output gate). */
hm_status hm_cuda_sigmoid_mul(hm_cuda_ctx *c, float *x, const float *gate, int64_t n, hm_err *err);

/* x[t][i] += sigmoid(s[t]) * y[t][i]  (the shared expert's gate). x, y: [n_tok, n]; s: [n_tok]. */
hm_status hm_cuda_add_sigmoid_scaled(hm_cuda_ctx *c, float *x, const float *y, const float *s, int64_t n_tok,
                                     int64_t n, hm_err *err);

/* y[t][r] = sum_c x[t][c] * w[r][c] for an f32 matrix of ANY width (w: ne1 rows of ne0 floats,
 * row stride nb1 bytes, a multiple of 4): the fallback for matrices hm_cuda_matmul does not take
 * (ne0 not a multiple of 32). Exact f32, one warp per (token, row). x: [n_tok, ne0]. */
hm_status hm_cuda_matmul_f32_any(hm_cuda_ctx *c, const float *w, int64_t ne0, int64_t ne1, size_t nb1,
                                 const float *x, int64_t n_tok, float *y, hm_err *err);

/* hm_cuda_attention's contract for any head_dim <= 256 (the fallback for those it does not take):
 * query t (position pos[t]) attends to f16 cache rows 0..pos[t] of kv head h / (n_head / n_kv_head),
 * f32 scores and online softmax; one warp per (token, head), no scratch. */
hm_status hm_cuda_attention_any(hm_cuda_ctx *c, const float *q, int64_t n_tok, const int32_t *pos,
                                const uint16_t *k_cache, const uint16_t *v_cache, int64_t n_ctx, int n_head,
                                int n_kv_head, int head_dim, float scale, float *out, hm_err *err);

#ifdef __cplusplus
}
#endif
#endif
