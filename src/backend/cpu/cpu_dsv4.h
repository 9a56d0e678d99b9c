/* cpu_dsv4.h - the CPU kernels of DeepSeek-V4's own ops (exec.h's hm_op_hc_* and hm_op_dsv4_attn; the attention kernel is hm_dsv4_attention):
 * hyper-connection mixing with Sinkhorn normalisation, and the attention of one layer with its
 * shared K=V head, query LoRA, sliding window, compressed KV (ratio 4 with the overlapping
 * compressor and the lightning indexer's top-k, ratio 128 without) and grouped low-rank output.
 *
 * The layer's state (one sequence) is a block of floats laid out by hm_dsv4_layout:
 *   raw   [cap][hd]        the window's K=V rows, position p in row p % cap (values f16-rounded,
 *                          as an f16 cache holds them)
 *   ckv, csc [S][coff hd]  the compressor's projections and scores (+ position bias) of the last
 *                          S positions (p in row p % S), f32
 *   comp  [n_ctx / r + 1][hd]  compressed rows: block b (positions b r .. b r + r - 1) once its
 *                          last position is seen (f16-rounded)
 *   ikv, isc, icomp        the indexer's compressor alike (ratio 4 only; head idx_hd)
 * S = HM_DSV4_RING covers the previous block of the largest ratio, so a session can go back to
 * any position of the current 128-block (hm_dsv4_can_trim). */
#ifndef HM_CPU_DSV4_H
#define HM_CPU_DSV4_H

#include <stdbool.h>
#include <stdint.h>

#include "cpu_ops.h"

#define HM_DSV4_RING 256  /* 2 x the largest compression ratio */
#define HM_DSV4_BLOCK 128 /* the largest compression ratio */

/* The attention shape every layer shares. */
typedef struct hm_dsv4_dims {
    int32_t n_head, hd, n_rot, q_lora, o_groups, o_lora, window;
    int32_t idx_heads, idx_hd, idx_topk;
    float eps, c_theta;
    const float *c_ff; /* [n_rot / 2] the compressed layers' RoPE frequency divisors (YaRN, as
                          hm_model_rope_scaling gives them; its magnitude factor V4 cancels), or
                          NULL: plain RoPE. The uncompressed layers never scale. */
} hm_dsv4_dims;

/* One layer's weights (borrowed). Absent ones NULL (the compressor when ratio is 0, the indexer
 * unless ratio is 4). */
typedef struct hm_dsv4_lw {
    int32_t ratio; /* 0, 4 or 128 */
    float theta;   /* the layer's RoPE base (with ratio > 0 also dims.c_ff's frequencies) */
    const hm_mat *wq_b, *wo_a, *c_kv, *c_gate, *i_qb, *i_proj, *i_kv, *i_gate;
    const float *q_a_norm, *kv_norm, *sinks, *c_ape, *c_norm, *i_ape, *i_norm;
} hm_dsv4_lw;

/* The state block of one layer, carved from floats at base. */
typedef struct hm_dsv4_state {
    float *raw, *ckv, *csc, *comp, *ikv, *isc, *icomp;
    int64_t cap; /* raw rows */
} hm_dsv4_state;

/* Floats of layer state for ratio r, n_ctx positions, micro-batches of up to n_ubatch; with base
 * non-NULL also the pointers into it. */
size_t hm_dsv4_layout(const hm_dsv4_dims *d, int32_t ratio, int32_t n_ctx, int32_t n_ubatch, float *base,
                      hm_dsv4_state *st);
/* Whether a session that has evaluated positions < n_hi can continue at n_keep (0 < n_keep < n_hi):
 * the rows its compressors still need are in the ring. */
static inline bool hm_dsv4_can_trim(int64_t n_keep, int64_t n_hi) {
    return (n_keep / HM_DSV4_BLOCK) * HM_DSV4_BLOCK + HM_DSV4_BLOCK >= n_hi;
}

/* Scratch bytes of hm_dsv4_attention for up to n_tok rows over n_ctx positions on n_threads. */
size_t hm_dsv4_scratch_bytes(const hm_dsv4_dims *d, int64_t n_tok, int32_t n_ctx, int n_threads);

/* One layer's attention for n rows at positions pos (ascending, one sequence):
 *   h [n, E]: the normed input; qr [n, q_lora]: h Wq_a, normed in place; kv [n, hd]: h Wkv, normed
 *   and roped in place; q [n, n_head hd]: work; out [n, o_groups o_lora]: the grouped low-rank
 *   output (before Wo_b); ca, cb [n, 2 hd], ia, ib [n, 2 idx_hd], iq [n, idx_heads (idx_hd + 1)]:
 *   work. The state advances by these positions. */
void hm_dsv4_attention(hm_pool *pool, const hm_dsv4_dims *d, const hm_dsv4_lw *w, hm_dsv4_state *st, int64_t E,
                  const float *h, float *qr, float *kv, float *q, float *out, float *ca, float *cb, float *ia,
                  float *ib, float *iq, int64_t n, const int32_t *pos, hm_scratch *scratch);

/* Hyper-connections over rows of hc streams of E (x: [n, hc E]).
 * expand: x rows packed at E wide become hc copies each (in place).
 * mix: raw mixes [n, (2 + hc) hc] (or [n, hc] with head) -> in place [pre | post | comb]:
 *   pre = sigmoid(m scale[0] + base) + eps, post = 2 sigmoid(m scale[1] + base), comb =
 *   Sinkhorn(m scale[2] + base) (softmax over dst, + eps, then column / row normalisations with
 *   eps, iters in all); comb[dst + hc src].
 * reduce: y[t] = sum_h pre[t][h] x[t][h] (pre: row stride ps).
 * post: out[t][dst] = post[dst] f[t] + sum_src comb[dst + hc src] x[t][src]. */
void hm_dsv4_hc_expand(float *x, int64_t n, int64_t E, int hc);
void hm_dsv4_hc_mix(float *m, int64_t n, int hc, bool head, const float *scale, const float *base, int iters,
                    float eps);
void hm_dsv4_hc_reduce(hm_pool *pool, const float *x, const float *pre, int64_t ps, int64_t n, int64_t E, int hc,
                       float *y);
void hm_dsv4_hc_post(hm_pool *pool, const float *f, const float *x, const float *mix, int64_t n, int64_t E, int hc,
                     float *out);
/* out = silu(min(g, L)) * clamp(u, -L, L) over n (L <= 0: plain SwiGLU); u is clamped in place. */
void hm_dsv4_swiglu_clamp(hm_pool *pool, const float *g, float *u, float *out, int64_t n, float limit);

#endif
