/* synth_moe_archs.c - `hotmoe synth --arch glm4moe | olmoe | llama`: presets, tensor plans and arch
 * keys of GLM-4.5, OLMoE and Mixtral (GGUF arch "llama" with experts), beside the qwen3moe
 * (synth_plan.c), qwen35moe and gemma4 ones. Vocabulary: the built-in byte-level BPE
 * (synth_vocab.c).
 *
 * Shapes (config.json of each; the preset's real shape is the default, --layers overrides):
 *  - glm4.5-air: zai-org/GLM-4.5-Air - hidden 4096, 46 layers (+1 NextN: block_count 47), 96 heads,
 *    8 KV heads, head_dim 128, partial_rotary_factor 0.5 (64 rotated dims), intermediate 10944
 *    (the first_k_dense_replace = 1 dense layer), moe_intermediate 1408, 128 routed experts k 8,
 *    1 shared expert, n_group 1, norm_topk_prob, routed_scaling_factor 1, attention_bias, no qk
 *    norm, rope_theta 1e6, rms 1e-5, vocab 151552, 131072 positions.
 *  - olmoe-1b-7b: allenai/OLMoE-1B-7B-0924 - hidden 2048, 16 layers, 16 heads (no GQA), head 128,
 *    intermediate 1024 per expert, 64 experts k 8, no renormalisation, rope 1e4, rms 1e-5 (the
 *    converter writes 1e-5), vocab 50304, 4096 positions.
 *  - mixtral-8x7b: mistralai/Mixtral-8x7B-v0.1 - hidden 4096, 32 layers, 32 heads / 8 KV, head 128,
 *    intermediate 14336 per expert, 8 experts k 2, rope 1e6, rms 1e-5, vocab 32000, 32768 positions.
 *  - the -tiny presets: a few MB with every feature of the arch switched on (glm4moe-tiny: a dense
 *    layer, a shared expert, biases, q/k norms, partial RoPE, 4 groups of which 2 are kept, routed
 *    scale 2.5, a NextN layer).
 *
 * Names and shapes: llama.cpp's loaders (src/models/glm4-moe.cpp, olmoe.cpp, llama.cpp), ne[0]
 * contiguous. glm4moe per layer: attn_norm, attn_q/k/v {E, n_head hd / n_kv hd} + .bias,
 * attn_output, attn_q_norm / attn_k_norm {hd}, post_attention_norm; dense layers ffn_gate / ffn_up
 * {E, n_ff}, ffn_down; MoE layers ffn_gate_inp {E, n_expert}, exp_probs_b.bias {n_expert},
 * ffn_{gate,up}_exps {E, n_ff_exp, n_expert}, ffn_down_exps, ffn_{gate,up,down}_shexp; the NextN
 * layers the same plus nextn.eh_proj {2E, E}, nextn.enorm, nextn.hnorm, nextn.shared_head_norm.
 * olmoe: attn_q_norm {n_head hd}, attn_k_norm {n_kv hd} (whole-projection norms), ffn_norm.
 * llama: no q/k norms, ffn_norm.
 *
 * Values: synth_plan.c's conventions (matrices std 0.02, norms 1 +- 0.05, token_embd and output
 * scaled for a peaked next-token distribution); biases std 0.02; exp_probs_b std 0.05 (it moves
 * the choice without deciding it alone). Type mixes: pure types, mxfp4 (experts MXFP4, other
 * matrices Q8_0) and q4_k_m as synth_plan.c applies llama-quantize's rules (output Q6_K; attn_v
 * and the ffn_down tensors Q6_K on use_more_bits layers; with 8 experts, llama.cpp's Mixtral
 * rules: attn_v and attn_k Q8_0, attn_output Q5_K), and llama.cpp's fallback types for rows that
 * are not whole K-quant blocks (GLM-4.5-Air's 1408: Q4_K -> Q5_0, Q6_K -> Q8_0). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../quant/quant.h"
#include "synth_moe_archs.h"

#define GLM HM_SYNTH_MA_GLM4MOE
#define OLM HM_SYNTH_MA_OLMOE
#define LLA HM_SYNTH_MA_LLAMA

/* base: name, model_name, n_layer, n_embd, n_head, n_head_kv, head_dim, n_expert, k, n_ff_exp, n_ff,
 * n_vocab, n_ctx, theta, eps */
static const hm_synth_ma ma_presets[] = {
    {{"glm4.5-air", "GLM-4.5-Air (hotmoe synth, random weights)", 46, 4096, 96, 8, 128, 128, 8, 1408, 10944, 151552,
      131072, 1e6f, 1e-5f},
     GLM, 64, 1, 1, 1, 0, 0, 1.0f, false, true},
    {{"glm4moe-tiny", "tiny glm4moe (hotmoe synth, random weights)", 3, 256, 4, 2, 64, 16, 4, 256, 512, 384, 4096,
      1e6f, 1e-5f},
     GLM, 32, 1, 1, 1, 4, 2, 2.5f, true, true},
    {{"olmoe-1b-7b", "OLMoE-1B-7B (hotmoe synth, random weights)", 16, 2048, 16, 16, 128, 64, 8, 1024, 1024, 50304,
      4096, 1e4f, 1e-5f},
     OLM, 128, 0, 0, 0, 0, 0, 0.0f, true, false},
    {{"olmoe-tiny", "tiny olmoe (hotmoe synth, random weights)", 3, 256, 4, 4, 64, 16, 4, 256, 256, 384, 4096, 1e4f,
      1e-5f},
     OLM, 64, 0, 0, 0, 0, 0, 0.0f, true, false},
    {{"mixtral-8x7b", "Mixtral-8x7B (hotmoe synth, random weights)", 32, 4096, 32, 8, 128, 8, 2, 14336, 14336, 32000,
      32768, 1e6f, 1e-5f},
     LLA, 128, 0, 0, 0, 0, 0, 0.0f, false, false},
    {{"mixtral-tiny", "tiny mixtral (hotmoe synth, random weights)", 3, 256, 4, 2, 64, 8, 2, 256, 256, 384, 4096,
      1e6f, 1e-5f},
     LLA, 64, 0, 0, 0, 0, 0, 0.0f, false, false},
};

static const char *const arch_names[] = {"glm4moe", "olmoe", "llama"};

bool hm_synth_is_ma(const char *arch) {
    for (int i = 0; arch && i < 3; i++)
        if (strcmp(arch, arch_names[i]) == 0) return true;
    return false;
}

const hm_synth_ma *hm_synth_find_ma(const char *arch, const char *name) {
    for (size_t i = 0; arch && name && i < sizeof ma_presets / sizeof ma_presets[0]; i++)
        if (strcmp(arch_names[ma_presets[i].arch], arch) == 0 && strcmp(ma_presets[i].base.name, name) == 0)
            return &ma_presets[i];
    return NULL;
}

const char *hm_synth_ma_names(const char *arch) {
    if (arch && strcmp(arch, "glm4moe") == 0) return "glm4.5-air, glm4moe-tiny";
    if (arch && strcmp(arch, "olmoe") == 0) return "olmoe-1b-7b, olmoe-tiny";
    return "mixtral-8x7b, mixtral-tiny";
}

static bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

typedef struct ma_plan {
    hm_synth_tensor *t;
    int64_t n, cap;
    const hm_synth_mix *mix;
    const hm_synth_ma *q;
    int32_t n_layer; /* layers the forward runs (use_more_bits counts over them) */
} ma_plan;

static int ma_type(const ma_plan *pl, const char *name, uint32_t n_dims, int64_t ne0, int layer) {
    const hm_synth_mix *m = pl->mix;
    if (n_dims < 2 || strstr(name, "ffn_gate_inp")) return HM_TYPE_F32;
    int t = m->base;
    const bool e8 = pl->q->base.n_expert == 8;
    switch (m->kind) {
    case HM_SYNTH_MIX_PURE: break;
    case HM_SYNTH_MIX_MXFP4_MOE: t = n_dims == 3 ? HM_TYPE_MXFP4 : HM_TYPE_Q8_0; break;
    case HM_SYNTH_MIX_Q4_K_M:
        t = HM_TYPE_Q4_K;
        if (strcmp(name, "output.weight") == 0) t = HM_TYPE_Q6_K;
        else if (strstr(name, "attn_v.") && e8) t = HM_TYPE_Q8_0;
        else if (strstr(name, "attn_k.") && e8) t = HM_TYPE_Q8_0;
        else if (strstr(name, "attn_output.") && e8) t = HM_TYPE_Q5_K;
        else if ((strstr(name, "attn_v.") || strstr(name, "ffn_down")) && layer >= 0 &&
                 use_more_bits(layer < pl->n_layer ? layer : pl->n_layer - 1, pl->n_layer))
            t = HM_TYPE_Q6_K;
        break;
    default:
        if (!hm_synth_mix_by_rules(m)) return -1;
        break; /* the base type; hm_synth_mix_apply sets the mix */
    }
    return hm_synth_type_fallback(t, ne0);
}

static hm_status ma_add(ma_plan *pl, int layer, const char *name, uint32_t n_dims, int64_t ne0, int64_t ne1,
                        int64_t ne2, float mean, float std, hm_err *err) {
    hm_synth_tensor *t = hm_synth_push(&pl->t, &pl->n, &pl->cap, name, n_dims, ne0, ne1, ne2, err);
    if (!t) return HM_ERR_NOMEM;
    t->type = ma_type(pl, name, n_dims, ne0, layer);
    if (t->type < 0)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "synth: --type %s follows llama-quantize's rules for qwen3moe only",
                       pl->mix->name);
    t->mean = mean;
    t->std = std;
    return hm_synth_check_rows(t, err);
}

hm_status hm_synth_plan_ma(const hm_synth_ma *q, int32_t n_layer, const hm_synth_mix *m, hm_synth_tensor **out,
                           int64_t *n_out, hm_err *err) {
    const hm_synth_preset *p = &q->base;
    ma_plan pl = {.mix = m, .q = q, .n_layer = n_layer};
    const int64_t E = p->n_embd, hd = p->head_dim, Q = (int64_t)p->n_head * hd, KV = (int64_t)p->n_head_kv * hd;
    const int64_t X = p->n_expert, F = q->arch == GLM ? p->n_ff_exp : p->n_ff;
    const float W = 0.02f, N = 0.05f;
    /* synth_plan.c's synth_scales: the logits' std 8, the embedding 32 times an attention block */
    const float out_std = (float)(8.0 / sqrt((double)E)), embd_std = (float)(32.0 * W * W * sqrt((double)Q * E));
    const int32_t n_all = n_layer + (q->arch == GLM ? q->n_nextn : 0);
    char n[80];
    hm_status st = ma_add(&pl, -1, "token_embd.weight", 2, E, p->n_vocab, 1, 0, embd_std, err);
    for (int l = 0; !st && l < n_all; l++) {
#define ADD(suffix, nd, a, b, c, mean, std) \
    do { if (!st) st = ma_add(&pl, l, (snprintf(n, sizeof n, "blk.%d." suffix, l), n), nd, a, b, c, mean, std, err); } while (0)
        ADD("attn_norm.weight", 1, E, 1, 1, 1, N);
        ADD("attn_q.weight", 2, E, Q, 1, 0, W);
        ADD("attn_k.weight", 2, E, KV, 1, 0, W);
        ADD("attn_v.weight", 2, E, KV, 1, 0, W);
        if (q->qkv_bias) {
            ADD("attn_q.bias", 1, Q, 1, 1, 0, W);
            ADD("attn_k.bias", 1, KV, 1, 1, 0, W);
            ADD("attn_v.bias", 1, KV, 1, 1, 0, W);
        }
        ADD("attn_output.weight", 2, Q, E, 1, 0, W);
        if (q->qk_norm) {
            ADD("attn_q_norm.weight", 1, q->arch == OLM ? Q : hd, 1, 1, 1, N);
            ADD("attn_k_norm.weight", 1, q->arch == OLM ? KV : hd, 1, 1, 1, N);
        }
        if (q->arch == GLM) ADD("post_attention_norm.weight", 1, E, 1, 1, 1, N);
        else ADD("ffn_norm.weight", 1, E, 1, 1, 1, N);
        if (q->arch == GLM && l < q->n_dense) {
            ADD("ffn_gate.weight", 2, E, p->n_ff, 1, 0, W);
            ADD("ffn_up.weight", 2, E, p->n_ff, 1, 0, W);
            ADD("ffn_down.weight", 2, p->n_ff, E, 1, 0, W);
        } else {
            ADD("ffn_gate_inp.weight", 2, E, X, 1, 0, W);
            if (q->arch == GLM) ADD("exp_probs_b.bias", 1, X, 1, 1, 0, N);
            ADD("ffn_gate_exps.weight", 3, E, F, X, 0, W);
            ADD("ffn_up_exps.weight", 3, E, F, X, 0, W);
            ADD("ffn_down_exps.weight", 3, F, E, X, 0, W);
            if (q->arch == GLM) {
                const int64_t S = F * q->n_shared;
                ADD("ffn_gate_shexp.weight", 2, E, S, 1, 0, W);
                ADD("ffn_up_shexp.weight", 2, E, S, 1, 0, W);
                ADD("ffn_down_shexp.weight", 2, S, E, 1, 0, W);
            }
        }
        if (l >= n_layer) { /* glm4moe's NextN layer: loaded by llama.cpp, run by neither engine */
            ADD("nextn.eh_proj.weight", 2, 2 * E, E, 1, 0, W);
            ADD("nextn.enorm.weight", 1, E, 1, 1, 1, N);
            ADD("nextn.hnorm.weight", 1, E, 1, 1, 1, N);
            ADD("nextn.shared_head_norm.weight", 1, E, 1, 1, 1, N);
        }
#undef ADD
    }
    if (!st) st = ma_add(&pl, -1, "output_norm.weight", 1, E, 1, 1, 1, N, err);
    if (!st) st = ma_add(&pl, -1, "output.weight", 2, E, p->n_vocab, 1, 0, out_std, err);
    const hm_synth_mix_hp hp = {n_all, p->n_head / p->n_head_kv, p->n_expert};
    if (!st) st = hm_synth_mix_apply(pl.t, pl.n, m, &hp, err);
    if (st) {
        free(pl.t);
        return st;
    }
    *out = pl.t;
    *n_out = pl.n;
    return HM_OK;
}

hm_status hm_synth_meta_ma(hm_gguf_writer *w, const hm_synth_ma *q, int32_t n_layer, const hm_synth_mix *m) {
    const hm_synth_preset *p = &q->base;
    const char *a = arch_names[q->arch];
    hm_status st = HM_OK;
    char k[96];
#define KEY(s) (snprintf(k, sizeof k, "%s." s, a), k)
#define SET(call) do { if (!st) st = (call); } while (0)
    SET(hm_gguf_writer_set_str(w, "general.architecture", a));
    SET(hm_gguf_writer_set_str(w, "general.type", "model"));
    SET(hm_gguf_writer_set_str(w, "general.name", p->model_name));
    SET(hm_gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)(n_layer + (q->arch == GLM ? q->n_nextn : 0))));
    SET(hm_gguf_writer_set_u32(w, KEY("context_length"), (uint32_t)p->n_ctx));
    SET(hm_gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)p->n_embd));
    SET(hm_gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)p->n_ff));
    SET(hm_gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)p->n_head));
    SET(hm_gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)p->n_head_kv));
    SET(hm_gguf_writer_set_f32(w, KEY("rope.freq_base"), p->rope_theta));
    SET(hm_gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), p->rms_eps));
    SET(hm_gguf_writer_set_u32(w, KEY("expert_count"), (uint32_t)p->n_expert));
    SET(hm_gguf_writer_set_u32(w, KEY("expert_used_count"), (uint32_t)p->n_expert_used));
    if (p->head_dim != p->n_embd / p->n_head) {
        SET(hm_gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)p->head_dim));
        SET(hm_gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)p->head_dim));
    }
    if (q->arch == LLA) SET(hm_gguf_writer_set_u32(w, KEY("vocab_size"), (uint32_t)p->n_vocab));
    SET(hm_gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)q->n_rot));
    if (q->arch == GLM) {
        if (q->n_group > 1) {
            SET(hm_gguf_writer_set_u32(w, KEY("expert_group_count"), (uint32_t)q->n_group));
            SET(hm_gguf_writer_set_u32(w, KEY("expert_group_used_count"), (uint32_t)q->topk_group));
        }
        SET(hm_gguf_writer_set_u32(w, KEY("expert_feed_forward_length"), (uint32_t)p->n_ff_exp));
        SET(hm_gguf_writer_set_u32(w, KEY("expert_shared_count"), (uint32_t)q->n_shared));
        SET(hm_gguf_writer_set_u32(w, KEY("leading_dense_block_count"), (uint32_t)q->n_dense));
        SET(hm_gguf_writer_set_u32(w, KEY("expert_gating_func"), 2)); /* sigmoid */
        SET(hm_gguf_writer_set_f32(w, KEY("expert_weights_scale"), q->routed_scale));
        SET(hm_gguf_writer_set_bool(w, KEY("expert_weights_norm"), true));
        SET(hm_gguf_writer_set_u32(w, KEY("nextn_predict_layers"), (uint32_t)q->n_nextn));
    }
    SET(hm_gguf_writer_set_u32(w, "general.file_type", (uint32_t)m->ftype));
    SET(hm_gguf_writer_set_u32(w, "general.quantization_version", 2));
#undef SET
#undef KEY
    return st;
}
