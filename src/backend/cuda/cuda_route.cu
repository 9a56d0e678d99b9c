/* cuda_route.cu - the MoE router for every routing spec (backend/route_spec.h): sigmoid and
 * sqrt-softplus scores, a score bias that steers the choice, group-limited choice, softmax over
 * the chosen logits, hash-routed layers, routed scale. The plain spec (softmax, top-k, renorm) keeps
 * its tuned kernel (hm_cuda_router in cuda_ops.cu); this one is the general case.
 *
 * One warp per token. The scores and choice values live in shared memory (2 x n_expert floats per
 * warp); lane j owns experts j, j + 32, ... A choice round is a warp max over 64-bit keys (the
 * choice value in an order-preserving encoding, then the inverted index, so equal values go to the
 * lower id), the same order as the CPU's insertion top-k; the weights are summed in choice order as
 * the CPU does. Scores use expf/log1pf/sqrtf (not bit-identical to the CPU's libm, within ulps). */
#include <math.h>

#include "cuda_impl.h"
#include "cuda_quant.cuh"

using namespace hmcu;

namespace {

constexpr int RT_WARPS = 4;

/* Order-preserving: a > b as floats (no NaN) iff enc(a) > enc(b) as unsigned. */
__device__ __forceinline__ uint32_t enc(float f) {
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ uint64_t warp_max_u64(uint64_t v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const uint64_t w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}

/* The index of the largest v[i] over i in [0, n) with ok(i) (ties: the lower i); -1 if none. */
template <typename OK>
__device__ __forceinline__ int warp_argmax(const float *v, int n, OK ok) {
    const int lane = threadIdx.x & 31;
    uint64_t best = 0;
    for (int i = lane; i < n; i += 32)
        if (ok(i)) {
            const uint64_t key = (uint64_t)enc(v[i]) << 32 | (uint32_t)(0xffffffffu - (uint32_t)i);
            best = key > best ? key : best;
        }
    best = warp_max_u64(best);
    return best ? (int)(0xffffffffu - (uint32_t)best) : -1;
}

__global__ void __launch_bounds__(32 * RT_WARPS) k_route(hm_route_spec sp, const float *__restrict__ logits,
                                                          int64_t n_tok, const float *__restrict__ bias,
                                                          const int32_t *__restrict__ hash,
                                                          const int32_t *__restrict__ tokens, int32_t *ids,
                                                          float *weights) {
    extern __shared__ float sm[];
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
    const int64_t t = (int64_t)blockIdx.x * RT_WARPS + wi;
    if (t >= n_tok) return; /* the whole warp */
    const int ne = sp.n_expert, k = sp.k;
    float *s = sm + (size_t)wi * 2 * ne, *c = s + ne;
    const float *l = logits + t * ne;

    /* 1. scores */
    if (sp.score == HM_ROUTE_SOFTMAX) {
        float m = -INFINITY;
        for (int e = lane; e < ne; e += 32) m = fmaxf(m, l[e]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float sum = 0.0f;
        for (int e = lane; e < ne; e += 32) sum += (s[e] = expf(l[e] - m));
        const float inv = 1.0f / warp_sum(sum);
        for (int e = lane; e < ne; e += 32) s[e] *= inv;
    } else {
        for (int e = lane; e < ne; e += 32) {
            const float v = l[e];
            s[e] = sp.score == HM_ROUTE_SIGMOID        ? 1.0f / (1.0f + expf(-v))
                   : sp.score == HM_ROUTE_SQRT_SOFTPLUS ? sqrtf(v > 20.0f ? v : log1pf(expf(v)))
                                                        : v;
        }
    }
    /* 2-4. the choice */
    int myid = 0; /* lane i < k: the i-th chosen expert */
    if (hash) {
        if (lane < k) myid = hash[(int64_t)tokens[t] * k + lane];
        __syncwarp();
    } else {
        for (int e = lane; e < ne; e += 32) c[e] = bias ? s[e] + bias[e] : s[e];
        __syncwarp();
        uint32_t keep = 0xffffffffu; /* the groups still allowed (bit g) */
        if (sp.n_group > 1) {
            const int ng = sp.n_group, gs = ne / ng;
            float gscore = -INFINITY; /* lane g < ng: its group's score */
            if (lane < ng) {
                float a = -INFINITY, b = -INFINITY;
                for (int i = 0; i < gs; i++) {
                    const float v = c[lane * gs + i];
                    if (v > a) {
                        b = a;
                        a = v;
                    } else if (v > b) {
                        b = v;
                    }
                }
                gscore = bias && gs > 1 ? a + b : a;
            }
            keep = 0;
            for (int r = 0; r < sp.topk_group; r++) {
                uint64_t key = lane < ng && !(keep >> lane & 1u)
                                   ? (uint64_t)enc(gscore) << 32 | (uint32_t)(0xffffffffu - (uint32_t)lane)
                                   : 0;
                key = warp_max_u64(key);
                keep |= 1u << (0xffffffffu - (uint32_t)key);
            }
        }
        const int gs = sp.n_group > 1 ? ne / sp.n_group : ne;
        uint32_t taken = 0; /* bit j: the lane's expert lane + 32 j is chosen (n_expert <= 1024) */
        for (int r = 0; r < k; r++) {
            const int sel = warp_argmax(c, ne, [&](int e) { return (keep >> (e / gs) & 1u) && !(taken >> (e >> 5) & 1u); });
            if ((sel & 31) == lane) taken |= 1u << (sel >> 5);
            if (lane == r) myid = sel;
        }
    }
    /* 5-7. the weights, summed in choice order on every lane */
    float w = 0.0f;
    if (sp.score == HM_ROUTE_SOFTMAX_TOPK) {
        float m = -INFINITY;
        for (int i = 0; i < k; i++) m = fmaxf(m, s[__shfl_sync(0xffffffffu, myid, i)]);
        float sum = 0.0f;
        for (int i = 0; i < k; i++) {
            const float e = expf(s[__shfl_sync(0xffffffffu, myid, i)] - m);
            sum += e;
            if (lane == i) w = e;
        }
        w /= sum;
    } else {
        float sum = 0.0f;
        for (int i = 0; i < k; i++) {
            const float v = s[__shfl_sync(0xffffffffu, myid, i)];
            sum += v;
            if (lane == i) w = v;
        }
        if (sp.norm) w *= 1.0f / sum;
    }
    const float scale = sp.scale == 0.0f ? 1.0f : sp.scale;
    if (scale != 1.0f) w *= scale;
    if (lane < k) {
        ids[t * k + lane] = myid;
        weights[t * k + lane] = w;
    }
}

} // namespace

hm_status hm_cuda_route(hm_cuda_ctx *c, const hm_route_spec *sp, const float *logits, int64_t n_tok,
                        const float *bias, const int32_t *hash, const int32_t *tokens, int32_t *ids,
                        float *weights, hm_err *err) {
    HM_CU_ARG(sp && !hm_route_spec_invalid(sp) && logits && ids && weights && (!hash || tokens));
    HM_CU_ARG(n_tok >= 0 && n_tok < (1ll << 31));
    if (!n_tok) return HM_OK;
    const size_t smem = (size_t)RT_WARPS * 2 * (size_t)sp->n_expert * sizeof(float);
    k_route<<<hm_cu_blocks(n_tok, RT_WARPS), 32 * RT_WARPS, smem, c->compute>>>(*sp, logits, n_tok, bias, hash,
                                                                                tokens, ids, weights);
    HM_CU_LAUNCH("route");
    return HM_OK;
}
