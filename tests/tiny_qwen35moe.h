/* tiny_qwen35moe.h - a tiny qwen35moe GGUF written with the project's GGUF writer, for the GPU
 * tests that need one (test_qwen35moe_gpu.c, test_multi_gpu_gpu.c; header-only, each includes it
 * once). Shape: n_embd 256; gated attention every 4th layer (2 heads of 256, 1 KV head, 64 rotary
 * dims), Gated DeltaNet the others (1 key head, 2 value heads, d_k = d_v = 128, conv 4); 16
 * experts k 4 of n_ff 256 and a shared expert of 256; vocab 512. Values ~gaussian (the sum of 4
 * uniforms, std 1, scaled per tensor), drawn from an LCG seeded by the tensor's name: the file
 * depends only on the arguments. Matrices in wtype (F32 or Q8_0); vectors, the conv weights and
 * the routers F32. */
#ifndef HM_TESTS_TINY_QWEN35MOE_H
#define HM_TESTS_TINY_QWEN35MOE_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "gguf/gguf.h"
#include "hotmoe.h"
#include "quant/quant.h"

enum { TQ35_E = 256, TQ35_HD = 256, TQ35_NH = 2, TQ35_NKV = 1, TQ35_NROT = 64, TQ35_NEXP = 16, TQ35_K = 4,
       TQ35_FF = 256, TQ35_FFSH = 256, TQ35_NK = 1, TQ35_NV = 2, TQ35_DK = 128, TQ35_DV = 128, TQ35_DCONV = 4,
       TQ35_VOCAB = 512 };

/* Layer il is a DeltaNet (recurrent) layer; every 4th is gated attention. */
static inline int tq35_recurrent(int il) { return (il + 1) % 4 != 0; }

static inline uint64_t tq35_rng(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 11;
}

typedef struct tq35_tensor {
    char name[64];
    uint32_t nd;
    int64_t ne[3];
    int type;
    float mean, std;
} tq35_tensor;

static inline int tq35_add(tq35_tensor *t, int n, const char *name, uint32_t nd, int64_t a, int64_t b, int64_t c,
                           float mean, float std, int type) {
    snprintf(t[n].name, sizeof t[n].name, "%s", name);
    t[n].nd = nd;
    t[n].ne[0] = a, t[n].ne[1] = b, t[n].ne[2] = c;
    t[n].type = nd < 2 ? HM_TYPE_F32 : type;
    t[n].mean = mean, t[n].std = std;
    return n + 1;
}

/* Write the tiny model of n_layer layers to path, general.name `name`. */
static inline hm_status tq35_write(const char *path, int n_layer, int wtype, const char *name, hm_err *err) {
    const int64_t E = TQ35_E, Q = (int64_t)TQ35_NH * TQ35_HD, KV = (int64_t)TQ35_NKV * TQ35_HD;
    const int64_t vdim = (int64_t)TQ35_NV * TQ35_DV, cd = 2 * (int64_t)TQ35_NK * TQ35_DK + vdim;
    tq35_tensor *t = calloc(32 * (size_t)n_layer + 8, sizeof *t);
    if (!t) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    int n = 0;
    const float W = 0.02f, N = 0.05f;
    n = tq35_add(t, n, "token_embd.weight", 2, E, TQ35_VOCAB, 1, 0, (float)(32.0 * W * W * sqrt((double)Q * E)), wtype);
    char nm[64];
    for (int l = 0; l < n_layer; l++) {
#define T(s) (snprintf(nm, sizeof nm, "blk.%d." s, l), nm)
        n = tq35_add(t, n, T("attn_norm.weight"), 1, E, 1, 1, 1, N, wtype);
        if (tq35_recurrent(l)) {
            n = tq35_add(t, n, T("attn_qkv.weight"), 2, E, cd, 1, 0, W, wtype);
            n = tq35_add(t, n, T("attn_gate.weight"), 2, E, vdim, 1, 0, W, wtype);
            n = tq35_add(t, n, T("ssm_conv1d.weight"), 2, TQ35_DCONV, cd, 1, 0, 0.2f, HM_TYPE_F32);
            n = tq35_add(t, n, T("ssm_dt.bias"), 1, TQ35_NV, 1, 1, 1, 0.1f, wtype);
            n = tq35_add(t, n, T("ssm_a"), 1, TQ35_NV, 1, 1, -4, 0.5f, wtype);
            n = tq35_add(t, n, T("ssm_beta.weight"), 2, E, TQ35_NV, 1, 0, W, wtype);
            n = tq35_add(t, n, T("ssm_alpha.weight"), 2, E, TQ35_NV, 1, 0, W, wtype);
            n = tq35_add(t, n, T("ssm_norm.weight"), 1, TQ35_DV, 1, 1, 1, N, wtype);
            n = tq35_add(t, n, T("ssm_out.weight"), 2, vdim, E, 1, 0, W, wtype);
        } else {
            n = tq35_add(t, n, T("attn_q.weight"), 2, E, 2 * Q, 1, 0, W, wtype);
            n = tq35_add(t, n, T("attn_k.weight"), 2, E, KV, 1, 0, W, wtype);
            n = tq35_add(t, n, T("attn_v.weight"), 2, E, KV, 1, 0, W, wtype);
            n = tq35_add(t, n, T("attn_output.weight"), 2, Q, E, 1, 0, W, wtype);
            n = tq35_add(t, n, T("attn_q_norm.weight"), 1, TQ35_HD, 1, 1, 1, N, wtype);
            n = tq35_add(t, n, T("attn_k_norm.weight"), 1, TQ35_HD, 1, 1, 1, N, wtype);
        }
        n = tq35_add(t, n, T("post_attention_norm.weight"), 1, E, 1, 1, 1, N, wtype);
        n = tq35_add(t, n, T("ffn_gate_inp.weight"), 2, E, TQ35_NEXP, 1, 0, W, HM_TYPE_F32);
        n = tq35_add(t, n, T("ffn_gate_exps.weight"), 3, E, TQ35_FF, TQ35_NEXP, 0, W, wtype);
        n = tq35_add(t, n, T("ffn_up_exps.weight"), 3, E, TQ35_FF, TQ35_NEXP, 0, W, wtype);
        n = tq35_add(t, n, T("ffn_down_exps.weight"), 3, TQ35_FF, E, TQ35_NEXP, 0, W, wtype);
        n = tq35_add(t, n, T("ffn_gate_inp_shexp.weight"), 2, E, 1, 1, 0, W, HM_TYPE_F32);
        n = tq35_add(t, n, T("ffn_gate_shexp.weight"), 2, E, TQ35_FFSH, 1, 0, W, wtype);
        n = tq35_add(t, n, T("ffn_up_shexp.weight"), 2, E, TQ35_FFSH, 1, 0, W, wtype);
        n = tq35_add(t, n, T("ffn_down_shexp.weight"), 2, TQ35_FFSH, E, 1, 0, W, wtype);
#undef T
    }
    n = tq35_add(t, n, "output_norm.weight", 1, E, 1, 1, 1, N, wtype);
    n = tq35_add(t, n, "output.weight", 2, E, TQ35_VOCAB, 1, 0, (float)(8.0 / sqrt((double)E)), wtype);

    hm_gguf_writer *w = NULL;
    hm_status st = hm_gguf_writer_open(&w, path, 0, err);
    if (st != HM_OK) {
        free(t);
        return st;
    }
#define SET(call) do { if (!st) st = (call); } while (0)
#define A "qwen35moe."
    SET(hm_gguf_writer_set_str(w, "general.architecture", "qwen35moe"));
    SET(hm_gguf_writer_set_str(w, "general.name", name));
    SET(hm_gguf_writer_set_u32(w, A "block_count", (uint32_t)n_layer));
    SET(hm_gguf_writer_set_u32(w, A "context_length", 4096));
    SET(hm_gguf_writer_set_u32(w, A "embedding_length", TQ35_E));
    SET(hm_gguf_writer_set_u32(w, A "attention.head_count", TQ35_NH));
    SET(hm_gguf_writer_set_u32(w, A "attention.head_count_kv", TQ35_NKV));
    SET(hm_gguf_writer_set_u32(w, A "attention.key_length", TQ35_HD));
    SET(hm_gguf_writer_set_u32(w, A "attention.value_length", TQ35_HD));
    SET(hm_gguf_writer_set_f32(w, A "rope.freq_base", 1e7f));
    SET(hm_gguf_writer_set_u32(w, A "rope.dimension_count", TQ35_NROT));
    SET(hm_gguf_writer_set_f32(w, A "attention.layer_norm_rms_epsilon", 1e-6f));
    SET(hm_gguf_writer_set_u32(w, A "expert_count", TQ35_NEXP));
    SET(hm_gguf_writer_set_u32(w, A "expert_used_count", TQ35_K));
    SET(hm_gguf_writer_set_u32(w, A "expert_feed_forward_length", TQ35_FF));
    SET(hm_gguf_writer_set_u32(w, A "expert_shared_feed_forward_length", TQ35_FFSH));
    SET(hm_gguf_writer_set_u32(w, A "ssm.conv_kernel", TQ35_DCONV));
    SET(hm_gguf_writer_set_u32(w, A "ssm.state_size", TQ35_DK));
    SET(hm_gguf_writer_set_u32(w, A "ssm.group_count", TQ35_NK));
    SET(hm_gguf_writer_set_u32(w, A "ssm.time_step_rank", TQ35_NV));
    SET(hm_gguf_writer_set_u32(w, A "ssm.inner_size", (uint32_t)vdim));
    SET(hm_gguf_writer_set_u32(w, A "full_attention_interval", 4));
#undef A
    for (int i = 0; i < n; i++) SET(hm_gguf_writer_add_tensor(w, t[i].name, t[i].type, t[i].nd, t[i].ne));
    SET(hm_gguf_writer_begin_data(w));
    for (int i = 0; i < n && !st; i++) {
        const tq35_tensor *x = &t[i];
        const int64_t ne0 = x->ne[0], rows = x->ne[1] * x->ne[2];
        uint64_t seed = 1469598103934665603ull;
        for (const char *c = x->name; *c; c++) seed = (seed ^ (unsigned char)*c) * 1099511628211ull;
        float *row = malloc((size_t)ne0 * sizeof(float));
        const size_t rb = hm_row_size(x->type, ne0);
        void *qb = malloc(rb);
        if (!row || !qb) st = hm_errf(err, HM_ERR_NOMEM, "out of memory");
        for (int64_t r = 0; r < rows && !st; r++) {
            for (int64_t j = 0; j < ne0; j++) { /* ~gaussian: the sum of 4 uniforms, std 1 */
                float u = 0;
                for (int k = 0; k < 4; k++) u += (float)((double)tq35_rng(&seed) / 9007199254740992.0 * 2.0 - 1.0);
                row[j] = x->mean + x->std * u * 0.8660254f;
            }
            if (x->type == HM_TYPE_F32) {
                st = hm_gguf_writer_write(w, row, rb);
            } else {
                hm_type_get(x->type)->from_float_ref(row, qb, ne0);
                st = hm_gguf_writer_write(w, qb, rb);
            }
        }
        free(row);
        free(qb);
    }
#undef SET
    free(t);
    if (st != HM_OK) {
        hm_gguf_writer_abort(w);
        return st;
    }
    return hm_gguf_writer_finish(w);
}

#endif
