/* cuda_flash.cu - flash attention for prefill: causal (optionally windowed) GQA attention of a
 * batch of queries over an f16 or q8_0 KV cache, Q.K^T and P.V on tensor cores, online softmax in
 * between, never materialising the score matrix.
 *
 * A q8_0, q4_0 or bf16 cache (cuda_kvq.cu) is dequantised while its tile is copied to shared memory:
 * code * scale (or the bf16 value) in f32, rounded to f16 once, into the same f16 tiles, so the mma
 * path is the f16 cache's. That adds one f16 rounding of each K and V value (relative 2^-12; exact
 * for bf16 values in f16's range) to the kernel's precision contract.
 *
 * One block of 8 warps (4 for head dims 256 and 512) takes BM = 16 per warp consecutive query rows
 * of one q head (and, for head_dim 512, one half of the output columns: grid.z). The block walks the
 * keys its rows can see in tiles of BN positions: from max(0, min pos - window + 1) to max pos.
 * Each tile's K and V rows are copied to shared memory (position p lives in row p % cap: a plain
 * cache has cap = n_ctx, a ring cache less); from an f16 cache by cp.async into two buffers, the
 * next tile's copy in flight while this one is computed. Each warp takes 16 query rows:
 *   S = Q K^T on mma.sync m16n8k16 (f16 in, f32 accumulate; Q scaled by scale / ln 2 and rounded
 *   to f16 once, so the softmax runs in base 2 on the special-function unit's ex2), masked per row
 *   (key > pos[t], or outside the window: -inf) in the tiles where some key is hidden from some
 *   row of the warp (the diagonal and the window's edge; the others skip the mask), the running
 *   max m and sum l updated, the earlier output rescaled, P = 2^(S - m) rounded to f16 and
 *   O += P V on the same mma, P fed straight from the accumulator registers (the C fragment of
 *   m16n8 is the A fragment of the next product).
 * At the end out = O / l. When the grid would be small (few query blocks: a long context at
 * -ub 512) each block's tiles are split over several blocks (grid.z), which write (m, l, O)
 * partials that cuda_attn.cu's merge kernel combines in split order. Everything happens in a fixed
 * order: deterministic run to run. The precision is that of f16 Q and P (NMSE 1e-8..1e-7 against
 * exact attention, test_cuda_flash_gpu bounds it); the
 * exact f32 kernels of cuda_attn.cu / cuda_gemma.cu stay for decode and for HOTMOE_FLASH_ATTN=0.
 * Needs sm_80+ (m16n8k16 f16 mma, ldmatrix). */
#include <climits>
#include <cuda_fp16.h>

#include "cuda_impl.h"
#include "cuda_kvq.cuh"

#define FA_PAD 8 /* halves of padding per shared row: rows 16 bytes apart mod 128, ldmatrix conflict-free */

namespace {

/* The tile shape of a head dim, in one place for the launch and the split planning: warps per
 * block (16 query rows each: 8 warps for head dims up to 128, so each K/V tile copied from L2
 * serves 128 queries; 4 for the wide heads, whose Q tile is large), output columns per block (two
 * blocks share a 512-wide head), keys per tile (fewer for wide heads, so the K tile fits beside Q
 * in shared memory) and K/V tile buffers (2: the next tile's copy (cp.async) runs while this one
 * is computed; an f16 cache up to head dim 256. The quantised caches dequantise through registers
 * and head dim 512 has no room for two: one). */
constexpr int fa_warps(int head_dim) { return head_dim <= 128 ? 8 : 4; }
constexpr int fa_bm(int head_dim) { return 16 * fa_warps(head_dim); }
constexpr int fa_dv(int head_dim) { return head_dim > 256 ? 256 : head_dim; }
constexpr int fa_bn(int head_dim) { return head_dim >= 256 ? 32 : 64; }
constexpr int fa_stages(int head_dim, int kt) { return kt == HM_CUDA_KV_F16 && head_dim <= 256 ? 2 : 1; }

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

/* d += a b: a the 16x16 f16 A fragment, b0 b1 the 16x8 B fragment, d the 16x8 f32 accumulator */
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* 16 bytes global -> shared without a register round trip; zeros when !valid (src unread). */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
/* waits until at most N of this thread's committed groups are still in flight */
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

/* 2^x on the special-function unit (relative error ~2^-22; ex2(-inf) = 0) */
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *(const uint32_t *)&h;
}

/* Copy BN cache rows (positions kb .. kb + BN - 1, those outside [0, kend) as zeros) of ncol halves
 * starting at column c0 into dst (row stride ld halves). */
template <int BN, int NT>
__device__ __forceinline__ void load_rows(__half *dst, int ld, const uint16_t *__restrict__ cache, int64_t cap,
                                          int head_dim, int c0, int ncol, int64_t kb, int64_t kend) {
    const int per_row = ncol / 8; /* 16-byte chunks */
    for (int i = threadIdx.x; i < BN * per_row; i += NT) {
        const int r = i / per_row, ch = i % per_row;
        const int64_t p = kb + r;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (p >= 0 && p < kend) v = *(const uint4 *)(cache + (p % cap) * head_dim + c0 + ch * 8);
        *(uint4 *)(dst + r * ld + ch * 8) = v;
    }
}

/* load_rows queued as cp.async copies (committed by the caller). */
template <int BN, int NT>
__device__ __forceinline__ void load_rows_async(__half *dst, int ld, const uint16_t *__restrict__ cache, int64_t cap,
                                                int head_dim, int c0, int ncol, int64_t kb, int64_t kend) {
    const int per_row = ncol / 8;
    for (int i = threadIdx.x; i < BN * per_row; i += NT) {
        const int r = i / per_row, ch = i % per_row;
        const int64_t p = kb + r;
        const bool ok = p >= 0 && p < kend;
        cp_async16(dst + r * ld + ch * 8, ok ? cache + (p % cap) * head_dim + c0 + ch * 8 : cache, ok);
    }
}

/* load_rows over a q8_0 / q4_0 / bf16 cache (KT: hm_cuda_kv): each 8-value chunk dequantised
 * (cuda_kvq.cuh) and rounded to f16. */
template <int BN, int KT, int NT>
__device__ __forceinline__ void load_rows_kv(__half *dst, int ld, const unsigned char *__restrict__ cache,
                                             int64_t cap, int head_dim, int c0, int ncol, int64_t kb, int64_t kend) {
    const int per_row = ncol / 8;
    const int64_t rb = hmkv::row_bytes<KT>(head_dim);
    for (int i = threadIdx.x; i < BN * per_row; i += NT) {
        const int r = i / per_row, ch = i % per_row;
        const int64_t p = kb + r;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (p >= 0 && p < kend) {
            const int e = c0 + ch * 8;
            const unsigned char *row = cache + (p % cap) * rb;
            uint32_t w[4];
#pragma unroll
            for (int j = 0; j < 4; j++)
                w[j] = pack_half2(hmkv::elem<KT>(row, e + 2 * j), hmkv::elem<KT>(row, e + 2 * j + 1));
            v = make_uint4(w[0], w[1], w[2], w[3]);
        }
        *(uint4 *)(dst + r * ld + ch * 8) = v;
    }
}

/* D: head_dim (K's width); DV: output columns per block (D, or D / 2 for 512); BN: keys per tile;
 * KT: the cache's format (hm_cuda_kv); MINB: blocks per multiprocessor the registers must allow
 * (2 caps them at 128 a thread for 8 warps: twice the warps in flight, a few bytes spilled, the
 * default for 8-warp f16 tiles: 1.15-1.25x faster on the H200 than 1, 181 registers and no spill,
 * which hm_cuda_set_flash_variant(1) selects). The tile shape and the buffering follow from D and
 * KT (fa_warps, fa_stages). sinks: per q head a logit added to the softmax's denominator only
 * (gpt-oss), NULL: none. */
template <int D, int DV, int BN, int KT, int MINB, int W, bool GR>
__global__ void __launch_bounds__(32 * W, MINB) k_flash(const float *__restrict__ q, const int32_t *__restrict__ pos,
                                                        int64_t n_tok, const void *__restrict__ kc,
                                                        const void *__restrict__ vc, int64_t cap, int32_t window,
                                                        int n_head, int n_kv_head, float scale, int n_split,
                                                        float *__restrict__ part, float *__restrict__ out,
                                                        const float *__restrict__ sinks) {
    constexpr int BM = 16 * W, NT = 32 * W, ST = fa_stages(D, KT);
    constexpr int LQ = D + FA_PAD, LV = DV + FA_PAD;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    __half *sQ = (__half *)fa_smem;  /* [BM][LQ], then per stage K [BN][LQ] and V [BN][LV] */
    __shared__ int32_t s_pos[BM];
    __shared__ int32_t s_lo[W], s_hi[W], s_pmin[W];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int G = n_head / n_kv_head;
    const int kvh = GR ? (int)blockIdx.y : (int)blockIdx.y / G;
    const int dz = blockIdx.z % (D / DV), split = blockIdx.z / (D / DV);
    const int c0 = dz * DV;
    const int64_t t0 = (int64_t)blockIdx.x * BM;
    /* Row r of the block: a query row of q head blockIdx.y, token t0 + r; or (GR) entry t0 + r of
     * the kv head's (token, head of its group) list, token (t0 + r) / G, head kvh G + (t0 + r) % G.
     * Its index in q / out as rows of head_dim: token * n_head + head; -1 past the batch. */
    const int64_t n_rows = GR ? n_tok * G : n_tok;
    auto row_at = [&](int64_t r) -> int64_t {
        const int64_t i = t0 + r;
        if (i >= n_rows) return -1;
        return GR ? i / G * n_head + (int64_t)kvh * G + i % G : i * n_head + blockIdx.y;
    };

    /* Q rows (scaled by scale / ln 2: the softmax runs in base 2; f16) and positions; rows past
     * the batch are zeros with position -1 (no keys) */
    const float qs = scale * 1.44269504088896341f;
    for (int i = threadIdx.x; i < BM * (D / 4); i += NT) {
        const int r = i / (D / 4), c = (i % (D / 4)) * 4;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const int64_t qr = row_at(r);
        if (qr >= 0) v = *(const float4 *)(q + qr * D + c);
        *(__half2 *)(sQ + r * LQ + c) = __floats2half2_rn(v.x * qs, v.y * qs);
        *(__half2 *)(sQ + r * LQ + c + 2) = __floats2half2_rn(v.z * qs, v.w * qs);
    }
    for (int r = threadIdx.x; r < BM; r += NT) s_pos[r] = t0 + r < n_rows ? pos[GR ? (t0 + r) / G : t0 + r] : -1;
    __syncthreads();
    /* each warp's visible key range [lo, hi], its rows' lowest position, and the block's range
     * (padding rows see no key and are never written: they do not count) */
    {
        const int p = s_pos[warp * 16 + (lane & 15)];
        int hi = p, lo = p < 0 ? INT_MAX : (window > 0 ? max(0, p - window + 1) : 0), pm = p < 0 ? INT_MAX : p;
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) {
            hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, o));
            lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
            pm = min(pm, __shfl_xor_sync(0xffffffffu, pm, o));
        }
        if (lane == 0) {
            s_lo[warp] = lo;
            s_hi[warp] = hi;
            s_pmin[warp] = pm;
        }
    }
    __syncthreads();
    int blo = INT_MAX, bhi = -1;
#pragma unroll
    for (int w = 0; w < W; w++) {
        blo = min(blo, s_lo[w]);
        bhi = max(bhi, s_hi[w]);
    }
    const int wlo = s_lo[warp], whi = s_hi[warp], wpmin = s_pmin[warp];
    const int g = lane >> 2, cq = lane & 3;
    const int pr0 = s_pos[warp * 16 + g], pr1 = s_pos[warp * 16 + g + 8];

    float o[DV / 8][4];
#pragma unroll
    for (int j = 0; j < DV / 8; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

    constexpr int64_t RB = hmkv::row_bytes<KT>(D); /* bytes of a cache row */
    const unsigned char *kbase = (const unsigned char *)kc + (int64_t)kvh * cap * RB;
    const unsigned char *vbase = (const unsigned char *)vc + (int64_t)kvh * cap * RB;
    const int64_t kend = (int64_t)bhi + 1;
    /* this block's share of the tiles: split of n_split (a KV split when the grid is small) */
    const int64_t n_tiles = (kend - blo + BN - 1) / BN;
    const int64_t kb0 = blo + n_tiles * split / n_split * BN, kb1 = blo + n_tiles * (split + 1) / n_split * BN;
    const int64_t kstop = kb1 < kend ? kb1 : kend;
    /* tile buffers: stage st's K at sQ + BM LQ + st (BN LQ + BN LV), its V after it */
    auto tile_k = [&](int st) { return sQ + BM * LQ + st * (BN * LQ + BN * LV); };
    auto tile_v = [&](int st) { return tile_k(st) + BN * LQ; };
    if constexpr (ST == 2) {
        if (kb0 < kstop) {
            load_rows_async<BN, NT>(tile_k(0), LQ, (const uint16_t *)kbase, cap, D, 0, D, kb0, kend);
            load_rows_async<BN, NT>(tile_v(0), LV, (const uint16_t *)vbase, cap, D, c0, DV, kb0, kend);
        }
        cp_async_commit();
    }
    int stage = 0;
    for (int64_t kb = kb0; kb < kstop; kb += BN, stage = ST == 2 ? stage ^ 1 : 0) {
        __syncthreads(); /* the previous tile's readers are done (its buffer is the next one's) */
        __half *sK = tile_k(stage), *sV = tile_v(stage);
        if constexpr (ST == 2) {
            /* queue the next tile's copy, then wait for this one's */
            if (kb + BN < kstop) {
                load_rows_async<BN, NT>(tile_k(stage ^ 1), LQ, (const uint16_t *)kbase, cap, D, 0, D, kb + BN, kend);
                load_rows_async<BN, NT>(tile_v(stage ^ 1), LV, (const uint16_t *)vbase, cap, D, c0, DV, kb + BN, kend);
            }
            cp_async_commit();
            cp_async_wait<1>();
        } else if constexpr (KT != HM_CUDA_KV_F16) {
            load_rows_kv<BN, KT, NT>(sK, LQ, kbase, cap, D, 0, D, kb, kend);
            load_rows_kv<BN, KT, NT>(sV, LV, vbase, cap, D, c0, DV, kb, kend);
        } else {
            load_rows<BN, NT>(sK, LQ, (const uint16_t *)kbase, cap, D, 0, D, kb, kend);
            load_rows<BN, NT>(sV, LV, (const uint16_t *)vbase, cap, D, c0, DV, kb, kend);
        }
        __syncthreads();
        if (kb > whi || kb + BN <= wlo) continue; /* no key of this tile is visible to this warp's rows */

        float s[BN / 8][4];
#pragma unroll
        for (int j = 0; j < BN / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t a[4];
            ldsm_x4(a, sQ + (warp * 16 + (lane & 15)) * LQ + kk * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int j = 0; j < BN / 16; j++) {
                uint32_t b[4];
                const int m = lane >> 3;
                ldsm_x4(b, sK + (j * 16 + (lane & 7) + (m >> 1) * 8) * LQ + kk * 16 + (m & 1) * 8);
                mma16816(s[2 * j], a, b[0], b[1]);
                mma16816(s[2 * j + 1], a, b[2], b[3]);
            }
        }
        /* the mask, where some key of the tile is hidden from some row of the warp (past its
         * position, or before its window; a padding row sees nothing), then the row maxima (rows g
         * and g + 8; a row's 8 values per tile are spread over the four lanes of a quad) */
        const bool full = kb + BN - 1 <= (int64_t)wpmin && (window <= 0 || kb > (int64_t)whi - window);
        if (!full) {
#pragma unroll
            for (int j = 0; j < BN / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int64_t key = kb + j * 8 + 2 * cq + (e & 1);
                    const int pr = e < 2 ? pr0 : pr1;
                    const bool ok = key <= pr && (window <= 0 || key > (int64_t)pr - window);
                    s[j][e] = ok ? s[j][e] : -INFINITY;
                }
        }
        float mx0 = m0, mx1 = m1;
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
            mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
        }
#pragma unroll
        for (int o2 = 1; o2 < 4; o2 <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o2));
        }
        /* a row with no visible key so far keeps m = -inf; its exponent base is 0 so nothing is NaN */
        const float b0 = mx0 == -INFINITY ? 0.0f : mx0, b1 = mx1 == -INFINITY ? 0.0f : mx1;
        const float f0 = ex2(m0 - b0), f1 = ex2(m1 - b1);
        m0 = mx0;
        m1 = mx1;
        float rs0 = 0.0f, rs1 = 0.0f;
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            s[j][0] = ex2(s[j][0] - b0);
            s[j][1] = ex2(s[j][1] - b0);
            s[j][2] = ex2(s[j][2] - b1);
            s[j][3] = ex2(s[j][3] - b1);
            rs0 += s[j][0] + s[j][1];
            rs1 += s[j][2] + s[j][3];
        }
        l0 = l0 * f0 + rs0;
        l1 = l1 * f1 + rs1;
#pragma unroll
        for (int j = 0; j < DV / 8; j++) {
            o[j][0] *= f0;
            o[j][1] *= f0;
            o[j][2] *= f1;
            o[j][3] *= f1;
        }
        /* O += P V, 16 keys per step */
#pragma unroll
        for (int j = 0; j < BN / 16; j++) {
            uint32_t a[4];
            a[0] = pack_half2(s[2 * j][0], s[2 * j][1]);
            a[1] = pack_half2(s[2 * j][2], s[2 * j][3]);
            a[2] = pack_half2(s[2 * j + 1][0], s[2 * j + 1][1]);
            a[3] = pack_half2(s[2 * j + 1][2], s[2 * j + 1][3]);
#pragma unroll
            for (int i = 0; i < DV / 16; i++) {
                uint32_t b[4];
                const int m = lane >> 3;
                ldsm_x4_t(b, sV + (j * 16 + (lane & 7) + (m & 1) * 8) * LV + i * 16 + (m >> 1) * 8);
                mma16816(o[2 * i], a, b[0], b[1]);
                mma16816(o[2 * i + 1], a, b[2], b[3]);
            }
        }
    }
    /* the row sums are spread over the quad too */
#pragma unroll
    for (int o2 = 1; o2 < 4; o2 <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, o2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, o2);
    }
    /* this lane's two rows (g and g + 8 of its warp) as rows of q / out, -1 past the batch */
    const int64_t r0 = row_at(warp * 16 + g), r1 = row_at(warp * 16 + g + 8);
    if (n_split > 1) {
        /* a partial: (m, l, unnormalised O) per row, as the merge of cuda_attn.cu reads them; rows
         * that saw no key have l = 0 and are skipped there */
        float *p0 = part + (r0 * n_split + split) * (D + 2);
        float *p1 = part + (r1 * n_split + split) * (D + 2);
        if (dz == 0 && cq == 0) { /* m back from base 2 to the merge's natural units */
            if (r0 >= 0) { p0[0] = m0 * 0.69314718055994531f; p0[1] = l0; }
            if (r1 >= 0) { p1[0] = m1 * 0.69314718055994531f; p1[1] = l1; }
        }
#pragma unroll
        for (int j = 0; j < DV / 8; j++) {
            const int col = 2 + c0 + j * 8 + 2 * cq;
            if (r0 >= 0) { p0[col] = o[j][0]; p0[col + 1] = o[j][1]; }
            if (r1 >= 0) { p1[col] = o[j][2]; p1[col + 1] = o[j][3]; }
        }
        return;
    }
    if (sinks) { /* the sink: the denominator only (m is in base 2, the sink's logit natural) */
        if (r0 >= 0) l0 += l0 > 0.0f ? ex2(sinks[r0 % n_head] * 1.44269504088896341f - m0) : 0.0f;
        if (r1 >= 0) l1 += l1 > 0.0f ? ex2(sinks[r1 % n_head] * 1.44269504088896341f - m1) : 0.0f;
    }
    const float i0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, i1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
#pragma unroll
    for (int j = 0; j < DV / 8; j++) {
        const int col = c0 + j * 8 + 2 * cq;
        if (r0 >= 0) *(float2 *)(out + r0 * D + col) = make_float2(o[j][0] * i0, o[j][1] * i0);
        if (r1 >= 0) *(float2 *)(out + r1 * D + col) = make_float2(o[j][2] * i1, o[j][3] * i1);
    }
}

/* The KV split of a batch: blocks of the grid without it, and the splits that bring it to about
 * FA_BLOCKS_PER_SM blocks per multiprocessor (a long context at -ub 512 is only a few query blocks
 * per head), at most FA_MAX_SPLIT and at least FA_MIN_TILES tiles of keys each. */
#define FA_BLOCKS_PER_SM 4
#define FA_MAX_SPLIT 16
#define FA_MIN_TILES 4
static int flash_splits(const hm_cuda_ctx *c, int64_t n_tok, int n_head, int head_dim, int64_t n_keys) {
    const int dz = head_dim / fa_dv(head_dim), bn = fa_bn(head_dim), bm = fa_bm(head_dim);
    const int64_t blocks = (n_tok + bm - 1) / bm * n_head * dz;
    const int64_t target = (int64_t)FA_BLOCKS_PER_SM * (c->n_sm > 0 ? c->n_sm : 1);
    int64_t s = (target + blocks - 1) / blocks;
    const int64_t by_len = (n_keys + bn - 1) / bn / FA_MIN_TILES;
    if (s > by_len) s = by_len;
    if (s > FA_MAX_SPLIT) s = FA_MAX_SPLIT;
    return s < 1 ? 1 : (int)s;
}

static size_t flash_part_bytes(int64_t n_tok, int n_head, int head_dim, int n_split) {
    return n_split > 1 ? (size_t)n_tok * (size_t)n_head * (size_t)n_split * ((size_t)head_dim + 2) * sizeof(float) : 0;
}

template <int D, int DV, int BN, int KT, int MINB, int W = fa_warps(D), bool GR = false>
hm_status launch_flash_b(hm_cuda_ctx *c, const float *q, int64_t n_tok, const int32_t *pos, const void *kc,
                       const void *vc, int64_t cap, int32_t window, int n_head, int n_kv_head, float scale,
                       int n_split, float *part, float *out, const float *sinks, hm_err *err) {
    constexpr int BM = 16 * W, ST = fa_stages(D, KT);
    const size_t smem = sizeof(__half) * ((size_t)BM * (D + FA_PAD) +
                                          (size_t)ST * ((size_t)BN * (D + FA_PAD) + (size_t)BN * (DV + FA_PAD)));
    /* the shared-memory opt-in is a property of the function on each device: set once per device
     * (the context's device is the current one here); idempotent, so a race only repeats it */
    static unsigned long long attr_set = 0;
    const unsigned long long bit = c->device >= 0 && c->device < 64 ? 1ull << c->device : 0;
    if (!bit || !(attr_set & bit)) {
        HM_CU(cudaFuncSetAttribute(k_flash<D, DV, BN, KT, MINB, W, GR>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)smem));
        attr_set |= bit;
    }
    const int64_t rows = GR ? n_tok * (n_head / n_kv_head) : n_tok;
    const dim3 grid((unsigned)((rows + BM - 1) / BM), (unsigned)(GR ? n_kv_head : n_head), (unsigned)(D / DV * n_split));
    k_flash<D, DV, BN, KT, MINB, W, GR><<<grid, 32 * W, smem, c->compute>>>(q, pos, n_tok, kc, vc, cap, window, n_head,
                                                                          n_kv_head, scale, n_split, part, out, sinks);
    HM_CU_LAUNCH("flash attention");
    if (n_split > 1 && GR) return hm_cuda_attn_merge_wide(c, part, n_tok * n_head, n_split, D, sinks, n_head, out, err);
    if (n_split > 1) return hm_cuda_attn_merge_sinks(c, part, n_tok * n_head, n_split, D, sinks, n_head, out, err);
    return HM_OK;
}

/* The 8-warp f16 tiles in the variant the context picked (hm_cuda_set_flash_variant: 0 two blocks
 * per multiprocessor, 1 registers unbounded). */
template <int D, int DV, int BN, int KT>
hm_status launch_flash(hm_cuda_ctx *c, const float *q, int64_t n_tok, const int32_t *pos, const void *kc,
                       const void *vc, int64_t cap, int32_t window, int n_head, int n_kv_head, float scale,
                       int n_split, float *part, float *out, const float *sinks, hm_err *err) {
    if constexpr (D <= 128 && KT == HM_CUDA_KV_F16)
        if (c->flash_variant != 1)
            return launch_flash_b<D, DV, BN, KT, 2>(c, q, n_tok, pos, kc, vc, cap, window, n_head, n_kv_head, scale,
                                                    n_split, part, out, sinks, err);
    return launch_flash_b<D, DV, BN, KT, 1>(c, q, n_tok, pos, kc, vc, cap, window, n_head, n_kv_head, scale, n_split,
                                            part, out, sinks, err);
}

} // namespace

bool hm_cuda_flash_takes(const hm_cuda_ctx *c, int64_t n_tok, int head_dim) {
    return c->flash && n_tok >= HM_CUDA_FLASH_MIN_TOK &&
           (head_dim == 64 || head_dim == 128 || head_dim == 256 || head_dim == 512);
}

size_t hm_cuda_flash_scratch_size(const hm_cuda_ctx *c, int64_t n_tok_max, int n_head, int head_dim, int64_t n_ctx) {
    /* the largest over batch sizes: fewer query blocks take more splits */
    size_t most = 0;
    if (!hm_cuda_flash_takes(c, n_tok_max, head_dim)) return 0;
    const int bm = fa_bm(head_dim);
    for (int64_t qb = 1; qb <= (n_tok_max + bm - 1) / bm; qb++) {
        int64_t nt = qb * bm < n_tok_max ? qb * bm : n_tok_max;
        if (nt < HM_CUDA_FLASH_MIN_TOK) nt = HM_CUDA_FLASH_MIN_TOK; /* smaller batches run the exact kernels */
        const size_t b = flash_part_bytes(nt, n_head, head_dim, flash_splits(c, nt, n_head, head_dim, n_ctx));
        if (b > most) most = b;
    }
    return most;
}

hm_status hm_cuda_flash_attention(hm_cuda_ctx *c, const float *q, int64_t n_tok, const int32_t *pos, int64_t kv_len,
                                  const uint16_t *k_cache, const uint16_t *v_cache, int64_t cap, int32_t window,
                                  int n_head, int n_kv_head, int head_dim, float scale, float *out, void *scratch,
                                  size_t scratch_size, hm_err *err) {
    return hm_cuda_flash_attention_kv(c, HM_CUDA_KV_F16, q, n_tok, pos, kv_len, k_cache, v_cache, cap, window, n_head,
                                      n_kv_head, head_dim, scale, out, scratch, scratch_size, err);
}

hm_status hm_cuda_flash_attention_kv(hm_cuda_ctx *c, hm_cuda_kv kv, const float *q, int64_t n_tok, const int32_t *pos,
                                     int64_t kv_len, const void *k_cache, const void *v_cache, int64_t cap,
                                     int32_t window, int n_head, int n_kv_head, int head_dim, float scale, float *out,
                                     void *scratch, size_t scratch_size, hm_err *err) {
    return hm_cuda_flash_attention_kv_sinks(c, kv, q, n_tok, pos, kv_len, k_cache, v_cache, cap, window, n_head,
                                            n_kv_head, head_dim, scale, NULL, out, scratch, scratch_size, err);
}

hm_status hm_cuda_flash_attention_kv_sinks(hm_cuda_ctx *c, hm_cuda_kv kv, const float *q, int64_t n_tok,
                                           const int32_t *pos, int64_t kv_len, const void *k_cache,
                                           const void *v_cache, int64_t cap, int32_t window, int n_head,
                                           int n_kv_head, int head_dim, float scale, const float *sinks, float *out,
                                           void *scratch, size_t scratch_size, hm_err *err) {
    HM_CU_ARG(q && pos && k_cache && v_cache && out && (const void *)q != (const void *)out && n_tok >= 0 && cap > 0 &&
              window >= 0);
    HM_CU_ARG(kv >= HM_CUDA_KV_F16 && kv <= HM_CUDA_KV_BF16);
    HM_CU_ARG(n_kv_head > 0 && n_head > 0 && n_head % n_kv_head == 0 && n_head <= 65535);
    HM_CU_ARG((n_tok + 63) / 64 < (1LL << 31)); /* query blocks (of 64 or more) in grid.x */
    if (!n_tok) return HM_OK;
    /* the keys one query sees at most: its window, or the whole context */
    const int64_t n_keys = window > 0 && window < kv_len ? window + n_tok : kv_len;
    int ns = flash_splits(c, n_tok, n_head, head_dim, n_keys);
    if (!scratch || flash_part_bytes(n_tok, n_head, head_dim, ns) > scratch_size) ns = 1; /* no room: no split */
    float *part = (float *)scratch;
#define HM_FA_KT(HD, KT)                                                                                               \
    launch_flash<HD, fa_dv(HD), fa_bn(HD), KT>(c, q, n_tok, pos, k_cache, v_cache, cap, window, n_head, n_kv_head,    \
                                               scale, ns, part, out, sinks, err)
#define HM_FA_CASE(HD)                                                                                                  \
    case HD:                                                                                                            \
        return kv == HM_CUDA_KV_Q8_0   ? HM_FA_KT(HD, HM_CUDA_KV_Q8_0)                                                 \
               : kv == HM_CUDA_KV_Q4_0 ? HM_FA_KT(HD, HM_CUDA_KV_Q4_0)                                                 \
               : kv == HM_CUDA_KV_BF16 ? HM_FA_KT(HD, HM_CUDA_KV_BF16)                                                 \
                                       : HM_FA_KT(HD, HM_CUDA_KV_F16);
    switch (head_dim) {
    HM_FA_CASE(64)
    HM_FA_CASE(128)
    HM_FA_CASE(256)
    HM_FA_CASE(512)
#undef HM_FA_CASE
#undef HM_FA_KT
    default:
        return hm_errf(err, HM_ERR_UNSUPPORTED, "flash attention: head_dim %d (takes 64, 128, 256, 512)", head_dim);
    }
}

/* Decode (batches below HM_CUDA_FLASH_MIN_TOK): the same kernel with one warp per block whose 16
 * rows are a kv head's (token, q head of its group) pairs, so each K/V tile read serves the whole
 * GQA group, and the key range split over enough blocks (about FD_BLOCKS_PER_SM per
 * multiprocessor, each at least FD_MIN_TILES tiles) to keep the memory system busy: decode at depth
 * is a read of the whole cache. The split by length is a power of two (it changes at kv lengths
 * 2^k FD_MIN_TILES BN + 1 only), so a captured decode graph keyed on it is captured again rarely. */
#define FD_BLOCKS_PER_SM 8
#define FD_MAX_SPLIT 256
#define FD_MIN_TILES 4
constexpr int fd_bn(int head_dim) { return head_dim <= 64 ? 32 : 16; }

static int decode_splits(const hm_cuda_ctx *c, int64_t n_tok, int n_head, int n_kv_head, int head_dim,
                         int64_t n_keys) {
    const int64_t g = n_head / n_kv_head, dz = head_dim / fa_dv(head_dim);
    const int64_t blocks = (n_tok * g + 15) / 16 * n_kv_head * dz;
    const int64_t per_sm = c->flash_variant == 2 ? 4 : c->flash_variant >= 3 ? 16 : FD_BLOCKS_PER_SM;
    const int64_t cap = c->flash_variant == 4 ? 4 * FD_MAX_SPLIT : FD_MAX_SPLIT;
    int64_t s = (per_sm * (c->n_sm > 0 ? c->n_sm : 1) + blocks - 1) / blocks;
    int64_t by_len = (n_keys + fd_bn(head_dim) - 1) / fd_bn(head_dim) / FD_MIN_TILES;
    while (by_len & (by_len - 1)) by_len &= by_len - 1;
    if (s > by_len) s = by_len;
    if (s > cap) s = cap;
    return s < 1 ? 1 : (int)s;
}

/* The split a decode batch runs with: decode_splits, halved until its partials fit the scratch. */
static int decode_splits_in(const hm_cuda_ctx *c, int64_t n_tok, int n_head, int n_kv_head, int head_dim,
                            int64_t n_keys, size_t scratch_size) {
    int ns = decode_splits(c, n_tok, n_head, n_kv_head, head_dim, n_keys);
    while (ns > 1 && flash_part_bytes(n_tok, n_head, head_dim, ns) > scratch_size) ns /= 2;
    return ns;
}

bool hm_cuda_flash_decode_takes(const hm_cuda_ctx *c, int64_t n_tok, int head_dim) {
    return c->flash && n_tok >= 1 && n_tok < HM_CUDA_FLASH_MIN_TOK &&
           (head_dim == 64 || head_dim == 128 || head_dim == 256 || head_dim == 512);
}

bool hm_cuda_flash_decode_on(const hm_cuda_ctx *c, int64_t n_tok, int64_t n_keys, int head_dim) {
    return hm_cuda_flash_decode_takes(c, n_tok, head_dim) && (head_dim < 256 || n_keys > 2048);
}

size_t hm_cuda_flash_decode_scratch_size(const hm_cuda_ctx *c, int64_t n_tok_max, int n_head, int n_kv_head,
                                         int head_dim, int64_t n_ctx) {
    size_t most = 0;
    if (n_kv_head <= 0 || n_head % n_kv_head || !hm_cuda_flash_decode_takes(c, 1, head_dim)) return 0;
    for (int64_t nt = 1; nt <= n_tok_max && nt < HM_CUDA_FLASH_MIN_TOK; nt++) {
        const size_t b = flash_part_bytes(nt, n_head, head_dim, decode_splits(c, nt, n_head, n_kv_head, head_dim, n_ctx));
        if (b > most) most = b;
    }
    return most;
}

int hm_cuda_flash_decode_splits(const hm_cuda_ctx *c, int64_t n_tok, int n_head, int n_kv_head, int head_dim,
                                int64_t kv_len, int32_t window, size_t scratch_size) {
    if (n_kv_head <= 0 || n_head % n_kv_head) return 1;
    const int64_t n_keys = window > 0 && window < kv_len ? window + n_tok : kv_len;
    return decode_splits_in(c, n_tok, n_head, n_kv_head, head_dim, n_keys, scratch_size);
}

hm_status hm_cuda_flash_decode_kv_sinks(hm_cuda_ctx *c, hm_cuda_kv kv, const float *q, int64_t n_tok,
                                        const int32_t *pos, int64_t kv_len, const void *k_cache, const void *v_cache,
                                        int64_t cap, int32_t window, int n_head, int n_kv_head, int head_dim,
                                        float scale, const float *sinks, float *out, void *scratch,
                                        size_t scratch_size, hm_err *err) {
    HM_CU_ARG(q && pos && k_cache && v_cache && out && (const void *)q != (const void *)out && cap > 0 && window >= 0);
    HM_CU_ARG(kv >= HM_CUDA_KV_F16 && kv <= HM_CUDA_KV_BF16);
    HM_CU_ARG(n_kv_head > 0 && n_kv_head <= 65535 && n_head > 0 && n_head % n_kv_head == 0);
    HM_CU_ARG(n_tok >= 0 && n_tok < HM_CUDA_FLASH_MIN_TOK && kv_len >= 1);
    if (!n_tok) return HM_OK;
    const int ns = hm_cuda_flash_decode_splits(c, n_tok, n_head, n_kv_head, head_dim, kv_len, window,
                                               scratch ? scratch_size : 0);
    float *part = (float *)scratch;
#define HM_FD_KT(HD, KT)                                                                                               \
    launch_flash_b<HD, fa_dv(HD), fd_bn(HD), KT, 1, 1, true>(c, q, n_tok, pos, k_cache, v_cache, cap, window, n_head, \
                                                             n_kv_head, scale, ns, part, out, sinks, err)
#define HM_FD_CASE(HD)                                                                                                  \
    case HD:                                                                                                            \
        return kv == HM_CUDA_KV_Q8_0   ? HM_FD_KT(HD, HM_CUDA_KV_Q8_0)                                                 \
               : kv == HM_CUDA_KV_Q4_0 ? HM_FD_KT(HD, HM_CUDA_KV_Q4_0)                                                 \
               : kv == HM_CUDA_KV_BF16 ? HM_FD_KT(HD, HM_CUDA_KV_BF16)                                                 \
                                       : HM_FD_KT(HD, HM_CUDA_KV_F16);
    switch (head_dim) {
    HM_FD_CASE(64)
    HM_FD_CASE(128)
    HM_FD_CASE(256)
    HM_FD_CASE(512)
#undef HM_FD_CASE
#undef HM_FD_KT
    default:
        return hm_errf(err, HM_ERR_UNSUPPORTED, "flash decode attention: head_dim %d (takes 64, 128, 256, 512)",
                       head_dim);
    }
}

void hm_cuda_set_flash(hm_cuda_ctx *c, bool on) { c->flash = on; }
void hm_cuda_set_flash_variant(hm_cuda_ctx *c, int v) { c->flash_variant = v; }
bool hm_cuda_flash_on(const hm_cuda_ctx *c) { return c->flash; }
