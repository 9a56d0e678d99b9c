/* llama_routing_hist.c - llama.cpp's routing of a model, as a hotmoe.profile.v1 file.
 *
 *   llama_routing_hist MODEL.gguf OUT.json [TOKENS] [CTX] [SEED]
 *
 * Feeds TOKENS (default 2048) random token ids, uniform over the vocabulary and drawn with the
 * same generator and seed as bench_synth_routing (so both engines see the same tokens), through
 * llama.cpp in sequences of CTX (default 512) positions, one batch per sequence with logits for
 * every row (otherwise llama.cpp's last layer routes only the output rows), clearing the memory
 * between sequences. The graph callback reads every "ffn_moe_topk-<layer>" tensor (I32 [k, n_tok])
 * and counts (layer, expert). Writes the counts as hotmoe.profile.v1 (docs/PROFILE.md).
 *
 * Built outside CMake, against a llama.cpp build (bench/llama_routing.sh does it): it is the
 * llama.cpp side of checking `hotmoe synth --routing-profile`, not part of hotmoe. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

static int n_layer, n_expert;
static uint64_t *counts; /* [n_layer * n_expert] */
static int64_t topk_tensors;

static bool on_tensor(struct ggml_tensor *t, bool ask, void *ud) {
    (void)ud;
    int layer;
    if (strncmp(t->name, "ffn_moe_topk-", 13) != 0 || sscanf(t->name + 13, "%d", &layer) != 1) return ask ? false : true;
    if (ask) return true;
    if (t->type != GGML_TYPE_I32 || layer < 0 || layer >= n_layer) return true;
    size_t n = (size_t)ggml_nelements(t);
    int32_t *ids = malloc(n * sizeof *ids);
    if (!ids) return false;
    if (ggml_is_contiguous(t)) ggml_backend_tensor_get(t, ids, 0, n * sizeof *ids);
    else { /* a view: rows of ne[0] at stride nb[1] */
        for (int64_t r = 0; r < t->ne[1]; r++)
            ggml_backend_tensor_get(t, ids + r * t->ne[0], (size_t)r * t->nb[1], (size_t)t->ne[0] * sizeof *ids);
    }
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < n_expert) counts[(size_t)layer * (size_t)n_expert + (size_t)ids[i]]++;
    free(ids);
    topk_tensors++;
    return true;
}

static uint64_t splitmix(uint64_t *s) { /* bench_synth_routing's generator */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int meta_int(const struct llama_model *m, const char *key) {
    char buf[64];
    if (llama_model_meta_val_str(m, key, buf, sizeof buf) < 0) return -1;
    return atoi(buf);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: llama_routing_hist MODEL.gguf OUT.json [TOKENS] [CTX] [SEED]\n");
        return 2;
    }
    const int64_t n_tokens = argc > 3 ? atoll(argv[3]) : 2048;
    const int n_ctx = argc > 4 ? atoi(argv[4]) : 512;
    uint64_t seed = argc > 5 ? strtoull(argv[5], NULL, 0) : 1;
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) return 1;
    char arch[64] = "";
    llama_model_meta_val_str(model, "general.architecture", arch, sizeof arch);
    char key[128];
    snprintf(key, sizeof key, "%s.block_count", arch);
    n_layer = meta_int(model, key);
    snprintf(key, sizeof key, "%s.expert_count", arch);
    n_expert = meta_int(model, key);
    snprintf(key, sizeof key, "%s.expert_used_count", arch);
    const int k = meta_int(model, key);
    if (n_layer < 1 || n_expert < 1 || k < 1) {
        fprintf(stderr, "not an MoE model (block_count %d, expert_count %d)\n", n_layer, n_expert);
        return 1;
    }
    counts = calloc((size_t)n_layer * (size_t)n_expert, sizeof *counts);

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)n_ctx;
    cp.n_batch = (uint32_t)n_ctx;
    cp.n_ubatch = (uint32_t)n_ctx;
    cp.cb_eval = on_tensor;
    cp.cb_eval_user_data = NULL;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) return 1;
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    struct llama_batch batch = llama_batch_init(n_ctx, 0, 1);
    for (int64_t i = 0; i < n_tokens;) {
        llama_memory_clear(llama_get_memory(ctx), true);
        int n = (int)(n_tokens - i < n_ctx ? n_tokens - i : n_ctx);
        batch.n_tokens = n;
        for (int j = 0; j < n; j++) {
            batch.token[j] = (llama_token)(splitmix(&seed) % (uint64_t)n_vocab);
            batch.pos[j] = j;
            batch.n_seq_id[j] = 1;
            batch.seq_id[j][0] = 0;
            batch.logits[j] = 1;
        }
        if (llama_decode(ctx, batch)) {
            fprintf(stderr, "llama_decode failed\n");
            return 1;
        }
        i += n;
    }
    llama_batch_free(batch);

    FILE *f = fopen(argv[2], "w");
    if (!f) return 1;
    fprintf(f, "{\"schema\": \"hotmoe.profile.v1\", \"model\": \"llama.cpp routing\", \"arch\": \"%s\",\n", arch);
    fprintf(f, " \"n_layer\": %d, \"n_expert\": %d, \"k\": %d, \"tokens\": %lld, \"prompt_tokens\": %lld,\n", n_layer,
            n_expert, k, (long long)n_tokens, (long long)n_tokens);
    fprintf(f, " \"decode_tokens\": 0, \"steps\": 0, \"unit_bytes\": 0, \"layers\": [\n");
    for (int l = 0; l < n_layer; l++) {
        uint64_t tot = 0;
        for (int e = 0; e < n_expert; e++) tot += counts[(size_t)l * (size_t)n_expert + (size_t)e];
        fprintf(f, "  {\"layer\": %d, \"total\": %llu, \"counts\": [", l, (unsigned long long)tot);
        for (int e = 0; e < n_expert; e++)
            fprintf(f, "%s%llu", e ? ", " : "", (unsigned long long)counts[(size_t)l * (size_t)n_expert + (size_t)e]);
        fprintf(f, "]}%s\n", l + 1 < n_layer ? "," : "");
    }
    fprintf(f, "]}\n");
    fclose(f);
    fprintf(stderr, "llama_routing_hist: %lld tokens, %lld topk tensors read, wrote %s\n", (long long)n_tokens,
            (long long)topk_tensors, argv[2]);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
