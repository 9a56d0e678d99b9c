/* model.h - the contract between the engine and an architecture (model/<arch>.c).
 *
 * An hm_model is a GGUF file opened read-only (weights mmapped, borrowed by every hm_mat that
 * points into them) plus an architecture: a table of functions that read the hparams and bind
 * the tensors (load), size and own the per-session state (KV cache or recurrent state +
 * activations for one micro-batch), and run the forward pass of one micro-batch.
 *
 * Invariants:
 *  - load either succeeds with every tensor bound and checked, or fails naming the first key or
 *    tensor that is wrong (expected vs found shape / type); nothing is checked later.
 *  - forward never allocates: everything it needs was sized by state_open for n_ctx, n_ubatch and
 *    the pool's thread count.
 *  - an arch keeps no global state; everything hangs off hm_model.impl and the session state.
 *
 * Adding an architecture: write model/<arch>.c exporting one const hm_arch, list it in
 * model.c's table; its forward is one layer description run by the executor (exec/exec.h,
 * HM_EXEC_ARCH; docs/ARCHITECTURE.md, "Adding an architecture"). */
#ifndef HM_MODEL_H
#define HM_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/cpu/cpu_ops.h"
#include "core/log.h"
#include "core/status.h"
#include "core/threadpool.h"
#include "experts/experts.h"
#include "experts/tier_ram.h"
#include "gguf/gguf.h"
#include "hotmoe.h"

typedef struct hm_arch hm_arch;
struct hm_exec;       /* exec/exec.h: a forward pass in progress */
struct hm_exec_model; /* exec/exec.h: what the executor runs of an arch */

struct hm_model {
    hm_gguf *gguf;        /* owned; every weight pointer borrows from its mapping */
    const hm_arch *arch;
    void *impl;           /* owned by the arch (load / unload) */
    hm_model_info info;   /* filled by the arch's load; strings point into name/arch below */
    char name[256];
    char arch_name[64];
    hm_log log;
    char rope_scaling[8]; /* hm_model_opts' override of the file's RoPE scaling type ("" = none given) */
    float rope_scale;     /* its factor override (0 = the file's) */
    int32_t yarn_orig_ctx; /* its YaRN original context override (0 = the file's) */
    /* The expert store (model_experts.c): one per model, shared by its sessions. The forward
     * pass records into it after each router; the session ends each step. NULL for a model
     * without expert tensors. Single writer: `busy` makes overlapping evals an error. */
    hm_units units;       /* owned; borrows gguf's tensor table */
    hm_experts *experts;  /* owned */
    hm_policy_kind policy;
    /* The SSD tier (experts/tier_ram.h): NULL unless the placement's ram_budget is below the
     * model's expert bytes. Then the forward pass computes its CPU units through it (moe.c,
     * hm_moe_forward) and the session ends its steps after the store's. */
    hm_ram_tier *ram;     /* owned */
    uint64_t mlocked_bytes; /* --mlock without the SSD tier: the experts' span of the mapping,
                               locked in RAM (hm_units_span); 0: not locked */
    bool prefetch;        /* --prefetch: read layer l+1's predicted units during layer l */
    int32_t stats_every;  /* > 0: a stats line every N tokens (hm_placement_opts.stats_every) */
    uint64_t stats_tokens; /* tokens through the store so far, for stats_every */
    /* GPU placement (model_gpu.h): NULL = every op on the CPU. With it the arch keeps its dense
     * weights and each session its KV cache and activations on the device, and the store's hot
     * tier is gpu->vram (hot units computed there, the others by the CPU at the same time). */
    struct hm_gpu *gpu;   /* owned */
    /* What the executor runs (exec/exec.h), for an arch with a layer description: set by its load,
     * borrowed from m->impl; NULL for the others. */
    const struct hm_exec_model *xm;
    /* The model's own multi-token-prediction head (qwen35moe's nextn layer) as a one-layer model of
     * the same file that the executor runs on the CPU (draft-mtp, engine/spec_mtp.c): owned by
     * the arch's impl; NULL when the file has none. Its experts are computed from the mapping and
     * not counted in the store. */
    struct hm_model *mtp;
    _Atomic int busy;     /* 1 while a session of this model is inside eval */
    /* The compute pool shared by the model's sessions (engine/session.c): the first session opened
     * sets its thread count; later sessions with that count share the pool, others own theirs.
     * Evals of one model never overlap (busy), so one pool serves them all and no idle pool of a
     * sibling session spins beside the working one. Closed with the last session using it. */
    hm_pool *pool;
    int32_t pool_threads, pool_refs;
    _Atomic int pool_lock; /* guards the three fields above (session open/close) */
};

/* model_experts.c: build the unit table and open the store with o (NULL = count only). */
hm_status hm_model_experts_open(hm_model *m, const hm_placement_opts *o, hm_err *err);
void hm_model_experts_close(hm_model *m);
/* After a step of n_tok tokens: with stats_every, a line of the store's stats on stderr each time
 * the tokens pass a multiple of it. */
void hm_model_experts_tick(hm_model *m, int32_t n_tok);
/* Test-only: the SSD tier's read fault hook (tier_ssd.h) for tiers opened from now on. */
void hm_model_test_io_fault(hm_ssd_fault_fn fn, void *ctx);

/* What a session asks of an arch's state. */
typedef struct hm_state_opts {
    int32_t n_ctx;    /* positions the state must hold */
    int32_t n_ubatch; /* most tokens per forward call */
    int n_threads;    /* the pool the forward will run on */
    hm_kv_type kv_type;
} hm_state_opts;

/* One micro-batch for forward: n tokens at positions pos[i] (pos[i] < n_ctx, ascending, the
 * state holds every position < pos[0] already). Logits are wanted for rows out_rows[0..n_out)
 * (ascending indexes into the batch) and written to logits: [n_out, n_vocab]. */
typedef struct hm_fwd_batch {
    const int32_t *tokens; /* [n] */
    const int32_t *pos;    /* [n] */
    int32_t n;
    const int32_t *out_rows; /* [n_out] */
    int32_t n_out;
    float *logits; /* [n_out, n_vocab]; may be NULL when n_out == 0 */
    /* Optional (NULL: none). hidden: every row's final hidden state after the output norm
     * ([n, n_embd]; the last layer then runs all n rows, logits still only for out_rows, which
     * must be contiguous): what a multi-token-prediction head reads (draft-mtp). inject: rows of
     * xm->inject_width floats copied into the arch's xm->inject_buf before the first layer (an
     * MTP head's hidden input); only an arch that declares inject_buf takes it. */
    float *hidden;
    const float *inject;
} hm_fwd_batch;

/* Most sequences in one forward_multi call. */
#define HM_FWD_MAX_SEQ 64

/* One sequence of a batched forward (forward_multi): a micro-batch (tokens, positions, wanted rows
 * as in hm_fwd_batch, its logits field unused) on that sequence's own state (its KV cache). */
typedef struct hm_fwd_seq {
    void *state;
    hm_fwd_batch b;
} hm_fwd_seq;

struct hm_arch {
    const char *name; /* general.architecture */
    /* Read hparams, bind and check tensors; fill m->info and m->impl. */
    hm_status (*load)(hm_model *m, hm_err *err);
    void (*unload)(hm_model *m);
    /* Per-session state: owned by the caller through state_close. */
    hm_status (*state_open)(const hm_model *m, const hm_state_opts *o, void **state, hm_err *err);
    void (*state_close)(void *state);
    /* Forget positions >= n_keep. A KV cache needs nothing (rows are overwritten); a recurrent
     * state can only go back to 0 and says HM_ERR_UNSUPPORTED otherwise. */
    hm_status (*state_trim)(void *state, int32_t n_keep, hm_err *err);
    /* Optional (NULL: cannot): remember the state as it is now (save), and go back to the last
     * saved one (restore: positions after the saved ones are forgotten, the KV rows overwritten
     * later): how a speculative verify batch is rolled back over a recurrent state. */
    hm_status (*state_save)(void *state, hm_err *err);
    hm_status (*state_restore)(void *state, hm_err *err);
    /* Run one micro-batch (n <= n_ubatch). */
    hm_status (*forward)(const hm_model *m, void *state, hm_pool *pool, const hm_fwd_batch *b,
                         hm_err *err);
    /* Optional (NULL = the arch batches one sequence only): one forward pass over n_seq
     * sequences' micro-batches concatenated in order. Dense matmuls and the MoE block run once on
     * all rows (each expert unit computes once for every row routed to it); RoPE, the K/V write and
     * attention use each row's own sequence state and positions. `work` is the state whose
     * activations and scratch the pass uses (one of the sequences', or any state of the model
     * opened with the same thread count); sum of b.n <= its n_ubatch, each b.n <= its own state's
     * n_ubatch, states distinct. The wanted rows of all sequences, in sequence order, are written
     * to logits: [sum of b.n_out, n_vocab] (NULL when that sum is 0). */
    hm_status (*forward_multi)(const hm_model *m, void *work, hm_pool *pool, const hm_fwd_seq *seqs,
                               int n_seq, float *logits, hm_err *err);
    /* Optional (NULL = no GPU path: asking for the GPU is HM_ERR_UNSUPPORTED naming the arch):
     * upload the dense weights to m->gpu (hm_gpu_upload_*), keeping the arch's device view in
     * m->gpu->arch; gpu_unload frees that view (the buffers belong to m->gpu). With m->gpu set,
     * state_open also allocates the session's device state and forward runs on the device. */
    hm_status (*gpu_load)(hm_model *m, hm_err *err);
    void (*gpu_unload)(hm_model *m);
    /* The GPU path runs a layer split over several devices (model_gpu.h): gpu_load uploads each
     * layer's weights to hm_gpu_layer_dev's device and the forward hands the residual across. An
     * arch without it takes one device only (several are HM_ERR_UNSUPPORTED naming the arch). */
    bool gpu_multi;
    /* The arch's ONE layer description (exec/exec.h): layer il as ops on x. An arch that has one
     * sets m->xm at load and points state_open .. gpu_unload at the executor's hm_exec_*. */
    hm_status (*layer)(struct hm_exec *x, const hm_model *m, int32_t il);
};

extern const hm_arch hm_arch_qwen3moe;
extern const hm_arch hm_arch_qwen35moe; /* qwen35moe.c */

/* ---- helpers for archs' load functions (model.c) ---- */

/* Integer / float hparam "<arch>.<suffix>" (e.g. "block_count"). Absent and required ->
 * HM_ERR_FORMAT naming the key; absent and optional -> *out = dflt, HM_OK. The value (or the
 * default) must lie in the key's range (model.c's tables: e.g. block_count [1, 65536]; keys not
 * listed [0, 2^31)); floats must be finite (and e.g. the RMS epsilon in (0, 1), RoPE bases >= 1);
 * else HM_ERR_FORMAT "key <arch>.<suffix> = v is out of range ...". */
hm_status hm_model_hp_int(const hm_model *m, const char *suffix, bool required, int64_t dflt,
                          int32_t *out, hm_err *err);
hm_status hm_model_hp_float(const hm_model *m, const char *suffix, bool required, double dflt,
                            float *out, hm_err *err);
/* The integer range check of hm_model_hp_int for a value read some other way (an element of a
 * per-layer array): index (e.g. "[3]", or NULL) is appended to the key in the message. */
hm_status hm_model_hp_check(const hm_model *m, const char *suffix, const char *index, int64_t v, hm_err *err);
/* The head dim: "attention.key_length<sfx>" (absent: required -> HM_ERR_FORMAT, else dflt) and
 * "attention.value_length<sfx>" (default the key length), which must equal it (else
 * HM_ERR_UNSUPPORTED naming both). sfx: "" or e.g. "_swa". */
hm_status hm_model_hp_head_dim(const hm_model *m, const char *sfx, bool required, int64_t dflt, int32_t *out,
                               hm_err *err);

/* RoPE scaling from "<arch>.rope.scaling.*" (type none / absent: *ff NULL, *attn_mul 1; linear:
 * factor; yarn: factor, original_context_length, and attn_factor, yarn_beta_fast (32),
 * yarn_beta_slow (1), yarn_ext_factor (1) when present) as per-pair frequency divisors *ff
 * [n_rot / 2] (owned by the caller, free; angle_i = pos theta^(-2i/n_rot) / ff[i], the rope ops'
 * rope_ff) and *attn_mul, the factor YaRN's magnitude scaling puts on the attention logits (q and
 * k each scaled by attn_factor (1 + 0.1 ln factor)). Another type: HM_ERR_UNSUPPORTED naming it. */
hm_status hm_model_rope_scaling(const hm_model *m, int32_t n_rot, float theta, float **ff, float *attn_mul, hm_err *err);
/* For an arch that does not apply RoPE scaling: HM_ERR_UNSUPPORTED when the file's rope.scaling
 * keys or --rope-scaling / --rope-scale ask for any (a type other than none with a factor other than
 * 1), rather than running without it. */
hm_status hm_model_rope_scaling_none(const hm_model *m, hm_err *err);

/* The hparams a transformer with a MoE block in every layer reads alike (qwen3moe, qwen35moe).
 * An arch's model struct holds them as HM_MOE_HP: the fields by their own names (q->n_embd) and,
 * the same storage, as a whole (q->hp) for the helpers below. n_ff_exp and n_vocab are the arch's
 * to fill (their sources differ); the helpers read and write the others. */
#define HM_MOE_HP_FIELDS                                                                                   \
    int32_t n_layer, n_embd, n_head, n_head_kv, head_dim, n_rot;                                       \
    int32_t n_expert, n_expert_used, n_ff_exp, n_vocab, n_ctx_train;                                  \
    float eps, theta
typedef struct hm_moe_hp {
    HM_MOE_HP_FIELDS;
} hm_moe_hp;
#define HM_MOE_HP                                                                                          \
    union {                                                                                                \
        hm_moe_hp hp;                                                                                      \
        struct {                                                                                           \
            HM_MOE_HP_FIELDS;                                                                              \
        };                                                                                                 \
    }

/* Read into hp: context_length, embedding_length, block_count, attention.head_count (all > 0),
 * attention.head_count_kv (default head_count; > 0, divides head_count), the head dim
 * (hm_model_hp_head_dim, default n_embd / n_head; even, > 0), rope.dimension_count (default the
 * head dim; even, <= head dim; 0: no rotary), expert_count and expert_used_count (> 0, used <= count),
 * rope.freq_base (default 10000) and attention.layer_norm_rms_epsilon (default 1e-6). A value out
 * of range is HM_ERR_FORMAT "bad hparams: ..." naming the keys. */
hm_status hm_model_hp_moe(const hm_model *m, hm_moe_hp *hp, hm_err *err);
/* m->info's shape (n_vocab, n_ctx_train, n_embd, n_layer, heads, head_dim, experts, n_ff_exp)
 * from hp, once the arch has filled all of it. */
void hm_model_info_moe(hm_model *m, const hm_moe_hp *hp);

/* What a bound tensor must be. */
typedef enum hm_bind_kind {
    HM_BIND_F32 = 0,   /* norms and similar vectors: type must be F32 */
    HM_BIND_MATMUL,    /* any type the CPU backend computes with; ne0 a multiple of its block */
    HM_BIND_ROWS,      /* an embedding table: any type with a to_float (dequantised by rows) */
} hm_bind_kind;

/* Find tensor `name`, check it has n_dims dims of exactly ne[0..n_dims) and a type fitting kind.
 * Absent: required -> HM_ERR_FORMAT "missing tensor 'name' (expected [a, b])", else *out = NULL.
 * Shape wrong -> HM_ERR_FORMAT "tensor 'name': expected shape [..], found [..]"; type wrong ->
 * HM_ERR_UNSUPPORTED naming the type. */
hm_status hm_model_bind(const hm_model *m, const char *name, hm_bind_kind kind, uint32_t n_dims,
                        const int64_t *ne, bool required, const hm_gguf_tensor **out, hm_err *err);

/* The matrix view of a bound 2-D (or one slab of a 3-D) tensor: rows are ne[1]. */
hm_mat hm_model_mat(const hm_gguf_tensor *t);

/* hm_model_bind shorthands every arch uses. Absent and not required: HM_OK with *out untouched
 * (bind_vec: *out = NULL). bind_vec: an F32 vector of n. bind_mat: a matmul matrix [ne0, ne1].
 * bind_exps: a 3-D expert tensor [ne0, ne1, n_expert]: expert 0's matrix and the slab stride
 * *nb2 (expert e starts e * nb2 bytes further). */
hm_status hm_model_bind_vec(const hm_model *m, const char *name, int64_t n, bool required, const float **out,
                            hm_err *err);
hm_status hm_model_bind_mat(const hm_model *m, const char *name, int64_t ne0, int64_t ne1, bool required,
                            hm_mat *out, hm_err *err);
hm_status hm_model_bind_exps(const hm_model *m, const char *name, int64_t ne0, int64_t ne1, int64_t n_expert,
                             bool required, hm_mat *out, size_t *nb2, hm_err *err);

/* The vocabulary tensors: token_embd.weight [n_embd, n_vocab] (any row type; n_vocab from its
 * shape, 1..INT32_MAX) and output.weight of the same shape; without output.weight the embeddings
 * are tied (*output = *tok_embd, which must then be a matmul type too). */
hm_status hm_model_bind_vocab(const hm_model *m, int64_t n_embd, hm_mat *tok_embd, hm_mat *output,
                              int32_t *n_vocab, hm_err *err);

/* ---- helper for archs' state_open ---- */

/* Carve one aligned allocation (*block, owned by the caller, free with hm_free_aligned) into n
 * arrays of n_elems[i] 4-byte elements, each HM_ALIGN-aligned: *dst[i] points at array i (float or
 * int32 arrays alike). HM_ERR_NOMEM naming the size on failure. */
hm_status hm_model_carve(void **block, const size_t *n_elems, float **const *dst, size_t n, hm_err *err);

/* The larger of two sizes (state_open sizes its scratch by the largest need). */
static inline size_t hm_model_max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* The quant type (quant/quant.h's hm_type) of a KV cache type's rows. */
static inline int hm_kv_row_type(hm_kv_type t) {
    static const int map[HM_KV_TYPE_COUNT] = {HM_TYPE_F16, HM_TYPE_F32, HM_TYPE_Q8_0, HM_TYPE_Q4_0, HM_TYPE_BF16};
    return map[t];
}

/* *kv = an aligned, zeroed block of bytes bytes (the KV cache of kv_type for n_ctx positions, owned
 * by the caller, hm_free_aligned). Refused (HM_ERR_NOMEM, naming both sizes and the largest context
 * that fits) when it exceeds the RAM available now (MemAvailable): the pages are touched here, so a
 * cache that cannot be backed fails at load, not when a long prompt reaches it. HM_ERR_NOMEM
 * naming n_ctx and the size on allocation failure. */
hm_status hm_model_kv_alloc(void **kv, size_t bytes, hm_kv_type kv_type, int32_t n_ctx, hm_err *err);
/* *out = an aligned block of n floats of attention scratch; HM_ERR_NOMEM on failure. */
hm_status hm_model_att_scratch_alloc(float **out, size_t n, hm_err *err);
/* s->data = size bytes (nothing when 0), s->size = size; HM_ERR_NOMEM naming the size. */
hm_status hm_model_scratch_alloc(hm_scratch *s, size_t size, hm_err *err);
/* Free a CPU state's host buffers (each may be NULL / empty): its KV cache, attention scratch,
 * activation block, compute scratch and MoE route. The state struct itself stays the caller's. */
struct hm_moe_route;
void hm_model_state_free(void *kv, void *att_scratch, void *act, hm_scratch *scratch, struct hm_moe_route *route);

/* ---- helpers for archs' CPU forward ---- */

/* Layer `slot`'s K cache in a KV block of [slots][2][layer_elems] elements of es bytes; its V
 * cache follows at layer_elems elements (*vc). */
static inline char *hm_model_kv_layer(void *kv, size_t layer_elems, size_t es, int32_t slot, char **vc) {
    char *kc = (char *)kv + (size_t)slot * 2 * layer_elems * es;
    *vc = kc + layer_elems * es;
    return kc;
}

/* k, v: [n, n_kv * hd] into the cache rows pos[t] of a cache of kv_type (f16: the CPU backend's
 * plain cache, cpu_attn.c; every other type: the general cache, cpu_attn_ring.c). */
void hm_model_kv_write(hm_pool *pool, hm_kv_type kv_type, char *kc, char *vc, int64_t n_ctx, int n_kv, int hd,
                       const float *k, const float *v, int64_t n, const int32_t *pos);
/* Causal GQA attention of q [n, n_head * hd] over a cache of kv_type into out; f16 uses scratch,
 * every other type att_scratch (the larger of hm_cpu_attention_ring_scratch_floats and
 * hm_cpu_attn_tiled_scratch_floats). */
void hm_model_attention(hm_pool *pool, hm_kv_type kv_type, const float *q, int64_t n, const int32_t *pos,
                        const char *kc, const char *vc, int64_t n_ctx, int n_head, int n_kv, int hd, float scale,
                        float *out, float *att_scratch, hm_scratch *scratch);

/* The last layer's compaction: keep rows rows[0..n_out) of a [n, w] array, moved to the front in
 * order. rows ascend, so moving forward never overwrites a row still to be read. */
void hm_model_compact_rows(float *a, int64_t w, const int32_t *rows, int32_t n_out);

/* logits [n_out, n_vocab] = (rmsnorm(x) * norm) Wout for the first n_out rows of x [.., n_embd];
 * hout [n_out, n_embd] is work space. */
void hm_model_logits(hm_pool *pool, const float *x, const float *norm, float eps, const hm_mat *wout, int64_t n_out,
                     int64_t n_embd, float *hout, float *logits, hm_scratch *scratch);

#endif
