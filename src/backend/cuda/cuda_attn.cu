/* cuda_attn.cu - causal GQA attention over the f16 or q8_0 KV cache: the op's entry, which sends
 * prefill batches (HM_CUDA_FLASH_MIN_TOK or more queries) and decode batches to the flash kernel
 * (cuda_flash.cu; decode as its GQA-group shape) while flash is on, and the exact f32 kernels
 * below, with their flash-decoding split, which run everything with flash off (-fa off,
 * HOTMOE_CUDA_EXACT=1) and head dim 256 decode up to 2048 positions; the merges of KV-split
 * partials.
 *
 * A q8_0, q4_0 or bf16 cache (cuda_kvq.cu) is read by the same kernels: a lane's D values lie in
 * one block, dequantised as they are loaded (code * scale in f32, exactly the CPU's to_float;
 * cuda_kvq.cuh), so the attention is exact f32 attention over the dequantised cache.
 *
 * Kernel 1 (partials): a 128-thread block takes one (query token, KV range, kv head, chunk of up to
 * GC q heads of that kv head's group). K and V rows of the range are read once and used for all
 * GC q heads: GQA's sharing happens in registers, not in L2. Each warp walks positions
 * p0 + warp, p0 + warp + 4, ... keeping an online softmax (max m, sum l, unnormalised o) per head,
 * lane l holding elements l*D .. l*D+D-1 of head_dim = 32 D; the four warps merge through shared
 * memory and the block writes (m, l, o) of its range.
 * Kernel 2 (merge): per (token, q head) the ranges are merged in range order and normalised.
 * The number of ranges grows when few (token, head) blocks would leave multiprocessors idle
 * (decode at long context); prefill uses one range. Fixed orders everywhere: deterministic.
 *
 * Decode is latency-bound: a warp walks its positions one after another. The default kernels
 * (everything but the OLD test hook) split into ranges of ATTN_MIN_RANGE_NEW positions so a decode
 * token at short context still spreads over many blocks, have each warp load the K/V rows of its
 * next position before it folds in the current one (the same arithmetic in the same order), and
 * with a single range write the normalised output directly, without the merge kernel (the merge
 * of one range is O / L exactly: expf(0) = 1). */
#include "cuda_impl.h"
#include "cuda_kvq.cuh"
#include "cuda_quant.cuh"

using namespace hmcu;

#define ATTN_WARPS 4
#define ATTN_MIN_RANGE 256 /* positions per range at least, before splitting further (OLD) */
#define ATTN_MIN_RANGE_NEW 32
#define ATTN_MAX_SPLIT 128

static int heads_per_block(int head_dim) { return head_dim == 256 ? 4 : 8; }

static int attn_splits(const hm_cuda_ctx *c, int64_t n_tok, int64_t kv_len, int n_head,
                       int n_kv_head, int head_dim) {
    const int gc = heads_per_block(head_dim);
    const int64_t g = n_head / n_kv_head;
    const int64_t blocks = n_tok * n_kv_head * ((g + gc - 1) / gc);
    const bool old = c->kern == HM_CUDA_KERN_OLD;
    int64_t want = (2 * (int64_t)c->n_sm + blocks - 1) / blocks;
    const int64_t min_range = old ? ATTN_MIN_RANGE : ATTN_MIN_RANGE_NEW;
    int64_t by_len = (kv_len + min_range - 1) / min_range;
    /* new: by length in powers of two, so the split (and the scratch size, which keys a captured
     * decode graph) changes only at kv_len 33, 65, 129, ... and stays monotonic in kv_len */
    if (!old)
        while (by_len & (by_len - 1)) by_len &= by_len - 1;
    if (want > by_len) want = by_len;
    if (want > ATTN_MAX_SPLIT) want = ATTN_MAX_SPLIT;
    return want < 1 ? 1 : (int)want;
}

size_t hm_cuda_attention_scratch_size(const hm_cuda_ctx *c, int64_t n_tok, int64_t kv_len,
                                      int n_head, int n_kv_head, int head_dim) {
    if (n_kv_head <= 0 || n_head % n_kv_head) return 0;
    const int ns = attn_splits(c, n_tok, kv_len, n_head, n_kv_head, head_dim);
    const size_t fl = hm_cuda_flash_scratch_size(c, n_tok, n_head, head_dim, kv_len);
    const size_t fd = hm_cuda_flash_decode_scratch_size(c, n_tok, n_head, n_kv_head, head_dim, kv_len);
    const size_t ex = (size_t)n_tok * (size_t)n_head * (size_t)ns * ((size_t)head_dim + 2) * sizeof(float);
    const size_t most = ex > fl ? ex : fl;
    return most > fd ? most : fd;
}

bool hm_cuda_attention_flash(const hm_cuda_ctx *c, int64_t n_tok, int64_t kv_len, int head_dim) {
    if (head_dim != 64 && head_dim != 128 && head_dim != 256) return false;
    return hm_cuda_flash_takes(c, n_tok, head_dim) || hm_cuda_flash_decode_on(c, n_tok, kv_len, head_dim);
}

size_t hm_cuda_attention_key(const hm_cuda_ctx *c, int64_t n_tok, int64_t kv_len, int n_head, int n_kv_head,
                             int head_dim, size_t scratch_size) {
    if (n_kv_head <= 0 || n_head % n_kv_head) return 0;
    if (hm_cuda_flash_decode_on(c, n_tok, kv_len, head_dim))
        return (size_t)hm_cuda_flash_decode_splits(c, n_tok, n_head, n_kv_head, head_dim, kv_len, 0, scratch_size) << 1 |
               1;
    return (size_t)attn_splits(c, n_tok, kv_len, n_head, n_kv_head, head_dim) << 1;
}

/* D consecutive f16 of a K or V row (2, 4 or 8: one 4-, 8- or 16-byte load). */
template <int D>
__device__ __forceinline__ void ld_half_d(const uint16_t *p, float (&v)[D]) {
    uint32_t w[D / 2];
    if constexpr (D == 2) {
        w[0] = *(const uint32_t *)p;
    } else if constexpr (D == 4) {
        const uint2 u = *(const uint2 *)p;
        w[0] = u.x; w[1] = u.y;
    } else {
        const uint4 u = *(const uint4 *)p;
        w[0] = u.x; w[1] = u.y; w[2] = u.z; w[3] = u.w;
    }
#pragma unroll
    for (int i = 0; i < D / 2; i++) {
        const float2 f = __half22float2(*(const __half2 *)&w[i]);
        v[2 * i] = f.x;
        v[2 * i + 1] = f.y;
    }
}

/* The D values of a lane (elements lane * D ..) of a cache row: f16, or q8_0 blocks (the lane's D
 * values inside one block of 32: D divides 32). */
template <int D, int KT>
__device__ __forceinline__ void ld_row_d(const unsigned char *row, int lane, float (&v)[D]) {
    if constexpr (KT == HM_CUDA_KV_F16) {
        ld_half_d<D>((const uint16_t *)row + lane * D, v);
    } else if constexpr (KT != HM_CUDA_KV_Q8_0) {
#pragma unroll
        for (int i = 0; i < D; i++) v[i] = hmkv::elem<KT>(row, lane * D + i);
    } else {
        const int e = lane * D;
        const unsigned char *blk = row + (e / 32) * 34;
        const float d = __half2float(*(const __half *)blk);
        const signed char *qs = (const signed char *)blk + 2 + (e % 32);
#pragma unroll
        for (int i = 0; i < D; i++) v[i] = (float)qs[i] * d;
    }
}

/* Fold one position's K row kv and V row vv into the online softmax of the GC heads. */
template <int D, int GC>
__device__ __forceinline__ void attn_fold(const float (&qr)[GC][D], const float (&kv)[D], const float (&vv)[D],
                                          float (&o)[GC][D], float (&m)[GC], float (&l)[GC]) {
#pragma unroll
    for (int g = 0; g < GC; g++) {
        float sc = 0.0f;
#pragma unroll
        for (int i = 0; i < D; i++) sc = fmaf(qr[g][i], kv[i], sc);
        sc = warp_sum(sc);
        const float mn = fmaxf(m[g], sc);
        const float corr = expf(m[g] - mn), e = expf(sc - mn);
        l[g] = l[g] * corr + e;
#pragma unroll
        for (int i = 0; i < D; i++) o[g][i] = fmaf(o[g][i], corr, e * vv[i]);
        m[g] = mn;
    }
}

/* NEW: the next position's loads in flight while the current one is folded; with n_split == 1
 * the block writes out = O / L itself (out: [n_tok, n_head * HD]) instead of a partial. */
template <int D, int GC, bool NEW, int KT>
__global__ void __launch_bounds__(32 * ATTN_WARPS) k_attn_part(const float *__restrict__ q, const int32_t *__restrict__ pos,
                                                               const unsigned char *__restrict__ kc,
                                                               const unsigned char *__restrict__ vc,
                                                               int64_t n_ctx, int n_head, int n_kv_head, int n_hchunk,
                                                               float scale, int n_split, float *__restrict__ part,
                                                               float *__restrict__ out) {
    constexpr int HD = 32 * D;
    constexpr int RB = (int)hmkv::row_bytes<KT>(HD); /* bytes of a cache row */
    __shared__ float sm_m[ATTN_WARPS][GC], sm_l[ATTN_WARPS][GC];
    __shared__ float sm_o[ATTN_WARPS][GC][HD];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int s = blockIdx.x;
    const int kvh = blockIdx.y / n_hchunk, hc = blockIdx.y % n_hchunk;
    const int64_t t = blockIdx.z;
    const int G = n_head / n_kv_head;
    const int h0 = kvh * G + hc * GC;
    const int nh = min(GC, G - hc * GC);
    const int64_t n_kv = (int64_t)pos[t] + 1;
    const int64_t p0 = n_kv * s / n_split, p1 = n_kv * (s + 1) / n_split;

    float qr[GC][D], o[GC][D], m[GC], l[GC];
#pragma unroll
    for (int g = 0; g < GC; g++) {
        const float *qp = q + (t * n_head + h0 + (g < nh ? g : 0)) * HD + lane * D;
#pragma unroll
        for (int i = 0; i < D; i++) {
            qr[g][i] = qp[i] * scale;
            o[g][i] = 0.0f;
        }
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    const unsigned char *kb = kc + (int64_t)kvh * n_ctx * RB;
    const unsigned char *vb = vc + (int64_t)kvh * n_ctx * RB;
    if (NEW) {
        int64_t p = p0 + warp;
        float kv[D], vv[D];
        if (p < p1) {
            ld_row_d<D, KT>(kb + p * RB, lane, kv);
            ld_row_d<D, KT>(vb + p * RB, lane, vv);
        }
        for (; p < p1; p += ATTN_WARPS) {
            const int64_t pn = p + ATTN_WARPS;
            float kn[D], vn[D];
            if (pn < p1) {
                ld_row_d<D, KT>(kb + pn * RB, lane, kn);
                ld_row_d<D, KT>(vb + pn * RB, lane, vn);
            }
            attn_fold<D, GC>(qr, kv, vv, o, m, l);
            if (pn < p1) {
#pragma unroll
                for (int i = 0; i < D; i++) {
                    kv[i] = kn[i];
                    vv[i] = vn[i];
                }
            }
        }
    } else {
        for (int64_t p = p0 + warp; p < p1; p += ATTN_WARPS) {
            float kv[D], vv[D];
            ld_row_d<D, KT>(kb + p * RB, lane, kv);
            ld_row_d<D, KT>(vb + p * RB, lane, vv);
            attn_fold<D, GC>(qr, kv, vv, o, m, l);
        }
    }
#pragma unroll
    for (int g = 0; g < GC; g++) {
        if (lane == 0) {
            sm_m[warp][g] = m[g];
            sm_l[warp][g] = l[g];
        }
#pragma unroll
        for (int i = 0; i < D; i++) sm_o[warp][g][lane * D + i] = o[g][i];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < nh * HD; e += 32 * ATTN_WARPS) {
        const int g = e / HD, d = e % HD;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < ATTN_WARPS; w++) M = fmaxf(M, sm_m[w][g]);
        float L = 0.0f, O = 0.0f;
        if (M != -INFINITY) {
#pragma unroll
            for (int w = 0; w < ATTN_WARPS; w++) {
                const float f = expf(sm_m[w][g] - M);
                L += f * sm_l[w][g];
                O += f * sm_o[w][g][d];
            }
        }
        if (NEW && n_split == 1) {
            out[(t * n_head + h0 + g) * HD + d] = O / L;
            continue;
        }
        float *pp = part + ((t * n_head + h0 + g) * n_split + s) * (HD + 2);
        if (d == 0) {
            pp[0] = M;
            pp[1] = L;
        }
        pp[2 + d] = O;
    }
}

/* one block of head_dim threads per (token, q head) */
__global__ void k_attn_merge(const float *__restrict__ part, int n_split, int head_dim, float *__restrict__ out,
                             const float *__restrict__ sinks = nullptr, int n_head = 1) {
    const int64_t th = blockIdx.x;
    const int d = threadIdx.x;
    const float *pp = part + th * n_split * (head_dim + 2);
    float M = -INFINITY;
#pragma unroll 8
    for (int s = 0; s < n_split; s++)
        if (pp[s * (head_dim + 2) + 1] > 0.0f) M = fmaxf(M, pp[s * (head_dim + 2)]);
    float L = 0.0f, O = 0.0f;
#pragma unroll 8
    for (int s = 0; s < n_split; s++) {
        const float *ps = pp + s * (head_dim + 2);
        if (ps[1] == 0.0f) continue; /* empty range */
        const float f = expf(ps[0] - M);
        L += f * ps[1];
        O += f * ps[2 + d];
    }
    if (sinks && L > 0.0f) L += expf(sinks[th % n_head] - M); /* the sink: the denominator only */
    out[th * head_dim + d] = O / L;
}

/* The merge for many splits (decode at depth: up to 256 per row): one block of MW_THREADS per
 * (token, q head). The splits' maxima and weights exp(m_s - M) are found in parallel (each thread
 * a stride of splits, the block's reductions in a fixed tree), the weights kept in shared memory;
 * then MW_THREADS / head_dim groups of head_dim threads each sum a stride of the splits' O
 * columns, and the groups' sums are added in group order. Fixed orders: deterministic. */
#define MW_THREADS 512
__device__ __forceinline__ float block_reduce_mw(float v, float *red, bool is_max) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float u = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, u) : v + u;
    }
    __syncthreads(); /* red's earlier readers are done */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = red[0];
    for (int w = 1; w < MW_THREADS / 32; w++) v = is_max ? fmaxf(v, red[w]) : v + red[w];
    return v;
}

__global__ void __launch_bounds__(MW_THREADS) k_attn_merge_wide(const float *__restrict__ part, int n_split,
                                                                int head_dim, float *__restrict__ out,
                                                                const float *__restrict__ sinks, int n_head) {
    extern __shared__ float mw_smem[]; /* w [n_split], then acc [groups][head_dim] */
    __shared__ float red[MW_THREADS / 32];
    float *w = mw_smem, *acc = mw_smem + n_split;
    const int64_t th = blockIdx.x;
    const int tid = threadIdx.x, stride = head_dim + 2;
    const float *pp = part + th * n_split * stride;
    float mx = -INFINITY;
    for (int s = tid; s < n_split; s += MW_THREADS)
        if (pp[s * stride + 1] > 0.0f) mx = fmaxf(mx, pp[s * stride]);
    const float M = block_reduce_mw(mx, red, true);
    float ls = 0.0f;
    for (int s = tid; s < n_split; s += MW_THREADS) {
        const float l = pp[s * stride + 1];
        const float f = l > 0.0f ? expf(pp[s * stride] - M) : 0.0f; /* an empty range weighs nothing */
        w[s] = f;
        ls += f * l;
    }
    float L = block_reduce_mw(ls, red, false);
    __syncthreads(); /* w complete */
    const int groups = MW_THREADS / head_dim, j = tid / head_dim, d = tid % head_dim;
    if (j < groups) {
        float o = 0.0f;
        for (int s = j; s < n_split; s += groups) o += w[s] * pp[s * stride + 2 + d];
        acc[j * head_dim + d] = o;
    }
    __syncthreads();
    if (tid < head_dim) {
        float O = 0.0f;
        for (int g = 0; g < groups; g++) O += acc[g * head_dim + tid];
        if (sinks && L > 0.0f) L += expf(sinks[th % n_head] - M); /* the sink: the denominator only */
        out[th * head_dim + tid] = L > 0.0f ? O / L : 0.0f;
    }
}

hm_status hm_cuda_attn_merge_wide(hm_cuda_ctx *c, const float *part, int64_t rows, int n_split, int head_dim,
                                  const float *sinks, int n_head, float *out, hm_err *err) {
    HM_CU_ARG(rows >= 0 && rows < (1LL << 31) && n_split >= 1 && n_split <= 4096 && head_dim > 0 &&
              head_dim <= MW_THREADS && n_head > 0);
    if (!rows) return HM_OK;
    const size_t smem = sizeof(float) * ((size_t)n_split + (size_t)(MW_THREADS / head_dim) * (size_t)head_dim);
    k_attn_merge_wide<<<(unsigned)rows, MW_THREADS, smem, c->compute>>>(part, n_split, head_dim, out, sinks, n_head);
    HM_CU_LAUNCH("attention merge (wide)");
    return HM_OK;
}

hm_status hm_cuda_attn_merge(hm_cuda_ctx *c, const float *part, int64_t rows, int n_split, int head_dim, float *out,
                             hm_err *err) {
    return hm_cuda_attn_merge_sinks(c, part, rows, n_split, head_dim, NULL, 1, out, err);
}

hm_status hm_cuda_attn_merge_sinks(hm_cuda_ctx *c, const float *part, int64_t rows, int n_split, int head_dim,
                                   const float *sinks, int n_head, float *out, hm_err *err) {
    HM_CU_ARG(rows >= 0 && rows < (1LL << 31) && n_split >= 1 && head_dim > 0 && head_dim <= 1024 && n_head > 0);
    if (!rows) return HM_OK;
    k_attn_merge<<<(unsigned)rows, head_dim, 0, c->compute>>>(part, n_split, head_dim, out, sinks, n_head);
    HM_CU_LAUNCH("attention merge");
    return HM_OK;
}

template <int D, int KT>
static void launch_attn(hm_cuda_ctx *c, const float *q, int64_t n_tok, const int32_t *pos,
                        const unsigned char *kc, const unsigned char *vc, int64_t n_ctx, int n_head,
                        int n_kv_head, float scale, int n_split, float *part, float *out) {
    constexpr int GC = D == 8 ? 4 : 8;
    const int G = n_head / n_kv_head, n_hchunk = (G + GC - 1) / GC;
    const dim3 grid((unsigned)n_split, (unsigned)(n_kv_head * n_hchunk), (unsigned)n_tok);
    if (c->kern == HM_CUDA_KERN_OLD) {
        k_attn_part<D, GC, false, KT><<<grid, 32 * ATTN_WARPS, 0, c->compute>>>(q, pos, kc, vc, n_ctx, n_head, n_kv_head,
                                                                            n_hchunk, scale, n_split, part, out);
    } else {
        k_attn_part<D, GC, true, KT><<<grid, 32 * ATTN_WARPS, 0, c->compute>>>(q, pos, kc, vc, n_ctx, n_head, n_kv_head,
                                                                           n_hchunk, scale, n_split, part, out);
        if (n_split == 1) return;
    }
    k_attn_merge<<<(unsigned)(n_tok * n_head), 32 * D, 0, c->compute>>>(part, n_split, 32 * D, out);
}

hm_status hm_cuda_attention(hm_cuda_ctx *c, const float *q, int64_t n_tok, const int32_t *pos,
                            int64_t kv_len, const uint16_t *k_cache, const uint16_t *v_cache,
                            int64_t n_ctx, int n_head, int n_kv_head, int head_dim, float scale,
                            float *out, void *scratch, size_t scratch_size, hm_err *err) {
    return hm_cuda_attention_kv(c, HM_CUDA_KV_F16, q, n_tok, pos, kv_len, k_cache, v_cache, n_ctx, n_head, n_kv_head,
                                head_dim, scale, out, scratch, scratch_size, err);
}

hm_status hm_cuda_attention_kv(hm_cuda_ctx *c, hm_cuda_kv kv, const float *q, int64_t n_tok, const int32_t *pos,
                               int64_t kv_len, const void *k_cache, const void *v_cache, int64_t n_ctx, int n_head,
                               int n_kv_head, int head_dim, float scale, float *out, void *scratch,
                               size_t scratch_size, hm_err *err) {
    HM_CU_ARG(q && pos && k_cache && v_cache && out && n_kv_head > 0 && n_head % n_kv_head == 0);
    HM_CU_ARG(kv >= HM_CUDA_KV_F16 && kv <= HM_CUDA_KV_BF16);
    HM_CU_ARG(kv_len >= 1 && kv_len <= n_ctx && n_tok >= 0);
    if (head_dim != 64 && head_dim != 128 && head_dim != 256)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "cuda attention: head_dim %d (64, 128, 256 supported)", head_dim);
    if (!n_tok) return HM_OK;
    if (hm_cuda_flash_takes(c, n_tok, head_dim))
        return hm_cuda_flash_attention_kv(c, kv, q, n_tok, pos, kv_len, k_cache, v_cache, n_ctx, 0, n_head, n_kv_head,
                                          head_dim, scale, out, scratch, scratch_size, err);
    if (hm_cuda_flash_decode_on(c, n_tok, kv_len, head_dim))
        return hm_cuda_flash_decode_kv_sinks(c, kv, q, n_tok, pos, kv_len, k_cache, v_cache, n_ctx, 0, n_head,
                                             n_kv_head, head_dim, scale, NULL, out, scratch, scratch_size, err);
    HM_CU_ARG(n_tok <= 65535); /* grid.z of the exact kernels */
    const int ns = attn_splits(c, n_tok, kv_len, n_head, n_kv_head, head_dim);
    HM_CU_ARG(scratch && scratch_size >= hm_cuda_attention_scratch_size(c, n_tok, kv_len, n_head, n_kv_head, head_dim));
    float *part = (float *)scratch;
    const unsigned char *kc = (const unsigned char *)k_cache, *vc = (const unsigned char *)v_cache;
#define HM_ATTN_KT(KT)                                                                                                 \
    do {                                                                                                               \
        if (head_dim == 64) launch_attn<2, KT>(c, q, n_tok, pos, kc, vc, n_ctx, n_head, n_kv_head, scale, ns, part, out);   \
        else if (head_dim == 128) launch_attn<4, KT>(c, q, n_tok, pos, kc, vc, n_ctx, n_head, n_kv_head, scale, ns, part, out); \
        else launch_attn<8, KT>(c, q, n_tok, pos, kc, vc, n_ctx, n_head, n_kv_head, scale, ns, part, out);               \
    } while (0)
    switch (kv) {
    case HM_CUDA_KV_Q8_0: HM_ATTN_KT(HM_CUDA_KV_Q8_0); break;
    case HM_CUDA_KV_Q4_0: HM_ATTN_KT(HM_CUDA_KV_Q4_0); break;
    case HM_CUDA_KV_BF16: HM_ATTN_KT(HM_CUDA_KV_BF16); break;
    default: HM_ATTN_KT(HM_CUDA_KV_F16); break;
    }
#undef HM_ATTN_KT
    HM_CU_LAUNCH("attention");
    return HM_OK;
}
