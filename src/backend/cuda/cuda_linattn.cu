/* cuda_linattn.cu - the qwen35moe ops of cuda_linattn.h: Gated DeltaNet (conv, L2 norm, gates,
 * delta rule), the gated attention's split and gate, the shared expert's gate, and the f32 matmul /
 * attention fallbacks for odd shapes.
 *
 * Every kernel gives each output element to one thread (or one warp that reduces in a fixed
 * tree), so results are deterministic; expressions follow the CPU ops (cpu_deltanet.c,
 * exec/exec_cpu.c) in the same order where there is an order (the conv taps, the delta rule's
 * sums over d_k), so decode results differ from the CPU's by f32 rounding only. */
#include <cuda_fp16.h>

#include "cuda_impl.h"
#include "cuda_linattn.h"

__device__ static inline float la_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ static inline float la_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* ---- causal conv + SiLU ---- */

__global__ void k_ssm_conv(const float *x, int64_t xs, int64_t n, int64_t C, const float *w, int K, float *state,
                           float *out) {
    const int64_t ch = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= C) return;
    const float *wc = w + ch * K;
    for (int64_t t = 0; t < n; t++) {
        float acc = 0.0f;
        for (int j = 0; j < K; j++) {
            const int64_t s = t - (K - 1) + j; /* input row, < 0: from the state */
            const float xv = s < 0 ? state[(K - 1 + s) * C + ch] : x[s * xs + ch];
            acc += wc[j] * xv;
        }
        out[t * C + ch] = acc / (1.0f + expf(-acc));
    }
    /* the last K-1 rows of (state ++ x); row n + j read before it is written (j ascending) */
    for (int j = 0; j < K - 1; j++) {
        const int64_t s = n - (K - 1) + j;
        state[j * C + ch] = s < 0 ? state[(K - 1 + s) * C + ch] : x[s * xs + ch];
    }
}

hm_status hm_cuda_ssm_conv(hm_cuda_ctx *c, const float *x, int64_t x_stride, int64_t n_tok, int64_t C,
                           const float *w, int K, float *state, float *out, hm_err *err) {
    HM_CU_ARG(x && w && state && out && K >= 1 && n_tok >= 0 && C > 0 && x_stride >= C);
    k_ssm_conv<<<hm_cu_blocks(C, 128), 128, 0, c->compute>>>(x, x_stride, n_tok, C, w, K, state, out);
    HM_CU_LAUNCH("ssm_conv");
    return HM_OK;
}

/* ---- L2 norm per head ---- */

__global__ void k_l2norm_heads(float *x, int64_t xs, int64_t n_rows, int n_head, int d, float eps, float scale) {
    const int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= n_rows) return;
    float *v = x + (r / n_head) * xs + (r % n_head) * d;
    float ss = 0.0f;
    for (int i = lane; i < d; i += 32) ss += v[i] * v[i];
    ss = la_warp_sum(ss);
    const float f = scale / sqrtf(ss + eps);
    for (int i = lane; i < d; i += 32) v[i] *= f;
}

hm_status hm_cuda_l2norm_heads(hm_cuda_ctx *c, float *x, int64_t x_stride, int64_t n_tok, int n_head, int d,
                               float eps, float scale, hm_err *err) {
    HM_CU_ARG(x && n_tok >= 0 && n_head > 0 && d > 0 && x_stride >= (int64_t)n_head * d);
    const int64_t rows = n_tok * n_head;
    if (!rows) return HM_OK;
    k_l2norm_heads<<<hm_cu_blocks(rows, 4), 128, 0, c->compute>>>(x, x_stride, rows, n_head, d, eps, scale);
    HM_CU_LAUNCH("l2norm_heads");
    return HM_OK;
}

/* ---- gates ---- */

__global__ void k_delta_gates(const float *alpha, const float *b, const float *ssm_a, const float *dt_bias,
                              int64_t n, int n_v, int grp, float *g, float *beta) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int h = (int)(i % n_v);
    /* grp > 0: rows of 2 n_v, per key head grp betas then grp alphas (alpha = b + grp) */
    const int64_t ii = grp ? (i / n_v) * 2 * n_v + (h / grp) * 2 * grp + h % grp : i;
    const float a = alpha[ii] + dt_bias[h];
    const float sp = a > 20.0f ? a : log1pf(expf(a));
    const float bv = b[ii];
    g[i] = ssm_a[h] * sp;
    beta[i] = la_sigmoid(bv);
}

hm_status hm_cuda_delta_gates(hm_cuda_ctx *c, const float *alpha, const float *b, const float *ssm_a,
                              const float *dt_bias, int64_t n_tok, int n_v, int grp, float *g, float *beta,
                              hm_err *err) {
    HM_CU_ARG(alpha && b && ssm_a && dt_bias && g && beta && n_tok >= 0 && n_v > 0 && grp >= 0);
    HM_CU_ARG(!grp || (n_v % grp == 0 && g != alpha && g != b && beta != alpha && beta != b));
    const int64_t n = n_tok * n_v;
    if (!n) return HM_OK;
    k_delta_gates<<<hm_cu_blocks(n, 256), 256, 0, c->compute>>>(alpha, b, ssm_a, dt_bias, n, n_v, grp, g, beta);
    HM_CU_LAUNCH("delta_gates");
    return HM_OK;
}

/* ---- gated delta rule ----
 * Block (head h, 32 value columns). Column j of S is held by SPLIT threads (adjacent lanes), each
 * owning DK / SPLIT consecutive key rows in registers (DK > 0), or by one thread that reads and
 * writes it in memory each token (DK == 0: any d_k). Per token the block loads q_t and k_t of the
 * head's key head into shared memory; each thread sums its rows in i order and the SPLIT partial
 * sums are added by a lane shuffle (a + b == b + a: both halves see the same delta). */
#define LA_DELTA_COLS 32

template <int DK, int SPLIT>
__global__ void __launch_bounds__(LA_DELTA_COLS * SPLIT) k_gated_delta(const float *q, const float *k, int64_t qks,
                                                                       const float *v, int64_t vs, const float *g,
                                                                       const float *beta, int64_t n, int n_k, int n_v,
                                                                       int rep, int dk_rt, int dv, float *state,
                                                                       float *out) {
    static_assert(SPLIT == 1 || (SPLIT == 2 && DK > 0 && DK % 2 == 0), "split rows need a fixed d_k");
    constexpr int R = DK > 0 ? DK / SPLIT : 1; /* rows per thread */
    extern __shared__ float sh[];              /* [2][dk]: q_t, k_t */
    const int dk = DK > 0 ? DK : dk_rt;
    const int part = (int)threadIdx.x % SPLIT, i0 = part * R;
    const int h = blockIdx.x, j = blockIdx.y * LA_DELTA_COLS + (int)threadIdx.x / SPLIT;
    const bool live = j < dv;
    float *S = state + (int64_t)h * dk * dv + (live ? j : 0); /* column j: S[i * dv] */
    const int64_t kh = (h / rep) % n_k; /* rep 1: tiled, n_v / n_k: grouped */
    float s[R];
#pragma unroll
    for (int r = 0; r < R; r++) s[r] = DK > 0 && live ? S[(int64_t)(i0 + r) * dv] : 0.0f;
    float *qs = sh, *ks = sh + dk;
    for (int64_t t = 0; t < n; t++) {
        __syncthreads(); /* the previous token's q/k are no longer read */
        for (int i = threadIdx.x; i < dk; i += blockDim.x) {
            qs[i] = q[t * qks + kh * dk + i];
            ks[i] = k[t * qks + kh * dk + i];
        }
        __syncthreads();
        const float decay = expf(g[t * n_v + h]), bt = beta[t * n_v + h];
        float kv = 0.0f;
        if (DK > 0) {
#pragma unroll
            for (int r = 0; r < R; r++) kv += s[r] * ks[i0 + r];
        } else if (live) {
            for (int i = 0; i < dk; i++) kv += S[(int64_t)i * dv] * ks[i];
        }
        if (SPLIT == 2) kv += __shfl_xor_sync(0xffffffffu, kv, 1);
        const float vj = live ? v[t * vs + (int64_t)h * dv + j] : 0.0f;
        const float d = bt * (vj - decay * kv);
        float o = 0.0f;
        if (DK > 0) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                const float sv = decay * s[r] + ks[i0 + r] * d;
                s[r] = sv;
                o += sv * qs[i0 + r];
            }
        } else if (live) {
            for (int i = 0; i < dk; i++) {
                const float sv = decay * S[(int64_t)i * dv] + ks[i] * d;
                S[(int64_t)i * dv] = sv;
                o += sv * qs[i];
            }
        }
        if (SPLIT == 2) o += __shfl_xor_sync(0xffffffffu, o, 1);
        if (live && part == 0) out[(t * n_v + h) * dv + j] = o;
    }
    if (DK > 0 && live) {
#pragma unroll
        for (int r = 0; r < R; r++) S[(int64_t)(i0 + r) * dv] = s[r];
    }
}

hm_status hm_cuda_gated_delta(hm_cuda_ctx *c, const float *q, const float *k, int64_t qk_stride, const float *v,
                              int64_t v_stride, const float *g, const float *beta, int64_t n_tok, int n_k_head,
                              int n_v_head, bool grouped, int d_k, int d_v, float *state, float *out, hm_err *err) {
    HM_CU_ARG(q && k && v && g && beta && state && out && n_tok >= 0);
    HM_CU_ARG(n_k_head > 0 && n_v_head > 0 && n_v_head % n_k_head == 0 && n_v_head <= 65535);
    HM_CU_ARG(d_k > 0 && d_k <= 1024 && d_v > 0 && d_v <= 1024);
    HM_CU_ARG(qk_stride >= (int64_t)n_k_head * d_k && v_stride >= (int64_t)n_v_head * d_v);
    if (!n_tok) return HM_OK;
    const dim3 grid((unsigned)n_v_head, hm_cu_blocks(d_v, LA_DELTA_COLS));
    const size_t shb = 2 * (size_t)d_k * sizeof(float);
    const int rep = grouped ? n_v_head / n_k_head : 1;
#define LA_DELTA(DKV, SPL)                                                                                    \
    k_gated_delta<DKV, SPL><<<grid, LA_DELTA_COLS * SPL, shb, c->compute>>>(                                  \
        q, k, qk_stride, v, v_stride, g, beta, n_tok, n_k_head, n_v_head, rep, d_k, d_v, state, out)
    switch (d_k) {
    case 16: LA_DELTA(16, 1); break;
    case 32: LA_DELTA(32, 1); break;
    case 64: LA_DELTA(64, 2); break;
    case 128: LA_DELTA(128, 2); break;
    default: LA_DELTA(0, 1); break;
    }
#undef LA_DELTA
    HM_CU_LAUNCH("gated_delta");
    return HM_OK;
}

/* ---- gated attention helpers ---- */

__global__ void k_split_q_gate(const float *mix, int64_t n, int hd, float *q, float *gate) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; /* (token * n_head + head) * hd + d */
    if (i >= n) return;
    const int64_t th = i / hd, d = i % hd;
    q[i] = mix[th * 2 * hd + d];
    gate[i] = mix[th * 2 * hd + hd + d];
}

hm_status hm_cuda_split_q_gate(hm_cuda_ctx *c, const float *mix, int64_t n_tok, int n_head, int hd, float *q,
                               float *gate, hm_err *err) {
    HM_CU_ARG(mix && q && gate && n_tok >= 0 && n_head > 0 && hd > 0);
    const int64_t n = n_tok * n_head * hd;
    if (!n) return HM_OK;
    k_split_q_gate<<<hm_cu_blocks(n, 256), 256, 0, c->compute>>>(mix, n, hd, q, gate);
    HM_CU_LAUNCH("split_q_gate");
    return HM_OK;
}

__global__ void k_sigmoid_mul(float *x, const float *gate, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= la_sigmoid(gate[i]);
}

hm_status hm_cuda_sigmoid_mul(hm_cuda_ctx *c, float *x, const float *gate, int64_t n, hm_err *err) {
    HM_CU_ARG(x && gate && n >= 0);
    if (!n) return HM_OK;
    k_sigmoid_mul<<<hm_cu_blocks(n, 256), 256, 0, c->compute>>>(x, gate, n);
    HM_CU_LAUNCH("sigmoid_mul");
    return HM_OK;
}

__global__ void k_add_sigmoid_scaled(float *x, const float *y, const float *s, int64_t total, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const float gs = la_sigmoid(s[i / n]);
    x[i] += gs * y[i];
}

hm_status hm_cuda_add_sigmoid_scaled(hm_cuda_ctx *c, float *x, const float *y, const float *s, int64_t n_tok,
                                     int64_t n, hm_err *err) {
    HM_CU_ARG(x && y && s && n_tok >= 0 && n > 0);
    const int64_t total = n_tok * n;
    if (!total) return HM_OK;
    k_add_sigmoid_scaled<<<hm_cu_blocks(total, 256), 256, 0, c->compute>>>(x, y, s, total, n);
    HM_CU_LAUNCH("add_sigmoid_scaled");
    return HM_OK;
}

/* ---- fallbacks for odd shapes ---- */

__global__ void k_matmul_f32_any(const float *w, int64_t ne0, int64_t ne1, int64_t ws, const float *x, int64_t n,
                                 float *y) {
    const int64_t id = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); /* token * ne1 + row */
    const int lane = threadIdx.x & 31;
    if (id >= n * ne1) return;
    const int64_t t = id / ne1, r = id % ne1;
    const float *wr = w + r * ws, *xr = x + t * ne0;
    float acc = 0.0f;
    for (int64_t i = lane; i < ne0; i += 32) acc += wr[i] * xr[i];
    acc = la_warp_sum(acc);
    if (lane == 0) y[id] = acc;
}

hm_status hm_cuda_matmul_f32_any(hm_cuda_ctx *c, const float *w, int64_t ne0, int64_t ne1, size_t nb1,
                                 const float *x, int64_t n_tok, float *y, hm_err *err) {
    HM_CU_ARG(w && x && y && ne0 > 0 && ne1 > 0 && n_tok >= 0 && nb1 % 4 == 0 && nb1 >= (size_t)ne0 * 4);
    const int64_t rows = n_tok * ne1;
    if (!rows) return HM_OK;
    k_matmul_f32_any<<<hm_cu_blocks(rows, 4), 128, 0, c->compute>>>(w, ne0, ne1, (int64_t)(nb1 / 4), x, n_tok, y);
    HM_CU_LAUNCH("matmul_f32_any");
    return HM_OK;
}

#define LA_ATT_PER_LANE 8 /* head_dim <= 256 */

__global__ void k_attention_any(const float *q, int64_t n, const int32_t *pos, const __half *kc, const __half *vc,
                                int64_t n_ctx, int n_head, int n_kv_head, int hd, float scale, float *out) {
    const int64_t id = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); /* token * n_head + head */
    const int lane = threadIdx.x & 31;
    if (id >= n * n_head) return;
    const int64_t t = id / n_head;
    const int h = (int)(id % n_head), kvh = h / (n_head / n_kv_head);
    const float *qr = q + id * hd;
    float qv[LA_ATT_PER_LANE], acc[LA_ATT_PER_LANE];
#pragma unroll
    for (int u = 0; u < LA_ATT_PER_LANE; u++) {
        const int d = lane + 32 * u;
        qv[u] = d < hd ? qr[d] : 0.0f;
        acc[u] = 0.0f;
    }
    const __half *kh = kc + (int64_t)kvh * n_ctx * hd, *vh = vc + (int64_t)kvh * n_ctx * hd;
    float mx = -INFINITY, sum = 0.0f;
    const int64_t last = pos[t];
    for (int64_t p = 0; p <= last; p++) {
        const __half *kr = kh + p * hd, *vr = vh + p * hd;
        float sc = 0.0f;
#pragma unroll
        for (int u = 0; u < LA_ATT_PER_LANE; u++) {
            const int d = lane + 32 * u;
            if (d < hd) sc += qv[u] * __half2float(kr[d]);
        }
        sc = la_warp_sum(sc) * scale;
        const float nm = fmaxf(mx, sc), cf = expf(mx - nm), e = expf(sc - nm);
        sum = sum * cf + e;
#pragma unroll
        for (int u = 0; u < LA_ATT_PER_LANE; u++) {
            const int d = lane + 32 * u;
            acc[u] = acc[u] * cf + (d < hd ? e * __half2float(vr[d]) : 0.0f);
        }
        mx = nm;
    }
    float *o = out + id * hd;
#pragma unroll
    for (int u = 0; u < LA_ATT_PER_LANE; u++) {
        const int d = lane + 32 * u;
        if (d < hd) o[d] = acc[u] / sum;
    }
}

hm_status hm_cuda_attention_any(hm_cuda_ctx *c, const float *q, int64_t n_tok, const int32_t *pos,
                                const uint16_t *k_cache, const uint16_t *v_cache, int64_t n_ctx, int n_head,
                                int n_kv_head, int head_dim, float scale, float *out, hm_err *err) {
    HM_CU_ARG(q && pos && k_cache && v_cache && out && n_tok >= 0 && n_ctx > 0);
    HM_CU_ARG(n_kv_head > 0 && n_head % n_kv_head == 0 && head_dim > 0 && head_dim <= 32 * LA_ATT_PER_LANE);
    const int64_t rows = n_tok * n_head;
    if (!rows) return HM_OK;
    k_attention_any<<<hm_cu_blocks(rows, 4), 128, 0, c->compute>>>(q, n_tok, pos, (const __half *)k_cache,
                                                                   (const __half *)v_cache, n_ctx, n_head, n_kv_head,
                                                                   head_dim, scale, out);
    HM_CU_LAUNCH("attention_any");
    return HM_OK;
}
