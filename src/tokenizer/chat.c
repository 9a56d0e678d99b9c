/* chat.c - chat templates. We do not run Jinja: each supported family is recognised from the
 * template text (tokenizer.chat_template) and rendered by a small C function that produces what
 * the Jinja template would for plain {role, content} conversations. Adding a family = one
 * detect + one render function in the table below. gemma4 (<|turn>): chat_gemma.c.
 *
 * chatml (Qwen 2/2.5/3, and others using <|im_start|>):
 *   <|im_start|>{role}\n{content}<|im_end|>\n ... [+ <|im_start|>assistant\n]
 *   Qwen3's extras, applied when the template mentions them: assistant turns before the last
 *   user turn lose their <think>...</think> part; consecutive "tool" messages are grouped into
 *   one user turn of <tool_response> blocks; no_thinking appends an empty think block to the
 *   generation prompt (enable_thinking=false).
 *
 * chatglm4, deepseek3 and harmony are llama.cpp's built-in renderings (llama_chat_apply_template,
 * src/llama-chat.cpp), recognised by the same strings in the same order of precedence:
 *   chatglm4 (GLM-4, GLM-4.5/4.6: "[gMASK]<sop>"):
 *     [gMASK]<sop><|{role}|>\n{content} ... [+ <|assistant|>\n]
 *   deepseek3 (DeepSeek-V3/R1 and V4: <｜User｜>, <｜Assistant｜>, <｜end▁of▁sentence｜>):
 *     system: {content}\n\n   user: <｜User｜>{content}
 *     assistant: <｜Assistant｜>{content}<｜end▁of▁sentence｜>   (other roles: nothing)
 *     [+ <｜Assistant｜>]; BOS is the tokenizer's (add_bos_token)
 *   harmony (gpt-oss: "<|start|>" and "<|channel|>"):
 *     <|start|>{role}<|message|>{content}<|end|>  (assistant turns end in <|return|>)
 *     [+ <|start|>assistant]
 * These are not the Jinja renders (no Harmony system preamble, no GLM think block): they are what
 * llama.cpp's server gives without --jinja. tests/test_tokenizer_chat.c holds llama.cpp's bytes. */
#include <stdlib.h>
#include <string.h>

#include "../core/status.h"
#include "chat_gemma.h"
#include "tokenizer_impl.h"

typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->n + n + 1 > cap) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = true; return; }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static bool starts_with(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }
static bool ends_with(const char *s, const char *p) {
    size_t ls = strlen(s), lp = strlen(p);
    return ls >= lp && memcmp(s + ls - lp, p, lp) == 0;
}

static bool detect_chatml(const char *tmpl) { return strstr(tmpl, "<|im_start|>") != NULL; }

/* Qwen3: the answer part of an assistant turn is what follows the last </think> (leading
 * newlines dropped); its reasoning is what lies between the last <think> before the first
 * </think> and that </think>, newlines trimmed. Turns after the last user query keep the
 * reasoning (rendered as a think block) when it is non-empty or the turn is the last message. */
static void render_qwen3_assistant(sbuf *b, const char *c, bool after_query, bool is_last) {
    const char *answer = c, *r0 = c, *r1 = c;
    const char *first_end = strstr(c, "</think>");
    if (first_end) {
        const char *p = c, *e = NULL;
        while ((p = strstr(p, "</think>"))) e = p, p += 8;
        answer = e + 8;
        while (*answer == '\n') answer++;
        r0 = c;
        r1 = first_end;
        for (const char *q = c; (q = strstr(q, "<think>")) && q < first_end; q += 7) r0 = q + 7;
        while (r1 > r0 && r1[-1] == '\n') r1--;
        while (r0 < r1 && *r0 == '\n') r0++;
    }
    sb_str(b, "<|im_start|>assistant\n");
    if (after_query && (is_last || r1 > r0)) {
        sb_str(b, "<think>\n");
        sb_put(b, r0, (size_t)(r1 - r0));
        sb_str(b, "\n</think>\n\n");
        while (*answer == '\n') answer++;
    }
    sb_str(b, answer);
    sb_str(b, "<|im_end|>\n");
}

static void render_chatml(sbuf *b, const char *tmpl, const hm_chat_msg *m, size_t n,
                          const hm_chat_opts *o) {
    bool strip_think = strstr(tmpl, "</think>") != NULL;
    bool tool_groups = strstr(tmpl, "<tool_response>") != NULL;
    /* last user turn that is not a tool response (Qwen3's last_query_index) */
    size_t last_query = n ? n - 1 : 0;
    for (size_t i = n; i-- > 0;) {
        const char *c = m[i].content ? m[i].content : "";
        if (strcmp(m[i].role, "user") == 0 &&
            !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
            last_query = i;
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const char *role = m[i].role, *c = m[i].content ? m[i].content : "";
        if (tool_groups && strcmp(role, "tool") == 0) {
            if (i == 0 || strcmp(m[i - 1].role, "tool") != 0) sb_str(b, "<|im_start|>user");
            sb_str(b, "\n<tool_response>\n");
            sb_str(b, c);
            sb_str(b, "\n</tool_response>");
            if (i + 1 == n || strcmp(m[i + 1].role, "tool") != 0) sb_str(b, "<|im_end|>\n");
            continue;
        }
        if (strip_think && strcmp(role, "assistant") == 0) {
            render_qwen3_assistant(b, c, i > last_query, i + 1 == n);
            continue;
        }
        sb_str(b, "<|im_start|>");
        sb_str(b, role);
        sb_str(b, "\n");
        sb_str(b, c);
        sb_str(b, "<|im_end|>\n");
    }
    if (o->add_generation_prompt) {
        sb_str(b, "<|im_start|>assistant\n");
        if (o->no_thinking && strstr(tmpl, "enable_thinking")) sb_str(b, "<think>\n\n</think>\n\n");
    }
}

/* gemma4: chat_gemma.c */
static void render_gemma4(sbuf *b, const char *tmpl, const hm_chat_msg *m, size_t n, const hm_chat_opts *o) {
    (void)tmpl;
    char *s = hm_chat_gemma4_render(m, n, o);
    if (!s) b->oom = true;
    else sb_str(b, s);
    free(s);
}

/* llama.cpp's detection (llm_chat_detect_template): earlier families it checks first win */
static bool has(const char *t, const char *s) { return strstr(t, s) != NULL; }
static bool is_mistral_or_phi3(const char *t) {
    return strncmp(t, "mistral", 7) == 0 || has(t, "[INST]") || (has(t, "<|assistant|>") && has(t, "<|end|>"));
}
static bool detect_chatglm4(const char *t) { return has(t, "[gMASK]<sop>") && !is_mistral_or_phi3(t); }
static bool detect_deepseek3(const char *t) {
    return has(t, "<｜Assistant｜>") && has(t, "<｜User｜>") &&
           has(t, "<｜end▁of▁sentence｜>") && !is_mistral_or_phi3(t) &&
           !has(t, "[gMASK]<sop>") && !has(t, "'Assistant: ' + message['content'] + eos_token");
}
static bool detect_harmony(const char *t) {
    return has(t, "<|start|>") && has(t, "<|channel|>") && !is_mistral_or_phi3(t) && !has(t, "[gMASK]<sop>") &&
           !has(t, "<|start_header_id|>") && !has(t, "<|header_start|>");
}

static void render_chatglm4(sbuf *b, const char *tmpl, const hm_chat_msg *m, size_t n, const hm_chat_opts *o) {
    (void)tmpl;
    sb_str(b, "[gMASK]<sop>");
    for (size_t i = 0; i < n; i++) {
        sb_str(b, "<|");
        sb_str(b, m[i].role);
        sb_str(b, "|>\n");
        sb_str(b, m[i].content ? m[i].content : "");
    }
    if (o->add_generation_prompt) sb_str(b, "<|assistant|>\n");
}

static void render_deepseek3(sbuf *b, const char *tmpl, const hm_chat_msg *m, size_t n, const hm_chat_opts *o) {
    (void)tmpl;
    for (size_t i = 0; i < n; i++) {
        const char *c = m[i].content ? m[i].content : "";
        if (strcmp(m[i].role, "system") == 0) {
            sb_str(b, c);
            sb_str(b, "\n\n");
        } else if (strcmp(m[i].role, "user") == 0) {
            sb_str(b, "<｜User｜>");
            sb_str(b, c);
        } else if (strcmp(m[i].role, "assistant") == 0) {
            sb_str(b, "<｜Assistant｜>");
            sb_str(b, c);
            sb_str(b, "<｜end▁of▁sentence｜>");
        }
    }
    if (o->add_generation_prompt) sb_str(b, "<｜Assistant｜>");
}

static void render_harmony(sbuf *b, const char *tmpl, const hm_chat_msg *m, size_t n, const hm_chat_opts *o) {
    (void)tmpl;
    for (size_t i = 0; i < n; i++) {
        sb_str(b, "<|start|>");
        sb_str(b, m[i].role);
        sb_str(b, "<|message|>");
        sb_str(b, m[i].content ? m[i].content : "");
        sb_str(b, strcmp(m[i].role, "assistant") == 0 ? "<|return|>" : "<|end|>");
    }
    if (o->add_generation_prompt) sb_str(b, "<|start|>assistant");
}

static const struct chat_fmt {
    const char *name;
    bool (*detect)(const char *tmpl);
    void (*render)(sbuf *b, const char *tmpl, const hm_chat_msg *m, size_t n, const hm_chat_opts *o);
} formats[] = {
    {"chatml", detect_chatml, render_chatml},
    {"gemma4", hm_chat_gemma4_detect, render_gemma4},
    {"chatglm4", detect_chatglm4, render_chatglm4},
    {"deepseek3", detect_deepseek3, render_deepseek3},
    {"harmony", detect_harmony, render_harmony},
};

const char *hm_chat_template_name(const char *tmpl) {
    if (!tmpl) return NULL;
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
        if (formats[i].detect(tmpl)) return formats[i].name;
    return NULL;
}

hm_status hm_chat_apply(const char *tmpl, const hm_chat_msg *msgs, size_t n, const hm_chat_opts *o,
                        char **out, hm_err *err) {
    *out = NULL;
    hm_chat_opts def = {.add_generation_prompt = true};
    if (!o) o = &def;
    if (!tmpl || !*tmpl)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "the model has no chat template (tokenizer.chat_template)");
    const struct chat_fmt *f = NULL;
    for (size_t i = 0; i < sizeof formats / sizeof formats[0] && !f; i++)
        if (formats[i].detect(tmpl)) f = &formats[i];
    if (!f) {
        char head[81];
        size_t k = 0;
        for (const char *p = tmpl; *p && k < 80; p++) head[k++] = (*p == '\n' || *p == '\r') ? ' ' : *p;
        head[k] = 0;
        return hm_errf(err, HM_ERR_UNSUPPORTED,
                       "chat template not recognised (supported: chatml / <|im_start|>, gemma4 / <|turn>, chatglm4 / "
                       "[gMASK]<sop>, deepseek3 / <｜User｜>, harmony / <|start|> + <|channel|>); it begins: \"%s%s\"",
                       head, strlen(tmpl) > 80 ? "..." : "");
    }
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role || !*msgs[i].role)
            return hm_errf(err, HM_ERR_ARG, "chat message %zu has no role", i);
    sbuf b = {0};
    f->render(&b, tmpl, msgs, n, o);
    sb_put(&b, "", 0);
    if (b.oom || !b.p) {
        free(b.p);
        return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    }
    *out = b.p;
    return HM_OK;
}
