/* synth_mix_iq.c - which ggml type llama-quantize gives each matrix of a qwen3moe model under the
 * i-quant ftypes IQ2_XXS, IQ1_S, IQ2_M and IQ3_XXS (llama_tensor_get_type_impl in llama.cpp's
 * src/llama-quant.cpp, as its rules apply to qwen3moe: not Falcon, n_expert != 8, embeddings not
 * tied, every row a whole number of 256-element blocks).
 *
 * synth has no importance matrix: these are the rules llama-quantize applies without one
 * (has_imatrix false), and the tensors are quantised by the types' reference quantisers, which use
 * ggml's own weighting where ggml quantises without an importance matrix (IQ2_S, IQ3_XXS, IQ3_S)
 * and uniform importance for IQ2_XXS and IQ1_S (which llama-quantize refuses to write without
 * one). */
#include "../quant/quant.h"
#include "synth_impl.h"

enum { FT_IQ2_XXS = 19, FT_IQ3_XXS = 23, FT_IQ1_S = 24, FT_IQ2_M = 29 };

int hm_synth_iq_mix_type(int32_t ftype, hm_synth_role r, int layer, int n_layer, int n_gqa, int n_expert) {
    const int base = ftype == FT_IQ2_XXS ? HM_TYPE_IQ2_XXS
                   : ftype == FT_IQ1_S   ? HM_TYPE_IQ1_S
                   : ftype == FT_IQ2_M   ? HM_TYPE_IQ2_S
                                         : HM_TYPE_IQ3_XXS;
    const bool m2 = ftype == FT_IQ2_M;
    if (r == HM_SYNTH_ROLE_OUTPUT) return HM_TYPE_Q5_K;
    if (r == HM_SYNTH_ROLE_TOKEN_EMBD) return ftype == FT_IQ2_XXS || ftype == FT_IQ1_S ? HM_TYPE_Q2_K : HM_TYPE_IQ3_S;
    if (ftype != FT_IQ3_XXS) {
        switch (r) {
        case HM_SYNTH_ROLE_ATTN_V:
            if (n_gqa >= 4 || n_expert >= 4) return HM_TYPE_Q4_K;
            return m2 ? HM_TYPE_IQ3_S : HM_TYPE_Q2_K;
        case HM_SYNTH_ROLE_ATTN_K: return n_expert == 8 ? HM_TYPE_Q4_K : base;
        /* llama.cpp counts ffn_down tensors in file order: one per layer here */
        case HM_SYNTH_ROLE_FFN_DOWN: return layer < n_layer / 8 ? (m2 ? HM_TYPE_IQ3_S : HM_TYPE_Q2_K) : base;
        case HM_SYNTH_ROLE_ATTN_OUT:
            if (n_expert == 8) return HM_TYPE_Q5_K;
            return ftype == FT_IQ1_S ? HM_TYPE_IQ2_XXS : m2 ? HM_TYPE_IQ3_S : base;
        default: return base;
        }
    }
    switch (r) { /* IQ3_XXS */
    case HM_SYNTH_ROLE_ATTN_V: return n_expert == 8 ? HM_TYPE_Q8_0 : n_gqa >= 4 ? HM_TYPE_Q4_K : HM_TYPE_IQ3_S;
    case HM_SYNTH_ROLE_ATTN_K: return n_expert == 8 ? HM_TYPE_Q8_0 : HM_TYPE_IQ2_S;
    case HM_SYNTH_ROLE_ATTN_Q: return HM_TYPE_IQ2_S;
    case HM_SYNTH_ROLE_FFN_DOWN: return layer < n_layer / 8 ? HM_TYPE_Q4_K : HM_TYPE_Q3_K;
    case HM_SYNTH_ROLE_ATTN_OUT: return n_expert == 8 ? HM_TYPE_Q5_K : HM_TYPE_IQ3_S;
    default: return base;
    }
}
