/* route_spec.h - how a MoE router turns a token's logits into k (expert, weight) pairs: the
 * declarative routing spec that both backends implement (hm_cpu_route in cpu_route.c,
 * hm_cuda_route in cuda_route.cu) and the executor's hm_moe_spec carries.
 *
 * For one token with router logits l[0..n_expert):
 *   1. scores s[e]: SOFTMAX softmax(l); SIGMOID 1/(1+exp(-l)); SQRT_SOFTPLUS sqrt(softplus(l))
 *      (softplus(v) = v above 20, as torch); SOFTMAX_TOPK the logits themselves (gpt-oss: the
 *      weights are a softmax over the k chosen logits, step 5).
 *   2. choice c[e] = s[e] + bias[e] (bias: DeepSeek-V3/V4's and GLM-4.5's score correction; it
 *      steers which experts are chosen, never their weights). No bias: c = s.
 *   3. group-limited choice (n_group > 1; n_expert a multiple of n_group): group j's score is the
 *      sum of its two largest c with a bias, its largest c without (DeepSeek-V3 / V2); the
 *      topk_group best groups stay (ties: the lower group), the others' experts are not chosen.
 *   4. the k largest c (ties: the lower id; ids in descending c). Hash-routed layers skip 2-4: the
 *      ids are row tokens[t] of a [n_vocab, k] table, in the table's order.
 *   5. weights w_i = s[id_i] (SOFTMAX_TOPK: softmax over the k chosen logits);
 *   6. norm: w_i /= sum_i w_i (summed in order i = 0..k-1);
 *   7. w_i *= scale (DeepSeek's routed_scaling_factor; 1: none).
 * The plain spec (SOFTMAX, norm, no bias, no groups, scale 1, no hash) is every arch hotmoe ran
 * first (qwen3moe, qwen35moe, gemma4), bit-identical to the router before the spec. */
#ifndef HM_BACKEND_ROUTE_SPEC_H
#define HM_BACKEND_ROUTE_SPEC_H

#include <stdbool.h>
#include <stdint.h>

typedef enum hm_route_score {
    HM_ROUTE_SOFTMAX = 0,
    HM_ROUTE_SIGMOID,
    HM_ROUTE_SQRT_SOFTPLUS,
    HM_ROUTE_SOFTMAX_TOPK,
} hm_route_score;

typedef struct hm_route_spec {
    int32_t n_expert, k;      /* n_expert <= 1024, k <= 32 */
    hm_route_score score;
    bool norm;                /* step 6 */
    float scale;              /* step 7; 0 is read as 1 */
    int32_t n_group, topk_group; /* step 3; n_group <= 1: none */
} hm_route_spec;

/* NULL when sp is one the backends compute (a constant string naming what is wrong otherwise):
 * 1 <= k <= 32, k <= n_expert <= 1024, a known score; with groups n_expert % n_group == 0,
 * n_group <= 32, 1 <= topk_group <= n_group and topk_group * (n_expert / n_group) >= k. */
static inline const char *hm_route_spec_invalid(const hm_route_spec *sp) {
    if (sp->n_expert < 1 || sp->n_expert > 1024) return "n_expert outside 1..1024";
    if (sp->k < 1 || sp->k > 32 || sp->k > sp->n_expert) return "k outside 1..min(32, n_expert)";
    if (sp->score < HM_ROUTE_SOFTMAX || sp->score > HM_ROUTE_SOFTMAX_TOPK) return "unknown scoring function";
    if (sp->n_group > 1) {
        if (sp->n_group > 32 || sp->n_expert % sp->n_group) return "n_group does not divide n_expert (or > 32)";
        if (sp->topk_group < 1 || sp->topk_group > sp->n_group) return "topk_group outside 1..n_group";
        if ((int64_t)sp->topk_group * (sp->n_expert / sp->n_group) < sp->k) return "topk_group groups hold fewer than k experts";
    }
    return NULL;
}

/* True for the spec of the first archs (see above): the backends' original router runs it. */
static inline bool hm_route_spec_plain(const hm_route_spec *sp) {
    return sp->score == HM_ROUTE_SOFTMAX && sp->n_group <= 1 && (sp->scale == 0.0f || sp->scale == 1.0f);
}

#endif
