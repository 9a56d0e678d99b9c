/* detok.c - ids -> text. A token's bytes may end inside a UTF-8 character (byte-level BPE splits
 * characters freely), so the streaming decoder holds back an incomplete trailing sequence until
 * the next token completes it, and turns bytes that can never form a character into U+FFFD
 * (what Hugging Face's decode(errors="replace") prints). Its output is always valid UTF-8. */
#include <stdlib.h>
#include <string.h>

#include "../core/status.h"
#include "tokenizer_impl.h"
#include "unicode.h"

struct hm_detok {
    const hm_tokenizer *t;
    bool render_special;
    unsigned char held[4];
    size_t n_held;
    char *work; /* held + piece */
    char *out;  /* what is returned */
    size_t cap; /* of work; out has 3 * cap */
};

hm_status hm_detok_open(hm_detok **out, const hm_tokenizer *t, bool render_special, hm_err *err) {
    *out = NULL;
    hm_detok *d = calloc(1, sizeof *d);
    if (!d) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    d->t = t;
    d->render_special = render_special;
    d->cap = t->max_piece + 8;
    d->work = malloc(d->cap);
    d->out = malloc(3 * d->cap + 4);
    if (!d->work || !d->out) {
        hm_detok_close(d);
        return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    }
    *out = d;
    return HM_OK;
}

void hm_detok_close(hm_detok *d) {
    if (!d) return;
    free(d->work);
    free(d->out);
    free(d);
}

/* Emit work[0..n) into d->out: valid characters as they are, invalid sequences as U+FFFD; an
 * incomplete trailing sequence goes back to held unless final. */
static const char *emit(hm_detok *d, size_t n, bool final, size_t *len) {
    size_t keep = final ? n : hm_utf8_complete_prefix(d->work, n);
    size_t o = 0;
    const unsigned char *u = (const unsigned char *)d->work;
    for (size_t i = 0; i < keep;) {
        if (u[i] < 0x80) { d->out[o++] = (char)u[i++]; continue; }
        uint32_t cp;
        int l = hm_utf8_decode(u + i, keep - i, &cp);
        if (cp == 0xFFFD) o += (size_t)hm_utf8_encode(cp, d->out + o);
        else { memcpy(d->out + o, u + i, (size_t)l); o += (size_t)l; }
        i += (size_t)l;
    }
    d->n_held = n - keep;
    memcpy(d->held, d->work + keep, d->n_held);
    d->out[o] = 0;
    *len = o;
    return d->out;
}

const char *hm_detok_push(hm_detok *d, int32_t id, size_t *len) {
    size_t pl;
    const char *p = hm_token_piece(d->t, id, &pl);
    int ty = hm_token_type(d->t, id);
    if (!d->render_special && (ty == HM_TT_CONTROL || ty == HM_TT_UNUSED)) pl = 0;
    memcpy(d->work, d->held, d->n_held);
    memcpy(d->work + d->n_held, p, pl);
    return emit(d, d->n_held + pl, false, len);
}

const char *hm_detok_flush(hm_detok *d, size_t *len) {
    memcpy(d->work, d->held, d->n_held);
    return emit(d, d->n_held, true, len);
}

hm_status hm_detokenize(const hm_tokenizer *t, const int32_t *ids, size_t n, bool render_special,
                        char **out, size_t *len, hm_err *err) {
    *out = NULL;
    *len = 0;
    hm_detok *d;
    hm_status st = hm_detok_open(&d, t, render_special, err);
    if (st != HM_OK) return st;
    size_t cap = 64, o = 0;
    char *buf = malloc(cap);
    for (size_t i = 0; buf && i <= n; i++) {
        size_t l;
        const char *s = i < n ? hm_detok_push(d, ids[i], &l) : hm_detok_flush(d, &l);
        if (o + l + 1 > cap) {
            while (o + l + 1 > cap) cap *= 2;
            char *nb = realloc(buf, cap);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
        }
        memcpy(buf + o, s, l);
        o += l;
    }
    hm_detok_close(d);
    if (!buf) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    buf[o] = 0;
    *out = buf;
    *len = o;
    return HM_OK;
}
