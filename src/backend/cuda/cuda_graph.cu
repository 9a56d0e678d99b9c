/* cuda_graph.cu - a decode step as one CUDA graph (capture once, replay each step) and the two
 * handshakes over pinned host memory that let the CPU compute a MoE layer's cold units inside it
 * (hm_cuda_publish on the device -> host; hm_cuda_join host -> device). Contracts in cuda_ops.h.
 *
 * Memory order: the publishing block writes the host buffers, every thread fences at system scope,
 * the block syncs, then one thread stores the flag; the host reads the flag with acquire and only
 * then the buffers. The other way, the host stores its sum, then the flag with release; the join's
 * waiting thread polls the flag with volatile (uncached) loads, fences, and the block reads the
 * sum with uncached loads too (a previous step's values must never be served from a cache). */
#include <sched.h>

#include "cuda_impl.h"

struct hm_cuda_graph {
    cudaGraphExec_t exec;
};

hm_status hm_cuda_capture_begin(hm_cuda_ctx *c, hm_err *err) {
    HM_CU(cudaStreamBeginCapture(c->compute, cudaStreamCaptureModeThreadLocal));
    return HM_OK;
}

hm_status hm_cuda_capture_end(hm_cuda_ctx *c, bool ok, hm_cuda_graph **out, hm_err *err) {
    *out = NULL;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(c->compute, &graph);
    if (!ok || e != cudaSuccess) {
        if (graph) cudaGraphDestroy(graph);
        (void)cudaGetLastError();
        if (!ok) return HM_OK; /* the caller reports its own error */
        return hm_errf(err, HM_ERR_CUDA, "cuda: capturing the decode step: %s", cudaGetErrorString(e));
    }
    hm_cuda_graph *g = (hm_cuda_graph *)calloc(1, sizeof *g);
    if (!g) {
        cudaGraphDestroy(graph);
        return hm_errf(err, HM_ERR_NOMEM, "cuda: out of host memory for a graph");
    }
    e = cudaGraphInstantiate(&g->exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
        free(g);
        (void)cudaGetLastError();
        return hm_errf(err, HM_ERR_CUDA, "cuda: instantiating the decode step's graph: %s", cudaGetErrorString(e));
    }
    *out = g;
    return HM_OK;
}

hm_status hm_cuda_graph_launch(hm_cuda_ctx *c, hm_cuda_graph *g, hm_err *err) {
    HM_CU(cudaGraphLaunch(g->exec, c->compute));
    return HM_OK;
}

void hm_cuda_graph_destroy(hm_cuda_graph *g) {
    if (!g) return;
    cudaGraphExecDestroy(g->exec);
    free(g);
}

/* ---- the handshakes ---- */

#define PUB_THREADS 256

__global__ void __launch_bounds__(PUB_THREADS) k_publish(const hm_cuda_moe_slot *__restrict__ slots,
                                                         const int32_t *__restrict__ ids, const float *__restrict__ w,
                                                         int n_pairs, const float *__restrict__ x, int64_t n_x,
                                                         int32_t *ncold_dev, int32_t *pub_host, float *x_host,
                                                         uint32_t *flag_host, const uint32_t *seq_dev) {
    const int tid = threadIdx.x;
    int32_t id = 0;
    float wt = 0.0f;
    if (tid < n_pairs) {
        id = ids[tid];
        wt = w[tid];
    }
    const int cold = tid < n_pairs && slots[id].gate == NULL;
    const int n_cold = __syncthreads_count(cold);
    if (tid < n_pairs) {
        pub_host[1 + tid] = id;
        pub_host[1 + n_pairs + tid] = __float_as_int(wt);
    }
    if (tid == 0) {
        pub_host[0] = n_cold;
        *ncold_dev = n_cold;
    }
    if (n_cold > 0)
        for (int64_t i = tid; i < n_x; i += PUB_THREADS) x_host[i] = x[i];
    __threadfence_system();
    __syncthreads();
    if (tid == 0) *(volatile uint32_t *)flag_host = *seq_dev;
}

#define JOIN_THREADS 1024

__global__ void __launch_bounds__(JOIN_THREADS) k_join(const int32_t *ncold_dev, const uint32_t *flag_host,
                                                       const uint32_t *seq_dev, const float *add_host,
                                                       float *__restrict__ out, int64_t n) {
    if (*ncold_dev == 0) return; /* the same value for every thread: no one reaches the barrier */
    if (threadIdx.x == 0) {
        const uint32_t want = *seq_dev;
        while (__ldcv(flag_host) != want) __nanosleep(200);
        __threadfence_system();
    }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < n; i += JOIN_THREADS) out[i] += __ldcv(add_host + i);
}

hm_status hm_cuda_publish(hm_cuda_ctx *c, const hm_cuda_moe_slot *slots, const int32_t *ids, const float *w,
                          int n_pairs, const float *x, int64_t n_x, int32_t *ncold_dev, int32_t *pub_host,
                          float *x_host, uint32_t *flag_host, const uint32_t *seq_dev, hm_err *err) {
    HM_CU_ARG(slots && ids && w && x && ncold_dev && pub_host && x_host && flag_host && seq_dev);
    HM_CU_ARG(n_pairs >= 1 && n_pairs <= PUB_THREADS && n_x >= 0);
    k_publish<<<1, PUB_THREADS, 0, c->compute>>>(slots, ids, w, n_pairs, x, n_x, ncold_dev, pub_host, x_host,
                                                 flag_host, seq_dev);
    HM_CU_LAUNCH("publish");
    return HM_OK;
}

hm_status hm_cuda_join(hm_cuda_ctx *c, const int32_t *ncold_dev, const uint32_t *flag_host,
                       const uint32_t *seq_dev, const float *add_host, float *out, int64_t n, hm_err *err) {
    HM_CU_ARG(ncold_dev && flag_host && seq_dev && add_host && out && n >= 0);
    k_join<<<1, JOIN_THREADS, 0, c->compute>>>(ncold_dev, flag_host, seq_dev, add_host, out, n);
    HM_CU_LAUNCH("join");
    return HM_OK;
}

hm_status hm_cuda_host_wait(hm_cuda_ctx *c, const uint32_t *flag, uint32_t want, hm_err *err) {
    for (uint64_t spin = 0;; spin++) {
        if (__atomic_load_n(flag, __ATOMIC_ACQUIRE) == want) return HM_OK;
        if ((spin & 1023) != 1023) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
            continue;
        }
        const cudaError_t q = cudaStreamQuery(c->compute);
        if (q == cudaErrorNotReady) {
            if (spin > (1u << 20)) sched_yield(); /* a long wait (e.g. a big prefill before): let others run */
            continue;
        }
        if (__atomic_load_n(flag, __ATOMIC_ACQUIRE) == want) return HM_OK;
        if (q != cudaSuccess)
            return hm_errf(err, HM_ERR_CUDA, "cuda: the decode step failed on the device: %s", cudaGetErrorString(q));
        return hm_errf(err, HM_ERR_INTERNAL, "cuda: the device finished the step without publishing (flag %u, "
                       "want %u)", *flag, want);
    }
}

void hm_cuda_host_signal(uint32_t *flag, uint32_t v) { __atomic_store_n(flag, v, __ATOMIC_RELEASE); }
