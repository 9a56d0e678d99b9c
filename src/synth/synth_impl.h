/* synth_impl.h - internals of `hotmoe synth`, shared by synth.c (driver: metadata, threads,
 * streaming), synth_plan.c (presets, tensor list, per-tensor type mix) and synth_vocab.c
 * (tokenizer keys).
 *
 * The random generator is counter-based: value (seed, tensor name, element index) -> float,
 * with no state carried between elements, so any split of a tensor over threads or chunks gives
 * the same bytes, and a tensor's values do not depend on which other tensors the file has
 * (blk.0 of a 4-layer and of a 48-layer file are equal). */
#ifndef HM_SYNTH_IMPL_H
#define HM_SYNTH_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "../gguf/gguf.h"
#include "hotmoe_tools.h"

/* ---- counter-based generator ---- */

/* splitmix64's output function: a bijective 64-bit mixer. */
static inline uint64_t hm_synth_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Per-tensor key from the seed and the tensor name. */
static inline uint64_t hm_synth_key(uint64_t seed, const char *name) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a of the name */
    for (; *name; name++) h = (h ^ (unsigned char)*name) * 1099511628211ull;
    return hm_synth_mix64(hm_synth_mix64(seed) ^ h);
}

/* Gaussian-like value (mean 0, std 1, within +-3.46) for element i: the sum of four 16-bit
 * uniforms (Irwin-Hall, n = 4) of splitmix64's i-th output for state key. Exact std of the
 * sum: sqrt((65536^2 - 1) / 3) = 37837.2265. */
static inline float hm_synth_gauss(uint64_t key, uint64_t i) {
    uint64_t r = hm_synth_mix64(key + (i + 1) * 0x9e3779b97f4a7c15ull);
    int32_t s = (int32_t)(r & 0xffff) + (int32_t)((r >> 16) & 0xffff) + (int32_t)((r >> 32) & 0xffff) +
                (int32_t)(r >> 48);
    return (float)(s - 131070) * (1.0f / 37837.2265f);
}

/* ---- presets and the tensor plan ---- */

typedef struct hm_synth_preset {
    const char *name;       /* "--preset" value */
    const char *model_name; /* general.name */
    int32_t n_layer, n_embd, n_head, n_head_kv, head_dim;
    int32_t n_expert, n_expert_used, n_ff_exp, n_ff, n_vocab, n_ctx;
    float rope_theta, rms_eps;
} hm_synth_preset;

/* How --type maps tensors to ggml types. */
typedef enum hm_synth_mix_kind {
    HM_SYNTH_MIX_PURE,      /* every matrix of base type (llama-quantize --pure) */
    HM_SYNTH_MIX_Q4_K_M,    /* llama.cpp's Q4_K_M rules */
    HM_SYNTH_MIX_MXFP4_MOE, /* llama.cpp's MXFP4_MOE: experts MXFP4, other matrices Q8_0 */
    HM_SYNTH_MIX_Q2_K,      /* llama.cpp's Q2_K rules (synth_mix.c, every arch) */
    HM_SYNTH_MIX_Q3_K_M,    /* llama.cpp's Q3_K_M rules (synth_mix.c) */
    HM_SYNTH_MIX_IQ,        /* llama.cpp's rules for the i-quant ftype m->ftype (synth_mix.c) */
    HM_SYNTH_MIX_UD,        /* unsloth-dynamic-like: routed experts base / down, the rest high (synth_mix.c) */
} hm_synth_mix_kind;

typedef struct hm_synth_mix {
    const char *name;  /* "--type" value */
    int32_t ftype;     /* general.file_type (LLAMA_FTYPE_*) */
    int base;          /* hm_type of the bulk of the matrices */
    hm_synth_mix_kind kind;
    int down;          /* HM_SYNTH_MIX_UD: hm_type of the routed ffn_down_exps */
    bool imatrix;      /* the rules llama-quantize applies with an importance matrix (hm_synth sets
                          it on a copy of the table's entry when --imatrix is given) */
} hm_synth_mix;

typedef struct hm_synth_tensor {
    char name[64];
    uint32_t n_dims;
    int64_t ne[3];
    int type;    /* hm_type */
    float mean;  /* values are mean + std * gauss */
    float std;
    int32_t rope_pairs; /* > 0: rope_freqs (gemma4): 1 for the first rope_pairs values, 1e30 after */
    int32_t hash_experts; /* > 0: an I32 hash-routing table (deepseek4): each row's ne0 distinct expert
                             ids in [0, hash_experts), spread from a per-row start */
} hm_synth_tensor;

const hm_synth_preset *hm_synth_find_preset(const char *name);
const hm_synth_mix *hm_synth_find_mix(const char *name);
/* llama.cpp's tensor_type_fallback: type when rows of ne0 are whole blocks of it, else the type
 * llama-quantize falls back to (Q2_K/Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0,
 * IQ4_XS and the grid i-quants -> IQ4_NL; F16 when that does not fit either; any other type as it
 * is: the caller reports the block mismatch). */
int hm_synth_type_fallback(int type, int64_t ne0);
/* "tiny, qwen3-30b-a3b" / "q4_k_m, q8_0, ..." for error messages and --help. */
const char *hm_synth_preset_names(void);
const char *hm_synth_mix_names(void);

/* Append a zeroed tensor named `name` of shape (n_dims; ne0, ne1, ne2) to the growing list
 * (*t, *n, *cap: owned by the caller, free(*t)). NULL with HM_ERR_NOMEM in err on failure. */
hm_synth_tensor *hm_synth_push(hm_synth_tensor **t, int64_t *n, int64_t *cap, const char *name, uint32_t n_dims,
                               int64_t ne0, int64_t ne1, int64_t ne2, hm_err *err);
/* HM_ERR_UNSUPPORTED naming the tensor when its rows do not fit its type's block size. */
hm_status hm_synth_check_rows(const hm_synth_tensor *t, hm_err *err);

/* The model facts llama-quantize's rules read (its hparams: n_layer, n_head / n_head_kv of layer
 * 0, n_expert). */
typedef struct hm_synth_mix_hp {
    int32_t n_layer, n_gqa, n_expert;
} hm_synth_mix_hp;

/* Whether m's types come from hm_synth_mix_apply (Q2_K, Q3_K_M, the i-quant ftypes, ud-*): an
 * arch's plan then gives each matrix it quantises m->base (hm_synth_type_fallback'd) and calls it. */
bool hm_synth_mix_by_rules(const hm_synth_mix *m);
/* Set the type of every matrix of t[0..n) the plan quantises (n_dims >= 2, not F32, not a hash
 * table) by llama-quantize's rules for m (or the ud-* rules), as synth_mix.c says (m->imatrix:
 * the rules it applies with an importance matrix). A no-op for other mixes. HM_ERR_UNSUPPORTED
 * naming a tensor whose rows fit no type. */
hm_status hm_synth_mix_apply(hm_synth_tensor *t, int64_t n, const hm_synth_mix *m, const hm_synth_mix_hp *hp,
                             hm_err *err);

/* The tensors of preset p with n_layer layers and type mix m, in file order. *out owned by the
 * caller (free). HM_ERR_UNSUPPORTED when a shape does not fit a type's block size. */
hm_status hm_synth_plan(const hm_synth_preset *p, int32_t n_layer, const hm_synth_mix *m,
                        hm_synth_tensor **out, int64_t *n_out, hm_err *err);

/* ---- tokenizer keys ---- */

/* Write the tokenizer.* keys: the built-in byte-level BPE vocabulary padded with [PADi] tokens
 * to n_vocab (tokenizer_json NULL), or the Hugging Face tokenizer.json (+ config) through the
 * tokenizer module's importer, padded to n_vocab the way llama.cpp's converter does. A file with
 * more than n_vocab tokens is HM_ERR_ARG. */
hm_status hm_synth_write_vocab(hm_gguf_writer *w, int32_t n_vocab, const char *tokenizer_json,
                               const char *tokenizer_config, hm_err *err);

/* ---- routing skew (synth_routing.c, --routing-profile) ---- */

typedef struct hm_synth_routing hm_synth_routing;

/* Read the profile at path (any schema profile.h reads), check it against preset p (n_expert
 * must match: HM_ERR_ARG naming both counts), map its layers onto n_layer and calibrate every
 * layer's router biases on n_threads threads. plan is the file's tensor list (token_embd's type
 * and std are replayed). *out owned by the caller (hm_synth_routing_close). */
hm_status hm_synth_routing_open(hm_synth_routing **out, const char *path, const hm_synth_preset *p, int32_t n_layer,
                                const hm_synth_tensor *plan, int64_t n_plan, uint64_t seed, int n_threads,
                                hm_err *err);
void hm_synth_routing_close(hm_synth_routing *r); /* NULL-safe */
/* What the construction does to tensor t (0: nothing; r NULL: 0); *layer = its block or -1. */
int hm_synth_routing_op(const hm_synth_routing *r, const hm_synth_tensor *t, int32_t *layer);
/* Rewrite row `row` (ne0 generator values x, tensor key `key`) for op; pure, thread-safe. */
void hm_synth_routing_row(const hm_synth_routing *r, int op, int32_t layer, uint64_t key, int64_t row, float *x,
                          int64_t ne0);
/* Whether op makes row `row` all zeros (a writer of the residual stream on a reserved channel):
 * what hm_synth_routing_row would do, for rows that are not generated as floats (--fast-experts). */
bool hm_synth_routing_zeroes_row(const hm_synth_routing *r, int op, int64_t row);
/* hotmoe.synth.routing.* provenance keys (profile, layer map, reserved channels, fit). r NULL: none. */
hm_status hm_synth_routing_write_meta(const hm_synth_routing *r, hm_gguf_writer *w);

/* ---- --fast-experts (synth_fast.c) ---- */

/* Whether type has a random-block generator (q4_0, q5_0, q8_0, q4_k, q5_k, q6_k). */
bool hm_synth_fast_supported(int type);
/* The i-quants' part (synth_fast_iq.c): which have a generator, and a block's super-scale for
 * values of std `std` after its bytes were filled at random. */
bool hm_synth_fast_iq_supported(int type);
void hm_synth_fast_iq_block(int type, float std, uint8_t *y);
/* Write row `row` of an expert tensor (ne0 elements of a supported type) as random blocks whose
 * dequantised values have mean ~0 and std ~std; the bytes depend only on (key, row). */
void hm_synth_fast_row(int type, uint64_t key, int64_t row, int64_t ne0, float std, uint8_t *out);

/* ---- qwen35moe (synth_qwen35.c) ---- */

/* A Qwen3.5-MoE preset: the common shape plus the DeltaNet and shared-expert dimensions
 * (base.n_ff is unused). */
typedef struct hm_synth_q35 {
    hm_synth_preset base;
    int32_t n_ff_sh, d_conv, n_k, n_v, d_k, d_v, n_rot, interval;
    const char *arch; /* "qwen35moe", or "qwen3next" (ssm_ba for ssm_beta + ssm_alpha, NEOX rotary) */
} hm_synth_q35;

/* The preset of that name for arch (qwen35moe or qwen3next), NULL if none; the names, listed. */
const hm_synth_q35 *hm_synth_find_q35(const char *arch, const char *name);
const char *hm_synth_q35_names(const char *arch);
/* As hm_synth_plan, for qwen35moe and qwen3next. */
hm_status hm_synth_plan_q35(const hm_synth_q35 *q, int32_t n_layer, int32_t n_nextn, const hm_synth_mix *m,
                            hm_synth_tensor **out,
                            int64_t *n_out, hm_err *err);
/* general.* and qwen35moe.* / qwen3next.* keys as llama.cpp's converter writes them. */
hm_status hm_synth_meta_q35(hm_gguf_writer *w, const hm_synth_q35 *q, int32_t n_layer, int32_t n_nextn,
                            const hm_synth_mix *m);

#endif
