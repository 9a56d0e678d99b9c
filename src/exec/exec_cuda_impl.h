/* exec_cuda_impl.h - what the CUDA executor's two files share (CUDA builds only): the device copies
 * of the weights, made by the upload pass (exec_upload_cuda.c) and found by the compute ops
 * (exec_cuda.c), keyed by (host pointer, device): a matrix by its rows' address in the mapping, an
 * f32 vector by its own. Stored in m->gpu->arch (hm_exec_gpu_load / hm_exec_gpu_unload). */
#ifndef HM_EXEC_CUDA_IMPL_H
#define HM_EXEC_CUDA_IMPL_H

#include "backend/cuda/cuda_ops.h"
#include "exec_impl.h"

typedef struct hm_xw {
    const void *key;  /* the host data (a matrix's rows or an f32 vector); NULL: an empty entry */
    int32_t dev;
    hm_cuda_mat m;    /* a matrix's device copy (a view into its stack when stacked) */
    const float *v;   /* a vector's device copy */
    bool any;         /* F32 rows only the exact f32 fallback matmul reads (hm_gpu_up_mat) */
    int32_t stack;    /* index into stacks, -1: none */
    int32_t pos;      /* its place in the stack */
} hm_xw;

typedef struct hm_xstack {
    hm_cuda_mat m; /* the stacked matrix */
    int32_t n;     /* matrices in it */
} hm_xstack;

typedef struct hm_xmap {
    hm_xw *e;        /* [cap], open addressing */
    size_t cap, n;
    hm_xstack *stacks;
    int32_t n_stacks, cap_stacks;
} hm_xmap;

/* The device copy of host pointer key on device index dev; NULL when the upload pass made none. */
hm_xw *hm_xmap_find(const hm_xmap *mp, const void *key, int32_t dev);

#endif
