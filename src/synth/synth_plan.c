/* synth_plan.c - what `hotmoe synth` writes: the presets (model shapes), the tensor list with
 * llama.cpp's names and ggml shapes for qwen3moe, and which ggml type each tensor gets.
 *
 * Names and shapes follow llama.cpp (src/models/qwen3moe.cpp, gguf-py's tensor names), ne[0]
 * contiguous: token_embd / output {n_embd, n_vocab}; attn_q {n_embd, n_head*head_dim};
 * attn_k / attn_v {n_embd, n_head_kv*head_dim}; attn_output {n_head*head_dim, n_embd};
 * attn_q_norm / attn_k_norm {head_dim}; ffn_gate_inp {n_embd, n_expert};
 * ffn_gate_exps / ffn_up_exps {n_embd, n_ff_exp, n_expert}; ffn_down_exps {n_ff_exp, n_embd,
 * n_expert}; the norms {n_embd}. Order: token_embd, then each layer's tensors, then output_norm
 * and output, so a layer's bytes are contiguous in the file. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../quant/quant.h"
#include "synth_impl.h"

/* Qwen3-30B-A3B's config.json; feed_forward_length is its (unused) dense intermediate_size.
 * tiny: a few MB with the same structure; head_dim 64 != n_embd / n_head on purpose (Qwen3 sets
 * head_dim explicitly), n_ff_exp 256 so that every matrix row is a whole number of 256-element
 * K-quant blocks (llama.cpp would fall back to Q5_0/Q8_0 for rows of 128). */
static const hm_synth_preset presets[] = {
    {"qwen3-30b-a3b", "Qwen3-30B-A3B (hotmoe synth, random weights)", 48, 2048, 32, 4, 128,
     128, 8, 768, 6144, 151936, 40960, 1e6f, 1e-6f},
    {"tiny", "tiny qwen3moe (hotmoe synth, random weights)", 4, 256, 4, 2, 64,
     16, 4, 256, 1024, 384, 4096, 1e6f, 1e-6f},
    /* qwen3moe with Qwen3.6-35B-A3B's expert geometry (40 layers, 256 experts, k 8, n_ff_exp
     * 512), so its usage profiles (the seed-1 coding profile) map 1:1 layer by layer; attention
     * and vocabulary as qwen3-30b-a3b. For --routing-profile benchmarks across engines. */
    {"qwen36-geom", "Qwen3.6-35B-A3B expert geometry on qwen3moe (hotmoe synth, random weights)", 40, 2048, 32, 4,
     128, 256, 8, 512, 6144, 151936, 40960, 1e7f, 1e-6f},
};

/* general.file_type values are llama.cpp's LLAMA_FTYPE_*. Pure K-quant files are labelled with
 * the nearest llama.cpp ftype (Q4_K_S, Q5_K_S, Q6_K), as llama-quantize --pure does. */
static const hm_synth_mix mixes[] = {
    {"q4_k_m", 15, HM_TYPE_Q4_K, HM_SYNTH_MIX_Q4_K_M, 0, false},
    {"q8_0", 7, HM_TYPE_Q8_0, HM_SYNTH_MIX_PURE, 0, false},
    {"f16", 1, HM_TYPE_F16, HM_SYNTH_MIX_PURE, 0, false},
    {"f32", 0, HM_TYPE_F32, HM_SYNTH_MIX_PURE, 0, false},
    {"bf16", 32, HM_TYPE_BF16, HM_SYNTH_MIX_PURE, 0, false},
    {"q4_0", 2, HM_TYPE_Q4_0, HM_SYNTH_MIX_PURE, 0, false},
    {"q4_k", 14, HM_TYPE_Q4_K, HM_SYNTH_MIX_PURE, 0, false},
    {"q5_k", 16, HM_TYPE_Q5_K, HM_SYNTH_MIX_PURE, 0, false},
    {"q6_k", 18, HM_TYPE_Q6_K, HM_SYNTH_MIX_PURE, 0, false},
    {"iq4_xs", 30, HM_TYPE_IQ4_XS, HM_SYNTH_MIX_PURE, 0, false},
    {"mxfp4", 38, HM_TYPE_MXFP4, HM_SYNTH_MIX_MXFP4_MOE, 0, false},
    {"q4_1", 3, HM_TYPE_Q4_1, HM_SYNTH_MIX_PURE, 0, false},
    {"q5_1", 9, HM_TYPE_Q5_1, HM_SYNTH_MIX_PURE, 0, false},
    {"iq4_nl", 25, HM_TYPE_IQ4_NL, HM_SYNTH_MIX_PURE, 0, false},
    {"q2_k", 10, HM_TYPE_Q2_K, HM_SYNTH_MIX_Q2_K, 0, false},
    {"q3_k_m", 12, HM_TYPE_Q3_K, HM_SYNTH_MIX_Q3_K_M, 0, false},
    {"iq2_m", 29, HM_TYPE_IQ2_S, HM_SYNTH_MIX_IQ, 0, false},
    {"iq2_xxs", 19, HM_TYPE_IQ2_XXS, HM_SYNTH_MIX_IQ, 0, false},
    {"iq1_s", 24, HM_TYPE_IQ1_S, HM_SYNTH_MIX_IQ, 0, false},
    {"iq3_xxs", 23, HM_TYPE_IQ3_XXS, HM_SYNTH_MIX_IQ, 0, false},
    {"iq2_xs", 20, HM_TYPE_IQ2_XS, HM_SYNTH_MIX_PURE, 0, false},
    {"iq2_s", 28, HM_TYPE_IQ2_S, HM_SYNTH_MIX_PURE, 0, false},
    {"iq3_s", 26, HM_TYPE_IQ3_S, HM_SYNTH_MIX_PURE, 0, false},
    {"iq1_m", 31, HM_TYPE_IQ1_M, HM_SYNTH_MIX_PURE, 0, false},
    /* unsloth-dynamic-like (synth_mix.c): routed gate/up at base, routed down at .down, the rest
     * Q5_K/Q6_K; labelled with llama.cpp's ftype of the nearest name */
    {"ud-iq1_s", 24, HM_TYPE_IQ1_S, HM_SYNTH_MIX_UD, HM_TYPE_IQ2_XXS, false},
    {"ud-iq2_m", 29, HM_TYPE_IQ2_S, HM_SYNTH_MIX_UD, HM_TYPE_IQ3_S, false},
    {"ud-q2_k_xl", 10, HM_TYPE_Q2_K, HM_SYNTH_MIX_UD, HM_TYPE_Q3_K, false},
};

#define N_PRESETS (sizeof presets / sizeof presets[0])
#define N_MIXES (sizeof mixes / sizeof mixes[0])

const hm_synth_preset *hm_synth_find_preset(const char *name) {
    for (size_t i = 0; name && i < N_PRESETS; i++)
        if (strcmp(presets[i].name, name) == 0) return &presets[i];
    return NULL;
}

int hm_synth_type_fallback(int type, int64_t ne0) {
    const hm_type_traits *tr = hm_type_get(type);
    if (tr && tr->blck_size > 0 && ne0 % tr->blck_size == 0) return type;
    int fb;
    switch (type) {
    case HM_TYPE_Q2_K: case HM_TYPE_Q3_K: fb = HM_TYPE_Q4_0; break;
    case HM_TYPE_Q4_K: fb = HM_TYPE_Q5_0; break;
    case HM_TYPE_Q5_K: fb = HM_TYPE_Q5_1; break;
    case HM_TYPE_Q6_K: fb = HM_TYPE_Q8_0; break;
    case HM_TYPE_IQ4_XS: case HM_TYPE_IQ1_S: case HM_TYPE_IQ1_M: case HM_TYPE_IQ2_XXS: case HM_TYPE_IQ2_XS:
    case HM_TYPE_IQ2_S: case HM_TYPE_IQ3_XXS: case HM_TYPE_IQ3_S: fb = HM_TYPE_IQ4_NL; break;
    default: return type; /* the caller reports the block mismatch */
    }
    return ne0 % 32 == 0 ? fb : HM_TYPE_F16; /* every fallback type has blocks of 32 */
}

const hm_synth_mix *hm_synth_find_mix(const char *name) {
    for (size_t i = 0; name && i < N_MIXES; i++)
        if (strcasecmp(mixes[i].name, name) == 0) return &mixes[i];
    return NULL;
}

const char *hm_synth_preset_names(void) { return "qwen3-30b-a3b, tiny, qwen36-geom"; }
const char *hm_synth_mix_names(void) {
    return "q4_k_m, q8_0, f16, f32, bf16, q4_0, q4_k, q5_k, q6_k, iq4_xs, mxfp4, q4_1, q5_1, iq4_nl, q2_k, q3_k_m, "
           "iq2_m, iq2_xxs, iq1_s, iq3_xxs, iq2_xs, iq2_s, iq3_s, iq1_m, ud-iq1_s, ud-iq2_m, ud-q2_k_xl";
}

typedef enum tkind {
    T_TOKEN_EMBD, T_OUTPUT_NORM, T_OUTPUT, T_ATTN_NORM, T_ATTN_Q, T_ATTN_K, T_ATTN_V, T_ATTN_OUT,
    T_ATTN_Q_NORM, T_ATTN_K_NORM, T_FFN_NORM, T_FFN_GATE_INP, T_FFN_GATE_EXPS, T_FFN_UP_EXPS,
    T_FFN_DOWN_EXPS,
} tkind;

/* llama.cpp's use_more_bits (src/llama-quant.cpp): the first and last eighth of the layers and
 * every third layer in between get more bits. */
static bool use_more_bits(int i_layer, int n_layers) {
    return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2;
}

/* The ggml type of a tensor, following llama.cpp:
 * - 1-D tensors (all norms) are F32 (the converter writes them F32, llama-quantize skips them);
 * - ffn_gate_inp (the router) is F32 (the converter forces it, llama-quantize never quantises it);
 * - PURE: every other tensor gets the base type (llama-quantize --pure);
 * - Q4_K_M (llama_tensor_get_type_impl for LLAMA_FTYPE_MOSTLY_Q4_K_M, a non-Falcon model with
 *   n_expert != 8): output.weight Q6_K; attn_v Q6_K on use_more_bits(i, n_layer) layers (llama.cpp
 *   counts attn_v tensors in file order, which is layer order here); ffn_down(_exps) Q6_K on
 *   use_more_bits layers; everything else (token_embd, attn_q/k/output, ffn_gate/up_exps) Q4_K;
 * - MXFP4_MOE: expert tensors (ne[2] > 1) MXFP4, every other matrix Q8_0 (output included);
 * - Q2_K, Q3_K_M, the i-quant ftypes (iq2_m, iq2_xxs, iq1_s, iq3_xxs) and ud-*: the base type
 *   here, then hm_synth_mix_apply (synth_mix.c) over the whole list. The pure i-quant types
 *   (iq2_xs, iq2_s, iq3_s, iq1_m) are labelled with llama.cpp's ftype of that name. */
static int tensor_type(const hm_synth_mix *m, const hm_synth_preset *p, tkind k, uint32_t n_dims, int layer,
                       int n_layer) {
    if (n_dims < 2 || k == T_FFN_GATE_INP) return HM_TYPE_F32;
    switch (m->kind) {
    case HM_SYNTH_MIX_PURE: return m->base;
    case HM_SYNTH_MIX_MXFP4_MOE: return n_dims == 3 ? HM_TYPE_MXFP4 : HM_TYPE_Q8_0;
    case HM_SYNTH_MIX_Q4_K_M:
        if (k == T_OUTPUT) return HM_TYPE_Q6_K;
        if ((k == T_ATTN_V || k == T_FFN_DOWN_EXPS) && use_more_bits(layer, n_layer)) return HM_TYPE_Q6_K;
        return HM_TYPE_Q4_K;
    default: return m->base; /* the mixes by rules: hm_synth_mix_apply */
    }
}

typedef struct plan {
    hm_synth_tensor *t;
    int64_t n, cap;
    const hm_synth_mix *mix;
    const hm_synth_preset *preset;
    int32_t n_layer;
    float embd_std, output_std; /* the two ends of the network (see synth_scales) */
} plan;

/* Value scales. Matrices are N(0, 0.02^2) (a usual init std) and norms N(1, 0.05^2), except the
 * two ends of the network, which are scaled so that a random model has what comparing engines
 * needs from a trained one: a peaked next-token distribution that small numerical differences
 * (F16 KV, summation order, a near-tie between two experts in the router) rarely reorder.
 *
 * output: the last hidden state h is RMS-normalised and multiplied by output_norm (mean 1, std
 * 0.05), so |h|^2 = n_embd (1 + 0.05^2); a row of iid values of std s gives a logit of std
 * s |h| over the rows. s = SYNTH_LOGIT_STD / sqrt(n_embd) makes the logits' std over the
 * vocabulary SYNTH_LOGIT_STD = 8 (s = 0.177 for n_embd 2048). With 0.02 it was 0.9: a flat
 * distribution (top-1 probability ~1e-4 over 151936 tokens). 8 is above sqrt(2 ln n_vocab) (4.9),
 * so the softmax is carried by its top few tokens (mean top-1 probability ~0.5).
 *
 * token_embd: scaling output alone scales every logit and every engine difference by the same
 * factor, so it cannot change which token wins. What decides that is the relative error of h.
 * The random layers add noise-like vectors to the residual stream, and the engines' rounding
 * differences are a fraction of those vectors (amplified where a tiny difference flips a Q8
 * activation rounding or a near-tie in the router); an embedding that dominates the stream makes
 * them a small fraction of h (in a trained model the hidden state carries a strong signal the
 * same way). One attention block at position 0 (where attention averages nothing) adds a vector
 * of rms 0.02 sqrt(n_q) * 0.02 sqrt(n_embd) (v = W_v x with |x|^2 = n_embd after the norm, then
 * W_o over n_q = n_head * head_dim inputs); an MoE block adds less. token_embd's std is
 * SYNTH_EMBD_RATIO = 32 times that: 37.1 for qwen3-30b-a3b, 3.28 for tiny. Measured on the
 * qwen3-30b-a3b shape, 4 layers, Q4_K_M (llama.cpp F16 KV vs F32 KV, and vs hotmoe): the rms
 * engine difference per logit is 0.016 at ratio 16, 0.010 at 32, 0.0065 at 64 (logit std 8),
 * top-1 agreement ~99 %, ~99.5 %, ~99.5 %; ratio 1 with the old output scale gave 96 %. 32 keeps
 * the layers' share of the logits large enough that a wrong layer still moves them by far more
 * than that (tests/fixtures/llama_q3l4/README.md has the numbers). */
#define SYNTH_WEIGHT_STD 0.02
#define SYNTH_LOGIT_STD 8.0
#define SYNTH_EMBD_RATIO 32.0
static void synth_scales(plan *pl, const hm_synth_preset *p) {
    const double n_q = (double)p->n_head * p->head_dim, w2 = SYNTH_WEIGHT_STD * SYNTH_WEIGHT_STD;
    pl->output_std = (float)(SYNTH_LOGIT_STD / sqrt((double)p->n_embd));
    pl->embd_std = (float)(SYNTH_EMBD_RATIO * w2 * sqrt(n_q * (double)p->n_embd));
}

hm_synth_tensor *hm_synth_push(hm_synth_tensor **tl, int64_t *n, int64_t *cap, const char *name, uint32_t n_dims,
                               int64_t ne0, int64_t ne1, int64_t ne2, hm_err *err) {
    if (*n == *cap) {
        int64_t c = *cap ? *cap * 2 : 64;
        hm_synth_tensor *g = realloc(*tl, (size_t)c * sizeof *g);
        if (!g) {
            hm_errf(err, HM_ERR_NOMEM, "synth: out of memory for the tensor list");
            return NULL;
        }
        *tl = g;
        *cap = c;
    }
    hm_synth_tensor *t = &(*tl)[(*n)++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = n_dims;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = ne2;
    return t;
}

hm_status hm_synth_check_rows(const hm_synth_tensor *t, hm_err *err) {
    int64_t blck = hm_type_get(t->type)->blck_size;
    if (blck <= 0 || t->ne[0] % blck)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "synth: %s has rows of %lld elements, not a multiple of %s's block of %lld",
                       t->name, (long long)t->ne[0], hm_type_name(t->type), (long long)blck);
    return HM_OK;
}

static hm_status add(plan *pl, tkind k, int layer, const char *suffix, uint32_t n_dims, int64_t ne0,
                     int64_t ne1, int64_t ne2, hm_err *err) {
    char name[64];
    if (layer >= 0) snprintf(name, sizeof name, "blk.%d.%s.weight", layer, suffix);
    else snprintf(name, sizeof name, "%s.weight", suffix);
    hm_synth_tensor *t = hm_synth_push(&pl->t, &pl->n, &pl->cap, name, n_dims, ne0, ne1, ne2, err);
    if (!t) return HM_ERR_NOMEM;
    t->type = tensor_type(pl->mix, pl->preset, k, n_dims, layer, pl->n_layer);
    if (hm_synth_mix_by_rules(pl->mix) && t->type != HM_TYPE_F32) t->type = hm_synth_type_fallback(t->type, ne0);
    bool norm = n_dims == 1;
    t->mean = norm ? 1.0f : 0.0f; /* norms near 1, matrices centred */
    t->std = norm ? 0.05f : (float)SYNTH_WEIGHT_STD;
    if (k == T_TOKEN_EMBD) t->std = pl->embd_std;
    if (k == T_OUTPUT) t->std = pl->output_std;
    return hm_synth_check_rows(t, err);
}

hm_status hm_synth_plan(const hm_synth_preset *p, int32_t n_layer, const hm_synth_mix *m,
                        hm_synth_tensor **out, int64_t *n_out, hm_err *err) {
    plan pl = {.mix = m, .preset = p, .n_layer = n_layer};
    synth_scales(&pl, p);
    const int64_t E = p->n_embd, Q = (int64_t)p->n_head * p->head_dim, KV = (int64_t)p->n_head_kv * p->head_dim;
    hm_status st = add(&pl, T_TOKEN_EMBD, -1, "token_embd", 2, E, p->n_vocab, 1, err);
    for (int l = 0; !st && l < n_layer; l++) {
        if (!st) st = add(&pl, T_ATTN_NORM, l, "attn_norm", 1, E, 1, 1, err);
        if (!st) st = add(&pl, T_ATTN_Q, l, "attn_q", 2, E, Q, 1, err);
        if (!st) st = add(&pl, T_ATTN_K, l, "attn_k", 2, E, KV, 1, err);
        if (!st) st = add(&pl, T_ATTN_V, l, "attn_v", 2, E, KV, 1, err);
        if (!st) st = add(&pl, T_ATTN_OUT, l, "attn_output", 2, Q, E, 1, err);
        if (!st) st = add(&pl, T_ATTN_Q_NORM, l, "attn_q_norm", 1, p->head_dim, 1, 1, err);
        if (!st) st = add(&pl, T_ATTN_K_NORM, l, "attn_k_norm", 1, p->head_dim, 1, 1, err);
        if (!st) st = add(&pl, T_FFN_NORM, l, "ffn_norm", 1, E, 1, 1, err);
        if (!st) st = add(&pl, T_FFN_GATE_INP, l, "ffn_gate_inp", 2, E, p->n_expert, 1, err);
        if (!st) st = add(&pl, T_FFN_GATE_EXPS, l, "ffn_gate_exps", 3, E, p->n_ff_exp, p->n_expert, err);
        if (!st) st = add(&pl, T_FFN_UP_EXPS, l, "ffn_up_exps", 3, E, p->n_ff_exp, p->n_expert, err);
        if (!st) st = add(&pl, T_FFN_DOWN_EXPS, l, "ffn_down_exps", 3, p->n_ff_exp, E, p->n_expert, err);
    }
    if (!st) st = add(&pl, T_OUTPUT_NORM, -1, "output_norm", 1, E, 1, 1, err);
    if (!st) st = add(&pl, T_OUTPUT, -1, "output", 2, E, p->n_vocab, 1, err);
    const hm_synth_mix_hp hp = {n_layer, p->n_head / p->n_head_kv, p->n_expert};
    if (!st) st = hm_synth_mix_apply(pl.t, pl.n, m, &hp, err);
    if (st) {
        free(pl.t);
        return st;
    }
    *out = pl.t;
    *n_out = pl.n;
    return HM_OK;
}
