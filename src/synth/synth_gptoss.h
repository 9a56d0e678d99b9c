/* synth_gptoss.h - `hotmoe synth --arch gpt-oss` (synth_gptoss.c): presets, tensor plan and arch
 * keys of OpenAI's gpt-oss. */
#ifndef HM_SYNTH_GPTOSS_H
#define HM_SYNTH_GPTOSS_H

#include "synth_impl.h"

/* A gpt-oss preset: the common shape plus the sliding window and YaRN's keys. */
typedef struct hm_synth_gpt {
    hm_synth_preset base;
    int32_t window;     /* attention.sliding_window (the even layers slide) */
    float yarn_factor;  /* rope.scaling.factor */
    int32_t yarn_orig;  /* rope.scaling.original_context_length */
} hm_synth_gpt;

const hm_synth_gpt *hm_synth_find_gpt(const char *name);
const char *hm_synth_gpt_names(void);
/* As hm_synth_plan, for gpt-oss (--type pure kinds and mxfp4_moe only: HM_ERR_UNSUPPORTED else). */
hm_status hm_synth_plan_gpt(const hm_synth_gpt *q, int32_t n_layer, const hm_synth_mix *m, hm_synth_tensor **out,
                            int64_t *n_out, hm_err *err);
/* general.* and gpt-oss.* keys as llama.cpp's converter writes them. */
hm_status hm_synth_meta_gpt(hm_gguf_writer *w, const hm_synth_gpt *q, int32_t n_layer, const hm_synth_mix *m);

#endif
