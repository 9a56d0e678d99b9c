/* exec.h - runs an architecture's ONE layer description on every backend.
 *
 * An architecture (model/<arch>.c) writes its layer once, as a function over the ops below
 * (hm_op_*), and describes the rest declaratively in an hm_exec_model: the activation buffers it
 * uses, the attention shape of its KV cache, its vocabulary tensors and, per layer, its MoE block
 * (router, experts, hm_moe_spec). The executor owns everything per session (KV cache,
 * activations, the CPU route and scratch, on the GPU one device state per device of the layer
 * split) and runs the description on:
 *   - the CPU backend (exec_cpu.c): every op on the pool; several sequences in one pass
 *     (forward_multi: row-wise ops once over all rows, the K/V write and attention per sequence);
 *   - the CUDA backend (exec_cuda.c), op by op ("per-launch"), with the MoE split into hot units
 *     on the device and cold ones on the CPU threads (exec/moe_cuda.c);
 *   - the CUDA graph (exec_cuda.c): a decode step is the SAME description run once under stream
 *     capture and replayed (exec/moe_graph_cuda.c); its MoE op publishes and joins instead;
 *   - the upload pass (exec_upload_cuda.c): the description run once per layer at gpu_load, each
 *     op uploading the weights it names to the layer's device: no arch writes an upload list.
 * So an arch file holds its hparams, its tensor binding and this one description; nothing else.
 *
 * The description's contract: its control flow depends on the model and the layer index only
 * (never on data), since the upload pass and the graph capture replay it; after hm_op_out_rows it
 * returns at once when hm_exec_done says so (the last layer of a pass without wanted logits).
 * Rows: every op works on the pass's current rows (all of the micro-batch, then after the last
 * layer's hm_op_out_rows only the rows whose logits are wanted). A buffer's declared width (floats
 * per row) sizes it; an op writes its rows packed at the op's own width (a matmul's output rows,
 * an attention's heads), which may be less. Buffers HM_BUF_X (the residual stream) and HM_BUF_H (a
 * block's normed input, the MoE's input) exist in every arch, n_embd wide. */
#ifndef HM_EXEC_H
#define HM_EXEC_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/cpu/cpu_dsv4.h"
#include "backend/cpu/cpu_ops.h"
#include "core/status.h"
#include "model/model.h"
#include "exec/moe.h"

/* An activation buffer: an index into the arch's declared buffers. */
typedef int32_t hm_buf;
enum { HM_BUF_X = 0, HM_BUF_H = 1, HM_BUF_ARCH = 2 /* the arch's own from here */ };
#define HM_EXEC_MAX_BUF 24

/* How a MoE layer routes (the declarative MoE spec; what the route op and the expert kernels
 * read). The routing steps are backend/route_spec.h's (both backends implement them): softmax,
 * sigmoid or sqrt-softplus scores (or a softmax over the chosen logits), an optional per-layer
 * score bias that steers the choice, group-limited top-k, renormalisation, a routed scale, and
 * hash-routed layers (experts from a token-id table). qwen3moe, qwen35moe and gemma4: softmax,
 * top-k renormalised, SiLU or GELU experts (hm_moe_weights.act); gpt-oss: biased router logits
 * (hm_moe_layer.router_bias), a softmax over the chosen ones, clamped SwiGLU experts with biases. */
typedef struct hm_moe_spec {
    int32_t n_expert, k;     /* experts, routed per token */
    int64_t n_ff;            /* an expert's hidden width */
    hm_route_score score;    /* HM_ROUTE_SOFTMAX, _SIGMOID, _SQRT_SOFTPLUS, _SOFTMAX_TOPK */
    bool norm_topk;          /* the k weights renormalised to sum 1 */
    float routed_scale;      /* the weights times this after (0 or 1: none) */
    int32_t n_group, topk_group; /* group-limited choice (n_group <= 1: none) */
} hm_moe_spec;

/* The backends' routing spec of a MoE spec. */
static inline hm_route_spec hm_moe_route_spec(const hm_moe_spec *m) {
    return (hm_route_spec){.n_expert = m->n_expert, .k = m->k, .score = m->score, .norm = m->norm_topk,
                           .scale = m->routed_scale, .n_group = m->n_group, .topk_group = m->topk_group};
}

/* One layer's MoE block (borrowed from the arch's bound weights). */
typedef struct hm_moe_layer {
    const hm_mat *router;          /* [n_expert x n_embd] */
    const hm_moe_weights *experts; /* the units (moe.h) */
    const float *expert_scale;     /* [n_expert] per-expert weight scale, NULL: none */
    const float *score_bias;       /* [n_expert] added to the scores for the choice, NULL: none */
    const int32_t *hash;           /* [n_vocab, k] a hash-routed layer's experts per token id, NULL:
                                      routed by score (the router still gives the weights) */
    const float *router_bias;      /* [n_expert] added to the router's logits before the scores
                                      (gpt-oss's ffn_gate_inp.bias), NULL: none */
} hm_moe_layer;

/* The shape of a Gated DeltaNet token mixer (qwen35moe's and qwen3next's linear-attention layers): conv window d_conv
 * over conv_dim channels (q and k: n_k heads of d_k, v: n_v heads of d_v), the delta state
 * S [n_v][d_k][d_v] per layer. n_v 0: the arch has none. */
typedef struct hm_deltanet_spec {
    int32_t d_conv, n_k, n_v, d_k, d_v, conv_dim;
} hm_deltanet_spec;

/* One layer's attention shape where layers differ (gemma4: sliding and global layers). */
typedef struct hm_attn_layer {
    int32_t head_dim, n_head_kv;
    int32_t window;  /* a sliding layer sees the last `window` positions (its KV cache a ring of
                        min(n_ctx, window + n_ubatch) rows); 0: every position (n_ctx rows) */
    const float *sinks; /* [n_head] attention sinks (gpt-oss): one more logit per q head in the
                           softmax's denominator, unscaled, with no value; NULL: none */
} hm_attn_layer;

/* DeepSeek-V4's shape (hc 0: the arch is not V4): the attention dims every layer shares, each
 * layer's compression ratio (0, 4, 128), and the hyper-connections (hc residual streams mixed by
 * Sinkhorn matrices of hc_iters iterations). Its layers keep their attention state (window ring,
 * compressors, compressed rows: backend/cpu/cpu_dsv4.h) in the session's state; a session can go
 * back only within the current 128-position block of what it evaluated (or to 0). */
typedef struct hm_dsv4_spec {
    hm_dsv4_dims dims;
    int32_t hc, hc_iters;
    float hc_eps;
    const int32_t *ratio; /* [n_layer] */
} hm_dsv4_spec;

/* What the executor needs of an architecture besides its layer description (filled by the arch's
 * load, pointed at by hm_model.xm; borrowed). */
typedef struct hm_exec_model {
    int32_t n_layer, n_embd, n_vocab;
    float eps;                         /* the output norm's */
    const hm_mat *tok_embd, *output;   /* [n_vocab x n_embd] each (may be the same matrix) */
    const float *output_norm;          /* [n_embd] */
    float embd_scale;                  /* the embeddings are scaled by it after the lookup; 0: not */
    float softcap;                     /* logits = softcap tanh(logits / softcap); 0: none */
    int32_t n_buf;                     /* activation buffers, HM_BUF_X and HM_BUF_H among them */
    int64_t buf_width[HM_EXEC_MAX_BUF];/* floats per row of each */
    /* attention: a layer with a KV cache has n_head_kv heads of head_dim (f16, or f32 on the CPU) */
    int32_t n_head, n_head_kv, head_dim;
    const int32_t *kv_slot;            /* [n_layer] the layer's KV cache, -1: none; NULL: every layer,
                                          slot il */
    int32_t n_kv_layer;                /* layers with a KV cache */
    const hm_attn_layer *attn_layers;  /* [n_layer] per-layer shapes (the ring attention ops read
                                          them); NULL: every layer n_head_kv x head_dim, all positions */
    bool attn_ring;                    /* the layers use hm_op_attn_in_ring / hm_op_attention_ring */
    bool kv_v_is_k;                    /* a layer's cache holds K rows only and attention reads each V
                                          row as its K row (MLA's compressed cache: hm_op_mla_in) */
    /* recurrent layers (Gated DeltaNet): a state of hm_exec_rs_floats floats each, carried from
     * pass to pass; with any, a session only continues at its last position or restarts at 0 */
    hm_deltanet_spec dn;
    const int32_t *rs_slot;            /* [n_layer] the layer's recurrent state, -1: none */
    int32_t n_rs_layer;
    hm_moe_spec moe;
    const hm_moe_layer *moe_layers;    /* [n_layer] */
    hm_dsv4_spec dsv4;                 /* DeepSeek-V4's attention and hyper-connections (hc 0: none) */
    hm_buf inject_buf;                 /* > 0: the buffer a batch's inject rows land in (an MTP head's
                                          hidden input; hm_fwd_batch.inject), inject_width wide */
    int64_t inject_width;
} hm_exec_model;

/* Floats of one recurrent layer's state: the conv window (d_conv - 1 inputs) then S. */
static inline size_t hm_exec_rs_floats(const hm_deltanet_spec *d) {
    return (size_t)(d->d_conv - 1) * (size_t)d->conv_dim + (size_t)d->n_v * (size_t)d->d_k * (size_t)d->d_v;
}

/* A forward pass in progress (exec_impl.h); the description only passes it on. */
typedef struct hm_exec hm_exec;

/* ---- the ops a layer description calls (each returns a status; rows: the pass's current) ---- */

/* out = rmsnorm(in) * w over n_embd-wide rows. */
hm_status hm_op_rmsnorm(hm_exec *x, hm_buf in, const float *w, hm_buf out);
/* outs[i] = in W_i for n (<= 4) matrices of the same input; a backend may run them as one
 * (stacked at upload when their types and widths match). */
hm_status hm_op_matmul_n(hm_exec *x, hm_buf in, const hm_mat *const *ws, const hm_buf *outs, int n);
static inline hm_status hm_op_matmul(hm_exec *x, hm_buf in, const hm_mat *w, hm_buf out) {
    return hm_op_matmul_n(x, in, &w, &out, 1);
}
/* acc += add; out = rmsnorm(acc) * w (n_embd wide). */
hm_status hm_op_add_rmsnorm(hm_exec *x, hm_buf acc, hm_buf add, const float *w, hm_buf out);
/* Layer il's attention input: per-head rmsnorm of q (q_norm) and k (k_norm) over head_dim, NEOX
 * RoPE of the first n_rot dims of each head at each row's position (base theta), then k and v into
 * the layer's KV cache at those positions. q: [rows, n_head*hd], k, v: [rows, n_head_kv*hd].
 * A NULL q_norm / k_norm leaves q / k unnormed; rope_norm pairs dims (2i, 2i + 1) instead of
 * NEOX's (i, i + n_rot/2) (llama.cpp's "normal" RoPE: llama, Mixtral). */
typedef struct hm_qk_rope {
    hm_buf q, k, v;
    const float *q_norm, *k_norm; /* [head_dim], or NULL: none */
    const float *rope_ff;         /* NULL, or per-pair frequency divisors [n_rot / 2] (RoPE scaling:
                                     angle pos * theta^(-2i/n_rot) / ff[i]; hm_model_rope_scaling) */
    int32_t n_rot;
    float theta, eps;
    bool rope_norm;               /* pairs (2i, 2i + 1); false: NEOX */
} hm_qk_rope;
hm_status hm_op_qk_norm_rope_kv(hm_exec *x, int32_t il, const hm_qk_rope *p);
/* Where the last layer drops the rows whose logits are not wanted: in layer n_layer - 1 of a pass
 * that wants fewer rows than it has, bufs[0..n) keep only the wanted rows (moved to the front), the
 * positions and row counts follow; when no row is wanted the pass is done (hm_exec_done). In any
 * other layer nothing. */
hm_status hm_op_out_rows(hm_exec *x, int32_t il, const hm_buf *bufs, int n);
/* hm_op_out_rows with each buffer's row width given (widths[i] floats; a layer's own width where
 * the buffer is declared wider). */
hm_status hm_op_out_rows_w(hm_exec *x, int32_t il, const hm_buf *bufs, const int64_t *widths, int n);
/* True once the pass has nothing more to compute (see hm_op_out_rows). */
bool hm_exec_done(const hm_exec *x);
/* out = causal GQA attention of q over layer il's KV cache, scores scaled by scale. */
hm_status hm_op_attention(hm_exec *x, int32_t il, hm_buf q, hm_buf out, float scale);
/* Gated attention's split: mix [rows, n_head * 2 * head_dim] holds per head [q | gate]; q and gate
 * [rows, n_head * head_dim] get the halves. */
hm_status hm_op_split_gate(hm_exec *x, hm_buf mix, hm_buf q, hm_buf gate);
/* a[r][i] *= sigmoid(gate[r][i]) for i < width (both packed [rows, width]). */
hm_status hm_op_sigmoid_mul(hm_exec *x, hm_buf a, hm_buf gate, int64_t width);
/* out = silu(g) * u elementwise over [rows, width] (out may be g). */
hm_status hm_op_swiglu(hm_exec *x, hm_buf g, hm_buf u, hm_buf out, int64_t width);
/* acc[r] += sigmoid(s[r]) * y[r] (n_embd wide; s: one logit a row): a sigmoid-gated shared expert. */
hm_status hm_op_add_sigmoid_scaled(hm_exec *x, hm_buf acc, hm_buf y, hm_buf s);
/* Layer il's Gated DeltaNet token mixer (xm->dn's shape) on io (n_embd wide, in and out): qkv, z,
 * beta and alpha projections, the causal conv + SiLU over the carried window, q and k L2-normalised
 * per head (q / sqrt(d_k)), the gates g = ssm_a * softplus(alpha + dt_bias) and beta = sigmoid,
 * the gated delta rule over the carried S, per-head rmsnorm(o) * ssm_norm * silu(z), the output
 * projection; the layer's recurrent state advanced. The buffers are work space. The layout of the
 * value heads: qwen35moe's GGUF tiles them (value head h reads key head h % n_k); grouped is
 * Qwen3-Next's, a key head's value heads adjacent (key head h / (n_v / n_k)), with beta and alpha
 * from one fused matrix (wbeta: ssm_ba [2 n_v x n_embd], per key head its n_v / n_k beta rows then
 * its alpha rows; walpha NULL; ba then [rows, 2 n_v]). */
typedef struct hm_deltanet {
    const hm_mat *wqkv, *wz, *wbeta, *walpha, *wout;
    const float *conv_w;          /* [d_conv, conv_dim] */
    const float *dt_bias, *ssm_a; /* [n_v] */
    const float *ssm_norm;        /* [d_v] */
    float eps;
    bool grouped;                 /* Qwen3-Next's layout (above) */
    hm_buf mix, conv, z, ba, aa, g, beta, att; /* [rows, conv_dim] x2, [rows, n_v d_v], [rows, n_v] x4
                                                  (ba: 2 n_v when grouped), [rows, n_v d_v] */
} hm_deltanet;
hm_status hm_op_deltanet(hm_exec *x, int32_t il, hm_buf io, const hm_deltanet *p);
/* Layer il's MoE block (xm->moe_layers[il], xm->moe) in two steps. route: the router on in, the
 * spec's choice and weights (a hash-routed layer: its table at each row's token), each weight times
 * expert_scale[e] when the layer has one; the routing recorded in the expert store. experts: the routed units of in summed into out. The GPU
 * reads the experts' input from HM_BUF_H. hm_op_moe: both on one input. */
hm_status hm_op_route(hm_exec *x, int32_t il, hm_buf in);
hm_status hm_op_experts(hm_exec *x, int32_t il, hm_buf in, hm_buf out);
hm_status hm_op_moe(hm_exec *x, int32_t il, hm_buf in, hm_buf out);

/* acc += add (n_embd wide). */
hm_status hm_op_add(hm_exec *x, hm_buf acc, hm_buf add);
/* a[r][i] += b[i] over [rows, width] (a projection's bias: GLM-4.5's q/k/v, gpt-oss's q/k/v/o). */
hm_status hm_op_add_bias(hm_exec *x, hm_buf a, const float *b, int64_t width);
/* a *= s over [rows, width]. */
hm_status hm_op_scale(hm_exec *x, hm_buf a, float s, int64_t width);
/* a = 0 over [rows, width]. */
hm_status hm_op_zero(hm_exec *x, hm_buf a, int64_t width);
/* dst = src over [rows, width]. */
hm_status hm_op_copy(hm_exec *x, hm_buf src, hm_buf dst, int64_t width);
/* out[r] = [a[r][0..wa) | b[r][0..wb)] (a concatenation along the row; out wa + wb wide; the CPU
 * only for now: another backend refuses it naming the op). */
hm_status hm_op_concat(hm_exec *x, hm_buf a, int64_t wa, hm_buf b, int64_t wb, hm_buf out);
/* out = gelu_tanh(g) * u elementwise over [rows, width] (out may be g). */
hm_status hm_op_geglu(hm_exec *x, hm_buf g, hm_buf u, hm_buf out, int64_t width);
/* Layer il's attention input over a ring KV cache (xm->attn_layers[il]'s shape, n_head query
 * heads): per-head rmsnorm of q (q_norm) and k (k_norm), of v without a weight, NEOX RoPE of the
 * first n_rot dims at each row's position, angle pos * theta^(-2i/n_rot) / ff[i] (rope_ff NULL:
 * ones), then k and v into the layer's cache rows pos % cap. */
typedef struct hm_ring_in {
    hm_buf q, k, v;
    const float *q_norm, *k_norm; /* [head_dim] */
    const float *rope_ff;         /* [n_rot / 2] or NULL */
    int32_t n_rot;
    float theta, eps;
    bool no_norm;                 /* q, k and v as they come: no rmsnorm at all (gpt-oss) */
} hm_ring_in;
hm_status hm_op_attn_in_ring(hm_exec *x, int32_t il, const hm_ring_in *p);
/* out = causal GQA attention of q over layer il's ring cache (its window; 0: every position),
 * scores scaled by scale. */
hm_status hm_op_attention_ring(hm_exec *x, int32_t il, hm_buf q, hm_buf out, float scale);

/* out = rmsnorm(in) * w over width-wide rows (w NULL: none; a norm over a whole projection:
 * OLMoE's q and k, MLA's compressed rows). */
hm_status hm_op_rmsnorm_w(hm_exec *x, hm_buf in, const float *w, hm_buf out, int64_t width);
/* Multi-head latent attention's input (DeepSeek-V2/V3, deepseek2.c), layer il: q [rows, n_head *
 * (nope + n_rot)] per head [nope part | rope part]; kv [rows, kv_lora + n_rot] [compressed c | k_pe].
 * The rope part of each q head, RoPE'd (interleaved pairs 2i, 2i+1: ggml's NORM rope; angle pos *
 * theta^(-2i/n_rot) / ff[i]), goes to qa's head h at kv_lora (qa [rows, n_head * (kv_lora + n_rot)]);
 * c = rmsnorm(c) * kv_norm and k_pe RoPE'd in place; the kv rows go to the layer's cache (one head
 * of kv_lora + n_rot: xm->n_head_kv 1, head_dim kv_lora + n_rot, kv_v_is_k). q is left as it was. */
typedef struct hm_mla_in {
    hm_buf q, qa, kv;
    const float *kv_norm;  /* [kv_lora] */
    const float *rope_ff;  /* [n_rot / 2] or NULL */
    int32_t nope, kv_lora, n_rot;
    float theta, eps;
} hm_mla_in;
hm_status hm_op_mla_in(hm_exec *x, int32_t il, const hm_mla_in *p);
/* Per-head matrices: head h's [ne1 x ne0] matrix is w with data + h * nb2 (a 3-D tensor
 * [ne0, ne1, n_head]: MLA's attn_k_b, attn_v_b). */
typedef struct hm_mat_heads {
    hm_mat w;   /* head 0 */
    size_t nb2; /* bytes from one head's matrix to the next */
    int32_t n_head;
} hm_mat_heads;
/* out[r][h * out_stride + j] = sum_i W_h[j][i] in[r][h * in_stride + i] for every head h, i < ne0,
 * j < ne1 (other columns of out untouched); tin [rows, ne0] and tout [rows, ne1] are work space. */
typedef struct hm_heads_io {
    hm_buf in, out, tin, tout;
    int64_t in_stride, out_stride;
} hm_heads_io;
hm_status hm_op_matmul_heads(hm_exec *x, const hm_mat_heads *w, const hm_heads_io *io);

/* ---- DeepSeek-V4's ops (xm->dsv4; one sequence a pass; CPU: cpu_dsv4.h, CUDA: cuda_dsv4.h) ---- */

/* Hyper-connection weights: fn [(2 + hc) hc x hc E] (the head's: [hc x hc E]), scale [3] ([1]),
 * base [(2 + hc) hc] ([hc]). */
typedef struct hm_hc {
    const hm_mat *fn;
    const float *scale, *base;
} hm_hc;
/* io's rows, packed n_embd wide (the embeddings), become hc copies each ([rows, hc n_embd]). */
hm_status hm_op_hc_expand(hm_exec *x, hm_buf io);
/* The mixing before a block: mix = fn rmsnorm(in) (norm: work, hc n_embd wide), turned into
 * [pre | post | comb] (cpu_dsv4.h's hm_dsv4_hc_mix), out = sum_h pre_h in_h (n_embd wide). */
hm_status hm_op_hc_pre(hm_exec *x, hm_buf in, const hm_hc *p, hm_buf norm, hm_buf mix, hm_buf out);
/* After the block: out[dst] = post[dst] f + sum_src comb[dst][src] res[src] ([rows, hc n_embd];
 * out must not be res). */
hm_status hm_op_hc_post(hm_exec *x, hm_buf f, hm_buf res, hm_buf mix, hm_buf out);
/* The head's reduction before the output norm: out (n_embd wide) = sum_h pre_h in_h with
 * pre = sigmoid(fn rmsnorm(in) scale + base) + eps. */
hm_status hm_op_hc_head(hm_exec *x, hm_buf in, const hm_hc *p, hm_buf norm, hm_buf mix, hm_buf out);
/* Layer il's attention (cpu_dsv4.h's hm_dsv4_attention on the layer's state): in h (normed input),
 * qr (h Wq_a), kv (h Wkv); out the grouped low-rank output (before Wo_b); the rest work space of
 * the widths hm_dsv4_attn names (ca [max(2 hd, n_head hd / groups)], cb [max(2 hd, o_lora)]). */
typedef struct hm_dsv4_attn {
    hm_dsv4_lw w;
    hm_buf h, qr, kv, q, out, ca, cb, ia, ib, iq;
} hm_dsv4_attn;
hm_status hm_op_dsv4_attn(hm_exec *x, int32_t il, const hm_dsv4_attn *p);
/* out = silu(min(g, limit)) * clamp(u, -limit, limit) over [rows, width] (u clamped in place). */
hm_status hm_op_swiglu_clamp(hm_exec *x, hm_buf g, hm_buf u, hm_buf out, int64_t width, float limit);

/* ---- the executor: an arch that has a layer description fills its hm_arch with these ---- */

hm_status hm_exec_state_open(const hm_model *m, const hm_state_opts *o, void **state, hm_err *err);
void hm_exec_state_close(void *state);
hm_status hm_exec_state_trim(void *state, int32_t n_keep, hm_err *err);
/* Remember the recurrent state and its position (save; KV rows need nothing: rows past a position
 * are overwritten), and go back to it (restore). */
hm_status hm_exec_state_save(void *state, hm_err *err);
hm_status hm_exec_state_restore(void *state, hm_err *err);
hm_status hm_exec_forward(const hm_model *m, void *state, hm_pool *pool, const hm_fwd_batch *b, hm_err *err);
hm_status hm_exec_forward_multi(const hm_model *m, void *work, hm_pool *pool, const hm_fwd_seq *seqs, int n_seq,
                                float *logits, hm_err *err);
/* Copy positions [p0, p1) of src's KV cache into dst's, the recurrent state and DeepSeek-V4's
 * compressed state whole, and the positions they hold: the prompt-processing hand-over between two
 * sessions of two models with the same shapes (hm_model_check_same) opened with the same options.
 * Either state may be on the CPU or on a GPU chain (any layer split): host copies, downloads and
 * uploads through a host buffer. A sliding layer's ring is copied whole. HM_ERR_ARG when the two
 * layouts differ, HM_ERR_UNSUPPORTED for a device state the executor keeps elsewhere (none today
 * but DeepSeek-V4's, which has no GPU path). */
hm_status hm_exec_state_copy(void *dst, const void *src, int32_t p0, int32_t p1, hm_err *err);
#ifdef HM_HAVE_CUDA
/* gpu_load: the upload pass (each op's weights to its layer's device); gpu_unload frees its map. */
hm_status hm_exec_gpu_load(hm_model *m, hm_err *err);
void hm_exec_gpu_unload(hm_model *m);
#define HM_EXEC_ARCH_GPU .gpu_load = hm_exec_gpu_load, .gpu_unload = hm_exec_gpu_unload, .gpu_multi = true,
#else
#define HM_EXEC_ARCH_GPU
#endif
/* The hm_arch fields of an arch the executor runs, in its table after name/load/unload:
 * `HM_EXEC_ARCH(my_layer)`; an arch that batches several sequences adds .forward_multi. */
#define HM_EXEC_ARCH(layer_fn)                                                                             \
    .state_open = hm_exec_state_open, .state_close = hm_exec_state_close, .state_trim = hm_exec_state_trim, \
    .state_save = hm_exec_state_save, .state_restore = hm_exec_state_restore, .forward = hm_exec_forward,       \
    HM_EXEC_ARCH_GPU.layer = (layer_fn)

#endif
