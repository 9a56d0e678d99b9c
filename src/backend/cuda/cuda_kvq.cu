/* cuda_kvq.cu - the quantised KV caches' write on the device (-ctk q8_0, and q4_0 / bf16 beside
 * it: the same reference arithmetic as the CPU's from_float_ref, so the same bytes): each K and V row
 * of head_dim values stored as ggml's q8_0 blocks (32 values: an f16 scale d = amax / 127, then 32 int8 codes
 * round(x / d)), as llama.cpp's cache stores them and as the CPU's cache does (cpu_attn_ring.c through
 * the quant traits). The arithmetic is the reference quantiser's, operation for operation (amax, d =
 * amax / 127, id = 1 / d in IEEE f32, roundf(x * id) half away from zero, d rounded to f16 last), so
 * the device and the host write the same bytes for the same floats. The readers are cuda_attn.cu
 * (decode) and cuda_flash.cu (prefill, dequantised into the f16 tiles). Position p lives in row
 * p % cap (cap = n_ctx for a plain cache). */
#include <cuda_fp16.h>

#include "cuda_impl.h"

/* One thread per (token, kv head, block of 32) of K, then of V: the block's 32 values from k or v
 * (f32), quantised into the row's block. */
__global__ void k_kv_write_q8_0(unsigned char *kc, unsigned char *vc, int64_t cap, int n_kv_head, int head_dim,
                                const float *k, const float *v, int64_t n_blk, const int32_t *pos) {
    const int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= 2 * n_blk) return;
    const bool is_v = id >= n_blk;
    const int64_t b = is_v ? id - n_blk : id;
    const int nb = head_dim / 32;
    const int jb = (int)(b % nb);
    const int64_t th = b / nb;
    const int h = (int)(th % n_kv_head);
    const int64_t t = th / n_kv_head;
    const float *x = (is_v ? v : k) + th * head_dim + jb * 32;
    const int64_t row = (int64_t)h * cap + pos[t] % cap;
    unsigned char *dst = (is_v ? vc : kc) + row * (int64_t)(nb * 34) + jb * 34;
    float amax = 0.0f;
#pragma unroll 8
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127.0f;
    const float idv = d != 0.0f ? __frcp_rn(d) : 0.0f;
    *(__half *)dst = __float2half_rn(d);
    signed char *qs = (signed char *)(dst + 2);
#pragma unroll 8
    for (int j = 0; j < 32; j++) qs[j] = (signed char)roundf(__fmul_rn(x[j], idv));
}

hm_status hm_cuda_kv_write_q8_0(hm_cuda_ctx *c, void *k_cache, void *v_cache, int64_t cap, int n_kv_head,
                                int head_dim, const float *k, const float *v, int64_t n_tok, const int32_t *pos,
                                hm_err *err) {
    HM_CU_ARG(k_cache && v_cache && k && v && pos && n_kv_head > 0 && cap > 0);
    HM_CU_ARG(head_dim > 0 && head_dim % 32 == 0 && n_tok >= 0);
    const int64_t n_blk = n_tok * n_kv_head * (head_dim / 32);
    if (n_blk <= 0) return HM_OK;
    k_kv_write_q8_0<<<hm_cu_blocks(2 * n_blk, 128), 128, 0, c->compute>>>(
        (unsigned char *)k_cache, (unsigned char *)v_cache, cap, n_kv_head, head_dim, k, v, n_blk, pos);
    HM_CU_LAUNCH("kv_write_q8_0");
    return HM_OK;
}

/* q4_0, ggml's reference: max = the value of largest magnitude (the first on ties), d = max / -8,
 * id = 1 / d, code = min(15, trunc(x id + 8.5)) (the product rounded on its own, no fused add);
 * element j < 16 the low nibble of byte j, j >= 16 the high nibble of byte j - 16. bf16: round to
 * nearest even (the CPU's hm_f32_to_bf16 formula), a thread per 32 values too. */
__global__ void k_kv_write_q4_bf16(unsigned char *kc, unsigned char *vc, int64_t cap, int n_kv_head, int head_dim,
                                   const float *k, const float *v, int64_t n_blk, const int32_t *pos, bool bf16) {
    const int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= 2 * n_blk) return;
    const bool is_v = id >= n_blk;
    const int64_t b = is_v ? id - n_blk : id;
    const int nb = head_dim / 32;
    const int jb = (int)(b % nb);
    const int64_t th = b / nb;
    const int h = (int)(th % n_kv_head);
    const int64_t t = th / n_kv_head;
    const float *x = (is_v ? v : k) + th * head_dim + jb * 32;
    const int64_t row = (int64_t)h * cap + pos[t] % cap;
    if (bf16) {
        uint16_t *dst = (uint16_t *)((is_v ? vc : kc) + row * (int64_t)head_dim * 2) + jb * 32;
        for (int j = 0; j < 32; j++) {
            uint32_t u = __float_as_uint(x[j]);
            if ((u & 0x7fffffffu) > 0x7f800000u) {
                dst[j] = (uint16_t)((u >> 16) | 0x40u);
            } else {
                u += 0x7fffu + ((u >> 16) & 1u);
                dst[j] = (uint16_t)(u >> 16);
            }
        }
        return;
    }
    unsigned char *dst = (is_v ? vc : kc) + row * (int64_t)(nb * 18) + jb * 18;
    float amax = 0.0f, mx = 0.0f;
    for (int j = 0; j < 32; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            mx = x[j];
        }
    const float d = mx / -8.0f;
    const float idv = d != 0.0f ? __frcp_rn(d) : 0.0f;
    *(__half *)dst = __float2half_rn(d);
    for (int j = 0; j < 16; j++) {
        int q0 = (signed char)__fadd_rn(__fmul_rn(x[j], idv), 8.5f);
        int q1 = (signed char)__fadd_rn(__fmul_rn(x[j + 16], idv), 8.5f);
        q0 = q0 < 15 ? q0 : 15;
        q1 = q1 < 15 ? q1 : 15;
        dst[2 + j] = (unsigned char)(q0 | (q1 << 4));
    }
}

hm_status hm_cuda_kv_write_kv(hm_cuda_ctx *c, hm_cuda_kv kv, void *k_cache, void *v_cache, int64_t cap,
                              int n_kv_head, int head_dim, const float *k, const float *v, int64_t n_tok,
                              const int32_t *pos, hm_err *err) {
    HM_CU_ARG(kv == HM_CUDA_KV_Q8_0 || kv == HM_CUDA_KV_Q4_0 || kv == HM_CUDA_KV_BF16);
    if (kv == HM_CUDA_KV_Q8_0)
        return hm_cuda_kv_write_q8_0(c, k_cache, v_cache, cap, n_kv_head, head_dim, k, v, n_tok, pos, err);
    HM_CU_ARG(k_cache && v_cache && k && v && pos && n_kv_head > 0 && cap > 0);
    HM_CU_ARG(head_dim > 0 && head_dim % 32 == 0 && n_tok >= 0);
    const int64_t n_blk = n_tok * n_kv_head * (head_dim / 32);
    if (n_blk <= 0) return HM_OK;
    k_kv_write_q4_bf16<<<hm_cu_blocks(2 * n_blk, 128), 128, 0, c->compute>>>(
        (unsigned char *)k_cache, (unsigned char *)v_cache, cap, n_kv_head, head_dim, k, v, n_blk, pos,
        kv == HM_CUDA_KV_BF16);
    HM_CU_LAUNCH("kv_write q4_0 / bf16");
    return HM_OK;
}
