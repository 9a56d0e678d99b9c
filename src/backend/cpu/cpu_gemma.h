/* cpu_gemma.h - CPU ops that Gemma-style models need beyond cpu_ops.h: GELU (tanh form), logit
 * soft-capping, NEOX RoPE with per-pair frequency factors (Gemma 4's "proportional" RoPE; also
 * RoPE scaling's). Its ring-buffer KV cache and attention are the CPU's general ones (cpu_ops.h,
 * cpu_attn_ring.c), its GELU-gated experts the MoE op's (hm_cpu_moe_act).
 *
 * Same conventions as cpu_ops.h: row-major f32 activations, every op takes the engine's pool
 * (NULL = calling thread) and splits its work ith/nth; each output element is computed by one
 * thread in a fixed order, so results do not depend on the thread count; nothing allocates.
 */
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

#endif
