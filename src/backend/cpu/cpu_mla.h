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

#endif
