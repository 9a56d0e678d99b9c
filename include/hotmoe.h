/* hotmoe.h - the engine's public C API: models, sessions, sampling, the expert store (usage,
 * placement, profiles, traces) and the tokenizer. hotmoe_tools.h adds the tools built on it
 * (inspect, synth, the server, plan).
 *
 * These two headers are the only ones the CLI, the server and outside programs include.
 * Everything not declared in them is internal. Conventions: functions return hm_status (HM_OK = 0, errors < 0) and
 * fill the caller's hm_err with a message naming what went wrong; handles are opaque; *_close(NULL)
 * is a no-op. */
#ifndef HOTMOE_H
#define HOTMOE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HOTMOE_VERSION "0.1.0"

typedef enum hm_status {
    HM_OK = 0,
    HM_ERR_IO = -1,          /* open/read/write/mmap failed */
    HM_ERR_FORMAT = -2,      /* malformed or truncated input file */
    HM_ERR_NOMEM = -3,       /* allocation failed */
    HM_ERR_ARG = -4,         /* bad argument or option from the user */
    HM_ERR_UNSUPPORTED = -5, /* valid input we do not handle (arch, type, ...) */
    HM_ERR_CUDA = -6,        /* CUDA runtime/driver failure */
    HM_ERR_INTERNAL = -7,    /* a bug; message says where */
} hm_status;

/* Error message buffer filled by failing calls. */
typedef struct hm_err {
    char msg[512];
} hm_err;

/* Short constant name of a status ("HM_ERR_FORMAT"). */
const char *hm_status_name(hm_status s);

/* Parse a byte size: "12GiB", "512MiB", "1.5G", "4096" (bytes), "-1"/"auto" -> -1.
 * Returns HM_ERR_ARG on junk. */
hm_status hm_parse_size(const char *s, int64_t *out, hm_err *err);

/* ==== Models, sessions, sampling (engine/, model/) ======================================== */

typedef struct hm_model hm_model;     /* an opened model file: weights mmapped, read-only */
typedef struct hm_session hm_session; /* one conversation: KV cache, scratch, thread pool */

typedef struct hm_placement_opts hm_placement_opts; /* see "Expert store of a model" below */

typedef struct hm_model_opts {
    bool verbose; /* log hparams and loading to stderr */
    /* RoPE scaling over the file's <arch>.rope.scaling.* keys (llama.cpp's flags): rope_scaling
     * NULL = the file's type, else "none", "linear" or "yarn" (--rope-scaling); rope_scale > 0 =
     * the factor (--rope-scale); yarn_orig_ctx > 0 = YaRN's original context (--yarn-orig-ctx). */
    const char *rope_scaling;
    float rope_scale;
    int32_t yarn_orig_ctx;
    const hm_placement_opts *placement; /* borrowed during open; NULL = count expert use only */
    /* Another open model whose dense tensors this file may share (the prompt-processing copy's
     * main model): every non-expert tensor with the same name, type, shape and bytes in both is
     * bound to share_dense's mapping, so its pages are in memory once (the file's own copy was read
     * once to compare, then dropped). Borrowed: it must outlive this model. NULL = none. */
    const hm_model *share_dense;
} hm_model_opts;

/* Fills o with the defaults. */
void hm_model_opts_default(hm_model_opts *o);

/* Open the GGUF model at path: reads hparams, checks the architecture is one we run and binds
 * every tensor by name, checking shape and type (an error names the tensor, the expected and
 * the found shape). Weights stay in the file mapping and are used in place. *out is owned by
 * the caller (hm_model_close). opts NULL = defaults. */
hm_status hm_model_open(hm_model **out, const char *path, const hm_model_opts *opts, hm_err *err);
void hm_model_close(hm_model *m); /* NULL is a no-op; close sessions first */

typedef struct hm_model_info {
    const char *arch;     /* "qwen3moe"; borrowed from the model */
    const char *name;     /* general.name or "" */
    int32_t n_vocab;
    int32_t n_ctx_train;
    int32_t n_embd;
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;
    int32_t n_expert;
    int32_t n_expert_used;
    int32_t n_ff_exp;
    int32_t bos_id;       /* -1 when the file names none */
    int32_t eos_id;       /* -1 when the file names none */
    bool add_bos;         /* tokenizer.ggml.add_bos_token (false when absent) */
    uint64_t n_params;    /* elements of all tensors */
    uint64_t file_bytes;
    uint64_t shared_bytes; /* tensor bytes bound to hm_model_opts.share_dense's mapping */
    int32_t shared_tensors;
} hm_model_info;

/* Borrowed; valid until hm_model_close. */
const hm_model_info *hm_model_get_info(const hm_model *m);
int32_t hm_model_n_vocab(const hm_model *m);
int32_t hm_model_n_ctx_train(const hm_model *m);
const char *hm_model_arch(const hm_model *m);

/* KV cache element type: f16 is the default and the fast path; f32 is exact (for comparing
 * against float references) and slower; bf16, and ggml's q8_0 / q4_0 blocks (32 values and an f16
 * scale: 34 / 18 bytes), stored per row of head_dim values as llama.cpp's cache stores them
 * (-ctk/-ctv): head_dim must be a multiple of 32 for the block types. Attention reads the
 * dequantised values in f32. One type for K and V. */
typedef enum hm_kv_type { HM_KV_F16 = 0, HM_KV_F32 = 1, HM_KV_Q8_0 = 2, HM_KV_Q4_0 = 3, HM_KV_BF16 = 4 } hm_kv_type;
#define HM_KV_TYPE_COUNT 5

/* "f16", "f32", "q8_0", "q4_0", "bf16" (llama.cpp's -ctk names); "?" for other values. */
const char *hm_kv_type_name(hm_kv_type t);
/* The type named name (those above); HM_ERR_ARG naming the accepted ones otherwise. */
hm_status hm_kv_type_parse(const char *name, hm_kv_type *out, hm_err *err);

/* Bytes of the KV cache a session of n_ctx positions and micro-batches of n_ubatch (0 = 512) holds:
 * the layers with a cache, each K and V, sliding-window layers as their ring of min(n_ctx,
 * window + n_ubatch) rows of head_dim values in kv_type's bytes (f16 2 a value, f32 4, bf16 2, q8_0 34
 * per 32, q4_0 18 per 32). The same layout sessions allocate (on the GPU too). HM_ERR_ARG for n_ctx
 * < 1, HM_ERR_UNSUPPORTED for a block type whose block does not divide a layer's head_dim. */
hm_status hm_model_kv_bytes(const hm_model *m, int32_t n_ctx, int32_t n_ubatch, hm_kv_type kv_type, uint64_t *bytes,
                            hm_err *err);

typedef struct hm_session_opts {
    int32_t n_ctx;     /* KV cache positions; 0 = min(n_ctx_train, 4096) */
    int32_t n_threads; /* compute threads incl. the caller; 0 = online CPUs */
    int32_t n_ubatch;  /* tokens per forward micro-batch; 0 = 512 */
    hm_kv_type kv_type;
} hm_session_opts;

void hm_session_opts_default(hm_session_opts *o);

/* Open a session on m (borrowed: m must outlive it). Everything the forward pass needs (KV cache
 * for n_ctx positions, activations for one ubatch, the thread pool) is allocated here, so eval
 * in decode never allocates. *out owned by the caller (hm_session_close).
 * Sessions of one model share its expert store (usage counts, placement): their evals must not
 * overlap in time. One thread drives a model (the server's engine thread steps every slot in
 * turn); an eval that starts while another session of the same model is inside one fails with
 * HM_ERR_ARG instead of racing. */
/* [batch eval] Sessions of one model share one thread pool when their thread count is the one of
 * the first session open (their evals never overlap, so no sibling's idle pool spins beside the
 * working one); a session with another count has a pool of its own. */
hm_status hm_session_open(hm_session **out, hm_model *m, const hm_session_opts *opts, hm_err *err);
void hm_session_close(hm_session *s); /* NULL is a no-op */

/* Append n tokens at positions n_past .. n_past+n-1 and run the forward pass (in ubatch pieces).
 * Every ubatch's routing is counted in the model's expert store (a prompt step when n > 1, a
 * decode step when n == 1).
 * *logits (borrowed, valid until the next eval/reset/close) receives [n][n_vocab] floats when
 * logits_all, else [n_vocab] for the last token. logits may be NULL (prefill only).
 * HM_ERR_ARG when n_past + n > n_ctx (nothing is evaluated) or a token id is out of range.
 * logits_all with a batch larger than any before grows the logits buffer (one allocation). */
hm_status hm_session_eval(hm_session *s, const int32_t *tokens, int32_t n, bool logits_all,
                          const float **logits, hm_err *err);
/* [batch eval] Evaluate several sessions of one model in ONE forward pass per micro-batch:
 * session i appends n_tokens[i] tokens (tokens[i]) at its own positions n_past_i ..; the dense
 * matmuls and the MoE block run on all sessions' rows together (an expert unit computes once per
 * pass for every row routed to it), attention runs per session over its own KV cache. logits[i]
 * (borrowed, like hm_session_eval's last-token logits, valid until session i's next eval) receives
 * session i's last-token logits; logits may be NULL. The rows go in session order, at most session
 * 0's n_ubatch per pass (a session's longer run continues in the next pass), on session 0's thread
 * pool: every session must have the same thread count. Each pass is one step of the expert store.
 * Results equal evaluating each session alone within float rounding (docs/ENGINE.md).
 * n_seq == 1 is hm_session_eval. HM_ERR_ARG (nothing evaluated): n_seq outside 1..HM_BATCH_MAX_SEQ,
 * a session twice, sessions of different models or thread counts, a sequence that does not fit its
 * context or has a token out of range. HM_ERR_UNSUPPORTED (nothing evaluated): the architecture
 * batches one session only (gemma4 and qwen35moe today); evaluate the sessions one at a time. */
#define HM_BATCH_MAX_SEQ 64
hm_status hm_batch_eval(hm_session *const *sessions, const int32_t *const *tokens, const int32_t *n_tokens,
                        int n_seq, const float **logits, hm_err *err);
int32_t hm_session_n_past(const hm_session *s);
int32_t hm_session_n_ctx(const hm_session *s);
int32_t hm_session_n_threads(const hm_session *s);
int32_t hm_session_n_ubatch(const hm_session *s); /* rows per forward micro-batch */
/* Forget every position (n_past = 0). */
void hm_session_reset(hm_session *s);
/* Keep the first n_keep positions, drop the rest (n_keep <= n_past). */
hm_status hm_session_trim(hm_session *s, int32_t n_keep, hm_err *err);

/* Sampling: repetition penalty over the last repeat_last_n accepted tokens, then greedy argmax
 * when temp <= 0, else top-k -> top-p -> min-p (on the softmax at temperature 1) -> temperature ->
 * a draw from a seeded generator. Same seed, same logits, same history => same tokens. */
typedef struct hm_sampler hm_sampler;

typedef struct hm_sampler_opts {
    float temp;           /* <= 0: greedy */
    int32_t top_k;        /* <= 0: off */
    float top_p;          /* >= 1: off */
    float min_p;          /* <= 0: off */
    float repeat_penalty; /* 1: off */
    int32_t repeat_last_n;/* history window for the penalty (0: off) */
    uint64_t seed;
} hm_sampler_opts;

/* temp 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat_penalty 1.0, repeat_last_n 64, seed 0. */
void hm_sampler_opts_default(hm_sampler_opts *o);
hm_status hm_sampler_open(hm_sampler **out, int32_t n_vocab, const hm_sampler_opts *opts,
                          hm_err *err);
void hm_sampler_close(hm_sampler *s); /* NULL is a no-op */
/* Pick a token from logits [n_vocab] (not modified). Does not allocate. */
int32_t hm_sampler_sample(hm_sampler *s, const float *logits);
/* Record a token in the penalty history (prompt tokens too, if they should be penalised). */
void hm_sampler_accept(hm_sampler *s, int32_t token);
/* Clear the history and re-seed with opts.seed. */
void hm_sampler_reset(hm_sampler *s);

/* ==== end of models, sessions, sampling ================================================== */

/* ==== Speculative decoding (engine/speculative.c, spec_ngram.c, spec_draft.c, spec_mtp.c) === */

/* A drafter proposes the next k tokens cheaply; the target session verifies [the pending token,
 * the k drafts] in ONE micro-batch with the logits of every row, the caller's sampler picks each
 * row's token in turn, and the drafts are accepted while they equal what it picked; the first
 * token it picks that differs (or the one after the last draft) is the step's own. The rejected
 * rows are dropped from the KV cache (hm_session_trim). Each token is picked from the target's
 * logits after the same history, with the same sampler calls, as plain decoding, so the output is
 * plain decoding's up to the float rounding of a batched row against a single-row step (greedy: the
 * same ids unless two logits tie within that rounding). Names and defaults are llama.cpp's
 * (--spec-type, --spec-draft-n-max/-n-min/-p-min, --spec-ngram-simple-size-n/-m, -md).
 * A recurrent target (qwen35moe's Gated DeltaNet) is saved before a verify batch and, when a draft is
 * rejected, restored and the kept rows evaluated again (hm_session_save / restore). The model
 * drafters' length (draft-simple, draft-mtp) adapts to the measured acceptance within
 * [max(n_min, 1), n_max]: one more after a step that kept every draft, one past the kept ones after
 * a rejection; the n-gram drafters' length is their match's (size_m, 8). */
typedef enum hm_spec_type {
    HM_SPEC_NONE = 0,
    HM_SPEC_NGRAM_SIMPLE = 1, /* "ngram-simple": the last size_n tokens (the pending one last) matched
                                 against their latest earlier occurrence in the history; up to size_m
                                 tokens that followed it are the draft (none when fewer than size_n) */
    HM_SPEC_DRAFT_SIMPLE = 2, /* "draft-simple": a second model with the same vocabulary drafts greedily */
    HM_SPEC_NGRAM_CACHE = 3,  /* "ngram-cache": the most frequent follower of the longest 1..4-gram ending
                                 the sequence, from counts over the history (llama.cpp's context cache
                                 and thresholds; its static/dynamic cache files are not read); up to 8 */
    HM_SPEC_DRAFT_MTP = 4,    /* "draft-mtp": the target model's own multi-token-prediction layer
                                 (qwen35moe / qwen3next files with nextn_predict_layers 1) drafts greedily */
} hm_spec_type;

/* "none" / "ngram-simple" / "draft-simple" / "ngram-cache" / "draft-mtp" -> the type; -1 for any
 * other name (llama.cpp's draft-eagle3, draft-dflash, ngram-mod, ... are not run yet: the caller
 * refuses them). */
int hm_spec_type_from_name(const char *name);
const char *hm_spec_type_name(hm_spec_type t); /* static string; "?" out of range */

typedef struct hm_spec_opts {
    hm_spec_type type;
    int32_t n_max;     /* draft-simple, draft-mtp: most tokens drafted per step (llama.cpp
                          --spec-draft-n-max, 3); the length adapts below it (above) */
    int32_t n_min;     /* draft-simple, draft-mtp: fewer drafted than this = no draft this step (0) */
    float p_min;       /* draft-simple, draft-mtp: stop drafting when the draft's top token has a probability
                          (softmax over its 10 best, as llama.cpp's draft sampler) below this (0) */
    int32_t size_n;    /* ngram-simple: lookup n-gram length (12) */
    int32_t size_m;    /* ngram-simple: longest draft (48) */
    hm_model *draft;   /* draft-simple: the draft model (borrowed; its own hm_model, not the target's) */
    /* Token ids at which a step stops early (end of generation): the step's output ends with the
     * first one the sampler picks, and that one is left pending like any step's last token. NULL /
     * 0 = none. Copied at open. */
    const int32_t *stop_ids;
    int32_t n_stop_ids;
} hm_spec_opts;

void hm_spec_opts_default(hm_spec_opts *o); /* llama.cpp's defaults, type none */

typedef struct hm_spec hm_spec;

/* Speculation on target (a session, borrowed: it and its model must outlive sp). For
 * draft-simple a session of o->draft is opened with the target's context, threads and KV type.
 * draft-mtp opens a session of the target model's MTP head and must be opened before the target
 * evaluates anything (the head reads every row's hidden state; HM_ERR_ARG otherwise).
 * Errors (nothing opened): HM_ERR_UNSUPPORTED for a recurrent draft model, a target whose state
 * cannot be saved, or draft-mtp on a model without an MTP layer (the message names the arch and
 * what the file lacks); HM_ERR_ARG for bad sizes, a missing draft
 * model, or a draft vocabulary that llama.cpp would refuse (tokenizer type, BOS/EOS ids and
 * add-flags, vocabulary sizes more than 128 apart, a token text differing from id 5 on; the message
 * names the first difference). The history starts empty: hm_spec_add what the target evaluates
 * outside hm_spec_step (the prompt). */
hm_status hm_spec_open(hm_spec **out, hm_session *target, const hm_spec_opts *o, hm_err *err);
void hm_spec_close(hm_spec *sp); /* NULL is a no-op */
/* Tokens the caller evaluated on the target itself (a prompt, a chat turn): appended to the
 * history the drafters read. The history must always equal what the target holds. */
hm_status hm_spec_add(hm_spec *sp, const int32_t *tokens, int32_t n, hm_err *err);
/* The caller reset or trimmed the target: keep the first n_keep tokens of the history. */
void hm_spec_trim(hm_spec *sp, int32_t n_keep);

/* One step. tok: the token picked last and not yet evaluated (the target holds the history before
 * it). Drafts up to min(drafter's length, max_out - 1, the session's n_ubatch - 1, free context - 1)
 * tokens, evaluates [tok, drafts] as one micro-batch, and picks with smp (hm_sampler_sample +
 * hm_sampler_accept per row, exactly as plain decoding would) until a pick differs from the draft,
 * is a stop id, or the drafts end. out[0..*n_out) (1 <= *n_out <= max_out; out holds max_out) are
 * the picks; afterwards the target holds tok and out[0..*n_out-1), and out[*n_out-1] is the new
 * pending token. With no draft this is one plain decode step. HM_ERR_ARG: max_out < 1, no room in
 * the context for tok, or a history that does not match the target's length. */
hm_status hm_spec_step(hm_spec *sp, hm_sampler *smp, int32_t tok, int32_t max_out, int32_t *out, int32_t *n_out,
                       hm_err *err);

/* Change the model drafters' n_max / n_min / p_min (a server request's speculative.n_max, .n_min,
 * .p_min) from the next step on; the adaptive length restarts at n_max. HM_ERR_ARG as hm_spec_open
 * for values out of range. */
hm_status hm_spec_set_draft(hm_spec *sp, int32_t n_max, int32_t n_min, float p_min, hm_err *err);
/* The options it runs with (after hm_spec_set_draft). */
void hm_spec_get_opts(const hm_spec *sp, hm_spec_opts *o);

/* Counters since open. steps: verify micro-batches (with or without a draft); drafted: draft tokens
 * verified; accepted: of them, kept (= tokens - steps: each step adds its own token); tokens: picks
 * returned. Acceptance rate = accepted / drafted. */
typedef struct hm_spec_stats {
    uint64_t steps, steps_drafted, drafted, accepted, tokens;
    double t_draft_s, t_verify_s; /* time drafting and verifying (the target's evals) */
} hm_spec_stats;
void hm_spec_get_stats(const hm_spec *sp, hm_spec_stats *st);

/* ==== end of speculative decoding ======================================================== */

/* ==== The prompt-processing model (engine/ppmodel.c; docs/ENGINE.md) ====================== */

/* A long prompt prefilled by a cheaper copy of the model (the same model at another quantisation)
 * writing the session's own state - KV cache, qwen35moe's recurrent state, DeepSeek-V4's compressed
 * state - in the main model's format, then the main model decodes from it with nothing recomputed.
 * The prefill's routing (counts per unit, step by step) is fed to the main model's expert store as
 * if the main model had routed it, so its policy warms the VRAM tier while the copy still runs, and
 * the units the prompt used are read ahead in RAM (madvise) on the mmap path, or its most routed
 * units read into the SSD tier's RAM (--ram-budget) when the copy's run ends. */
typedef struct hm_pp_opts {
    hm_model *model;     /* the prompt-processing copy (borrowed; its own hm_model, not the session's);
                            NULL detaches */
    int32_t min_tokens;  /* hm_session_prefill: prompts of at least this many tokens go through it (8192) */
    int32_t refresh;     /* hm_session_prefill: the last N prompt tokens are evaluated by the main model
                            instead (0): the cache's tail and the first token's logits are its own */
    bool no_warm;        /* do not feed the prefill's routing to the main model's store */
    bool copy_state;     /* hand over by copying (below) even where the state could be shared (tests) */
} hm_pp_opts;

void hm_pp_opts_default(hm_pp_opts *o); /* model NULL, min_tokens 8192, refresh 0, warm */

/* pp is the same model as m at another quantisation: the same architecture, every "<arch>.*" hparam
 * key and every "tokenizer.*" key equal (vocabulary, merges, special ids, template), the same tensor
 * names and shapes (types may differ), and the same bytes in every 1-D tensor stored at the same type
 * in both (norms and biases stay f32 at every quantisation: another model of the same shapes differs
 * there). HM_ERR_ARG naming the first difference otherwise. */
hm_status hm_model_check_same(const hm_model *m, const hm_model *pp, hm_err *err);

/* Attach o->model to s (checked with hm_model_check_same). o NULL or o->model NULL detaches. Both
 * models on the CPU: the copy's passes run on s's own state (nothing copied). Either on a GPU: the
 * copy evaluates in a session of its own (its placement: KV cache and activations there too) and
 * the positions it wrote are copied into s's state after each hm_session_eval_pp (device to host to
 * device; s's earlier positions are copied into it first when s changed since). */
hm_status hm_session_set_pp(hm_session *s, const hm_pp_opts *o, hm_err *err);
/* hm_session_eval's contract (last-token logits only), evaluated by the attached copy into s's state:
 * s holds the n positions afterwards exactly as if its own model had written them (in the copy's
 * numbers). HM_ERR_ARG without an attached copy. */
hm_status hm_session_eval_pp(hm_session *s, const int32_t *tokens, int32_t n, const float **logits, hm_err *err);
/* A prompt: with a copy attached and n >= min_tokens, tokens[0 .. n - refresh) through the copy
 * (hm_session_eval_pp) and the rest through the main model; else hm_session_eval (last logits). */
hm_status hm_session_prefill(hm_session *s, const int32_t *tokens, int32_t n, const float **logits, hm_err *err);

typedef struct hm_pp_stats {
    uint64_t prefills_pp;     /* hm_session_prefill calls the copy took */
    uint64_t prefills_main;   /* ... the main model took alone (shorter than min_tokens) */
    uint64_t tokens_pp;       /* tokens the copy evaluated (hm_session_eval_pp) */
    uint64_t tokens_refresh;  /* prompt tokens the main model evaluated after the copy (refresh) */
    uint64_t routes_warm;     /* routed (token, unit) selections fed to the main model's store */
    uint64_t units_advised;   /* units read ahead in the main model's mapping (madvise WILLNEED) */
    uint64_t units_prefetched; /* units read into the main model's SSD tier's RAM after the copy's run */
    uint64_t replans;         /* the main model's VRAM residency re-planned from the counts (half-way
                                 through a long run of the copy, and at its end) */
    double t_pp_s, t_refresh_s; /* time in the copy's evals and in the refresh evals */
    bool last_pp;             /* the last hm_session_prefill went through the copy */
} hm_pp_stats;
void hm_session_pp_stats(const hm_session *s, hm_pp_stats *out);

/* ==== end of the prompt-processing model ================================================= */



/* ==== Expert store of a model: usage, placement, profiles, traces (engine/ + experts/) ===== */

/* Every MoE model opened by hm_model_open has one expert store: a table of its expert units
 * (layer, expert), the home tier of each (VRAM, RAM, SSD), usage counters, and a placement
 * policy. The forward pass records each layer's routed experts into it and the session marks the
 * end of each step, so counting costs O(k) per token per layer and takes no lock. All calls below
 * read or change the store between evals: call them from the thread that drives the model's
 * sessions (or while none is evaluating); the server runs them on its engine thread. */

#define HM_MAX_GPUS 16 /* CUDA devices a placement can name (llama.cpp's GGML_CUDA_MAX_DEVICES) */

/* One device's expert slot budget (--vram-budget DEV:SIZE). */
typedef struct hm_gpu_budget {
    int32_t device; /* CUDA ordinal, 0..HM_MAX_GPUS-1 */
    int64_t bytes;  /* VRAM for expert slots on it; -1 = auto (its free VRAM minus vram_reserve) */
} hm_gpu_budget;

struct hm_placement_opts {
    const char *profile;  /* usage profile to place from (--profile; hotmoe.profile.v1, the seed-1
                             fork's v1 or SGLang's logical_count JSON, docs/PROFILE.md); NULL = none */
    const char *policy;   /* "static", "online", "lru" or "none"; NULL = "static" with a profile,
                             else "none" */
    float update_rate;    /* online: at most rate x slots swaps per window; < 0 = default (0.005) */
    /* The GPU (CUDA builds; docs/ENGINE.md "GPU placement"). The dense part, the KV cache and the
     * hot expert units go to the device when n_gpu_layers > 0 or vram_budget != 0. */
    int32_t n_gpu_layers; /* -ngl: > 0 = the dense part on the GPU (every layer: a value below the
                             model's layer count is treated as all, with a warning); 0 = CPU only */
    int64_t vram_budget;  /* bytes of VRAM for expert slots; 0 = by the flags below, -1 = auto
                             (free VRAM after the dense part, KV and activations, minus vram_reserve) */
    int64_t vram_reserve; /* auto: VRAM left free; < 0 = 1 GiB */
    bool cpu_moe;         /* --cpu-moe: no expert slots unless vram_budget says otherwise */
    int32_t n_cpu_moe;    /* --n-cpu-moe N: units of layers >= N in VRAM, the rest on the CPU; < 0 = off */
    int32_t main_gpu;     /* --main-gpu: the device (0) */
    int32_t flash_attn;   /* -fa: 1 on, 0 off, -1 auto (= on): prefill attention of 32+ tokens as
                             one tensor-core flash kernel (Q and P in f16) instead of the exact f32
                             kernels; env HOTMOE_FLASH_ATTN=0 turns auto off */
    /* Several GPUs (issue 11; docs/ENGINE.md "GPU placement"; model/gpu_split.h plans them): the
     * layers split over the devices as llama.cpp's -ts, each device with its own slot budget. A
     * plan that names a single device runs as the single-device form on it (as -mg N
     * --vram-budget SIZE). qwen3moe, qwen35moe and gemma4 models run a plan of several (an arch
     * without it: HM_ERR_UNSUPPORTED). A per-device budget or a -ts turns the GPU on. */
    int32_t n_vram_budgets; /* entries of vram_budgets; 0 = the single form (vram_budget) */
    hm_gpu_budget vram_budgets[HM_MAX_GPUS]; /* --vram-budget 0:11GiB,1:5GiB: one per device named,
                                                devices distinct; a device not named gets none */
    int32_t n_tensor_split; /* entries of tensor_split; 0 = none */
    float tensor_split[HM_MAX_GPUS]; /* -ts: share of the layers of CUDA device i (llama.cpp's
                                        proportions, >= 0); none or all 0 = by free VRAM */
    bool no_peer;         /* several GPUs: a unit stays on its layer's device or the CPU (default:
                             when its layer's device is full, a hot unit may take a free slot on
                             another device and run there, its rows sent over and back) */
    int32_t n_ctx;        /* context the sessions will ask for: sizes the auto budget's KV share
                             (0 = the model's training context, capped at 32768) */
    /* The SSD tier (models larger than RAM, docs/ENGINE.md). ram_budget 0, or >= the model's
     * expert bytes: every unit is computed from the file mapping (plain mmap). Below: expert
     * units live in a RAM slot pool of ram_budget bytes (placed by `policy`), units without a
     * slot are read from the file when routed (io_uring or pread, O_DIRECT when it can). */
    int64_t ram_budget;   /* bytes for RAM expert slots + staging (--ram-budget); 0 = plain mmap */
    bool mlock;           /* lock the slot pool in RAM (--mlock); fails naming RLIMIT_MEMLOCK */
    bool prefetch;        /* apply layer l+1's router to layer l's input, read its units ahead */
    int32_t io_depth;     /* reads in flight (--io-depth); 0 = 16 */
    bool io_pread;        /* never io_uring (pread); for tests and seccomp'd containers */
    /* The seed-2 fork's expert-cache knobs (its GGML_CUDA_MOE_CACHE_* variables, docs/ENGINE.md) */
    int32_t admit_misses;   /* online/elite: misses before a unit may enter the fast tier; < 0 = default (2) */
    int32_t max_inserts;    /* online/lru/elite: at most this many units enter the fast tier per step; 0 = no cap */
    float demand_half_life; /* online/elite: half-life of the decayed use, in steps (a decode token is one);
                               0 = default (x0.7 every 16-step window) */
    float elite_pct;        /* policy elite: the static elite's share of the slots, 0..100; < 0 = default (60) */
    bool no_preload;        /* with a profile and no policy: start with an empty pool and learn online
                               instead of placing the profile's hot set at open */
    int32_t stats_every;    /* > 0: one line of expert-store stats on stderr every N tokens */
    int64_t staging_bytes;  /* the VRAM tier's pinned staging ring for copies to the slots; 0 = 64 MiB */
};

/* No profile, policy NULL, update_rate -1, no GPU (n_gpu_layers 0, vram_budget 0, vram_reserve -1,
 * n_cpu_moe -1, no per-device budget, no tensor split), flash_attn -1 (auto). */
void hm_placement_opts_default(hm_placement_opts *o);
/* True when o puts anything on the GPU (n_gpu_layers > 0, vram_budget != 0, a per-device budget or
 * a tensor split). */
bool hm_placement_wants_gpu(const hm_placement_opts *o);
/* CUDA devices this process can use: 0 in a build without CUDA or on a machine without a device. */
int hm_gpu_count(void);
/* --vram-budget's value into o. One size for one device ("12GiB", "0"; "auto" or "-1" = auto):
 * vram_budget, with n_vram_budgets = 0. A size per device ("0:11GiB,1:11GiB,2:auto"):
 * vram_budgets and n_vram_budgets, with vram_budget = 0. mib: sizes are whole MiB (-1 = auto), as
 * in the seed's GGML_CUDA_MOE_CACHE_BUDGET_MB_DEVICES=0:11800,1:11800. HM_ERR_ARG with a message
 * naming the bad token ("bad device 'x'"); o unchanged then. */
hm_status hm_parse_vram_budget(const char *s, bool mib, hm_placement_opts *o, hm_err *err);
/* -ts / --tensor-split's value into o (tensor_split, n_tensor_split), as llama.cpp's: proportions
 * >= 0 separated by ',' or '/' ("3,1"), the i-th for CUDA device i, at most HM_MAX_GPUS. HM_ERR_ARG
 * naming the bad token; o unchanged then. */
hm_status hm_parse_tensor_split(const char *s, hm_placement_opts *o, hm_err *err);

/* Usage profile file formats (docs/PROFILE.md). */
typedef enum hm_profile_fmt {
    HM_PROFILE_FMT_HOTMOE = 0, /* "hotmoe": hotmoe.profile.v1 */
    HM_PROFILE_FMT_SEED1 = 1,  /* "seed1": llama.cpp.moe_layer_perf.v1 (the seed-1 fork's input) */
    HM_PROFILE_FMT_SGLANG = 2, /* "sglang": {"logical_count": [layers][experts]}, what SGLang's
                                  --init-expert-location reads (docs/CLUSTER.md) */
} hm_profile_fmt;
/* "hotmoe" / "seed1" / "sglang" -> the format; -1 for anything else. */
int hm_profile_fmt_from_name(const char *name);
/* The name of a format ("hotmoe", "seed1", "sglang"; "?" for anything else). Static string. */
const char *hm_profile_fmt_name(hm_profile_fmt fmt);

/* Read the profile at in (any format --profile takes) and write it to out in format fmt,
 * atomically. n_layer / n_expert > 0: the model's geometry, checked as --profile checks it (0 =
 * unchecked). Errors name the file and the field; a PyTorch .pt file is refused with how to
 * convert it to JSON. */
hm_status hm_profile_convert(const char *in, const char *out, hm_profile_fmt fmt, int32_t n_layer, int32_t n_expert,
                             hm_err *err);

/* False for a model without expert tensors (then the calls below answer HM_ERR_UNSUPPORTED). */
bool hm_model_has_experts(const hm_model *m);

/* Write the usage counts so far (per layer per expert, tokens, prompt/decode split) to path,
 * atomically (path.tmp.<pid>, fsync, rename). */
hm_status hm_model_profile_save(const hm_model *m, const char *path, hm_profile_fmt fmt, hm_err *err);

/* From now on write every routed (token, layer, expert) and step boundary to path (the binary
 * trace of docs/PROFILE.md; `hotmoe plan --trace` replays it). Start it before the first eval to
 * trace the whole run; the file is flushed and closed by hm_model_close. One trace per model. */
hm_status hm_model_trace_out(hm_model *m, const char *path, hm_err *err);
/* Flush and close the trace: HM_ERR_IO naming the file and the cause (a full disk shows here)
 * when any write since hm_model_trace_out failed; HM_OK when none is being written. Call it before
 * hm_model_close to learn whether the trace is complete (hm_model_close drops the status). */
hm_status hm_model_trace_close(hm_model *m, hm_err *err);

/* The placement policies (one table: experts/policy.c), for listing them: policy i's name and, in
 * *what when non-NULL, one line on what it does, for i in 0 .. hm_policy_count() - 1 ("none",
 * the default without a profile or a budget, last); NULL past the end. Static strings. */
int hm_policy_count(void);
const char *hm_policy_info(int i, const char **what);
/* The placement policy in force: "none", "static", "online", "lru" (static string). */
const char *hm_model_policy(const hm_model *m);
/* Switch the placement policy between steps (HM_ERR_ARG inside a step or for an unknown name).
 * With VRAM slots the residency is re-planned at once: static re-seeds from the --profile the
 * model was opened with, or from the counts so far; online and lru keep the residents and go on
 * from the live counters; none empties the slots. Without a fast tier (no VRAM slots: today's
 * only case) every unit stays where it is and only the name changes. */
hm_status hm_model_set_policy(hm_model *m, const char *policy, hm_err *err);

/* Where a unit is computed from now. */
typedef enum hm_unit_home { HM_HOME_SSD = 0, HM_HOME_RAM = 1, HM_HOME_VRAM = 2 } hm_unit_home;
const char *hm_unit_home_name(hm_unit_home h); /* "ssd", "ram", "vram" */

/* A snapshot of the store. A "hit" is a routed (token, unit) computed from VRAM. */
typedef struct hm_usage {
    int32_t n_layer, n_expert, n_expert_used;
    const char *policy;              /* static string */
    uint64_t tokens, prompt_tokens, decode_tokens, steps;
    uint64_t hits, misses;           /* all layers */
    int64_t vram_slots, vram_slots_used;
    uint64_t units[3];               /* units by home: [HM_HOME_SSD], [HM_HOME_RAM], [HM_HOME_VRAM] */
    uint64_t unit_bytes;             /* the largest unit (the size of a slot) */
    uint64_t swaps_in, swaps_out;    /* units moved into / out of VRAM since open */
    int64_t elite_units;             /* policy elite: units of the static elite holding a VRAM slot */
    uint64_t bytes_to_vram;          /* bytes copied into VRAM slots since open */
    uint64_t bytes_from_ssd;         /* bytes read from SSD since open (0 without a RAM budget) */
    /* The SSD tier (all 0 without a RAM budget): */
    int64_t ram_budget;              /* the pool's bytes (0 = no SSD tier: plain mmap) */
    int32_t ram_slots, ram_stage;    /* policy slots, staging buffers */
    uint64_t ram_acquired;           /* routed unit acquisitions from the RAM tier */
    uint64_t ram_hits;               /* of those: already in RAM (slot, staging, or prefetched) */
    uint64_t ram_hit_prefetch;       /* of the hits: there because a prefetch read them */
    uint64_t ssd_reads;              /* unit reads from the file (on demand + prefetch + policy) */
    uint64_t ssd_errors;             /* failed unit reads */
    uint64_t prefetch_pred, prefetch_used; /* predicted units; of them, routed then */
    uint64_t prefetch_acq;           /* acquisitions in layers that had a prediction */
    double ssd_wait_us;              /* time the forward pass blocked on reads */
    bool io_uring, io_direct, ram_mlocked;
    uint64_t mlocked_bytes;          /* --mlock without the SSD tier: expert bytes locked in RAM */
    uint64_t *counts;                /* [n_layer * n_expert] routed selections (row = layer), owned */
    uint8_t *home;                   /* [n_layer * n_expert] hm_unit_home, owned */
    uint64_t *layer_hits, *layer_misses; /* [n_layer], owned */
    /* The GPU placement's devices (n_gpus 0 without one): CUDA ordinal, expert slots, slots
     * holding a unit and peer units per device, and the device index (0..n_gpus-1) running each
     * layer. */
    int32_t n_gpus;
    int32_t gpu_ordinal[HM_MAX_GPUS];
    int64_t gpu_slots[HM_MAX_GPUS], gpu_slots_used[HM_MAX_GPUS];
    int64_t gpu_peer[HM_MAX_GPUS];   /* of the used slots: units of another device's layers */
    uint64_t stream_units, stream_bytes; /* prefill streaming: cold units copied up for one layer's
                                            batch and computed on the GPU (docs/ENGINE.md) */
    uint64_t stream_ahead, stream_ahead_used; /* of them: copied a layer ahead from a predicted
                                                 routing; of those, routed there (used) */
    uint64_t gpu_pinned_bytes;       /* --mlock: expert bytes of the mapping registered with CUDA */
    uint64_t gpu_direct_fills;       /* copies to VRAM (slots and streaming) straight from them */
    int32_t *layer_gpu;              /* [n_layer] owned; NULL when n_gpus is 0 */
} hm_usage;

/* Fill u (arrays malloc'd, owned by u: hm_usage_free). HM_ERR_UNSUPPORTED without experts. */
hm_status hm_model_usage(const hm_model *m, hm_usage *u, hm_err *err);
void hm_usage_free(hm_usage *u); /* NULL-safe, idempotent */

/* ==== end of expert store of a model ===================================================== */


/* ==== Tokenizer (tokenizer/) ============================================================== */

/* A model's tokenizer, read from the tokenizer.* keys of a GGUF file (a full model or a
 * vocab-only file). Immutable once open: every call takes it const, so threads may share one.
 * Byte-level BPE (tokenizer.ggml.model "gpt2", pre-tokenizers qwen2, qwen35, llama-bpe,
 * deepseek-llm, deepseek-v3, gpt-2) and SentencePiece BPE ("llama").
 * Input text that is not valid UTF-8 is not an error: each invalid sequence is replaced by
 * U+FFFD (per maximal subpart, as Python's bytes.decode(errors="replace") does), which is the
 * text a Hugging Face tokenizer would have been given. Qwen's pre-tokenizers NFC-normalise the
 * text between special tokens first, as their tokenizer.json does. */
typedef struct hm_tokenizer hm_tokenizer;

/* Open the tokenizer of the GGUF file at path. *out owned by the caller (hm_tokenizer_close).
 * A missing file, a file without tokenizer keys or an unsupported vocabulary/pre-tokenizer
 * fail with a message naming the file and key. */
hm_status hm_tokenizer_open(hm_tokenizer **out, const char *path, hm_err *err);
void hm_tokenizer_close(hm_tokenizer *t); /* NULL is a no-op */

int32_t hm_tokenizer_n_vocab(const hm_tokenizer *t);
int32_t hm_tokenizer_bos(const hm_tokenizer *t); /* -1 when the file names none */
int32_t hm_tokenizer_eos(const hm_tokenizer *t); /* -1 when the file names none */
bool hm_tokenizer_add_bos(const hm_tokenizer *t); /* tokenizer.ggml.add_bos_token */
/* End of generation: eos, eot, and the turn/text end tokens the vocabulary has
 * (<|im_end|>, <|endoftext|>, <|eot_id|>, <end_of_turn>, ...). */
bool hm_tokenizer_is_eog(const hm_tokenizer *t, int32_t id);
const char *hm_tokenizer_model(const hm_tokenizer *t); /* "gpt2" or "llama"; borrowed */
const char *hm_tokenizer_pre(const hm_tokenizer *t);   /* pre-tokenizer name, "" for SPM */
const char *hm_tokenizer_chat_template(const hm_tokenizer *t); /* borrowed; NULL when none */

typedef struct hm_tokenize_opts {
    bool add_bos;       /* prepend BOS (when the vocabulary has one) */
    bool parse_special; /* match control tokens (<|im_start|>, ...) in the text; user-defined
                           added tokens (<think>, ...) are matched either way */
} hm_tokenize_opts;

/* add_bos = the file's add_bos_token, parse_special = true. */
void hm_tokenize_opts_default(const hm_tokenizer *t, hm_tokenize_opts *o);

/* Tokenize text[0..len). *ids is malloc'd and owned by the caller (free()), *n_ids its length.
 * o NULL = defaults. Fails only for lack of memory. */
hm_status hm_tokenize(const hm_tokenizer *t, const char *text, size_t len,
                      const hm_tokenize_opts *o, int32_t **ids, size_t *n_ids, hm_err *err);

/* GGUF token types. */
enum { HM_TOKEN_NORMAL = 1, HM_TOKEN_UNKNOWN = 2, HM_TOKEN_CONTROL = 3, HM_TOKEN_USER_DEFINED = 4,
       HM_TOKEN_UNUSED = 5, HM_TOKEN_BYTE = 6 };
int hm_token_type(const hm_tokenizer *t, int32_t id); /* 0 for an id out of range */
/* The bytes a token stands for (byte-level decoded; SPM: U+2581 as ' ', <0xNN> as the byte;
 * control tokens: their text). Not NUL-terminated; may be a partial UTF-8 character. Borrowed,
 * valid until hm_tokenizer_close; "" for an id out of range. */
const char *hm_token_piece(const hm_tokenizer *t, int32_t id, size_t *len);
/* The token's text as stored in the file (GPT-2 byte encoding for BPE). Borrowed. */
const char *hm_token_text(const hm_tokenizer *t, int32_t id, size_t *len);

/* Streaming detokeniser: feed ids one at a time, print what comes back. Bytes that end inside a
 * UTF-8 character are held until the next token completes them; bytes that can never form one
 * come out as U+FFFD, so the output is always valid UTF-8. Control and unused tokens print
 * nothing unless render_special. */
typedef struct hm_detok hm_detok;
hm_status hm_detok_open(hm_detok **out, const hm_tokenizer *t, bool render_special, hm_err *err);
void hm_detok_close(hm_detok *d); /* NULL is a no-op */
/* Returns the text now complete (borrowed, NUL-terminated, valid until the next call on d),
 * its length in *len (may be 0). Never allocates. */
const char *hm_detok_push(hm_detok *d, int32_t id, size_t *len);
/* End of stream: the held bytes (as U+FFFD when incomplete). */
const char *hm_detok_flush(hm_detok *d, size_t *len);
/* Whole sequence at once; *out malloc'd, NUL-terminated, owned by the caller. */
hm_status hm_detokenize(const hm_tokenizer *t, const int32_t *ids, size_t n, bool render_special,
                        char **out, size_t *len, hm_err *err);

/* Chat templates: the family is recognised from the template text (tokenizer.chat_template);
 * supported: "chatml" (<|im_start|>, Qwen 2/2.5/3 with Qwen3's think/tool rules), "gemma4",
 * and llama.cpp's built-in renderings of "chatglm4" (GLM-4.5), "deepseek3" (DeepSeek-V3/R1/V4)
 * and "harmony" (gpt-oss). */
typedef struct hm_chat_msg {
    const char *role;    /* "system", "user", "assistant", "tool" */
    const char *content; /* NULL = "" */
} hm_chat_msg;

typedef struct hm_chat_opts {
    bool add_generation_prompt; /* end with the assistant turn's header */
    bool no_thinking;           /* Qwen3 enable_thinking=false: an empty think block */
} hm_chat_opts;

/* Render msgs[0..n) with template tmpl (e.g. hm_tokenizer_chat_template(t)). *out malloc'd,
 * NUL-terminated, owned by the caller. o NULL = add_generation_prompt only. An unknown template
 * is HM_ERR_UNSUPPORTED with a message quoting its beginning; NULL/"" says the model has none. */
hm_status hm_chat_apply(const char *tmpl, const hm_chat_msg *msgs, size_t n, const hm_chat_opts *o,
                        char **out, hm_err *err);
/* "chatml", "gemma4", "chatglm4", "deepseek3", "harmony", or NULL when the template is not one
 * we render. */
const char *hm_chat_template_name(const char *tmpl);

/* A generated reply split into what the user is shown and the model's reasoning, for families
 * that mark them: "harmony" (gpt-oss), whose analysis channel is reasoning and whose final (and
 * commentary) channel is content; the channel headers and markers are dropped. Feed the
 * detokenised text (special tokens rendered as llama.cpp renders them) in pieces of any size;
 * each push returns the parts released by it (borrowed until the next push). hm_chat_reply_open
 * sets *out NULL for families without channels: their whole reply is content. */
typedef struct hm_chat_reply hm_chat_reply;
typedef struct hm_chat_reply_part {
    const char *content, *reasoning; /* borrowed; "" when empty */
    size_t n_content, n_reasoning;
} hm_chat_reply_part;
hm_status hm_chat_reply_open(hm_chat_reply **out, const char *tmpl, hm_err *err);
/* final: the reply ends here (a tail held for a possible marker is released). */
hm_status hm_chat_reply_push(hm_chat_reply *r, const char *text, size_t len, bool final, hm_chat_reply_part *out,
                             hm_err *err);
void hm_chat_reply_close(hm_chat_reply *r); /* NULL is a no-op */

/* Write a vocab-only GGUF (tokenizer keys, no tensors) at out_path from a Hugging Face
 * tokenizer.json and optional tokenizer_config.json (NULL): byte-level BPE only. */
hm_status hm_tokenizer_write_vocab_gguf(const char *tokenizer_json, const char *tokenizer_config_json,
                                        const char *out_path, hm_err *err);

/* ==== end of tokenizer ==================================================================== */


#ifdef __cplusplus
}
#endif
#endif
