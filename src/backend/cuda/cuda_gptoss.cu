/* cuda_gptoss.cu - the gpt-oss ops of cuda_gptoss.h that are not a flag of another kernel (the
 * sinks are: cuda_gemma.cu's and cuda_flash.cu's attention take them). One thread per element. */
#include "cuda_gptoss.h"
#include "cuda_impl.h"

__global__ void k_add_bias(float *a, const float *b, int64_t n, int64_t width) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] += b[i % width];
}

hm_status hm_cuda_add_bias(hm_cuda_ctx *c, float *a, const float *b, int64_t rows, int64_t width, hm_err *err) {
    HM_CU_ARG(a && b && rows >= 0 && width > 0);
    const int64_t n = rows * width;
    if (!n) return HM_OK;
    k_add_bias<<<hm_cu_blocks(n, 256), 256, 0, c->compute>>>(a, b, n, width);
    HM_CU_LAUNCH("add_bias");
    return HM_OK;
}
