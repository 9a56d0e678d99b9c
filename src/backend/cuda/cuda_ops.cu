/* cuda_ops.cu - the row and elementwise ops: RMSNorm (whole rows and per head), RoPE NEOX,
 * add/mul/scale/SwiGLU, row softmax, the softmax + top-k router, embedding lookup (dequantising
 * get_rows) and the KV-cache write.
 *
 * Row ops give each row to one block (or one warp for short rows) and reduce in a fixed tree, so
 * results are deterministic. Numerics follow the CPU ops: f32 sums, expf, angles in double.
 *
 * Decode makes these ops latency-bound (a 2048-float row is 8 KB), so the default kernels keep a
 * row in registers and issue all of its loads at once: a thread owns "quads" (4 consecutive
 * floats, one float4 load when the pointers allow, else 4 scalar loads with the same arithmetic),
 * quad j, j + T, j + 2T, ... of a row of T threads; its partial sum runs over its quads in that
 * order and elements 0..3 within each (padding past the row end adds exact zeros), then a fixed
 * warp and block tree. The thread count and quad order depend on the row length only, never on
 * alignment, so fused and unfused ops (add_rmsnorm = add + rmsnorm; qk_norm_rope_kv = the head
 * norms + RoPE + kv_write) give bit-identical results. RoPE computes each (token, pair) angle once
 * per block (frequency from the host's pow, angle and sincos in double, as the CPU) into a shared
 * table. The pre-rewrite kernels stay
 * for the OLD test hook (hm_cuda_set_kern), which benchmarks compare against. */
#include <math.h>
#include <string.h>

#include "cuda_impl.h"
#include "cuda_quant.cuh"

using namespace hmcu;

/* Sum over a block of `nt` threads (a multiple of 32, <= 1024); every thread gets the result. */
__device__ float block_sum(float v, float *sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); /* sh may still be read from a previous call */
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(v);
}

__device__ float block_max(float v, float *sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -INFINITY;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over a block (blockDim a multiple of 32): the fixed tree of block_sum, for a kernel that
 * reduces once (no leading barrier). */
__device__ __forceinline__ float block_sum_once(float v, float *sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(v);
}

/* ---- the quad layout of the default kernels (see the top of the file) ---- */

/* Quad q of a row of n floats: elements 4q .. 4q+3, `pad` past the end. VEC: one float4 load
 * (the row 16-byte aligned and n % 4 == 0, so a quad is all in or all out). */
template <bool VEC>
__device__ __forceinline__ float4 ld_quad(const float *r, int64_t q, int64_t n, float pad = 0.0f) {
    const int64_t i = 4 * q;
    if (VEC) return i < n ? *(const float4 *)(r + i) : make_float4(pad, pad, pad, pad);
    return make_float4(i < n ? r[i] : pad, i + 1 < n ? r[i + 1] : pad, i + 2 < n ? r[i + 2] : pad,
                       i + 3 < n ? r[i + 3] : pad);
}

template <bool VEC>
__device__ __forceinline__ void st_quad(float *r, int64_t q, int64_t n, float4 v) {
    const int64_t i = 4 * q;
    if (VEC) {
        if (i < n) *(float4 *)(r + i) = v;
        return;
    }
    if (i < n) r[i] = v.x;
    if (i + 1 < n) r[i + 1] = v.y;
    if (i + 2 < n) r[i + 2] = v.z;
    if (i + 3 < n) r[i + 3] = v.w;
}

/* The four elements as f16 (round to nearest even) into a cache row; VEC: one 8-byte store. */
template <bool VEC>
__device__ __forceinline__ void st_quad_f16(uint16_t *r, int64_t q, int64_t n, float4 v) {
    const int64_t i = 4 * q;
    const uint16_t h0 = __half_as_ushort(__float2half_rn(v.x)), h1 = __half_as_ushort(__float2half_rn(v.y)),
                   h2 = __half_as_ushort(__float2half_rn(v.z)), h3 = __half_as_ushort(__float2half_rn(v.w));
    if (VEC) {
        if (i < n) *(uint2 *)(r + i) = make_uint2((uint32_t)h0 | (uint32_t)h1 << 16, (uint32_t)h2 | (uint32_t)h3 << 16);
        return;
    }
    if (i < n) r[i] = h0;
    if (i + 1 < n) r[i + 1] = h1;
    if (i + 2 < n) r[i + 2] = h2;
    if (i + 3 < n) r[i + 3] = h3;
}

/* ss + the quad's squares, elements in order, explicit fma (no contraction choices left to the
 * compiler: every kernel that uses this gets the same bits). */
__device__ __forceinline__ float quad_ss(float4 v, float ss) {
    ss = __fmaf_rn(v.x, v.x, ss);
    ss = __fmaf_rn(v.y, v.y, ss);
    ss = __fmaf_rn(v.z, v.z, ss);
    return __fmaf_rn(v.w, v.w, ss);
}

/* x * scale * w (w absent: x * scale), rounded as the CPU's expression. */
__device__ __forceinline__ float4 quad_norm(float4 v, float scale, float4 w, bool has_w) {
    v = make_float4(__fmul_rn(v.x, scale), __fmul_rn(v.y, scale), __fmul_rn(v.z, scale), __fmul_rn(v.w, scale));
    if (has_w) v = make_float4(__fmul_rn(v.x, w.x), __fmul_rn(v.y, w.y), __fmul_rn(v.z, w.z), __fmul_rn(v.w, w.w));
    return v;
}

__device__ __forceinline__ float4 quad_add(float4 a, float4 b) {
    return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z), __fadd_rn(a.w, b.w));
}

__device__ __forceinline__ float quad_at(float4 v, int c) { return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w; }

/* ---- RMSNorm of whole rows (and the fused residual add): one block of T threads per row ---- */

/* T (a multiple of 32, <= 1024) and quads per thread V for a row of n: T from n alone, so that
 * rmsnorm and add_rmsnorm reduce in the same order whatever their pointers. V = 0: more than 2
 * quads a thread (n > 8192), the two-pass loop kernel (same order). */
static void rows_shape(int64_t n, int *threads, int *v) {
    const int64_t nq = (n + 3) / 4;
    int64_t t = (nq + 31) / 32 * 32;
    if (t > 1024) t = 1024;
    const int64_t per = (nq + t - 1) / t;
    *threads = (int)t;
    *v = per <= 1 ? 1 : per <= 2 ? 2 : 0;
}

/* ADD: x[r] += h[r] stored, then out[r] = rmsnorm(x[r]) * w. A thread reads h and x of its quads
 * before it writes out of the same quads (out may alias h, or x without ADD). */
template <int V, bool VEC, bool ADD>
__global__ void __launch_bounds__(1024) k_rmsnorm_q(float *x, const float *h, const float *w, float *out, int64_t n,
                                                    float eps) {
    __shared__ float sh[32];
    const int64_t row = blockIdx.x;
    float *xr = x + row * n;
    const float *hr = ADD ? h + row * n : nullptr;
    float *orow = out + row * n;
    const int j = threadIdx.x, T = blockDim.x;
    const float4 one = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
    float ss = 0.0f;
    if constexpr (V > 0) {
        float4 xv[V], wv[V];
#pragma unroll
        for (int u = 0; u < V; u++) {
            const int64_t q = j + (int64_t)u * T;
            xv[u] = ld_quad<VEC>(xr, q, n);
            if (ADD) xv[u] = quad_add(xv[u], ld_quad<VEC>(hr, q, n));
            wv[u] = w ? ld_quad<VEC>(w, q, n) : one;
        }
#pragma unroll
        for (int u = 0; u < V; u++) {
            if (ADD) st_quad<VEC>(xr, j + (int64_t)u * T, n, xv[u]);
            ss = quad_ss(xv[u], ss);
        }
        ss = block_sum_once(ss, sh);
        const float scale = 1.0f / sqrtf(ss / (float)n + eps);
#pragma unroll
        for (int u = 0; u < V; u++) st_quad<VEC>(orow, j + (int64_t)u * T, n, quad_norm(xv[u], scale, wv[u], w != nullptr));
    } else {
        const int64_t nq = (n + 3) / 4;
        for (int64_t q = j; q < nq; q += T) {
            float4 v = ld_quad<VEC>(xr, q, n);
            if (ADD) {
                v = quad_add(v, ld_quad<VEC>(hr, q, n));
                st_quad<VEC>(xr, q, n, v);
            }
            ss = quad_ss(v, ss);
        }
        ss = block_sum_once(ss, sh);
        const float scale = 1.0f / sqrtf(ss / (float)n + eps);
        for (int64_t q = j; q < nq; q += T)
            st_quad<VEC>(orow, q, n, quad_norm(ld_quad<VEC>(xr, q, n), scale, w ? ld_quad<VEC>(w, q, n) : one, w != nullptr));
    }
}

static bool al16(const void *p) { return (uintptr_t)p % 16 == 0; }

template <bool ADD>
static void launch_rows(cudaStream_t st, float *x, const float *h, const float *w, float *out, int64_t n_rows,
                        int64_t n, float eps) {
    int T, V;
    rows_shape(n, &T, &V);
    const bool vec = n % 4 == 0 && al16(x) && al16(out) && (!w || al16(w)) && (!ADD || al16(h));
    const unsigned nb = (unsigned)n_rows;
#define HM_ROWS_V(VV)                                                                                         \
    do {                                                                                                      \
        if (vec) k_rmsnorm_q<VV, true, ADD><<<nb, T, 0, st>>>(x, h, w, out, n, eps);                           \
        else k_rmsnorm_q<VV, false, ADD><<<nb, T, 0, st>>>(x, h, w, out, n, eps);                              \
    } while (0)
    if (V == 1) HM_ROWS_V(1);
    else if (V == 2) HM_ROWS_V(2);
    else HM_ROWS_V(0);
#undef HM_ROWS_V
}

/* ---- per-head ops (q/k norms, RoPE, the K/V write): one warp per head, 8 heads a block ---- */

#define HEAD_WARPS 8

/* RoPE NEOX's frequencies theta^(-2i/n_rot), i < n_rot/2 <= 128, computed on the host in double
 * with the CPU's expression and passed by value (a __grid_constant__ parameter: no pow on the
 * device, and nothing that changes per step, so a captured graph may replay it). */
struct rope_freqs {
    double f[128];
};

static void rope_freqs_host(rope_freqs *r, double theta_base, int n_rot) {
    memset(r, 0, sizeof *r);
    for (int i = 0; i < n_rot / 2 && i < 128; i++) r->f[i] = pow(theta_base, -2.0 * i / n_rot);
}

/* cos and sin of the angle p * freq, in double as the CPU, rounded to float. The one definition
 * every new RoPE kernel uses (the fused op must match the unfused ones bit for bit). */
__device__ __forceinline__ void rope_cs(int32_t p, double freq, float *cs, float *sn) {
    const double a = (double)p * freq;
    double sd, cd;
    sincos(a, &sd, &cd);
    *cs = (float)cd;
    *sn = (float)sd;
}

/* The rotated pair (v[i], v[i + half]) from (x0, x1) = the old pair, rounded explicitly. */
__device__ __forceinline__ float rot_lo(float x0, float x1, float cs, float sn) {
    return __fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn));
}
__device__ __forceinline__ float rot_hi(float x0, float x1, float cs, float sn) {
    return __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, cs));
}

/* Block (token t, chunk of HEAD_WARPS heads of t's n_a heads of a then n_b heads of b); warp w
 * takes head chunk * HEAD_WARPS + w, lane l its quads l and l + 32 (HV = 2: head_dim <= 256).
 * NORM: the head's RMSNorm with w_a / w_b; ROPE: then NEOX over the first n_rot elements, the
 * angles of t computed once per block into shared memory; KV: then b's heads (k) and v's rows go
 * to the cache at row pos[t]. The standalone ops run this kernel with n_b = 0 and one flag: the
 * same expressions in the same order, so the fused op's results are theirs bit for bit. */
template <int HV, bool VEC, bool NORM, bool ROPE, bool KV>
__global__ void __launch_bounds__(32 * HEAD_WARPS) k_heads(float *a, float *b, const float *v, const float *w_a,
                                                           const float *w_b, int n_a, int n_b, int head_dim,
                                                           int n_rot, int n_chunk, const int32_t *pos,
                                                           const __grid_constant__ rope_freqs fr, float eps,
                                                           uint16_t *kc, uint16_t *vc, int64_t n_ctx) {
    __shared__ float s_cs[128], s_sn[128];
    __shared__ __align__(16) float s_m[HEAD_WARPS][128 * HV];
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
    const int64_t t = blockIdx.x / n_chunk;
    const int hh = (int)(blockIdx.x % n_chunk) * HEAD_WARPS + wi;
    const bool active = hh < n_a + n_b, is_b = hh >= n_a;
    const int h = is_b ? hh - n_a : hh;
    float *p = !active ? a : is_b ? b + (t * n_b + h) * head_dim : a + (t * n_a + h) * head_dim;
    const float *w = is_b ? w_b : w_a;
    const float4 one = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
    float4 x[HV], wv[HV], vv[HV];
    if (active) { /* every load of the head first */
#pragma unroll
        for (int u = 0; u < HV; u++) {
            x[u] = ld_quad<VEC>(p, lane + 32 * u, head_dim);
            wv[u] = NORM && w ? ld_quad<VEC>(w, lane + 32 * u, head_dim) : one;
            if (KV && is_b) vv[u] = ld_quad<VEC>(v + (t * n_b + h) * head_dim, lane + 32 * u, head_dim);
        }
    }
    int32_t pt = 0;
    if (ROPE || KV) pt = pos[t];
    if (ROPE) {
        for (int i = threadIdx.x; i < n_rot / 2; i += 32 * HEAD_WARPS) rope_cs(pt, fr.f[i], &s_cs[i], &s_sn[i]);
    }
    if (NORM && active) {
        float ss = 0.0f;
#pragma unroll
        for (int u = 0; u < HV; u++) ss = quad_ss(x[u], ss);
        ss = warp_sum(ss);
        const float scale = 1.0f / sqrtf(ss / (float)head_dim + eps);
#pragma unroll
        for (int u = 0; u < HV; u++) x[u] = quad_norm(x[u], scale, wv[u], w != nullptr);
    }
    if (ROPE) {
        float *m = s_m[wi];
        if (active) {
#pragma unroll
            for (int u = 0; u < HV; u++) *(float4 *)(m + 4 * (lane + 32 * u)) = x[u];
        }
        __syncthreads(); /* the angle table and every warp's head */
        if (!active) return;
        const int half = n_rot / 2;
#pragma unroll
        for (int u = 0; u < HV; u++) {
            const int i0 = 4 * (lane + 32 * u);
            float y[4];
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int i = i0 + c;
                if (i < half) y[c] = rot_lo(m[i], m[i + half], s_cs[i], s_sn[i]);
                else if (i < n_rot) y[c] = rot_hi(m[i - half], m[i], s_cs[i - half], s_sn[i - half]);
                else y[c] = quad_at(x[u], c);
            }
            x[u] = make_float4(y[0], y[1], y[2], y[3]);
        }
    }
    if (!active) return;
#pragma unroll
    for (int u = 0; u < HV; u++) st_quad<VEC>(p, lane + 32 * u, head_dim, x[u]);
    if (KV && is_b) {
        const int64_t dst = ((int64_t)h * n_ctx + pt) * head_dim;
#pragma unroll
        for (int u = 0; u < HV; u++) {
            st_quad_f16<VEC>(kc + dst, lane + 32 * u, head_dim, x[u]);
            st_quad_f16<VEC>(vc + dst, lane + 32 * u, head_dim, vv[u]);
        }
    }
}

/* Launch k_heads over n_tok tokens; false when the shape is not the kernel's (head_dim > 256, or a
 * grid too large): the caller falls back to the pre-rewrite kernels. */
template <bool NORM, bool ROPE, bool KV>
static bool launch_heads(cudaStream_t st, float *a, float *b, const float *v, const float *w_a, const float *w_b,
                         int64_t n_tok, int n_a, int n_b, int head_dim, int n_rot, const int32_t *pos,
                         double theta_base, float eps, uint16_t *kc, uint16_t *vc, int64_t n_ctx) {
    if (head_dim > 256) return false;
    const int n_chunk = (n_a + n_b + HEAD_WARPS - 1) / HEAD_WARPS;
    if (n_tok * n_chunk >= (1ll << 31)) return false;
    const bool vec = head_dim % 4 == 0 && al16(a) && (!n_b || al16(b)) && (!KV || (al16(v) && (uintptr_t)kc % 8 == 0 &&
                     (uintptr_t)vc % 8 == 0)) && (!NORM || ((!w_a || al16(w_a)) && (!w_b || al16(w_b))));
    const unsigned nb = (unsigned)(n_tok * n_chunk);
    rope_freqs fr;
    if (ROPE) rope_freqs_host(&fr, theta_base, n_rot);
    else memset(&fr, 0, sizeof fr);
#define HM_HEADS(HV, VE)                                                                                       \
    k_heads<HV, VE, NORM, ROPE, KV><<<nb, 32 * HEAD_WARPS, 0, st>>>(a, b, v, w_a, w_b, n_a, n_b, head_dim, n_rot, \
                                                                   n_chunk, pos, fr, eps, kc, vc, n_ctx)
    if (head_dim <= 128) {
        if (vec) HM_HEADS(1, true);
        else HM_HEADS(1, false);
    } else {
        if (vec) HM_HEADS(2, true);
        else HM_HEADS(2, false);
    }
#undef HM_HEADS
    return true;
}

/* ---- RMSNorm (pre-rewrite kernels: the OLD test hook and shapes the new ones do not take) ---- */

__global__ void k_rmsnorm(const float *x, const float *w, float *out, int64_t n, float eps) {
    __shared__ float sh[32];
    const float *xr = x + (int64_t)blockIdx.x * n;
    float *orow = out + (int64_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, sh);
    const float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) orow[i] = w ? xr[i] * scale * w[i] : xr[i] * scale;
}

/* one warp per (token, head) segment of head_dim */
__global__ void k_rmsnorm_heads(float *x, const float *w, int64_t n_seg, int head_dim, float eps) {
    const int64_t s = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (s >= n_seg) return;
    float *p = x + s * head_dim;
    float ss = 0.0f;
    for (int i = lane; i < head_dim; i += 32) ss += p[i] * p[i];
    ss = warp_sum(ss);
    const float scale = 1.0f / sqrtf(ss / (float)head_dim + eps);
    for (int i = lane; i < head_dim; i += 32) p[i] = w ? p[i] * scale * w[i] : p[i] * scale;
}

hm_status hm_cuda_rmsnorm(hm_cuda_ctx *c, const float *x, const float *w, float *out,
                          int64_t n_rows, int64_t n, float eps, hm_err *err) {
    HM_CU_ARG(x && out && n > 0 && n_rows >= 0 && n_rows < (1ll << 31));
    if (!n_rows) return HM_OK;
    if (c->kern == HM_CUDA_KERN_OLD) k_rmsnorm<<<(unsigned)n_rows, 256, 0, c->compute>>>(x, w, out, n, eps);
    else launch_rows<false>(c->compute, (float *)x, NULL, w, out, n_rows, n, eps);
    HM_CU_LAUNCH("rmsnorm");
    return HM_OK;
}

hm_status hm_cuda_rmsnorm_heads(hm_cuda_ctx *c, float *x, const float *w, int64_t n_tok,
                                int n_head, int head_dim, float eps, hm_err *err) {
    HM_CU_ARG(x && n_head > 0 && head_dim > 0 && n_tok >= 0);
    const int64_t n_seg = n_tok * n_head;
    if (!n_seg) return HM_OK;
    if (c->kern == HM_CUDA_KERN_OLD || !launch_heads<true, false, false>(c->compute, x, NULL, NULL, w, NULL, n_tok,
                                                                          n_head, 0, head_dim, 0, NULL, 0.0, eps,
                                                                          NULL, NULL, 0))
        k_rmsnorm_heads<<<hm_cu_blocks(n_seg, 4), 128, 0, c->compute>>>(x, w, n_seg, head_dim, eps);
    HM_CU_LAUNCH("rmsnorm_heads");
    return HM_OK;
}

/* ---- RoPE NEOX: one thread per (token, head, i < n_rot/2) ---- */

__global__ void k_rope_neox(float *x, int64_t n, int n_head, int head_dim, int n_rot,
                            const int32_t *pos, double theta_base) {
    const int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= n) return;
    const int half = n_rot / 2;
    const int i = (int)(id % half);
    const int64_t th = id / half; /* token * n_head + head */
    const int64_t t = th / n_head;
    const double a = (double)pos[t] * pow(theta_base, -2.0 * i / n_rot);
    double sd, cd;
    sincos(a, &sd, &cd);
    const float cs = (float)cd, sn = (float)sd;
    float *v = x + th * head_dim;
    const float x0 = v[i], x1 = v[i + half];
    v[i] = x0 * cs - x1 * sn;
    v[i + half] = x0 * sn + x1 * cs;
}

hm_status hm_cuda_rope_neox(hm_cuda_ctx *c, float *x, int64_t n_tok, int n_head, int head_dim,
                            int n_rot, const int32_t *pos, float theta_base, hm_err *err) {
    HM_CU_ARG(x && pos && n_rot > 0 && n_rot % 2 == 0 && n_rot <= head_dim && n_head > 0);
    const int64_t n = n_tok * n_head * (n_rot / 2);
    if (!n) return HM_OK;
    if (c->kern == HM_CUDA_KERN_OLD || !launch_heads<false, true, false>(c->compute, x, NULL, NULL, NULL, NULL, n_tok,
                                                                          n_head, 0, head_dim, n_rot, pos,
                                                                          (double)theta_base, 0.0f, NULL, NULL, 0))
        k_rope_neox<<<hm_cu_blocks(n, 256), 256, 0, c->compute>>>(x, n, n_head, head_dim, n_rot, pos,
                                                                 (double)theta_base);
    HM_CU_LAUNCH("rope");
    return HM_OK;
}

/* ---- elementwise ---- */

enum { EW_ADD, EW_MUL, EW_SCALE, EW_SWIGLU };

template <int OP>
__global__ void k_ew(const float *a, const float *b, float s, float *out, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float av = a[i];
        if (OP == EW_ADD) out[i] = av + b[i];
        else if (OP == EW_MUL) out[i] = av * b[i];
        else if (OP == EW_SCALE) out[i] = av * s;
        else out[i] = av / (1.0f + expf(-av)) * b[i];
    }
}

template <int OP>
static hm_status ew_run(hm_cuda_ctx *c, const float *a, const float *b, float s, float *out,
                        int64_t n, hm_err *err) {
    HM_CU_ARG(a && out && n >= 0 && (OP == EW_SCALE || b));
    if (!n) return HM_OK;
    const int64_t nb = (n + 255) / 256;
    k_ew<OP><<<(unsigned)(nb < 65536 ? nb : 65536), 256, 0, c->compute>>>(a, b, s, out, n);
    HM_CU_LAUNCH("elementwise");
    return HM_OK;
}

hm_status hm_cuda_add(hm_cuda_ctx *c, const float *a, const float *b, float *out, int64_t n, hm_err *err) {
    return ew_run<EW_ADD>(c, a, b, 0.0f, out, n, err);
}
hm_status hm_cuda_mul(hm_cuda_ctx *c, const float *a, const float *b, float *out, int64_t n, hm_err *err) {
    return ew_run<EW_MUL>(c, a, b, 0.0f, out, n, err);
}
hm_status hm_cuda_scale(hm_cuda_ctx *c, const float *a, float s, float *out, int64_t n, hm_err *err) {
    return ew_run<EW_SCALE>(c, a, NULL, s, out, n, err);
}
hm_status hm_cuda_swiglu(hm_cuda_ctx *c, const float *gate, const float *up, float *out, int64_t n,
                         hm_err *err) {
    return ew_run<EW_SWIGLU>(c, gate, up, 0.0f, out, n, err);
}

/* ---- softmax ---- */

__global__ void k_softmax(float *x, int64_t n) {
    __shared__ float sh[32];
    float *r = x + (int64_t)blockIdx.x * n;
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, r[i]);
    m = block_max(m, sh);
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float e = expf(r[i] - m);
        r[i] = e;
        s += e;
    }
    s = block_sum(s, sh);
    const float inv = 1.0f / s;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) r[i] *= inv;
}

hm_status hm_cuda_softmax(hm_cuda_ctx *c, float *x, int64_t n_rows, int64_t n, hm_err *err) {
    HM_CU_ARG(x && n > 0 && n_rows >= 0 && n_rows < (1ll << 31));
    if (!n_rows) return HM_OK;
    k_softmax<<<(unsigned)n_rows, 256, 0, c->compute>>>(x, n);
    HM_CU_LAUNCH("softmax");
    return HM_OK;
}

/* ---- router: one warp per token; probabilities in shared memory, k rounds of warp argmax ---- */

__global__ void __launch_bounds__(32) k_router(const float *logits, int n_expert, int k, int renorm,
                                               int32_t *ids, float *weights) {
    __shared__ float p[1024];
    const int lane = threadIdx.x;
    const int64_t t = blockIdx.x;
    const float *l = logits + t * n_expert;
    float m = -INFINITY;
    for (int e = lane; e < n_expert; e += 32) m = fmaxf(m, l[e]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float s = 0.0f;
    for (int e = lane; e < n_expert; e += 32) {
        p[e] = expf(l[e] - m);
        s += p[e];
    }
    s = warp_sum(s);
    const float inv = 1.0f / s;
    float wsum = 0.0f, wk = 0.0f;
    int idk = 0;
    for (int j = 0; j < k; j++) {
        float best = -1.0f;
        int bi = 0x7fffffff;
        for (int e = lane; e < n_expert; e += 32) {
            const float v = p[e] * inv;
            if (v > best) { best = v; bi = e; } /* ascending e: first max per lane is the lowest id */
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ob > best || (ob == best && oi < bi)) { best = ob; bi = oi; }
        }
        if (lane == j) { wk = best; idk = bi; }
        wsum += best;
        __syncwarp();
        if (lane == 0) p[bi] = -INFINITY; /* taken */
        __syncwarp();
    }
    if (lane < k) {
        ids[t * k + lane] = idk;
        weights[t * k + lane] = renorm ? wk / wsum : wk;
    }
}

/* The default router: one warp per token, 4 a block, the row in registers. Lane l holds quads
 * l + 32 j (experts 4(l + 32 j) .. +3), j < NQ. The max goes through one warp-wide integer max of
 * order-preserving bit patterns; each of the k rounds is a scan of the lane's own registers (ascending
 * ids, strict >: a lane's first max is its lowest id) and two warp-wide integer reductions: the
 * largest key, then the lowest id holding it. Keys are a probability's bits + 1 (order-preserving
 * for p >= 0); 0 marks a taken expert or padding past n_expert. */
__device__ __forceinline__ uint32_t warp_max_u32(uint32_t u) {
#if __CUDA_ARCH__ >= 800
    return __reduce_max_sync(0xffffffffu, u);
#else
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) u = max(u, __shfl_xor_sync(0xffffffffu, u, o));
    return u;
#endif
}
__device__ __forceinline__ uint32_t warp_min_u32(uint32_t u) {
#if __CUDA_ARCH__ >= 800
    return __reduce_min_sync(0xffffffffu, u);
#else
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) u = min(u, __shfl_xor_sync(0xffffffffu, u, o));
    return u;
#endif
}
__device__ __forceinline__ float warp_max_f(float v) {
    uint32_t u = __float_as_uint(v);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    u = warp_max_u32(u);
    return __uint_as_float((u & 0x80000000u) ? (u & 0x7fffffffu) : ~u);
}

template <int NQ, bool VEC>
__global__ void __launch_bounds__(128) k_router_q(const float *logits, int64_t n_tok, int n_expert, int k, int renorm,
                                                  int32_t *ids, float *weights) {
    const int lane = threadIdx.x & 31;
    const int64_t t = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
    if (t >= n_tok) return; /* the whole warp */
    const float *l = logits + t * n_expert;
    float e[NQ][4];
#pragma unroll
    for (int j = 0; j < NQ; j++) {
        const float4 v = ld_quad<VEC>(l, lane + 32 * j, n_expert, -INFINITY);
        e[j][0] = v.x; e[j][1] = v.y; e[j][2] = v.z; e[j][3] = v.w;
    }
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < NQ; j++)
#pragma unroll
        for (int c = 0; c < 4; c++) m = fmaxf(m, e[j][c]);
    m = warp_max_f(m);
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < NQ; j++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            e[j][c] = expf(e[j][c] - m); /* padding: expf(-inf) = 0 */
            s += e[j][c];
        }
    s = warp_sum(s);
    const float inv = 1.0f / s;
    uint32_t key[NQ][4];
#pragma unroll
    for (int j = 0; j < NQ; j++)
#pragma unroll
        for (int c = 0; c < 4; c++)
            key[j][c] = 4 * (lane + 32 * j) + c < n_expert ? __float_as_uint(e[j][c] * inv) + 1u : 0u;
    float wsum = 0.0f, wk = 0.0f;
    int idk = 0;
    for (int r = 0; r < k; r++) {
        uint32_t best = 0u, bi = 0xffffffffu;
#pragma unroll
        for (int j = 0; j < NQ; j++)
#pragma unroll
            for (int c = 0; c < 4; c++)
                if (key[j][c] > best) {
                    best = key[j][c];
                    bi = (uint32_t)(4 * (lane + 32 * j) + c);
                }
        const uint32_t mk = warp_max_u32(best);
        const uint32_t sel = warp_min_u32(best == mk ? bi : 0xffffffffu);
        const float pv = __uint_as_float(mk - 1u);
        if (lane == r) {
            wk = pv;
            idk = (int)sel;
        }
        wsum += pv;
#pragma unroll
        for (int j = 0; j < NQ; j++)
#pragma unroll
            for (int c = 0; c < 4; c++)
                if ((uint32_t)(4 * (lane + 32 * j) + c) == sel) key[j][c] = 0u; /* taken */
    }
    if (lane < k) {
        ids[t * k + lane] = idk;
        weights[t * k + lane] = renorm ? wk / wsum : wk;
    }
}

hm_status hm_cuda_router(hm_cuda_ctx *c, const float *logits, int64_t n_tok, int n_expert, int k,
                         bool renorm, int32_t *ids, float *weights, hm_err *err) {
    HM_CU_ARG(logits && ids && weights && n_expert >= 1 && n_expert <= 1024 && k >= 1 &&
              k <= 32 && k <= n_expert && n_tok >= 0 && n_tok < (1ll << 31));
    if (!n_tok) return HM_OK;
    const int rn = renorm ? 1 : 0;
    if (c->kern == HM_CUDA_KERN_OLD) {
        k_router<<<(unsigned)n_tok, 32, 0, c->compute>>>(logits, n_expert, k, rn, ids, weights);
    } else {
        const unsigned nb = hm_cu_blocks(n_tok, 4);
        const bool vec = n_expert % 4 == 0 && al16(logits);
        const int nq = (n_expert + 127) / 128;
#define HM_ROUTER(NQ)                                                                                              do {                                                                                                               if (vec) k_router_q<NQ, true><<<nb, 128, 0, c->compute>>>(logits, n_tok, n_expert, k, rn, ids, weights);         else k_router_q<NQ, false><<<nb, 128, 0, c->compute>>>(logits, n_tok, n_expert, k, rn, ids, weights);       } while (0)
        if (nq <= 1) HM_ROUTER(1);
        else if (nq <= 2) HM_ROUTER(2);
        else if (nq <= 4) HM_ROUTER(4);
        else HM_ROUTER(8);
#undef HM_ROUTER
    }
    HM_CU_LAUNCH("router");
    return HM_OK;
}

/* ---- get_rows: one thread per group of 8 elements ---- */

template <int T>
__global__ void k_get_rows(const uint8_t *__restrict__ tab, size_t nb1, int64_t ne0, const int32_t *ids,
                           int64_t n_ids, float *out) {
    const int64_t ng = ne0 / 8;
    const int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= n_ids * ng) return;
    const int64_t i = id / ng, g = id % ng;
    float v[8];
    deq8<T>(tab + (int64_t)ids[i] * nb1, g, v);
    float4 *o = (float4 *)(out + i * ne0 + 8 * g);
    o[0] = make_float4(v[0], v[1], v[2], v[3]);
    o[1] = make_float4(v[4], v[5], v[6], v[7]);
}

hm_status hm_cuda_get_rows(hm_cuda_ctx *c, const hm_cuda_mat *table, const int32_t *ids,
                           int64_t n_ids, float *out, hm_err *err) {
    hm_status st = hm_cuda_mat_check(table, err);
    if (st) return st;
    HM_CU_ARG(ids && out && n_ids >= 0 && (uintptr_t)out % 16 == 0);
    const int64_t n = n_ids * (table->ne0 / 8);
    if (!n) return HM_OK;
    const unsigned nb = hm_cu_blocks(n, 256);
    const uint8_t *d = (const uint8_t *)table->data;
    switch (table->type) {
#define HM_GR_CASE(T) case T: k_get_rows<T><<<nb, 256, 0, c->compute>>>(d, table->nb1, table->ne0, ids, n_ids, out); break;
        HM_CUDA_FOR_TYPES(HM_GR_CASE)
#undef HM_GR_CASE
    default: return hm_errf(err, HM_ERR_UNSUPPORTED, "cuda get_rows: type %d", table->type);
    }
    HM_CU_LAUNCH("get_rows");
    return HM_OK;
}

template <int T>
static void dequant_host(const void *row, int64_t ne0, float *out) {
    for (int64_t g = 0; g < ne0 / 8; g++) deq8<T>((const uint8_t *)row, g, out + 8 * g);
}

hm_status hm_cuda_dequant_row_host(int type, const void *row, int64_t ne0, float *out, hm_err *err) {
    HM_CU_ARG(row && out && ne0 % 32 == 0);
    switch (type) {
#define HM_DQ_CASE(T) case T: dequant_host<T>(row, ne0, out); return HM_OK;
        HM_CUDA_FOR_TYPES(HM_DQ_CASE)
#undef HM_DQ_CASE
    default: return hm_errf(err, HM_ERR_UNSUPPORTED, "cuda: no decoder for type %s", hm_type_name(type));
    }
}

/* ---- KV write: one thread per element of K and V ---- */

__global__ void k_kv_write(uint16_t *kc, uint16_t *vc, int64_t n_ctx, int n_kv_head, int head_dim,
                           const float *k, const float *v, int64_t n, const int32_t *pos) {
    const int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= n) return;
    const int d = (int)(id % head_dim);
    const int64_t th = id / head_dim;
    const int h = (int)(th % n_kv_head);
    const int64_t t = th / n_kv_head;
    const int64_t dst = ((int64_t)h * n_ctx + pos[t]) * head_dim + d;
    kc[dst] = __half_as_ushort(__float2half_rn(k[id]));
    vc[dst] = __half_as_ushort(__float2half_rn(v[id]));
}

hm_status hm_cuda_kv_write(hm_cuda_ctx *c, uint16_t *k_cache, uint16_t *v_cache, int64_t n_ctx,
                           int n_kv_head, int head_dim, const float *k, const float *v,
                           int64_t n_tok, const int32_t *pos, hm_err *err) {
    HM_CU_ARG(k_cache && v_cache && k && v && pos && n_kv_head > 0 && head_dim > 0 && n_ctx > 0);
    const int64_t n = n_tok * n_kv_head * head_dim;
    if (n <= 0) return HM_OK;
    k_kv_write<<<hm_cu_blocks(n, 256), 256, 0, c->compute>>>(k_cache, v_cache, n_ctx, n_kv_head,
                                                           head_dim, k, v, n, pos);
    HM_CU_LAUNCH("kv_write");
    return HM_OK;
}

/* ---- fused decode ops (one launch for what took several) ---- */

/* x[r] += h[r]; out[r] = rmsnorm(x[r]) * w. A thread reads h[i] and writes x[i] and out[i] for the
 * same i, so out may alias h. */
__global__ void k_add_rmsnorm(float *x, const float *h, const float *w, float *out, int64_t n, float eps) {
    __shared__ float sh[32];
    float *xr = x + (int64_t)blockIdx.x * n;
    const float *hr = h + (int64_t)blockIdx.x * n;
    float *orow = out + (int64_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = xr[i] + hr[i];
        xr[i] = v;
        ss += v * v;
    }
    ss = block_sum(ss, sh);
    const float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) orow[i] = w ? xr[i] * scale * w[i] : xr[i] * scale;
}

hm_status hm_cuda_add_rmsnorm(hm_cuda_ctx *c, float *x, const float *h, const float *w, float *out,
                              int64_t n_rows, int64_t n, float eps, hm_err *err) {
    HM_CU_ARG(x && h && out && n > 0 && n_rows >= 0 && n_rows < (1ll << 31));
    if (!n_rows) return HM_OK;
    if (c->kern == HM_CUDA_KERN_OLD) k_add_rmsnorm<<<(unsigned)n_rows, 256, 0, c->compute>>>(x, h, w, out, n, eps);
    else launch_rows<true>(c->compute, x, h, w, out, n_rows, n, eps);
    HM_CU_LAUNCH("add_rmsnorm");
    return HM_OK;
}

/* One warp per (token, head) of q's n_head then k's n_kv_head heads: the head's RMSNorm, RoPE NEOX
 * (the same expressions as k_rmsnorm_heads and k_rope_neox, so the results are theirs), and for a
 * k head the K and V rows into the cache. The head goes through shared memory between the norm
 * and the rotation (a lane rotates pairs it did not normalise). */
__global__ void __launch_bounds__(128) k_qk_norm_rope_kv(float *q, float *k, const float *v, const float *q_norm,
                                                         const float *k_norm, int64_t n_tok, int n_head,
                                                         int n_kv_head, int head_dim, int n_rot,
                                                         const int32_t *pos, double theta_base, float eps,
                                                         uint16_t *kc, uint16_t *vc, int64_t n_ctx) {
    __shared__ float sh[4][256];
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
    const int nhh = n_head + n_kv_head;
    const int64_t s = (int64_t)blockIdx.x * 4 + wi;
    if (s >= n_tok * nhh) return;
    const int64_t t = s / nhh;
    const int hh = (int)(s % nhh);
    const bool is_k = hh >= n_head;
    const int h = is_k ? hh - n_head : hh;
    float *p = is_k ? k + (t * n_kv_head + h) * head_dim : q + (t * n_head + h) * head_dim;
    const float *w = is_k ? k_norm : q_norm;
    float *m = sh[wi];
    float ss = 0.0f;
    for (int i = lane; i < head_dim; i += 32) ss += p[i] * p[i];
    ss = warp_sum(ss);
    const float scale = 1.0f / sqrtf(ss / (float)head_dim + eps);
    for (int i = lane; i < head_dim; i += 32) m[i] = w ? p[i] * scale * w[i] : p[i] * scale;
    __syncwarp();
    const int half = n_rot / 2;
    for (int i = lane; i < half; i += 32) {
        const double a = (double)pos[t] * pow(theta_base, -2.0 * i / n_rot);
        double sd, cd;
        sincos(a, &sd, &cd);
        const float cs = (float)cd, sn = (float)sd;
        const float x0 = m[i], x1 = m[i + half];
        m[i] = x0 * cs - x1 * sn;
        m[i + half] = x0 * sn + x1 * cs;
    }
    __syncwarp();
    for (int i = lane; i < head_dim; i += 32) p[i] = m[i];
    if (!is_k) return;
    const int64_t dst = ((int64_t)h * n_ctx + pos[t]) * head_dim;
    const float *vr = v + (t * n_kv_head + h) * head_dim;
    for (int i = lane; i < head_dim; i += 32) {
        kc[dst + i] = __half_as_ushort(__float2half_rn(m[i]));
        vc[dst + i] = __half_as_ushort(__float2half_rn(vr[i]));
    }
}

hm_status hm_cuda_qk_norm_rope_kv(hm_cuda_ctx *c, float *q, float *k, const float *v, const float *q_norm,
                                  const float *k_norm, int64_t n_tok, int n_head, int n_kv_head,
                                  int head_dim, int n_rot, const int32_t *pos, float theta_base, float eps,
                                  uint16_t *k_cache, uint16_t *v_cache, int64_t n_ctx, hm_err *err) {
    HM_CU_ARG(q && k && v && pos && k_cache && v_cache && n_head > 0 && n_kv_head > 0 && n_ctx > 0);
    HM_CU_ARG(head_dim > 0 && head_dim <= 256 && n_rot > 0 && n_rot % 2 == 0 && n_rot <= head_dim);
    HM_CU_ARG(n_tok >= 0 && n_tok < (1ll << 24));
    const int64_t n_seg = n_tok * (n_head + n_kv_head);
    if (!n_seg) return HM_OK;
    if (c->kern != HM_CUDA_KERN_OLD &&
        launch_heads<true, true, true>(c->compute, q, k, v, q_norm, k_norm, n_tok, n_head, n_kv_head, head_dim, n_rot,
                                       pos, (double)theta_base, eps, k_cache, v_cache, n_ctx)) {
        HM_CU_LAUNCH("qk_norm_rope_kv");
        return HM_OK;
    }
    k_qk_norm_rope_kv<<<hm_cu_blocks(n_seg, 4), 128, 0, c->compute>>>(q, k, v, q_norm, k_norm, n_tok, n_head,
                                                                     n_kv_head, head_dim, n_rot, pos,
                                                                     (double)theta_base, eps, k_cache, v_cache,
                                                                     n_ctx);
    HM_CU_LAUNCH("qk_norm_rope_kv");
    return HM_OK;
}
