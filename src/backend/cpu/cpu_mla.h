/* cpu_mla.h - the CPU pieces of multi-head latent attention (MLA: DeepSeek-V2/V3, model/deepseek2.c)
 * beside the ordinary attention kernels: the input step (RoPE of the decoupled rope parts, the
 * compressed KV's norm) and the per-head matmuls of the absorbed form (q through attn_k_b, the
 * latent output through attn_v_b). The attention itself is the ordinary one (hm_model_attention)
 * over a one-head cache whose V rows are its K rows: scores q_abs . c + q_pe . k_pe, output the
 * latent sum of c (its first kv_lora values).
 * Shapes: ne[0] contiguous; rows are tokens. */
#ifndef HM_CPU_MLA_H
#define HM_CPU_MLA_H

#include <stddef.h>
#include <stdint.h>

#include "cpu_ops.h"

/* For each row t and head h: qa[t][h][kv_lora + j] = rope(q[t][h][nope + j]) (j < n_rot; q rows
 * n_head * (nope + n_rot), qa rows n_head * (kv_lora + n_rot)); kv[t][0..kv_lora) = rmsnorm(.) *
 * kv_norm, kv[t][kv_lora..) = rope(.) in place. RoPE pairs (2i, 2i+1) (ggml's NORM type), angle
 * pos[t] * theta^(-2i/n_rot) / ff[i] (ff NULL: ones). */
void hm_cpu_mla_in(hm_pool *pool, const float *q, float *qa, float *kv, int64_t n, int n_head, int nope, int kv_lora,
                   int n_rot, const int32_t *pos, float theta, const float *ff, const float *kv_norm, float eps);

/* out[t][h * out_stride + j] = sum_i W_h[j][i] in[t][h * in_stride + i], W_h = w with data + h * nb2
 * ([w->ne1 x w->ne0]); tin [n, w->ne0] and tout [n, w->ne1] are work space (the rows gathered and
 * scattered around hm_cpu_matmul). */
void hm_cpu_matmul_heads(hm_pool *pool, const hm_mat *w, size_t nb2, int n_head, const float *in, int64_t in_stride,
                         int64_t n, float *out, int64_t out_stride, float *tin, float *tout, hm_scratch *scratch);

/* The compressed rows kv [n, hd] into rows pos[t] of a one-head cache of `type` (F32, F16, BF16,
 * Q8_0, Q4_0: hd a multiple of its block), quantised as the KV writes do (the type's from_float). */
void hm_cpu_mla_kv_write(hm_pool *pool, int type, char *cache, int hd, const float *kv, int64_t n, const int32_t *pos);

/* Causal attention of q [n, n_head * hd] over the one-head cache of `type` whose V rows are its K
 * rows: out [n, n_head * hd] (the latent sum in each head's first kv_lora values), row t attending
 * to cache rows 0..pos[t] with scores q . k * scale; f32 scores, online softmax over blocks of
 * HM_CPU_MLA_BLOCK rows, each block's rows converted once for every head of the item. Items are
 * (row, group of heads) over the pool; any hd and head count. scratch: hm_cpu_mla_scratch_floats. */
#define HM_CPU_MLA_BLOCK 32
size_t hm_cpu_mla_scratch_floats(int n_head, int hd, int n_threads);
void hm_cpu_mla_attention(hm_pool *pool, int type, const float *q, int64_t n, const int32_t *pos, const char *cache,
                          int n_head, int hd, float scale, float *out, float *scratch);

#endif
