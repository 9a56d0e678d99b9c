/* cuda_device.h - CUDA device discovery (C interface). Only built when HM_HAVE_CUDA. */
#ifndef HM_CUDA_DEVICE_H
#define HM_CUDA_DEVICE_H
#include <stddef.h>
#ifdef __cplusplus
extern "C" {
#endif
/* Number of usable CUDA devices; 0 when there is no driver or no GPU. */
int hm_cuda_device_count(void);
/* "NVIDIA H200 (sm_90, 139.8 GiB)" into buf; -1 on failure. */
int hm_cuda_device_name(int dev, char *buf, size_t len);
#ifdef __cplusplus
}
#endif
#endif
