/* tokenizer.h - the tokenizer module's contract inside the engine (the public half is the
 * "Tokenizer" section of hotmoe.h).
 *
 * A hm_tokenizer is built once from the tokenizer.* keys of a GGUF file and is immutable after
 * that: every call takes it const, scratch memory is per call, so threads may share one. It owns
 * copies of everything it needs; the GGUF file may be closed after hm_tokenizer_from_gguf.
 *
 * Vocabulary kinds (tokenizer.ggml.model):
 *   "gpt2"  byte-level BPE: pre-tokenizer regexes (tokenizer.ggml.pre, see pretok.h), then merges
 *           by rank over the bytes of each piece. Token text in the file is in GPT-2's byte <-> code
 *           point encoding; pieces are the raw bytes.
 *   "llama" SentencePiece BPE: spaces become U+2581, optional leading space, bigrams merged by
 *           score, characters without a token fall back to <0xNN> byte tokens.
 * Token types are GGUF's: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
 * Control and user-defined tokens are "special": when parse_special is on their text is matched
 * in the input (leftmost, longest first) before anything else; user-defined ones are matched
 * even when it is off (as llama.cpp does). */
#ifndef HM_TOKENIZER_H
#define HM_TOKENIZER_H

#include "../gguf/gguf.h"
#include "hotmoe.h"

enum {
    HM_TT_NORMAL = 1,
    HM_TT_UNKNOWN = 2,
    HM_TT_CONTROL = 3,
    HM_TT_USER_DEFINED = 4,
    HM_TT_UNUSED = 5,
    HM_TT_BYTE = 6,
};

/* Build from an open GGUF (borrowed during the call only). Errors name the key at fault. */
hm_status hm_tokenizer_from_gguf(hm_tokenizer **out, const hm_gguf *g, hm_err *err);

#endif
