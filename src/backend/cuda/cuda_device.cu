/* cuda_device.cu - CUDA device discovery. The CUDA backend (kernels, VRAM expert slots) grows
 * here; this file answers "is there a GPU and what is it" without failing when there is none. */
#include <cuda_runtime.h>
#include <stdio.h>

#include "cuda_device.h"

extern "C" int hm_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
    return n;
}

extern "C" int hm_cuda_device_name(int dev, char *buf, size_t len) {
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, dev) != cudaSuccess) return -1;
    snprintf(buf, len, "%s (sm_%d%d, %.1f GiB)", p.name, p.major, p.minor,
             (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    return 0;
}
