/* synth_mix.c - llama-quantize's per-tensor type rules (llama_tensor_get_type_impl in llama.cpp's
 * src/llama-quant.cpp) for the --type mixes Q2_K, Q3_K_M, IQ2_XXS, IQ1_S, IQ2_M and IQ3_XXS, written
 * once over tensor names so that every arch synth writes gets them as llama-quantize would give
 * them to its f32 file; and the unsloth-dynamic-like ud-* mixes (our own rules, below).
 *
 * What llama-quantize does, as it falls on the tensors synth writes:
 *  - the tensors are visited in its loader's order: the ones outside blk.N first, then by layer,
 *    by name within a layer (ASCII); the counters of attn_v-like tensors and of ffn_down tensors
 *    (one per ffn_down, ffn_down_exps and ffn_down_shexp) run in that order;
 *  - categories by name: output.weight; token_embd.weight; *attn_qkv.weight, *attn_kv_b.weight and
 *    *attn_v.weight (all three "attn_v-like"); *attn_k.weight; *attn_q.weight; *attn_output.weight;
 *    *ffn_up*; *ffn_gate*; *ffn_down*; everything else keeps the ftype's default type;
 *  - without output.weight the embeddings are tied and token_embd takes output's rule;
 *  - a row that is not whole blocks of the chosen type takes its fallback (hm_synth_type_fallback).
 * Only the matrices the arch's plan quantises are visited (the plan keeps norms, routers and the
 * arch's small F32 tensors as the converter writes them). With an importance matrix (--imatrix)
 * the IQ3_XXS rules change as llama-quantize's do (attn_v IQ3_XXS, ffn_down the default type). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../quant/quant.h"
#include "synth_impl.h"

enum { FT_Q2_K = 10, FT_Q3_K_M = 12, FT_IQ2_XXS = 19, FT_IQ3_XXS = 23, FT_IQ1_S = 24, FT_IQ2_M = 29 };

typedef enum cat {
    C_OTHER, C_OUTPUT, C_TOKEN_EMBD, C_ATTN_V_LIKE, C_ATTN_K, C_ATTN_Q, C_ATTN_OUT, C_FFN_UP, C_FFN_GATE, C_FFN_DOWN,
} cat;

static cat category(const char *name) {
    if (strcmp(name, "output.weight") == 0) return C_OUTPUT;
    if (strcmp(name, "token_embd.weight") == 0 || strcmp(name, "per_layer_token_embd.weight") == 0) return C_TOKEN_EMBD;
    if (strstr(name, "attn_qkv.weight") || strstr(name, "attn_kv_b.weight") || strstr(name, "attn_v.weight"))
        return C_ATTN_V_LIKE;
    if (strstr(name, "attn_k.weight")) return C_ATTN_K;
    if (strstr(name, "attn_q.weight")) return C_ATTN_Q;
    if (strstr(name, "attn_output.weight")) return C_ATTN_OUT;
    if (strstr(name, "ffn_up")) return C_FFN_UP;
    if (strstr(name, "ffn_gate")) return C_FFN_GATE;
    if (strstr(name, "ffn_down")) return C_FFN_DOWN;
    return C_OTHER;
}

static int layer_of(const char *name) {
    int l = -1;
    if (sscanf(name, "blk.%d.", &l) != 1) return -1;
    return l;
}

bool hm_synth_mix_by_rules(const hm_synth_mix *m) {
    return m->kind == HM_SYNTH_MIX_Q2_K || m->kind == HM_SYNTH_MIX_Q3_K_M || m->kind == HM_SYNTH_MIX_IQ ||
           m->kind == HM_SYNTH_MIX_UD;
}

typedef struct rstate {
    const hm_synth_mix_hp *hp;
    int32_t ftype;
    int base;
    bool imatrix, tied;
    int i_wv, i_down;
} rstate;

/* llama_tensor_get_type_impl for the six ftypes, before the fallback. */
static int llama_rule(rstate *s, const hm_synth_tensor *t, cat c) {
    const int ft = s->ftype, n_gqa = s->hp->n_gqa, n_expert = s->hp->n_expert;
    const bool iq_branch = ft == FT_IQ2_XXS || ft == FT_IQ1_S || ft == FT_IQ2_M;
    int ty = s->base;
    if (c == C_OUTPUT || (s->tied && c == C_TOKEN_EMBD)) {
        if (t->ne[0] % hm_type_get(s->base)->blck_size) return HM_TYPE_Q8_0;
        if (iq_branch || ft == FT_IQ3_XXS) return HM_TYPE_Q5_K;
        return s->base != HM_TYPE_Q8_0 ? HM_TYPE_Q6_K : s->base;
    }
    if (c == C_TOKEN_EMBD) {
        if (ft == FT_IQ2_XXS || ft == FT_IQ1_S) return HM_TYPE_Q2_K;
        if (ft == FT_IQ2_M || ft == FT_IQ3_XXS) return HM_TYPE_IQ3_S;
        return ty;
    }
    if (iq_branch) {
        switch (c) {
        case C_ATTN_V_LIKE:
            s->i_wv++;
            if (n_gqa >= 4 || n_expert >= 4) return HM_TYPE_Q4_K;
            return ft == FT_IQ2_M ? HM_TYPE_IQ3_S : HM_TYPE_Q2_K;
        case C_ATTN_K: return n_expert == 8 ? HM_TYPE_Q4_K : ty;
        case C_FFN_DOWN:
            if (s->i_down++ < s->hp->n_layer / 8) return ft == FT_IQ2_M ? HM_TYPE_IQ3_S : HM_TYPE_Q2_K;
            return ty;
        case C_ATTN_OUT:
            if (n_expert == 8) return HM_TYPE_Q5_K;
            return ft == FT_IQ1_S ? HM_TYPE_IQ2_XXS : ft == FT_IQ2_M ? HM_TYPE_IQ3_S : ty;
        default: return ty;
        }
    }
    switch (c) {
    case C_ATTN_V_LIKE:
        if (ft == FT_Q2_K) ty = n_gqa >= 4 ? HM_TYPE_Q4_K : HM_TYPE_Q3_K;
        else if (ft == FT_IQ3_XXS) ty = n_gqa >= 4 ? HM_TYPE_Q4_K : s->imatrix ? HM_TYPE_IQ3_XXS : HM_TYPE_IQ3_S;
        else ty = s->i_wv < 2 ? HM_TYPE_Q5_K : HM_TYPE_Q4_K; /* Q3_K_M */
        if (n_expert == 8) ty = HM_TYPE_Q8_0;
        s->i_wv++;
        return ty;
    case C_ATTN_K:
        if (n_expert == 8) return HM_TYPE_Q8_0;
        return ft == FT_IQ3_XXS ? HM_TYPE_IQ2_S : ty;
    case C_ATTN_Q: return ft == FT_IQ3_XXS ? HM_TYPE_IQ2_S : ty;
    case C_FFN_DOWN: {
        /* with experts llama.cpp takes the layer from the name, not the counter */
        const int il = n_expert > 1 ? layer_of(t->name) : s->i_down, nl = s->hp->n_layer;
        s->i_down++;
        if (ft == FT_Q2_K) return HM_TYPE_Q3_K;
        if (ft == FT_IQ3_XXS && !s->imatrix) return il < nl / 8 ? HM_TYPE_Q4_K : HM_TYPE_Q3_K;
        if (ft == FT_Q3_K_M) return il < nl / 16 ? HM_TYPE_Q5_K : HM_TYPE_Q4_K;
        return ty;
    }
    case C_ATTN_OUT:
        if (n_expert == 8) return ft == FT_Q2_K || ft == FT_IQ3_XXS || ft == FT_Q3_K_M ? HM_TYPE_Q5_K : ty;
        return ft == FT_Q2_K ? HM_TYPE_Q3_K : ft == FT_IQ3_XXS ? HM_TYPE_IQ3_S : ft == FT_Q3_K_M ? HM_TYPE_Q4_K : ty;
    default: return ty;
    }
}

/* The ud-* mixes (unsloth-dynamic-like): the routed experts low, everything a token always goes
 * through high. Routed ffn_gate_exps / ffn_up_exps (and gemma4's ffn_gate_up_exps): the mix's base
 * type; routed ffn_down_exps: its down type; output Q6_K; token_embd Q4_K (tied: Q6_K);
 * attn_v-like tensors (attn_v, attn_qkv, attn_kv_b, deepseek4's attn_kv) Q6_K; shared experts
 * (*_shexp) and dense FFN matrices (ffn_gate/ffn_up/ffn_down without _exps) Q6_K; every other
 * matrix (attention, linear attention, indexer, compressors) Q5_K. */
static int ud_rule(const rstate *s, const hm_synth_mix *m, const hm_synth_tensor *t, cat c) {
    if (c == C_OUTPUT || (s->tied && c == C_TOKEN_EMBD)) return HM_TYPE_Q6_K;
    if (c == C_TOKEN_EMBD) return HM_TYPE_Q4_K;
    const bool routed = strstr(t->name, "_exps.") != NULL;
    if (routed) return strstr(t->name, "ffn_down") ? m->down : m->base;
    if (c == C_FFN_UP || c == C_FFN_GATE || c == C_FFN_DOWN) return HM_TYPE_Q6_K;
    if (c == C_ATTN_V_LIKE || strstr(t->name, "attn_kv.weight")) return HM_TYPE_Q6_K;
    return HM_TYPE_Q5_K;
}

static int cmp_loader_order(const void *a, const void *b) {
    const hm_synth_tensor *x = *(const hm_synth_tensor *const *)a, *y = *(const hm_synth_tensor *const *)b;
    const int lx = layer_of(x->name), ly = layer_of(y->name);
    if (lx != ly) return lx < ly ? -1 : 1;
    return strcmp(x->name, y->name);
}

hm_status hm_synth_mix_apply(hm_synth_tensor *t, int64_t n, const hm_synth_mix *m, const hm_synth_mix_hp *hp,
                             hm_err *err) {
    if (!hm_synth_mix_by_rules(m) || n == 0) return HM_OK;
    hm_synth_tensor **order = malloc((size_t)n * sizeof *order);
    if (!order) return hm_errf(err, HM_ERR_NOMEM, "synth: out of memory for the type mix");
    rstate s = {.hp = hp, .ftype = m->ftype, .base = m->base, .imatrix = m->imatrix, .tied = true};
    for (int64_t i = 0; i < n; i++) {
        order[i] = &t[i];
        if (strcmp(t[i].name, "output.weight") == 0) s.tied = false;
    }
    qsort(order, (size_t)n, sizeof *order, cmp_loader_order);
    hm_status st = HM_OK;
    for (int64_t i = 0; !st && i < n; i++) {
        hm_synth_tensor *x = order[i];
        if (x->n_dims < 2 || x->type == HM_TYPE_F32 || x->hash_experts) continue; /* kept as the converter writes it */
        const cat c = category(x->name);
        const int ty = m->kind == HM_SYNTH_MIX_UD ? ud_rule(&s, m, x, c) : llama_rule(&s, x, c);
        x->type = hm_synth_type_fallback(ty, x->ne[0]);
        st = hm_synth_check_rows(x, err);
    }
    free(order);
    return st;
}
