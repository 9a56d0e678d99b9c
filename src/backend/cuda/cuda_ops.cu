/* cuda_ops.cu - the row and elementwise ops: RMSNorm (whole rows and per head), RoPE NEOX,
 * add/mul/scale/SwiGLU, row softmax, the softmax + top-k router, embedding lookup (dequantising
 * get_rows) and the KV-cache write.
 *
 * Row ops give each row to one block (or one warp for short rows) and reduce in a fixed tree, so
 * results are deterministic. Numerics follow the CPU ops: f32 sums, expf, angles in double. */
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

/* ---- RMSNorm ---- */

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
    k_rmsnorm<<<(unsigned)n_rows, 256, 0, c->compute>>>(x, w, out, n, eps);
    HM_CU_LAUNCH("rmsnorm");
    return HM_OK;
}

hm_status hm_cuda_rmsnorm_heads(hm_cuda_ctx *c, float *x, const float *w, int64_t n_tok,
                                int n_head, int head_dim, float eps, hm_err *err) {
    HM_CU_ARG(x && n_head > 0 && head_dim > 0 && n_tok >= 0);
    const int64_t n_seg = n_tok * n_head;
    if (!n_seg) return HM_OK;
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

hm_status hm_cuda_router(hm_cuda_ctx *c, const float *logits, int64_t n_tok, int n_expert, int k,
                         bool renorm, int32_t *ids, float *weights, hm_err *err) {
    HM_CU_ARG(logits && ids && weights && n_expert >= 1 && n_expert <= 1024 && k >= 1 &&
              k <= 32 && k <= n_expert && n_tok >= 0 && n_tok < (1ll << 31));
    if (!n_tok) return HM_OK;
    k_router<<<(unsigned)n_tok, 32, 0, c->compute>>>(logits, n_expert, k, renorm ? 1 : 0, ids, weights);
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
    k_add_rmsnorm<<<(unsigned)n_rows, 256, 0, c->compute>>>(x, h, w, out, n, eps);
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
    k_qk_norm_rope_kv<<<hm_cu_blocks(n_seg, 4), 128, 0, c->compute>>>(q, k, v, q_norm, k_norm, n_tok, n_head,
                                                                     n_kv_head, head_dim, n_rot, pos,
                                                                     (double)theta_base, eps, k_cache, v_cache,
                                                                     n_ctx);
    HM_CU_LAUNCH("qk_norm_rope_kv");
    return HM_OK;
}
