/* cuda_mmq.cu - the int8 tensor-core prefill matmul ("MMQ") for the K-quants: y = W x for
 * n_tok > HM_CUDA_MATVEC_MAX_TOK tokens, W of type Q4_K, Q5_K, Q6_K or IQ4_XS, or of the low-bit
 * Q3_K, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M (cuda_q8k_lowbit.cuh's units; a scale
 * per 16 elements, staged and multiplied as Q6_K's). Taken by
 * hm_cuda_matmul while the context's mmq switch is on (the default; HOTMOE_CUDA_MMQ=0 or
 * HOTMOE_CUDA_EXACT=1 when the context opens, or the hm_cuda_set_mmq test hook, turn it off);
 * otherwise the bf16 WMMA kernel of cuda_matmul.cu runs.
 *
 * Numerics: x is quantised to Q8_K exactly as the CPU's quantize_row_q8_K (cuda_quant.cuh's warp
 * quantiser), into the context's workspace, with the sums of every 32 codes (the CPU's bsums, for
 * the mins of Q4_K/Q5_K). The weights' quantised values go to shared memory as int8 (q8k<T>'s unit
 * decoders: Q4_K/Q5_K 0..31, Q6_K q - 32, IQ4_XS its levels) with their integer sub-block scales.
 * A sub-block (32 elements; 16 for Q6_K) times a token is one int32 from mma.sync m16n8k32 (m16n8k16
 * for Q6_K) s8 x s8, times its integer scale (IMAD); the mins' sum_j m_j * bsum_j is two more
 * m16n8k16 per block (bsum = 128 hi + lo). Both integers are exact, so each (row, 256-block,
 * token) integer equals the CPU vec_dot's; the block sums are then scaled and added in f32: only
 * the float order differs from the CPU (as the int8 decode path). hm_cuda_mmq_host_dot runs the
 * same staging and arithmetic on the host: the kernel must match it bit for bit.
 *
 * Measured (H200, test_cuda_mmq_gpu): a 4096 x 4096 Q4_K matmul of 512 tokens 205 us in bf16 WMMA,
 * 106 us here (Q6_K 265 -> 123 us); all-GPU pp512 of the Qwen3.6-35B-A3B shape 1954 -> 8235 t/s.
 * Cost model: per mma k32 a lane spends 4 IMAD applying the sub-block scale
 * (half-rate on sm_90), which outweighs the mma itself; the next steps are ldmatrix fragments,
 * cp.async double buffering of the next K block, and larger tiles (fewer L2 re-reads of x).
 *
 * Tile: a 128-thread block computes 64 rows x 64 tokens, one 256-element Q block per K step; each
 * warp owns a 32 x 32 corner (2 m16 x 4 n8 mma tiles). Shared rows are padded to 272 bytes so the
 * fragment loads (8 rows x 4 words per quarter) hit 32 distinct banks. Edge rows/tokens are zero.
 * Each output element is produced by one thread in a fixed order: deterministic. */
#include <stdlib.h>
#include <string.h>

#include "cuda_impl.h"
#include "cuda_quant.cuh"

using namespace hmcu;

#define MQ_BM 64          /* weight rows per tile */
#define MQ_BN 64          /* tokens per tile */
#define MQ_LD 272         /* byte pitch of the int8 tiles: 256 + 16 (68 words: conflict-free frags) */
#define MQ_SCP 17         /* int pitch of the per-row sub-block scales (16 + 1) */
#define MQ_WS_BYTES (16u << 20) /* the context's workspace at open: quantised activations, token chunks */
#define MQ_WS_MAX ((size_t)256 << 20) /* what big MoE micro-batches may grow it to (mmq_ws_grow) */
#define MQ_WS_HEADROOM ((size_t)512 << 20)
#define MQ_CHUNK_PAIRS 8192     /* (unit, token) pairs whose outputs a grown workspace holds at once */

/* Workspace bytes per token of ne0: int8 codes, a float scale per 256, an int sum per 32. */
static inline size_t mmq_tok_bytes(int64_t ne0) { return (size_t)ne0 + (size_t)(ne0 / 256) * 4 + (size_t)(ne0 / 32) * 4; }

/* Quantise x [n_tok, ne0] to Q8_K: q [n_tok, ne0], d [n_tok, ne0/256], s [n_tok, ne0/32] (sums of
 * 32 codes). One warp per (token, block), 8 warps per 256-thread block. */
__global__ void __launch_bounds__(256) k_mmq_quant(const float *__restrict__ x, int64_t ne0, int64_t n_tasks,
                                                   int8_t *__restrict__ q, float *__restrict__ d,
                                                   int *__restrict__ s) {
    const int lane = threadIdx.x & 31;
    const int64_t task = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (task >= n_tasks) return;
    const int64_t nb = ne0 / 256, t = task / nb, b = task - t * nb;
    int8_t *qb = q + t * ne0 + 256 * b;
    q8k_quant_block_warp(x + t * ne0 + 256 * b, qb, d + task, lane);
    __syncwarp();
    /* lane l < 8: sum of codes 32l .. 32l+31 (the same value as the CPU's bsums[2l] + bsums[2l+1]) */
    if (lane < 8) {
        const uint4 *p = (const uint4 *)(qb + 32 * lane);
        const uint4 a = p[0], c = p[1];
        s[task * 8 + lane] = q8_sum16(a) + q8_sum16(c);
    }
}

/* mma.sync s8 x s8 -> s32 with a zero accumulator: c = A (16 x K, row) * B (K x 8, col).
 * Fragments (PTX ISA, g = lane / 4, t = lane % 4): A word r holds A[g + 8 (r & 1)][4t + 16 (r >> 1) ..
 * + 3], B word r holds B[4t + 16 r .. + 3][g], c[e] = C[g + 8 (e >> 1)][2t + (e & 1)]. */
__device__ __forceinline__ void mma_k32(const uint32_t (&a)[4], const uint32_t (&b)[2], int (&c)[4]) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%10,%10,%10,%10};"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(0));
}
/* k16: A word r holds A[g + 8 r][4t .. + 3], B holds B[4t .. + 3][g]. */
__device__ __forceinline__ void mma_k16(const uint32_t (&a)[2], uint32_t b, int (&c)[4]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
                 "{%7,%7,%7,%7};"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(b), "r"(0));
}

/* Per type: the sub-block size (32, or 16 for Q6_K and the symmetric low-bit types of kind 3,
 * whose units carry a scale per 16: Q3_K, the grid i-quants) and whether there are mins (Q4_K,
 * Q5_K). */
template <int T> struct mmq_traits {
    static constexpr int S = T == HM_TYPE_Q6_K || q8k<T>::kind == 3 ? 16 : 32, NS = 256 / S;
    static constexpr bool mins = q8k<T>::kind == 0;
    /* blocks per multiprocessor the registers must allow: 4 (<= 128 a thread; no spills in
     * ptxas -v on sm_90 with the weight loads two units at a time and the j loop not unrolled) */
    static constexpr int min_blocks = 4;
};

/* Stage unit p of one row's block (decoded by q8k<T>) as the kernel's shared tiles hold it: its
 * 32 int8 values at dst[off1 ..], dst[off2 ..] (q6_K's 0..63 shifted to q - 32, so no offset term),
 * the integer scales of its sub-blocks at sc[j] (j = element / S), the mins at mn[j] (Q4_K/Q5_K),
 * and the row block's d, dmin (unit 0). Host and device: the host emulation checks this staging. */
template <int T, typename M>
HMCU_HD void mmq_stage(const qunit &u, int p, int8_t *dst, int *sc, M *mn, float *dw, float *dm) {
    using tr = mmq_traits<T>;
    using Q = q8kx<T>;
    uint32_t v1[4], v2[4];
HMCU_UNROLL
    for (int i = 0; i < 4; i++) {
        v1[i] = u.v1[i];
        v2[i] = u.v2[i];
        if constexpr (q8k<T>::kind == 1) { /* bytes 0..63: +96 never carries, ^0x80 makes it q - 32 */
            v1[i] = ((v1[i] | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
            v2[i] = ((v2[i] | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
        }
    }
    *(uint4 *)(dst + Q::off1(p)) = make_uint4(v1[0], v1[1], v1[2], v1[3]);
    *(uint4 *)(dst + Q::off2(p)) = make_uint4(v2[0], v2[1], v2[2], v2[3]);
    if constexpr (tr::S == 16) { /* q6_K, kind 3: every unit holds two whole sub-blocks of 16 */
        sc[Q::off1(p) / 16] = u.s1;
        sc[Q::off2(p) / 16] = u.s2;
    } else if constexpr (tr::mins) { /* units 2c, 2c + 1: the halves of sub-blocks 2c, 2c + 1 */
        if ((p & 1) == 0) {
            sc[Q::off1(p) / 32] = u.s1;
            sc[Q::off2(p) / 32] = u.s2;
            mn[Q::off1(p) / 32] = (M)u.m1;
            mn[Q::off2(p) / 32] = (M)u.m2;
        }
    } else { /* iq4_xs: unit p = sub-block p */
        sc[p] = u.s1;
    }
    if (p == 0) {
        *dw = u.d;
        *dm = u.dm;
    }
}

/* One 64 x 64 output tile of y = W x: rows r0 .. r0+63 of w (ne1 rows, stride nb1), tokens
 * t0 .. t0+63 below t_end, whose activations are row s = map ? map[tok] : tok of the quantised x:
 * codes xq + s * ne0, scales xd + s * ne0 / 256, 32-sums xs32 + s * ne0 / 32; the result of token
 * tok goes to y[(tok - y0) * ne1 + row]. */
template <int T>
__device__ __forceinline__ void mmq_tile(const uint8_t *__restrict__ w, size_t nb1, int64_t ne0, int64_t ne1,
                                         int64_t r0, const int8_t *__restrict__ xq, const float *__restrict__ xd,
                                         const int *__restrict__ xs32, const int32_t *__restrict__ map, int64_t t0,
                                         int64_t t_end, int64_t y0, float *__restrict__ y) {
    using tr = mmq_traits<T>;
    using Q = q8kx<T>;
    __shared__ __align__(16) int8_t ws[MQ_BM * MQ_LD];  /* [row][k] */
    __shared__ __align__(16) int8_t xs[MQ_BN * MQ_LD];  /* [token][k] */
    __shared__ int sc_s[MQ_BM * MQ_SCP];                /* [row][sub-block] integer scale */
    __shared__ __align__(16) int8_t mn_s[tr::mins ? MQ_BM * 16 : 4]; /* [row][sub-block] min, 0..63 (8 + 8 pad) */
    __shared__ float dw_s[MQ_BM], dm_s[MQ_BM];          /* row block scales d, dmin */
    __shared__ float xd_s[MQ_BN];                       /* token block scales */
    __shared__ __align__(16) int8_t xsl_s[tr::mins ? MQ_BN * 8 : 4]; /* [token][sub-block] 32-sum & 127 */
    __shared__ __align__(16) int8_t xsh_s[tr::mins ? MQ_BN * 8 : 4]; /* [token][sub-block] 32-sum >> 7 */

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp >> 1, wn = warp & 1, g = lane >> 2, t4 = lane & 3;
    const int64_t nb = ne0 / 256;

    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

    for (int64_t kb = 0; kb < nb; kb++) {
        /* weights: 64 rows x 8 units, 4 units a thread (8 consecutive lanes = one row's block) */
#pragma unroll 2
        for (int it = 0; it < 4; it++) {
            const int task = tid + 128 * it, r = task >> 3, p = task & 7;
            const int64_t row = r0 + r;
            int8_t *dst = ws + r * MQ_LD;
            if (row < ne1) {
                const uint8_t *blk = w + row * nb1 + kb * Q::size;
                const qunit u = Q::dec(Q::load(blk, p), blk, p);
                mmq_stage<T>(u, p, dst, sc_s + r * MQ_SCP, tr::mins ? mn_s + r * 16 : nullptr, dw_s + r, dm_s + r);
            } else {
                *(uint4 *)(dst + Q::off1(p)) = make_uint4(0, 0, 0, 0);
                *(uint4 *)(dst + Q::off2(p)) = make_uint4(0, 0, 0, 0);
                if (p == 0) {
                    dw_s[r] = 0.0f;
                    dm_s[r] = 0.0f;
#pragma unroll
                    for (int j = 0; j < 16; j++) sc_s[r * MQ_SCP + j] = 0;
                    if constexpr (tr::mins)
#pragma unroll
                        for (int j = 0; j < 8; j++) mn_s[r * 16 + j] = 0;
                }
            }
        }
        /* activations: 64 tokens x 256 codes (16 x 16 bytes each), their scale and 32-sums */
#pragma unroll
        for (int it = 0; it < 8; it++) {
            const int task = tid + 128 * it, tk = task >> 4, c = task & 15;
            const int64_t tok = t0 + tk;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (tok < t_end) v = __ldg((const uint4 *)(xq + (map ? (int64_t)__ldg(map + tok) : tok) * ne0 + kb * 256) + c);
            *(uint4 *)(xs + tk * MQ_LD + 16 * c) = v;
        }
        if (tid < MQ_BN) {
            const int64_t tok = t0 + tid;
            xd_s[tid] = tok < t_end ? __ldg(xd + (map ? (int64_t)__ldg(map + tok) : tok) * nb + kb) : 0.0f;
        }
        if constexpr (tr::mins)
#pragma unroll
            for (int it = 0; it < 4; it++) {
                const int task = tid + 128 * it, tk = task >> 3, j = task & 7;
                const int64_t tok = t0 + tk;
                const int v = tok < t_end ? __ldg(xs32 + ((map ? (int64_t)__ldg(map + tok) : tok) * nb + kb) * 8 + j) : 0;
                xsl_s[tk * 8 + j] = (int8_t)(v & 127); /* |v| <= 32 * 127: v >> 7 in -32 .. 31 */
                xsh_s[tk * 8 + j] = (int8_t)(v >> 7);
            }
        __syncthreads();

        int isum[2][4][4];
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) isum[i][j][e] = 0;
        const int8_t *wa = ws + (32 * wm + g) * MQ_LD + 4 * t4, *xb = xs + (32 * wn + g) * MQ_LD + 4 * t4;
#pragma unroll 1
        for (int j = 0; j < tr::NS; j++) {
            int scr[2][2];
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int h = 0; h < 2; h++) scr[i][h] = sc_s[(32 * wm + 16 * i + 8 * h + g) * MQ_SCP + j];
            if constexpr (tr::S == 32) {
                uint32_t a[2][4], b[4][2];
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int r = 0; r < 4; r++)
                        a[i][r] = *(const uint32_t *)(wa + (16 * i + 8 * (r & 1)) * MQ_LD + 32 * j + 16 * (r >> 1));
#pragma unroll
                for (int n = 0; n < 4; n++)
#pragma unroll
                    for (int r = 0; r < 2; r++) b[n][r] = *(const uint32_t *)(xb + 8 * n * MQ_LD + 32 * j + 16 * r);
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int n = 0; n < 4; n++) {
                        int c[4];
                        mma_k32(a[i], b[n], c);
#pragma unroll
                        for (int e = 0; e < 4; e++) isum[i][n][e] += scr[i][e >> 1] * c[e];
                    }
            } else {
                uint32_t a[2][2], b[4];
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int r = 0; r < 2; r++) a[i][r] = *(const uint32_t *)(wa + (16 * i + 8 * r) * MQ_LD + 16 * j);
#pragma unroll
                for (int n = 0; n < 4; n++) b[n] = *(const uint32_t *)(xb + 8 * n * MQ_LD + 16 * j);
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int n = 0; n < 4; n++) {
                        int c[4];
                        mma_k16(a[i], b[n], c);
#pragma unroll
                        for (int e = 0; e < 4; e++) isum[i][n][e] += scr[i][e >> 1] * c[e];
                    }
            }
        }
        /* scale: acc += (d_w d_x) isum, then acc -= (dmin_w d_x) sum_j m_j bsum_j, per (row, token) */
        float dw[2][2], dm[2][2], dx[4][2];
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                dw[i][h] = dw_s[32 * wm + 16 * i + 8 * h + g];
                dm[i][h] = dm_s[32 * wm + 16 * i + 8 * h + g];
            }
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int e2 = 0; e2 < 2; e2++) dx[n][e2] = xd_s[32 * wn + 8 * n + 2 * t4 + e2];
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    acc[i][n][e] = fmaf(dw[i][e >> 1] * dx[n][e & 1], (float)isum[i][n][e], acc[i][n][e]);
                }
        if constexpr (tr::mins) {
            /* sum_j m_j bsum_j as two m16n8k16 mma (k = the 8 sub-blocks, lanes t4 >= 2 give the
             * zero padding): bsum = 128 hi + lo with lo in 0..127, hi in -32..31, so the min sum
             * is 128 C_hi + C_lo exactly. A = the rows' mins, B = the tokens' split 32-sums. */
            uint32_t am[2][2], bl[4], bh[4];
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    am[i][h] = t4 < 2 ? *(const uint32_t *)(mn_s + (32 * wm + 16 * i + 8 * h + g) * 16 + 4 * t4) : 0u;
#pragma unroll
            for (int n = 0; n < 4; n++) {
                const int o = (32 * wn + 8 * n + g) * 8 + 4 * t4;
                bl[n] = t4 < 2 ? *(const uint32_t *)(xsl_s + o) : 0u;
                bh[n] = t4 < 2 ? *(const uint32_t *)(xsh_s + o) : 0u;
            }
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int n = 0; n < 4; n++) {
                    int cl[4], ch[4];
                    mma_k16(am[i], bl[n], cl);
                    mma_k16(am[i], bh[n], ch);
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        acc[i][n][e] = fmaf(-(dm[i][e >> 1] * dx[n][e & 1]), (float)(128 * ch[e] + cl[e]), acc[i][n][e]);
                }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t row = r0 + 32 * wm + 16 * i + 8 * (e >> 1) + g;
                const int64_t tok = t0 + 32 * wn + 8 * n + 2 * t4 + (e & 1);
                if (row < ne1 && tok < t_end) y[(tok - y0) * ne1 + row] = acc[i][n][e];
            }
}

template <int T>
__global__ void __launch_bounds__(128, mmq_traits<T>::min_blocks) k_mmq(const uint8_t *__restrict__ w, size_t nb1,
                                                                        int64_t ne0, int64_t ne1, const int8_t *__restrict__ xq,
                                                                        const float *__restrict__ xd, const int *__restrict__ xs32,
                                                                        int64_t n_tok, float *__restrict__ y) {
    mmq_tile<T>(w, nb1, ne0, ne1, (int64_t)blockIdx.x * MQ_BM, xq, xd, xs32, nullptr, (int64_t)blockIdx.y * MQ_BN, n_tok,
                0, y);
}

template <int T>
static void launch_mmq(cudaStream_t st, const hm_cuda_mat *w, const int8_t *q, const float *d, const int *s,
                       int64_t n_tok, float *y) {
    const dim3 grid(hm_cu_blocks(w->ne1, MQ_BM), hm_cu_blocks(n_tok, MQ_BN));
    k_mmq<T><<<grid, 128, 0, st>>>((const uint8_t *)w->data, w->nb1, w->ne0, w->ne1, q, d, s, n_tok, y);
}

bool hm_cuda_mmq_takes(const hm_cuda_ctx *c, const hm_cuda_mat *w) {
    return c->mmq_ws && q8k_mmq_type(w->type) && w->ne0 % 256 == 0 && mmq_tok_bytes(w->ne0) <= c->mmq_ws_size;
}

hm_status hm_cuda_mmq_run(hm_cuda_ctx *c, const hm_cuda_mat *w, const float *x, int64_t n_tok, float *y,
                          hm_err *err) {
    const int64_t ne0 = w->ne0, nb = ne0 / 256;
    const int64_t chunk = (int64_t)(c->mmq_ws_size / mmq_tok_bytes(ne0));
    for (int64_t t0 = 0; t0 < n_tok; t0 += chunk) {
        const int64_t nt = n_tok - t0 < chunk ? n_tok - t0 : chunk;
        int8_t *q = (int8_t *)c->mmq_ws;
        float *d = (float *)(q + nt * ne0);
        int *s = (int *)(d + nt * nb);
        const int64_t n_tasks = nt * nb;
        k_mmq_quant<<<hm_cu_blocks(n_tasks, 8), 256, 0, c->compute>>>(x + t0 * ne0, ne0, n_tasks, q, d, s);
        float *yc = y + t0 * w->ne1;
        switch (w->type) {
#define HM_MMQ_CASE(T) case T: launch_mmq<T>(c->compute, w, q, d, s, nt, yc); break;
            HM_CUDA_FOR_MMQ_TYPES(HM_MMQ_CASE)
#undef HM_MMQ_CASE
        default: return hm_errf(err, HM_ERR_UNSUPPORTED, "cuda mmq: type %s", hm_type_name(w->type));
        }
        HM_CU_LAUNCH("mmq");
    }
    return HM_OK;
}

/* ---- the grouped MoE down projection (hm_cuda_moe_act's launch B for prefill batches) ---- */

/* Tile (x: 64 rows, y: unit a0 + y, z: 64 of its pairs) of y_i = M_u v_i, M = the unit's gate
 * (which 0), up (1) or down (2) of ne1 rows of ne0, v_i the quantised row map ? map[i] : i (x of
 * the pair's token for gate / up, h_i for down), into y[(i - y0) * ne1 + row]. */
template <int T>
__global__ void __launch_bounds__(128, mmq_traits<T>::min_blocks)
k_mmq_moe(const moe_unit_dev *__restrict__ units, int a0, int which, size_t nb1, int64_t ne0, int64_t ne1,
          const int8_t *__restrict__ vq, const float *__restrict__ vd, const int *__restrict__ vs,
          const int32_t *__restrict__ map, int64_t y0, float *__restrict__ y) {
    const moe_unit_dev u = units[a0 + (int)blockIdx.y];
    const int64_t t0 = (int64_t)u.pair0 + (int64_t)blockIdx.z * MQ_BN, t_end = (int64_t)u.pair0 + u.n_pair;
    if (t0 >= t_end) return; /* the whole block: before any barrier */
    const uint8_t *w = which == 0 ? u.gate : which == 1 ? u.up : u.down;
    mmq_tile<T>(w, nb1, ne0, ne1, (int64_t)blockIdx.x * MQ_BM, vq, vd, vs, map, t0, t_end, y0, y);
}

/* h[i][r] = act(h[i][r]) * ub[i - p0][r] for pairs i in [p0, p1) (the gate's result is in h). */
__global__ void __launch_bounds__(256) k_mmq_moe_act(float *__restrict__ h, const float *__restrict__ ub, int64_t p0,
                                                     int64_t p1, int64_t n_ff, int act, float lim) {
    const int64_t e = (int64_t)blockIdx.x * 256 + threadIdx.x, n = (p1 - p0) * n_ff;
    if (e >= n) return;
    h[p0 * n_ff + e] = act_mul(act, lim, h[p0 * n_ff + e], ub[e]);
}

/* out[t][r] += sum over t's pairs i in [p0, p1), in tok_pairs (unit) order, of w_i y_i[r], as
 * k_moe_down sums them; nothing when t has no pair there. */
__global__ void __launch_bounds__(256) k_mmq_moe_sum(const float *__restrict__ pair_w, const int32_t *__restrict__ tok_start,
                                                     const int32_t *__restrict__ tok_pairs, const float *__restrict__ yb,
                                                     int64_t p0, int64_t p1, int64_t n_embd, float *__restrict__ out) {
    const int64_t r = (int64_t)blockIdx.x * 256 + threadIdx.x, t = blockIdx.y;
    if (r >= n_embd) return;
    float acc = 0.0f;
    bool any = false;
    for (int32_t q = tok_start[t]; q < tok_start[t + 1]; q++) {
        const int32_t i = tok_pairs[q];
        if (i < p0 || i >= p1) continue;
        acc = fmaf(pair_w[i], yb[(i - p0) * n_embd + r], acc);
        any = true;
    }
    if (any) out[t * n_embd + r] += acc;
}

/* Workspace bytes of n rows of ne0 quantised (codes, scales, 32-sums), rounded up to 256. */
static size_t mmq_rows_bytes(int64_t n, int64_t ne0) { return ((size_t)n * mmq_tok_bytes(ne0) + 255) & ~(size_t)255; }

/* Grows c's workspace to need bytes (at most MQ_WS_MAX) when it is smaller: a big micro-batch's
 * projections then run in a few chunks of units instead of dozens of small launches (at -ub 2048
 * on the Qwen3.6 shape, 16 MB made the down projection 20 launches). The new buffer is allocated
 * before the old one is freed (after the queued work that may read it): when VRAM is short the old
 * one stays and the projections run in more chunks, as before; it also stays when the growth would
 * leave less than MQ_WS_HEADROOM free on the device (what later allocations of a session may need). */
static void mmq_ws_grow(hm_cuda_ctx *c, size_t need) {
    need = (need + MQ_WS_BYTES - 1) / MQ_WS_BYTES * MQ_WS_BYTES;
    if (need > MQ_WS_MAX) need = MQ_WS_MAX;
    if (need <= c->mmq_ws_size) return;
    void *p = NULL;
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(c->device) != cudaSuccess || cudaMemGetInfo(&free_b, &total_b) != cudaSuccess ||
        free_b < need + MQ_WS_HEADROOM || cudaMalloc(&p, need) != cudaSuccess) {
        (void)cudaGetLastError(); /* not sticky: the old workspace serves */
        return;
    }
    if (cudaStreamSynchronize(c->compute) != cudaSuccess) {
        cudaFree(p);
        return;
    }
    cudaFree(c->mmq_ws);
    c->mmq_ws = p;
    c->mmq_ws_size = need;
}

int hm_cuda_mmq_moe_plan(hm_cuda_ctx *c, int gate_type, int down_type, int64_t n_batch, int64_t n_pairs,
                         int64_t n_embd, int64_t n_ff, int64_t max_pair) {
    if (!c->mmq_ws || n_batch <= HM_CUDA_MATVEC_MAX_TOK || n_ff % 256) return 0;
    {
        /* room for each projection's quantised input and MQ_CHUNK_PAIRS pairs' outputs */
        const size_t cp = (size_t)(n_pairs < MQ_CHUNK_PAIRS ? n_pairs : MQ_CHUNK_PAIRS);
        const size_t a = mmq_rows_bytes(n_batch, n_embd) + cp * (size_t)n_ff * 4;
        const size_t b = mmq_rows_bytes(n_pairs, n_ff) + cp * (size_t)n_embd * 4;
        mmq_ws_grow(c, a > b ? a : b);
    }
    int plan = 0;
    if (q8k_mmq_type(gate_type) && n_embd % 256 == 0 &&
        mmq_rows_bytes(n_batch, n_embd) + (size_t)max_pair * (size_t)n_ff * 4 <= c->mmq_ws_size)
        plan |= HM_CUDA_MMQ_GATE_UP;
    if (q8k_mmq_type(down_type) && mmq_rows_bytes(n_pairs, n_ff) + (size_t)max_pair * (size_t)n_embd * 4 <= c->mmq_ws_size)
        plan |= HM_CUDA_MMQ_DOWN;
    return plan;
}

template <int T>
static void launch_moe_tiles(cudaStream_t st, const moe_unit_dev *ud, int a0, int n_u, int max_tiles, int which,
                             int64_t ne0, int64_t ne1, const int8_t *vq, const float *vd, const int *vs,
                             const int32_t *map, int64_t y0, float *y) {
    const dim3 grid(hm_cu_blocks(ne1, MQ_BM), (unsigned)n_u, (unsigned)max_tiles);
    k_mmq_moe<T><<<grid, 128, 0, st>>>(ud, a0, which, hm_row_size(T, ne0), ne0, ne1, vq, vd, vs, map, y0, y);
}

/* M_u v for the units [a, a1) of every chunk whose outputs fit cap pairs: tiles(a, a1, p0, np,
 * max_tiles) launches a chunk, then after(p0, np) (the chunk's epilogue). */
template <class F, class G>
static hm_status mmq_moe_chunks(const moe_unit_dev *ud_host, int n_active, int64_t cap, F tiles, G after, hm_err *err) {
    for (int a = 0; a < n_active;) {
        const int64_t p0 = ud_host[a].pair0;
        int64_t np = 0;
        int a1 = a, max_tiles = 0;
        while (a1 < n_active && np + ud_host[a1].n_pair <= cap) {
            np += ud_host[a1].n_pair;
            const int nt = (int)hm_cu_blocks(ud_host[a1].n_pair, MQ_BN);
            if (nt > max_tiles) max_tiles = nt;
            a1++;
        }
        if (a1 == a) /* the plan checked cap >= the largest unit */
            return hm_errf(err, HM_ERR_INTERNAL, "cuda mmq moe: unit of %d pairs over the workspace", (int)ud_host[a].n_pair);
        if (!tiles(a, a1, max_tiles)) return hm_errf(err, HM_ERR_UNSUPPORTED, "cuda mmq moe: weight type");
        after(p0, np);
        a = a1;
    }
    return HM_OK;
}

/* Dispatch of the unit tiles by weight type (false: not a type of the int8 path). */
static bool moe_tiles(int type, cudaStream_t st, const moe_unit_dev *ud, int a0, int n_u, int max_tiles, int which,
                      int64_t ne0, int64_t ne1, const int8_t *vq, const float *vd, const int *vs, const int32_t *map,
                      int64_t y0, float *y) {
    switch (type) {
#define HM_MMQ_MOE_CASE(T) \
    case T: launch_moe_tiles<T>(st, ud, a0, n_u, max_tiles, which, ne0, ne1, vq, vd, vs, map, y0, y); return true;
        HM_CUDA_FOR_MMQ_TYPES(HM_MMQ_MOE_CASE)
#undef HM_MMQ_MOE_CASE
    default: return false;
    }
}

/* The workspace of one grouped-MoE projection (the plan checked that it fits): its n input rows of
 * ne quantised (codes q, scales d, 32-sums s, as k_mmq_quant writes them), then y, room for cap
 * pairs' outputs of ne_out floats (one chunk of units). */
struct mmq_moe_ws {
    int8_t *q;
    float *d;
    int *s;
    float *y;
    int64_t cap;
};

/* Carves c's workspace for v (n rows of ne) and outputs of ne_out, and queues v's quantisation. */
static mmq_moe_ws mmq_moe_quant(hm_cuda_ctx *c, const float *v, int64_t n, int64_t ne, int64_t ne_out) {
    const int64_t nb = ne / 256;
    mmq_moe_ws w;
    w.q = (int8_t *)c->mmq_ws;
    w.d = (float *)(w.q + n * ne);
    w.s = (int *)(w.d + n * nb);
    w.y = (float *)((char *)c->mmq_ws + mmq_rows_bytes(n, ne));
    w.cap = (int64_t)((c->mmq_ws_size - mmq_rows_bytes(n, ne)) / ((size_t)ne_out * 4));
    k_mmq_quant<<<hm_cu_blocks(n * nb, 8), 256, 0, c->compute>>>(v, ne, n * nb, w.q, w.d, w.s);
    return w;
}

hm_status hm_cuda_mmq_moe_gate_up(hm_cuda_ctx *c, int gate_type, int act, float lim, const moe_unit_dev *ud_host,
                                  const moe_unit_dev *ud, int n_active, const int32_t *pair_tok, const float *x,
                                  int64_t n_batch, int64_t n_embd, int64_t n_ff, float *h, hm_err *err) {
    const mmq_moe_ws w = mmq_moe_quant(c, x, n_batch, n_embd, n_ff);
    cudaStream_t st = c->compute;
    hm_status s = mmq_moe_chunks(
        ud_host, n_active, w.cap,
        [&](int a, int a1, int mt) {
            const int64_t p0 = ud_host[a].pair0;
            return moe_tiles(gate_type, st, ud, a, a1 - a, mt, 0, n_embd, n_ff, w.q, w.d, w.s, pair_tok, 0, h) &&
                   moe_tiles(gate_type, st, ud, a, a1 - a, mt, 1, n_embd, n_ff, w.q, w.d, w.s, pair_tok, p0, w.y);
        },
        [&](int64_t p0, int64_t np) {
            k_mmq_moe_act<<<hm_cu_blocks(np * n_ff, 256), 256, 0, st>>>(h, w.y, p0, p0 + np, n_ff, act, lim);
        },
        err);
    if (s) return s;
    HM_CU_LAUNCH("mmq moe gate/up");
    return HM_OK;
}

hm_status hm_cuda_mmq_moe_down(hm_cuda_ctx *c, int down_type, const moe_unit_dev *ud_host, const moe_unit_dev *ud,
                               int n_active, const float *pair_w, const int32_t *tok_start, const int32_t *tok_pairs,
                               const float *h, int64_t n_batch, int64_t n_pairs, int64_t n_embd, int64_t n_ff,
                               float *out, hm_err *err) {
    const mmq_moe_ws w = mmq_moe_quant(c, h, n_pairs, n_ff, n_embd);
    cudaStream_t st = c->compute;
    hm_status s = mmq_moe_chunks(
        ud_host, n_active, w.cap,
        [&](int a, int a1, int mt) {
            return moe_tiles(down_type, st, ud, a, a1 - a, mt, 2, n_ff, n_embd, w.q, w.d, w.s, nullptr, ud_host[a].pair0, w.y);
        },
        [&](int64_t p0, int64_t np) {
            k_mmq_moe_sum<<<dim3(hm_cu_blocks(n_embd, 256), (unsigned)n_batch), 256, 0, st>>>(
                pair_w, tok_start, tok_pairs, w.y, p0, p0 + np, n_embd, out);
        },
        err);
    if (s) return s;
    HM_CU_LAUNCH("mmq moe down");
    return HM_OK;
}

hm_status hm_cuda_set_mmq(hm_cuda_ctx *c, bool on, hm_err *err) {
    if (!on) {
        if (c->mmq_ws) {
            HM_CU(cudaSetDevice(c->device));
            HM_CU(cudaStreamSynchronize(c->compute)); /* queued matmuls may still read it */
            HM_CU(cudaFree(c->mmq_ws));
        }
        c->mmq_ws = NULL;
        c->mmq_ws_size = 0;
        return HM_OK;
    }
    if (c->mmq_ws) return HM_OK;
    HM_CU(cudaSetDevice(c->device));
    HM_CU(cudaMalloc(&c->mmq_ws, MQ_WS_BYTES));
    c->mmq_ws_size = MQ_WS_BYTES;
    return HM_OK;
}

/* ---- host emulation (a test hook: tests/test_cuda_mmq_gpu.c checks the staging and the block
 * arithmetic against the CPU's vec_dot without a GPU; on a GPU, the kernel must match it bit for
 * bit, which checks the mma fragment layouts: every float operation is the same, in the same
 * order, and the integer sums are exact) ---- */

extern "C" bool hm_cuda_mmq_host_dot(int type, const void *row, int64_t ne0, const int8_t *xq, const float *xd,
                                     const int *xs32, float *out);

template <int T>
static float host_mmq_dot(const uint8_t *row, int64_t ne0, const int8_t *xq, const float *xd, const int *xs32) {
    using tr = mmq_traits<T>;
    using Q = q8kx<T>;
    float acc = 0.0f;
    for (int64_t kb = 0; kb < ne0 / 256; kb++) {
        alignas(16) int8_t wr[256];
        int sc[16] = {0}, mn[8] = {0};
        float dw = 0.0f, dm = 0.0f;
        const uint8_t *blk = row + kb * Q::size;
        for (int p = 0; p < 8; p++) mmq_stage<T>(Q::dec(Q::load(blk, p), blk, p), p, wr, sc, mn, &dw, &dm);
        int isum = 0;
        for (int j = 0; j < tr::NS; j++) {
            int dot = 0;
            for (int e = tr::S * j; e < tr::S * (j + 1); e++) dot += (int)wr[e] * (int)xq[256 * kb + e];
            isum += sc[j] * dot;
        }
        acc = fmaf(dw * xd[kb], (float)isum, acc);
        if (tr::mins) {
            int ms = 0;
            for (int j = 0; j < 8; j++) ms += mn[j] * xs32[8 * kb + j];
            acc = fmaf(-(dm * xd[kb]), (float)ms, acc);
        }
    }
    return acc;
}

bool hm_cuda_mmq_host_dot(int type, const void *row, int64_t ne0, const int8_t *xq, const float *xd,
                          const int *xs32, float *out) {
    const uint8_t *r = (const uint8_t *)row;
    switch (type) {
#define HM_MMQ_HOST_CASE(T) case T: *out = host_mmq_dot<T>(r, ne0, xq, xd, xs32); return true;
        HM_CUDA_FOR_MMQ_TYPES(HM_MMQ_HOST_CASE)
#undef HM_MMQ_HOST_CASE
    default: return false;
    }
}
