/* synth_gemma4.c - `hotmoe synth --arch gemma4`: the Gemma 4 presets, tensor plan, arch keys and
 * built-in vocabulary, beside the qwen3moe (synth_plan.c) and qwen35moe (synth_qwen35.c) ones.
 *
 * Shape of gemma4-26b-a4b: google/gemma-4-26B-A4B's config.json text_config - hidden_size 2816,
 * intermediate_size 2112 (the dense MLP beside the experts), moe_intermediate_size 704,
 * num_experts 128, top_k_experts 8, num_attention_heads 16, num_key_value_heads 8 with head_dim
 * 256 (sliding layers), num_global_key_value_heads 2 with global_head_dim 512 and
 * attention_k_eq_v (global layers), 30 layers with layer_types 5 sliding : 1 full,
 * sliding_window 1024, vocab_size 262144, max_position_embeddings 262144, rope: sliding theta 1e4
 * default, full theta 1e6 proportional with partial_rotary_factor 0.25, rms_norm_eps 1e-6,
 * final_logit_softcapping 30, tied embeddings. Sources: the same numbers in public test fixtures
 * mirroring that config (e.g. a GEMMA4_26B_A4B_TEXT dict and a Swift Gemma4MoE config test, found
 * through the code search), the model card (30 layers, 128 experts k 8, window 1024, 262144
 * vocab), llama.cpp's gemma4 loader (30 layers = LLM_TYPE_26B_A4B) and transformers'
 * configuration_gemma4.py for the key meanings.
 *
 * Names, shapes and keys: what llama.cpp's converter writes for gemma4 (tools/convert_gemma4.py
 * does the same; llama.cpp's src/models/gemma4.cpp loads them), ne[0] contiguous. Per layer:
 * attn_norm; attn_q {E, n_head hd}; attn_k {E, n_kv hd}; attn_v only on sliding layers (global
 * layers: K = V); attn_output {n_head hd, E}; attn_q_norm, attn_k_norm {hd}; post_attention_norm;
 * ffn_norm, ffn_gate, ffn_up {E, n_ff}, ffn_down {n_ff, E}, post_ffw_norm (dense MLP);
 * ffn_gate_inp {E, n_expert} (F32), ffn_gate_inp.scale {E}, pre_ffw_norm_2, post_ffw_norm_1,
 * post_ffw_norm_2, ffn_gate_up_exps {E, 2 n_ff_exp, n_expert} (fused as the converter writes
 * it), ffn_down_exps {n_ff_exp, E, n_expert}, ffn_down_exps.scale {n_expert}; layer_output_scale
 * {1}. Globals: token_embd (tied: no output.weight), rope_freqs {hd_global / 2} (1 for the
 * rotated pairs, 1e30 for the rest: proportional RoPE), output_norm.
 *
 * Values (synth_plan.c's conventions: matrices std 0.02, norms 1 +- 0.05), with what Gemma's
 * structure needs for a peaked, engine-stable next-token distribution:
 *  - token_embd std 8 / sqrt(E): it is also the output matrix (tied), so the logits' std before
 *    the soft-cap is 8 (synth_plan.c's SYNTH_LOGIT_STD); the embedding enters the residual times
 *    sqrt(E), i.e. with rms 8.
 *  - post_attention_norm, post_ffw_norm mean 0.25 (std 5 % of it): each block adds
 *    rmsnorm(.) * w, a vector of rms |w|, so the embedding is 32 times one block's contribution
 *    (synth_plan.c's SYNTH_EMBD_RATIO).
 *  - ffn_gate_inp.scale the constant sqrt(E): the router's input rmsnorm(x) * scale / sqrt(E) is
 *    then rmsnorm(x), and router logits have std ~1 (as qwen3moe synth); being constant keeps the
 *    --routing-profile construction exact (synth_routing.c: ffn_down is zeroed on R too).
 *  - ffn_down_exps.scale, layer_output_scale: 1 +- 0.05.
 *
 * Type mix q4_k_m follows llama-quantize (src/llama-quant.cpp) as it applies to this model:
 * token_embd Q6_K (tied embeddings get the output's type); attn_v Q6_K on use_more_bits of the
 * attn_v count (sliding layers only); ffn_down and ffn_down_exps (both "ffn_down") Q6_K on
 * use_more_bits(layer); everything else Q4_K; 1-D tensors and ffn_gate_inp F32. Rows that are not
 * a multiple of the type's block (ffn_down_exps: 704, ffn_down: 2112 are not multiples of 256)
 * take llama.cpp's fallback: Q2_K, Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0,
 * IQ4_XS -> IQ4_NL (every fallback type has a reference quantiser here). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../quant/quant.h"
#include "synth_gemma4.h"

static const hm_synth_g4 g4_presets[] = {
    {{"gemma4-26b-a4b", "Gemma-4-26B-A4B (hotmoe synth, random weights)", 30, 2816, 16, 2, 512, 128, 8, 704, 2112,
      262144, 262144, 1e6f, 1e-6f},
     256, 8, 1024, 6, 64, 1e4f, 30.0f},
    /* a few MB, same structure: 2 sliding + 1 global per 3 layers, window 16 */
    {{"gemma4-tiny", "tiny gemma4 (hotmoe synth, random weights)", 3, 256, 4, 1, 128, 16, 4, 256, 512, 512, 4096,
      1e6f, 1e-6f},
     64, 2, 16, 3, 16, 1e4f, 30.0f},
};

const hm_synth_g4 *hm_synth_find_g4(const char *name) {
    for (size_t i = 0; name && i < sizeof g4_presets / sizeof g4_presets[0]; i++)
        if (strcmp(g4_presets[i].base.name, name) == 0) return &g4_presets[i];
    return NULL;
}

const char *hm_synth_g4_names(void) { return "gemma4-26b-a4b, gemma4-tiny"; }

bool hm_synth_g4_swa(const hm_synth_g4 *q, int32_t il) { return (il + 1) % q->swa_period != 0; }

static bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

typedef struct g4_plan {
    hm_synth_tensor *t;
    int64_t n, cap;
    const hm_synth_mix *mix;
} g4_plan;

/* more: a tensor llama-quantize gives Q6_K on use_more_bits layers under Q4_K_M */
static int g4_type(g4_plan *pl, const char *name, uint32_t n_dims, int64_t ne0, bool more) {
    const hm_synth_mix *m = pl->mix;
    if (n_dims < 2 || strstr(name, "ffn_gate_inp")) return HM_TYPE_F32;
    int t = m->base;
    switch (m->kind) {
    case HM_SYNTH_MIX_PURE: break;
    case HM_SYNTH_MIX_MXFP4_MOE: t = n_dims == 3 ? HM_TYPE_MXFP4 : HM_TYPE_Q8_0; break;
    case HM_SYNTH_MIX_Q4_K_M:
        t = strcmp(name, "token_embd.weight") == 0 || more ? HM_TYPE_Q6_K : HM_TYPE_Q4_K;
        break;
    default: break; /* the mixes by rules: the base type; hm_synth_mix_apply sets them */
    }
    return hm_synth_type_fallback(t, ne0);
}

static hm_status g4_add(g4_plan *pl, const char *name, uint32_t n_dims, int64_t ne0, int64_t ne1, int64_t ne2,
                        float mean, float std, bool more, hm_err *err) {
    hm_synth_tensor *t = hm_synth_push(&pl->t, &pl->n, &pl->cap, name, n_dims, ne0, ne1, ne2, err);
    if (!t) return HM_ERR_NOMEM;
    t->type = g4_type(pl, name, n_dims, ne0, more);
    if (t->type < 0) return hm_errf(err, HM_ERR_UNSUPPORTED, "synth: --type %s is written for qwen3moe only", pl->mix->name);
    t->mean = mean;
    t->std = std;
    return hm_synth_check_rows(t, err);
}

hm_status hm_synth_plan_g4(const hm_synth_g4 *q, int32_t n_layer, const hm_synth_mix *m, hm_synth_tensor **out,
                           int64_t *n_out, hm_err *err) {
    const hm_synth_preset *p = &q->base;
    g4_plan pl = {.mix = m};
    const int64_t E = p->n_embd, F = p->n_ff_exp, X = p->n_expert;
    const float W = 0.02f, N = 0.05f, POST = 0.25f;
    const float embd_std = (float)(8.0 / sqrt((double)E)), router_scale = (float)sqrt((double)E);
    int n_v = 0; /* attn_v tensors: sliding layers */
    for (int l = 0; l < n_layer; l++) n_v += hm_synth_g4_swa(q, l);
    char n[64];
    hm_status st = g4_add(&pl, "token_embd.weight", 2, E, p->n_vocab, 1, 0, embd_std, false, err);
    bool any_global = false;
    for (int l = 0; l < n_layer; l++) any_global |= !hm_synth_g4_swa(q, l);
    if (!st && any_global) {
        st = g4_add(&pl, "rope_freqs.weight", 1, p->head_dim / 2, 1, 1, 0, 0, false, err);
        if (!st) pl.t[pl.n - 1].rope_pairs = q->n_rot_pairs;
    }
    for (int l = 0, iv = 0; !st && l < n_layer; l++) {
        const bool swa = hm_synth_g4_swa(q, l), mb = use_more_bits(l, n_layer);
        const int64_t hd = swa ? q->hd_swa : p->head_dim, kv = swa ? q->n_head_kv_swa : p->n_head_kv;
        const int64_t Q = (int64_t)p->n_head * hd;
        const bool q4km = m->kind == HM_SYNTH_MIX_Q4_K_M;
#define T(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, l), n)
#define ADD(suffix, nd, a, b, c, mean, std, more) \
    do { if (!st) st = g4_add(&pl, T(suffix), nd, a, b, c, mean, std, q4km && (more), err); } while (0)
        ADD("attn_norm.weight", 1, E, 1, 1, 1, N, false);
        ADD("attn_q.weight", 2, E, Q, 1, 0, W, false);
        ADD("attn_k.weight", 2, E, kv * hd, 1, 0, W, false);
        if (swa) {
            const bool mv = use_more_bits(iv++, n_v);
            ADD("attn_v.weight", 2, E, kv * hd, 1, 0, W, mv);
        }
        ADD("attn_output.weight", 2, Q, E, 1, 0, W, false);
        ADD("attn_q_norm.weight", 1, hd, 1, 1, 1, N, false);
        ADD("attn_k_norm.weight", 1, hd, 1, 1, 1, N, false);
        ADD("post_attention_norm.weight", 1, E, 1, 1, POST, POST * N, false);
        ADD("ffn_norm.weight", 1, E, 1, 1, 1, N, false);
        ADD("ffn_gate.weight", 2, E, p->n_ff, 1, 0, W, false);
        ADD("ffn_up.weight", 2, E, p->n_ff, 1, 0, W, false);
        ADD("ffn_down.weight", 2, p->n_ff, E, 1, 0, W, mb);
        ADD("post_ffw_norm.weight", 1, E, 1, 1, POST, POST * N, false);
        ADD("ffn_gate_inp.weight", 2, E, X, 1, 0, W, false);
        ADD("ffn_gate_inp.scale", 1, E, 1, 1, router_scale, 0, false);
        ADD("pre_ffw_norm_2.weight", 1, E, 1, 1, 1, N, false);
        ADD("post_ffw_norm_1.weight", 1, E, 1, 1, 1, N, false);
        ADD("post_ffw_norm_2.weight", 1, E, 1, 1, 1, N, false);
        ADD("ffn_gate_up_exps.weight", 3, E, 2 * F, X, 0, W, false);
        ADD("ffn_down_exps.weight", 3, F, E, X, 0, W, mb);
        ADD("ffn_down_exps.scale", 1, X, 1, 1, 1, N, false);
        ADD("layer_output_scale.weight", 1, 1, 1, 1, 1, N, false);
#undef ADD
#undef T
    }
    if (!st) st = g4_add(&pl, "output_norm.weight", 1, E, 1, 1, 1, N, false, err);
    const hm_synth_mix_hp hp = {n_layer, p->n_head / q->n_head_kv_swa, p->n_expert} /* layer 0 slides */;
    if (!st) st = hm_synth_mix_apply(pl.t, pl.n, m, &hp, err);
    if (st) {
        free(pl.t);
        return st;
    }
    *out = pl.t;
    *n_out = pl.n;
    return HM_OK;
}

hm_status hm_synth_meta_g4(hm_gguf_writer *w, const hm_synth_g4 *q, int32_t n_layer, const hm_synth_mix *m) {
    const hm_synth_preset *p = &q->base;
    hm_status st = HM_OK;
    int32_t *kv = malloc((size_t)n_layer * sizeof *kv);
    uint8_t *swa = malloc((size_t)n_layer);
    if (!kv || !swa) {
        free(kv);
        free(swa);
        return HM_ERR_NOMEM;
    }
    for (int32_t l = 0; l < n_layer; l++) {
        swa[l] = hm_synth_g4_swa(q, l);
        kv[l] = swa[l] ? q->n_head_kv_swa : p->n_head_kv;
    }
#define SET(call) do { if (!st) st = (call); } while (0)
#define A "gemma4."
    SET(hm_gguf_writer_set_str(w, "general.architecture", "gemma4"));
    SET(hm_gguf_writer_set_str(w, "general.type", "model"));
    SET(hm_gguf_writer_set_str(w, "general.name", p->model_name));
    SET(hm_gguf_writer_set_u32(w, A "block_count", (uint32_t)n_layer));
    SET(hm_gguf_writer_set_u32(w, A "context_length", (uint32_t)p->n_ctx));
    SET(hm_gguf_writer_set_u32(w, A "embedding_length", (uint32_t)p->n_embd));
    SET(hm_gguf_writer_set_u32(w, A "feed_forward_length", (uint32_t)p->n_ff));
    SET(hm_gguf_writer_set_u32(w, A "attention.head_count", (uint32_t)p->n_head));
    SET(hm_gguf_writer_set_arr(w, A "attention.head_count_kv", HM_GGUF_I32, kv, (uint64_t)n_layer));
    SET(hm_gguf_writer_set_f32(w, A "rope.freq_base", p->rope_theta));
    SET(hm_gguf_writer_set_f32(w, A "rope.freq_base_swa", q->rope_theta_swa));
    SET(hm_gguf_writer_set_f32(w, A "attention.layer_norm_rms_epsilon", p->rms_eps));
    SET(hm_gguf_writer_set_u32(w, A "expert_count", (uint32_t)p->n_expert));
    SET(hm_gguf_writer_set_u32(w, A "expert_used_count", (uint32_t)p->n_expert_used));
    SET(hm_gguf_writer_set_u32(w, A "attention.key_length", (uint32_t)p->head_dim));
    SET(hm_gguf_writer_set_u32(w, A "attention.value_length", (uint32_t)p->head_dim));
    SET(hm_gguf_writer_set_u32(w, A "attention.key_length_swa", (uint32_t)q->hd_swa));
    SET(hm_gguf_writer_set_u32(w, A "attention.value_length_swa", (uint32_t)q->hd_swa));
    SET(hm_gguf_writer_set_u32(w, "general.file_type", (uint32_t)m->ftype));
    SET(hm_gguf_writer_set_u32(w, "general.quantization_version", 2));
    SET(hm_gguf_writer_set_f32(w, A "final_logit_softcapping", q->softcap));
    SET(hm_gguf_writer_set_u32(w, A "attention.sliding_window", (uint32_t)q->window));
    SET(hm_gguf_writer_set_u32(w, A "attention.shared_kv_layers", 0));
    SET(hm_gguf_writer_set_u32(w, A "embedding_length_per_layer_input", 0));
    SET(hm_gguf_writer_set_arr(w, A "attention.sliding_window_pattern", HM_GGUF_BOOL, swa, (uint64_t)n_layer));
    SET(hm_gguf_writer_set_u32(w, A "expert_feed_forward_length", (uint32_t)p->n_ff_exp));
    SET(hm_gguf_writer_set_u32(w, A "rope.dimension_count", (uint32_t)p->head_dim));
    SET(hm_gguf_writer_set_u32(w, A "rope.dimension_count_swa", (uint32_t)q->hd_swa));
#undef A
#undef SET
    free(kv);
    free(swa);
    return st;
}

/* ---- built-in vocabulary ----
 * What llama.cpp's gemma4 tokenizer needs (tokenizer.ggml.model "gemma4": BPE over raw UTF-8 with
 * spaces as U+2581, byte fallback through <0xXX> tokens), laid out as Gemma's vocabulary is:
 *   0 <pad>, 1 <eos>, 2 <bos>, 3 <unk>, 4 <mask>, 5 <|turn>, 6 <turn|> (control; <mask> user-defined)
 *   7..262     <0x00>..<0xFF> (type byte)
 *   then       U+2581, a-z, A-Z, 0-9, punctuation, "\n", "\n\n" (normal)
 *   then       one token per merge below, in merge order (normal)
 *   up to n_vocab "<unusedN>" (type unused).
 * bos 2, eos 1, unk 3, pad 0; add_bos true, add_space_prefix false (as the converter writes). */

#define SP "\xe2\x96\x81" /* U+2581, SentencePiece's space */
static const char *const g4_merges[][2] = {
    {SP, "t"}, {"h", "e"}, {"i", "n"}, {SP, "a"}, {"r", "e"}, {"o", "n"},
    {SP "t", "he"}, {"e", "r"}, {SP, "s"}, {"a", "t"}, {SP, "w"},
    {SP, "o"}, {"e", "n"}, {"i", "t"}, {"i", "s"}, {"a", "n"}, {"o", "r"}, {"e", "s"},
    {"in", "g"}, {SP "a", "n"}, {SP "an", "d"}, {SP, "is"}, {"l", "l"},
    {SP, SP},
};
#define G4_N_MERGES ((int32_t)(sizeof g4_merges / sizeof g4_merges[0]))

static const char g4_template[] =
    "{{ bos_token }}{% for message in messages %}<|turn>{{ 'model' if message['role'] == 'assistant' else "
    "message['role'] }}\n{{ message['content'] | trim }}<turn|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|turn>model\n{% endif %}";

hm_status hm_synth_vocab_g4(hm_gguf_writer *w, int32_t n_vocab, hm_err *err) {
    enum { NORMAL = 1, UNKNOWN = 2, CONTROL = 3, USER = 4, UNUSED = 5, BYTE = 6 };
    static const char *const specials[] = {"<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<|turn>", "<turn|>"};
    static const int spec_type[] = {CONTROL, CONTROL, CONTROL, UNKNOWN, USER, CONTROL, CONTROL};
    static const char punct[] = ".,!?'\"-:;()";
    const int32_t n_chars = 1 + 26 + 26 + 10 + (int32_t)strlen(punct) + 2;
    const int32_t n_real = 7 + 256 + n_chars + G4_N_MERGES;
    if (n_vocab < n_real)
        return hm_errf(err, HM_ERR_ARG, "synth: n_vocab %d is smaller than the built-in vocabulary (%d)", n_vocab, n_real);
    char **tok = calloc((size_t)n_vocab, sizeof *tok);
    int32_t *type = calloc((size_t)n_vocab, sizeof *type);
    float *score = calloc((size_t)n_vocab, sizeof *score);
    char **merge = calloc(G4_N_MERGES, sizeof *merge);
    hm_status st = HM_OK;
    int32_t n = 0;
    if (!tok || !type || !score || !merge) goto oom;
    char buf[64];
#define PUT(s, ty) do { if (!(tok[n] = strdup(s))) goto oom; type[n++] = (ty); } while (0)
    for (int i = 0; i < 7; i++) PUT(specials[i], spec_type[i]);
    for (int b = 0; b < 256; b++) {
        snprintf(buf, sizeof buf, "<0x%02X>", b);
        PUT(buf, BYTE);
    }
    PUT("\xe2\x96\x81", NORMAL);
    for (char c = 'a'; c <= 'z'; c++) { buf[0] = c, buf[1] = 0; PUT(buf, NORMAL); }
    for (char c = 'A'; c <= 'Z'; c++) { buf[0] = c, buf[1] = 0; PUT(buf, NORMAL); }
    for (char c = '0'; c <= '9'; c++) { buf[0] = c, buf[1] = 0; PUT(buf, NORMAL); }
    for (const char *c = punct; *c; c++) { buf[0] = *c, buf[1] = 0; PUT(buf, NORMAL); }
    PUT("\n", NORMAL);
    PUT("\n\n", NORMAL);
    for (int32_t i = 0; i < G4_N_MERGES; i++) {
        snprintf(buf, sizeof buf, "%s %s", g4_merges[i][0], g4_merges[i][1]);
        if (!(merge[i] = strdup(buf))) goto oom;
        snprintf(buf, sizeof buf, "%s%s", g4_merges[i][0], g4_merges[i][1]);
        PUT(buf, NORMAL);
    }
    for (int32_t u = 0; n < n_vocab; u++) {
        snprintf(buf, sizeof buf, "<unused%d>", u);
        PUT(buf, UNUSED);
    }
#undef PUT
#define SET(call) do { if (!st) st = (call); } while (0)
    SET(hm_gguf_writer_set_str(w, "tokenizer.ggml.model", "gemma4"));
    SET(hm_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tok, (uint64_t)n));
    SET(hm_gguf_writer_set_arr(w, "tokenizer.ggml.scores", HM_GGUF_F32, score, (uint64_t)n));
    SET(hm_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", HM_GGUF_I32, type, (uint64_t)n));
    SET(hm_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merge, G4_N_MERGES));
    SET(hm_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 2));
    SET(hm_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 1));
    SET(hm_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 3));
    SET(hm_gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", 0));
    SET(hm_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true));
    SET(hm_gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", false));
    SET(hm_gguf_writer_set_str(w, "tokenizer.chat_template", g4_template));
#undef SET
    goto done;
oom:
    st = hm_errf(err, HM_ERR_NOMEM, "synth: out of memory building the vocabulary");
done:
    for (int32_t i = 0; tok && i < n; i++) free(tok[i]);
    for (int32_t i = 0; merge && i < G4_N_MERGES; i++) free(merge[i]);
    free(tok);
    free(type);
    free(score);
    free(merge);
    return st;
}
