/* synth_gptoss.c - `hotmoe synth --arch gpt-oss`: the gpt-oss presets, tensor plan and arch keys.
 *
 * Shapes of gpt-oss-20b / gpt-oss-120b: openai/gpt-oss-20b's and -120b's config.json - hidden_size
 * 2880, 64 attention heads / 8 KV heads of head_dim 64, intermediate_size 2880 per expert, 32
 * experts (120b: 128), 4 per token, 24 layers (120b: 36) alternating sliding (window 128) and full
 * attention, vocab 201088, rope_theta 150000 with YaRN (factor 32, original context 4096), rms eps
 * 1e-5, context 131072; llama.cpp's loader types them by block_count (24: 20B, 36: 120B).
 *
 * Names, shapes and keys: what llama.cpp's converter writes for gpt-oss (its GptOssModel; its
 * src/models/openai-moe.cpp loads them), ne[0] contiguous. Per layer: attn_norm, attn_q/k/v and
 * attn_output with their .bias, attn_sinks.weight [n_head], post_attention_norm, ffn_gate_inp
 * (.weight and .bias [n_expert]), ffn_gate_exps / ffn_up_exps / ffn_down_exps (.weight 3-D and
 * .bias [n_ff or n_embd, n_expert]).
 *
 * Values: matrices 0.02-wide at the tiny preset's widths (q and k 0.08, so that attention is peaked
 * enough for the window, the sinks and YaRN's scale to matter; the output 0.15 for logit margins),
 * scaled by 1/sqrt of the input width elsewhere so that every preset has the same activation and
 * logit scales (unscaled, gpt-oss-20b's 2880-wide rows give attention near argmax and logits of std
 * 8, where quantisation noise decides near-ties); the expert gate / up biases wide enough (std 3.5) that a few
 * per cent of the clamped SwiGLU's inputs pass its limit of 7; the sinks (std 1) and the router
 * bias (0.5) large enough to change which heads attend and which experts win. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../quant/quant.h"
#include "synth_gptoss.h"

static const hm_synth_gpt gpt_presets[] = {
    {{"gpt-oss-20b", "gpt-oss-20b (hotmoe synth, random weights)", 24, 2880, 64, 8, 64, 32, 4, 2880, 2880, 201088,
      131072, 150000.0f, 1e-5f},
     128, 32.0f, 4096},
    {{"gpt-oss-120b", "gpt-oss-120b (hotmoe synth, random weights)", 36, 2880, 64, 8, 64, 128, 4, 2880, 2880,
      201088, 131072, 150000.0f, 1e-5f},
     128, 32.0f, 4096},
    /* a few MB, every feature on: 2 sliding + 2 full layers, window 16, YaRN over a ramp of dims */
    {{"gpt-oss-tiny", "tiny gpt-oss (hotmoe synth, random weights)", 4, 256, 8, 2, 64, 8, 4, 256, 256, 384, 4096,
      150000.0f, 1e-5f},
     16, 4.0f, 1024},
};

const hm_synth_gpt *hm_synth_find_gpt(const char *name) {
    for (size_t i = 0; name && i < sizeof gpt_presets / sizeof gpt_presets[0]; i++)
        if (strcmp(gpt_presets[i].base.name, name) == 0) return &gpt_presets[i];
    if (name && strcmp(name, "tiny") == 0) return &gpt_presets[2];
    return NULL;
}

const char *hm_synth_gpt_names(void) { return "gpt-oss-20b, gpt-oss-120b, gpt-oss-tiny (or tiny)"; }

/* A matrix's std s (set for an input width of ref, the tiny preset's) at input width ne0: s
 * sqrt(ref / ne0), so that its outputs keep the tiny preset's scale at every width (s itself there). */
static float wstd(float s, int64_t ref, int64_t ne0) { return (float)((double)s * sqrt((double)ref / (double)ne0)); }

typedef struct gpt_plan {
    hm_synth_tensor *t;
    int64_t n, cap;
    const hm_synth_mix *mix;
} gpt_plan;

static hm_status gpt_add(gpt_plan *pl, const char *name, uint32_t n_dims, int64_t ne0, int64_t ne1, int64_t ne2,
                         bool f32, float mean, float std, hm_err *err) {
    hm_synth_tensor *t = hm_synth_push(&pl->t, &pl->n, &pl->cap, name, n_dims, ne0, ne1, ne2, err);
    if (!t) return HM_ERR_NOMEM;
    const hm_synth_mix *m = pl->mix;
    if (f32 || n_dims < 2 || strstr(name, "ffn_gate_inp")) t->type = HM_TYPE_F32;
    else if (m->kind == HM_SYNTH_MIX_MXFP4_MOE) t->type = n_dims == 3 ? HM_TYPE_MXFP4 : HM_TYPE_Q8_0;
    else if (m->kind == HM_SYNTH_MIX_PURE) t->type = m->base;
    else return hm_errf(err, HM_ERR_UNSUPPORTED, "synth: --type %s is not written for gpt-oss (pure types, mxfp4_moe)",
                        m->name);
    t->mean = mean;
    t->std = std;
    return hm_synth_check_rows(t, err);
}

hm_status hm_synth_plan_gpt(const hm_synth_gpt *q, int32_t n_layer, const hm_synth_mix *m, hm_synth_tensor **out,
                            int64_t *n_out, hm_err *err) {
    const hm_synth_preset *p = &q->base;
    gpt_plan pl = {.mix = m};
    const int64_t E = p->n_embd, F = p->n_ff_exp, X = p->n_expert, hd = p->head_dim;
    const int64_t Q = (int64_t)p->n_head * hd, KV = (int64_t)p->n_head_kv * hd;
    /* matrices 0.02-wide at the tiny preset's widths (256 in, 512 for attn_output), q and k 0.08 (attention
     * that is not uniform), the output 0.15 (logit margins); scaled by wstd at other widths */
    const float W = wstd(0.02f, 256, E), N = 0.05f, QK = wstd(0.08f, 256, E), WO = wstd(0.02f, 512, Q);
    const float WD = wstd(0.02f, 256, F), OUT = wstd(0.15f, 256, E);
    char n[64];
    hm_status st = gpt_add(&pl, "token_embd.weight", 2, E, p->n_vocab, 1, false, 0, 1.0f, err);
    for (int l = 0; !st && l < n_layer; l++) {
#define T(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, l), n)
#define ADD(suffix, nd, a, b, c, f32, mean, std) \
    do { if (!st) st = gpt_add(&pl, T(suffix), nd, a, b, c, f32, mean, std, err); } while (0)
        ADD("attn_norm.weight", 1, E, 1, 1, true, 1, N);
        ADD("attn_q.weight", 2, E, Q, 1, false, 0, QK);
        ADD("attn_q.bias", 1, Q, 1, 1, true, 0, 0.1f);
        ADD("attn_k.weight", 2, E, KV, 1, false, 0, QK);
        ADD("attn_k.bias", 1, KV, 1, 1, true, 0, 0.1f);
        ADD("attn_v.weight", 2, E, KV, 1, false, 0, W);
        ADD("attn_v.bias", 1, KV, 1, 1, true, 0, 0.1f);
        ADD("attn_output.weight", 2, Q, E, 1, false, 0, WO);
        ADD("attn_output.bias", 1, E, 1, 1, true, 0, 0.1f);
        ADD("attn_sinks.weight", 1, p->n_head, 1, 1, true, 0, 1.0f);
        ADD("post_attention_norm.weight", 1, E, 1, 1, true, 1, N);
        ADD("ffn_gate_inp.weight", 2, E, X, 1, true, 0, W);
        ADD("ffn_gate_inp.bias", 1, X, 1, 1, true, 0, 0.5f);
        ADD("ffn_gate_exps.weight", 3, E, F, X, false, 0, W);
        ADD("ffn_gate_exps.bias", 2, F, X, 1, true, 0, 3.5f);
        ADD("ffn_up_exps.weight", 3, E, F, X, false, 0, W);
        ADD("ffn_up_exps.bias", 2, F, X, 1, true, 0, 3.5f);
        ADD("ffn_down_exps.weight", 3, F, E, X, false, 0, WD);
        ADD("ffn_down_exps.bias", 2, E, X, 1, true, 0, 0.1f);
#undef ADD
#undef T
    }
    if (!st) st = gpt_add(&pl, "output_norm.weight", 1, E, 1, 1, true, 1, N, err);
    if (!st) st = gpt_add(&pl, "output.weight", 2, E, p->n_vocab, 1, false, 0, OUT, err);
    if (st) {
        free(pl.t);
        return st;
    }
    *out = pl.t;
    *n_out = pl.n;
    return HM_OK;
}

hm_status hm_synth_meta_gpt(hm_gguf_writer *w, const hm_synth_gpt *q, int32_t n_layer, const hm_synth_mix *m) {
    const hm_synth_preset *p = &q->base;
    hm_status st = HM_OK;
#define SET(call) do { if (!st) st = (call); } while (0)
#define A "gpt-oss."
    SET(hm_gguf_writer_set_str(w, "general.architecture", "gpt-oss"));
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
    SET(hm_gguf_writer_set_u32(w, A "expert_count", (uint32_t)p->n_expert));
    SET(hm_gguf_writer_set_u32(w, A "expert_used_count", (uint32_t)p->n_expert_used));
    SET(hm_gguf_writer_set_u32(w, A "attention.key_length", (uint32_t)p->head_dim));
    SET(hm_gguf_writer_set_u32(w, A "attention.value_length", (uint32_t)p->head_dim));
    SET(hm_gguf_writer_set_str(w, A "rope.scaling.type", "yarn"));
    SET(hm_gguf_writer_set_f32(w, A "rope.scaling.factor", q->yarn_factor));
    SET(hm_gguf_writer_set_u32(w, A "rope.scaling.original_context_length", (uint32_t)q->yarn_orig));
    SET(hm_gguf_writer_set_u32(w, "general.file_type", (uint32_t)m->ftype));
    SET(hm_gguf_writer_set_u32(w, "general.quantization_version", 2));
    SET(hm_gguf_writer_set_u32(w, A "attention.sliding_window", (uint32_t)q->window));
    SET(hm_gguf_writer_set_u32(w, A "expert_feed_forward_length", (uint32_t)p->n_ff_exp));
#undef A
#undef SET
    return st;
}
