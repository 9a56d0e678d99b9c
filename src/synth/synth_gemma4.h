/* synth_gemma4.h - `hotmoe synth --arch gemma4` (synth_gemma4.c): presets, tensor plan, arch keys
 * and the built-in gemma4 vocabulary. */
#ifndef HM_SYNTH_GEMMA4_H
#define HM_SYNTH_GEMMA4_H

#include <stdbool.h>

#include "synth_impl.h"

/* A Gemma 4 preset: base holds the global layers' attention (head_dim, n_head_kv), the dense MLP
 * width (n_ff) and the expert shape; the sliding layers' attention and the pattern are here. */
typedef struct hm_synth_g4 {
    hm_synth_preset base;
    int32_t hd_swa, n_head_kv_swa, window;
    int32_t swa_period;  /* layer il is global when (il + 1) % swa_period == 0 */
    int32_t n_rot_pairs; /* rotated pairs of a global head (partial_rotary_factor * hd / 2) */
    float rope_theta_swa, softcap;
} hm_synth_g4;

const hm_synth_g4 *hm_synth_find_g4(const char *name);
const char *hm_synth_g4_names(void);
bool hm_synth_g4_swa(const hm_synth_g4 *q, int32_t il);
/* As hm_synth_plan, for gemma4 (rows that do not fit the type's block take llama.cpp's fallback
 * type). */
hm_status hm_synth_plan_g4(const hm_synth_g4 *q, int32_t n_layer, const hm_synth_mix *m, hm_synth_tensor **out,
                           int64_t *n_out, hm_err *err);
/* general.* and gemma4.* keys as llama.cpp's converter writes them. */
hm_status hm_synth_meta_g4(hm_gguf_writer *w, const hm_synth_g4 *q, int32_t n_layer, const hm_synth_mix *m);
/* tokenizer.* keys: the built-in gemma4 vocabulary padded to n_vocab. */
hm_status hm_synth_vocab_g4(hm_gguf_writer *w, int32_t n_vocab, hm_err *err);

#endif
