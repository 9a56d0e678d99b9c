/* fuzz_model.c - libFuzzer target for LOADING a model, not only parsing its GGUF.
 *
 * The input is a whole GGUF file (seeds: fuzz/corpus/model/, the smallest model of each arch,
 * tools/make_fuzz_seeds.py). It goes into a memfd and is opened by path (/proc/self/fd/N) the way
 * the CLI opens a file: hm_model_open (arch selection, every hparam, every tensor bound, the
 * expert store), the tokenizer from the same file (hm_tokenizer_open: tokens, merges, special
 * ids, pre-tokenizer), a short text tokenized, the file's chat template applied to three
 * messages, and, when both load, a session of
 * 8 positions evaluating two tokens (the header values that size the KV cache, activations and
 * the MoE routing meet real buffers). Failures must be HM_ERR_FORMAT / HM_ERR_UNSUPPORTED with a
 * message; anything else (a crash, a sanitizer report, another status, an empty message) aborts.
 * One thread: the machine is shared. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "hotmoe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int mem_fd = -1;
static char mem_path[64];
static volatile float sink;

static bool expected(hm_status st, const hm_err *err) {
    return (st == HM_ERR_FORMAT || st == HM_ERR_UNSUPPORTED) && err->msg[0];
}

static void use_tokenizer(const hm_tokenizer *t) {
    static const char text[] = "ab abc <|end|> a\xc3\xa9 b";
    int32_t *ids = NULL;
    size_t n = 0;
    hm_err err = {{0}};
    if (hm_tokenize(t, text, sizeof text - 1, NULL, &ids, &n, &err) != HM_OK) abort(); /* only out of memory */
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= hm_tokenizer_n_vocab(t)) abort();
        size_t len;
        const char *p = hm_token_piece(t, ids[i], &len);
        if (len) sink += (float)(unsigned char)p[len - 1];
    }
    free(ids);
    /* the file's chat template (tokenizer.chat_template), as run --chat and the server render it */
    const hm_chat_msg msgs[3] = {{"system", "be brief"}, {"user", "ab"}, {"assistant", NULL}};
    char *out = NULL;
    hm_status st = hm_chat_apply(hm_tokenizer_chat_template(t), msgs, 3, NULL, &out, &err);
    if (st != HM_OK && st != HM_ERR_UNSUPPORTED && st != HM_ERR_ARG) abort();
    if (st == HM_OK) sink += (float)strlen(out);
    free(out);
}

static void run_model(hm_model *m, const hm_tokenizer *t) {
    hm_session_opts so;
    hm_session_opts_default(&so);
    so.n_ctx = 8;
    so.n_threads = 1;
    hm_session *s = NULL;
    hm_err err = {{0}};
    hm_status st = hm_session_open(&s, m, &so, &err);
    if (st != HM_OK) {
        if (st != HM_ERR_NOMEM && !expected(st, &err)) abort();
        return;
    }
    int32_t nv = hm_model_n_vocab(m), tok[2] = {0, nv - 1};
    if (t && hm_tokenizer_bos(t) >= 0) tok[0] = hm_tokenizer_bos(t);
    const float *logits = NULL;
    st = hm_session_eval(s, tok, 2, false, &logits, &err);
    if (st != HM_OK) abort(); /* a loaded model evaluates any in-range token */
    sink += logits[0] + logits[nv - 1];
    hm_session_close(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (mem_fd < 0) {
        mem_fd = memfd_create("fuzz_model.gguf", MFD_CLOEXEC);
        if (mem_fd < 0) abort();
        snprintf(mem_path, sizeof mem_path, "/proc/self/fd/%d", mem_fd);
    }
    if (ftruncate(mem_fd, 0) != 0 || pwrite(mem_fd, data, size, 0) != (ssize_t)size) abort();

    hm_err err = {{0}};
    hm_tokenizer *t = NULL;
    hm_status st = hm_tokenizer_open(&t, mem_path, &err);
    if (st != HM_OK && !expected(st, &err)) abort();
    if (t) use_tokenizer(t);

    hm_model *m = NULL;
    memset(&err, 0, sizeof err);
    hm_model_opts mo;
    hm_model_opts_default(&mo);
    st = hm_model_open(&m, mem_path, &mo, &err);
    if (st != HM_OK) {
        if (m || !expected(st, &err)) abort();
    } else {
        const hm_model_info *inf = hm_model_get_info(m);
        if (inf->n_vocab <= 0 || inf->bos_id >= inf->n_vocab || inf->eos_id >= inf->n_vocab) abort();
        if (t && hm_tokenizer_n_vocab(t) > inf->n_vocab) abort(); /* its ids must index the embedding */
        run_model(m, t);
        hm_model_close(m);
    }
    hm_tokenizer_close(t);
    return 0;
}
