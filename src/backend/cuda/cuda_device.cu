/* cuda_device.cu - CUDA device discovery, the device context (its compute and upload streams),
 * device memory and host<->device copies.
 *
 * Discovery never fails when there is no GPU (hm_cuda_device_count() == 0 is an answer, not an
 * error). Everything else reports CUDA failures as HM_ERR_CUDA through HM_CU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_device.h"
#include "cuda_impl.h"

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

static hm_status ctx_init(hm_cuda_ctx *c, int device, hm_err *err) {
    HM_CU(cudaSetDevice(device));
    HM_CU(cudaDeviceGetAttribute(&c->n_sm, cudaDevAttrMultiProcessorCount, device));
    {
        const char *ev = getenv("HOTMOE_CUDA_EXACT");
        c->exact_mm = ev && strcmp(ev, "1") == 0;
        const char *fa = getenv("HOTMOE_FLASH_ATTN");
        c->flash = !c->exact_mm && !(fa && strcmp(fa, "0") == 0);
        const char *fv = getenv("HOTMOE_FLASH_VARIANT"); /* a benchmark switch: hm_cuda_set_flash_variant */
        c->flash_variant = fv ? atoi(fv) : 0;
    }
    HM_CU(cudaStreamCreateWithFlags(&c->compute, cudaStreamNonBlocking));
    HM_CU(cudaStreamCreateWithFlags(&c->upload, cudaStreamNonBlocking));
    HM_CU(cudaEventCreateWithFlags(&c->upload_done, cudaEventDisableTiming));
    for (int i = 0; i < HM_CUDA_MOE_RING; i++)
        HM_CU(cudaEventCreateWithFlags(&c->moe_free[i], cudaEventDisableTiming));
    {
        /* the int8 prefill matmul: on unless HOTMOE_CUDA_MMQ=0 or the exact reference path is */
        const char *ev = getenv("HOTMOE_CUDA_MMQ");
        if (!c->exact_mm && !(ev && strcmp(ev, "0") == 0)) return hm_cuda_set_mmq(c, true, err);
    }
    return HM_OK;
}

hm_status hm_cuda_open(hm_cuda_ctx **out, int device, hm_err *err) {
    *out = NULL;
    hm_cuda_ctx *c = (hm_cuda_ctx *)calloc(1, sizeof *c);
    if (!c) return hm_errf(err, HM_ERR_NOMEM, "cuda: out of host memory for the context");
    c->device = device;
    hm_status st = ctx_init(c, device, err);
    if (st) {
        hm_cuda_close(c);
        return st;
    }
    *out = c;
    return HM_OK;
}

void hm_cuda_close(hm_cuda_ctx *c) {
    if (!c) return;
    cudaSetDevice(c->device);
    if (c->compute) cudaStreamSynchronize(c->compute);
    if (c->upload) cudaStreamSynchronize(c->upload);
    for (int i = 0; i < HM_CUDA_MOE_RING; i++) {
        if (c->moe_host[i]) cudaFreeHost(c->moe_host[i]);
        if (c->moe_free[i]) cudaEventDestroy(c->moe_free[i]);
    }
    if (c->mmq_ws) cudaFree(c->mmq_ws);
    if (c->upload_done) cudaEventDestroy(c->upload_done);
    if (c->upload) cudaStreamDestroy(c->upload);
    if (c->compute) cudaStreamDestroy(c->compute);
    free(c);
}

hm_status hm_cuda_alloc(hm_cuda_ctx *c, size_t bytes, void **out, hm_err *err) {
    *out = NULL;
    HM_CU(cudaSetDevice(c->device));
    cudaError_t e = cudaMalloc(out, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *out = NULL;
        (void)cudaGetLastError(); /* clear the sticky-free allocation error */
        return hm_errf(err, e == cudaErrorMemoryAllocation ? HM_ERR_NOMEM : HM_ERR_CUDA,
                       "cuda: cudaMalloc of %zu bytes on device %d: %s", bytes, c->device,
                       cudaGetErrorString(e));
    }
    return HM_OK;
}

void hm_cuda_free(hm_cuda_ctx *c, void *p) {
    if (!p) return;
    if (c) (void)cudaSetDevice(c->device); /* the owner's device (several devices in one process) */
    cudaFree(p);
}

hm_status hm_cuda_memset(hm_cuda_ctx *c, void *dst, int byte, size_t n, hm_err *err) {
    HM_CU(cudaMemsetAsync(dst, byte, n, c->compute));
    return HM_OK;
}

hm_status hm_cuda_upload(hm_cuda_ctx *c, void *dst, const void *src_host, size_t n, hm_err *err) {
    HM_CU(cudaMemcpyAsync(dst, src_host, n, cudaMemcpyHostToDevice, c->upload));
    HM_CU(cudaStreamSynchronize(c->upload));
    return HM_OK;
}

hm_status hm_cuda_upload_async(hm_cuda_ctx *c, void *dst, const void *src_host, size_t n,
                               hm_err *err) {
    HM_CU(cudaMemcpyAsync(dst, src_host, n, cudaMemcpyHostToDevice, c->upload));
    return HM_OK;
}

hm_status hm_cuda_upload_fence(hm_cuda_ctx *c, hm_err *err) {
    HM_CU(cudaEventRecord(c->upload_done, c->upload));
    HM_CU(cudaStreamWaitEvent(c->compute, c->upload_done, 0));
    return HM_OK;
}

hm_status hm_cuda_download(hm_cuda_ctx *c, void *dst_host, const void *src, size_t n, hm_err *err) {
    HM_CU(cudaMemcpyAsync(dst_host, src, n, cudaMemcpyDeviceToHost, c->compute));
    HM_CU(cudaStreamSynchronize(c->compute));
    return HM_OK;
}

hm_status hm_cuda_sync(hm_cuda_ctx *c, hm_err *err) {
    HM_CU(cudaStreamSynchronize(c->compute));
    return HM_OK;
}

/* ---- pinned host memory, device info, async copies on the compute stream, events ---- */

hm_status hm_cuda_host_alloc(hm_cuda_ctx *c, size_t bytes, void **out, hm_err *err) {
    *out = NULL;
    HM_CU(cudaSetDevice(c->device));
    cudaError_t e = cudaHostAlloc(out, bytes ? bytes : 1, cudaHostAllocPortable | cudaHostAllocMapped);
    if (e != cudaSuccess) {
        *out = NULL;
        (void)cudaGetLastError();
        return hm_errf(err, HM_ERR_NOMEM, "cuda: cudaHostAlloc of %zu pinned bytes: %s", bytes,
                       cudaGetErrorString(e));
    }
    return HM_OK;
}

void hm_cuda_host_free(hm_cuda_ctx *c, void *p) {
    (void)c;
    if (p) cudaFreeHost(p);
}

static uintptr_t page_floor(const void *p) {
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    return (uintptr_t)p / pg * pg;
}

hm_status hm_cuda_host_register(hm_cuda_ctx *c, const void *p, size_t n, hm_err *err) {
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), lo = page_floor(p);
    const uintptr_t hi = ((uintptr_t)p + n + pg - 1) / pg * pg;
    HM_CU(cudaSetDevice(c->device));
    cudaError_t e = cudaHostRegister((void *)lo, (size_t)(hi - lo), cudaHostRegisterReadOnly | cudaHostRegisterPortable);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return hm_errf(err, HM_ERR_NOMEM, "cuda: cudaHostRegister of %zu MiB of read-only host memory: %s",
                       (size_t)(hi - lo) >> 20, cudaGetErrorString(e));
    }
    return HM_OK;
}

void hm_cuda_host_unregister(hm_cuda_ctx *c, const void *p) {
    if (!p) return;
    (void)cudaSetDevice(c->device);
    if (cudaHostUnregister((void *)page_floor(p)) != cudaSuccess) (void)cudaGetLastError();
}

hm_status hm_cuda_mem_info(hm_cuda_ctx *c, size_t *free_bytes, size_t *total_bytes, hm_err *err) {
    HM_CU(cudaSetDevice(c->device));
    HM_CU(cudaMemGetInfo(free_bytes, total_bytes));
    return HM_OK;
}

hm_status hm_cuda_download_async(hm_cuda_ctx *c, void *dst_host, const void *src, size_t n, hm_err *err) {
    HM_CU(cudaMemcpyAsync(dst_host, src, n, cudaMemcpyDeviceToHost, c->compute));
    return HM_OK;
}

hm_status hm_cuda_upload_compute(hm_cuda_ctx *c, void *dst, const void *src_host, size_t n, hm_err *err) {
    HM_CU(cudaMemcpyAsync(dst, src_host, n, cudaMemcpyHostToDevice, c->compute));
    return HM_OK;
}

struct hm_cuda_event {
    cudaEvent_t ev;
    bool recorded;
};

hm_status hm_cuda_make_current(hm_cuda_ctx *c, hm_err *err) {
    HM_CU(cudaSetDevice(c->device));
    return HM_OK;
}

/* Peer access from a's device to b's memory; an "already enabled" answer is success. */
static hm_status peer_one(hm_cuda_ctx *a, hm_cuda_ctx *b, bool *on, hm_err *err) {
    int can = 0;
    *on = false;
    HM_CU(cudaDeviceCanAccessPeer(&can, a->device, b->device));
    if (!can) return HM_OK;
    HM_CU(cudaSetDevice(a->device));
    cudaError_t e = cudaDeviceEnablePeerAccess(b->device, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError(); /* take it out of the runtime's last-error slot */
        e = cudaSuccess;
    }
    HM_CU(e);
    *on = true;
    return HM_OK;
}

hm_status hm_cuda_enable_peer(hm_cuda_ctx *a, hm_cuda_ctx *b, bool *on, hm_err *err) {
    bool ab = false, ba = false;
    *on = false;
    if (a->device == b->device) return HM_OK;
    hm_status st = peer_one(a, b, &ab, err);
    if (st == HM_OK) st = peer_one(b, a, &ba, err);
    *on = ab && ba;
    return st;
}

hm_status hm_cuda_copy_peer(hm_cuda_ctx *dst_c, void *dst, hm_cuda_ctx *src_c, const void *src, size_t n,
                            hm_cuda_event *done_src, hm_err *err) {
    if (!n) return HM_OK;
    HM_CU(cudaEventRecord(done_src->ev, src_c->compute));
    done_src->recorded = true;
    HM_CU(cudaStreamWaitEvent(dst_c->compute, done_src->ev, 0));
    HM_CU(cudaMemcpyPeerAsync(dst, dst_c->device, src, src_c->device, n, dst_c->compute));
    return HM_OK;
}

hm_status hm_cuda_event_create(hm_cuda_ctx *c, hm_cuda_event **out, hm_err *err) {
    *out = NULL;
    hm_cuda_event *e = (hm_cuda_event *)calloc(1, sizeof *e);
    if (!e) return hm_errf(err, HM_ERR_NOMEM, "cuda: out of host memory for an event");
    cudaError_t ce = cudaSetDevice(c->device);
    if (ce == cudaSuccess) ce = cudaEventCreateWithFlags(&e->ev, cudaEventDisableTiming);
    if (ce != cudaSuccess) {
        free(e);
        return hm_errf(err, HM_ERR_CUDA, "cuda: cudaEventCreate: %s", cudaGetErrorString(ce));
    }
    *out = e;
    return HM_OK;
}

void hm_cuda_event_destroy(hm_cuda_event *e) {
    if (!e) return;
    cudaEventDestroy(e->ev);
    free(e);
}

hm_status hm_cuda_event_record(hm_cuda_ctx *c, hm_cuda_event *e, bool on_upload, hm_err *err) {
    HM_CU(cudaEventRecord(e->ev, on_upload ? c->upload : c->compute));
    e->recorded = true;
    return HM_OK;
}

bool hm_cuda_event_done(hm_cuda_event *e) {
    if (!e->recorded) return true;
    cudaError_t q = cudaEventQuery(e->ev);
    if (q == cudaErrorNotReady) {
        return false;
    }
    return true; /* done, or an error that the next wait/sync reports */
}

hm_status hm_cuda_event_wait(hm_cuda_event *e, hm_err *err) {
    if (!e->recorded) return HM_OK;
    HM_CU(cudaEventSynchronize(e->ev));
    return HM_OK;
}

hm_status hm_cuda_compute_wait(hm_cuda_ctx *c, hm_cuda_event *e, hm_err *err) {
    if (!e->recorded) return HM_OK;
    HM_CU(cudaStreamWaitEvent(c->compute, e->ev, 0));
    return HM_OK;
}

hm_status hm_cuda_copy(hm_cuda_ctx *c, void *dst, const void *src, size_t n, hm_err *err) {
    if (!n) return HM_OK;
    HM_CU(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, c->compute));
    return HM_OK;
}
