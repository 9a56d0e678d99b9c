/* cuda_matvec.cu - the decode matvec: y = W x for 1..8 tokens, every weight type.
 *
 * One warp per weight row, four rows per 128-thread block. Lane l decodes groups l, l+32, ... of
 * 8 consecutive elements (cuda_quant.cuh) and multiplies each by the matching 8 activations of
 * every token, so the weight bytes stream from HBM once for all tokens and the activation loads of
 * a warp are contiguous. The kernel is templated on the token count NT in {1, 2, 4, 8}; a batch
 * of 3 runs NT = 4 with the last token repeated (its result is not stored). Activations stay f32:
 * exact against the CPU reference, at the price of 4 bytes of (L1-resident) activation per weight
 * element per token; quantising x to int8 for dp4a is the next step if L1 becomes the limit.
 *
 * Measured on the H200 (test_cuda_ops_gpu, n_tok 1, weights from HBM): f32 3.4 TB/s, f16/bf16
 * 2.5 TB/s on 4096 x 4096, but every quantised type takes ~13 us there (q4_K 0.71 TB/s, q6_K
 * 0.63 TB/s) and every type ~6.6 us on 2048 x 768: the quantised rows are latency-bound (a lane
 * has only 8 bytes of a row in flight per iteration), not bandwidth-bound.
 *
 * Hence the int8 kernels, the default for Q4_K / Q5_K / Q6_K / IQ4_XS: x quantised to Q8_K in
 * shared memory like the CPU does, a lane per 32-weight unit (16+ bytes per load), dp4a. k_mvqp
 * (persistent, <= 2 blocks per SM, the next row's loads in flight while a row is summed) is the
 * default; k_mvq, the first int8 kernel (one block per 8 or 16 rows, each quantising x), stays
 * behind HOTMOE_CUDA_Q8=v1 / hm_cuda_q8_set_variant(1); both give bit-identical results. The
 * f32 kernels stay for the other types and behind the test hook (HM_CUDA_KERN_F32 / NEW / OLD). */
#include <stdlib.h>
#include <string.h>

#include "cuda_impl.h"
#include "cuda_quant.cuh"

using namespace hmcu;

/* Where the rows' results go: rows [r0[s], r0[s] + n[s]) of the matrix are output s, written as
 * y[s][t * n[s] + row - r0[s]] (one segment for a plain matvec; up to 3 for stacked q|k|v). */
struct mv_out {
    float *y[3];
    int64_t r0[3], n[3];
    int n_seg;
};

template <int T, int NT>
__global__ void __launch_bounds__(128) k_matvec(const uint8_t *__restrict__ w, size_t nb1, int64_t ne0,
                                                int64_t ne1, const float *__restrict__ x, int n_tok,
                                                const mv_out o) {
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
    if (r >= ne1) return;
    const float *xs[NT];
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        xs[t] = x + (int64_t)(t < n_tok ? t : n_tok - 1) * ne0;
        acc[t] = 0.0f;
    }
    warp_row_dot<T, NT>(w + r * nb1, ne0 / 8, xs, acc, lane);
    int sg = 0;
    if (o.n_seg > 1 && r >= o.r0[1]) sg = 1;
    if (o.n_seg > 2 && r >= o.r0[2]) sg = 2;
    float *y = o.y[sg];
    const int64_t ry = r - o.r0[sg], ny = o.n[sg];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float s = warp_sum(acc[t]);
        if (lane == t && t < n_tok) y[(int64_t)t * ny + ry] = s;
    }
}

/* The new kernel (HM_CUDA_KERN_NEW): a warp takes R consecutive rows and each lane issues the
 * loads of U groups of all R rows before decoding any (warp_rows_dot), so a lane has U*R loads in
 * flight instead of one; the R rows share one read of the activations. Each row's sum is formed in
 * the same order as k_matvec's, whatever R and U, so a row's result does not depend on which rows
 * share its launch (hm_cuda_matvec_multi stays bit-identical to separate hm_cuda_matmul calls). */
template <int T, int NT, int R, int U>
__global__ void __launch_bounds__(128) k_matvec2(const uint8_t *__restrict__ w, size_t nb1, int64_t ne0,
                                                 int64_t ne1, const float *__restrict__ x, int n_tok,
                                                 const mv_out o) {
    const int lane = threadIdx.x & 31;
    const int64_t r0 = ((int64_t)blockIdx.x * 4 + (threadIdx.x >> 5)) * R;
    if (r0 >= ne1) return;
    const uint8_t *rows[R];
    const float *xs[R][NT];
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++) {
        rows[r] = w + (r0 + r < ne1 ? r0 + r : ne1 - 1) * nb1; /* a tail row repeats the last */
#pragma unroll
        for (int t = 0; t < NT; t++) {
            xs[r][t] = x + (int64_t)(t < n_tok ? t : n_tok - 1) * ne0;
            acc[r][t] = 0.0f;
        }
    }
    warp_rows_dot<T, NT, R, U, true>(rows, (int)(ne0 / 8), xs, acc, lane);
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int64_t row = r0 + r;
        if (row >= ne1) break;
        int sg = 0;
        if (o.n_seg > 1 && row >= o.r0[1]) sg = 1;
        if (o.n_seg > 2 && row >= o.r0[2]) sg = 2;
        float *y = o.y[sg];
        const int64_t ry = row - o.r0[sg], ny = o.n[sg];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float s = warp_sum(acc[r][t]);
            if (lane == t && t < n_tok) y[(int64_t)t * ny + ry] = s;
        }
    }
}

template <int T, int NT, int R, int U>
static void launch2(cudaStream_t st, const hm_cuda_mat *w, const float *x, int n_tok, const mv_out &y) {
    k_matvec2<T, NT, R, U><<<hm_cu_blocks(w->ne1, 4 * R), 128, 0, st>>>((const uint8_t *)w->data, w->nb1,
                                                                       w->ne0, w->ne1, x, n_tok, y);
}

/* The first int8 kernel (v1; HM_CUDA_KERN_DEFAULT for the Q8_K-partner types, cuda_quant.cuh): 256 threads,
 * a warp per R rows. Each block first issues its warps' first weight loads, then quantises the
 * n_tok activation rows to Q8_K into shared memory (n_tok * ne0 int8 + a scale per 256: the same
 * bytes as the CPU's quantize_row_q8_K; every block redoes this from L2, no scratch, no extra
 * launch), then each lane takes whole 32-weight units with dp4a. Rows' results do not depend on R,
 * U or the other rows of the launch (the unit -> lane map and the sum order are fixed), so
 * hm_cuda_matvec_multi stays bit-identical to separate hm_cuda_matmul calls. */
template <int T, int NT, int R, int U>
__global__ void __launch_bounds__(256) k_mvq(const uint8_t *__restrict__ w, size_t nb1, int64_t ne0, int64_t ne1,
                                             const float *__restrict__ x, int n_tok, const mv_out o) {
    extern __shared__ __align__(16) uint8_t smem[];
    int8_t *xq = (int8_t *)smem;
    float *xd = (float *)(smem + (size_t)n_tok * (size_t)ne0);
    const int lane = threadIdx.x & 31;
    const int64_t r0 = ((int64_t)blockIdx.x * 8 + (threadIdx.x >> 5)) * R;
    const int n_units = (int)(ne0 / 32);
    const bool live = r0 < ne1;
    const uint8_t *rows[R];
#pragma unroll
    for (int r = 0; r < R; r++) rows[r] = w + (r0 + r < ne1 ? r0 + r : ne1 - 1) * nb1; /* a tail row repeats the last */
    qraw rw[U][R] = {};
    if (live) q8k_load<T, R, U>(rows, lane, n_units, rw);
    q8k_quant_rows_block(x, ne0, n_tok, (int)ne0, xq, xd, 0);
    __syncthreads();
    if (!live) return;
    int tok[NT];
    float acc[R][NT];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        tok[t] = t < n_tok ? t : n_tok - 1;
#pragma unroll
        for (int r = 0; r < R; r++) acc[r][t] = 0.0f;
    }
    q8k_rows_dot<T, NT, R, U>(rows, n_units, xq, xd, (int)ne0, tok, acc, lane, rw);
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int64_t row = r0 + r;
        if (row >= ne1) break;
        int sg = 0;
        if (o.n_seg > 1 && row >= o.r0[1]) sg = 1;
        if (o.n_seg > 2 && row >= o.r0[2]) sg = 2;
        float *y = o.y[sg];
        const int64_t ry = row - o.r0[sg], ny = o.n[sg];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float s = warp_sum(acc[r][t]);
            if (lane == t && t < n_tok) y[(int64_t)t * ny + ry] = s;
        }
    }
}

template <int T, int NT, int R>
static void launch_q8(cudaStream_t st, const hm_cuda_mat *w, const float *x, int n_tok, const mv_out &y) {
    constexpr int U = q8k_unroll(T, R);
    k_mvq<T, NT, R, U><<<hm_cu_blocks(w->ne1, 8 * R), 256, hm_cuda_q8k_smem(n_tok, w->ne0), st>>>(
        (const uint8_t *)w->data, w->nb1, w->ne0, w->ne1, x, n_tok, y);
}

/* The stored result of one row (the warp's sums of acc[t], lane t writes token t). */
template <int NT>
__device__ __forceinline__ void mv_store(const mv_out &o, int64_t row, const float (&acc)[1][NT], int n_tok, int lane) {
    /* the segment by selects, not a run-time index into o (which would put o in local memory) */
    const bool s1 = o.n_seg > 1 && row >= o.r0[1], s2 = o.n_seg > 2 && row >= o.r0[2];
    float *y = s2 ? o.y[2] : s1 ? o.y[1] : o.y[0];
    const int64_t ry = row - (s2 ? o.r0[2] : s1 ? o.r0[1] : o.r0[0]), ny = s2 ? o.n[2] : s1 ? o.n[1] : o.n[0];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float s = warp_sum(acc[0][t]);
        if (lane == t && t < n_tok) y[(int64_t)t * ny + ry] = s;
    }
}

/* The persistent int8 kernel (the default; k_mvq stays as the v1 variant): at most MVP_BPS blocks
 * of 256 threads per multiprocessor, each quantises x once (q8k_quant_rows_blockb) and its warps
 * walk rows w, w + W, w + 2W, ... (W = all warps of the grid), a row at a time. While a row's units
 * are decoded and summed, the loads of the warp's next row are already in flight (two register
 * buffers, a and b, used alternately; the first two rows are issued before x is quantised), so
 * each warp keeps two rows' bytes in flight and the
 * quantisation prologue is paid by <= 2 * n_sm blocks instead of one block per 8 rows. A row's
 * sum is formed exactly as in k_mvq (lane l: units l, l + 32, ... in order, then warp_sum), so
 * results are bit-identical to k_mvq and to the host emulation, whatever the grid. Units are read
 * through q8kx (q6_K with 8-byte loads, the same decoded units). */
#define MVP_BPS 2
template <int T, int NT, int U>
__global__ void __launch_bounds__(256, MVP_BPS) k_mvqp(const uint8_t *__restrict__ w, size_t nb1, int64_t ne0,
                                                      int64_t ne1, const float *__restrict__ x, int n_tok,
                                                      const mv_out o) {
    extern __shared__ __align__(16) uint8_t smem[];
    int8_t *xq = (int8_t *)smem;
    float *xd = (float *)(smem + (size_t)n_tok * (size_t)ne0);
    const int lane = threadIdx.x & 31;
    const int64_t W = (int64_t)gridDim.x * 8;
    int64_t r = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    const int n_units = (int)(ne0 / 32);
    int64_t rn = r + W;
    const uint8_t *ra[1] = {w + (r < ne1 ? r : 0) * nb1}, *rb[1] = {w + (rn < ne1 ? rn : 0) * nb1};
    qraw a[U][1] = {}, b[U][1] = {};
    if (r < ne1) q8k_load<T, 1, U, q8kx<T>>(ra, lane, n_units, a); /* the first two rows in flight during */
    if (rn < ne1) q8k_load<T, 1, U, q8kx<T>>(rb, lane, n_units, b); /* the quantisation of x */
    q8k_quant_rows_blockb<2>(x, ne0, n_tok, (int)ne0, xq, xd, 0);
    __syncthreads();
    int tok[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) tok[t] = t < n_tok ? t : n_tok - 1;
    /* invariant at the top: a holds row r, b row rn = r + W (when < ne1); each buffer is refilled
     * with its next row (+ 2W) as soon as it has been summed */
    while (r < ne1) {
        {
            float acc[1][NT];
#pragma unroll
            for (int t = 0; t < NT; t++) acc[0][t] = 0.0f;
            q8k_rows_dot<T, NT, 1, U, q8kx<T>>(ra, n_units, xq, xd, (int)ne0, tok, acc, lane, a);
            mv_store<NT>(o, r, acc, n_tok, lane);
        }
        if (rn >= ne1) break;
        r = rn + W;
        if (r < ne1) {
            ra[0] = w + r * nb1;
            q8k_load<T, 1, U, q8kx<T>>(ra, lane, n_units, a);
        }
        {
            float acc[1][NT];
#pragma unroll
            for (int t = 0; t < NT; t++) acc[0][t] = 0.0f;
            q8k_rows_dot<T, NT, 1, U, q8kx<T>>(rb, n_units, xq, xd, (int)ne0, tok, acc, lane, b);
            mv_store<NT>(o, rn, acc, n_tok, lane);
        }
        rn = r + W;
        if (rn < ne1) {
            rb[0] = w + rn * nb1;
            q8k_load<T, 1, U, q8kx<T>>(rb, lane, n_units, b);
        }
    }
}

/* Units per lane per load round of k_mvqp: for 1..2 tokens a whole row of up to 4096 (Q4_K /
 * IQ4_XS) or 2048 (Q5_K / Q6_K, 12 raw words a unit) elements in one round; two buffers within
 * the register cap of 2 blocks per SM (no spills: checked with -Xptxas -v). */
HMCU_HD constexpr int mvp_unroll(int t, int nt) {
    return q8k_words(t) <= 8 ? (nt <= 2 ? 4 : 2) : (nt <= 4 ? 2 : 1);
}

template <int T, int NT>
static void launch_q8p(const hm_cuda_ctx *c, const hm_cuda_mat *w, const float *x, int n_tok, const mv_out &y) {
    constexpr int U = mvp_unroll(T, NT);
    unsigned nb = hm_cu_blocks(w->ne1, 8);
    if (nb > (unsigned)(MVP_BPS * c->n_sm)) nb = (unsigned)(MVP_BPS * c->n_sm);
    k_mvqp<T, NT, U><<<nb, 256, hm_cuda_q8k_smem(n_tok, w->ne0), c->compute>>>(
        (const uint8_t *)w->data, w->nb1, w->ne0, w->ne1, x, n_tok, y);
}

template <int T>
static void launch_matvec_q8(const hm_cuda_ctx *c, const hm_cuda_mat *w, const float *x, int n_tok, const mv_out &y) {
    cudaStream_t st = c->compute;
    if (!hm_cu_q8_v1()) {
        if (n_tok == 1) launch_q8p<T, 1>(c, w, x, n_tok, y);
        else if (n_tok == 2) launch_q8p<T, 2>(c, w, x, n_tok, y);
        else if (n_tok <= 4) launch_q8p<T, 4>(c, w, x, n_tok, y);
        else launch_q8p<T, 8>(c, w, x, n_tok, y);
        return;
    }
    if (n_tok == 1) {
        if (w->ne1 >= (int64_t)c->n_sm * 32) launch_q8<T, 1, 2>(st, w, x, n_tok, y);
        else launch_q8<T, 1, 1>(st, w, x, n_tok, y);
    } else if (n_tok == 2) launch_q8<T, 2, 1>(st, w, x, n_tok, y);
    else if (n_tok <= 4) launch_q8<T, 4, 1>(st, w, x, n_tok, y);
    else launch_q8<T, 8, 1>(st, w, x, n_tok, y);
}

template <int T>
static void launch_matvec(const hm_cuda_ctx *c, const hm_cuda_mat *w, const float *x, int n_tok, const mv_out &y) {
    if constexpr (q8k_type(T)) {
        if (c->kern == HM_CUDA_KERN_DEFAULT && hm_cuda_q8k_smem(n_tok, w->ne0) <= HM_CUDA_Q8K_SMEM_MAX) {
            launch_matvec_q8<T>(c, w, x, n_tok, y);
            return;
        }
    }
    cudaStream_t st = c->compute;
    if (c->kern == HM_CUDA_KERN_OLD) {
        const unsigned nb = hm_cu_blocks(w->ne1, 4);
        const uint8_t *wd = (const uint8_t *)w->data;
        if (n_tok == 1) k_matvec<T, 1><<<nb, 128, 0, st>>>(wd, w->nb1, w->ne0, w->ne1, x, n_tok, y);
        else if (n_tok == 2) k_matvec<T, 2><<<nb, 128, 0, st>>>(wd, w->nb1, w->ne0, w->ne1, x, n_tok, y);
        else if (n_tok <= 4) k_matvec<T, 4><<<nb, 128, 0, st>>>(wd, w->nb1, w->ne0, w->ne1, x, n_tok, y);
        else k_matvec<T, 8><<<nb, 128, 0, st>>>(wd, w->nb1, w->ne0, w->ne1, x, n_tok, y);
        return;
    }
    /* Two rows per warp only when that still leaves >= 4 warps per multiprocessor; short
     * matrices (the experts' 512..768 rows) take one row per warp and 8 groups in flight. */
    if (n_tok == 1) {
        if (w->ne1 >= (int64_t)c->n_sm * 16) launch2<T, 1, 2, 4>(st, w, x, n_tok, y);
        else launch2<T, 1, 1, 8>(st, w, x, n_tok, y);
    } else if (n_tok == 2) launch2<T, 2, 1, 4>(st, w, x, n_tok, y);
    else if (n_tok <= 4) launch2<T, 4, 1, 4>(st, w, x, n_tok, y);
    else launch2<T, 8, 1, 2>(st, w, x, n_tok, y);
}

void hm_cuda_set_kern(hm_cuda_ctx *c, int kern) { c->kern = kern; }

/* The int8 kernel variant (cuda_quant.cuh): -1 = not read yet, then HOTMOE_CUDA_Q8=v1 or the
 * setter below (a test / benchmark hook: old and new kernels side by side in one process). */
static int q8_variant = -1;
bool hmcu::hm_cu_q8_v1(void) {
    if (q8_variant < 0) {
        const char *ev = getenv("HOTMOE_CUDA_Q8");
        q8_variant = ev && strcmp(ev, "v1") == 0 ? 1 : 0;
    }
    return q8_variant == 1;
}
extern "C" void hm_cuda_q8_set_variant(int v);
void hm_cuda_q8_set_variant(int v) { q8_variant = v == 1 ? 1 : 0; }

bool hm_cuda_type_ok(int type) { return hm_cuda_type_align(type) != 0; }

size_t hm_cuda_type_align(int type) {
    switch (type) {
#define HM_ALIGN_CASE(T) case T: return (size_t)qtype<T>::align;
        HM_CUDA_FOR_TYPES(HM_ALIGN_CASE)
#undef HM_ALIGN_CASE
    default: return 0;
    }
}

hm_status hm_cuda_mat_check(const hm_cuda_mat *w, hm_err *err) {
    const size_t a = hm_cuda_type_align(w->type);
    if (!a)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "cuda: weight type %s has no CUDA kernel",
                       hm_type_name(w->type));
    const hm_type_traits *tr = hm_type_get(w->type);
    if (w->ne0 <= 0 || w->ne0 % 32 || w->ne0 % tr->blck_size || w->ne1 <= 0)
        return hm_errf(err, HM_ERR_ARG, "cuda: %s matrix of %lld x %lld: ne0 must be a multiple of 32 "
                       "and of the block size", hm_type_name(w->type), (long long)w->ne1, (long long)w->ne0);
    if ((uintptr_t)w->data % a || w->nb1 % a || w->nb1 < hm_row_size(w->type, w->ne0))
        return hm_errf(err, HM_ERR_ARG, "cuda: %s matrix data %p / row stride %zu not %zu-byte aligned "
                       "or too small", hm_type_name(w->type), w->data, w->nb1, a);
    return HM_OK;
}

static hm_status matvec_out(hm_cuda_ctx *c, const hm_cuda_mat *w, const float *x, int n_tok, const mv_out &y,
                            hm_err *err) {
    switch (w->type) {
#define HM_MV_CASE(T) case T: launch_matvec<T>(c, w, x, n_tok, y); break;
        HM_CUDA_FOR_TYPES(HM_MV_CASE)
#undef HM_MV_CASE
    default: return hm_errf(err, HM_ERR_UNSUPPORTED, "cuda matvec: type %d", w->type);
    }
    HM_CU_LAUNCH("matvec");
    return HM_OK;
}

hm_status hm_cuda_matvec_run(hm_cuda_ctx *c, const hm_cuda_mat *w, const float *x, int n_tok,
                             float *y, hm_err *err) {
    mv_out o = {};
    o.y[0] = y;
    o.n[0] = w->ne1;
    o.n_seg = 1;
    return matvec_out(c, w, x, n_tok, o, err);
}

hm_status hm_cuda_matvec_multi(hm_cuda_ctx *c, const hm_cuda_mat *w, const float *x, int64_t n_tok, int n_out,
                               float *const *y, const int64_t *rows, hm_err *err) {
    hm_status st = hm_cuda_mat_check(w, err);
    if (st) return st;
    HM_CU_ARG(x && y && rows && n_out >= 1 && n_out <= 3 && n_tok >= 1 && n_tok <= HM_CUDA_MATVEC_MAX_TOK);
    HM_CU_ARG((uintptr_t)x % 16 == 0);
    mv_out o = {};
    int64_t at = 0;
    for (int i = 0; i < n_out; i++) {
        HM_CU_ARG(y[i] && rows[i] > 0);
        o.y[i] = y[i];
        o.r0[i] = at;
        o.n[i] = rows[i];
        at += rows[i];
    }
    HM_CU_ARG(at == w->ne1);
    o.n_seg = n_out;
    return matvec_out(c, w, x, (int)n_tok, o, err);
}

/* ---- host emulation of the int8 path (a test hook: tests/test_cuda_q8_gpu.c checks the device
 * code's quantiser and unit decoding against the CPU's on machines without a GPU) ---- */

extern "C" void hm_cuda_q8k_host_quant(const float *x, int64_t n, int8_t *q, float *d);
extern "C" bool hm_cuda_q8k_host_dot(int type, const void *row, int64_t ne0, const int8_t *xq, const float *xd,
                                     float *out);

/* As q8k_quant_block_warp: each of 32 "lanes" finds its best over its 8 elements, then the lanes'
 * bests are combined (the rule is a total order, so any combining order gives the warp's). */
void hm_cuda_q8k_host_quant(const float *x, int64_t n, int8_t *q, float *d) {
    for (int64_t b = 0; b < n / 256; b++) {
        const float *xb = x + 256 * b;
        q8max best = {0.0f, 0.0f, 256};
        for (int lane = 0; lane < 32; lane++) {
            q8max m = {0.0f, 0.0f, 256};
            for (int i = 0; i < 8; i++) {
                const float v = xb[8 * lane + i];
                if (fabsf(v) > m.a) m = q8max{fabsf(v), v, 8 * lane + i};
            }
            best = q8max_better(best, m);
        }
        const float is = q8k_iscale(best);
        for (int i = 0; i < 256; i++) q[256 * b + i] = (int8_t)q8k_code(is, xb[i]);
        d[b] = q8k_d(is);
    }
}

template <int T>
static float host_row_dot(const uint8_t *row, int64_t ne0, const int8_t *xq, const float *xd) {
    const int n_units = (int)(ne0 / 32);
    float lanes[32];
    for (int lane = 0; lane < 32; lane++) {
        float acc = 0.0f;
        for (int un = lane; un < n_units; un += 32) {
            const int b = un >> 3, p = un & 7;
            const uint8_t *blk = row + (int64_t)b * q8k<T>::size;
            const qunit u = q8k<T>::dec(q8k<T>::load(blk, p), blk, p);
            uint4 xa, xc;
            memcpy(&xa, xq + 256 * b + q8k<T>::off1(p), 16);
            memcpy(&xc, xq + 256 * b + q8k<T>::off2(p), 16);
            acc = q8k_unit_dot<T>(u, xa, xc, q8_sum16(xa), q8_sum16(xc), xd[b], acc);
        }
        lanes[lane] = acc;
    }
    for (int o = 16; o > 0; o >>= 1) /* warp_sum's butterfly, lane 0's view */
        for (int lane = 0; lane < o; lane++) lanes[lane] += lanes[lane + o];
    return lanes[0];
}

/* The same units' integer sums, each times its block's float scales and summed in double in unit
 * order, as the CPU's scalar dots sum their blocks: equal (up to double rounding) to the scalar
 * vec_dot's float exactly when every integer and scale product matches the CPU's. */
template <int T>
static float host_row_dot_dbl(const uint8_t *row, int64_t ne0, const int8_t *xq, const float *xd) {
    double acc = 0;
    for (int un = 0; un < (int)(ne0 / 32); un++) {
        const int b = un >> 3, p = un & 7;
        const uint8_t *blk = row + (int64_t)b * q8k<T>::size;
        const qunit u = q8k<T>::dec(q8k<T>::load(blk, p), blk, p);
        uint4 xa, xc;
        memcpy(&xa, xq + 256 * b + q8k<T>::off1(p), 16);
        memcpy(&xc, xq + 256 * b + q8k<T>::off2(p), 16);
        const uint32_t a[4] = {xa.x, xa.y, xa.z, xa.w}, c[4] = {xc.x, xc.y, xc.z, xc.w};
        int d1 = 0, d2 = 0;
        for (int i = 0; i < 4; i++) {
            d1 = dp4a(u.v1[i], a[i], d1);
            d2 = dp4a(u.v2[i], c[i], d2);
        }
        const int bs1 = q8_sum16(xa), bs2 = q8_sum16(xc);
        const int64_t si = q8k<T>::kind == 1   ? (int64_t)u.s1 * (d1 - 32 * bs1) + (int64_t)u.s2 * (d2 - 32 * bs2)
                           : q8k<T>::kind == 2 ? (int64_t)u.s1 * (d1 + d2)
                                               : (int64_t)u.s1 * d1 + (int64_t)u.s2 * d2;
        const int64_t sm = q8k<T>::kind == 0 ? (int64_t)u.m1 * bs1 + (int64_t)u.m2 * bs2 : 0;
        acc += (double)(u.d * xd[b]) * (double)si;
        if (sm) acc -= (double)(u.dm * xd[b]) * (double)sm;
    }
    return (float)acc;
}

extern "C" bool hm_cuda_q8k_host_dot_dbl(int type, const void *row, int64_t ne0, const int8_t *xq, const float *xd,
                                         float *out);
bool hm_cuda_q8k_host_dot_dbl(int type, const void *row, int64_t ne0, const int8_t *xq, const float *xd, float *out) {
    const uint8_t *r = (const uint8_t *)row;
    switch (type) {
#define HM_HOST_DBL_CASE(T) case T: *out = host_row_dot_dbl<T>(r, ne0, xq, xd); return true;
        HM_CUDA_FOR_Q8K_TYPES(HM_HOST_DBL_CASE)
#undef HM_HOST_DBL_CASE
    default: return false;
    }
}

bool hm_cuda_q8k_host_dot(int type, const void *row, int64_t ne0, const int8_t *xq, const float *xd, float *out) {
    const uint8_t *r = (const uint8_t *)row;
    switch (type) {
#define HM_HOST_DOT_CASE(T) case T: *out = host_row_dot<T>(r, ne0, xq, xd); return true;
        HM_CUDA_FOR_Q8K_TYPES(HM_HOST_DOT_CASE)
#undef HM_HOST_DOT_CASE
    default: return false;
    }
}
