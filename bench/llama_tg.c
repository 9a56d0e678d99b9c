/* llama_tg.c - llama-bench's pp/tg tests with weight repacking switchable, as one JSON line.
 *
 *   llama_tg MODEL.gguf [N_PROMPT] [N_GEN] [THREADS] [REPACK 0|1] [SEED]
 *
 * llama-bench has no switch for llama.cpp's CPU weight repacking (the CPU_REPACK buffer type,
 * `--no-repack` in llama-cli / llama-completion): repacked tensors are copied out of the mmap into
 * anonymous memory, so a Q4_K model larger than RAM fails to load with it (bench/ssd_vs_mmap.sh).
 * This does what llama-bench does for `-p N_PROMPT -n N_GEN -r 1` with use_extra_bufts = REPACK
 * (default 0) and the default mmap: load once; pp: one untimed run, clear the memory, one timed
 * batch of N_PROMPT random ids; tg: one untimed token, clear, N_GEN tokens one at a time, each a
 * random id (llama-bench's test_gen). Ids uniform over the vocabulary (splitmix64, SEED).
 *
 * Built outside CMake against a llama.cpp build (bench/ssd_vs_mmap.sh does it, as
 * bench/llama_routing.sh does for llama_routing_hist.c): the baseline's side, not part of hotmoe. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "llama.h"

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int run_prompt(struct llama_context *ctx, struct llama_batch *b, int n, int32_t n_vocab, uint64_t *seed) {
    b->n_tokens = n;
    for (int j = 0; j < n; j++) {
        b->token[j] = (llama_token)(splitmix(seed) % (uint64_t)n_vocab);
        b->pos[j] = j;
        b->n_seq_id[j] = 1;
        b->seq_id[j][0] = 0;
        b->logits[j] = j == n - 1;
    }
    return llama_decode(ctx, *b);
}

static int run_gen(struct llama_context *ctx, int n, int32_t n_vocab, uint64_t *seed) {
    for (int i = 0; i < n; i++) {
        llama_token t = (llama_token)(splitmix(seed) % (uint64_t)n_vocab);
        if (llama_decode(ctx, llama_batch_get_one(&t, 1))) return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: llama_tg MODEL.gguf [N_PROMPT] [N_GEN] [THREADS] [REPACK 0|1] [SEED]\n");
        return 2;
    }
    const int npp = argc > 2 ? atoi(argv[2]) : 16, ngen = argc > 3 ? atoi(argv[3]) : 64;
    const int th = argc > 4 ? atoi(argv[4]) : 2, repack = argc > 5 ? atoi(argv[5]) : 0;
    uint64_t seed = argc > 6 ? strtoull(argv[6], NULL, 0) : 1;
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.use_extra_bufts = repack != 0;
    double t0 = now_s();
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) return 1;
    const double load_s = now_s() - t0;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(npp + ngen + 16);
    cp.n_batch = cp.n_ubatch = (uint32_t)(npp > 1 ? npp : 1);
    cp.n_threads = cp.n_threads_batch = th;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) return 1;
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    struct llama_batch b = llama_batch_init(npp > 1 ? npp : 1, 0, 1);
    double pp = 0, tg = 0;
    if (npp > 0) {
        if (run_prompt(ctx, &b, npp, n_vocab, &seed)) return 1; /* warm-up */
        llama_memory_clear(llama_get_memory(ctx), true);
        t0 = now_s();
        if (run_prompt(ctx, &b, npp, n_vocab, &seed)) return 1;
        pp = npp / (now_s() - t0);
    }
    if (ngen > 0) {
        llama_memory_clear(llama_get_memory(ctx), true);
        if (run_gen(ctx, 1, n_vocab, &seed)) return 1; /* warm-up */
        llama_memory_clear(llama_get_memory(ctx), true);
        t0 = now_s();
        if (run_gen(ctx, ngen, n_vocab, &seed)) return 1;
        tg = ngen / (now_s() - t0);
    }
    printf("{\"engine\": \"llama.cpp\", \"repack\": %d, \"n_prompt\": %d, \"n_gen\": %d, \"n_threads\": %d, "
           "\"load_s\": %.3f, \"pp_tok_s\": %.3f, \"tg_tok_s\": %.3f}\n",
           repack, npp, ngen, th, load_s, pp, tg);
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
