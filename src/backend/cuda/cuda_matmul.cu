/* cuda_matmul.cu - hm_cuda_matmul: the decode matvec for small batches, and for prefill a tiled
 * tensor-core matmul.
 *
 * Prefill tile: a 128-thread block computes y for 64 weight rows x 64 tokens. Per K step of 32
 * columns it dequantises the 64x32 weight tile (256 groups of 8, two per thread, cuda_quant.cuh)
 * and converts the 64x32 activation tile to bf16 in shared memory, then each warp multiplies its
 * 32x32 corner with 2x2 WMMA 16x16x16 bf16 fragments accumulating in f32. bf16 keeps f32's range
 * (activations of some models exceed f16's 65504) at 8 bits of mantissa. Edge tiles are zero
 * padded; the f32 result goes through shared memory so the global stores are coalesced and
 * guarded. Each output element is produced by one thread: deterministic.
 *
 * With the context's mmq switch on (the default; off: HOTMOE_CUDA_MMQ=0), Q4_K / Q5_K / Q6_K / IQ4_XS weights take
 * the int8 tensor-core matmul of cuda_mmq.cu instead (Q8_K activations, the CPU's integer sums). */
#include <mma.h>

#include "cuda_impl.h"
#include "cuda_quant.cuh"

using namespace hmcu;
using namespace nvcuda;

#define MM_BM 64 /* weight rows per tile */
#define MM_BN 64 /* tokens per tile */
#define MM_BK 32
#define MM_LD (MM_BK + 8)  /* bf16 row pitch of the A/B tiles: 80 bytes, 16-byte multiple */
#define MM_LDC (MM_BM + 4) /* f32 pitch of the staged result */

template <int T>
__global__ void __launch_bounds__(128) k_matmul(const uint8_t *__restrict__ w, size_t nb1, int64_t ne0,
                                                int64_t ne1, const float *__restrict__ x, int64_t n_tok,
                                                float *__restrict__ y) {
    __shared__ __align__(128) __nv_bfloat16 ws[MM_BM * MM_LD]; /* [row][k] */
    __shared__ __align__(128) __nv_bfloat16 xs[MM_BN * MM_LD]; /* [token][k] */
    __shared__ __align__(128) float cs[MM_BN * MM_LDC];        /* [token][row] */
    const int tid = threadIdx.x, warp = tid >> 5;
    const int wm = warp >> 1, wn = warp & 1;
    const int64_t r0 = (int64_t)blockIdx.x * MM_BM, t0 = (int64_t)blockIdx.y * MM_BN;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);

    for (int64_t k0 = 0; k0 < ne0; k0 += MM_BK) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int gi = tid + 128 * i, r = gi >> 2, gg = gi & 3;
            float v[8];
            const int64_t row = r0 + r;
            if (row < ne1) deq8<T>(w + row * nb1, k0 / 8 + gg, v);
            else
#pragma unroll
                for (int e = 0; e < 8; e++) v[e] = 0.0f;
            __align__(16) __nv_bfloat162 p[4];
#pragma unroll
            for (int e = 0; e < 4; e++) p[e] = __floats2bfloat162_rn(v[2 * e], v[2 * e + 1]);
            *(uint4 *)&ws[r * MM_LD + 8 * gg] = *(const uint4 *)p;

            const int64_t tok = t0 + r;
            float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
            if (tok < n_tok) {
                const float4 *xp = (const float4 *)(x + tok * ne0 + k0 + 8 * gg);
                a = __ldg(xp);
                b = __ldg(xp + 1);
            }
            p[0] = __floats2bfloat162_rn(a.x, a.y);
            p[1] = __floats2bfloat162_rn(a.z, a.w);
            p[2] = __floats2bfloat162_rn(b.x, b.y);
            p[3] = __floats2bfloat162_rn(b.z, b.w);
            *(uint4 *)&xs[r * MM_LD + 8 * gg] = *(const uint4 *)p;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < MM_BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb[2];
#pragma unroll
            for (int i = 0; i < 2; i++) wmma::load_matrix_sync(fa[i], &ws[(32 * wm + 16 * i) * MM_LD + kk], MM_LD);
#pragma unroll
            for (int j = 0; j < 2; j++) wmma::load_matrix_sync(fb[j], &xs[(32 * wn + 16 * j) * MM_LD + kk], MM_LD);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        __syncthreads();
    }
    /* C(m = row, n = token) stored column-major = cs[token][row] */
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(&cs[(32 * wn + 16 * j) * MM_LDC + 32 * wm + 16 * i], acc[i][j], MM_LDC,
                                    wmma::mem_col_major);
    __syncthreads();
    for (int e = tid; e < MM_BM * MM_BN; e += 128) {
        const int m = e % MM_BM, n = e / MM_BM;
        const int64_t row = r0 + m, tok = t0 + n;
        if (row < ne1 && tok < n_tok) y[tok * ne1 + row] = cs[n * MM_LDC + m];
    }
}

template <int T>
static void launch_matmul(cudaStream_t st, const hm_cuda_mat *w, const float *x, int64_t n_tok, float *y) {
    const dim3 grid(hm_cu_blocks(w->ne1, MM_BM), hm_cu_blocks(n_tok, MM_BN));
    k_matmul<T><<<grid, 128, 0, st>>>((const uint8_t *)w->data, w->nb1, w->ne0, w->ne1, x, n_tok, y);
}

hm_status hm_cuda_matmul(hm_cuda_ctx *c, const hm_cuda_mat *w, const float *x, int64_t n_tok,
                         float *y, hm_err *err) {
    hm_status st = hm_cuda_mat_check(w, err);
    if (st) return st;
    HM_CU_ARG(x && y && n_tok >= 1 && n_tok <= 65535 * (int64_t)MM_BN);
    HM_CU_ARG((uintptr_t)x % 16 == 0);
    if (n_tok <= HM_CUDA_MATVEC_MAX_TOK) return hm_cuda_matvec_run(c, w, x, (int)n_tok, y, err);
    if (c->exact_mm) { /* the reference path (HOTMOE_CUDA_EXACT=1): exact-f32 matvecs, 8 rows at a time */
        for (int64_t t0 = 0; t0 < n_tok; t0 += HM_CUDA_MATVEC_MAX_TOK) {
            const int nt = (int)(n_tok - t0 < HM_CUDA_MATVEC_MAX_TOK ? n_tok - t0 : HM_CUDA_MATVEC_MAX_TOK);
            if ((st = hm_cuda_matvec_run(c, w, x + t0 * w->ne0, nt, y + t0 * w->ne1, err)) != HM_OK) return st;
        }
        return HM_OK;
    }
    if (hm_cuda_mmq_takes(c, w)) return hm_cuda_mmq_run(c, w, x, n_tok, y, err);
    switch (w->type) {
#define HM_MM_CASE(T) case T: launch_matmul<T>(c->compute, w, x, n_tok, y); break;
        HM_CUDA_FOR_TYPES(HM_MM_CASE)
#undef HM_MM_CASE
    default: return hm_errf(err, HM_ERR_UNSUPPORTED, "cuda matmul: type %d", w->type);
    }
    HM_CU_LAUNCH("matmul");
    return HM_OK;
}
