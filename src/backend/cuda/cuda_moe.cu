/* cuda_moe.cu - the grouped MoE kernel: every resident expert unit of a layer in two launches.
 *
 * Routing tables (built on the host, uploaded once per call into the head of the scratch):
 *   units[a]     = {gate, up, down, pair0, n_pair}: active unit a owns pairs [pair0, pair0+n_pair)
 *   pair_tok[i], pair_w[i], pair_unit[i]: the token, routing weight and unit of pair i
 *   tok_start[t], tok_pairs[]: CSR of the pairs of each token, in unit order
 * Launch A, grid (n_ff / 4 rows, unit): a warp takes row r of one unit's gate and up and all the
 *   unit's tokens (8 at a time, the weights read once per 8 tokens) and writes
 *   h[i][r] = act(gate_r . x) * (up_r . x) for each pair i.   h: [n_pairs, n_ff] f32
 *   (act: silu, gelu_tanh for Gemma or gpt-oss's clamped SwiGLU: hm_cuda_act, a run-time flag read
 *   in the epilogue only; a unit's gate / up biases, when it has them, added there too)
 * Launch B, grid (n_embd / 4 rows, token): a warp takes row r of the output of token t and sums
 *   w_i * (down_u row r . h_i + down bias) over t's pairs in unit order, then out[t][r] += the sum.
 * Each output element has exactly one writer: no atomics, bit-identical results run to run.
 * Launch B reads a unit's down rows once per token routed to it (from L2 after the first): right
 * for decode batches; with the mmq switch on (the default), prefill batches of K-quant parts
 * take cuda_mmq.cu's int8 tiles per unit instead, for launch A and / or B (hm_cuda_mmq_moe_plan). */
#include <string.h>

#include "cuda_impl.h"
#include "cuda_quant.cuh"

using namespace hmcu;

/* Byte offsets of the tables and of h inside the scratch. */
typedef struct {
    size_t units, pair_tok, pair_w, pair_unit, tok_start, tok_pairs, tables_end, h, end;
} moe_layout;

static size_t up16(size_t n) { return (n + 15) & ~(size_t)15; }

static moe_layout moe_layout_of(int64_t n_batch, int64_t n_pairs, int64_t n_units, int64_t n_ff) {
    moe_layout L;
    L.units = 0;
    L.pair_tok = up16((size_t)n_units * sizeof(moe_unit_dev));
    L.pair_w = L.pair_tok + up16((size_t)n_pairs * 4);
    L.pair_unit = L.pair_w + up16((size_t)n_pairs * 4);
    L.tok_start = L.pair_unit + up16((size_t)n_pairs * 4);
    L.tok_pairs = L.tok_start + up16(((size_t)n_batch + 1) * 4);
    L.tables_end = L.tok_pairs + up16((size_t)n_pairs * 4);
    L.h = (L.tables_end + 255) & ~(size_t)255;
    L.end = L.h + (size_t)n_pairs * (size_t)n_ff * sizeof(float);
    return L;
}

size_t hm_cuda_moe_scratch_size(int64_t n_batch, int64_t n_pairs, int64_t n_units, int64_t n_ff) {
    return moe_layout_of(n_batch, n_pairs, n_units, n_ff).end;
}

/* silu, gelu_tanh, act_mul: cuda_impl.h (shared with cuda_mmq.cu's int8 tiles). */

/* gate and up rows r for NT tokens (pairs i0 .. i0+n-1 of the unit). */
template <int T, int NT>
__device__ __forceinline__ void gate_up_chunk(const moe_unit_dev &u, int64_t r, size_t nb1, int64_t n_embd,
                                              int64_t n_ff, const int32_t *pair_tok, int32_t i0, int n,
                                              const float *x, float *h, int lane, int act, float lim) {
    const float *xs[NT];
    float g[NT], up[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        xs[t] = x + (int64_t)pair_tok[i0 + (t < n ? t : n - 1)] * n_embd;
        g[t] = up[t] = 0.0f;
    }
    warp_row_dot<T, NT>(u.gate + r * nb1, n_embd / 8, xs, g, lane);
    warp_row_dot<T, NT>(u.up + r * nb1, n_embd / 8, xs, up, lane);
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float gs = warp_sum(g[t]), us = warp_sum(up[t]);
        if (lane == t && t < n) h[(int64_t)(i0 + t) * n_ff + r] = act_mul_b(act, lim, gs, us, u.gate_b, u.up_b, r);
    }
}

template <int T>
__global__ void __launch_bounds__(128) k_moe_gate_up(const moe_unit_dev *__restrict__ units, const int32_t *__restrict__ pair_tok,
                                                     const float *__restrict__ x, int64_t n_embd, int64_t n_ff, size_t nb1,
                                                     float *__restrict__ h, int act, float lim) {
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
    if (r >= n_ff) return;
    const moe_unit_dev u = units[blockIdx.y];
    for (int32_t i = u.pair0; i < u.pair0 + u.n_pair; i += 8) {
        const int n = min(8, u.pair0 + u.n_pair - i);
        if (n == 1) gate_up_chunk<T, 1>(u, r, nb1, n_embd, n_ff, pair_tok, i, n, x, h, lane, act, lim);
        else if (n == 2) gate_up_chunk<T, 2>(u, r, nb1, n_embd, n_ff, pair_tok, i, n, x, h, lane, act, lim);
        else if (n <= 4) gate_up_chunk<T, 4>(u, r, nb1, n_embd, n_ff, pair_tok, i, n, x, h, lane, act, lim);
        else gate_up_chunk<T, 8>(u, r, nb1, n_embd, n_ff, pair_tok, i, n, x, h, lane, act, lim);
    }
}

template <int T>
__global__ void __launch_bounds__(128) k_moe_down(const moe_unit_dev *__restrict__ units, const float *__restrict__ pair_w,
                                                  const int32_t *__restrict__ pair_unit, const int32_t *__restrict__ tok_start,
                                                  const int32_t *__restrict__ tok_pairs, const float *__restrict__ h,
                                                  int64_t n_embd, int64_t n_ff, size_t nb1, float *__restrict__ out) {
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
    const int64_t t = blockIdx.y;
    if (r >= n_embd) return;
    const int32_t q0 = tok_start[t], q1 = tok_start[t + 1];
    if (q0 == q1) return;
    float acc = 0.0f;
    for (int32_t q = q0; q < q1; q++) {
        const int32_t i = tok_pairs[q];
        const float *xs[1] = {h + (int64_t)i * n_ff};
        float d[1] = {0.0f};
        const moe_unit_dev &u = units[pair_unit[i]];
        warp_row_dot<T, 1>(u.down + r * nb1, n_ff / 8, xs, d, lane);
        if (u.down_b && lane == 0) d[0] += u.down_b[r]; /* the bias once, in lane 0's share of the dot */
        acc = fmaf(pair_w[i], d[0], acc);
    }
    acc = warp_sum(acc);
    if (lane == 0) out[t * n_embd + r] += acc;
}

template <int TG, int TD>
static void launch_moe(cudaStream_t st, char *scr, const moe_layout &L, int n_active, const float *x,
                       int64_t n_batch, int64_t n_embd, int64_t n_ff, float *out, int act, float lim, bool gate_up, bool down) {
    const moe_unit_dev *units = (const moe_unit_dev *)(scr + L.units);
    float *h = (float *)(scr + L.h);
    if (gate_up) /* else the int8 tile path (cuda_mmq.cu) wrote h */
        k_moe_gate_up<TG><<<dim3(hm_cu_blocks(n_ff, 4), (unsigned)n_active), 128, 0, st>>>(
            units, (const int32_t *)(scr + L.pair_tok), x, n_embd, n_ff, hm_row_size(TG, n_embd), h, act, lim);
    if (!down) return; /* the int8 tile path (cuda_mmq.cu) takes the down projection */
    k_moe_down<TD><<<dim3(hm_cu_blocks(n_embd, 4), (unsigned)n_batch), 128, 0, st>>>(
        units, (const float *)(scr + L.pair_w), (const int32_t *)(scr + L.pair_unit),
        (const int32_t *)(scr + L.tok_start), (const int32_t *)(scr + L.tok_pairs), h, n_embd, n_ff,
        hm_row_size(TD, n_ff), out);
}

/* Dispatch the (gate type, down type) pair: the gate type is a template of launch A, the down
 * type of launch B, so the 11 x 11 table is two switches. */
template <int TG>
static bool launch_moe_down(int down_type, cudaStream_t st, char *scr, const moe_layout &L, int n_active,
                            const float *x, int64_t n_batch, int64_t n_embd, int64_t n_ff, float *out, int act, float lim,
                            bool gate_up, bool down) {
    switch (down_type) {
#define HM_MD_CASE(T) case T: launch_moe<TG, T>(st, scr, L, n_active, x, n_batch, n_embd, n_ff, out, act, lim, gate_up, down); return true;
        HM_CUDA_FOR_TYPES(HM_MD_CASE)
#undef HM_MD_CASE
    default: return false;
    }
}

/* The next staging slot, grown to `bytes` (pinned), once its previous copy has been read. */
static hm_status moe_staging(hm_cuda_ctx *c, size_t bytes, int *slot, hm_err *err) {
    const int s = c->moe_next;
    c->moe_next = (s + 1) % HM_CUDA_MOE_RING;
    HM_CU(cudaEventSynchronize(c->moe_free[s]));
    if (c->moe_host_size[s] < bytes) {
        if (c->moe_host[s]) HM_CU(cudaFreeHost(c->moe_host[s]));
        c->moe_host[s] = NULL;
        c->moe_host_size[s] = 0;
        size_t sz = bytes < 65536 ? 65536 : bytes * 2;
        HM_CU(cudaHostAlloc(&c->moe_host[s], sz, cudaHostAllocDefault));
        c->moe_host_size[s] = sz;
    }
    *slot = s;
    return HM_OK;
}

hm_status hm_cuda_moe(hm_cuda_ctx *c, const hm_cuda_moe_unit *units, int n_units, int gate_type,
                      int down_type, const float *x, int64_t n_batch, int64_t n_embd, int64_t n_ff,
                      float *out, void *scratch, size_t scratch_size, hm_err *err) {
    return hm_cuda_moe_act(c, units, n_units, gate_type, down_type, HM_CUDA_ACT_SILU, x, n_batch, n_embd, n_ff, out,
                           scratch, scratch_size, err);
}

/* The widths the grouped kernels take: multiples of 32 (a lane's 8-element groups, float4 rows of
 * x and h) and of each matrix's block (K-quants: 256, which the int8 paths' Q8_K blocks of x and h
 * then inherit). Gemma-4 26B-A4B's experts have n_ff 704: Q5_0 / Q8_0 down parts, f32 path. */
static bool moe_widths_ok(int gate_type, int down_type, int64_t n_embd, int64_t n_ff) {
    return n_embd > 0 && n_ff > 0 && n_embd % 32 == 0 && n_ff % 32 == 0 &&
           n_embd % hm_type_get(gate_type)->blck_size == 0 && n_ff % hm_type_get(down_type)->blck_size == 0;
}

hm_status hm_cuda_moe_act(hm_cuda_ctx *c, const hm_cuda_moe_unit *units, int n_units, int gate_type,
                          int down_type, int act, const float *x, int64_t n_batch, int64_t n_embd, int64_t n_ff,
                          float *out, void *scratch, size_t scratch_size, hm_err *err) {
    return hm_cuda_moe_act_lim(c, units, n_units, gate_type, down_type, act, 0.0f, x, n_batch, n_embd, n_ff, out,
                               scratch, scratch_size, err);
}

hm_status hm_cuda_moe_act_lim(hm_cuda_ctx *c, const hm_cuda_moe_unit *units, int n_units, int gate_type,
                              int down_type, int act, float lim, const float *x, int64_t n_batch, int64_t n_embd,
                              int64_t n_ff, float *out, void *scratch, size_t scratch_size, hm_err *err) {
    HM_CU_ARG(x && out && scratch && n_units >= 0 && n_batch >= 0 && n_batch <= 65535 && lim >= 0.0f);
    HM_CU_ARG(act == HM_CUDA_ACT_SILU || act == HM_CUDA_ACT_GELU || act == HM_CUDA_ACT_SWIGLU_OAI);
    if (!hm_cuda_type_ok(gate_type) || !hm_cuda_type_ok(down_type))
        return hm_errf(err, HM_ERR_UNSUPPORTED, "cuda moe: types %s / %s", hm_type_name(gate_type),
                       hm_type_name(down_type));
    HM_CU_ARG(moe_widths_ok(gate_type, down_type, n_embd, n_ff));
    bool biased = false; /* the int8 tile paths (cuda_mmq.cu) add no biases: such units take the f32 kernels */
    const size_t ga = hm_cuda_type_align(gate_type), da = hm_cuda_type_align(down_type);
    HM_CU_ARG(hm_row_size(gate_type, n_embd) % ga == 0 && hm_row_size(down_type, n_ff) % da == 0);
    int64_t n_pairs = 0, max_pair = 0;
    int n_active = 0;
    for (int j = 0; j < n_units; j++) {
        HM_CU_ARG(units[j].n_tok >= 0);
        if (units[j].n_tok > max_pair) max_pair = units[j].n_tok;
        if (!units[j].n_tok) continue;
        HM_CU_ARG(units[j].gate && units[j].up && units[j].down && units[j].tok_host && units[j].w_host);
        HM_CU_ARG((uintptr_t)units[j].gate % ga == 0 && (uintptr_t)units[j].up % ga == 0 &&
                  (uintptr_t)units[j].down % da == 0);
        n_pairs += units[j].n_tok;
        n_active++;
        biased |= units[j].gate_b || units[j].up_b || units[j].down_b;
    }
    if (!n_pairs) return HM_OK;
    const moe_layout L = moe_layout_of(n_batch, n_pairs, n_active, n_ff);
    HM_CU_ARG(scratch_size >= L.end);

    int slot = 0;
    hm_status st = moe_staging(c, L.tables_end + ((size_t)n_batch + 1) * 4, &slot, err);
    if (st) return st;
    char *hb = (char *)c->moe_host[slot];
    moe_unit_dev *ud = (moe_unit_dev *)(hb + L.units);
    int32_t *pair_tok = (int32_t *)(hb + L.pair_tok), *pair_unit = (int32_t *)(hb + L.pair_unit);
    float *pair_w = (float *)(hb + L.pair_w);
    int32_t *tok_start = (int32_t *)(hb + L.tok_start), *tok_pairs = (int32_t *)(hb + L.tok_pairs);
    memset(tok_start, 0, ((size_t)n_batch + 1) * 4);
    int32_t i = 0, a = 0;
    for (int j = 0; j < n_units; j++) {
        const hm_cuda_moe_unit *u = &units[j];
        if (!u->n_tok) continue;
        ud[a].gate = (const uint8_t *)u->gate;
        ud[a].up = (const uint8_t *)u->up;
        ud[a].down = (const uint8_t *)u->down;
        ud[a].pair0 = i;
        ud[a].n_pair = u->n_tok;
        ud[a].gate_b = u->gate_b;
        ud[a].up_b = u->up_b;
        ud[a].down_b = u->down_b;
        for (int32_t k = 0; k < u->n_tok; k++, i++) {
            const int32_t t = u->tok_host[k];
            if (t < 0 || t >= n_batch)
                return hm_errf(err, HM_ERR_ARG, "cuda moe: unit %d routes token %d outside the batch of %lld",
                               j, t, (long long)n_batch);
            pair_tok[i] = t;
            pair_w[i] = u->w_host[k];
            pair_unit[i] = a;
            tok_start[t + 1]++;
        }
        a++;
    }
    for (int64_t t = 0; t < n_batch; t++) tok_start[t + 1] += tok_start[t];
    /* stable counting sort: each token's pairs in pair (= unit) order; the cursors live in the
     * staging tail, which is not uploaded */
    int32_t *cur = (int32_t *)(hb + L.tables_end);
    memcpy(cur, tok_start, (size_t)n_batch * 4);
    for (int32_t p = 0; p < (int32_t)n_pairs; p++) tok_pairs[cur[pair_tok[p]]++] = p;
    char *scr = (char *)scratch;
    HM_CU(cudaMemcpyAsync(scr, hb, L.tables_end, cudaMemcpyHostToDevice, c->compute));
    HM_CU(cudaEventRecord(c->moe_free[slot], c->compute));

    const int mmq = biased ? 0 : hm_cuda_mmq_moe_plan(c, gate_type, down_type, n_batch, n_pairs, n_embd, n_ff, max_pair);
    if ((mmq & HM_CUDA_MMQ_GATE_UP) &&
        (st = hm_cuda_mmq_moe_gate_up(c, gate_type, act, lim, ud, (const moe_unit_dev *)(scr + L.units), n_active,
                                      (const int32_t *)(scr + L.pair_tok), x, n_batch, n_embd, n_ff,
                                      (float *)(scr + L.h), err)) != HM_OK)
        return st;
    bool ok = false;
    switch (gate_type) {
#define HM_MG_CASE(T) case T: ok = launch_moe_down<T>(down_type, c->compute, scr, L, n_active, x, n_batch, n_embd, n_ff, out, act, lim, !(mmq & HM_CUDA_MMQ_GATE_UP), !(mmq & HM_CUDA_MMQ_DOWN)); break;
        HM_CUDA_FOR_TYPES(HM_MG_CASE)
#undef HM_MG_CASE
    default: break;
    }
    if (!ok) return hm_errf(err, HM_ERR_UNSUPPORTED, "cuda moe: type pair %d/%d", gate_type, down_type);
    HM_CU_LAUNCH("moe");
    if (mmq & HM_CUDA_MMQ_DOWN)
        return hm_cuda_mmq_moe_down(c, down_type, ud, (const moe_unit_dev *)(scr + L.units), n_active,
                                    (const float *)(scr + L.pair_w), (const int32_t *)(scr + L.tok_start),
                                    (const int32_t *)(scr + L.tok_pairs), (const float *)(scr + L.h), n_batch, n_pairs,
                                    n_embd, n_ff, out, err);
    return HM_OK;
}

/* ---- the device-routed variant (decode): ids and weights read on the device ----
 * Launch A, grid (n_ff / 4 rows, pair p = t * k + j): expert ids[p]'s slot (NULL gate = cold:
 *   the block returns) gives h[p][r] = act(gate_r . x_t) * (up_r . x_t) (silu or gelu_tanh).
 * Launch B, grid (n_embd / 4 rows, token t): out[t][r] += sum over j < k in j order of
 *   weights[p] * (down_r . h[p]) over the hot pairs. One writer per element, fixed order.
 * Each kernel has two bodies behind one preamble and epilogue: NEW = false, the old kernels
 * (HM_CUDA_KERN_OLD: one warp_row_dot per row), and NEW = true (HM_CUDA_KERN_NEW, warp_rows_dot):
 * launch A takes gate row r and up row r as the two rows of one warp_rows_dot (their loads
 * interleaved, 8 in flight per lane instead of one sequential pass per matrix); launch B takes the
 * down rows of MOED_R of the token's k experts at once, each against its own h[p]. Sums are formed
 * in the old kernels' order. */
#define MOED_R 4

template <int T, bool NEW>
__global__ void __launch_bounds__(128) k_moed_gate_up(const hm_cuda_moe_slot *__restrict__ slots,
                                                      const int32_t *__restrict__ ids, int k,
                                                      const float *__restrict__ x, int64_t n_embd,
                                                      int64_t n_ff, size_t nb1, float *__restrict__ h, int act, float lim) {
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
    if (r >= n_ff) return;
    const int64_t p = blockIdx.y;
    const hm_cuda_moe_slot s = slots[ids[p]];
    if (!s.gate) return;
    float gs, us;
    if constexpr (NEW) {
        const float *xt = x + (p / k) * n_embd;
        const uint8_t *rows[2] = {(const uint8_t *)s.gate + r * nb1, (const uint8_t *)s.up + r * nb1};
        const float *xs[2][1] = {{xt}, {xt}};
        float acc[2][1] = {{0.0f}, {0.0f}};
        warp_rows_dot<T, 1, 2, 4, true>(rows, (int)(n_embd / 8), xs, acc, lane);
        gs = warp_sum(acc[0][0]);
        us = warp_sum(acc[1][0]);
    } else {
        const float *xs[1] = {x + (p / k) * n_embd};
        float g[1] = {0.0f}, u[1] = {0.0f};
        warp_row_dot<T, 1>((const uint8_t *)s.gate + r * nb1, n_embd / 8, xs, g, lane);
        warp_row_dot<T, 1>((const uint8_t *)s.up + r * nb1, n_embd / 8, xs, u, lane);
        gs = warp_sum(g[0]);
        us = warp_sum(u[0]);
    }
    if (lane == 0) h[p * n_ff + r] = act_mul_b(act, lim, gs, us, s.gate_b, s.up_b, r);
}

template <int T, bool NEW>
__global__ void __launch_bounds__(128) k_moed_down(const hm_cuda_moe_slot *__restrict__ slots,
                                                   const int32_t *__restrict__ ids,
                                                   const float *__restrict__ weights, int k,
                                                   const float *__restrict__ h, int64_t n_embd,
                                                   int64_t n_ff, size_t nb1, float *__restrict__ out) {
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
    const int64_t t = blockIdx.y;
    if (r >= n_embd) return;
    float acc = 0.0f;
    bool any = false;
    if constexpr (NEW) {
        for (int j0 = 0; j0 < k; j0 += MOED_R) {
            const uint8_t *rows[MOED_R];
            const float *xs[MOED_R][1];
            bool live[MOED_R];
            const uint8_t *frow = NULL; /* a hot entry's row and h (no run-time array index) */
            const float *fx = NULL;
#pragma unroll
            for (int jj = 0; jj < MOED_R; jj++) {
                const int64_t p = t * k + j0 + jj;
                const uint8_t *down = j0 + jj < k ? (const uint8_t *)slots[ids[p]].down : NULL;
                live[jj] = down != NULL;
                rows[jj] = down ? down + r * nb1 : NULL;
                xs[jj][0] = h + p * n_ff;
                if (down && !frow) {
                    frow = rows[jj];
                    fx = xs[jj][0];
                }
            }
            if (!frow) continue;
            /* cold or past-k entries read a hot entry's row (valid memory) and are not summed */
#pragma unroll
            for (int jj = 0; jj < MOED_R; jj++)
                if (!live[jj]) {
                    rows[jj] = frow;
                    xs[jj][0] = fx;
                }
            float d[MOED_R][1];
#pragma unroll
            for (int jj = 0; jj < MOED_R; jj++) d[jj][0] = 0.0f;
            warp_rows_dot<T, 1, MOED_R, 2, false>(rows, (int)(n_ff / 8), xs, d, lane);
#pragma unroll
            for (int jj = 0; jj < MOED_R; jj++)
                if (live[jj]) acc = fmaf(weights[t * k + j0 + jj], d[jj][0], acc);
            any = true;
        }
    } else {
        for (int j = 0; j < k; j++) {
            const int64_t p = t * k + j;
            const uint8_t *down = (const uint8_t *)slots[ids[p]].down;
            if (!down) continue;
            const float *xs[1] = {h + p * n_ff};
            float d[1] = {0.0f};
            warp_row_dot<T, 1>(down + r * nb1, n_ff / 8, xs, d, lane);
            acc = fmaf(weights[p], d[0], acc);
            any = true;
        }
    }
    if (!any) return;
    acc = warp_sum(acc);
    if (lane == 0) out[t * n_embd + r] += acc;
}

/* The first int8 kernels of the device-routed MoE (v1, HOTMOE_CUDA_Q8=v1; the current ones follow):
 * Launch A', grid (n_ff / (8 * MQ_RF) rows, pair p), 256 threads: the block quantises x_t to Q8_K
 *   in shared memory (as the CPU's quantize_row_q8_K), each warp takes gate and up rows of MQ_RF
 *   ff rows as the 2 * MQ_RF rows of one q8k_rows_dot.
 * Launch B', grid (n_embd / (8 * MQ_RD) rows, token t): the block quantises the k rows h[t * k + j]
 *   of the token's hot pairs to Q8_K (each (pair, block of 256) as the CPU quantises the pair's
 *   h before its down dot), then each warp takes MQ_RD output rows over the k experts: lane l takes
 *   units l, l + 32, ... of the (expert, unit) sequence, and sums weights[p] * (unit dot) per unit.
 * Both issue their first weight loads before quantising. */
#define MQ_RF 2
#define MQ_RD 2

template <int T>
__global__ void __launch_bounds__(256) k_moeq_gate_up(const hm_cuda_moe_slot *__restrict__ slots,
                                                      const int32_t *__restrict__ ids, int k,
                                                      const float *__restrict__ x, int64_t n_embd,
                                                      int64_t n_ff, size_t nb1, float *__restrict__ h, int act, float lim) {
    constexpr int R = 2 * MQ_RF, U = q8k_unroll(T, R);
    extern __shared__ __align__(16) uint8_t smem[];
    const int64_t p = blockIdx.y;
    const hm_cuda_moe_slot s = slots[ids[p]];
    if (!s.gate) return; /* cold: the whole block leaves before any barrier */
    int8_t *xq = (int8_t *)smem;
    float *xd = (float *)(smem + n_embd);
    const int lane = threadIdx.x & 31;
    const int64_t r0 = ((int64_t)blockIdx.x * 8 + (threadIdx.x >> 5)) * MQ_RF;
    const int n_units = (int)(n_embd / 32);
    const bool live = r0 < n_ff;
    const uint8_t *rows[R];
#pragma unroll
    for (int i = 0; i < MQ_RF; i++) {
        const int64_t rr = r0 + i < n_ff ? r0 + i : n_ff - 1;
        rows[2 * i] = (const uint8_t *)s.gate + rr * nb1;
        rows[2 * i + 1] = (const uint8_t *)s.up + rr * nb1;
    }
    qraw rw[U][R] = {};
    if (live) q8k_load<T, R, U>(rows, lane, n_units, rw);
    q8k_quant_rows_block(x + (p / k) * n_embd, n_embd, 1, (int)n_embd, xq, xd, 0);
    __syncthreads();
    if (!live) return;
    const int tok[1] = {0};
    float acc[R][1];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r][0] = 0.0f;
    q8k_rows_dot<T, 1, R, U>(rows, n_units, xq, xd, (int)n_embd, tok, acc, lane, rw);
#pragma unroll
    for (int i = 0; i < MQ_RF; i++) {
        const float gs = warp_sum(acc[2 * i][0]), us = warp_sum(acc[2 * i + 1][0]);
        if (lane == 0 && r0 + i < n_ff) h[p * n_ff + r0 + i] = act_mul_b(act, lim, gs, us, s.gate_b, s.up_b, r0 + i);
    }
}

/* Shared memory of launch B': the k down pointers and weights, then h quantised. */
static size_t moeq_down_smem(int k, int64_t n_ff) {
    return (size_t)k * 16 + hm_cuda_q8k_smem(k, n_ff);
}

/* Token t's part of that shared memory, and which of its pairs are cold. */
struct moeq_down_tok {
    const uint8_t **dn; /* [k]: the pairs' down matrices, NULL where cold */
    float *wj;          /* [k]: the pairs' weights */
    int8_t *hq;         /* [k][n_ff]: h quantised */
    float *hd;          /* [k][n_ff / 256]: its scales */
    uint32_t cold;      /* bit j: pair t * k + j is cold */
};

/* The prologue of B' and B'': carves smem, loads token t's down pointers and weights (one barrier)
 * and forms the cold mask. False, alike in every thread of the block, when no pair of t is hot. */
__device__ __forceinline__ bool moeq_down_enter(uint8_t *smem, const hm_cuda_moe_slot *__restrict__ slots,
                                                const int32_t *__restrict__ ids, const float *__restrict__ weights,
                                                int k, int64_t n_ff, int64_t t, moeq_down_tok &s) {
    s.dn = (const uint8_t **)smem;
    s.wj = (float *)(smem + (size_t)k * 8);
    s.hq = (int8_t *)(smem + (size_t)k * 16);
    s.hd = (float *)(smem + (size_t)k * 16 + (size_t)k * (size_t)n_ff);
    if ((int)threadIdx.x < k) {
        const int64_t p = t * k + threadIdx.x;
        s.dn[threadIdx.x] = (const uint8_t *)slots[ids[p]].down;
        s.wj[threadIdx.x] = weights[p];
    }
    __syncthreads();
    s.cold = 0;
    for (int j = 0; j < k; j++)
        if (!s.dn[j]) s.cold |= 1u << j;
    return s.cold != (k == 32 ? 0xffffffffu : (1u << k) - 1);
}

/* f(u, j, pu, base) for each hot unit un = u0 + 32 u (u < U, un < n_units) of token t's (expert,
 * unit) sequence in B' / B'': register slot u, expert j, unit pu of its row, j's down matrix base. */
template <int U, class F>
__device__ __forceinline__ void moeq_down_hot(const moeq_down_tok &s, int u0, int upr, int n_units, F f) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int un = u0 + 32 * u;
        if (un >= n_units) break;
        const int j = un / upr, pu = un - j * upr;
        const uint8_t *base = s.dn[j];
        if (!base) continue;
        f(u, j, pu, base);
    }
}

/* The quantised h one unit meets (its codes xa, xc and their 16-sums, its scale) and the pair's weight. */
struct moeq_hx {
    uint4 xa, xc;
    int bs1, bs2;
    float dx, wgt;
};

/* The unit loop of B' and B'' in one lane: units lane, lane + 32, ... of token t's (expert, unit)
 * sequence, U at a time; load(u0) issues the loads of the U from u0 (the first U are issued before
 * the loop), then dot(u, base, b, pp, x) takes each hot unit: register slot u, the expert's down
 * matrix base, block b, part pp, and the quantised h it meets. Cold experts' units are skipped. */
template <int T, int U, class L, class D>
__device__ __forceinline__ void moeq_down_units(const moeq_down_tok &s, int lane, int upr, int n_units, int64_t n_ff,
                                                int nbf, L &load, D dot) {
    for (int u0 = lane; u0 < n_units; u0 += 32 * U) {
        if (u0 != lane) load(u0);
        moeq_down_hot<U>(s, u0, upr, n_units, [&](int u, int j, int pu, const uint8_t *base) {
            const int b = pu >> 3, pp = pu & 7;
            const int8_t *xb = s.hq + (int64_t)j * n_ff + 256 * b;
            moeq_hx x;
            x.xa = *(const uint4 *)(xb + q8k<T>::off1(pp));
            x.xc = *(const uint4 *)(xb + q8k<T>::off2(pp));
            x.dx = s.hd[j * nbf + b];
            x.wgt = s.wj[j];
            x.bs1 = 0;
            x.bs2 = 0;
            if (q8k<T>::kind < 2) {
                x.bs1 = q8_sum16(x.xa);
                x.bs2 = q8_sum16(x.xc);
            }
            dot(u, base, b, pp, x);
        });
    }
}

template <int T>
__global__ void __launch_bounds__(256) k_moeq_down(const hm_cuda_moe_slot *__restrict__ slots,
                                                   const int32_t *__restrict__ ids,
                                                   const float *__restrict__ weights, int k,
                                                   const float *__restrict__ h, int64_t n_embd,
                                                   int64_t n_ff, size_t nb1, float *__restrict__ out) {
    constexpr int R = MQ_RD, U = q8k_unroll(T, R);
    extern __shared__ __align__(16) uint8_t smem[];
    const int64_t t = blockIdx.y;
    moeq_down_tok s;
    if (!moeq_down_enter(smem, slots, ids, weights, k, n_ff, t, s)) return; /* no hot pair: uniform exit */
    const int lane = threadIdx.x & 31;
    const int64_t r0 = ((int64_t)blockIdx.x * 8 + (threadIdx.x >> 5)) * R;
    const int upr = (int)(n_ff / 32), n_units = k * upr, nbf = (int)(n_ff / 256);
    const bool live = r0 < n_embd;
    int64_t roff[R];
#pragma unroll
    for (int r = 0; r < R; r++) roff[r] = (r0 + r < n_embd ? r0 + r : n_embd - 1) * (int64_t)nb1;
    qraw rw[U][R] = {};
    /* the loads of units u0 .. u0 + 32 (U - 1) of this lane; cold experts' units load nothing */
    auto load = [&](int u0) {
        moeq_down_hot<U>(s, u0, upr, n_units, [&](int u, int, int pu, const uint8_t *base) {
#pragma unroll
            for (int r = 0; r < R; r++)
                rw[u][r] = q8k<T>::load(base + roff[r] + (int64_t)(pu >> 3) * q8k<T>::size, pu & 7);
        });
    };
    if (live) load(lane);
    q8k_quant_rows_block(h + t * k * n_ff, n_ff, k, (int)n_ff, s.hq, s.hd, s.cold);
    __syncthreads();
    if (!live) return;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    moeq_down_units<T, U>(s, lane, upr, n_units, n_ff, nbf, load, [&](int u, const uint8_t *base, int b, int pp,
                                                                     const moeq_hx &x) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint8_t *blk = base + roff[r] + (int64_t)b * q8k<T>::size;
            const qunit qu = q8k<T>::dec(rw[u][r], blk, pp);
            acc[r] = fmaf(x.wgt, q8k_unit_dot<T>(qu, x.xa, x.xc, x.bs1, x.bs2, x.dx, 0.0f), acc[r]);
        }
    });
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float v = warp_sum(acc[r]);
        if (lane == 0 && r0 + r < n_embd) out[t * n_embd + r0 + r] += v;
    }
}

/* The current int8 kernels of the device-routed MoE (k_moeq_* above stay as the v1 variant,
 * hm_cu_q8_v1); every h and out element is formed exactly as there (same per-lane unit order and
 * operations), so the results are bit-identical to v1.
 * Launch A'', persistent: at most MOEP_BPS blocks of 256 threads per multiprocessor. A block loads
 *   the pairs' gate / up pointers into shared memory, quantises all n_tok rows of x to Q8_K once,
 *   and its warps walk the tasks (pair p, ff row r) w, w + W, ... (W = all warps of the grid,
 *   p-major); a task is gate row r and up row r as the two rows of one q8k_rows_dot against token
 *   p / k. The loads of a warp's next hot task are issued before the current one is summed (two
 *   register buffers; the first two before x is quantised), so each warp keeps two tasks' bytes
 *   in flight; cold tasks are skipped.
 * Launch B'', grid (n_embd / 8 rows, token t): as B' with one output row per warp (twice the
 *   blocks, in one wave on an H200) and up to 8 (6 for the 12-word types) units of the (expert,
 *   unit) sequence in flight per lane instead of 2, the h quantisation four (two for the 12-word
 *   types) blocks per round.
 * Both read q6_K units with 8-byte loads (q8kx, cuda_quant.cuh): 9 loads a unit instead of 13. */
#define MOEP_BPS 2

static size_t moep_gate_smem(int64_t n_pairs, int64_t n_tok, int64_t n_embd) {
    return (size_t)n_pairs * 16 + hm_cuda_q8k_smem(n_tok, n_embd);
}

template <int T>
__global__ void __launch_bounds__(256, MOEP_BPS) k_moeqp_gate_up(const hm_cuda_moe_slot *__restrict__ slots,
                                                                const int32_t *__restrict__ ids, int k, int n_tok,
                                                                const float *__restrict__ x, int64_t n_embd,
                                                                int64_t n_ff, size_t nb1, float *__restrict__ h,
                                                                int act, float lim) {
    constexpr int U = q8k_words(T) <= 8 ? 2 : 1;
    extern __shared__ __align__(16) uint8_t smem[];
    const int n_pairs = n_tok * k;
    const uint8_t **gp = (const uint8_t **)smem; /* [n_pairs][2]: gate, up (NULL: cold) */
    int8_t *xq = (int8_t *)(smem + (size_t)n_pairs * 16);
    float *xd = (float *)(smem + (size_t)n_pairs * 16 + (size_t)n_tok * (size_t)n_embd);
    for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) {
        const hm_cuda_moe_slot s = slots[ids[i]];
        gp[2 * i] = (const uint8_t *)s.gate;
        gp[2 * i + 1] = s.gate ? (const uint8_t *)s.up : NULL;
    }
    __syncthreads();
    const int lane = threadIdx.x & 31;
    /* task indices fit in 31 bits (the launch checks n_pairs * n_ff < 2^31): 32-bit divisions */
    const int n_task = n_pairs * (int)n_ff, W = (int)gridDim.x * 8, nf = (int)n_ff;
    const int n_units = (int)(n_embd / 32);
    /* the next hot task at or after i (stride W), n_task if none; its rows in rows[] */
    auto next_hot = [&](int i, const uint8_t *(&rows)[2]) -> int {
        for (; i < n_task; i += W) {
            const int p = i / nf;
            const uint8_t *g = gp[2 * p];
            if (!g) continue;
            const int64_t r = i - p * nf;
            rows[0] = g + r * nb1;
            rows[1] = gp[2 * p + 1] + r * nb1;
            return i;
        }
        return n_task;
    };
    auto finish = [&](int i, const uint8_t *const (&rows)[2], qraw (&rw)[U][2]) {
        const int p = i / nf;
        const int tok[1] = {p / k};
        float acc[2][1] = {{0.0f}, {0.0f}};
        q8k_rows_dot<T, 1, 2, U, q8kx<T>>(rows, n_units, xq, xd, (int)n_embd, tok, acc, lane, rw);
        const float gs = warp_sum(acc[0][0]), us = warp_sum(acc[1][0]);
        if (lane == 0) { /* i = p * n_ff + r */
            const hm_cuda_moe_slot &s = slots[ids[p]];
            h[i] = act_mul_b(act, lim, gs, us, s.gate_b, s.up_b, i - (int64_t)p * nf);
        }
    };
    const uint8_t *ra[2] = {NULL, NULL}, *rb[2] = {NULL, NULL};
    qraw a[U][2] = {}, b[U][2] = {};
    int i = next_hot((int)blockIdx.x * 8 + (threadIdx.x >> 5), ra);
    int in = next_hot(i + W, rb);
    if (i < n_task) q8k_load<T, 2, U, q8kx<T>>(ra, lane, n_units, a); /* the first two tasks in flight */
    if (in < n_task) q8k_load<T, 2, U, q8kx<T>>(rb, lane, n_units, b); /* during the quantisation of x */
    q8k_quant_rows_blockb<2>(x, n_embd, n_tok, (int)n_embd, xq, xd, 0);
    __syncthreads();
    /* invariant at the top: a holds task i, b task in (the next hot one, when < n_task) */
    while (i < n_task) {
        finish(i, ra, a);
        if (in >= n_task) break;
        i = next_hot(in + W, ra);
        if (i < n_task) q8k_load<T, 2, U, q8kx<T>>(ra, lane, n_units, a);
        finish(in, rb, b);
        in = next_hot(i + W, rb);
        if (in < n_task) q8k_load<T, 2, U, q8kx<T>>(rb, lane, n_units, b);
    }
}

template <int T>
__global__ void __launch_bounds__(256, MOEP_BPS) k_moeq_down1(const hm_cuda_moe_slot *__restrict__ slots,
                                                             const int32_t *__restrict__ ids,
                                                             const float *__restrict__ weights, int k,
                                                             const float *__restrict__ h, int64_t n_embd,
                                                             int64_t n_ff, size_t nb1, float *__restrict__ out) {
    constexpr int U = q8k_words(T) <= 8 ? 8 : 6, QB = q8k_words(T) <= 8 ? 4 : 2;
    extern __shared__ __align__(16) uint8_t smem[];
    const int64_t t = blockIdx.y;
    moeq_down_tok s;
    if (!moeq_down_enter(smem, slots, ids, weights, k, n_ff, t, s)) return; /* no hot pair: uniform exit */
    const int lane = threadIdx.x & 31;
    const int64_t r0 = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    const int upr = (int)(n_ff / 32), n_units = k * upr, nbf = (int)(n_ff / 256);
    const bool live = r0 < n_embd;
    const int64_t roff = (live ? r0 : n_embd - 1) * (int64_t)nb1;
    qraw rw[U] = {};
    auto load = [&](int u0) {
        moeq_down_hot<U>(s, u0, upr, n_units, [&](int u, int, int pu, const uint8_t *base) {
            rw[u] = q8kx<T>::load(base + roff + (int64_t)(pu >> 3) * q8kx<T>::size, pu & 7);
        });
    };
    if (live) load(lane);
    q8k_quant_rows_blockb<QB>(h + t * k * n_ff, n_ff, k, (int)n_ff, s.hq, s.hd, s.cold);
    __syncthreads();
    if (!live) return;
    float acc = 0.0f;
    moeq_down_units<T, U>(s, lane, upr, n_units, n_ff, nbf, load, [&](int u, const uint8_t *base, int b, int pp,
                                                                     const moeq_hx &x) {
        const qunit qu = q8kx<T>::dec(rw[u], base + roff + (int64_t)b * q8kx<T>::size, pp);
        acc = fmaf(x.wgt, q8k_unit_dot<T>(qu, x.xa, x.xc, x.bs1, x.bs2, x.dx, 0.0f), acc);
    });
    const float v = warp_sum(acc);
    if (lane == 0) out[t * n_embd + r0] += v;
}

size_t hm_cuda_moe_dev_scratch_size(int64_t n_tok, int k, int64_t n_ff) {
    return (size_t)n_tok * (size_t)k * (size_t)n_ff * sizeof(float);
}

hm_status hm_cuda_moe_dev(hm_cuda_ctx *c, const hm_cuda_moe_slot *slots, int gate_type, int down_type,
                          const int32_t *ids, const float *weights, int k, const float *x, int64_t n_tok,
                          int64_t n_embd, int64_t n_ff, float *out, void *scratch, size_t scratch_size,
                          hm_err *err) {
    return hm_cuda_moe_dev_act(c, slots, gate_type, down_type, HM_CUDA_ACT_SILU, ids, weights, k, x, n_tok, n_embd,
                               n_ff, out, scratch, scratch_size, err);
}

hm_status hm_cuda_moe_dev_act(hm_cuda_ctx *c, const hm_cuda_moe_slot *slots, int gate_type, int down_type, int act,
                              const int32_t *ids, const float *weights, int k, const float *x, int64_t n_tok,
                              int64_t n_embd, int64_t n_ff, float *out, void *scratch, size_t scratch_size,
                              hm_err *err) {
    return hm_cuda_moe_dev_act_lim(c, slots, gate_type, down_type, act, 0.0f, ids, weights, k, x, n_tok, n_embd, n_ff,
                                   out, scratch, scratch_size, err);
}

hm_status hm_cuda_moe_dev_act_lim(hm_cuda_ctx *c, const hm_cuda_moe_slot *slots, int gate_type, int down_type, int act,
                                  float lim, const int32_t *ids, const float *weights, int k, const float *x,
                                  int64_t n_tok, int64_t n_embd, int64_t n_ff, float *out, void *scratch,
                                  size_t scratch_size, hm_err *err) {
    HM_CU_ARG(slots && ids && weights && x && out && scratch && k >= 1 && n_tok >= 0 && lim >= 0.0f);
    HM_CU_ARG(act == HM_CUDA_ACT_SILU || act == HM_CUDA_ACT_GELU || act == HM_CUDA_ACT_SWIGLU_OAI);
    HM_CU_ARG(n_tok * k <= 65535);
    if (!hm_cuda_type_ok(gate_type) || !hm_cuda_type_ok(down_type))
        return hm_errf(err, HM_ERR_UNSUPPORTED, "cuda moe: types %s / %s", hm_type_name(gate_type),
                       hm_type_name(down_type));
    HM_CU_ARG(moe_widths_ok(gate_type, down_type, n_embd, n_ff));
    HM_CU_ARG(scratch_size >= hm_cuda_moe_dev_scratch_size(n_tok, k, n_ff));
    if (!n_tok) return HM_OK;
    float *h = (float *)scratch;
    const bool old = c->kern == HM_CUDA_KERN_OLD, q8 = c->kern == HM_CUDA_KERN_DEFAULT;
    const dim3 ga(hm_cu_blocks(n_ff, 4), (unsigned)(n_tok * k)), gb(hm_cu_blocks(n_embd, 4), (unsigned)n_tok);
    const size_t sa = hm_cuda_q8k_smem(1, n_embd), sb = moeq_down_smem(k, n_ff);
    const bool v1 = hm_cu_q8_v1();
    const size_t sp = moep_gate_smem(n_tok * k, n_tok, n_embd);
    if (q8 && !v1 && q8k_type(gate_type) && sp <= HM_CUDA_Q8K_SMEM_MAX && n_tok * k * n_ff < ((int64_t)1 << 30)) {
        const int64_t want = hm_cu_blocks(n_tok * k * n_ff, 8);
        const unsigned g = (unsigned)(want < (int64_t)MOEP_BPS * c->n_sm ? want : (int64_t)MOEP_BPS * c->n_sm);
        switch (gate_type) {
#define HM_MQP_CASE(T) case T: k_moeqp_gate_up<T><<<g, 256, sp, c->compute>>>(slots, ids, k, (int)n_tok, x, n_embd, \
                                   n_ff, hm_row_size(T, n_embd), h, act, lim); break;
        HM_CUDA_FOR_Q8K_TYPES(HM_MQP_CASE)
#undef HM_MQP_CASE
        default: break;
        }
    } else if (q8 && q8k_type(gate_type) && sa <= HM_CUDA_Q8K_SMEM_MAX) {
        const dim3 g(hm_cu_blocks(n_ff, 8 * MQ_RF), (unsigned)(n_tok * k));
        switch (gate_type) {
#define HM_MQG_CASE(T) case T: k_moeq_gate_up<T><<<g, 256, sa, c->compute>>>(slots, ids, k, x, n_embd, n_ff, \
                                   hm_row_size(T, n_embd), h, act, lim); break;
        HM_CUDA_FOR_Q8K_TYPES(HM_MQG_CASE)
#undef HM_MQG_CASE
        default: break;
        }
    } else switch (gate_type) {
#define HM_MDG_CASE(T) case T: (old ? k_moed_gate_up<T, false> : k_moed_gate_up<T, true>)<<<ga, 128, 0, c->compute>>>( \
                                   slots, ids, k, x, n_embd, n_ff, hm_row_size(T, n_embd), h, act, lim); break;
        HM_CUDA_FOR_TYPES(HM_MDG_CASE)
#undef HM_MDG_CASE
    default: return hm_errf(err, HM_ERR_UNSUPPORTED, "cuda moe: gate type %d", gate_type);
    }
    HM_CU_LAUNCH("moe_dev gate_up");
    if (q8 && !v1 && q8k_type(down_type) && k <= 32 && sb <= HM_CUDA_Q8K_SMEM_MAX) {
        const dim3 g(hm_cu_blocks(n_embd, 8), (unsigned)n_tok);
        switch (down_type) {
#define HM_MQD1_CASE(T) case T: k_moeq_down1<T><<<g, 256, sb, c->compute>>>(slots, ids, weights, k, h, n_embd, n_ff, \
                                    hm_row_size(T, n_ff), out); break;
        HM_CUDA_FOR_Q8K_TYPES(HM_MQD1_CASE)
#undef HM_MQD1_CASE
        default: break;
        }
    } else if (q8 && q8k_type(down_type) && k <= 32 && sb <= HM_CUDA_Q8K_SMEM_MAX) {
        const dim3 g(hm_cu_blocks(n_embd, 8 * MQ_RD), (unsigned)n_tok);
        switch (down_type) {
#define HM_MQD_CASE(T) case T: k_moeq_down<T><<<g, 256, sb, c->compute>>>(slots, ids, weights, k, h, n_embd, n_ff, \
                                   hm_row_size(T, n_ff), out); break;
        HM_CUDA_FOR_Q8K_TYPES(HM_MQD_CASE)
#undef HM_MQD_CASE
        default: break;
        }
    } else switch (down_type) {
#define HM_MDD_CASE(T) case T: (old ? k_moed_down<T, false> : k_moed_down<T, true>)<<<gb, 128, 0, c->compute>>>( \
                                   slots, ids, weights, k, h, n_embd, n_ff, hm_row_size(T, n_ff), out); break;
        HM_CUDA_FOR_TYPES(HM_MDD_CASE)
#undef HM_MDD_CASE
    default: return hm_errf(err, HM_ERR_UNSUPPORTED, "cuda moe: down type %d", down_type);
    }
    HM_CU_LAUNCH("moe_dev down");
    return HM_OK;
}

/* Block per (256 elements, token): out[t][r] += sum over t's hot pairs j with a down bias, in j order. */
__global__ void k_moed_down_bias(const hm_cuda_moe_slot *__restrict__ slots, const int32_t *__restrict__ ids,
                                 const float *__restrict__ weights, int k, int64_t n_embd, float *__restrict__ out) {
    const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (r >= n_embd) return;
    float acc = 0.0f;
    bool any = false;
    for (int j = 0; j < k; j++) {
        const hm_cuda_moe_slot &s = slots[ids[t * k + j]];
        if (!s.gate || !s.down_b) continue;
        acc = fmaf(weights[t * k + j], s.down_b[r], acc);
        any = true;
    }
    if (any) out[t * n_embd + r] += acc;
}

hm_status hm_cuda_moe_dev_down_bias(hm_cuda_ctx *c, const hm_cuda_moe_slot *slots, const int32_t *ids,
                                    const float *weights, int k, int64_t n_tok, int64_t n_embd, float *out,
                                    hm_err *err) {
    HM_CU_ARG(slots && ids && weights && out && k >= 1 && n_tok >= 0 && n_tok <= 65535 && n_embd > 0);
    if (!n_tok) return HM_OK;
    k_moed_down_bias<<<dim3(hm_cu_blocks(n_embd, 256), (unsigned)n_tok), 256, 0, c->compute>>>(slots, ids, weights, k,
                                                                                              n_embd, out);
    HM_CU_LAUNCH("moe_dev down bias");
    return HM_OK;
}
