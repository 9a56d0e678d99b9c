/* synth_deepseek4.c - `hotmoe synth --arch deepseek4`: the DeepSeek-V4 presets, tensor plan and
 * arch keys, beside the qwen3moe, qwen35moe and gemma4 ones.
 *
 * Shape of deepseek-v4-flash: DeepSeek-V4-Flash's config.json as public configs mirroring it
 * give it (found through the code search): 43 layers, hidden 4096, 64 heads of head_dim 512 with
 * one shared K=V head, qk_rope_head_dim 64, q_lora_rank 1024, o_groups 8, o_lora_rank 1024,
 * sliding_window 128, compress_ratios 0, 0 then 4, 128 alternating, index_n_heads 64,
 * index_head_dim 128, index_topk 512, hc_mult 4, hc_sinkhorn_iters 20, hc_eps 1e-6, 256 routed
 * experts top-6 + 1 shared of moe_intermediate_size 2048, routed_scaling_factor 1.5,
 * sqrtsoftplus scoring with a bias, norm_topk_prob, num_hash_layers 3, swiglu_limit 10,
 * rope_theta 10000, compress_rope_theta 160000, rms_norm_eps 1e-6, vocab 129280, and YaRN (factor 16,
 * original_max_position_embeddings 65536, beta 32 / 1) as rope.scaling.* keys: llama.cpp applies it
 * to the compressed layers only (the others keep plain RoPE at rope.freq_base).
 *
 * Names, shapes and keys: what llama.cpp's converter writes for deepseek4 (its loader in
 * src/llama-model.cpp / src/models/deepseek4.cpp reads them), ne[0] contiguous. Per layer:
 * attn_norm {E}; attn_sinks {n_head}; attn_q_a {E, q_lora}; attn_q_a_norm {q_lora}; attn_q_b
 * {q_lora, n_head hd}; attn_kv {E, hd}; attn_kv_a_norm {hd}; attn_output_a {n_head hd / groups,
 * groups o_lora}; attn_output_b {groups o_lora, E}; hc_attn_fn / hc_ffn_fn {hc E, (2 + hc) hc},
 * hc_*_base {(2 + hc) hc}, hc_*_scale {3}; compressed layers (ratio r, coff = 2 for r = 4 else 1):
 * attn_compressor_kv / _gate {E, coff hd}, attn_compressor_ape {coff hd, r}, attn_compressor_norm
 * {hd}; ratio-4 layers also the indexer: indexer.proj {E, idx_heads}, indexer.attn_q_b {q_lora,
 * idx_heads idx_hd}, indexer_compressor_kv / _gate {E, 2 idx_hd}, indexer_compressor_ape
 * {2 idx_hd, 4}, indexer_compressor_norm {idx_hd}; ffn_gate_inp {E, n_expert}; hash layers
 * ffn_gate_tid2eid {k, n_vocab} (I32), the others exp_probs_b.bias {n_expert}; ffn_norm; experts
 * ffn_gate_exps / ffn_up_exps {E, n_ff, n_expert}, ffn_down_exps {n_ff, E, n_expert}; shared
 * ffn_gate_shexp / ffn_up_shexp {E, n_ff}, ffn_down_shexp {n_ff, E}. Globals: token_embd, output,
 * output_norm, output_hc_fn {hc E, hc}, output_hc_base {hc}, output_hc_scale {1}.
 *
 * Values: matrices std 0.02 (synth_plan.c's convention), norms 1 +- 0.05 (the compressors' norms:
 * the preset's comp_norm); output std 8 / sqrt(E) (logits of std 8, a peaked distribution);
 * token_embd as synth_plan.c's SYNTH_EMBD_RATIO rule (32);
 * the hyper-connection scales 0.5 +- 0.05 and bases std 0.5 (mixes of a few tenths, so the
 * Sinkhorn matrices are far from uniform); attention sinks std 0.5; compressor position biases
 * (ape) std 0.1; router bias std 0.1. Hash tables: token v's k experts spread over the experts
 * from a per-token start (distinct).
 *
 * Types: 1-D tensors, the router, the hyper-connection and ape tensors F32 (as the converter
 * keeps them), the hash table I32; the other matrices by the mix: pure, MXFP4_MOE (experts MXFP4,
 * the rest Q8_0), Q4_K_M (Q4_K, Q6_K for token_embd and the ffn_down tensors on use_more_bits
 * layers) with llama.cpp's fallback where a row is not a whole number of blocks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../quant/quant.h"
#include "synth_deepseek4.h"

static const hm_synth_ds4 ds4_presets[] = {
    {{"deepseek-v4-flash", "DeepSeek-V4-Flash (hotmoe synth, random weights)", 43, 4096, 64, 1, 512, 256, 6, 2048,
      2048, 129280, 1048576, 10000.0f, 1e-6f},
     64, 1024, 8, 1024, 128, 64, 128, 512, 4, 20, 3, 1, 2, 1e-6f, 160000.0f, 1.5f, 10.0f, 32.0f, 1.0f, 16.0f, 65536},
    /* a few MB, every feature on: layer 0 uncompressed, then 4, 128, 4, 128 (a 256-token sequence
     * fills 64 ratio-4 blocks, far more than the indexer's top 8, and two ratio-128 blocks);
     * window 16; hash-routed layers 0 and 1; a SwiGLU limit low enough to clamp; 16 indexer heads
     * of 64 (llama.cpp rotates the indexer by a Hadamard matrix of 64 or more; with few heads many
     * scores are exactly 0 after the ReLU and the top-k is a tie); compressor norms of mean 3, so
     * compressed rows carry a large share of the attention and a wrong choice of them shows in
     * the logits (tests/fixtures/llama_deepseek4/README.md); YaRN from an original context of 64,
     * so the 256 test positions are well past it */
    {{"tiny", "tiny deepseek4 (hotmoe synth, random weights)", 5, 256, 8, 1, 64, 16, 4, 64, 64, 384, 4096,
      10000.0f, 1e-6f},
     16, 64, 4, 32, 16, 16, 64, 8, 4, 20, 2, 1, 1, 1e-6f, 160000.0f, 1.5f, 0.5f, 32.0f, 2.0f, 16.0f, 64},
};

const hm_synth_ds4 *hm_synth_find_ds4(const char *name) {
    for (size_t i = 0; name && i < sizeof ds4_presets / sizeof ds4_presets[0]; i++)
        if (strcmp(ds4_presets[i].base.name, name) == 0) return &ds4_presets[i];
    return NULL;
}

const char *hm_synth_ds4_names(void) { return "deepseek-v4-flash, tiny"; }

int32_t hm_synth_ds4_ratio(const hm_synth_ds4 *q, int32_t il) {
    if (il < q->n_dense_attn) return 0;
    return (il - q->n_dense_attn) % 2 == 0 ? 4 : 128;
}

static bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

typedef struct ds4_plan {
    hm_synth_tensor *t;
    int64_t n, cap;
    const hm_synth_mix *mix;
} ds4_plan;

static bool keep_f32(const char *name) {
    return strstr(name, "ffn_gate_inp") || strstr(name, "hc_") || strstr(name, "_ape");
}

static int ds4_type(const ds4_plan *pl, const char *name, uint32_t n_dims, int64_t ne0, bool more) {
    const hm_synth_mix *m = pl->mix;
    if (n_dims < 2 || keep_f32(name)) return HM_TYPE_F32;
    int t = m->base;
    switch (m->kind) {
    case HM_SYNTH_MIX_PURE: break;
    case HM_SYNTH_MIX_MXFP4_MOE: t = n_dims == 3 ? HM_TYPE_MXFP4 : HM_TYPE_Q8_0; break;
    case HM_SYNTH_MIX_Q4_K_M:
        t = strcmp(name, "token_embd.weight") == 0 || more ? HM_TYPE_Q6_K : HM_TYPE_Q4_K;
        break;
    default:
        if (!hm_synth_mix_by_rules(m)) return -1;
        break; /* the base type; hm_synth_mix_apply sets the mix */
    }
    return hm_synth_type_fallback(t, ne0);
}

static hm_status ds4_add(ds4_plan *pl, const char *name, uint32_t n_dims, int64_t ne0, int64_t ne1, int64_t ne2,
                         float mean, float std, bool more, hm_err *err) {
    hm_synth_tensor *t = hm_synth_push(&pl->t, &pl->n, &pl->cap, name, n_dims, ne0, ne1, ne2, err);
    if (!t) return HM_ERR_NOMEM;
    t->type = ds4_type(pl, name, n_dims, ne0, more);
    if (t->type < 0)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "synth: --type %s is not available for deepseek4 (pure types, "
                       "q4_k_m, mxfp4, the llama-quantize and ud-* mixes)", pl->mix->name);
    t->mean = mean;
    t->std = std;
    return hm_synth_check_rows(t, err);
}

hm_status hm_synth_plan_ds4(const hm_synth_ds4 *q, int32_t n_layer, const hm_synth_mix *m, hm_synth_tensor **out,
                            int64_t *n_out, hm_err *err) {
    const hm_synth_preset *p = &q->base;
    ds4_plan pl = {.mix = m};
    const int64_t E = p->n_embd, F = p->n_ff_exp, X = p->n_expert, hd = p->head_dim, H = p->n_head;
    const int64_t hc = q->hc, mix = (2 + hc) * hc, nq = H * hd;
    const float W = 0.02f, N = 0.05f;
    const float out_std = (float)(8.0 / sqrt((double)E));
    const float embd_std = (float)(q->embd_ratio * W * W * sqrt((double)nq * (double)E));
    const bool q4km = m->kind == HM_SYNTH_MIX_Q4_K_M;
    char n[64];
    hm_status st = ds4_add(&pl, "token_embd.weight", 2, E, p->n_vocab, 1, 0, embd_std, false, err);
    if (!st) st = ds4_add(&pl, "output_hc_fn.weight", 2, hc * E, hc, 1, 0, W, false, err);
    if (!st) st = ds4_add(&pl, "output_hc_base.weight", 1, hc, 1, 1, 0, 0.5f, false, err);
    if (!st) st = ds4_add(&pl, "output_hc_scale.weight", 1, 1, 1, 1, 0.5f, 0.05f, false, err);
    for (int l = 0; !st && l < n_layer; l++) {
        const int32_t r = hm_synth_ds4_ratio(q, l);
        const int64_t coff = r == 4 ? 2 : 1;
        const bool mb = q4km && use_more_bits(l, n_layer);
#define T(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, l), n)
#define ADD(suffix, nd, a, b, c, mean, std, more) \
    do { if (!st) st = ds4_add(&pl, T(suffix), nd, a, b, c, mean, std, more, err); } while (0)
        ADD("attn_norm.weight", 1, E, 1, 1, 1, N, false);
        ADD("attn_sinks.weight", 1, H, 1, 1, 0, 0.5f, false);
        ADD("attn_q_a.weight", 2, E, q->q_lora, 1, 0, W, false);
        ADD("attn_q_a_norm.weight", 1, q->q_lora, 1, 1, 1, N, false);
        ADD("attn_q_b.weight", 2, q->q_lora, nq, 1, 0, W, false);
        ADD("attn_kv.weight", 2, E, hd, 1, 0, W, false);
        ADD("attn_kv_a_norm.weight", 1, hd, 1, 1, 1, N, false);
        ADD("attn_output_a.weight", 2, nq / q->o_groups, (int64_t)q->o_groups * q->o_lora, 1, 0, W, false);
        ADD("attn_output_b.weight", 2, (int64_t)q->o_groups * q->o_lora, E, 1, 0, W, false);
        ADD("hc_attn_fn.weight", 2, hc * E, mix, 1, 0, W, false);
        ADD("hc_attn_base.weight", 1, mix, 1, 1, 0, 0.5f, false);
        ADD("hc_attn_scale.weight", 1, 3, 1, 1, 0.5f, 0.05f, false);
        ADD("hc_ffn_fn.weight", 2, hc * E, mix, 1, 0, W, false);
        ADD("hc_ffn_base.weight", 1, mix, 1, 1, 0, 0.5f, false);
        ADD("hc_ffn_scale.weight", 1, 3, 1, 1, 0.5f, 0.05f, false);
        if (r) {
            ADD("attn_compressor_kv.weight", 2, E, coff * hd, 1, 0, W, false);
            ADD("attn_compressor_gate.weight", 2, E, coff * hd, 1, 0, W, false);
            ADD("attn_compressor_ape.weight", 2, coff * hd, r, 1, 0, 0.1f, false);
            ADD("attn_compressor_norm.weight", 1, hd, 1, 1, q->comp_norm, q->comp_norm * N, false);
        }
        if (r == 4) {
            ADD("indexer.proj.weight", 2, E, q->idx_heads, 1, 0, W, false);
            ADD("indexer.attn_q_b.weight", 2, q->q_lora, (int64_t)q->idx_heads * q->idx_hd, 1, 0, W, false);
            ADD("indexer_compressor_kv.weight", 2, E, 2 * (int64_t)q->idx_hd, 1, 0, W, false);
            ADD("indexer_compressor_gate.weight", 2, E, 2 * (int64_t)q->idx_hd, 1, 0, W, false);
            ADD("indexer_compressor_ape.weight", 2, 2 * (int64_t)q->idx_hd, 4, 1, 0, 0.1f, false);
            ADD("indexer_compressor_norm.weight", 1, q->idx_hd, 1, 1, q->comp_norm, q->comp_norm * N, false);
        }
        ADD("ffn_gate_inp.weight", 2, E, X, 1, 0, W, false);
        if (l < q->n_hash) {
            hm_synth_tensor *t = hm_synth_push(&pl.t, &pl.n, &pl.cap, T("ffn_gate_tid2eid.weight"), 2,
                                               p->n_expert_used, p->n_vocab, 1, err);
            if (!t) st = HM_ERR_NOMEM;
            else t->type = 26, t->hash_experts = (int32_t)X; /* I32 */
        } else {
            ADD("exp_probs_b.bias", 1, X, 1, 1, 0, 0.1f, false);
        }
        ADD("ffn_norm.weight", 1, E, 1, 1, 1, N, false);
        ADD("ffn_gate_exps.weight", 3, E, F, X, 0, W, false);
        ADD("ffn_down_exps.weight", 3, F, E, X, 0, W, mb);
        ADD("ffn_up_exps.weight", 3, E, F, X, 0, W, false);
        ADD("ffn_gate_shexp.weight", 2, E, F * q->n_shared, 1, 0, W, false);
        ADD("ffn_down_shexp.weight", 2, F * q->n_shared, E, 1, 0, W, mb);
        ADD("ffn_up_shexp.weight", 2, E, F * q->n_shared, 1, 0, W, false);
#undef ADD
#undef T
    }
    if (!st) st = ds4_add(&pl, "output_norm.weight", 1, E, 1, 1, 1, N, false, err);
    if (!st) st = ds4_add(&pl, "output.weight", 2, E, p->n_vocab, 1, 0, out_std, false, err);
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

hm_status hm_synth_meta_ds4(hm_gguf_writer *w, const hm_synth_ds4 *q, int32_t n_layer, const hm_synth_mix *m) {
    const hm_synth_preset *p = &q->base;
    hm_status st = HM_OK;
    int32_t *ratio = malloc((size_t)n_layer * sizeof *ratio);
    float *clamp = malloc((size_t)n_layer * sizeof *clamp);
    if (!ratio || !clamp) {
        free(ratio);
        free(clamp);
        return HM_ERR_NOMEM;
    }
    for (int32_t l = 0; l < n_layer; l++) {
        ratio[l] = hm_synth_ds4_ratio(q, l);
        clamp[l] = q->swiglu_limit;
    }
    const int32_t n_hash = q->n_hash < n_layer ? q->n_hash : n_layer;
#define SET(call) do { if (!st) st = (call); } while (0)
#define A "deepseek4."
    SET(hm_gguf_writer_set_str(w, "general.architecture", "deepseek4"));
    SET(hm_gguf_writer_set_str(w, "general.type", "model"));
    SET(hm_gguf_writer_set_str(w, "general.name", p->model_name));
    SET(hm_gguf_writer_set_u32(w, A "block_count", (uint32_t)n_layer));
    SET(hm_gguf_writer_set_u32(w, A "context_length", (uint32_t)p->n_ctx));
    SET(hm_gguf_writer_set_u32(w, A "embedding_length", (uint32_t)p->n_embd));
    SET(hm_gguf_writer_set_u32(w, A "feed_forward_length", (uint32_t)p->n_ff));
    SET(hm_gguf_writer_set_u32(w, A "attention.head_count", (uint32_t)p->n_head));
    SET(hm_gguf_writer_set_u32(w, A "attention.head_count_kv", (uint32_t)p->n_head_kv));
    SET(hm_gguf_writer_set_f32(w, A "rope.freq_base", p->rope_theta));
    SET(hm_gguf_writer_set_f32(w, A "attention.layer_norm_rms_epsilon", p->rms_eps));
    SET(hm_gguf_writer_set_u32(w, A "expert_used_count", (uint32_t)p->n_expert_used));
    SET(hm_gguf_writer_set_u32(w, A "expert_count", (uint32_t)p->n_expert));
    SET(hm_gguf_writer_set_u32(w, A "attention.key_length", (uint32_t)p->head_dim));
    SET(hm_gguf_writer_set_u32(w, A "attention.value_length", (uint32_t)p->head_dim));
    SET(hm_gguf_writer_set_u32(w, "general.file_type", (uint32_t)m->ftype));
    SET(hm_gguf_writer_set_u32(w, A "rope.dimension_count", (uint32_t)q->n_rot));
    SET(hm_gguf_writer_set_u32(w, A "attention.q_lora_rank", (uint32_t)q->q_lora));
    SET(hm_gguf_writer_set_u32(w, A "attention.sliding_window", (uint32_t)q->window));
    SET(hm_gguf_writer_set_u32(w, A "expert_feed_forward_length", (uint32_t)p->n_ff_exp));
    SET(hm_gguf_writer_set_u32(w, A "expert_shared_count", (uint32_t)q->n_shared));
    SET(hm_gguf_writer_set_f32(w, A "expert_weights_scale", q->routed_scale));
    SET(hm_gguf_writer_set_bool(w, A "expert_weights_norm", true));
    SET(hm_gguf_writer_set_arr(w, A "swiglu_clamp_exp", HM_GGUF_F32, clamp, (uint64_t)n_layer));
    SET(hm_gguf_writer_set_arr(w, A "swiglu_clamp_shexp", HM_GGUF_F32, clamp, (uint64_t)n_layer));
    SET(hm_gguf_writer_set_u32(w, A "attention.indexer.head_count", (uint32_t)q->idx_heads));
    SET(hm_gguf_writer_set_u32(w, A "attention.indexer.key_length", (uint32_t)q->idx_hd));
    SET(hm_gguf_writer_set_u32(w, A "attention.indexer.top_k", (uint32_t)q->idx_topk));
    SET(hm_gguf_writer_set_u32(w, A "attention.output_group_count", (uint32_t)q->o_groups));
    SET(hm_gguf_writer_set_u32(w, A "attention.output_lora_rank", (uint32_t)q->o_lora));
    SET(hm_gguf_writer_set_arr(w, A "attention.compress_ratios", HM_GGUF_I32, ratio, (uint64_t)n_layer));
    SET(hm_gguf_writer_set_f32(w, A "attention.compress_rope_freq_base", q->compress_theta));
    SET(hm_gguf_writer_set_u32(w, A "hyper_connection.count", (uint32_t)q->hc));
    SET(hm_gguf_writer_set_u32(w, A "hyper_connection.sinkhorn_iterations", (uint32_t)q->hc_iters));
    SET(hm_gguf_writer_set_f32(w, A "hyper_connection.epsilon", q->hc_eps));
    SET(hm_gguf_writer_set_u32(w, A "hash_layer_count", (uint32_t)n_hash));
    SET(hm_gguf_writer_set_u32(w, A "embedding_length_out", (uint32_t)(p->n_embd * q->hc)));
    SET(hm_gguf_writer_set_u32(w, A "expert_gating_func", 4)); /* sqrtsoftplus */
    if (q->yarn_factor > 0) {
        SET(hm_gguf_writer_set_str(w, A "rope.scaling.type", "yarn"));
        SET(hm_gguf_writer_set_f32(w, A "rope.scaling.factor", q->yarn_factor));
        SET(hm_gguf_writer_set_u32(w, A "rope.scaling.original_context_length", (uint32_t)q->yarn_orig));
        SET(hm_gguf_writer_set_f32(w, A "rope.scaling.yarn_beta_fast", 32.0f));
        SET(hm_gguf_writer_set_f32(w, A "rope.scaling.yarn_beta_slow", 1.0f));
    }
    SET(hm_gguf_writer_set_u32(w, "general.quantization_version", 2));
#undef A
#undef SET
    free(ratio);
    free(clamp);
    return st;
}
