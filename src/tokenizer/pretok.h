/* pretok.h - the pre-tokenizers of byte-level BPE models, by their `tokenizer.ggml.pre` name.
 *
 * A pre-tokenizer is a sequence of regexes; each splits every piece the previous one produced
 * into matches and the gaps between them (Hugging Face's Split with behaviour "Isolated"), so a
 * later regex never sees across an earlier boundary. The regexes are the ones the models'
 * tokenizer.json files carry, compiled by PCRE2 with UTF + UCP (Unicode properties for \p, \s,
 * \w). `nfc` says the model's tokenizer.json normalises input to NFC first (Qwen). */
#ifndef HM_TOKENIZER_PRETOK_H
#define HM_TOKENIZER_PRETOK_H

#include <stdbool.h>
#include <stddef.h>

#define HM_PRETOK_MAX_REGEX 6

typedef struct hm_pretok_def {
    const char *name;                       /* tokenizer.ggml.pre value */
    const char *regex[HM_PRETOK_MAX_REGEX]; /* NULL-terminated sequence */
    bool nfc;                               /* NFC-normalise text segments before splitting */
    bool ignore_merges;                     /* a piece that is a whole vocab token is not merged */
} hm_pretok_def;

/* The definition for a `tokenizer.ggml.pre` value (aliases included), or NULL when unknown.
 * An absent key means "default" (llama.cpp's default regexes), as in llama.cpp. */
const hm_pretok_def *hm_pretok_find(const char *name, size_t len);
/* The i-th known definition (NULL past the end), for detection from tokenizer.json. */
const hm_pretok_def *hm_pretok_at(size_t i);

#endif
