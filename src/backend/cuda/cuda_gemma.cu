/* cuda_gemma.cu - the Gemma ops of cuda_gemma.h. Elementwise ops are one thread per element;
 * RoPE one thread per (token, head, pair); attention one block of 4 warps per (query head, KV
 * range): each warp walks every 4th position of the range with an online softmax (lane j holds
 * head elements j, j + 32, ...), the 4 warps merge in warp order, and when the range was split a
 * second launch merges the ranges in range order. Fixed order everywhere: bit-identical runs. */
#include <cuda_fp16.h>
#include <math.h>

#include "cuda_gemma.h"
#include "cuda_gptoss.h"
#include "cuda_impl.h"
#include "cuda_kvq.cuh"
#include "cuda_quant.cuh"

using namespace hmcu;

/* ---- elementwise ---- */

__global__ void k_gelu_mul(const float *g, const float *u, float *out, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float x = g[i];
    out[i] = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x))) * u[i];
}

hm_status hm_cuda_gelu_mul(hm_cuda_ctx *c, const float *g, const float *u, float *out, int64_t n, hm_err *err) {
    HM_CU_ARG(g && u && out && n >= 0);
    if (!n) return HM_OK;
    k_gelu_mul<<<hm_cu_blocks(n, 256), 256, 0, c->compute>>>(g, u, out, n);
    HM_CU_LAUNCH("gelu_mul");
    return HM_OK;
}

__global__ void k_softcap(float *x, int64_t n, float cap) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = cap * tanhf(x[i] / cap);
}

hm_status hm_cuda_softcap(hm_cuda_ctx *c, float *x, int64_t n, float cap, hm_err *err) {
    HM_CU_ARG(x && n >= 0 && cap > 0);
    if (!n) return HM_OK;
    k_softcap<<<hm_cu_blocks(n, 256), 256, 0, c->compute>>>(x, n, cap);
    HM_CU_LAUNCH("softcap");
    return HM_OK;
}

__global__ void k_scale_by_id(float *w, const int32_t *ids, const float *table, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) w[i] *= table[ids[i]];
}

hm_status hm_cuda_scale_by_id(hm_cuda_ctx *c, float *w, const int32_t *ids, const float *table, int64_t n,
                              hm_err *err) {
    HM_CU_ARG(w && ids && table && n >= 0);
    if (!n) return HM_OK;
    k_scale_by_id<<<hm_cu_blocks(n, 256), 256, 0, c->compute>>>(w, ids, table, n);
    HM_CU_LAUNCH("scale_by_id");
    return HM_OK;
}

/* ---- RoPE with frequency factors ---- */

__global__ void k_rope_neox_ff(float *x, int64_t n, int n_head, int head_dim, int n_rot, const int32_t *pos,
                               double theta, const float *ff) {
    const int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= n) return;
    const int half = n_rot / 2;
    const int i = (int)(id % half);
    const int64_t th = id / half; /* token * n_head + head */
    double a = (double)pos[th / n_head] * pow(theta, -2.0 * i / n_rot);
    if (ff) a /= (double)ff[i];
    const float cs = (float)cos(a), sn = (float)sin(a);
    float *v = x + th * head_dim;
    const float x0 = v[i], x1 = v[i + half];
    v[i] = x0 * cs - x1 * sn;
    v[i + half] = x0 * sn + x1 * cs;
}

hm_status hm_cuda_rope_neox_ff(hm_cuda_ctx *c, float *x, int64_t n_tok, int n_head, int head_dim, int n_rot,
                               const int32_t *pos, float theta_base, const float *ff, hm_err *err) {
    HM_CU_ARG(x && pos && n_tok >= 0 && n_head > 0 && n_rot > 0 && n_rot % 2 == 0 && n_rot <= head_dim);
    const int64_t n = n_tok * n_head * (n_rot / 2);
    if (!n) return HM_OK;
    k_rope_neox_ff<<<hm_cu_blocks(n, 256), 256, 0, c->compute>>>(x, n, n_head, head_dim, n_rot, pos,
                                                                 (double)theta_base, ff);
    HM_CU_LAUNCH("rope_neox_ff");
    return HM_OK;
}

/* ---- ring KV write ---- */

__global__ void k_kv_write_ring(uint16_t *kc, uint16_t *vc, int64_t cap, int n_kv_head, int head_dim,
                                const float *k, const float *v, int64_t n, const int32_t *pos) {
    const int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= n) return;
    const int d = (int)(id % head_dim);
    const int64_t th = id / head_dim;
    const int h = (int)(th % n_kv_head);
    const int64_t t = th / n_kv_head;
    const int64_t dst = ((int64_t)h * cap + pos[t] % cap) * head_dim + d;
    kc[dst] = __half_as_ushort(__float2half_rn(k[id]));
    vc[dst] = __half_as_ushort(__float2half_rn(v[id]));
}

hm_status hm_cuda_kv_write_ring(hm_cuda_ctx *c, uint16_t *k_cache, uint16_t *v_cache, int64_t cap, int n_kv_head,
                                int head_dim, const float *k, const float *v, int64_t n_tok, const int32_t *pos,
                                hm_err *err) {
    HM_CU_ARG(k_cache && v_cache && k && v && pos && n_kv_head > 0 && head_dim > 0 && cap > 0 && n_tok >= 0);
    const int64_t n = n_tok * n_kv_head * head_dim;
    if (!n) return HM_OK;
    k_kv_write_ring<<<hm_cu_blocks(n, 256), 256, 0, c->compute>>>(k_cache, v_cache, cap, n_kv_head, head_dim, k, v,
                                                                  n, pos);
    HM_CU_LAUNCH("kv_write_ring");
    return HM_OK;
}

/* ---- attention ---- */

#define G4A_WARPS 4
#define G4A_MAX_SPLIT 64
#define G4A_MIN_RANGE 64 /* positions a block takes at least when a query's range is split */

/* Block (row x = token * n_head + head, range y), D = head_dim / 32 elements per lane. Writes the
 * normalised output when n_split is 1, else the range's partial {max, sum, o[head_dim]} (o not
 * normalised) to part[x * n_split + y]. */
template <int D, int KT>
__global__ void __launch_bounds__(128) k_g4_attn(const float *__restrict__ q, const int32_t *__restrict__ pos,
                                                 const void *__restrict__ kc, const void *__restrict__ vc,
                                                 int64_t cap, int32_t window, int n_head, int n_kv_head, float scale,
                                                 int n_split, float *__restrict__ out, float *__restrict__ part,
                                                 const float *__restrict__ sinks) {
    constexpr int HD = D * 32;
    constexpr int64_t RB = hmkv::row_bytes<KT>(HD); /* bytes of a cache row (cuda_kvq.cuh) */
    __shared__ float sm_m[G4A_WARPS], sm_l[G4A_WARPS];
    __shared__ float sm_o[G4A_WARPS][HD];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t row = blockIdx.x;
    const int64_t t = row / n_head;
    const int h = (int)(row % n_head), g = h / (n_head / n_kv_head);
    const int64_t p1 = pos[t];
    int64_t p0 = window > 0 ? p1 - window + 1 : 0;
    if (p0 < 0) p0 = 0;
    const int64_t span = p1 - p0 + 1, len = (span + n_split - 1) / n_split;
    const int64_t c0 = p0 + (int64_t)blockIdx.y * len;
    const int64_t c1 = c0 + len < p1 + 1 ? c0 + len : p1 + 1;
    float qv[D], o[D];
    const float *qr = q + row * HD;
#pragma unroll
    for (int i = 0; i < D; i++) {
        qv[i] = qr[lane + 32 * i];
        o[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    const unsigned char *kb = (const unsigned char *)kc + (int64_t)g * cap * RB;
    const unsigned char *vb = (const unsigned char *)vc + (int64_t)g * cap * RB;
    /* element lane + 32 i of a row: f16 as before, or dequantised (cuda_kvq.cuh) */
    auto elem = [lane](const unsigned char *r, int i) -> float {
        if constexpr (KT == HM_CUDA_KV_F16) return __half2float(__ushort_as_half(((const uint16_t *)r)[lane + 32 * i]));
        else return hmkv::elem<KT>(r, lane + 32 * i);
    };
    for (int64_t s = c0 + w; s < c1; s += G4A_WARPS) {
        const unsigned char *kr = kb + (s % cap) * RB, *vr = vb + (s % cap) * RB;
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < D; i++) dot = fmaf(qv[i], elem(kr, i), dot);
        dot = warp_sum(dot) * scale;
        const float mn = fmaxf(m, dot);
        const float corr = expf(m - mn), pe = expf(dot - mn); /* m = -inf the first time: corr 0 */
        l = l * corr + pe;
#pragma unroll
        for (int i = 0; i < D; i++) o[i] = o[i] * corr + pe * elem(vr, i);
        m = mn;
    }
    if (lane == 0) {
        sm_m[w] = m;
        sm_l[w] = l;
    }
#pragma unroll
    for (int i = 0; i < D; i++) sm_o[w][lane + 32 * i] = o[i];
    __syncthreads();
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < G4A_WARPS; j++) mx = fmaxf(mx, sm_m[j]);
    float f[G4A_WARPS], sum = 0.0f;
#pragma unroll
    for (int j = 0; j < G4A_WARPS; j++) {
        f[j] = mx == -INFINITY ? 0.0f : expf(sm_m[j] - mx); /* an empty warp (or range): weight 0 */
        sum += sm_l[j] * f[j];
    }
    if (sinks && n_split == 1) sum += expf(sinks[h] - mx); /* the sink: the denominator only */
    for (int e = threadIdx.x; e < HD; e += blockDim.x) {
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < G4A_WARPS; j++) acc += sm_o[j][e] * f[j];
        if (n_split == 1) out[row * HD + e] = acc / sum;
        else part[(row * n_split + blockIdx.y) * (HD + 2) + 2 + e] = acc;
    }
    if (n_split > 1 && threadIdx.x == 0) {
        float *pp = part + (row * n_split + blockIdx.y) * (HD + 2);
        pp[0] = mx;
        pp[1] = sum;
    }
}

/* Block per row, thread per head element: the ranges' partials merged in range order. */
__global__ void k_g4_attn_merge(const float *__restrict__ part, int n_split, int head_dim, float *__restrict__ out,
                                const float *__restrict__ sinks, int n_head) {
    const int64_t row = blockIdx.x;
    const float *pr = part + row * n_split * (head_dim + 2);
    float mx = -INFINITY;
    for (int j = 0; j < n_split; j++) mx = fmaxf(mx, pr[j * (head_dim + 2)]);
    for (int e = threadIdx.x; e < head_dim; e += blockDim.x) {
        float sum = sinks ? expf(sinks[row % n_head] - mx) : 0.0f, acc = 0.0f;
        for (int j = 0; j < n_split; j++) {
            const float *pj = pr + j * (head_dim + 2);
            const float f = pj[0] == -INFINITY ? 0.0f : expf(pj[0] - mx);
            sum += pj[1] * f;
            acc += pj[2 + e] * f;
        }
        out[row * head_dim + e] = acc / sum;
    }
}

/* Ranges per query row: 1 when the rows alone fill the device, else enough blocks for ~2 per SM,
 * each range at least G4A_MIN_RANGE positions. rows * split < 2 n_sm + rows <= 4 n_sm when > 1. */
static int g4a_split(const hm_cuda_ctx *c, int64_t rows, int64_t span) {
    const int64_t want = 2 * (int64_t)c->n_sm;
    if (rows >= want) return 1;
    int64_t s = (want + rows - 1) / rows, by_len = (span + G4A_MIN_RANGE - 1) / G4A_MIN_RANGE;
    if (s > by_len) s = by_len;
    if (s > G4A_MAX_SPLIT) s = G4A_MAX_SPLIT;
    return s < 1 ? 1 : (int)s;
}

bool hm_cuda_gemma_attention_flash(const hm_cuda_ctx *c, int64_t n_tok, int64_t kv_len, int32_t window, int head_dim) {
    const int64_t span = window > 0 && window < kv_len ? window : kv_len;
    return hm_cuda_flash_takes(c, n_tok, head_dim) || hm_cuda_flash_decode_on(c, n_tok, span, head_dim);
}

size_t hm_cuda_gemma_attention_key(const hm_cuda_ctx *c, int64_t n_tok, int n_head, int n_kv_head, int head_dim,
                                   int64_t kv_len, int32_t window, size_t scratch_size) {
    const int64_t span = window > 0 && window < kv_len ? window : kv_len;
    if (hm_cuda_flash_decode_on(c, n_tok, span, head_dim))
        return (size_t)hm_cuda_flash_decode_splits(c, n_tok, n_head, n_kv_head, head_dim, kv_len, window, scratch_size)
                   << 1 |
               1;
    return (size_t)g4a_split(c, n_tok * n_head, span) << 1;
}

size_t hm_cuda_gemma_attention_scratch_size(const hm_cuda_ctx *c, int head_dim) {
    return (size_t)4 * (size_t)(c->n_sm > 0 ? c->n_sm : 1) * (size_t)(head_dim + 2) * sizeof(float);
}

hm_status hm_cuda_gemma_attention(hm_cuda_ctx *c, const float *q, int64_t n_tok, const int32_t *pos, int64_t kv_len,
                                  const uint16_t *k_cache, const uint16_t *v_cache, int64_t cap, int32_t window,
                                  int n_head, int n_kv_head, int head_dim, float scale, float *out, void *scratch,
                                  size_t scratch_size, hm_err *err) {
    return hm_cuda_gemma_attention_kv(c, HM_CUDA_KV_F16, q, n_tok, pos, kv_len, k_cache, v_cache, cap, window, n_head,
                                      n_kv_head, head_dim, scale, out, scratch, scratch_size, err);
}

hm_status hm_cuda_gemma_attention_kv(hm_cuda_ctx *c, hm_cuda_kv kv, const float *q, int64_t n_tok, const int32_t *pos,
                                     int64_t kv_len, const void *k_cache, const void *v_cache, int64_t cap,
                                     int32_t window, int n_head, int n_kv_head, int head_dim, float scale, float *out,
                                     void *scratch, size_t scratch_size, hm_err *err) {
    return hm_cuda_gemma_attention_kv_sinks(c, kv, q, n_tok, pos, kv_len, k_cache, v_cache, cap, window, n_head,
                                            n_kv_head, head_dim, scale, NULL, out, scratch, scratch_size, err);
}

hm_status hm_cuda_gemma_attention_kv_sinks(hm_cuda_ctx *c, hm_cuda_kv kv, const float *q, int64_t n_tok,
                                           const int32_t *pos, int64_t kv_len, const void *k_cache,
                                           const void *v_cache, int64_t cap, int32_t window, int n_head,
                                           int n_kv_head, int head_dim, float scale, const float *sinks, float *out,
                                           void *scratch, size_t scratch_size, hm_err *err) {
    HM_CU_ARG(q && pos && k_cache && v_cache && out && (const void *)q != (const void *)out && n_tok >= 0 &&
              kv_len > 0 && cap > 0);
    HM_CU_ARG(n_kv_head > 0 && n_head > 0 && n_head % n_kv_head == 0 && window >= 0);
    HM_CU_ARG(kv == HM_CUDA_KV_F16 || (kv >= HM_CUDA_KV_Q8_0 && kv <= HM_CUDA_KV_BF16 && head_dim % 32 == 0));
    if (!n_tok) return HM_OK;
    if (hm_cuda_flash_takes(c, n_tok, head_dim))
        return hm_cuda_flash_attention_kv_sinks(c, kv, q, n_tok, pos, kv_len, k_cache, v_cache, cap, window, n_head,
                                                n_kv_head, head_dim, scale, sinks, out, scratch, scratch_size, err);
    const int64_t span = window > 0 && window < kv_len ? window : kv_len;
    if (hm_cuda_flash_decode_on(c, n_tok, span, head_dim))
        return hm_cuda_flash_decode_kv_sinks(c, kv, q, n_tok, pos, kv_len, k_cache, v_cache, cap, window, n_head,
                                             n_kv_head, head_dim, scale, sinks, out, scratch, scratch_size, err);
    HM_CU_ARG(n_tok * n_head < (1LL << 31));
    const int64_t rows = n_tok * n_head;
    const int split = g4a_split(c, rows, span);
    float *part = (float *)scratch;
    if (split > 1)
        HM_CU_ARG(scratch && scratch_size >= (size_t)rows * (size_t)split * (size_t)(head_dim + 2) * sizeof(float));
    const dim3 grid((unsigned)rows, (unsigned)split);
#define G4A_LAUNCH(HDIM, KT)                                                                                     \
    k_g4_attn<HDIM / 32, KT><<<grid, 128, 0, c->compute>>>(q, pos, k_cache, v_cache, cap, window, n_head,        \
                                                           n_kv_head, scale, split, out, part, sinks)
    switch (head_dim) {
#define G4A_CASE(HDIM)                                                                                           \
    case HDIM:                                                                                                   \
        if (kv == HM_CUDA_KV_Q8_0) G4A_LAUNCH(HDIM, HM_CUDA_KV_Q8_0);                                           \
        else if (kv == HM_CUDA_KV_Q4_0) G4A_LAUNCH(HDIM, HM_CUDA_KV_Q4_0);                                      \
        else if (kv == HM_CUDA_KV_BF16) G4A_LAUNCH(HDIM, HM_CUDA_KV_BF16);                                      \
        else G4A_LAUNCH(HDIM, HM_CUDA_KV_F16);                                                                   \
        break;
        G4A_CASE(32)
        G4A_CASE(64)
        G4A_CASE(128)
        G4A_CASE(256)
        G4A_CASE(512)
#undef G4A_CASE
#undef G4A_LAUNCH
    default:
        return hm_errf(err, HM_ERR_UNSUPPORTED, "gemma attention: head_dim %d (takes 32, 64, 128, 256 or 512)",
                       head_dim);
    }
    HM_CU_LAUNCH("gemma attention");
    if (split > 1) {
        k_g4_attn_merge<<<(unsigned)rows, head_dim < 256 ? head_dim : 256, 0, c->compute>>>(part, split, head_dim,
                                                                                             out, sinks, n_head);
        HM_CU_LAUNCH("gemma attention merge");
    }
    return HM_OK;
}
