/* synth_deepseek2.c - `hotmoe synth --arch deepseek2`: DeepSeek-V2/V3 presets, tensor plan and arch
 * keys, beside the qwen3moe (synth_plan.c), qwen35moe and gemma4 ones.
 *
 * deepseek-v2-lite: deepseek-ai/DeepSeek-V2-Lite's config.json - hidden_size 2048, 27 layers, 16
 * heads, q_lora_rank null (a plain Wq), kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim
 * 64, v_head_dim 128, n_routed_experts 64, num_experts_per_tok 6, moe_intermediate_size 1408,
 * n_shared_experts 2, first_k_dense_replace 1, intermediate_size 10944, n_group 1, topk_group 1,
 * softmax scoring, norm_topk_prob false, routed_scaling_factor 1.0, vocab_size 102400,
 * max_position_embeddings 163840, rope_theta 10000, YaRN factor 40 over 4096 with mscale =
 * mscale_all_dim = 0.707, rms_norm_eps 1e-6. deepseek-v3: deepseek-ai/DeepSeek-V3's config.json
 * (R1 has the same shapes) - hidden_size 7168, 61 layers (the first 3 dense, intermediate_size
 * 18432), 128 heads, q_lora_rank 1536, kv_lora_rank 512, nope 128, rope 64, v 128, 256 experts of
 * 2048, k 8, 1 shared, sigmoid scores with e_score_correction_bias, n_group 8, topk_group 4,
 * norm_topk_prob true, routed_scaling_factor 2.5, vocab 129280, YaRN factor 40 over 4096 with
 * mscale = mscale_all_dim = 1 (its multi-token-prediction layer is not written). deepseek2-tiny: a few MB with every feature on (a q
 * LoRA, a dense first layer, a shared expert, sigmoid scores with exp_probs_b, 4 groups of which 2
 * are kept, renormalisation, a routed scale, YaRN).
 *
 * Names, shapes and keys: what llama.cpp's converter writes for deepseek2 (its DeepseekV2Model;
 * llama.cpp's src/models/deepseek2.cpp loads them), ne[0] contiguous. Per layer: attn_norm; attn_q
 * {E, n_head (nope + rope)} or attn_q_a {E, q_lora}, attn_q_a_norm {q_lora}, attn_q_b {q_lora,
 * n_head (nope + rope)}; attn_kv_a_mqa {E, kv_lora + rope}, attn_kv_a_norm {kv_lora}; attn_k_b
 * {nope, kv_lora, n_head}, attn_v_b {kv_lora, v_dim, n_head} (kv_b split and k_b transposed, as
 * the converter does for the absorbed form); attn_output {n_head v_dim, E}; ffn_norm; then
 * ffn_gate / ffn_up {E, n_ff}, ffn_down {n_ff, E} on the leading dense layers, else ffn_gate_inp
 * {E, n_expert} (F32), exp_probs_b.bias {n_expert}, ffn_{gate,up}_exps {E, n_ff_exp, n_expert},
 * ffn_down_exps, ffn_{gate,up}_shexp {E, n_ff_exp n_shared}, ffn_down_shexp.
 *
 * Values: synth_plan.c's conventions (matrices std 0.02, norms 1 +- 0.05, output std 8 / sqrt(E),
 * token_embd 32 times one attention block's output at position 0); exp_probs_b std 0.02.
 * Types: --type's base for every matrix (q4_k_m: output Q6_K, the rest Q4_K; not llama-quantize's
 * whole rule set), with llama.cpp's fallback for rows that are not whole blocks (attn_k_b's 128
 * values under a K-quant); 1-D tensors and ffn_gate_inp F32. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../quant/quant.h"
#include "synth_deepseek2.h"

static const hm_synth_ds2 ds2_presets[] = {
    {{"deepseek-v2-lite", "DeepSeek-V2-Lite (hotmoe synth, random weights)", 27, 2048, 16, 1, 192, 64, 6, 1408, 10944,
      102400, 163840, 10000.0f, 1e-6f},
     0, 512, 128, 64, 128, 1, 2, 1, 1, 1, false, false, 1.0f, 40.0f, 4096, 0.707f, 32.0f, 0.02f},
    {{"deepseek-v3", "DeepSeek-V3 (hotmoe synth, random weights)", 61, 7168, 128, 1, 192, 256, 8, 2048, 18432,
      129280, 163840, 10000.0f, 1e-6f},
     1536, 512, 128, 64, 128, 3, 1, 8, 4, 2, true, true, 2.5f, 40.0f, 4096, 1.0f, 32.0f, 0.02f},
    {{"deepseek2-tiny", "tiny deepseek2 (hotmoe synth, random weights)", 3, 128, 4, 1, 64, 16, 4, 64, 256, 512, 4096,
      10000.0f, 1e-6f},
     64, 64, 32, 32, 32, 1, 1, 4, 2, 2, true, true, 2.5f, 4.0f, 32, 1.0f, 32.0f, 0.2f},
};

const hm_synth_ds2 *hm_synth_find_ds2(const char *name) {
    for (size_t i = 0; name && i < sizeof ds2_presets / sizeof ds2_presets[0]; i++)
        if (strcmp(ds2_presets[i].base.name, name) == 0) return &ds2_presets[i];
    return NULL;
}

const char *hm_synth_ds2_names(void) { return "deepseek-v2-lite, deepseek-v3, deepseek2-tiny"; }

typedef struct ds2_plan {
    hm_synth_tensor *t;
    int64_t n, cap;
    const hm_synth_mix *mix;
} ds2_plan;

static hm_status ds2_add(ds2_plan *pl, const char *name, uint32_t n_dims, int64_t ne0, int64_t ne1, int64_t ne2,
                         float mean, float std, hm_err *err) {
    hm_synth_tensor *t = hm_synth_push(&pl->t, &pl->n, &pl->cap, name, n_dims, ne0, ne1, ne2, err);
    if (!t) return HM_ERR_NOMEM;
    const hm_synth_mix *m = pl->mix;
    int ty = m->base;
    if (n_dims < 2 || strstr(name, "ffn_gate_inp")) ty = HM_TYPE_F32;
    else if (m->kind == HM_SYNTH_MIX_MXFP4_MOE) ty = n_dims == 3 && strstr(name, "_exps") ? HM_TYPE_MXFP4 : HM_TYPE_Q8_0;
    else if (m->kind == HM_SYNTH_MIX_Q4_K_M) ty = strcmp(name, "output.weight") == 0 ? HM_TYPE_Q6_K : HM_TYPE_Q4_K;
    else if (m->kind != HM_SYNTH_MIX_PURE && !hm_synth_mix_by_rules(m))
        return hm_errf(err, HM_ERR_UNSUPPORTED, "synth: --type %s is written for qwen3moe only", m->name);
    t->type = n_dims < 2 ? ty : hm_synth_type_fallback(ty, ne0);
    t->mean = mean;
    t->std = std;
    return hm_synth_check_rows(t, err);
}

hm_status hm_synth_plan_ds2(const hm_synth_ds2 *q, int32_t n_layer, const hm_synth_mix *m, hm_synth_tensor **out,
                            int64_t *n_out, hm_err *err) {
    const hm_synth_preset *p = &q->base;
    ds2_plan pl = {.mix = m};
    const int64_t E = p->n_embd, H = p->n_head, X = p->n_expert, F = p->n_ff_exp, qk = (int64_t)q->nope + q->n_rot;
    const float W = 0.02f, N = 0.05f, S = q->score_std;
    const double n_q = (double)H * q->v_dim;
    const float out_std = (float)(8.0 / sqrt((double)E)), embd_std = (float)(q->embd_ratio * W * W * sqrt(n_q * (double)E));
    char n[64];
    hm_status st = ds2_add(&pl, "token_embd.weight", 2, E, p->n_vocab, 1, 0, embd_std, err);
    for (int l = 0; !st && l < n_layer; l++) {
#define ADD(suffix, nd, a, b, c, mean, std) \
    do { if (!st) st = ds2_add(&pl, (snprintf(n, sizeof n, "blk.%d." suffix, l), n), nd, a, b, c, mean, std, err); } while (0)
        ADD("attn_norm.weight", 1, E, 1, 1, 1, N);
        if (q->q_lora > 0) {
            ADD("attn_q_a.weight", 2, E, q->q_lora, 1, 0, W);
            ADD("attn_q_a_norm.weight", 1, q->q_lora, 1, 1, 1, N);
            ADD("attn_q_b.weight", 2, q->q_lora, H * qk, 1, 0, S);
        } else {
            ADD("attn_q.weight", 2, E, H * qk, 1, 0, S);
        }
        ADD("attn_kv_a_mqa.weight", 2, E, q->kv_lora + q->n_rot, 1, 0, S);
        ADD("attn_kv_a_norm.weight", 1, q->kv_lora, 1, 1, 1, N);
        ADD("attn_k_b.weight", 3, q->nope, q->kv_lora, H, 0, S);
        ADD("attn_v_b.weight", 3, q->kv_lora, q->v_dim, H, 0, W);
        ADD("attn_output.weight", 2, H * q->v_dim, E, 1, 0, W);
        ADD("ffn_norm.weight", 1, E, 1, 1, 1, N);
        if (l < q->n_dense) {
            ADD("ffn_gate.weight", 2, E, p->n_ff, 1, 0, W);
            ADD("ffn_up.weight", 2, E, p->n_ff, 1, 0, W);
            ADD("ffn_down.weight", 2, p->n_ff, E, 1, 0, W);
            continue;
        }
        ADD("ffn_gate_inp.weight", 2, E, X, 1, 0, W);
        if (q->probs_b) ADD("exp_probs_b.bias", 1, X, 1, 1, 0, W);
        ADD("ffn_gate_exps.weight", 3, E, F, X, 0, W);
        ADD("ffn_up_exps.weight", 3, E, F, X, 0, W);
        ADD("ffn_down_exps.weight", 3, F, E, X, 0, W);
        if (q->n_shared > 0) {
            ADD("ffn_gate_shexp.weight", 2, E, F * q->n_shared, 1, 0, W);
            ADD("ffn_up_shexp.weight", 2, E, F * q->n_shared, 1, 0, W);
            ADD("ffn_down_shexp.weight", 2, F * q->n_shared, E, 1, 0, W);
        }
#undef ADD
    }
    if (!st) st = ds2_add(&pl, "output_norm.weight", 1, E, 1, 1, 1, N, err);
    if (!st) st = ds2_add(&pl, "output.weight", 2, E, p->n_vocab, 1, 0, out_std, err);
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

hm_status hm_synth_meta_ds2(hm_gguf_writer *w, const hm_synth_ds2 *q, int32_t n_layer, const hm_synth_mix *m) {
    const hm_synth_preset *p = &q->base;
    hm_status st = HM_OK;
#define SET(call) do { if (!st) st = (call); } while (0)
#define A "deepseek2."
    SET(hm_gguf_writer_set_str(w, "general.architecture", "deepseek2"));
    SET(hm_gguf_writer_set_str(w, "general.type", "model"));
    SET(hm_gguf_writer_set_str(w, "general.name", p->model_name));
    SET(hm_gguf_writer_set_u32(w, A "block_count", (uint32_t)n_layer));
    SET(hm_gguf_writer_set_u32(w, A "context_length", (uint32_t)p->n_ctx));
    SET(hm_gguf_writer_set_u32(w, A "embedding_length", (uint32_t)p->n_embd));
    SET(hm_gguf_writer_set_u32(w, A "feed_forward_length", (uint32_t)p->n_ff));
    SET(hm_gguf_writer_set_u32(w, A "attention.head_count", (uint32_t)p->n_head));
    SET(hm_gguf_writer_set_u32(w, A "attention.head_count_kv", 1));
    SET(hm_gguf_writer_set_f32(w, A "rope.freq_base", p->rope_theta));
    SET(hm_gguf_writer_set_f32(w, A "attention.layer_norm_rms_epsilon", p->rms_eps));
    SET(hm_gguf_writer_set_u32(w, A "expert_used_count", (uint32_t)p->n_expert_used));
    if (q->n_group > 1) {
        SET(hm_gguf_writer_set_u32(w, A "expert_group_count", (uint32_t)q->n_group));
        SET(hm_gguf_writer_set_u32(w, A "expert_group_used_count", (uint32_t)q->topk_group));
    }
    SET(hm_gguf_writer_set_u32(w, A "expert_gating_func", (uint32_t)q->gating));
    SET(hm_gguf_writer_set_u32(w, "general.file_type", (uint32_t)m->ftype));
    SET(hm_gguf_writer_set_u32(w, A "leading_dense_block_count", (uint32_t)q->n_dense));
    SET(hm_gguf_writer_set_u32(w, A "vocab_size", (uint32_t)p->n_vocab));
    /* written as 0 without a q LoRA too: llama.cpp requires the key unless the layer count is a
     * V2-Lite one (27), and 0 keeps a `--layers N` V2-Lite file loadable there */
    SET(hm_gguf_writer_set_u32(w, A "attention.q_lora_rank", (uint32_t)q->q_lora));
    SET(hm_gguf_writer_set_u32(w, A "attention.kv_lora_rank", (uint32_t)q->kv_lora));
    SET(hm_gguf_writer_set_u32(w, A "attention.key_length", (uint32_t)(q->kv_lora + q->n_rot)));
    SET(hm_gguf_writer_set_u32(w, A "attention.value_length", (uint32_t)q->kv_lora));
    SET(hm_gguf_writer_set_u32(w, A "attention.key_length_mla", (uint32_t)(q->nope + q->n_rot)));
    SET(hm_gguf_writer_set_u32(w, A "attention.value_length_mla", (uint32_t)q->v_dim));
    SET(hm_gguf_writer_set_u32(w, A "expert_feed_forward_length", (uint32_t)p->n_ff_exp));
    SET(hm_gguf_writer_set_u32(w, A "expert_count", (uint32_t)p->n_expert));
    SET(hm_gguf_writer_set_u32(w, A "expert_shared_count", (uint32_t)q->n_shared));
    SET(hm_gguf_writer_set_f32(w, A "expert_weights_scale", q->wscale));
    if (q->norm) SET(hm_gguf_writer_set_bool(w, A "expert_weights_norm", true));
    SET(hm_gguf_writer_set_u32(w, A "rope.dimension_count", (uint32_t)q->n_rot));
    if (q->yarn_factor > 0) {
        SET(hm_gguf_writer_set_str(w, A "rope.scaling.type", "yarn"));
        SET(hm_gguf_writer_set_f32(w, A "rope.scaling.factor", q->yarn_factor));
        SET(hm_gguf_writer_set_u32(w, A "rope.scaling.original_context_length", (uint32_t)q->yarn_orig));
        SET(hm_gguf_writer_set_f32(w, A "rope.scaling.yarn_log_multiplier", 0.1f * q->mscale_all));
    }
    SET(hm_gguf_writer_set_u32(w, "general.quantization_version", 2));
#undef A
#undef SET
    return st;
}
