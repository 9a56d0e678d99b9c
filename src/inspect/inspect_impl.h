/* inspect_impl.h - the facts `hotmoe inspect` gathers from a GGUF file, shared by the text
 * report (inspect.c) and the JSON report (inspect_json.c). Gathered once, printed by either;
 * everything borrowed points into the open hm_gguf. */
#ifndef HM_INSPECT_IMPL_H
#define HM_INSPECT_IMPL_H

#include <stdio.h>

#include "../experts/units.h"
#include "../gguf/gguf.h"
#include "../quant/quant.h"
#include "hotmoe_tools.h"

#define HM_INSPECT_NTYPE (HM_TYPE_COUNT + 1) /* last bucket: ids we do not know */

typedef struct hm_inspect_info {
    const hm_gguf *g;
    const char *path;
    hm_gguf_str arch;     /* general.architecture, len 0 if absent */
    hm_gguf_str name;     /* general.name, len 0 if absent */
    int64_t file_type;    /* general.file_type, -1 if absent */
    int64_t n_vocab;      /* tokens array, else <arch>.vocab_size, else token_embd ne[1]; -1 unknown */
    int64_t n_embd;       /* <arch>.embedding_length, -1 if absent */
    int64_t n_params;     /* elements of all tensors */
    hm_units units;

    /* tokenizer */
    hm_gguf_str tok_model, tok_pre; /* len 0 if absent */
    int64_t n_tokens;               /* -1: no token list */
    int64_t n_merges;               /* -1: no merges */
    int64_t bos_id, eos_id, pad_id; /* -1: not set */
    int64_t n_token_type[8];        /* count per token type 0..6, [7] other */
    bool has_chat_template;

    /* tensor table by type */
    int64_t type_count[HM_INSPECT_NTYPE];
    uint64_t type_bytes[HM_INSPECT_NTYPE];

    int64_t budget; /* < 0: not asked */
    int32_t kv_ctx; /* > 0: the KV cache of kv_ctx positions takes kv_bytes */
    uint64_t kv_bytes;
    const char *kv_type; /* "f16", "q8_0", ... */
} hm_inspect_info;

/* "<arch>.", or "" when the file names no architecture (then no key is a hyper-parameter). */
bool hm_inspect_is_hparam(const hm_inspect_info *in, const char *key);

/* Name of the llama.cpp file type (LLAMA_FTYPE_*) id, e.g. "Q4_K_M"; "?" if unknown. */
const char *hm_inspect_ftype_name(int64_t ftype);

/* Text of token id (borrowed), len 0 if out of range or no tokens. */
hm_gguf_str hm_inspect_token_text(const hm_inspect_info *in, int64_t id);

hm_status hm_inspect_print_json(const hm_inspect_info *in, FILE *out, hm_err *err);

#endif
