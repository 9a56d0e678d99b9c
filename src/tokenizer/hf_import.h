/* hf_import.h - turn a Hugging Face tokenizer.json (+ tokenizer_config.json) into the GGUF
 * tokenizer keys, written through the GGUF writer. Used by `hotmoe synth --tokenizer` and by
 * `hotmoe tokenize --vocab-from` (vocab-only files for tests).
 *
 * Supported: byte-level BPE (model.type "BPE" with a ByteLevel pre-tokenizer/decoder), the
 * flavour of Qwen, Llama 3, DeepSeek and GPT-2. Keys written (llama.cpp's names and meanings):
 *   tokenizer.ggml.model = "gpt2", tokenizer.ggml.pre (detected from the pre-tokenizer regexes,
 *   or opts.pre), tokenizer.ggml.tokens, tokenizer.ggml.token_type (1 normal, 3 control = added
 *   special, 4 user-defined = added non-special, 5 unused = padding), tokenizer.ggml.merges
 *   ("left right"), tokenizer.ggml.{bos,eos,padding}_token_id when the config names them,
 *   tokenizer.ggml.add_bos_token, tokenizer.chat_template when the config has one. */
#ifndef HM_TOKENIZER_HF_IMPORT_H
#define HM_TOKENIZER_HF_IMPORT_H

#include <stdint.h>

#include "../gguf/gguf.h"

typedef struct hm_hf_import_opts {
    int32_t pad_vocab_to; /* > n tokens: append "[PAD<id>]" unused tokens up to this count (a
                             model's embedding rows); 0 = no padding */
    const char *pre;      /* tokenizer.ggml.pre to write; NULL = detect (error when unknown) */
} hm_hf_import_opts;

/* Read tokenizer_json (path, required) and tokenizer_config_json (path, NULL = none) and add the
 * keys above to w, which must not have begun its data section. *n_vocab_out (may be NULL)
 * receives the number of tokens written, padding included. Errors name the file and field. */
hm_status hm_tokenizer_import_hf(hm_gguf_writer *w, const char *tokenizer_json,
                                 const char *tokenizer_config_json, const hm_hf_import_opts *o,
                                 int32_t *n_vocab_out, hm_err *err);

#endif
