/* hotmoe_tools.h - the tools' public C API, built on the engine's (hotmoe.h, included): inspect
 * and synth (GGUF files without loading a model, and random-weight models for tests and
 * benchmarks), the OpenAI-compatible server, and `plan` (placement predictions from a profile).
 * The engine itself never uses these. Conventions as hotmoe.h. */
#ifndef HOTMOE_TOOLS_H
#define HOTMOE_TOOLS_H

#include "hotmoe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ==== Inspect and synth (inspect/, synth/) ============================================== */

typedef struct hm_inspect_opts {
    bool json;      /* print one JSON object instead of the text report */
    int64_t budget; /* bytes for "how many expert units fit"; < 0 = not asked */
    int32_t kv_ctx;    /* > 0: the KV cache of kv_ctx positions is shown (kv_bytes, which the caller
                          fills from hm_model_kv_bytes: inspect itself reads no weights) and, with a
                          budget, the units that fit beside it */
    uint64_t kv_bytes;
    const char *kv_type; /* the cache type kv_bytes is of ("f16", "q8_0", ...; NULL: f16) */
} hm_inspect_opts;

/* Describe the GGUF file at path on out: architecture, every `<arch>.*` hyper-parameter, the
 * tokenizer, the tensor table by type, and the MoE view (expert units per layer, their bytes,
 * dense vs expert bytes, units that fit in o->budget). A vocab-only file (no tensors) is valid.
 * A missing, truncated or corrupt file, or malformed expert tensors, fail with a message naming
 * the file and field; nothing is printed then. o NULL = text, no budget. */
hm_status hm_inspect(const char *path, const hm_inspect_opts *o, FILE *out, hm_err *err);

/* Progress of hm_synth, reported after each chunk of tensor data. */
typedef struct hm_synth_progress {
    const char *tensor;   /* name of the tensor being written (borrowed, valid during the call) */
    int64_t i_tensor;     /* its index, 0-based */
    int64_t n_tensors;
    uint64_t bytes_done;  /* tensor data bytes written so far, all tensors */
    uint64_t bytes_total; /* tensor data bytes of the whole file */
    double elapsed_s;     /* since hm_synth started writing tensor data */
} hm_synth_progress;

typedef struct hm_synth_opts {
    const char *arch;             /* "qwen3moe" (NULL = qwen3moe) */
    const char *preset;           /* "qwen3-30b-a3b" or "tiny" */
    int32_t n_layer;              /* 0 = the preset's depth */
    const char *type;             /* "q4_k_m", "q8_0", "f16", "f32", "bf16", "q4_0", "q4_k",
                                     "q5_k", "q6_k", "iq4_xs", "mxfp4" */
    uint64_t seed;                /* same options + seed => the same file, byte for byte */
    const char *tokenizer_json;   /* Hugging Face tokenizer.json, or NULL for the built-in
                                     byte-level BPE vocabulary (padded to the preset's n_vocab) */
    const char *tokenizer_config; /* its tokenizer_config.json (chat template), or NULL */
    const char *out_path;         /* written atomically (out_path.tmp, then rename) */
    int32_t n_threads;            /* quantisation threads; 0 = online CPUs */
    void (*progress)(void *ud, const hm_synth_progress *p); /* NULL = silent */
    void *progress_ud;
    const char *routing_profile;  /* a usage profile (docs/PROFILE.md): build its per-layer expert
                                     popularity into the weights (docs/SYNTH.md); its n_expert
                                     must be the preset's. NULL = unskewed random routing */
    bool fast_experts;            /* for I/O benchmarks: expert tensors (3-D) of q4_0, q5_0, q8_0,
                                     q4_k, q5_k, q6_k are random blocks of the same magnitude
                                     (std 0.02), not quantised gaussians; minutes instead of an
                                     hour for tens of GB. Every other tensor is unchanged */
    uint64_t split_max_bytes;     /* > 0: write llama-gguf-split's layout, a new file before a tensor
                                     that would take the current one's tensor bytes past this (soft);
                                     out_path must end in .gguf, the files are
                                     out_path-without-.gguf-00001-of-0000N.gguf ... (gguf.h) */
    int32_t split_max_tensors;    /* > 0 (and no split_max_bytes): a new file every N tensors */
    int32_t n_nextn;              /* qwen35moe, qwen3next: 1 writes a multi-token-prediction block after the
                                     layers as llama.cpp's converter does (block_count + 1,
                                     nextn_predict_layers 1, blk.N.nextn.*); 0: none */
    const char *imatrix;          /* llama.cpp importance matrix (llama-imatrix's GGUF or the legacy
                                     .dat): each quantised matrix uses its entry as llama-quantize
                                     --imatrix does (same bytes), and the mixes take llama-quantize's
                                     with-imatrix rules. NULL = none */
} hm_synth_opts;

/* Write a random-weight model with the real tensor names, shapes, GGUF keys and (for q4_k_m)
 * the per-tensor type mix of llama.cpp, so llama.cpp and hotmoe load it. Weights are
 * gaussian-like (std 0.02 for matrices, about 1 for norms) from a counter-based generator:
 * each value depends only on (seed, tensor name, element index). Memory stays small: tensors are
 * generated and quantised in chunks and streamed to the file. */
hm_status hm_synth(const hm_synth_opts *o, hm_err *err);

/* ==== end of inspect and synth =========================================================== */

/* ==== Server (server/) ===================================================================== */

/* `hotmoe serve`: an OpenAI-compatible HTTP server (libmicrohttpd) over one model with
 * n_parallel slots, each its own session (KV cache). One engine thread steps every active slot
 * in turn; connection threads only parse, tokenize and wait. See src/server/server.h. */
typedef struct hm_server hm_server;

typedef struct hm_server_opts {
    const char *model_path;    /* GGUF model (required) */
    const char *host;          /* bind address; NULL = "127.0.0.1" */
    int port;                  /* 0 = 8080 */
    int32_t n_parallel;        /* slots; 0 = 1 */
    int32_t n_ctx;             /* positions per slot; 0 = min(n_ctx_train, 4096) */
    int32_t n_threads;         /* compute threads; 0 = online CPUs */
    int32_t n_ubatch;          /* tokens per forward micro-batch of a prompt; 0 = 512 */
    hm_kv_type kv_type;        /* every slot's KV cache type (-ctk/-ctv); 0 = f16 */
    const char *api_key;       /* NULL = no auth; else every endpoint but /health and the page
                                  needs "Authorization: Bearer KEY"; "" is an error */
    const char *api_key_file;  /* more keys, one per line ('#' comments); any key is accepted.
                                  A file without a key is an error. NULL = none */
    const char *alias;         /* model id in the API; NULL = the file name */
    const char *chat_template; /* "chatml" or a template text; NULL = the model's own */
    const char *profile_out;   /* where POST /profile/save writes; NULL = "hotmoe-profile.json" */
    bool profile_on_exit;      /* also write profile_out when the server closes (--profile-out) */
    hm_profile_fmt profile_format; /* of those files (default hotmoe) */
    const hm_placement_opts *placement; /* borrowed during open; NULL = count expert use only */
    const hm_spec_opts *spec;  /* speculative decoding in every slot (ngram-simple, ngram-cache,
                                  draft-mtp; its n_max / n_min / p_min the defaults a request's
                                  speculative.* fields override); borrowed during open; NULL or
                                  type none = none */
    const char *trace_out;     /* write the routing trace of every request here; NULL = none */
    size_t max_body;           /* request body cap in bytes; 0 = 8 MiB */
    /* Connection limits (0 = the default in brackets): a client that opens many connections or
     * sends slowly cannot lock others out. */
    int32_t max_conns;         /* open connections at once, /health's reserve aside [256] */
    int32_t max_conns_per_ip;  /* open connections from one client address [32] */
    int32_t health_conns;      /* more connections that only /health may use once max_conns
                                  are open [4]; -1 = none */
    int32_t header_timeout_s;  /* a request's headers must be in within this many seconds of the
                                  connection's start or of its previous answer (keep-alive) [10] */
    int32_t body_timeout_s;    /* its body within this many seconds of its headers [60] */
    int32_t idle_timeout_s;    /* no byte either way for this long closes a connection while an
                                  answer is being sent [120] */
    bool verbose;              /* log requests to stderr */
    /* The prompt-processing model (issue 25, hotmoe.h's hm_pp_*): a request whose prompt (after the
     * cached prefix) has at least pp_min_tokens tokens is prefilled by this copy, its last
     * pp_refresh tokens by the main model. NULL = none. */
    const char *pp_model_path;
    int32_t pp_min_tokens;     /* 0 = 8192 */
    int32_t pp_refresh;        /* >= 0 */
    int32_t pp_gpu_moe;        /* >= 0: the copy's --n-cpu-moe; < 0: the main model's placement */
} hm_server_opts;

void hm_server_opts_default(hm_server_opts *o);
/* Open the model, one session per slot, start the engine thread and listen. *out owned by the
 * caller (hm_server_close). A port in use or a bad model fails with a message. */
hm_status hm_server_open(hm_server **out, const hm_server_opts *o, hm_err *err);
/* Block until hm_server_stop. */
void hm_server_wait(hm_server *s);
/* Ask hm_server_wait to return. Async-signal-safe (a SIGINT handler may call it). */
void hm_server_stop(hm_server *s);
/* The port the server listens on. */
int hm_server_port(const hm_server *s);
/* Stop listening, cancel every request, join the engine thread, free everything. NULL no-op. */
void hm_server_close(hm_server *s);

/* ==== end of server ======================================================================= */

/* ==== Expert placement: plan (plan/) ====================================================== */

/* `hotmoe plan`: which expert units to keep in a fast tier of a given size, the hit rate that
 * buys, the llama.cpp --n-cpu-moe placement with the same bytes and its hit rate, and (with a
 * model file) the measured CPU cost of a unit and the decode speed that implies. */
typedef struct hm_plan_opts {
    const char *model_path;   /* GGUF: unit sizes + CPU calibration; NULL = profile/trace + unit_bytes */
    const char *profile_path; /* a usage profile (hotmoe.profile.v1 or the seed-1 fork's v1) */
    const char *trace_path;   /* a routing trace (--trace-out): every policy is replayed on it */
    int64_t budget;           /* bytes of the fast tier for expert units; < 0: use budget_frac */
    double budget_frac;       /* or this fraction (0, 1] of all units, when budget < 0 */
    const char *policy;       /* "static" (default with a profile), "online" (default for a trace
                                 alone), "lru" */
    uint64_t unit_bytes;      /* without a model: bytes of one unit (0 = the profile's) */
    int64_t sim_tokens;       /* without a trace: tokens of the synthetic trace (0 = the profile's
                                 decode tokens, at least 2000, at most 20000) */
    uint64_t seed;            /* of the synthetic trace */
    int32_t n_threads;        /* calibration threads; 0 = online CPUs */
    bool calibrate;           /* time a unit's matvec on this CPU (needs model_path) */
    bool static_per_layer;    /* static: the same number of units in each layer */
    bool warm_start;          /* online/lru start from the static placement */
    float update_rate;        /* online: swaps per window as a fraction of slots (< 0: default) */
    float elite_pct;          /* elite: the elite's share of the slots, 0..100 (< 0: default 60) */
    bool json;                /* one JSON object instead of the text report */
    int64_t ram_budget;       /* bytes of the RAM slot pool (--ram-budget); < 0: use ram_budget_frac,
                                 and neither: no RAM+SSD section */
    double ram_budget_frac;   /* or this fraction (0, 1] of all expert bytes, when ram_budget < 0 */
    /* Several GPUs (`--budget 0:6GiB,1:6GiB`, `-ts 1,1`): the layer split and per-device slot
     * groups as the engine makes them (equal free VRAM assumed without -ts), simulated with and
     * without peer units; budget is then the devices' sum. n_gpu_budgets 0: one pool. */
    int32_t n_gpu_budgets;
    hm_gpu_budget gpu_budgets[HM_MAX_GPUS];
    int32_t n_tensor_split;
    float tensor_split[HM_MAX_GPUS];
    /* Expert parallelism (`--ep N`, hm_plan_ep; docs/CLUSTER.md): each layer's experts over N
     * devices or hosts, the per-device load of a contiguous split and of EPLB's balanced placement. */
    int32_t ep_devices;       /* N; 0 = no EP section */
    int32_t ep_redundant;     /* replicas (SGLang's --ep-num-redundant-experts); < 0 = N, rounded up
                                 so that experts + replicas split evenly */
} hm_plan_opts;

void hm_plan_opts_default(hm_plan_opts *o);

/* Compute and print the plan on out. Errors (unreadable profile/trace/model, shapes that do not
 * match, no unit size) name the file and field; nothing is printed then. */
hm_status hm_plan(const hm_plan_opts *o, FILE *out, hm_err *err);

/* `plan --ep N`: from the profile alone (o->profile_path, or o->trace_path's counts), each MoE
 * layer's experts placed over o->ep_devices devices three ways (a contiguous split; balanced
 * packing; balanced with replicas, DeepSeek's EPLB as SGLang runs it) and printed as per-device
 * loads and imbalance (max / mean); with o->json one JSON object. Errors name the file or flag. */
hm_status hm_plan_ep(const hm_plan_opts *o, FILE *out, hm_err *err);

/* ==== end of expert placement ============================================================= */

#ifdef __cplusplus
}
#endif
#endif
