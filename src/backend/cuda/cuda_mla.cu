/* cuda_mla.cu - the MLA ops of cuda_mla.h. The expressions follow the CPU's (cpu_mla.c: the RoPE
 * angle in double, interleaved pairs; the compressed row's norm), so results differ from the CPU's
 * by f32 rounding and summation order only. */
#include <cuda_fp16.h>

#include "cuda_impl.h"
#include "cuda_mla.h"

#define MLA_THREADS 128

__device__ static inline void mla_rope(const float *src, float *dst, int n_rot, double ps, float theta, const float *ff,
                                       int i) {
    double a = ps * pow((double)theta, -2.0 * i / n_rot);
    if (ff) a /= (double)ff[i];
    const float cs = (float)cos(a), sn = (float)sin(a);
    const float x0 = src[2 * i], x1 = src[2 * i + 1];
    dst[2 * i] = x0 * cs - x1 * sn;
    dst[2 * i + 1] = x0 * sn + x1 * cs;
}

/* One block per token: the q heads' rope parts, the norm of c, k_pe, the cache row. */
__global__ void k_mla_in(const float *q, float *qa, float *kv, int n_head, int nope, int kv_lora, int n_rot,
                         const int32_t *pos, float theta, const float *ff, const float *kv_norm, float eps,
                         __half *kc) {
    const int64_t t = blockIdx.x;
    const int half = n_rot / 2, qw = nope + n_rot, aw = kv_lora + n_rot;
    const double ps = (double)pos[t];
    for (int j = threadIdx.x; j < n_head * half; j += blockDim.x) {
        const int h = j / half, i = j % half;
        mla_rope(q + (t * n_head + h) * qw + nope, qa + (t * n_head + h) * aw + kv_lora, n_rot, ps, theta, ff, i);
    }
    float *r = kv + t * aw;
    __shared__ float part[MLA_THREADS];
    float ss = 0.0f;
    for (int i = threadIdx.x; i < kv_lora; i += blockDim.x) ss += r[i] * r[i];
    part[threadIdx.x] = ss;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    const float inv = rsqrtf(part[0] / kv_lora + eps);
    for (int i = threadIdx.x; i < kv_lora; i += blockDim.x) r[i] = r[i] * inv * kv_norm[i];
    for (int i = threadIdx.x; i < half; i += blockDim.x) mla_rope(r + kv_lora, r + kv_lora, n_rot, ps, theta, ff, i);
    __syncthreads();
    __half *row = kc + (int64_t)pos[t] * aw;
    for (int i = threadIdx.x; i < aw; i += blockDim.x) row[i] = __float2half(r[i]);
}

hm_status hm_cuda_mla_in(hm_cuda_ctx *c, const float *q, float *qa, float *kv, int64_t n, int n_head, int nope,
                         int kv_lora, int n_rot, const int32_t *pos, float theta, const float *ff,
                         const float *kv_norm, float eps, uint16_t *k_cache, int64_t n_ctx, hm_err *err) {
    HM_CU_ARG(q && qa && kv && pos && kv_norm && k_cache && n >= 0 && n_head > 0 && nope >= 0 && kv_lora > 0);
    HM_CU_ARG(n_rot > 0 && n_rot % 2 == 0 && n_ctx > 0);
    if (!n) return HM_OK;
    k_mla_in<<<(unsigned)n, MLA_THREADS, 0, c->compute>>>(q, qa, kv, n_head, nope, kv_lora, n_rot, pos, theta, ff,
                                                           kv_norm, eps, (__half *)k_cache);
    HM_CU_LAUNCH("mla_in");
    return HM_OK;
}

#define MLA_PER_LANE 32 /* hd <= 1024 */

__device__ static inline float mla_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__global__ void k_mla_attention(const float *q, int64_t n, const int32_t *pos, const __half *kc, int n_head, int hd,
                                float scale, float *out) {
    const int64_t id = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); /* row * n_head + head */
    const int lane = threadIdx.x & 31;
    if (id >= n * n_head) return;
    const int64_t t = id / n_head;
    const float *qr = q + id * hd;
    float qv[MLA_PER_LANE], acc[MLA_PER_LANE];
#pragma unroll
    for (int u = 0; u < MLA_PER_LANE; u++) {
        const int d = lane + 32 * u;
        qv[u] = d < hd ? qr[d] : 0.0f;
        acc[u] = 0.0f;
    }
    float mx = -INFINITY, sum = 0.0f;
    for (int64_t p = 0; p <= pos[t]; p++) {
        const __half *kr = kc + p * hd;
        float kv[MLA_PER_LANE], sc = 0.0f;
#pragma unroll
        for (int u = 0; u < MLA_PER_LANE; u++) {
            const int d = lane + 32 * u;
            kv[u] = d < hd ? __half2float(kr[d]) : 0.0f;
            sc += qv[u] * kv[u];
        }
        sc = mla_warp_sum(sc) * scale;
        const float nm = fmaxf(mx, sc), cf = expf(mx - nm), e = expf(sc - nm);
        sum = sum * cf + e;
#pragma unroll
        for (int u = 0; u < MLA_PER_LANE; u++) acc[u] = acc[u] * cf + e * kv[u];
        mx = nm;
    }
    float *o = out + id * hd;
#pragma unroll
    for (int u = 0; u < MLA_PER_LANE; u++) {
        const int d = lane + 32 * u;
        if (d < hd) o[d] = acc[u] / sum;
    }
}

hm_status hm_cuda_mla_attention(hm_cuda_ctx *c, const float *q, int64_t n, const int32_t *pos, const uint16_t *k_cache,
                                int64_t n_ctx, int n_head, int hd, float scale, float *out, hm_err *err) {
    HM_CU_ARG(q && pos && k_cache && out && n >= 0 && n_ctx > 0 && n_head > 0);
    HM_CU_ARG(hd > 0 && hd <= 32 * MLA_PER_LANE);
    const int64_t rows = n * n_head;
    if (!rows) return HM_OK;
    k_mla_attention<<<(unsigned)((rows + 3) / 4), 128, 0, c->compute>>>(q, n, pos, (const __half *)k_cache, n_head,
                                                                         hd, scale, out);
    HM_CU_LAUNCH("mla_attention");
    return HM_OK;
}

__global__ void k_copy_strided(float *dst, int64_t ds, const float *src, int64_t ss, int64_t rows, int64_t width) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * width) return;
    const int64_t r = i / width, j = i % width;
    dst[r * ds + j] = src[r * ss + j];
}

hm_status hm_cuda_copy_strided(hm_cuda_ctx *c, float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                               int64_t rows, int64_t width, hm_err *err) {
    HM_CU_ARG(dst && src && rows >= 0 && width >= 0 && dst_stride >= width && src_stride >= width);
    const int64_t n = rows * width;
    if (!n) return HM_OK;
    k_copy_strided<<<(unsigned)((n + 255) / 256), 256, 0, c->compute>>>(dst, dst_stride, src, src_stride, rows, width);
    HM_CU_LAUNCH("copy_strided");
    return HM_OK;
}
