/* chat_gemma.h - the Gemma 4 chat template (chat.c's table dispatches to it). */
#ifndef HM_TOKENIZER_CHAT_GEMMA_H
#define HM_TOKENIZER_CHAT_GEMMA_H

#include <stdbool.h>
#include <stddef.h>

#include "hotmoe.h"

/* True for Gemma 4's template (its turns open with "<|turn>"). */
bool hm_chat_gemma4_detect(const char *tmpl);

/* Render msgs as Gemma 4's template does for plain {role, content} conversations, enable_thinking
 * unset; malloc'd, NUL-terminated (caller frees); NULL when out of memory. */
char *hm_chat_gemma4_render(const hm_chat_msg *msgs, size_t n, const hm_chat_opts *o);

#endif
