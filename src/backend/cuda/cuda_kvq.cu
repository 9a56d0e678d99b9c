/* cuda_kvq.cu - the q8_0 KV cache's write on the device (-ctk q8_0): each K and V row of head_dim
 * values stored as ggml's q8_0 blocks (32 values: an f16 scale d = amax / 127, then 32 int8 codes
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
