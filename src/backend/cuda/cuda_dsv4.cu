/* cuda_dsv4.cu - the DeepSeek-V4 ops of cuda_dsv4.h. Each kernel follows its CPU twin in
 * backend/cpu/cpu_dsv4.c expression by expression (the same float products for RoPE angles, the
 * same order of the sequential sums: the softmax's denominator and the weighted values in key
 * order, the hyper-connection sums in stream order), so results differ from the CPU's by the
 * order of the dot products' reductions (warp trees here) and the libm's last bits only. The window
 * and compressed rows are stored as f16 (hm_cuda_dsv4_layout): the values the CPU rounds to f16 and
 * keeps in f32, so every read sees the CPU's number. */
#include <cuda_fp16.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_dsv4.h"
#include "cuda_dsv4.h"
#include "cuda_impl.h"

#define DS_THREADS 128
#define DS_IDX_THREADS 256
#define DS_MAX_HD 1024

__device__ static inline float ds_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ static inline float ds_h(const __half *p, int64_t i) { return __half2float(p[i]); }

/* Pair i's angle at position p: p tscale^i as the CPU forms it (a float product per pair). */
__device__ static inline float ds_theta(int32_t p, float tscale, int i) {
    float th = (float)p;
    for (int k = 0; k < i; k++) th *= tscale;
    return th;
}

/* Rotate pair i of r (the head's tail of n_rot values) at position p. */
__device__ static inline void ds_rope_pair(float *r, int i, int32_t p, float tscale, const float *ff, bool inv) {
    const float theta = ds_theta(p, tscale, i);
    const float th = ff ? theta / ff[i] : theta;
    const float cs = cosf(th), sn = inv ? -sinf(th) : sinf(th);
    const float a = r[2 * i], b = r[2 * i + 1];
    r[2 * i] = a * cs - b * sn;
    r[2 * i + 1] = a * sn + b * cs;
}

/* ---- the layer state ---- */

size_t hm_cuda_dsv4_layout(const hm_dsv4_dims *d, int32_t ratio, int32_t n_ctx, int32_t n_ubatch, void *base,
                           hm_cuda_dsv4_state *st) {
    const int64_t hd = d->hd, ihd = d->idx_hd, S = HM_DSV4_RING, coff = ratio == 4 ? 2 : 1;
    int64_t cap = (int64_t)d->window + n_ubatch;
    if (cap > n_ctx) cap = n_ctx;
    size_t at = 0;
    char *b = (char *)base;
#define TAKE(field, T, n)                                                   \
    do {                                                                    \
        if (base) st->field = (T *)(void *)(b + at);                        \
        at += ((size_t)(n) * sizeof(T) + 255) & ~(size_t)255;               \
    } while (0)
    if (base) memset(st, 0, sizeof *st), st->cap = cap;
    TAKE(raw, uint16_t, cap * hd);
    if (ratio > 0) {
        TAKE(ckv, float, S * coff * hd);
        TAKE(csc, float, S * coff * hd);
        TAKE(comp, uint16_t, ((int64_t)n_ctx / ratio + 1) * hd);
    }
    if (ratio == 4) {
        TAKE(ikv, float, S * 2 * ihd);
        TAKE(isc, float, S * 2 * ihd);
        TAKE(icomp, uint16_t, ((int64_t)n_ctx / 4 + 1) * ihd);
    }
#undef TAKE
    return at;
}

/* ---- hyper-connections ---- */

__global__ void k_hc_expand(const float *src, float *dst, int64_t n, int64_t E, int hc) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, W = (int64_t)hc * E;
    if (i >= n * W) return;
    dst[i] = src[(i / W) * E + i % E];
}

hm_status hm_cuda_dsv4_hc_expand(hm_cuda_ctx *c, const float *src, float *dst, int64_t n, int64_t E, int hc,
                                 hm_err *err) {
    HM_CU_ARG(src && dst && src != dst && n >= 0 && E > 0 && hc >= 1);
    if (!n) return HM_OK;
    k_hc_expand<<<hm_cu_blocks(n * hc * E, 256), 256, 0, c->compute>>>(src, dst, n, E, hc);
    HM_CU_LAUNCH("dsv4_hc_expand");
    return HM_OK;
}

__device__ static inline float ds_sigm(float v) { return 1.0f / (1.0f + expf(-v)); }

/* one thread per row: hm_dsv4_hc_mix's body */
__global__ void k_hc_mix(float *m, int64_t n, int hc, bool head, const float *scale, const float *base, int iters,
                         float eps) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    const int64_t w = head ? hc : (2 + hc) * hc;
    float *r = m + t * w;
    for (int i = 0; i < hc; i++) r[i] = ds_sigm(r[i] * scale[0] + base[i]) + eps;
    if (head) return;
    for (int i = 0; i < hc; i++) r[hc + i] = 2.0f * ds_sigm(r[hc + i] * scale[1] + base[hc + i]);
    float cm[16 * 16]; /* cm[dst + hc src], in registers / local memory */
    for (int i = 0; i < hc * hc; i++) cm[i] = r[2 * hc + i] * scale[2] + base[2 * hc + i];
    for (int s = 0; s < hc; s++) {
        float mx = -INFINITY, sum = 0.0f;
        for (int dd = 0; dd < hc; dd++) mx = cm[dd + hc * s] > mx ? cm[dd + hc * s] : mx;
        for (int dd = 0; dd < hc; dd++) sum += (cm[dd + hc * s] = expf(cm[dd + hc * s] - mx));
        for (int dd = 0; dd < hc; dd++) cm[dd + hc * s] = cm[dd + hc * s] / sum + eps;
    }
    for (int it = 0; it < iters; it++) {
        if (it > 0)
            for (int s = 0; s < hc; s++) {
                float sum = 0.0f;
                for (int dd = 0; dd < hc; dd++) sum += cm[dd + hc * s];
                for (int dd = 0; dd < hc; dd++) cm[dd + hc * s] /= sum + eps;
            }
        for (int dd = 0; dd < hc; dd++) {
            float sum = 0.0f;
            for (int s = 0; s < hc; s++) sum += cm[dd + hc * s];
            for (int s = 0; s < hc; s++) cm[dd + hc * s] /= sum + eps;
        }
    }
    for (int i = 0; i < hc * hc; i++) r[2 * hc + i] = cm[i];
}

hm_status hm_cuda_dsv4_hc_mix(hm_cuda_ctx *c, float *m, int64_t n, int hc, bool head, const float *scale,
                              const float *base, int iters, float eps, hm_err *err) {
    HM_CU_ARG(m && scale && base && n >= 0 && hc >= 1 && hc <= 16 && iters >= 1);
    if (!n) return HM_OK;
    k_hc_mix<<<hm_cu_blocks(n, 64), 64, 0, c->compute>>>(m, n, hc, head, scale, base, iters, eps);
    HM_CU_LAUNCH("dsv4_hc_mix");
    return HM_OK;
}

__global__ void k_hc_reduce(const float *x, const float *pre, int64_t ps, int64_t n, int64_t E, int hc, float *y) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * E) return;
    const int64_t t = i / E, e = i % E;
    const float *xt = x + t * hc * E, *pt = pre + t * ps;
    float o = xt[e] * pt[0];
    for (int h = 1; h < hc; h++) o += xt[h * E + e] * pt[h];
    y[i] = o;
}

hm_status hm_cuda_dsv4_hc_reduce(hm_cuda_ctx *c, const float *x, const float *pre, int64_t ps, int64_t n, int64_t E,
                                 int hc, float *y, hm_err *err) {
    HM_CU_ARG(x && pre && y && n >= 0 && E > 0 && hc >= 1 && ps >= hc);
    if (!n) return HM_OK;
    k_hc_reduce<<<hm_cu_blocks(n * E, 256), 256, 0, c->compute>>>(x, pre, ps, n, E, hc, y);
    HM_CU_LAUNCH("dsv4_hc_reduce");
    return HM_OK;
}

__global__ void k_hc_post(const float *f, const float *x, const float *mix, int64_t n, int64_t E, int hc, float *out) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, W = (int64_t)hc * E;
    if (i >= n * W) return;
    const int64_t t = i / W, e = i % E;
    const int dd = (int)((i % W) / E);
    const int64_t w = (2 + (int64_t)hc) * hc;
    const float *post = mix + t * w + hc, *cm = mix + t * w + 2 * hc, *xt = x + t * W;
    float o = f[t * E + e] * post[dd];
    for (int s = 0; s < hc; s++) o += xt[s * E + e] * cm[dd + hc * s];
    out[i] = o;
}

hm_status hm_cuda_dsv4_hc_post(hm_cuda_ctx *c, const float *f, const float *x, const float *mix, int64_t n,
                               int64_t E, int hc, float *out, hm_err *err) {
    HM_CU_ARG(f && x && mix && out && out != x && n >= 0 && E > 0 && hc >= 1);
    if (!n) return HM_OK;
    k_hc_post<<<hm_cu_blocks(n * hc * E, 256), 256, 0, c->compute>>>(f, x, mix, n, E, hc, out);
    HM_CU_LAUNCH("dsv4_hc_post");
    return HM_OK;
}

__global__ void k_swiglu_clamp(const float *g, const float *u, float *out, int64_t n, float limit) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float gi = g[i] > limit ? limit : g[i];
    const float ui = u[i] > limit ? limit : u[i] < -limit ? -limit : u[i];
    out[i] = gi / (1.0f + expf(-gi)) * ui;
}

hm_status hm_cuda_swiglu_clamp(hm_cuda_ctx *c, const float *g, const float *u, float *out, int64_t n, float limit,
                               hm_err *err) {
    HM_CU_ARG(g && u && out && n >= 0 && limit > 0.0f);
    if (!n) return HM_OK;
    k_swiglu_clamp<<<hm_cu_blocks(n, 256), 256, 0, c->compute>>>(g, u, out, n, limit);
    HM_CU_LAUNCH("swiglu_clamp");
    return HM_OK;
}

/* ---- the attention's steps ---- */

__global__ void k_rope_tail(float *x, int64_t n, int n_head, int hd, int n_rot, const int32_t *pos, float tscale,
                            const float *ff, bool inv) {
    const int half = n_rot / 2;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * n_head * half) return;
    const int64_t th = i / half; /* (row, head) */
    const int j = (int)(i % half);
    ds_rope_pair(x + th * hd + (hd - n_rot), j, pos[th / n_head], tscale, ff, inv);
}

hm_status hm_cuda_dsv4_rope_tail(hm_cuda_ctx *c, float *x, int64_t n, int n_head, int hd, int n_rot,
                                 const int32_t *pos, float tscale, const float *ff, bool inv, hm_err *err) {
    HM_CU_ARG(x && pos && n >= 0 && n_head > 0 && n_rot > 0 && n_rot % 2 == 0 && n_rot <= hd);
    if (!n) return HM_OK;
    k_rope_tail<<<hm_cu_blocks(n * n_head * (n_rot / 2), 256), 256, 0, c->compute>>>(x, n, n_head, hd, n_rot, pos,
                                                                                       tscale, ff, inv);
    HM_CU_LAUNCH("dsv4_rope_tail");
    return HM_OK;
}

__global__ void k_raw_write(const float *kv, int64_t n, int hd, const int32_t *pos, __half *raw, int64_t cap) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * hd) return;
    const int64_t t = i / hd, e = i % hd;
    raw[((int64_t)pos[t] % cap) * hd + e] = __float2half_rn(kv[i]);
}

hm_status hm_cuda_dsv4_raw_write(hm_cuda_ctx *c, const float *kv, int64_t n, int hd, const int32_t *pos,
                                 uint16_t *raw, int64_t cap, hm_err *err) {
    HM_CU_ARG(kv && pos && raw && n >= 0 && hd > 0 && cap >= n);
    if (!n) return HM_OK;
    k_raw_write<<<hm_cu_blocks(n * hd, 256), 256, 0, c->compute>>>(kv, n, hd, pos, (__half *)raw, cap);
    HM_CU_LAUNCH("dsv4_raw_write");
    return HM_OK;
}

__global__ void k_comp_write(const float *a, const float *b, const float *ape, int64_t t0, int64_t nt, int64_t w,
                             int32_t r, const int32_t *pos, float *kv, float *sc) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nt * w) return;
    const int64_t t = t0 + i / w, e = i % w, p = pos[t], ro = p % HM_DSV4_RING;
    kv[ro * w + e] = a[t * w + e];
    sc[ro * w + e] = b[t * w + e] + ape[(p % r) * w + e];
}

hm_status hm_cuda_dsv4_comp_write(hm_cuda_ctx *c, const float *a, const float *b, const float *ape, int64_t t0,
                                  int64_t t1, int64_t w, int32_t r, const int32_t *pos, float *kv, float *sc,
                                  hm_err *err) {
    HM_CU_ARG(a && b && ape && pos && kv && sc && t0 >= 0 && t1 >= t0 && t1 - t0 <= HM_DSV4_BLOCK && w > 0 && r > 0);
    if (t1 == t0) return HM_OK;
    k_comp_write<<<hm_cu_blocks((t1 - t0) * w, 256), 256, 0, c->compute>>>(a, b, ape, t0, t1 - t0, w, r, pos, kv, sc);
    HM_CU_LAUNCH("dsv4_comp_write");
    return HM_OK;
}

/* one block per row t0 + blockIdx.x; o: dynamic shared [dim] */
__global__ void k_compress(const float *kv, const float *sc, int64_t w, int32_t r, bool overlap, int64_t dim,
                           const float *norm, int n_rot, float tscale, const float *ff, float eps, const int32_t *pos,
                           int64_t t0, __half *out) {
    extern __shared__ float o[];
    __shared__ double part[DS_THREADS];
    const int64_t p = pos[t0 + blockIdx.x];
    if ((p + 1) % r) return; /* the whole block: no block ends here */
    const int64_t b = p / r, start = b * r, S = HM_DSV4_RING;
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
        float mx = -INFINITY;
        for (int pass = 0; pass < 2; pass++) {
            float sum = 0.0f, acc = 0.0f;
            for (int half = overlap ? 0 : 1; half < 2; half++) {
                const int64_t p0 = half == 0 ? start - r : start, col = overlap && half == 1 ? dim + d : d;
                for (int64_t j = 0; j < r; j++) {
                    const int64_t q = p0 + j;
                    if (q < 0) continue;
                    const float s = sc[(q % S) * w + col];
                    if (pass == 0) {
                        if (s > mx) mx = s;
                    } else {
                        const float e = expf(s - mx);
                        sum += e;
                        acc += e * kv[(q % S) * w + col];
                    }
                }
            }
            if (pass == 1) o[d] = acc / sum;
        }
    }
    __syncthreads();
    /* rmsnorm_row: the sum of squares in double as the CPU's */
    double ss = 0;
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) ss += (double)o[d] * o[d];
    part[threadIdx.x] = ss;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    const float scl = 1.0f / sqrtf((float)(part[0] / (double)dim) + eps);
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) o[d] = o[d] * scl * norm[d];
    __syncthreads();
    for (int j = threadIdx.x; j < n_rot / 2; j += blockDim.x)
        ds_rope_pair(o + dim - n_rot, j, (int32_t)start, tscale, ff, false);
    __syncthreads();
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) out[b * dim + d] = __float2half_rn(o[d]);
}

hm_status hm_cuda_dsv4_compress(hm_cuda_ctx *c, const float *kv, const float *sc, int64_t w, int32_t r, bool overlap,
                                int64_t dim, const float *norm, int n_rot, float tscale, const float *ff, float eps,
                                const int32_t *pos, int64_t t0, int64_t t1, uint16_t *out, hm_err *err) {
    HM_CU_ARG(kv && sc && norm && pos && out && r > 0 && dim > 0 && dim <= DS_MAX_HD && w >= (overlap ? 2 : 1) * dim);
    HM_CU_ARG(n_rot > 0 && n_rot % 2 == 0 && n_rot <= dim && t0 >= 0 && t1 >= t0 && t1 - t0 <= HM_DSV4_BLOCK);
    if (t1 == t0) return HM_OK;
    k_compress<<<(unsigned)(t1 - t0), DS_THREADS, (size_t)dim * sizeof(float), c->compute>>>(
        kv, sc, w, r, overlap, dim, norm, n_rot, tscale, ff, eps, pos, t0, (__half *)out);
    HM_CU_LAUNCH("dsv4_compress");
    return HM_OK;
}

/* (score, index) of the better candidate: a valid one (index >= 0), the higher score, ties the
 * lower index (the CPU's first maximum). */
__device__ static inline void ds_better(float &s, int &i, float s2, int i2) {
    if (i2 < 0) return;
    if (i < 0 || s2 > s || (s2 == s && i2 < i)) s = s2, i = i2;
}

/* one block per row t0 + blockIdx.x; the scores in dynamic shared memory when the launch gave it
 * room for n_cmp_max of them (the k passes then read no global memory), else in scores */
__global__ void __launch_bounds__(DS_IDX_THREADS) k_index(const float *iq, const float *iw, const __half *icomp,
                                                          const int32_t *pos, int64_t t0, int ih, int ihd, int topk,
                                                          float *scores, int64_t n_cmp_max, bool in_smem,
                                                          int32_t *sel, int32_t *n_sel) {
    extern __shared__ float sc_sm[];
    __shared__ float bs_w[DS_IDX_THREADS / 32];
    __shared__ int bi_w[DS_IDX_THREADS / 32];
    const int64_t t = t0 + blockIdx.x;
    const int64_t n_vis = ((int64_t)pos[t] + 1) / 4;
    int32_t *st = sel + t * topk;
    if (n_vis <= topk) {
        for (int64_t b = threadIdx.x; b < n_vis; b += blockDim.x) st[b] = (int32_t)b;
        if (threadIdx.x == 0) n_sel[t] = (int32_t)n_vis;
        return;
    }
    float *sc = in_smem ? sc_sm : scores + (int64_t)blockIdx.x * n_cmp_max;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int64_t b = warp; b < n_vis; b += nw) {
        const __half *kb = icomp + b * ihd;
        float s = 0.0f;
        for (int h = 0; h < ih; h++) {
            const float *qh = iq + (t * ih + h) * ihd;
            float dot = 0.0f;
            for (int i = lane; i < ihd; i += 32) dot += qh[i] * ds_h(kb, i);
            dot = ds_warp_sum(dot);
            s += (dot > 0.0f ? dot : 0.0f) * iw[t * ih + h];
        }
        if (lane == 0) sc[b] = s;
    }
    __syncthreads();
    for (int k = 0; k < topk; k++) { /* k passes of a max, as the CPU's */
        float bs = 0.0f;
        int bi = -1;
        for (int64_t b = threadIdx.x; b < n_vis; b += blockDim.x)
            if (sc[b] != -INFINITY) ds_better(bs, bi, sc[b], (int)b);
        for (int o = 16; o > 0; o >>= 1) {
            const float s2 = __shfl_xor_sync(0xffffffffu, bs, o);
            const int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
            ds_better(bs, bi, s2, i2);
        }
        if (lane == 0) bs_w[warp] = bs, bi_w[warp] = bi;
        __syncthreads();
        if (threadIdx.x == 0) {
            float s = bs_w[0];
            int i = bi_w[0];
            for (int w = 1; w < nw; w++) ds_better(s, i, bs_w[w], bi_w[w]);
            st[k] = i;
            if (i >= 0) sc[i] = -INFINITY;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) n_sel[t] = topk;
}

hm_status hm_cuda_dsv4_index(hm_cuda_ctx *c, const float *iq, const float *iw, const uint16_t *icomp,
                             const int32_t *pos, int64_t t0, int64_t t1, int ih, int ihd, int topk,
                             float *scores, int64_t n_cmp_max, int32_t *sel, int32_t *n_sel, hm_err *err) {
    HM_CU_ARG(iq && iw && icomp && pos && scores && sel && n_sel && ih > 0 && ihd > 0 && topk > 0);
    HM_CU_ARG(t0 >= 0 && t1 >= t0 && t1 - t0 < (1ll << 31) && n_cmp_max > 0);
    if (t1 == t0) return HM_OK;
    const bool in_smem = n_cmp_max <= HM_CUDA_DSV4_IDX_SMEM; /* 44 KiB: a context of 45k */
    k_index<<<(unsigned)(t1 - t0), DS_IDX_THREADS, in_smem ? (size_t)n_cmp_max * sizeof(float) : 0, c->compute>>>(
        iq, iw, (const __half *)icomp, pos, t0, ih, ihd, topk, scores, n_cmp_max, in_smem, sel, n_sel);
    HM_CU_LAUNCH("dsv4_index");
    return HM_OK;
}

/* one block per (head blockIdx.x, row blockIdx.y); shared: q / o [hd], scores [max_keys], 32 floats */
__global__ void __launch_bounds__(DS_THREADS) k_dsv4_attn(hm_cuda_dsv4_attn a, float *q, const int32_t *pos) {
    extern __shared__ float sm[];
    float *qs = sm, *red = sm + a.hd, *sc = red + 32;
    const int h = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int64_t t = blockIdx.y, hd = a.hd, p = pos[t];
    float *qh = q + (t * a.n_head + h) * hd;
    for (int64_t e = threadIdx.x; e < hd; e += blockDim.x) qs[e] = qh[e];
    const int64_t j0 = p - a.window + 1 > 0 ? p - a.window + 1 : 0, n_raw = p - j0 + 1;
    int64_t n_cmp = 0;
    const int32_t *sel = NULL;
    if (a.ratio == 128) n_cmp = (p + 1) / 128;
    if (a.ratio == 4) n_cmp = a.n_sel[t], sel = a.sel + t * a.topk;
    const int64_t nk = n_raw + n_cmp;
    const float scale = 1.0f / sqrtf((float)hd);
    __syncthreads();
    const __half *raw = (const __half *)a.raw, *comp = (const __half *)a.comp;
    for (int64_t i = warp; i < nk; i += nw) {
        const __half *k = i < n_raw ? raw + ((j0 + i) % a.cap) * hd
                                    : comp + (int64_t)(sel ? sel[i - n_raw] : i - n_raw) * hd;
        float s = 0.0f;
        for (int64_t e = lane; e < hd; e += 32) s += qs[e] * ds_h(k, e);
        s = ds_warp_sum(s);
        if (lane == 0) sc[i] = s * scale;
    }
    __syncthreads();
    /* the max over the sink and the scores (exact: a max does not depend on the order) */
    const float sink = a.sinks[h];
    float mx = sink;
    for (int64_t i = threadIdx.x; i < nk; i += blockDim.x) mx = fmaxf(mx, sc[i]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    mx = red[0];
    for (int w = 1; w < nw; w++) mx = fmaxf(mx, red[w]);
    for (int64_t i = threadIdx.x; i < nk; i += blockDim.x) sc[i] = expf(sc[i] - mx);
    __syncthreads();
    /* each thread its dims d = threadIdx.x + k blockDim.x, keys in order (the CPU's sums) */
    float acc[DS_MAX_HD / DS_THREADS];
    float sum = expf(sink - mx);
#pragma unroll
    for (int k = 0; k < DS_MAX_HD / DS_THREADS; k++) acc[k] = 0.0f;
    for (int64_t i = 0; i < nk; i++) {
        const __half *v = i < n_raw ? raw + ((j0 + i) % a.cap) * hd
                                    : comp + (int64_t)(sel ? sel[i - n_raw] : i - n_raw) * hd;
        const float e = sc[i];
        sum += e;
#pragma unroll
        for (int k = 0; k < DS_MAX_HD / DS_THREADS; k++) {
            const int64_t d = threadIdx.x + (int64_t)k * blockDim.x;
            if (d < hd) acc[k] += e * ds_h(v, d);
        }
    }
#pragma unroll
    for (int k = 0; k < DS_MAX_HD / DS_THREADS; k++) {
        const int64_t d = threadIdx.x + (int64_t)k * blockDim.x;
        if (d < hd) qs[d] = acc[k] / sum; /* every read of qs ended before the scores' barrier */
    }
    __syncthreads();
    for (int j = threadIdx.x; j < a.n_rot / 2; j += blockDim.x)
        ds_rope_pair(qs + hd - a.n_rot, j, (int32_t)p, a.tscale, a.ff, true);
    __syncthreads();
    for (int64_t e = threadIdx.x; e < hd; e += blockDim.x) qh[e] = qs[e];
}

hm_status hm_cuda_dsv4_attention(hm_cuda_ctx *c, const hm_cuda_dsv4_attn *a, float *q, int64_t n, const int32_t *pos,
                                 hm_err *err) {
    HM_CU_ARG(a && q && pos && a->raw && a->sinks && n >= 0 && n < 65536 && a->n_head > 0 && a->hd > 0);
    HM_CU_ARG(a->hd <= DS_MAX_HD && a->n_rot > 0 && a->n_rot % 2 == 0 && a->n_rot <= a->hd && a->window > 0);
    HM_CU_ARG(a->cap > 0 && a->max_keys >= a->window);
    HM_CU_ARG(a->ratio == 0 || (a->comp && (a->ratio == 128 || (a->ratio == 4 && a->sel && a->n_sel && a->topk > 0))));
    if (!n) return HM_OK;
    const size_t smem = ((size_t)a->hd + 32 + (size_t)a->max_keys) * sizeof(float);
    if (smem > 48 * 1024) {
        int dev = 0, cap = 0;
        HM_CU(cudaGetDevice(&dev));
        HM_CU(cudaDeviceGetAttribute(&cap, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        if (smem > (size_t)cap)
            return hm_errf(err, HM_ERR_UNSUPPORTED, "dsv4 attention: %lld keys a row need %zu bytes of shared memory "
                           "(the device has %d): use a smaller context", (long long)a->max_keys, smem, cap);
        HM_CU(cudaFuncSetAttribute(k_dsv4_attn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    }
    k_dsv4_attn<<<dim3((unsigned)a->n_head, (unsigned)n), DS_THREADS, smem, c->compute>>>(*a, q, pos);
    HM_CU_LAUNCH("dsv4_attention");
    return HM_OK;
}
