/* synth_moe_archs.h - `hotmoe synth --arch glm4moe | olmoe | llama` (synth_moe_archs.c): presets,
 * tensor plans and arch keys of GLM-4.5, OLMoE and Mixtral (llama with experts). */
#ifndef HM_SYNTH_MOE_ARCHS_H
#define HM_SYNTH_MOE_ARCHS_H

#include <stdbool.h>

#include "synth_impl.h"

typedef enum hm_synth_ma_arch { HM_SYNTH_MA_GLM4MOE, HM_SYNTH_MA_OLMOE, HM_SYNTH_MA_LLAMA } hm_synth_ma_arch;

/* A preset: base holds the shape (n_ff: glm4moe's dense FFN; olmoe and llama: the experts' width,
 * as their GGUFs say it); the rest is glm4moe's. */
typedef struct hm_synth_ma {
    hm_synth_preset base;
    hm_synth_ma_arch arch;
    int32_t n_rot;                  /* rotated dims of a head */
    int32_t n_dense, n_shared, n_nextn; /* leading dense layers, shared experts, NextN layers */
    int32_t n_group, topk_group;    /* expert groups (0: none) */
    float routed_scale;
    bool qk_norm, qkv_bias;
} hm_synth_ma;

/* The preset named name of arch (a GGUF architecture name), or NULL; the names for messages. */
const hm_synth_ma *hm_synth_find_ma(const char *arch, const char *name);
const char *hm_synth_ma_names(const char *arch);
/* Whether arch is one of this file's. */
bool hm_synth_is_ma(const char *arch);
/* As hm_synth_plan (n_layer: the layers the forward runs; glm4moe's NextN layers come on top). */
hm_status hm_synth_plan_ma(const hm_synth_ma *q, int32_t n_layer, const hm_synth_mix *m, hm_synth_tensor **out,
                           int64_t *n_out, hm_err *err);
/* general.* and <arch>.* keys as llama.cpp's converter writes them. */
hm_status hm_synth_meta_ma(hm_gguf_writer *w, const hm_synth_ma *q, int32_t n_layer, const hm_synth_mix *m);

#endif
