/* synth_deepseek4.h - `hotmoe synth --arch deepseek4` (synth_deepseek4.c): presets, tensor plan and
 * arch keys of DeepSeek-V4 (llama.cpp's "deepseek4"). */
#ifndef HM_SYNTH_DEEPSEEK4_H
#define HM_SYNTH_DEEPSEEK4_H

#include "synth_impl.h"

/* A DeepSeek-V4 preset: base holds the common shape (n_head_kv 1: the shared K=V head of head_dim;
 * base.n_ff unused); the rest is V4's own. Layer il's compression ratio: hm_synth_ds4_ratio. */
typedef struct hm_synth_ds4 {
    hm_synth_preset base;
    int32_t n_rot, q_lora, o_groups, o_lora, window;
    int32_t idx_heads, idx_hd, idx_topk;
    int32_t hc, hc_iters, n_hash, n_shared;
    int32_t n_dense_attn; /* the first layers without compression; after them 4, 128, 4, 128, ... */
    float hc_eps, compress_theta, routed_scale, swiglu_limit;
    float embd_ratio; /* token_embd's std as synth_plan.c's SYNTH_EMBD_RATIO rule with this ratio */
    float comp_norm;  /* the compressors' norm weights' mean: > 1 makes compressed rows win attention */
    float yarn_factor;   /* the compressed layers' YaRN (rope.scaling.*): factor, 0: none */
    int32_t yarn_orig;   /* and original_context_length */
} hm_synth_ds4;

const hm_synth_ds4 *hm_synth_find_ds4(const char *name);
const char *hm_synth_ds4_names(void);
int32_t hm_synth_ds4_ratio(const hm_synth_ds4 *q, int32_t il);
hm_status hm_synth_plan_ds4(const hm_synth_ds4 *q, int32_t n_layer, const hm_synth_mix *m, hm_synth_tensor **out,
                            int64_t *n_out, hm_err *err);
/* general.* and deepseek4.* keys as llama.cpp's converter writes them. */
hm_status hm_synth_meta_ds4(hm_gguf_writer *w, const hm_synth_ds4 *q, int32_t n_layer, const hm_synth_mix *m);

#endif
