/* cmd_perplexity.c - `hotmoe perplexity`: llama-perplexity's method, so the numbers compare.
 *   - tokenize the whole file (BOS first when the vocabulary adds one);
 *   - split into chunks of CTX tokens (the tail that does not fill a chunk is dropped); at least
 *     2 chunks' worth of tokens, else an error saying how many are needed;
 *   - each chunk runs in an empty context; when the vocabulary adds BOS, the chunk's first token
 *     is replaced by BOS (llama.cpp's rule);
 *   - only the second half is scored: positions first = CTX/2 .. CTX-2 predict tokens
 *     first+1 .. CTX-1; nll = -log softmax(logits)[next];
 *   - after each chunk print [i]ppl so far; last line
 *     `Final estimate: PPL = <exp(mean nll)> +/- <ppl * stddev(nll) / sqrt(count - 1)>`.
 * The first half of a chunk is evaluated without logits (it only fills the KV cache). */
#include <math.h>
#include <time.h>

#include "cmd_engine.h"

static void usage(FILE *f) {
    fprintf(f, "usage: hotmoe perplexity -m MODEL -f TEXT [-c CTX] [--chunks N] [options]\n\n"
               "  -f, --file FILE        text to score (needs at least 2 x CTX tokens)\n"
               "  -c, --ctx-size N       tokens per chunk (default 512)\n"
               "  --chunks N             score at most N chunks (default: all)\n" CLI_ENGINE_HELP);
}

/* -log p(tok) under softmax(logits[n]) in double. */
static double nll_of(const float *logits, int32_t n, int32_t tok) {
    float mx = logits[0];
    for (int32_t i = 1; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (int32_t i = 0; i < n; i++) sum += exp((double)(logits[i] - mx));
    return -((double)(logits[tok] - mx) - log(sum));
}

int hm_cmd_perplexity(int argc, char **argv) {
    cli_engine e = {.cmd = "perplexity"};
    const char *file = NULL;
    long max_chunks = -1;
    for (int i = 1; i < argc; i++) {
        int r = cli_common_arg(&e, argc, argv, &i, usage);
        if (r == CLI_ARG_NEXT) continue;
        if (r != CLI_ARG_OWN) return r;
        const char *a = argv[i], *v;
        if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if (!(file = cli_value(e.cmd, argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--chunks")) {
            if (!(v = cli_value(e.cmd, argc, argv, &i)) || cli_long(e.cmd, a, v, 1, 1 << 30, &max_chunks)) return 2;
        } else {
            return cli_unknown_arg(&e, a, usage);
        }
    }
    if (cli_need_model(&e)) return 2;
    if (!file) {
        fprintf(stderr, "hotmoe perplexity: no text given (-f FILE)\n");
        return 2;
    }
    const int32_t n_ctx = e.n_ctx ? e.n_ctx : 512;
    if (n_ctx < 4) {
        fprintf(stderr, "hotmoe perplexity: -c %d is too small (need >= 4)\n", n_ctx);
        return 2;
    }
    size_t len;
    char *text = cli_read_file(e.cmd, file, &len);
    if (!text) return 1;

    hm_err err;
    hm_tokenizer *tk = NULL;
    hm_model *m = NULL;
    hm_session *s = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc = 1;
    if (hm_tokenizer_open(&tk, e.model, &err) != HM_OK) {
        fprintf(stderr, "hotmoe perplexity: %s\n", err.msg);
        goto done;
    }
    hm_tokenize_opts to;
    hm_tokenize_opts_default(tk, &to); /* add_bos as the file says, special tokens parsed */
    if (hm_tokenize(tk, text, len, &to, &ids, &n_ids, &err) != HM_OK) {
        fprintf(stderr, "hotmoe perplexity: %s\n", err.msg);
        goto done;
    }
    fprintf(stderr, "hotmoe perplexity: %s: %zu tokens\n", file, n_ids);
    if (n_ids < 2 * (size_t)n_ctx) {
        fprintf(stderr, "hotmoe perplexity: you need at least %d tokens to evaluate perplexity with a context of %d "
                        "(the file has %zu)\n", 2 * n_ctx, n_ctx, n_ids);
        goto done;
    }
    if (!(m = cli_open_model(&e)) || !(s = cli_open_session(&e, m, n_ctx))) goto done;

    const int32_t n_vocab = hm_model_n_vocab(m);
    const bool add_bos = hm_tokenizer_add_bos(tk) && hm_tokenizer_bos(tk) >= 0;
    const int32_t first = n_ctx / 2;
    long n_chunk = (long)(n_ids / (size_t)n_ctx);
    if (max_chunks > 0 && max_chunks < n_chunk) n_chunk = max_chunks;
    fprintf(stderr, "hotmoe perplexity: %ld chunks of %d tokens, scoring the second half of each, %d threads\n",
            n_chunk, n_ctx, hm_session_n_threads(s));

    double nll = 0, nll2 = 0;
    long count = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long c = 0; c < n_chunk; c++) {
        int32_t *chunk = ids + (size_t)c * (size_t)n_ctx;
        int32_t saved = chunk[0];
        if (add_bos) chunk[0] = hm_tokenizer_bos(tk);
        const float *lg = NULL;
        hm_session_reset(s);
        hm_status st = hm_session_eval(s, chunk, first, false, NULL, &err);
        if (st == HM_OK) st = hm_session_eval(s, chunk + first, n_ctx - first, true, &lg, &err);
        chunk[0] = saved;
        if (st != HM_OK) {
            fprintf(stderr, "hotmoe perplexity: chunk %ld: %s\n", c + 1, err.msg);
            goto done;
        }
        /* row j of lg is position first + j; it predicts token first + j + 1 */
        for (int32_t j = 0; j < n_ctx - 1 - first; j++) {
            double v = nll_of(lg + (size_t)j * (size_t)n_vocab, n_vocab, chunk[first + j + 1]);
            nll += v;
            nll2 += v * v;
            count++;
        }
        if (c == 0) {
            clock_gettime(CLOCK_MONOTONIC, &t1);
            double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
            fprintf(stderr, "hotmoe perplexity: %.2f s per chunk, about %.1f min in all\n", secs,
                    secs * (double)n_chunk / 60.0);
        }
        printf("[%ld]%.4f,", c + 1, exp(nll / (double)count));
        fflush(stdout);
    }
    printf("\n");
    {
        double mean = nll / (double)count, var = nll2 / (double)count - mean * mean;
        double ppl = exp(mean);
        if (var > 0 && count > 1)
            printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl, sqrt(var / (double)(count - 1)) * ppl);
        else
            printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl, 0.0);
    }
    rc = cli_engine_finish(&e, m);
done:
    hm_session_close(s);
    hm_model_close(m);
    hm_tokenizer_close(tk);
    free(ids);
    free(text);
    return rc;
}
