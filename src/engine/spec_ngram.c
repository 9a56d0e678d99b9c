/* spec_ngram.c - ngram-simple, self-speculation from the history (llama.cpp's
 * common_ngram_simple_draft rule, written from its description): the last size_n tokens, the
 * pending one last, are searched backwards in the history; the tokens that followed their latest
 * earlier occurrence are the draft. No state: the history is the caller's. O(n * size_n) per step
 * in the worst case, nothing allocated. */
#include "spec.h"

int32_t hm_spec_ngram_simple(const int32_t *hist, int32_t n, int32_t tok, int32_t size_n, int32_t size_m,
                             int32_t *draft, int32_t cap) {
    if (size_n < 1 || size_m < 1 || n <= size_n + size_m + 1) return 0;
    /* pattern = hist[n - size_n + 1 .. n) + tok; candidate starts j from n - size_n - 1 down to 1 */
    const int32_t *pat = hist + n - size_n + 1;
    int32_t match = 0;
    for (int32_t j = n - size_n - 1; j > 0; j--) {
        int32_t k = 0;
        while (k < size_n - 1 && hist[j + k] == pat[k]) k++;
        if (k == size_n - 1 && hist[j + size_n - 1] == tok) {
            match = j;
            break;
        }
    }
    if (match == 0) return 0;
    int32_t len = n - (match + size_n);
    if (len > size_m) len = size_m;
    if (len < size_n) return 0;
    if (len > cap) len = cap;
    for (int32_t i = 0; i < len; i++) draft[i] = hist[match + size_n + i];
    return len;
}
