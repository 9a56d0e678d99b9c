/* cpu_ops.h - the CPU backend: the ops the forward pass is written in.
 *
 * Vocabulary: activations are row-major f32, a tensor written [n_tok, n] has n_tok rows of n
 * contiguous floats. Weights are hm_mat (borrowed, usually mmapped, any supported hm_type).
 * Every op takes the engine's pool (NULL = run on the calling thread) and splits its work ith/nth.
 * No op allocates: ops that need temporary memory take an hm_scratch sized at start with the
 * matching *_scratch_size function (too small a scratch is a bug: HM_ASSERT).
 *
 * Determinism: every op gives bit-identical results for any thread count (each output element is
 * computed by one thread in a fixed order), except hm_cpu_attention which is identical for a given
 * thread count and within float rounding across counts (its KV split depends on nth).
 *
 * KV cache layout (one layer, one sequence), f16 (IEEE half, core/fp16.h):
 *   k_cache: [n_kv_head][n_ctx][head_dim]   v_cache: [n_kv_head][n_ctx][head_dim]
 * i.e. element (h, p, d) at (h * n_ctx + p) * head_dim + d. Position p of the sequence is row p. */
#ifndef HM_BACKEND_CPU_OPS_H
#define HM_BACKEND_CPU_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/route_spec.h"
#include "core/threadpool.h"
#include "quant/quant.h"

/* A weight matrix: ne1 rows of ne0 elements of `type` (ne0 a multiple of the block size), row r at
 * (const char *)data + r * nb1. Borrowed. A slice of a 3-D GGUF tensor (one expert) is a hm_mat
 * whose data points at the slab. */
typedef struct hm_mat {
    const void *data;
    int type;    /* hm_type */
    int64_t ne0; /* columns (contiguous), the input dimension */
    int64_t ne1; /* rows, the output dimension */
    size_t nb1;  /* row stride in bytes (hm_row_size(type, ne0) when dense) */
} hm_mat;

/* Caller-owned temporary memory for one op at a time (64-byte aligned, e.g. hm_malloc_aligned). */
typedef struct hm_scratch {
    void *data;
    size_t size;
} hm_scratch;

/* Fill a dense hm_mat. */
static inline hm_mat hm_mat_make(const void *data, int type, int64_t ne0, int64_t ne1, size_t nb1) {
    hm_mat m = {data, type, ne0, ne1, nb1};
    return m;
}

/* True when this backend can compute with type t (its traits are registered and supported). */
bool hm_cpu_type_ok(int type);

/* ---- matmul ---------------------------------------------------------------------------------- */

/* Scratch bytes for hm_cpu_matmul / hm_cpu_matmul_n with inputs of ne0 columns, up to n_tok tokens,
 * weights of any supported type, on a pool of n_threads. Monotonic in every argument. */
size_t hm_cpu_matmul_scratch_size(int64_t ne0, int64_t n_tok, int n_threads);

/* y[t][r] = sum_c x[t][c] * w(r, c), for t < n_tok, r < w->ne1.
 *   x: [n_tok, w->ne0] f32;  y: [n_tok, w->ne1] f32 (must not alias x).
 * x is quantised once to the weight type's vec_dot_type; rows of w are split over the threads. */
void hm_cpu_matmul(hm_pool *pool, const hm_mat *w, const float *x, int64_t n_tok, float *y,
                   hm_scratch *scratch);

/* n_mat matmuls sharing one input x, in one dispatch (Q/K/V, the router): ys[i] = x * ws[i]^T.
 * All ws[i]->ne0 must be equal. n_mat <= HM_CPU_MATMUL_MAX. */
#define HM_CPU_MATMUL_MAX 8
void hm_cpu_matmul_n(hm_pool *pool, const hm_mat *const *ws, int n_mat, const float *x,
                     int64_t n_tok, float *const *ys, hm_scratch *scratch);

/* ---- mixture of experts ----------------------------------------------------------------------- */

/* One expert unit's work: its three matrices and the tokens routed to it.
 *   gate, up: n_ff rows x n_embd;  down: n_embd rows x n_ff.
 *   tok[i] indexes a row of X / out, w[i] is its routing weight (borrowed, n_tok entries). */
typedef struct hm_moe_job {
    hm_mat gate, up, down;
    const int32_t *tok;
    const float *w;
    int32_t n_tok;
    const float *gate_b, *up_b, *down_b; /* the unit's biases [n_ff], [n_ff], [n_embd] (gpt-oss), NULL: none */
} hm_moe_job;

/* Scratch bytes for hm_cpu_moe over up to n_batch tokens and n_pairs (token, job) pairs in total
 * (n_batch * n_expert_used for a full layer). */
size_t hm_cpu_moe_scratch_size(int64_t n_batch, int64_t n_pairs, int64_t n_embd, int64_t n_ff,
                               int n_threads);

/* out[t] += sum over jobs j, pairs i with tok = t: w_i * down_j(silu(gate_j(x_t)) * up_j(x_t)).
 *   x: [n_batch, n_embd];  out: [n_batch, n_embd] (accumulated into, not cleared).
 * Two dispatches for all jobs (gate+up, then down) with (job, row chunk) work items balanced over the
 * threads. The sum into out runs in job order, then pair order: deterministic for any nth. */
void hm_cpu_moe(hm_pool *pool, const hm_moe_job *jobs, int n_jobs, const float *x, int64_t n_batch,
                int64_t n_embd, int64_t n_ff, float *out, hm_scratch *scratch);
/* The same with the activation named: SiLU (hm_cpu_moe), GELU-tanh (Gemma's experts) or gpt-oss's
 * clamped SwiGLU, h = g' sigmoid(1.702 g') (u' + 1) with g' = min(g, 7), u' = clamp(u, -7, 7). A job's
 * biases, when it has them, are added to g and u before the activation and to its down output
 * before the routing weight: out += w (down h + down_b). */
typedef enum hm_cpu_act { HM_CPU_ACT_SILU = 0, HM_CPU_ACT_GELU = 1, HM_CPU_ACT_SWIGLU_OAI = 2 } hm_cpu_act;
#define HM_SWIGLU_OAI_ALPHA 1.702f
#define HM_SWIGLU_OAI_LIMIT 7.0f
void hm_cpu_moe_act(hm_pool *pool, hm_cpu_act act, const hm_moe_job *jobs, int n_jobs, const float *x,
                    int64_t n_batch, int64_t n_embd, int64_t n_ff, float *out, hm_scratch *scratch);
/* The same with a SwiGLU clamp (limit > 0; DeepSeek-V4): h = silu(min(g, limit)) * clamp(u, -limit,
 * limit); limit 0 is hm_cpu_moe_act. */
void hm_cpu_moe_act_lim(hm_pool *pool, hm_cpu_act act, float limit, const hm_moe_job *jobs, int n_jobs,
                        const float *x, int64_t n_batch, int64_t n_embd, int64_t n_ff, float *out,
                        hm_scratch *scratch);

/* One token (n_batch == 1, one pair per job: decode) takes a path of static row ranges with two
 * barriers, bit-identical to the general one; false sends it through the general path (tests, A/B
 * runs; not thread-safe against a running hm_cpu_moe). Default true. */
void hm_cpu_moe_set_one_token_path(bool on);

/* Router: for each token, p = softmax(logits[t]) over n_expert, pick the k largest (ties: lower id
 * first, ids in descending p), weights = their p, divided by their sum when renorm.
 *   logits: [n_tok, n_expert];  ids, weights: [n_tok, k]. (hm_cpu_route with the plain spec.) */
void hm_cpu_router(const float *logits, int64_t n_tok, int n_expert, int k, bool renorm,
                   int32_t *ids, float *weights);

/* The routing spec (backend/route_spec.h, which says what each step computes) for n_tok tokens:
 * bias [n_expert] or NULL; hash [n_vocab, k] with tokens [n_tok] for a hash-routed layer (ids from
 * the table), else NULL. sp must be valid (hm_route_spec_invalid NULL), table ids < n_expert.
 *   logits: [n_tok, n_expert];  ids, weights: [n_tok, k]. */
void hm_cpu_route(const hm_route_spec *sp, const float *logits, int64_t n_tok, const float *bias,
                  const int32_t *hash, const int32_t *tokens, int32_t *ids, float *weights);

/* ---- attention -------------------------------------------------------------------------------- */

/* Write n_tok new K/V rows into the cache at positions pos[t] (f32 -> f16).
 *   k, v: [n_tok, n_kv_head * head_dim]. */
void hm_cpu_kv_write(hm_pool *pool, uint16_t *k_cache, uint16_t *v_cache, int64_t n_ctx,
                     int n_kv_head, int head_dim, const float *k, const float *v, int64_t n_tok,
                     const int32_t *pos);

/* Scratch bytes for hm_cpu_attention with up to n_tok queries (any smaller count too), n_ctx
 * positions, n_head q heads of head_dim, on a pool of n_threads. Monotonic in every argument. */
size_t hm_cpu_attention_scratch_size(int64_t n_tok, int64_t n_ctx, int n_head, int head_dim,
                                     int n_threads);

/* Causal GQA attention of n_tok queries against the cache: query t (at position pos[t], its own
 * K/V already written) attends to cache rows 0..pos[t]; q head h uses kv head h / (n_head / n_kv_head).
 *   q: [n_tok, n_head * head_dim];  out: [n_tok, n_head * head_dim] (must not alias q).
 * softmax(scale * q.k) in f32 with max subtraction; scale is usually 1/sqrt(head_dim). */
void hm_cpu_attention(hm_pool *pool, const float *q, int64_t n_tok, const int32_t *pos,
                      const uint16_t *k_cache, const uint16_t *v_cache, int64_t n_ctx, int n_head,
                      int n_kv_head, int head_dim, float scale, float *out, hm_scratch *scratch);

/* hm_cpu_attention over a plain cache of bf16 / q8_0 / q4_0 rows (hm_row_size(type, head_dim) bytes
 * each, [n_kv_head][n_ctx] rows), its grouped kernel dequantising each 16-row block once for a GQA
 * group's q heads (the decode path of those caches; their prefill goes to the tiled kernel through
 * hm_cpu_attention_ring). Taken on AVX-512 builds with head_dim % 16 == 0 up to 512
 * (hm_cpu_attention_kv_takes); scratch: hm_cpu_attention_scratch_size. */
bool hm_cpu_attention_kv_takes(int type, int head_dim);
void hm_cpu_attention_kv(hm_pool *pool, int type, const float *q, int64_t n_tok, const int32_t *pos,
                         const void *k_cache, const void *v_cache, int64_t n_ctx, int n_head, int n_kv_head,
                         int head_dim, float scale, float *out, hm_scratch *scratch);

/* ---- the general cache (cpu_attn_ring.c): any row type, ring or plain, windowed or not ---- */

/* Ring-buffer KV (one layer): k_cache, v_cache: [n_kv_head][cap] rows of head_dim values of a cache
 * row type (hm_cpu_kv_row_ok: f32, f16, bf16, or ggml blocks q8_0 / q4_0 of 32 values: the row is
 * hm_row_size(type, head_dim) bytes); position p lives in row p % cap. A full cache is the case
 * cap >= every position (row = p). A sliding layer of window W evaluated in micro-batches of up to
 * U tokens needs cap >= W + U - 1: then writing a batch never overwrites a row that one of its own
 * queries still reads. */

/* true when rows of head_dim values of type can be a cache row (the types above; head_dim a
 * multiple of the type's block). */
bool hm_cpu_kv_row_ok(int type, int head_dim);

/* Write n_tok K/V rows (f32 in, converted to the cache's type: f16 rounded to nearest even,
 * quantised types by the type's from_float, as ggml's cache stores them) at rows pos[t] % cap.
 *   k, v: [n_tok, n_kv_head * head_dim]. */
void hm_cpu_kv_write_ring(hm_pool *pool, void *k_cache, void *v_cache, int type, int64_t cap,
                          int n_kv_head, int head_dim, const float *k, const float *v, int64_t n_tok,
                          const int32_t *pos);

/* Scratch floats for hm_cpu_attention_ring over a cache of cap rows on n_threads (and, for the tiled
 * prefill path it sends f16 batches to, at least hm_cpu_attn_tiled_scratch_floats of the layer's
 * shape: the caller takes the larger). */
size_t hm_cpu_attention_ring_scratch_floats(int64_t cap, int n_threads);

/* Causal GQA attention: query t (position pos[t], its K/V written) attends to positions
 * max(0, pos[t] - window + 1) .. pos[t] (window 0 = all), read from rows p % cap; q head h uses kv
 * head h / (n_head / n_kv_head). softmax(scale * q.k) in f32 with max subtraction.
 *   q, out: [n_tok, n_head * head_dim] (out must not alias q); scratch: see above. */
void hm_cpu_attention_ring(hm_pool *pool, const float *q, int64_t n_tok, const int32_t *pos,
                           const void *k_cache, const void *v_cache, int type, int64_t cap,
                           int32_t window, int n_head, int n_kv_head, int head_dim, float scale,
                           float *out, float *scratch);
/* The same with attention sinks (gpt-oss): sinks[h] (NULL: none) is one more logit of q head h's
 * softmax, unscaled, with no value: it only adds e^(sinks[h] - max) to the denominator. */
void hm_cpu_attention_ring_sinks(hm_pool *pool, const float *q, int64_t n_tok, const int32_t *pos,
                                 const void *k_cache, const void *v_cache, int type, int64_t cap,
                                 int32_t window, int n_head, int n_kv_head, int head_dim, float scale,
                                 const float *sinks, float *out, float *scratch);

/* Prefill attention in tiles (cpu_attn.c): blocks of 8 queries of one kv head walk their visible
 * keys 16 at a time, each K/V block converted to f32 once for all of their rows, with an online
 * softmax (running max and sum; no score buffer over the context). The contract of
 * hm_cpu_attention_ring over a cache of any row type but f32 (each block of rows dequantised to the
 * f32 tile once; f16 exactly as before): positions p at rows p % cap, query t sees max(0, pos[t] -
 * window + 1) .. pos[t] (window 0: every position; then pos[t] < cap). Deterministic for any
 * thread count. It takes batches of HM_CPU_ATTN_TILED_MIN+ queries with head_dim % 16 == 0 up to
 * 512 and at most 64 q heads per kv head, on AVX-512 builds (hm_cpu_attn_tiled_takes); ws: its
 * scratch floats. hm_cpu_attention_ring sends such batches here (hm_cpu_attention keeps its per-query
 * kernels: faster on a plain cache, cpu_attn.c says why). */
#define HM_CPU_ATTN_TILED_MIN 16
bool hm_cpu_attn_tiled_takes(int64_t n_tok, int n_head, int n_kv_head, int head_dim);
size_t hm_cpu_attn_tiled_scratch_floats(int n_head, int n_kv_head, int head_dim, int n_threads);
void hm_cpu_attention_tiled(hm_pool *pool, const float *q, int64_t n_tok, const int32_t *pos,
                            const void *k_cache, const void *v_cache, int type, int64_t cap, int32_t window,
                            int n_head, int n_kv_head, int head_dim, float scale, float *out, float *ws);
/* hm_cpu_attention_tiled with attention sinks (hm_cpu_attention_ring_sinks's; NULL: none). */
void hm_cpu_attention_tiled_sinks(hm_pool *pool, const float *q, int64_t n_tok, const int32_t *pos,
                                  const void *k_cache, const void *v_cache, int type, int64_t cap, int32_t window,
                                  int n_head, int n_kv_head, int head_dim, float scale, const float *sinks,
                                  float *out, float *ws);

/* ---- elementwise and row ops (out may alias the input unless said otherwise) -------------------- */

/* out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, for n_rows rows of n; w: [n] f32 (NULL = ones). */
void hm_cpu_rmsnorm(hm_pool *pool, const float *x, const float *w, float *out, int64_t n_rows,
                    int64_t n, float eps);

/* Per-head RMSNorm (Qwen3 q_norm / k_norm): x: [n_tok, n_head * head_dim] normalised in place per
 * head_dim segment with weight w: [head_dim]. */
void hm_cpu_rmsnorm_heads(hm_pool *pool, float *x, const float *w, int64_t n_tok, int n_head,
                          int head_dim, float eps);

/* RoPE, NEOX pairing (element i with i + n_rot/2, i < n_rot/2), in place on x: [n_tok, n_head *
 * head_dim]; angle = pos[t] * theta_base^(-2i/n_rot). Elements n_rot..head_dim-1 are left as is. */
void hm_cpu_rope_neox(hm_pool *pool, float *x, int64_t n_tok, int n_head, int head_dim, int n_rot,
                      const int32_t *pos, float theta_base);

/* RoPE, normal pairing (element 2i with 2i + 1, i < n_rot/2), in place on x as hm_cpu_rope_neox;
 * ff NULL or per-pair frequency divisors [n_rot / 2] (cpu_rope.c). */
void hm_cpu_rope_norm(hm_pool *pool, float *x, int64_t n_tok, int n_head, int head_dim, int n_rot,
                      const int32_t *pos, float theta_base, const float *ff);

void hm_cpu_add(hm_pool *pool, const float *a, const float *b, float *out, int64_t n); /* a + b */
void hm_cpu_mul(hm_pool *pool, const float *a, const float *b, float *out, int64_t n); /* a * b */
void hm_cpu_scale(hm_pool *pool, const float *a, float s, float *out, int64_t n);      /* a * s */
void hm_cpu_silu(hm_pool *pool, const float *x, float *out, int64_t n); /* x / (1 + e^-x) */
/* out = silu(gate) * up */
void hm_cpu_swiglu(hm_pool *pool, const float *gate, const float *up, float *out, int64_t n);

/* Row softmax with max subtraction, in place: x: [n_rows, n]. */
void hm_cpu_softmax(hm_pool *pool, float *x, int64_t n_rows, int64_t n);

/* Embedding lookup: out[i] = dequant(table row ids[i]) for i < n_ids; out: [n_ids, table->ne0].
 * ids must be in [0, table->ne1) (checked by the caller: they come from the tokenizer). */
void hm_cpu_get_rows(hm_pool *pool, const hm_mat *table, const int32_t *ids, int64_t n_ids,
                     float *out);

#endif
