/* logits_digest.c - a helper for refactors that must keep results byte-identical: runs a fixed set
 * of passes on a model and prints one 64-bit FNV-1a digest of the exact logit bytes of each, so
 * two builds (before / after) can be compared line by line.
 *
 * usage: logits_digest MODEL UBATCH f16|f32|bf16|q8_0|q4_0 [cpu|gpu|gpu:BYTES] [THREADS]
 *        logits_digest --write-q35 PATH f32|q8_0 LAYERS   (the tests' tiny qwen35moe, tiny_qwen35moe.h)
 * Passes (prompt: 37 token ids spread over the vocabulary):
 *   all      the prompt with every row's logits (no compaction)
 *   last     the prompt with the last row's logits only (the last layer's compaction), then
 *   dec1..6  six greedy decode steps after it
 *   nolog    a prompt without logits (the pass that stops at the last layer's K/V write), then
 *   after    one decode step
 *   batch    two sessions' prompts in one hm_batch_eval pass (n/a where the arch batches one)
 * gpu: -ngl 99 (every expert in VRAM); gpu:BYTES: --vram-budget BYTES (hot units on the GPU, the
 * others on the CPU). HOTMOE_CUDA_GRAPH=0 keeps decode off the CUDA graph. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hotmoe.h"
#include "tiny_qwen35moe.h"

static uint64_t fnv(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static int32_t argmax(const float *l, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (l[i] > l[best]) best = i;
    return best;
}

static void die(const char *what, const hm_err *e) {
    fprintf(stderr, "logits_digest: %s: %s\n", what, e->msg);
    exit(1);
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "--write-q35") == 0) {
        hm_err e = {0};
        const int type = strcmp(argv[3], "q8_0") == 0 ? HM_TYPE_Q8_0 : HM_TYPE_F32;
        if (tq35_write(argv[2], atoi(argv[4]), type, "tiny qwen35moe (logits_digest)", &e) != HM_OK) die("write", &e);
        return 0;
    }
    if (argc < 4) {
        fprintf(stderr, "usage: logits_digest MODEL UBATCH f16|f32|bf16|q8_0|q4_0 [cpu|gpu|gpu:BYTES] [THREADS]\n");
        return 2;
    }
    hm_err e = {0};
    hm_placement_opts po;
    hm_placement_opts_default(&po);
    const char *where = argc > 4 ? argv[4] : "cpu";
    if (strcmp(where, "gpu") == 0) po.n_gpu_layers = 99;
    else if (strncmp(where, "gpu:", 4) == 0) po.n_gpu_layers = 99, po.vram_budget = strtoll(where + 4, NULL, 10);
    hm_model_opts mo;
    hm_model_opts_default(&mo);
    mo.placement = &po;
    hm_model *m = NULL;
    if (hm_model_open(&m, argv[1], &mo, &e) != HM_OK) die("open", &e);
    const int32_t V = hm_model_get_info(m)->n_vocab;
    hm_session_opts so;
    hm_session_opts_default(&so);
    so.n_ctx = 128;
    so.n_ubatch = atoi(argv[2]);
    if (hm_kv_type_parse(argv[3], &so.kv_type, &e) != HM_OK) die("kv type", &e);
    so.n_threads = argc > 5 ? atoi(argv[5]) : 2;
    int32_t prompt[37], prompt2[23];
    for (int i = 0; i < 37; i++) prompt[i] = (int32_t)(((int64_t)i * 7919 + 13) % V);
    for (int i = 0; i < 23; i++) prompt2[i] = (int32_t)(((int64_t)i * 104729 + 5) % V);

    hm_session *s = NULL;
    const float *lg = NULL;
    if (hm_session_open(&s, m, &so, &e) != HM_OK) die("session", &e);
    if (hm_session_eval(s, prompt, 37, true, &lg, &e) != HM_OK) die("eval all", &e);
    printf("all    %016" PRIx64 "\n", fnv(lg, (size_t)37 * (size_t)V * sizeof(float)));
    hm_session_reset(s);
    if (hm_session_eval(s, prompt, 37, false, &lg, &e) != HM_OK) die("eval last", &e);
    printf("last   %016" PRIx64 "\n", fnv(lg, (size_t)V * sizeof(float)));
    for (int i = 1; i <= 6; i++) {
        const int32_t t = argmax(lg, V);
        if (hm_session_eval(s, &t, 1, false, &lg, &e) != HM_OK) die("decode", &e);
        printf("dec%d   %016" PRIx64 "\n", i, fnv(lg, (size_t)V * sizeof(float)));
    }
    hm_session_reset(s);
    if (hm_session_eval(s, prompt, 37, false, NULL, &e) != HM_OK) die("eval nolog", &e);
    printf("nolog  ok\n");
    const int32_t t0 = prompt[3];
    if (hm_session_eval(s, &t0, 1, false, &lg, &e) != HM_OK) die("after", &e);
    printf("after  %016" PRIx64 "\n", fnv(lg, (size_t)V * sizeof(float)));

    hm_session *s2 = NULL;
    if (hm_session_open(&s2, m, &so, &e) != HM_OK) die("session 2", &e);
    hm_session_reset(s);
    hm_session *const ss[2] = {s, s2};
    const int32_t *const toks[2] = {prompt, prompt2};
    const int32_t nt[2] = {37, 23};
    const float *lgs[2] = {NULL, NULL};
    hm_status st = hm_batch_eval(ss, toks, nt, 2, lgs, &e);
    if (st == HM_ERR_UNSUPPORTED) printf("batch  n/a\n");
    else if (st != HM_OK) die("batch", &e);
    else
        printf("batch  %016" PRIx64 " %016" PRIx64 "\n", fnv(lgs[0], (size_t)V * sizeof(float)),
               fnv(lgs[1], (size_t)V * sizeof(float)));
    hm_session_close(s2);
    hm_session_close(s);
    hm_model_close(m);
    return 0;
}
