/* synth_deepseek2.h - `hotmoe synth --arch deepseek2` (synth_deepseek2.c): presets, tensor plan and
 * arch keys (the vocabulary is synth_vocab.c's built-in one). */
#ifndef HM_SYNTH_DEEPSEEK2_H
#define HM_SYNTH_DEEPSEEK2_H

#include <stdbool.h>

#include "synth_impl.h"

/* A DeepSeek-V2/V3 preset: base holds the common shape (n_head_kv and head_dim unused; n_ff the
 * leading dense layers' FFN), the MLA and routing dimensions are here. */
typedef struct hm_synth_ds2 {
    hm_synth_preset base;
    int32_t q_lora, kv_lora, nope, n_rot, v_dim;
    int32_t n_dense, n_shared, n_group, topk_group;
    int32_t gating;        /* llama.cpp's expert_gating_func: 1 softmax, 2 sigmoid */
    bool probs_b, norm;    /* exp_probs_b (the choice's score bias), expert_weights_norm */
    float wscale;          /* expert_weights_scale (routed_scaling_factor) */
    float yarn_factor;     /* 0: no RoPE scaling */
    int32_t yarn_orig;     /* original_context_length */
    float mscale_all;      /* mscale_all_dim (the file stores 0.1 x it) */
    float embd_ratio;      /* token_embd's std over one attention block's output (synth_plan.c's 32) */
    float score_std;       /* std of the matrices that make the attention scores (attn_q*, attn_kv_a_mqa,
                              attn_k_b); the others 0.02 */
} hm_synth_ds2;

const hm_synth_ds2 *hm_synth_find_ds2(const char *name);
const char *hm_synth_ds2_names(void);
/* As hm_synth_plan, for deepseek2. */
hm_status hm_synth_plan_ds2(const hm_synth_ds2 *q, int32_t n_layer, const hm_synth_mix *m, hm_synth_tensor **out,
                            int64_t *n_out, hm_err *err);
/* general.* and deepseek2.* keys as llama.cpp's converter writes them. */
hm_status hm_synth_meta_ds2(hm_gguf_writer *w, const hm_synth_ds2 *q, int32_t n_layer, const hm_synth_mix *m);

#endif
