/* cuda_impl.h - internals shared by the CUDA backend's .cu files (C++ only): the context, the
 * one CUDA-call checking macro and the small launch helpers.
 *
 * Invariants: every CUDA runtime call goes through HM_CU / HM_CU_LAUNCH, which turn a failure into
 * HM_ERR_CUDA with "file:line: call: cudaGetErrorString" in the caller's hm_err. Ops only enqueue
 * on the context's compute stream; they never synchronise and never allocate. */
#ifndef HM_BACKEND_CUDA_IMPL_H
#define HM_BACKEND_CUDA_IMPL_H

#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "core/status.h"
}
#include "cuda_ops.h"

#define HM_CUDA_MOE_RING 4

struct hm_cuda_ctx {
    int device;
    int n_sm;                  /* multiprocessors, for grid sizing */
    cudaStream_t compute;      /* every op runs here, in call order */
    cudaStream_t upload;       /* host -> device copies that overlap compute */
    cudaEvent_t upload_done;   /* recorded on `upload`, waited on by `compute` (upload fence) */
    /* Pinned staging of the MoE routing tables, a ring so the host can fill the next layer's
     * tables while earlier copies are still queued; slot i is reusable once moe_free[i] fired. */
    void *moe_host[HM_CUDA_MOE_RING];
    size_t moe_host_size[HM_CUDA_MOE_RING];
    cudaEvent_t moe_free[HM_CUDA_MOE_RING];
    int moe_next;
    int kern;                  /* hm_cuda_kern: which decode kernels (tests pick; 0 = default) */
    bool exact_mm;             /* HOTMOE_CUDA_EXACT=1: matmuls of > 8 rows run as exact-f32 matvecs
                                  in chunks of 8 (a reference path for tests; slow) */
    void *mmq_ws;              /* the int8 prefill matmul's workspace (cuda_mmq.cu), NULL = that
                                  path is off (HOTMOE_CUDA_MMQ=0 or HOTMOE_CUDA_EXACT=1 at open, or hm_cuda_set_mmq) */
    size_t mmq_ws_size;
    bool flash;                /* prefill attention of >= HM_CUDA_FLASH_MIN_TOK queries runs the
                                  tensor-core flash kernel (cuda_flash.cu); off with
                                  HOTMOE_FLASH_ATTN=0 or HOTMOE_CUDA_EXACT=1 at open, or hm_cuda_set_flash */
    int flash_variant;         /* the flash kernel's register budget for 8-warp f16 tiles: 0 (default)
                                  two blocks per multiprocessor, 1 unbounded, none spilled
                                  (HOTMOE_FLASH_VARIANT, hm_cuda_set_flash_variant: benchmark switches) */
};

/* Evaluate a CUDA runtime call; on failure fill `err` (a hm_err * in scope) and return. */
#define HM_CU(call)                                                                              \
    do {                                                                                         \
        cudaError_t e_ = (call);                                                                 \
        if (e_ != cudaSuccess)                                                                   \
            return hm_errf(err, HM_ERR_CUDA, "%s:%d: %s: %s", __FILE__, __LINE__, #call,         \
                           cudaGetErrorString(e_));                                              \
    } while (0)

/* After a kernel launch: a bad configuration shows here; faults inside show at the next sync. */
#define HM_CU_LAUNCH(what) HM_CU(cudaPeekAtLastError())

/* Argument checks of the op entry points: a failing one is a caller bug reported as HM_ERR_ARG. */
#define HM_CU_ARG(cond)                                                                          \
    do {                                                                                         \
        if (!(cond)) return hm_errf(err, HM_ERR_ARG, "%s:%d: bad argument: %s", __FILE__,        \
                                    __LINE__, #cond);                                            \
    } while (0)

/* Internal entry points between the op families (all enqueue on c->compute). */
/* Decode path of hm_cuda_matmul (1 <= n_tok <= HM_CUDA_MATVEC_MAX_TOK), arguments checked. */
hm_status hm_cuda_matvec_run(hm_cuda_ctx *c, const hm_cuda_mat *w, const float *x, int n_tok,
                             float *y, hm_err *err);
/* One active unit of the grouped MoE kernels (cuda_moe.cu's device table): its matrices and its
 * pairs [pair0, pair0 + n_pair) (consecutive units own consecutive pairs). */
struct moe_unit_dev {
    const uint8_t *gate, *up, *down;
    int32_t pair0, n_pair;
    const float *gate_b, *up_b, *down_b; /* the unit's biases or NULL (hm_cuda_moe_unit) */
};

/* The int8 tensor-core prefill matmul (cuda_mmq.cu): whether it takes w (the switch is on and the
 * type has it), and the run (n_tok > HM_CUDA_MATVEC_MAX_TOK, arguments checked). */
bool hm_cuda_mmq_takes(const hm_cuda_ctx *c, const hm_cuda_mat *w);
hm_status hm_cuda_mmq_run(hm_cuda_ctx *c, const hm_cuda_mat *w, const float *x, int64_t n_tok, float *y,
                          hm_err *err);
/* The same for hm_cuda_moe_act of a prefill batch (n_batch > HM_CUDA_MATVEC_MAX_TOK), which parts
 * take it: HM_CUDA_MMQ_GATE_UP (launch A: x quantised, each unit's pairs through its gate and up
 * rows in int8 tiles, h = act(gate) * up) and / or HM_CUDA_MMQ_DOWN (launch B: h quantised, each
 * unit's pairs through its down rows, then out[t] += sum of w_i y_i over t's pairs in unit order),
 * each when its weight type has the path and the largest unit's outputs fit the workspace (units
 * are taken in chunks that fit: a token's down sum may be added to out in several parts;
 * deterministic either way). ud_host: the units' table as uploaded to ud (device); pair_tok,
 * pair_w, tok_start, tok_pairs, h: the grouped kernel's device tables and h (cuda_moe.cu). */
enum { HM_CUDA_MMQ_GATE_UP = 1, HM_CUDA_MMQ_DOWN = 2 };
int hm_cuda_mmq_moe_plan(hm_cuda_ctx *c, int gate_type, int down_type, int64_t n_batch, int64_t n_pairs,
                         int64_t n_embd, int64_t n_ff, int64_t max_pair);
hm_status hm_cuda_mmq_moe_gate_up(hm_cuda_ctx *c, int gate_type, int act, float lim, const moe_unit_dev *ud_host,
                                  const moe_unit_dev *ud, int n_active, const int32_t *pair_tok, const float *x,
                                  int64_t n_batch, int64_t n_embd, int64_t n_ff, float *h, hm_err *err);
hm_status hm_cuda_mmq_moe_down(hm_cuda_ctx *c, int down_type, const moe_unit_dev *ud_host, const moe_unit_dev *ud,
                               int n_active, const float *pair_w, const int32_t *tok_start, const int32_t *tok_pairs,
                               const float *h, int64_t n_batch, int64_t n_pairs, int64_t n_embd, int64_t n_ff,
                               float *out, hm_err *err);

/* The grouped MoE's activation: silu(gate) * up (Qwen) or gelu_tanh(gate) * up (Gemma: 0.5 x
 * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as cpu_gemma.c); act: hm_cuda_act; lim > 0: gate and up
 * clamped first (hm_cuda_moe_act_lim). */
__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }
__device__ __forceinline__ float gelu_tanh(float v) {
    return 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
}
__device__ __forceinline__ float act_mul(int act, float lim, float g, float u) {
    if (lim > 0.0f) { /* DeepSeek-V4's clamp (cpu_moe.c's act_mul): gate above, up both ways */
        g = fminf(g, lim);
        u = fminf(fmaxf(u, -lim), lim);
    }
    if (act == HM_CUDA_ACT_SWIGLU_OAI) { /* gpt-oss: min(g, 7) sigmoid(1.702 min(g, 7)) (clamp(u, -7, 7) + 1) */
        const float a = fminf(g, 7.0f), b = fminf(fmaxf(u, -7.0f), 7.0f);
        return a / (1.0f + expf(-1.702f * a)) * (b + 1.0f);
    }
    return (act == HM_CUDA_ACT_GELU ? gelu_tanh(g) : silu(g)) * u;
}
/* act_mul with row r's gate / up biases first (NULL: none) */
__device__ __forceinline__ float act_mul_b(int act, float lim, float g, float u, const float *gb, const float *ub,
                                           int64_t r) {
    return act_mul(act, lim, gb ? g + gb[r] : g, ub ? u + ub[r] : u);
}

/* The flash prefill attention (cuda_flash.cu): whether it takes a batch of n_tok queries of
 * head_dim, and the run (hm_cuda_gemma_attention's contract: positions p at rows p % cap, a window
 * of 0 = every position; arguments checked there). */
bool hm_cuda_flash_takes(const hm_cuda_ctx *c, int64_t n_tok, int head_dim);
hm_status hm_cuda_flash_attention(hm_cuda_ctx *c, const float *q, int64_t n_tok, const int32_t *pos, int64_t kv_len,
                                  const uint16_t *k_cache, const uint16_t *v_cache, int64_t cap, int32_t window,
                                  int n_head, int n_kv_head, int head_dim, float scale, float *out, void *scratch,
                                  size_t scratch_size, hm_err *err);
/* The same over a cache of kv's format (f16, or q8_0 dequantised into the f16 tiles). */
hm_status hm_cuda_flash_attention_kv(hm_cuda_ctx *c, hm_cuda_kv kv, const float *q, int64_t n_tok, const int32_t *pos,
                                     int64_t kv_len, const void *k_cache, const void *v_cache, int64_t cap,
                                     int32_t window, int n_head, int n_kv_head, int head_dim, float scale, float *out,
                                     void *scratch, size_t scratch_size, hm_err *err);
/* The same with attention sinks (cuda_gptoss.h; NULL: none). */
hm_status hm_cuda_flash_attention_kv_sinks(hm_cuda_ctx *c, hm_cuda_kv kv, const float *q, int64_t n_tok,
                                           const int32_t *pos, int64_t kv_len, const void *k_cache,
                                           const void *v_cache, int64_t cap, int32_t window, int n_head,
                                           int n_kv_head, int head_dim, float scale, const float *sinks, float *out,
                                           void *scratch, size_t scratch_size, hm_err *err);
/* Decode with the flash kernel (cuda_flash.cu): batches of 1 .. HM_CUDA_FLASH_MIN_TOK - 1 queries,
 * each tile of K/V rows serving a kv head's whole GQA group, the key range split over many
 * blocks; the same contract and precision as the prefill kernel. The split it runs with
 * (decode_splits; fewer when the scratch is smaller than hm_cuda_flash_decode_scratch_size's). */
bool hm_cuda_flash_decode_takes(const hm_cuda_ctx *c, int64_t n_tok, int head_dim);
/* Whether the attention ops send a decode batch seeing n_keys positions (its window, or the
 * context) to it: on the H200 it reads a deep cache 2-4x faster than the exact kernels
 * (bench_flash -decode: 131 against 509 us at 131072 positions, 32 q / 4 kv heads of 128) and is as
 * fast at 1024 positions, except for head dim 256, whose exact kernel is faster up to about 2048
 * positions (25 against 37 us at 1024; 512 is given the same rule, unmeasured). */
bool hm_cuda_flash_decode_on(const hm_cuda_ctx *c, int64_t n_tok, int64_t n_keys, int head_dim);
int hm_cuda_flash_decode_splits(const hm_cuda_ctx *c, int64_t n_tok, int n_head, int n_kv_head, int head_dim,
                                int64_t kv_len, int32_t window, size_t scratch_size);
hm_status hm_cuda_flash_decode_kv_sinks(hm_cuda_ctx *c, hm_cuda_kv kv, const float *q, int64_t n_tok,
                                        const int32_t *pos, int64_t kv_len, const void *k_cache, const void *v_cache,
                                        int64_t cap, int32_t window, int n_head, int n_kv_head, int head_dim,
                                        float scale, const float *sinks, float *out, void *scratch,
                                        size_t scratch_size, hm_err *err);
/* The merge of KV-split partials (cuda_attn.cu): part [rows][n_split][head_dim + 2] as (m, l,
 * unnormalised O) per split, merged in split order into out [rows][head_dim]; a split with
 * l = 0 saw no key and is skipped. head_dim <= 1024. */
hm_status hm_cuda_attn_merge(hm_cuda_ctx *c, const float *part, int64_t rows, int n_split, int head_dim, float *out,
                             hm_err *err);
/* The same with sinks[n_head] (row r is q head r % n_head) in the denominator; NULL: none. */
hm_status hm_cuda_attn_merge_sinks(hm_cuda_ctx *c, const float *part, int64_t rows, int n_split, int head_dim,
                                   const float *sinks, int n_head, float *out, hm_err *err);
/* The same merge for many splits per row (decode: up to 256), each row's splits reduced by a
 * block of 512 threads in parallel; a fixed order too (not the order of hm_cuda_attn_merge). */
hm_status hm_cuda_attn_merge_wide(hm_cuda_ctx *c, const float *part, int64_t rows, int n_split, int head_dim,
                                  const float *sinks, int n_head, float *out, hm_err *err);

/* Checks a weight matrix against the kernels' needs (type, alignment, ne0). */
hm_status hm_cuda_mat_check(const hm_cuda_mat *w, hm_err *err);

static inline unsigned hm_cu_blocks(int64_t n, int per) { return (unsigned)((n + per - 1) / per); }

#endif
