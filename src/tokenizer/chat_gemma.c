/* chat_gemma.c - Gemma 4's chat template (google/gemma-4-*-it chat_template.jinja) for plain
 * {role, content} conversations with enable_thinking unset (its default):
 *   [<|turn>system\n{trim(system or developer content)}<turn|>\n]      first message only
 *   <|turn>user\n{trim(content)}<turn|>\n
 *   <|turn>model\n{strip_thinking(content)}<turn|>\n                    role "assistant"
 *   ... [+ <|turn>model\n<|channel>thought\n<channel|>]                 add_generation_prompt
 * strip_thinking drops every <|channel>...<channel|> part and trims the rest; an assistant
 * message right after another assistant message (tool messages between them do not count)
 * continues the same model turn, without a new "<|turn>model\n". Tool messages render nothing
 * here (the template folds them into the preceding tool call, which plain messages do not have).
 * The template's leading bos_token is not rendered: the tokenizer adds BOS (add_bos_token). */
#include "chat_gemma.h"

#include <stdlib.h>
#include <string.h>

typedef struct gbuf {
    char *p;
    size_t n, cap;
    bool oom;
} gbuf;

static void put(gbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->n + n + 1 > cap) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void puts_(gbuf *b, const char *s) { put(b, s, strlen(s)); }

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* Jinja's trim: leading and trailing whitespace of s[0..n). */
static void put_trimmed(gbuf *b, const char *s, size_t n) {
    while (n && is_space(*s)) s++, n--;
    while (n && is_space(s[n - 1])) n--;
    put(b, s, n);
}

/* strip_thinking: split on <channel|>; of each part keep what precedes <|channel> (the whole part
 * when it has none); then trim the concatenation. */
static void put_stripped(gbuf *b, const char *c) {
    gbuf t = {0};
    const char *p = c;
    for (;;) {
        const char *end = strstr(p, "<channel|>");
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *open = NULL;
        for (const char *q = p; q + 10 <= p + len; q++)
            if (memcmp(q, "<|channel>", 10) == 0) {
                open = q;
                break;
            }
        put(&t, p, open ? (size_t)(open - p) : len);
        if (!end) break;
        p = end + 10;
    }
    if (t.oom) b->oom = true;
    else if (t.p) put_trimmed(b, t.p, t.n);
    free(t.p);
}

bool hm_chat_gemma4_detect(const char *tmpl) { return strstr(tmpl, "<|turn>") != NULL; }

char *hm_chat_gemma4_render(const hm_chat_msg *m, size_t n, const hm_chat_opts *o) {
    gbuf b = {0};
    size_t i0 = 0;
    put(&b, "", 0);
    if (n && (strcmp(m[0].role, "system") == 0 || strcmp(m[0].role, "developer") == 0)) {
        const char *c = m[0].content ? m[0].content : "";
        puts_(&b, "<|turn>system\n");
        put_trimmed(&b, c, strlen(c));
        puts_(&b, "<turn|>\n");
        i0 = 1;
    }
    const char *prev = NULL; /* role of the previous non-tool message */
    for (size_t i = i0; i < n; i++) {
        const char *role = m[i].role, *c = m[i].content ? m[i].content : "";
        if (strcmp(role, "tool") == 0) continue;
        const bool model = strcmp(role, "assistant") == 0;
        if (!(model && prev && strcmp(prev, "assistant") == 0)) {
            puts_(&b, "<|turn>");
            puts_(&b, model ? "model" : role);
            puts_(&b, "\n");
        }
        if (model) put_stripped(&b, c);
        else put_trimmed(&b, c, strlen(c));
        puts_(&b, "<turn|>\n");
        prev = role;
    }
    if (o->add_generation_prompt) puts_(&b, "<|turn>model\n<|channel>thought\n<channel|>");
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}
