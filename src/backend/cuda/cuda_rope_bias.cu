/* cuda_rope_bias.cu - the llama-family ops of cuda_ops.h that the first archs did not need:
 * RoPE with the normal pairing (dims 2i, 2i + 1; llama, Mixtral) and a projection's bias added
 * to every row (GLM-4.5's q/k/v). One thread per (token, head, pair) / per element; the angles
 * in double as the CPU's hm_cpu_rope_norm computes them. */
#include <math.h>

#include "cuda_impl.h"
#include "cuda_ops.h"

static __global__ void k_rope_norm_ff(float *x, int64_t n, int n_head, int head_dim, int n_rot, const int32_t *pos,
                               double theta, const float *ff) {
    const int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= n) return;
    const int half = n_rot / 2;
    const int i = (int)(id % half);
    const int64_t th = id / half; /* token * n_head + head */
    double a = (double)pos[th / n_head] * pow(theta, -2.0 * i / n_rot);
    if (ff) a /= (double)ff[i];
    const float cs = (float)cos(a), sn = (float)sin(a);
    float *v = x + th * head_dim;
    const float x0 = v[2 * i], x1 = v[2 * i + 1];
    v[2 * i] = x0 * cs - x1 * sn;
    v[2 * i + 1] = x0 * sn + x1 * cs;
}

hm_status hm_cuda_rope_norm_ff(hm_cuda_ctx *c, float *x, int64_t n_tok, int n_head, int head_dim, int n_rot,
                               const int32_t *pos, float theta_base, const float *ff, hm_err *err) {
    HM_CU_ARG(x && pos && n_tok >= 0 && n_head > 0 && n_rot > 0 && n_rot % 2 == 0 && n_rot <= head_dim);
    const int64_t n = n_tok * n_head * (n_rot / 2);
    if (!n) return HM_OK;
    k_rope_norm_ff<<<hm_cu_blocks(n, 256), 256, 0, c->compute>>>(x, n, n_head, head_dim, n_rot, pos,
                                                                 (double)theta_base, ff);
    HM_CU_LAUNCH("rope_norm_ff");
    return HM_OK;
}

static __global__ void k_add_bias(float *a, const float *b, int64_t n, int64_t width) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] += b[i % width];
}

hm_status hm_cuda_add_bias(hm_cuda_ctx *c, float *a, const float *b, int64_t n_rows, int64_t width, hm_err *err) {
    HM_CU_ARG(a && b && n_rows >= 0 && width > 0);
    const int64_t n = n_rows * width;
    if (!n) return HM_OK;
    k_add_bias<<<hm_cu_blocks(n, 256), 256, 0, c->compute>>>(a, b, n, width);
    HM_CU_LAUNCH("add_bias");
    return HM_OK;
}
