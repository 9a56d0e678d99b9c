/* synth_qwen35.c - `hotmoe synth --arch qwen35moe` and `--arch qwen3next`: the Qwen3.5-MoE and
 * Qwen3-Next presets, tensor plan and arch keys, beside the qwen3moe ones of synth_plan.c / synth.c.
 * qwen3next's file differs in its key prefix, ssm_ba {n_embd, 2 n_v} (per key head its n_v / n_k
 * beta rows then its alpha rows, the value heads in HF's grouped order) in place of ssm_beta and
 * ssm_alpha, and no rope.dimension_sections (NEOX rotary); everything else is the same.
 *
 * Names, shapes and keys are what llama.cpp's converter writes for qwen35moe (see
 * tools/qwen35moe.py and llama.cpp's src/models/qwen35moe.cpp), ne[0] contiguous. Per layer:
 * attn_norm, post_attention_norm {n_embd} (stored 1 + w: mean 1); then either Gated DeltaNet
 * (layers with (il + 1) % 4 != 0): attn_qkv {n_embd, 2 n_k d_k + n_v d_v}, attn_gate {n_embd,
 * n_v d_v}, ssm_conv1d {K, conv_dim}, ssm_dt.bias, ssm_a {n_v}, ssm_beta, ssm_alpha {n_embd, n_v},
 * ssm_norm {d_v}, ssm_out {n_v d_v, n_embd}; or gated attention: attn_q {n_embd, 2 n_head hd},
 * attn_k, attn_v {n_embd, n_head_kv hd}, attn_output {n_head hd, n_embd}, attn_q_norm,
 * attn_k_norm {hd}; then the MoE: ffn_gate_inp {n_embd, n_expert}, ffn_{gate,up}_exps, ffn_down_exps,
 * ffn_gate_inp_shexp {n_embd, 1}, ffn_{gate,up}_shexp {n_embd, n_ff_sh}, ffn_down_shexp.
 *
 * Values: as synth_plan.c (matrices std 0.02, norms 1 +- 0.05, token_embd and output scaled by
 * the same rule), plus what keeps a random DeltaNet stable: ssm_a = -exp(A_log) around -4 (a
 * decay exp(ssm_a * softplus(.)) well inside (0, 1)), dt_bias around 1.
 *
 * Type mix q4_k_m follows llama-quantize's rules as they apply here: output Q6_K; attn_qkv Q5_K;
 * attn_v (counted over attention layers) and ffn_down_exps / ffn_down_shexp on use_more_bits
 * layers Q6_K; the rest Q4_K; 1-D tensors, the routers (ffn_gate_inp*) and ssm_conv1d F32. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../quant/quant.h"
#include "synth_impl.h"

/* Qwen3.6-35B-A3B's and Qwen3-Next-80B-A3B's config.json (text part); qwen3next tiny: a few MB with
 * both layer kinds (4 layers), 2 key heads of 4 value heads (the grouped order matters), a shared
 * expert, rows of whole 256-element K-quant blocks. */
static const hm_synth_q35 q35_presets[] = {
    {{"qwen36-35b-a3b", "Qwen3.6-35B-A3B (hotmoe synth, random weights)", 40, 2048, 16, 2, 256, 256, 8, 512, 0,
      248320, 262144, 1e7f, 1e-6f},
     512, 4, 16, 32, 128, 128, 64, 4, "qwen35moe"},
    {{"qwen3-next-80b-a3b", "Qwen3-Next-80B-A3B (hotmoe synth, random weights)", 48, 2048, 16, 2, 256, 512, 10,
      512, 5120, 151936, 262144, 1e7f, 1e-6f},
     512, 4, 16, 32, 128, 128, 64, 4, "qwen3next"},
    {{"tiny", "tiny qwen35moe (hotmoe synth, random weights)", 4, 256, 4, 2, 64, 16, 4, 256, 1024, 384, 4096, 1e7f,
      1e-6f},
     256, 4, 2, 4, 64, 64, 64, 4, "qwen35moe"},
    {{"tiny", "tiny qwen3next (hotmoe synth, random weights)", 4, 256, 4, 2, 64, 16, 4, 256, 1024, 384, 4096, 1e7f,
      1e-6f},
     256, 4, 2, 4, 64, 64, 16, 4, "qwen3next"},
};

const hm_synth_q35 *hm_synth_find_q35(const char *arch, const char *name) {
    for (size_t i = 0; name && i < sizeof q35_presets / sizeof q35_presets[0]; i++)
        if (strcmp(q35_presets[i].arch, arch) == 0 && strcmp(q35_presets[i].base.name, name) == 0)
            return &q35_presets[i];
    return NULL;
}

const char *hm_synth_q35_names(const char *arch) {
    return strcmp(arch, "qwen3next") == 0 ? "qwen3-next-80b-a3b, tiny" : "qwen36-35b-a3b, tiny";
}

typedef struct q35_plan {
    hm_synth_tensor *t;
    int64_t n, cap;
    const hm_synth_mix *mix;
} q35_plan;

static bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

/* more: this tensor is one llama-quantize gives more bits on use_more_bits layers (attn_v, ffn_down*) */
static int q35_type(const hm_synth_mix *m, const char *name, uint32_t n_dims, bool more, bool more_layer) {
    if (n_dims < 2 || strstr(name, "ffn_gate_inp") || strstr(name, "ssm_conv1d")) return HM_TYPE_F32;
    switch (m->kind) {
    case HM_SYNTH_MIX_PURE: return m->base;
    case HM_SYNTH_MIX_MXFP4_MOE: return n_dims == 3 ? HM_TYPE_MXFP4 : HM_TYPE_Q8_0;
    case HM_SYNTH_MIX_Q4_K_M:
        if (strcmp(name, "output.weight") == 0) return HM_TYPE_Q6_K;
        if (strstr(name, "attn_qkv")) return HM_TYPE_Q5_K;
        if (more && more_layer) return HM_TYPE_Q6_K;
        return HM_TYPE_Q4_K;
    default: break; /* the mixes by rules: the base type; hm_synth_mix_apply sets them */
    }
    return m->base;
}

static hm_status q35_add(q35_plan *pl, const char *name, uint32_t n_dims, int64_t ne0, int64_t ne1, int64_t ne2,
                         float mean, float std, bool more, bool more_layer, hm_err *err) {
    hm_synth_tensor *t = hm_synth_push(&pl->t, &pl->n, &pl->cap, name, n_dims, ne0, ne1, ne2, err);
    if (!t) return HM_ERR_NOMEM;
    t->type = q35_type(pl->mix, name, n_dims, more, more_layer);
    if (hm_synth_mix_by_rules(pl->mix) && t->type > 0) t->type = hm_synth_type_fallback(t->type, ne0);
    if (t->type < 0) return hm_errf(err, HM_ERR_UNSUPPORTED, "synth: --type %s is written for qwen3moe only", pl->mix->name);
    t->mean = mean;
    t->std = std;
    return hm_synth_check_rows(t, err);
}

hm_status hm_synth_plan_q35(const hm_synth_q35 *q, int32_t n_layer, int32_t n_nextn, const hm_synth_mix *m,
                            hm_synth_tensor **out, int64_t *n_out, hm_err *err) {
    const hm_synth_preset *p = &q->base;
    q35_plan pl = {.mix = m};
    const int64_t E = p->n_embd, hd = p->head_dim, Q = (int64_t)p->n_head * hd, KV = (int64_t)p->n_head_kv * hd;
    const int64_t vdim = (int64_t)q->n_v * q->d_v, cd = 2 * (int64_t)q->n_k * q->d_k + vdim;
    const float W = 0.02f, N = 0.05f;
    /* synth_plan.c's end scales: logits of std 8, an embedding 32x one attention block's output */
    const float out_std = (float)(8.0 / sqrt((double)E));
    const float embd_std = (float)(32.0 * 0.02 * 0.02 * sqrt((double)Q * (double)E));
    int n_attn = 0;
    for (int l = 0; l < n_layer; l++) n_attn += (l + 1) % q->interval == 0;
    const bool next = strcmp(q->arch, "qwen3next") == 0;
    char n[64];
    hm_status st = q35_add(&pl, "token_embd.weight", 2, E, p->n_vocab, 1, 0, embd_std, false, false, err);
    for (int l = 0, ia = 0; !st && l < n_layer + n_nextn; l++) {
        /* the MTP block (l >= n_layer): gated attention + the MoE + its nextn tensors, base types */
        const bool mtp = l >= n_layer;
        const bool recr = !mtp && (l + 1) % q->interval != 0, mb = !mtp && use_more_bits(l, n_layer);
#define T(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, l), n)
#define ADD(suffix, nd, a, b, c, mean, std, more, ml) \
    do { if (!st) st = q35_add(&pl, T(suffix), nd, a, b, c, mean, std, more, ml, err); } while (0)
        ADD("attn_norm.weight", 1, E, 1, 1, 1, N, false, false);
        if (recr) {
            ADD("attn_qkv.weight", 2, E, cd, 1, 0, W, false, false);
            ADD("attn_gate.weight", 2, E, vdim, 1, 0, W, false, false);
            ADD("ssm_conv1d.weight", 2, q->d_conv, cd, 1, 0, 0.2f, false, false);
            ADD("ssm_dt.bias", 1, q->n_v, 1, 1, 1, 0.1f, false, false);
            ADD("ssm_a", 1, q->n_v, 1, 1, -4, 0.5f, false, false);
            if (next) {
                ADD("ssm_ba.weight", 2, E, 2 * q->n_v, 1, 0, W, false, false);
            } else {
                ADD("ssm_beta.weight", 2, E, q->n_v, 1, 0, W, false, false);
                ADD("ssm_alpha.weight", 2, E, q->n_v, 1, 0, W, false, false);
            }
            ADD("ssm_norm.weight", 1, q->d_v, 1, 1, 1, N, false, false);
            ADD("ssm_out.weight", 2, vdim, E, 1, 0, W, false, false);
        } else {
            const bool mv = !mtp && use_more_bits(ia++, n_attn);
            ADD("attn_q.weight", 2, E, 2 * Q, 1, 0, W, false, false);
            ADD("attn_k.weight", 2, E, KV, 1, 0, W, false, false);
            ADD("attn_v.weight", 2, E, KV, 1, 0, W, true, mv);
            ADD("attn_output.weight", 2, Q, E, 1, 0, W, false, false);
            ADD("attn_q_norm.weight", 1, hd, 1, 1, 1, N, false, false);
            ADD("attn_k_norm.weight", 1, hd, 1, 1, 1, N, false, false);
        }
        ADD("post_attention_norm.weight", 1, E, 1, 1, 1, N, false, false);
        ADD("ffn_gate_inp.weight", 2, E, p->n_expert, 1, 0, W, false, false);
        ADD("ffn_gate_exps.weight", 3, E, p->n_ff_exp, p->n_expert, 0, W, false, false);
        ADD("ffn_up_exps.weight", 3, E, p->n_ff_exp, p->n_expert, 0, W, false, false);
        ADD("ffn_down_exps.weight", 3, p->n_ff_exp, E, p->n_expert, 0, W, true, mb);
        ADD("ffn_gate_inp_shexp.weight", 2, E, 1, 1, 0, W, false, false);
        ADD("ffn_gate_shexp.weight", 2, E, q->n_ff_sh, 1, 0, W, false, false);
        ADD("ffn_up_shexp.weight", 2, E, q->n_ff_sh, 1, 0, W, false, false);
        ADD("ffn_down_shexp.weight", 2, q->n_ff_sh, E, 1, 0, W, true, mb);
        if (mtp) { /* llama.cpp's converter: mtp.fc, pre_fc_norm_embedding / _hidden, norm */
            ADD("nextn.eh_proj.weight", 2, 2 * E, E, 1, 0, W, false, false);
            ADD("nextn.enorm.weight", 1, E, 1, 1, 1, N, false, false);
            ADD("nextn.hnorm.weight", 1, E, 1, 1, 1, N, false, false);
            ADD("nextn.shared_head_norm.weight", 1, E, 1, 1, 1, N, false, false);
        }
#undef ADD
#undef T
    }
    if (!st) st = q35_add(&pl, "output_norm.weight", 1, E, 1, 1, 1, N, false, false, err);
    if (!st) st = q35_add(&pl, "output.weight", 2, E, p->n_vocab, 1, 0, out_std, false, false, err);
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

hm_status hm_synth_meta_q35(hm_gguf_writer *w, const hm_synth_q35 *q, int32_t n_layer, int32_t n_nextn,
                            const hm_synth_mix *m) {
    const hm_synth_preset *p = &q->base;
    hm_status st = HM_OK;
    char key[96];
#define SET(call) do { if (!st) st = (call); } while (0)
#define A(suffix) (snprintf(key, sizeof key, "%s." suffix, q->arch), key)
    SET(hm_gguf_writer_set_str(w, "general.architecture", q->arch));
    SET(hm_gguf_writer_set_str(w, "general.type", "model"));
    SET(hm_gguf_writer_set_str(w, "general.name", p->model_name));
    SET(hm_gguf_writer_set_u32(w, A("block_count"), (uint32_t)(n_layer + n_nextn)));
    if (n_nextn) SET(hm_gguf_writer_set_u32(w, A("nextn_predict_layers"), (uint32_t)n_nextn));
    SET(hm_gguf_writer_set_u32(w, A("context_length"), (uint32_t)p->n_ctx));
    SET(hm_gguf_writer_set_u32(w, A("embedding_length"), (uint32_t)p->n_embd));
    SET(hm_gguf_writer_set_u32(w, A("attention.head_count"), (uint32_t)p->n_head));
    SET(hm_gguf_writer_set_u32(w, A("attention.head_count_kv"), (uint32_t)p->n_head_kv));
    SET(hm_gguf_writer_set_f32(w, A("rope.freq_base"), p->rope_theta));
    SET(hm_gguf_writer_set_f32(w, A("attention.layer_norm_rms_epsilon"), p->rms_eps));
    SET(hm_gguf_writer_set_u32(w, A("expert_count"), (uint32_t)p->n_expert));
    SET(hm_gguf_writer_set_u32(w, A("expert_used_count"), (uint32_t)p->n_expert_used));
    SET(hm_gguf_writer_set_u32(w, A("attention.key_length"), (uint32_t)p->head_dim));
    SET(hm_gguf_writer_set_u32(w, A("attention.value_length"), (uint32_t)p->head_dim));
    SET(hm_gguf_writer_set_u32(w, "general.file_type", (uint32_t)m->ftype));
    SET(hm_gguf_writer_set_u32(w, A("expert_feed_forward_length"), (uint32_t)p->n_ff_exp));
    SET(hm_gguf_writer_set_u32(w, A("expert_shared_feed_forward_length"), (uint32_t)q->n_ff_sh));
    SET(hm_gguf_writer_set_u32(w, A("ssm.conv_kernel"), (uint32_t)q->d_conv));
    SET(hm_gguf_writer_set_u32(w, A("ssm.state_size"), (uint32_t)q->d_k));
    SET(hm_gguf_writer_set_u32(w, A("ssm.group_count"), (uint32_t)q->n_k));
    SET(hm_gguf_writer_set_u32(w, A("ssm.time_step_rank"), (uint32_t)q->n_v));
    SET(hm_gguf_writer_set_u32(w, A("ssm.inner_size"), (uint32_t)(q->n_v * q->d_v)));
    SET(hm_gguf_writer_set_u32(w, A("full_attention_interval"), (uint32_t)q->interval));
    SET(hm_gguf_writer_set_u32(w, A("rope.dimension_count"), (uint32_t)q->n_rot));
    if (strcmp(q->arch, "qwen35moe") == 0) {
        const int32_t sections[4] = {11, 11, 10, 0}; /* interleaved M-RoPE; text uses one position */
        SET(hm_gguf_writer_set_arr(w, A("rope.dimension_sections"), HM_GGUF_I32, sections, 4));
    }
    SET(hm_gguf_writer_set_u32(w, "general.quantization_version", 2));
#undef A
#undef SET
    return st;
}
