/* chat_reply.c - split a generated reply into its content and its reasoning, for the chat
 * families that mark them (hotmoe.h: hm_chat_reply). Harmony (gpt-oss) writes messages
 *   [<|start|>assistant]<|channel|>{name}[ to=...][<|constrain|>...]<|message|>{body}<|end|>
 * and ends the last one with <|return|> or <|call|> (end-of-generation tokens, so they never reach
 * us as text). The bodies of "analysis" messages are reasoning; every other body (final,
 * commentary) is content; headers and the markers themselves are dropped. A reply that does not
 * open with <|channel|> or <|start|> is plain content (a model that ignored the format).
 * Invariant: text is released as soon as it cannot be the start of a marker, so a stream sees
 * each byte once; only a tail that could begin a marker waits for the next push. */
#include <stdlib.h>
#include <string.h>

#include "../core/status.h"
#include "tokenizer_impl.h"

typedef enum { R_START, R_HEADER, R_BODY, R_PLAIN } r_state;

struct hm_chat_reply {
    r_state st;
    bool analysis;      /* the current body is reasoning */
    char *hold;         /* bytes not yet decided (a possible marker, or the current header) */
    size_t n_hold, cap_hold;
    char *out[2];       /* released content [0] and reasoning [1] of the last push */
    size_t n_out[2], cap_out[2];
    bool oom;
};

static void grow_put(char **p, size_t *n, size_t *cap, const char *s, size_t len, bool *oom) {
    if (*oom || !len) return;
    if (*n + len + 1 > *cap) {
        size_t c = *cap ? *cap : 256;
        while (*n + len + 1 > c) c *= 2;
        char *q = realloc(*p, c);
        if (!q) { *oom = true; return; }
        *p = q;
        *cap = c;
    }
    memcpy(*p + *n, s, len);
    *n += len;
    (*p)[*n] = 0;
}

static void emit(hm_chat_reply *r, const char *s, size_t n) {
    int k = r->st == R_BODY && r->analysis ? 1 : 0;
    grow_put(&r->out[k], &r->n_out[k], &r->cap_out[k], s, n, &r->oom);
}

/* The longest suffix of s[0..n) that is a proper prefix of marker m. */
static size_t partial_suffix(const char *s, size_t n, const char *m) {
    size_t lm = strlen(m);
    for (size_t k = lm - 1 < n ? lm - 1 : n; k > 0; k--)
        if (memcmp(s + n - k, m, k) == 0) return k;
    return 0;
}

static const char *const body_ends[] = {"<|end|>", "<|return|>", "<|call|>", "<|start|>"};

hm_status hm_chat_reply_open(hm_chat_reply **out, const char *tmpl, hm_err *err) {
    *out = NULL;
    const char *name = hm_chat_template_name(tmpl);
    if (!name || strcmp(name, "harmony") != 0) return HM_OK; /* no channels to split */
    hm_chat_reply *r = calloc(1, sizeof *r);
    if (!r) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    *out = r;
    return HM_OK;
}

void hm_chat_reply_close(hm_chat_reply *r) {
    if (!r) return;
    free(r->hold);
    free(r->out[0]);
    free(r->out[1]);
    free(r);
}

/* Consume the held bytes as far as they can be decided. */
static void step(hm_chat_reply *r, bool final) {
    for (;;) {
        char *s = r->hold;
        size_t n = r->n_hold, used = 0;
        if (r->st == R_START) {
            if (n == 0) return;
            bool ch = n >= 11 && memcmp(s, "<|channel|>", 11) == 0, st = n >= 9 && memcmp(s, "<|start|>", 9) == 0;
            bool maybe = (n < 11 && memcmp(s, "<|channel|>", n) == 0) || (n < 9 && memcmp(s, "<|start|>", n) == 0);
            if (ch || st) r->st = R_HEADER;
            else if (maybe && !final) return;
            else r->st = R_PLAIN;
            continue;
        }
        if (r->st == R_PLAIN) {
            emit(r, s, n);
            r->n_hold = 0;
            return;
        }
        if (r->st == R_HEADER) { /* wait for <|message|>; the channel's name decides the body */
            const char *m = memmem(s, n, "<|message|>", 11);
            if (!m) {
                if (final) r->n_hold = 0; /* a header cut short: nothing to show */
                return;
            }
            const char *c = memmem(s, (size_t)(m - s), "<|channel|>", 11);
            r->analysis = c && (size_t)(m - c) >= 19 && memcmp(c + 11, "analysis", 8) == 0;
            r->st = R_BODY;
            used = (size_t)(m - s) + 11;
        } else { /* R_BODY: up to the first end marker */
            const char *e = NULL;
            size_t el = 0;
            for (size_t i = 0; i < sizeof body_ends / sizeof body_ends[0]; i++) {
                const char *f = memmem(s, n, body_ends[i], strlen(body_ends[i]));
                if (f && (!e || f < e)) e = f, el = strlen(body_ends[i]);
            }
            if (e) {
                emit(r, s, (size_t)(e - s));
                r->st = R_HEADER; /* what follows is the next message's header */
                used = (size_t)(e - s) + el;
            } else {
                size_t keep = 0;
                if (!final)
                    for (size_t i = 0; i < sizeof body_ends / sizeof body_ends[0]; i++) {
                        size_t k = partial_suffix(s, n, body_ends[i]);
                        if (k > keep) keep = k;
                    }
                emit(r, s, n - keep);
                used = n - keep;
                memmove(s, s + used, keep);
                r->n_hold = keep;
                return;
            }
        }
        memmove(s, s + used, n - used);
        r->n_hold = n - used;
    }
}

hm_status hm_chat_reply_push(hm_chat_reply *r, const char *text, size_t len, bool final, hm_chat_reply_part *out,
                             hm_err *err) {
    r->n_out[0] = r->n_out[1] = 0;
    grow_put(&r->hold, &r->n_hold, &r->cap_hold, text, len, &r->oom);
    if (!r->oom) step(r, final);
    if (r->oom) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    out->content = r->n_out[0] ? r->out[0] : "";
    out->n_content = r->n_out[0];
    out->reasoning = r->n_out[1] ? r->out[1] : "";
    out->n_reasoning = r->n_out[1];
    return HM_OK;
}
