/* cuda_dsv4.h - CUDA ops of DeepSeek-V4 (model/deepseek4.c) that cuda_ops.h lacks, each the device
 * twin of a piece of backend/cpu/cpu_dsv4.c: the hyper-connections (expand, the Sinkhorn mix,
 * the reduction by pre, the post mix), the clamped SwiGLU of the shared expert, and the attention's
 * own steps (RoPE of a head's tail, the window ring's write, the compressors' ring write and block
 * compression, the indexer's top-k, the attention over window + compressed rows with sinks).
 *
 * The layer state is cpu_dsv4.h's (hm_dsv4_state) with the window's ring and the compressed rows
 * stored as f16 (hm_cuda_dsv4_state): the CPU keeps those values f16-rounded in f32, so the numbers
 * are the same at half the bytes; the compressors' rings are f32 as there.
 *
 * Vocabulary as in cuda_ops.h: every pointer is a DEVICE pointer, activations row-major f32; every
 * op enqueues on the context's compute stream and allocates nothing. Each output element is
 * written by one thread (or one block reducing in a fixed tree): bit-identical run to run. RoPE
 * takes tscale = powf(base, -2 / n_rot) computed on the host (as the CPU does) and forms each
 * pair's angle by the CPU's sequence of float products. */
#ifndef HM_BACKEND_CUDA_DSV4_H
#define HM_BACKEND_CUDA_DSV4_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/cpu/cpu_dsv4.h"
#include "cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One layer's state in device memory (hm_cuda_dsv4_layout): raw [cap][hd] f16, ckv / csc
 * [HM_DSV4_RING][coff hd] f32, comp [n_ctx / r + 1][hd] f16, ikv / isc [HM_DSV4_RING][2 idx_hd] f32,
 * icomp [n_ctx / 4 + 1][idx_hd] f16 (absent parts NULL: ratio 0 has raw only, 128 no indexer). */
typedef struct hm_cuda_dsv4_state {
    uint16_t *raw, *comp, *icomp;
    float *ckv, *csc, *ikv, *isc;
    int64_t cap;
} hm_cuda_dsv4_state;
/* Bytes of a layer's device state for ratio r (hm_dsv4_layout's sizes, f16 where above; each part
 * 256-byte aligned); with base non-NULL also the pointers into it. */
size_t hm_cuda_dsv4_layout(const hm_dsv4_dims *d, int32_t ratio, int32_t n_ctx, int32_t n_ubatch, void *base,
                           hm_cuda_dsv4_state *st);

/* dst [n, hc E] = hc copies of each src row [n, E] (dst must not overlap src). */
hm_status hm_cuda_dsv4_hc_expand(hm_cuda_ctx *c, const float *src, float *dst, int64_t n, int64_t E, int hc,
                                 hm_err *err);
/* hm_dsv4_hc_mix on the device: m [n, (2 + hc) hc] (head: [n, hc]) in place; scale [3] ([1]) and
 * base device vectors; hc <= 16. One thread per row, the CPU's order of operations. */
hm_status hm_cuda_dsv4_hc_mix(hm_cuda_ctx *c, float *m, int64_t n, int hc, bool head, const float *scale,
                              const float *base, int iters, float eps, hm_err *err);
/* y[t] = sum_h pre[t][h] x[t][h] (pre: row stride ps), the CPU's order (h ascending). */
hm_status hm_cuda_dsv4_hc_reduce(hm_cuda_ctx *c, const float *x, const float *pre, int64_t ps, int64_t n, int64_t E,
                                 int hc, float *y, hm_err *err);
/* out[t][dst] = post[dst] f[t] + sum_src comb[dst + hc src] x[t][src] (mix rows [pre | post | comb]);
 * out must not be x. */
hm_status hm_cuda_dsv4_hc_post(hm_cuda_ctx *c, const float *f, const float *x, const float *mix, int64_t n,
                               int64_t E, int hc, float *out, hm_err *err);
/* out = silu(min(g, L)) * clamp(u, -L, L) over n (L > 0; out may be g). */
hm_status hm_cuda_swiglu_clamp(hm_cuda_ctx *c, const float *g, const float *u, float *out, int64_t n, float limit,
                               hm_err *err);
/* RoPE (pairs 2i, 2i + 1) of the last n_rot values of each head of hd in x [n, n_head hd] at pos[t]:
 * pair i's angle p tscale^i (float products, i.e. the CPU's) divided by ff[i] (NULL: none); inv:
 * the inverse rotation. */
hm_status hm_cuda_dsv4_rope_tail(hm_cuda_ctx *c, float *x, int64_t n, int n_head, int hd, int n_rot,
                                 const int32_t *pos, float tscale, const float *ff, bool inv, hm_err *err);
/* raw[(pos[t] % cap) hd + e] = kv[t hd + e] as f16 (round to nearest even). */
hm_status hm_cuda_dsv4_raw_write(hm_cuda_ctx *c, const float *kv, int64_t n, int hd, const int32_t *pos,
                                 uint16_t *raw, int64_t cap, hm_err *err);
/* A compressor's ring write for rows [t0, t1) (t1 - t0 <= HM_DSV4_BLOCK): row p % HM_DSV4_RING of
 * kv gets a[t], of sc gets b[t] + ape[p % r] (rows of w values). */
hm_status hm_cuda_dsv4_comp_write(hm_cuda_ctx *c, const float *a, const float *b, const float *ape, int64_t t0,
                                  int64_t t1, int64_t w, int32_t r, const int32_t *pos, float *kv, float *sc,
                                  hm_err *err);
/* For rows t in [t0, t1) whose position ends a block ((p + 1) % r == 0): block p / r compressed
 * from the ring (cpu_dsv4.c's compress_block: a softmax over the block's (overlap: and the previous
 * block's) scores weighting the values, rmsnorm * norm, RoPE at the block's first position,
 * as f16) into out + (p / r) dim. dim <= 1024. */
hm_status hm_cuda_dsv4_compress(hm_cuda_ctx *c, const float *kv, const float *sc, int64_t w, int32_t r, bool overlap,
                                int64_t dim, const float *norm, int n_rot, float tscale, const float *ff, float eps,
                                const int32_t *pos, int64_t t0, int64_t t1, uint16_t *out, hm_err *err);
/* The indexer's choice for rows [t0, t1): the visible compressed rows ((pos + 1) / 4) or, when more
 * than topk, the topk best by sum_h relu(iq_h . icomp_b) iw_h (ties: the lower row), in the CPU's
 * order (best first). iq [n, ih ihd], iw [n, ih], icomp [.., ihd] f16; scores: work [t1 - t0,
 * n_cmp_max], unused when n_cmp_max <= HM_CUDA_DSV4_IDX_SMEM (the scores in shared memory then);
 * sel [n, topk], n_sel [n]. */
#define HM_CUDA_DSV4_IDX_SMEM 11264
hm_status hm_cuda_dsv4_index(hm_cuda_ctx *c, const float *iq, const float *iw, const uint16_t *icomp,
                             const int32_t *pos, int64_t t0, int64_t t1, int ih, int ihd, int topk,
                             float *scores, int64_t n_cmp_max, int32_t *sel, int32_t *n_sel, hm_err *err);
/* The attention of cpu_dsv4.c's attn_item for every (row, head): q [n, n_head hd] in, the output
 * (de-roped) out in place. Keys: raw rows max(0, p - window + 1) .. p (row j % cap), then ratio 128:
 * comp rows 0 .. (p + 1) / 128 - 1, ratio 4: comp rows sel[t][0 .. n_sel[t]); sinks [n_head].
 * max_keys bounds window + the compressed rows (shared memory); hd <= 1024. */
typedef struct hm_cuda_dsv4_attn {
    const uint16_t *raw, *comp; /* f16 rows */
    const float *sinks, *ff;
    const int32_t *sel, *n_sel;
    int64_t cap;
    int32_t ratio, window, topk, n_head, hd, n_rot;
    float tscale;
    int64_t max_keys;
} hm_cuda_dsv4_attn;
hm_status hm_cuda_dsv4_attention(hm_cuda_ctx *c, const hm_cuda_dsv4_attn *a, float *q, int64_t n, const int32_t *pos,
                                 hm_err *err);

#ifdef __cplusplus
}
#endif
#endif
