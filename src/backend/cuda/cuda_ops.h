/* cuda_ops.h - the CUDA backend (C interface): a device context with its streams, device memory,
 * and the op set of the forward pass, mirroring backend/cpu/cpu_ops.h.
 *
 * Vocabulary as in cpu_ops.h: activations are row-major f32 ([n_tok, n] = n_tok rows of n floats),
 * weights are hm_cuda_mat (ne0 contiguous columns = the input dimension, ne1 rows). Every pointer
 * an op takes is a DEVICE pointer (from hm_cuda_alloc or inside such a buffer) unless its name ends
 * in _host. Weights and caches are borrowed; nothing here frees what it did not allocate.
 *
 * Execution: every op enqueues kernels on the context's compute stream and returns at once; its
 * hm_status covers bad arguments and launch errors, a fault inside a kernel shows at the next
 * hm_cuda_sync / hm_cuda_download. Ops never allocate: the few that need temporary device memory
 * take a scratch buffer sized at start with their *_scratch_size function.
 *
 * Numerics (the backend-ops test bounds each against a double reference):
 *   - decode matvec (n_tok <= HM_CUDA_MATVEC_MAX_TOK: hm_cuda_matmul's decode path and
 *     hm_cuda_matvec_multi) and hm_cuda_moe_dev(_act), weights Q4_K / Q5_K / Q6_K / IQ4_XS and the
 *     low-bit Q2_K / Q3_K / IQ2_XXS / IQ2_XS / IQ2_S / IQ3_XXS / IQ3_S / IQ1_S / IQ1_M: the
 *     activations (and the MoE's h before the down projection) are quantised to Q8_K exactly as the
 *     CPU's quantize_row_q8_K, and each block's integer dot is the CPU vec_dot's, bit for bit; only
 *     the f32 scaling and summation order of the block sums differs from the CPU (the low-bit
 *     types: each unit's integer is the CPU's per-16 / per-8 integer, bit for bit). Against exact
 *     f32 this is the CPU's Q8_K rounding (NMSE ~1e-5 .. 1e-4), not float rounding.
 *   - the other types, hm_cuda_moe, calls whose quantised activations exceed 48 KiB of shared
 *     memory, and the test hook's F32 / NEW / OLD kernels: weights dequantised exactly to f32 in
 *     registers, f32 activations, f32 accumulation: error is float rounding only.
 *   - prefill matmul (n_tok > HM_CUDA_MATVEC_MAX_TOK): weights and activations rounded to bf16
 *     (8-bit mantissa, f32 range) for the tensor cores, f32 accumulation; with the int8
 *     path (hm_cuda_set_mmq, on by default) the weights of the int8 decode types but Q2_K get the
 *     decode path's Q8_K numerics.
 *     With HOTMOE_CUDA_EXACT=1 in the environment when the context opens, such matmuls run as
 *     the decode matvec in chunks of 8 rows instead: a slow reference path for tests (a model
 *     whose routing flips under bf16 rounding can then still be checked tightly).
 *   - attention: f16 KV (as the CPU), f32 scores and online softmax with expf.
 * Determinism: every output element is computed by one thread in a fixed order: results are
 * bit-identical run to run (no atomics anywhere).
 *
 * KV cache layout (one layer, one sequence), f16, identical to the CPU's:
 *   k_cache, v_cache: [n_kv_head][n_ctx][head_dim]. */
#ifndef HM_BACKEND_CUDA_OPS_H
#define HM_BACKEND_CUDA_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/route_spec.h"
#include "hotmoe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- context, memory, streams ------------------------------------------------------------------ */

/* One device: a compute stream, an upload stream and their fence. Owned by the engine. */
typedef struct hm_cuda_ctx hm_cuda_ctx;
typedef struct hm_cuda_event hm_cuda_event; /* below: events */

/* Open device `device` (0-based). HM_ERR_CUDA when there is no such device or no driver. */
hm_status hm_cuda_open(hm_cuda_ctx **out, int device, hm_err *err);
/* Waits for queued work, then frees the streams and staging buffers. NULL is a no-op. */
void hm_cuda_close(hm_cuda_ctx *c);
/* Several devices in one process (model_gpu.h): ops launch kernels on the CURRENT device, so a
 * caller that drives more than one context makes c's device current before enqueueing on it
 * (allocations, copies and events set it themselves). */
hm_status hm_cuda_make_current(hm_cuda_ctx *c, hm_err *err);
/* Let each of the two devices read the other's memory directly (NVLink / PCIe peer access) when
 * the hardware allows; *on = whether both directions are enabled. Without it the peer copies below
 * still work, staged by the driver. */
hm_status hm_cuda_enable_peer(hm_cuda_ctx *a, hm_cuda_ctx *b, bool *on, hm_err *err);
/* n bytes from src (on src_c's device) to dst (on dst_c's device), on dst_c's compute stream after
 * everything queued on src_c's compute stream so far (done_src, an event of src_c, is recorded
 * there and waited on): the residual stream's hand-over between the devices of a layer split. */
hm_status hm_cuda_copy_peer(hm_cuda_ctx *dst_c, void *dst, hm_cuda_ctx *src_c, const void *src, size_t n,
                            hm_cuda_event *done_src, hm_err *err);

/* Device memory (cudaMalloc, 256-byte aligned). *out is owned by the caller: hm_cuda_free it. */
hm_status hm_cuda_alloc(hm_cuda_ctx *c, size_t bytes, void **out, hm_err *err);
void hm_cuda_free(hm_cuda_ctx *c, void *p); /* NULL is a no-op */
/* Fill n bytes with `byte` (on the compute stream). */
hm_status hm_cuda_memset(hm_cuda_ctx *c, void *dst, int byte, size_t n, hm_err *err);

/* Copy host -> device on the upload stream and wait for it (src may be pageable). dst must not be
 * in use by queued compute work (that stream is not ordered with this one: hm_cuda_sync first). */
hm_status hm_cuda_upload(hm_cuda_ctx *c, void *dst, const void *src_host, size_t n, hm_err *err);
/* Copy host -> device on the upload stream without waiting: src must stay valid (and should be
 * pinned to overlap) until hm_cuda_upload_fence's work has run. */
hm_status hm_cuda_upload_async(hm_cuda_ctx *c, void *dst, const void *src_host, size_t n,
                               hm_err *err);
/* Make every op enqueued after this wait for the uploads issued before it (no host wait). */
hm_status hm_cuda_upload_fence(hm_cuda_ctx *c, hm_err *err);
/* Copy device -> host after all queued compute work, and wait for it. */
hm_status hm_cuda_download(hm_cuda_ctx *c, void *dst_host, const void *src, size_t n, hm_err *err);
/* Wait for all queued compute work; reports faults of kernels that ran. */
hm_status hm_cuda_sync(hm_cuda_ctx *c, hm_err *err);

/* ---- host memory, device info and events (for the engine's GPU path) ------------------------- */

/* Page-locked host memory (cudaHostAlloc, portable, mapped: device code may read and write it
 * through the same pointer): what async copies need to overlap. *out owned by the caller:
 * hm_cuda_host_free it. */
hm_status hm_cuda_host_alloc(hm_cuda_ctx *c, size_t bytes, void **out, hm_err *err);
void hm_cuda_host_free(hm_cuda_ctx *c, void *p); /* NULL is a no-op */
/* Page-lock existing read-only host memory [p, p + n) for every device (cudaHostRegister,
 * read-only, portable), e.g. a file mapping's expert bytes: async copies from it then run as DMA
 * without a staging copy, and its pages stay in RAM. p and n are widened to whole pages; the pages
 * are faulted in (read from the file) now. Failure (RLIMIT_MEMLOCK, too little RAM, a driver
 * that refuses file-backed memory) is HM_ERR_NOMEM with the driver's reason; nothing stays
 * registered then. hm_cuda_host_unregister(c, p) with the same p undoes it. */
hm_status hm_cuda_host_register(hm_cuda_ctx *c, const void *p, size_t n, hm_err *err);
void hm_cuda_host_unregister(hm_cuda_ctx *c, const void *p);
/* Free and total device memory now (cudaMemGetInfo). */
hm_status hm_cuda_mem_info(hm_cuda_ctx *c, size_t *free_bytes, size_t *total_bytes, hm_err *err);
/* Copy device -> host on the compute stream after queued work, without waiting: dst_host must be
 * pinned and stay valid until a later hm_cuda_sync / hm_cuda_event_wait on an event recorded after. */
hm_status hm_cuda_download_async(hm_cuda_ctx *c, void *dst_host, const void *src, size_t n, hm_err *err);
/* Copy host -> device on the COMPUTE stream (ordered with the ops around it), without waiting:
 * src_host must be pinned and unchanged until that point of the stream has run. */
hm_status hm_cuda_upload_compute(hm_cuda_ctx *c, void *dst, const void *src_host, size_t n, hm_err *err);

/* Device -> device copy on the compute stream (regions must not overlap). */
hm_status hm_cuda_copy(hm_cuda_ctx *c, void *dst, const void *src, size_t n, hm_err *err);

/* A point in one of the context's streams. */
hm_status hm_cuda_event_create(hm_cuda_ctx *c, hm_cuda_event **out, hm_err *err);
void hm_cuda_event_destroy(hm_cuda_event *e); /* NULL is a no-op */
/* Record at the current end of the compute (on_upload false) or upload stream. */
hm_status hm_cuda_event_record(hm_cuda_ctx *c, hm_cuda_event *e, bool on_upload, hm_err *err);
/* True when everything before the record has run (or the event was never recorded). */
bool hm_cuda_event_done(hm_cuda_event *e);
/* Block the host until the event has run; reports faults of the work before it. */
hm_status hm_cuda_event_wait(hm_cuda_event *e, hm_err *err);
/* Make the compute stream wait (on the device, no host wait) for an event of either stream. */
hm_status hm_cuda_compute_wait(hm_cuda_ctx *c, hm_cuda_event *e, hm_err *err);

/* ---- matmul ---------------------------------------------------------------------------------- */

/* A weight matrix in device memory: ne1 rows of ne0 elements of `type`, row r at
 * (const char *)data + r * nb1. Borrowed. Alignment: data and nb1 multiples of
 * hm_cuda_type_align(type); ne0 a multiple of the block size and of 32. */
typedef struct hm_cuda_mat {
    const void *data;
    int type;    /* hm_type */
    int64_t ne0; /* columns (contiguous), the input dimension */
    int64_t ne1; /* rows, the output dimension */
    size_t nb1;  /* row stride in bytes */
} hm_cuda_mat;

/* True for the types this backend computes with: F32 F16 BF16 Q8_0 Q4_0 Q5_0 MXFP4 Q4_K Q5_K Q6_K
 * IQ4_XS Q4_1 Q5_1 IQ4_NL Q2_K Q3_K IQ2_XXS IQ2_XS IQ2_S IQ3_XXS IQ3_S IQ1_S IQ1_M. */
bool hm_cuda_type_ok(int type);
/* Alignment in bytes the kernels' vector loads need of a weight's data pointer and row stride. */
size_t hm_cuda_type_align(int type);

/* Largest batch that takes the decode matvec path; larger batches take the tiled matmul. */
#define HM_CUDA_MATVEC_MAX_TOK 8

/* y[t][r] = sum_c x[t][c] * w(r, c), t < n_tok, r < w->ne1.
 *   x: [n_tok, w->ne0] f32;  y: [n_tok, w->ne1] f32 (must not alias x).
 * n_tok <= 8: one warp per row, all tokens at once (weights read once, exact f32 dequant).
 * n_tok > 8: 64x64 tiles, weights dequantised to bf16 in shared memory, WMMA tensor cores. */
hm_status hm_cuda_matmul(hm_cuda_ctx *c, const hm_cuda_mat *w, const float *x, int64_t n_tok,
                         float *y, hm_err *err);

/* Decode only (1 <= n_tok <= HM_CUDA_MATVEC_MAX_TOK): n_out (<= 3) matrices of one type stacked
 * as ONE matrix w (rows [0, rows[0]) are the first, the next rows[1] the second, ...), all in one
 * matvec launch: y[i] = [n_tok, rows[i]] gets matrix i's outputs, exactly what hm_cuda_matmul of
 * each alone gives (e.g. Q|K|V from one read of the normed input). Sum of rows = w->ne1. */
hm_status hm_cuda_matvec_multi(hm_cuda_ctx *c, const hm_cuda_mat *w, const float *x, int64_t n_tok,
                               int n_out, float *const *y, const int64_t *rows, hm_err *err);

/* ---- mixture of experts ----------------------------------------------------------------------- */

/* One resident expert unit for hm_cuda_moe: device pointers to its three slices and the tokens
 * routed to it. gate, up: n_ff rows of n_embd; down: n_embd rows of n_ff (dense rows).
 * tok_host[i] indexes a row of x / out, w_host[i] its routing weight (host memory, n_tok entries). */
typedef struct hm_cuda_moe_unit {
    const void *gate, *up, *down;
    const int32_t *tok_host;
    const float *w_host;
    int32_t n_tok;
    const float *gate_b, *up_b, *down_b; /* device [n_ff], [n_ff], [n_embd]: the unit's biases (gpt-oss), or NULL */
} hm_cuda_moe_unit;

/* The gate's activation of the grouped MoE kernels: silu(gate) * up (Qwen; hm_cuda_moe and
 * hm_cuda_moe_dev) or gelu_tanh(gate) * up (Gemma; gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi)
 * (x + 0.044715 x^3))), as cpu_gemma.c). The values match moe.h's hm_moe_act. */
enum hm_cuda_act { HM_CUDA_ACT_SILU = 0, HM_CUDA_ACT_GELU = 1, HM_CUDA_ACT_SWIGLU_OAI = 2 /* gpt-oss's clamped
                                                                                         SwiGLU (cpu_ops.h) */ };

/* Scratch bytes for hm_cuda_moe over up to n_batch tokens, n_pairs (token, unit) pairs and
 * n_units units. */
size_t hm_cuda_moe_scratch_size(int64_t n_batch, int64_t n_pairs, int64_t n_units, int64_t n_ff);

/* out[t] += sum over units u, pairs i with tok = t: w_i * down_u(silu(gate_u(x_t)) * up_u(x_t)).
 *   x: [n_batch, n_embd];  out: [n_batch, n_embd] (accumulated into).
 * All units share gate_type (gate and up) and down_type (true within a layer). Two launches for all
 * units: gate+up+SwiGLU over (unit, row) items, then down + the weighted sum over (token, row)
 * items, each token's pairs summed in unit order: atomics-free and deterministic. The routing
 * tables go up through pinned staging on the compute stream (a few KB per layer). n_embd and n_ff
 * multiples of 32 and of the gate / down type's block (both MoE entry points). */
hm_status hm_cuda_moe(hm_cuda_ctx *c, const hm_cuda_moe_unit *units, int n_units, int gate_type,
                      int down_type, const float *x, int64_t n_batch, int64_t n_embd, int64_t n_ff,
                      float *out, void *scratch, size_t scratch_size, hm_err *err);
/* hm_cuda_moe with the activation act (hm_cuda_act) in place of silu. */
hm_status hm_cuda_moe_act(hm_cuda_ctx *c, const hm_cuda_moe_unit *units, int n_units, int gate_type,
                          int down_type, int act, const float *x, int64_t n_batch, int64_t n_embd,
                          int64_t n_ff, float *out, void *scratch, size_t scratch_size, hm_err *err);
/* hm_cuda_moe_act with a clamp first when lim > 0 (DeepSeek-V4's swiglu_limit, cpu_moe.c's act_mul):
 * gate = min(gate, lim), up = clamp(up, -lim, lim), then the activation; lim 0: none. */
hm_status hm_cuda_moe_act_lim(hm_cuda_ctx *c, const hm_cuda_moe_unit *units, int n_units, int gate_type,
                              int down_type, int act, float lim, const float *x, int64_t n_batch, int64_t n_embd,
                              int64_t n_ff, float *out, void *scratch, size_t scratch_size, hm_err *err);

/* The device-routed variant for decode (no host staging, no host wait before it): the routing
 * is read on the device, straight from the router's output.
 * slots: device [n_expert], expert e's slices in VRAM, or all NULL when e is not resident (COLD:
 * its pairs are skipped here; the caller computes them elsewhere). gate, up: n_ff dense rows of
 * n_embd (gate_type); down: n_embd dense rows of n_ff (down_type). Borrowed.
 *   ids, weights: device [n_tok, k] (hm_cuda_router's output);  x: [n_tok, n_embd];
 *   out: [n_tok, n_embd], out[t] += sum over t's hot pairs j (in j order) of
 *   weights[t][j] * down(silu(gate x_t) * up x_t).
 * Two launches (gate+up+SwiGLU over (pair, row), down + the weighted sum over (token, row)); no
 * atomics, deterministic. A pair's weights are read once per pair: right for n_tok <= 8.
 * scratch: hm_cuda_moe_dev_scratch_size bytes (h: [n_tok * k, n_ff]). */
typedef struct hm_cuda_moe_slot {
    const void *gate, *up, *down;
    const float *gate_b, *up_b, *down_b; /* device: the expert's biases (gpt-oss; added to gate and up before
                                            the activation, down_b by hm_cuda_moe_dev_down_bias), or NULL */
} hm_cuda_moe_slot;
size_t hm_cuda_moe_dev_scratch_size(int64_t n_tok, int k, int64_t n_ff);
hm_status hm_cuda_moe_dev(hm_cuda_ctx *c, const hm_cuda_moe_slot *slots, int gate_type, int down_type,
                          const int32_t *ids, const float *weights, int k, const float *x, int64_t n_tok,
                          int64_t n_embd, int64_t n_ff, float *out, void *scratch, size_t scratch_size,
                          hm_err *err);
/* hm_cuda_moe_dev with the activation act (hm_cuda_act) in place of silu. */
hm_status hm_cuda_moe_dev_act(hm_cuda_ctx *c, const hm_cuda_moe_slot *slots, int gate_type, int down_type,
                              int act, const int32_t *ids, const float *weights, int k, const float *x,
                              int64_t n_tok, int64_t n_embd, int64_t n_ff, float *out, void *scratch,
                              size_t scratch_size, hm_err *err);
/* hm_cuda_moe_dev_act with hm_cuda_moe_act_lim's clamp (lim 0: none). */
hm_status hm_cuda_moe_dev_act_lim(hm_cuda_ctx *c, const hm_cuda_moe_slot *slots, int gate_type, int down_type, int act,
                                  float lim, const int32_t *ids, const float *weights, int k, const float *x,
                                  int64_t n_tok, int64_t n_embd, int64_t n_ff, float *out, void *scratch,
                                  size_t scratch_size, hm_err *err);

/* out[t] += sum over t's hot pairs j (slots[ids] non-NULL with a down_b) of weights[t][j] * down_b:
 * the down biases of hm_cuda_moe_dev_act's units, in j order. */
hm_status hm_cuda_moe_dev_down_bias(hm_cuda_ctx *c, const hm_cuda_moe_slot *slots, const int32_t *ids,
                                    const float *weights, int k, int64_t n_tok, int64_t n_embd, float *out,
                                    hm_err *err);

/* Router: per token p = softmax(logits[t]), the k largest (ties: lower id first; ids in descending
 * p), weights = their p, divided by their sum when renorm. n_expert <= 1024, k <= 32.
 *   logits: [n_tok, n_expert];  ids, weights: [n_tok, k]. */
hm_status hm_cuda_router(hm_cuda_ctx *c, const float *logits, int64_t n_tok, int n_expert, int k,
                         bool renorm, int32_t *ids, float *weights, hm_err *err);

/* The routing spec (backend/route_spec.h) on the device (cuda_route.cu): bias [n_expert] or NULL;
 * hash [n_vocab, k] and tokens [n_tok] (device) for a hash-routed layer, else NULL. Same choice as
 * hm_cpu_route (ties: the lower id); weights within float rounding of it.
 *   logits: [n_tok, n_expert];  ids, weights: [n_tok, k]. */
hm_status hm_cuda_route(hm_cuda_ctx *c, const hm_route_spec *sp, const float *logits, int64_t n_tok,
                        const float *bias, const int32_t *hash, const int32_t *tokens, int32_t *ids,
                        float *weights, hm_err *err);

/* ---- attention -------------------------------------------------------------------------------- */

/* Write n_tok K/V rows into the cache at rows pos[t] (f32 -> f16, round to nearest even).
 *   k, v: [n_tok, n_kv_head * head_dim];  pos: [n_tok] device int32 in [0, n_ctx). */
hm_status hm_cuda_kv_write(hm_cuda_ctx *c, uint16_t *k_cache, uint16_t *v_cache, int64_t n_ctx,
                           int n_kv_head, int head_dim, const float *k, const float *v,
                           int64_t n_tok, const int32_t *pos, hm_err *err);

/* KV cache row formats on the device: f16, bf16, or ggml's q8_0 blocks (head_dim / 32 blocks of 34
 * bytes: an f16 scale, 32 int8 codes; -ctk q8_0) and q4_0 blocks (18 bytes: an f16 scale, 32 4-bit
 * codes). */
typedef enum hm_cuda_kv { HM_CUDA_KV_F16 = 0, HM_CUDA_KV_Q8_0 = 1, HM_CUDA_KV_Q4_0 = 2, HM_CUDA_KV_BF16 = 3 } hm_cuda_kv;

/* Write n_tok K/V rows as q8_0 at rows pos[t] % cap (cap = n_ctx: a plain cache), quantised as
 * ggml's reference quantiser does (the CPU cache's bytes for the same floats). head_dim % 32 == 0.
 *   k, v: [n_tok, n_kv_head * head_dim];  pos: device int32 >= 0. */
hm_status hm_cuda_kv_write_q8_0(hm_cuda_ctx *c, void *k_cache, void *v_cache, int64_t cap, int n_kv_head,
                                int head_dim, const float *k, const float *v, int64_t n_tok, const int32_t *pos,
                                hm_err *err);
/* The same for a cache of kv's format other than f16: q8_0, q4_0 (the reference quantisers) or bf16
 * (round to nearest even), at rows pos[t] % cap. */
hm_status hm_cuda_kv_write_kv(hm_cuda_ctx *c, hm_cuda_kv kv, void *k_cache, void *v_cache, int64_t cap,
                              int n_kv_head, int head_dim, const float *k, const float *v, int64_t n_tok,
                              const int32_t *pos, hm_err *err);

/* Scratch bytes for hm_cuda_attention with n_tok queries and KV length up to kv_len. */
size_t hm_cuda_attention_scratch_size(const hm_cuda_ctx *c, int64_t n_tok, int64_t kv_len,
                                      int n_head, int n_kv_head, int head_dim);

/* Whether hm_cuda_attention(_kv) runs a batch of n_tok queries over kv_len positions on the flash
 * kernel (cuda_flash.cu: Q and P rounded to f16): prefill batches of HM_CUDA_FLASH_MIN_TOK or
 * more, and decode batches below it, whose tiles serve a whole GQA group (head dim 256: past 2048
 * positions); false: the exact f32 kernels (flash off). */
bool hm_cuda_attention_flash(const hm_cuda_ctx *c, int64_t n_tok, int64_t kv_len, int head_dim);
/* A captured decode graph's key for its attention: the KV split the batch runs with (a kernel
 * argument), given the scratch the caller has. */
size_t hm_cuda_attention_key(const hm_cuda_ctx *c, int64_t n_tok, int64_t kv_len, int n_head, int n_kv_head,
                             int head_dim, size_t scratch_size);

/* Causal GQA attention, the CPU's contract: query t (position pos[t], its K/V already written)
 * attends to cache rows 0..pos[t]; q head h uses kv head h / (n_head / n_kv_head).
 *   q: [n_tok, n_head * head_dim];  out: [n_tok, n_head * head_dim];  pos: device int32.
 * kv_len >= max_t pos[t] + 1 (the host knows it) sizes the flash-decoding split: each
 * (token, kv head, KV range) block computes all q heads of its group from one read of K/V, and a
 * second kernel merges the ranges. head_dim in {64, 128, 256}. */
hm_status hm_cuda_attention(hm_cuda_ctx *c, const float *q, int64_t n_tok, const int32_t *pos,
                            int64_t kv_len, const uint16_t *k_cache, const uint16_t *v_cache,
                            int64_t n_ctx, int n_head, int n_kv_head, int head_dim, float scale,
                            float *out, void *scratch, size_t scratch_size, hm_err *err);
/* The same over a cache of kv's format: a q8_0 cache is read dequantised (exact f32 attention over
 * the dequantised values in the decode kernels; the flash prefill rounds them to f16 once). The
 * same scratch size. */
hm_status hm_cuda_attention_kv(hm_cuda_ctx *c, hm_cuda_kv kv, const float *q, int64_t n_tok, const int32_t *pos,
                               int64_t kv_len, const void *k_cache, const void *v_cache, int64_t n_ctx, int n_head,
                               int n_kv_head, int head_dim, float scale, float *out, void *scratch,
                               size_t scratch_size, hm_err *err);

/* ---- elementwise and row ops (out may alias the input) -------------------------------------------- */

/* out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w;  w: [n] (NULL = ones). */
hm_status hm_cuda_rmsnorm(hm_cuda_ctx *c, const float *x, const float *w, float *out,
                          int64_t n_rows, int64_t n, float eps, hm_err *err);
/* Per-head RMSNorm in place: x: [n_tok, n_head * head_dim], w: [head_dim]. */
hm_status hm_cuda_rmsnorm_heads(hm_cuda_ctx *c, float *x, const float *w, int64_t n_tok,
                                int n_head, int head_dim, float eps, hm_err *err);
/* RoPE NEOX in place (i with i + n_rot/2), angle = pos[t] * theta^(-2i/n_rot) in double. */
hm_status hm_cuda_rope_neox(hm_cuda_ctx *c, float *x, int64_t n_tok, int n_head, int head_dim,
                            int n_rot, const int32_t *pos, float theta_base, hm_err *err);
/* RoPE with the normal pairing (2i with 2i + 1, i < n_rot/2) in place, angle as hm_cuda_rope_neox's
 * divided by ff[i] (device [n_rot/2] or NULL = ones); hm_cpu_rope_norm's semantics (cuda_rope_bias.cu). */
hm_status hm_cuda_rope_norm_ff(hm_cuda_ctx *c, float *x, int64_t n_tok, int n_head, int head_dim, int n_rot,
                               const int32_t *pos, float theta_base, const float *ff, hm_err *err);
/* a[r][i] += b[i] over [n_rows, width] (cuda_rope_bias.cu). */
hm_status hm_cuda_add_bias(hm_cuda_ctx *c, float *a, const float *b, int64_t n_rows, int64_t width, hm_err *err);
hm_status hm_cuda_add(hm_cuda_ctx *c, const float *a, const float *b, float *out, int64_t n,
                      hm_err *err);
hm_status hm_cuda_mul(hm_cuda_ctx *c, const float *a, const float *b, float *out, int64_t n,
                      hm_err *err);
hm_status hm_cuda_scale(hm_cuda_ctx *c, const float *a, float s, float *out, int64_t n,
                        hm_err *err);
/* out = silu(gate) * up */
hm_status hm_cuda_swiglu(hm_cuda_ctx *c, const float *gate, const float *up, float *out,
                         int64_t n, hm_err *err);
/* Row softmax in place with max subtraction: x: [n_rows, n]. */
hm_status hm_cuda_softmax(hm_cuda_ctx *c, float *x, int64_t n_rows, int64_t n, hm_err *err);
/* Fused for decode: x[r] += h[r] (in place), then out[r] = rmsnorm(x[r]) * w (NULL w = ones):
 * hm_cuda_add then hm_cuda_rmsnorm in one launch, the same results. out may alias h. */
hm_status hm_cuda_add_rmsnorm(hm_cuda_ctx *c, float *x, const float *h, const float *w, float *out,
                              int64_t n_rows, int64_t n, float eps, hm_err *err);
/* Fused for decode: hm_cuda_rmsnorm_heads of q (q_norm) and k (k_norm), hm_cuda_rope_neox of both,
 * then hm_cuda_kv_write of k and v, in one launch with the same results (q and k are left normed
 * and rotated in place, as those ops leave them). head_dim <= 256.
 *   q: [n_tok, n_head * head_dim];  k, v: [n_tok, n_kv_head * head_dim];  pos: device [n_tok]. */
hm_status hm_cuda_qk_norm_rope_kv(hm_cuda_ctx *c, float *q, float *k, const float *v, const float *q_norm,
                                  const float *k_norm, int64_t n_tok, int n_head, int n_kv_head,
                                  int head_dim, int n_rot, const int32_t *pos, float theta_base, float eps,
                                  uint16_t *k_cache, uint16_t *v_cache, int64_t n_ctx, hm_err *err);
/* Embedding lookup: out[i] = dequant(table row ids[i]); ids: device int32 in [0, table->ne1). */
hm_status hm_cuda_get_rows(hm_cuda_ctx *c, const hm_cuda_mat *table, const int32_t *ids,
                           int64_t n_ids, float *out, hm_err *err);

/* ---- a decode step as one CUDA graph, with host handshakes inside it (cuda_graph.cu) ----------
 *
 * The engine captures the ops of a whole decode step once (hm_cuda_capture_begin .. _end: every op
 * enqueued on the compute stream in between is recorded, not run) and replays the graph each step
 * (hm_cuda_graph_launch): one host call instead of hundreds of launches, no gaps between kernels.
 * Everything that changes per step must then live in device memory (tokens, positions, the step
 * number `seq`, the expert slot table), not in kernel arguments.
 *
 * The CPU's share of a MoE layer happens INSIDE the graph through two handshakes over pinned host
 * memory (hm_cuda_host_alloc memory is mapped: device code reaches it through the same pointer):
 *   - hm_cuda_publish: after the router, the device counts the pairs whose expert has no VRAM slot
 *     (slots[id].gate == NULL, hm_cuda_moe_dev's COLD), writes that count, the ids and weights and
 *     (only when the count is > 0) the MoE input rows to host memory, then sets *flag_host = *seq.
 *     The host waits for the flag (hm_cuda_host_wait), computes the cold units, writes their sum
 *     and sets its own flag.
 *   - hm_cuda_join: when the layer's count was 0 nothing happens (the GPU goes straight on);
 *     else the device waits until *flag_host == *seq, then out += the host's sum.
 * The host MUST eventually set every joined flag of a launched step (also when it failed: set
 * them all, then sync), or the stream waits forever. */
typedef struct hm_cuda_graph hm_cuda_graph;
/* Start recording the compute stream (this thread's calls only). */
hm_status hm_cuda_capture_begin(hm_cuda_ctx *c, hm_err *err);
/* Stop recording and instantiate: *out owned by the caller (hm_cuda_graph_destroy). On failure
 * (or when ok is false: the caller's enqueueing failed) the recording is discarded, *out NULL. */
hm_status hm_cuda_capture_end(hm_cuda_ctx *c, bool ok, hm_cuda_graph **out, hm_err *err);
hm_status hm_cuda_graph_launch(hm_cuda_ctx *c, hm_cuda_graph *g, hm_err *err);
void hm_cuda_graph_destroy(hm_cuda_graph *g); /* NULL is a no-op */

/* See above. n_pairs <= 256 (ids, w: device [n_pairs]); x: device [n_x] floats; pub_host: pinned
 * [1 + 2 * n_pairs] int32 (count, ids, weights' bits); x_host: pinned [n_x]; ncold_dev: device
 * int32 the join reads; seq_dev: device uint32, the step number. */
hm_status hm_cuda_publish(hm_cuda_ctx *c, const hm_cuda_moe_slot *slots, const int32_t *ids, const float *w,
                          int n_pairs, const float *x, int64_t n_x, int32_t *ncold_dev, int32_t *pub_host,
                          float *x_host, uint32_t *flag_host, const uint32_t *seq_dev, hm_err *err);
/* out[i] += add_host[i], i < n, once *flag_host == *seq_dev; nothing when *ncold_dev == 0. */
hm_status hm_cuda_join(hm_cuda_ctx *c, const int32_t *ncold_dev, const uint32_t *flag_host,
                       const uint32_t *seq_dev, const float *add_host, float *out, int64_t n, hm_err *err);
/* Host side of the handshake: spin until *flag == want (acquire). While spinning, checks the
 * compute stream now and then: a fault is HM_ERR_CUDA, an idle stream with the flag still unset
 * is HM_ERR_INTERNAL (the device will never set it). */
hm_status hm_cuda_host_wait(hm_cuda_ctx *c, const uint32_t *flag, uint32_t want, hm_err *err);
/* Host side: *flag = v (release), for the device's hm_cuda_join. */
void hm_cuda_host_signal(uint32_t *flag, uint32_t v);

/* Test hook, not for the engine: which decode kernels (hm_cuda_matmul's matvec path,
 * hm_cuda_matvec_multi, hm_cuda_moe_dev) the context runs. DEFAULT is what the engine gets. */
/* DEFAULT: the int8 (Q8_K activation) kernels where they apply, else NEW. OLD: the first f32
 * kernels. NEW: the faster f32 kernels (more loads in flight). F32: the fastest exact-f32 kernels
 * (today NEW), the reference the int8 kernels are measured against. The int8 kernels themselves
 * come in two bit-identical versions: the persistent ones (default) and the first ones, picked by
 * HOTMOE_CUDA_Q8=v1 in the environment or hm_cuda_q8_set_variant (cuda_matvec.cu; for A/B runs). */
enum hm_cuda_kern { HM_CUDA_KERN_DEFAULT = 0, HM_CUDA_KERN_OLD = 1, HM_CUDA_KERN_NEW = 2, HM_CUDA_KERN_F32 = 3 };
void hm_cuda_set_kern(hm_cuda_ctx *c, int kern);

/* The int8 tensor-core prefill matmul (hm_cuda_matmul, n_tok > HM_CUDA_MATVEC_MAX_TOK, weights
 * Q4_K / Q5_K / Q6_K / IQ4_XS / Q3_K and the grid i-quants; not Q2_K): activations quantised to Q8_K as the CPU does, each block's integer
 * dot the CPU vec_dot's, only the f32 order of the block sums differs (as the decode int8 path).
 * On by default when a context opens; off with HOTMOE_CUDA_MMQ=0 or HOTMOE_CUDA_EXACT=1 in the
 * environment then, or with this setter (a test / A-B hook; turning it on allocates a 16 MiB device workspace, turning
 * it off waits for the compute stream and frees it). Other types keep the bf16 kernel. */
hm_status hm_cuda_set_mmq(hm_cuda_ctx *c, bool on, hm_err *err);

/* Flash attention for prefill (cuda_flash.cu): a batch of at least HM_CUDA_FLASH_MIN_TOK queries
 * with head_dim 64, 128, 256 or 512 runs hm_cuda_attention / hm_cuda_gemma_attention as one fused
 * tensor-core kernel (Q and P rounded to f16, f32 accumulation and softmax; NMSE ~1e-7 against
 * exact attention) instead of the exact f32 kernels, whose cost grows with the batch times the
 * context. On by default when a context opens; off with HOTMOE_FLASH_ATTN=0 or
 * HOTMOE_CUDA_EXACT=1 in the environment then, or with this setter (-fa off). */
#define HM_CUDA_FLASH_MIN_TOK 32
void hm_cuda_set_flash(hm_cuda_ctx *c, bool on);
/* Benchmark hook: the flash kernel's variant for 8-warp f16 tiles (head dim <= 128): 0 (default)
 * registers bounded to two blocks per multiprocessor, 1 unbounded; 2 and 3: decode's KV split
 * aimed at 4 and 16 blocks per multiprocessor instead of 8, 4: at 16 with up to 1024 ranges
 * instead of 256. Same results up to the split's rounding. */
void hm_cuda_set_flash_variant(hm_cuda_ctx *c, int v);
/* Scratch bytes the flash kernel's decode shape uses for batches up to n_tok_max queries (below
 * HM_CUDA_FLASH_MIN_TOK) over up to n_ctx positions: its partials of up to 256 KV ranges a row.
 * hm_cuda_attention_scratch_size includes it; a ring-cache caller adds it. With less scratch the
 * key range is split less (same results within rounding, slower). */
size_t hm_cuda_flash_decode_scratch_size(const hm_cuda_ctx *c, int64_t n_tok_max, int n_head, int n_kv_head,
                                         int head_dim, int64_t n_ctx);
/* Scratch bytes the flash kernel uses for batches up to n_tok_max queries over up to n_ctx
 * positions: with few query blocks (a long context at -ub 512) each block's KV range is split over
 * several blocks whose partials a second kernel merges in order. hm_cuda_attention_scratch_size
 * includes it; a ring-cache caller adds it to hm_cuda_gemma_attention_scratch_size. With less
 * scratch than this the kernel runs unsplit (same results within rounding, slower). 0 when flash
 * is off or does not take such batches. */
size_t hm_cuda_flash_scratch_size(const hm_cuda_ctx *c, int64_t n_tok_max, int n_head, int head_dim, int64_t n_ctx);
bool hm_cuda_flash_on(const hm_cuda_ctx *c);

/* The kernels' block decoders run on the host (no GPU needed): out[0 .. ne0) = `row` of `type`
 * dequantised exactly as the device does it. For tests; HM_ERR_UNSUPPORTED without a kernel. */
hm_status hm_cuda_dequant_row_host(int type, const void *row, int64_t ne0, float *out, hm_err *err);

#ifdef __cplusplus
}
#endif
#endif
