/* tokenize.c - text -> ids: UTF-8 repair, special-token splitting, normalisation, the
 * pre-tokenizer regexes, then the BPE or SPM merge of each piece.
 *
 * Order of the stages (Hugging Face's): added/special tokens are found in the raw text first;
 * only the text between them is normalised (NFC for Qwen) and pre-tokenized. */
#include <stdlib.h>
#include <string.h>

#include "../core/status.h"
#include "tokenizer_impl.h"
#include "unicode.h"

bool hm_idvec_push(hm_idvec *v, int32_t id) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = realloc(v->v, cap * sizeof *p);
        if (!p) return false;
        v->v = p;
        v->cap = cap;
    }
    v->v[v->n++] = id;
    return true;
}

void *hm_tok_scratch_get(hm_tok_scratch *s, size_t bytes) {
    if (bytes > s->cap) {
        size_t cap = bytes < 4096 ? 4096 : bytes + bytes / 2;
        void *p = realloc(s->buf, cap);
        if (!p) return NULL;
        s->buf = p;
        s->cap = cap;
    }
    return s->buf;
}

typedef struct span {
    size_t off, len;
} span;

typedef struct spanvec {
    span *v;
    size_t n, cap;
} spanvec;

static bool span_push(spanvec *v, size_t off, size_t len) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        span *p = realloc(v->v, cap * sizeof *p);
        if (!p) return false;
        v->v = p;
        v->cap = cap;
    }
    v->v[v->n++] = (span){off, len};
    return true;
}

/* per-call state */
typedef struct tok_ctx {
    const hm_tokenizer *t;
    hm_idvec out;
    hm_tok_scratch sc, sc2;
    spanvec a, b;
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *js;
    bool spm_prev_special;
} tok_ctx;

/* Split text[0..n) into pieces with the pre-tokenizer's regex sequence into c->a. */
static bool pretokenize(tok_ctx *c, const char *text, size_t n) {
    const hm_tokenizer *t = c->t;
    c->a.n = 0;
    if (!span_push(&c->a, 0, n)) return false;
    for (int r = 0; r < t->n_rx; r++) {
        c->b.n = 0;
        for (size_t p = 0; p < c->a.n; p++) {
            span sp = c->a.v[p];
            const PCRE2_SPTR subj = (PCRE2_SPTR)(text + sp.off);
            size_t cur = 0, start = 0;
            while (start < sp.len) {
                int rc = pcre2_match(t->rx[r], subj, sp.len, start, PCRE2_NO_UTF_CHECK, c->md, c->mc);
                if (rc < 0) break; /* no match (or a match-limit error: rest stays one piece) */
                PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
                size_t ms = ov[0], me = ov[1];
                if (me == ms) { /* empty match: step one character */
                    start = ms + 1;
                    while (start < sp.len && ((unsigned char)subj[start] & 0xC0) == 0x80) start++;
                    continue;
                }
                if (ms > cur && !span_push(&c->b, sp.off + cur, ms - cur)) return false;
                if (!span_push(&c->b, sp.off + ms, me - ms)) return false;
                cur = start = me;
            }
            if (cur < sp.len && !span_push(&c->b, sp.off + cur, sp.len - cur)) return false;
        }
        spanvec tmp = c->a;
        c->a = c->b;
        c->b = tmp;
    }
    return true;
}

/* Tokenize a run of ordinary text (no special tokens in it). */
static hm_status text_segment(tok_ctx *c, const char *s, size_t n, hm_err *err) {
    const hm_tokenizer *t = c->t;
    if (t->kind == HM_VOCAB_SPM) {
        /* spaces -> U+2581, and a leading one at the start and after a special token */
        size_t cap = n * 3 + 3;
        char *buf = hm_tok_scratch_get(&c->sc2, cap);
        if (!buf) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
        size_t o = 0;
        if (t->add_space_prefix && c->spm_prev_special) {
            memcpy(buf, "\xe2\x96\x81", 3);
            o = 3;
        }
        for (size_t i = 0; i < n; i++) {
            if (s[i] == ' ') { memcpy(buf + o, "\xe2\x96\x81", 3); o += 3; }
            else buf[o++] = s[i];
        }
        c->spm_prev_special = false;
        if (!hm_spm_segment(t, buf, o, &c->out, &c->sc)) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
        return HM_OK;
    }
    if (t->kind == HM_VOCAB_GEMMA4) {
        /* spaces -> U+2581, then words = runs of '\n' and runs of anything else; a run of
         * newlines that is a token is that token (llama.cpp) */
        char *buf = hm_tok_scratch_get(&c->sc2, n * 3 + 1);
        if (!buf) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
        size_t o = 0;
        for (size_t i = 0; i < n; i++) {
            if (s[i] == ' ') { memcpy(buf + o, "\xe2\x96\x81", 3); o += 3; }
            else buf[o++] = s[i];
        }
        for (size_t w = 0; w < o;) {
            bool nl = buf[w] == '\n';
            size_t e = w;
            while (e < o && (buf[e] == '\n') == nl) e++;
            int32_t id = nl ? hm_tok_map_find(t, buf + w, e - w) : -1;
            if (id >= 0 ? !hm_idvec_push(&c->out, id) : !hm_g4_word(t, buf + w, e - w, &c->out, &c->sc))
                return hm_errf(err, HM_ERR_NOMEM, "out of memory");
            w = e;
        }
        return HM_OK;
    }
    char *norm = NULL;
    if (t->pretok->nfc && !hm_nfc_quick(s, n)) {
        size_t nl;
        norm = hm_nfc(s, n, &nl);
        if (!norm) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
        s = norm;
        n = nl;
    }
    hm_status st = HM_OK;
    if (!pretokenize(c, s, n)) st = hm_errf(err, HM_ERR_NOMEM, "out of memory");
    for (size_t p = 0; st == HM_OK && p < c->a.n; p++)
        if (!hm_bpe_piece(t, s + c->a.v[p].off, c->a.v[p].len, &c->out, &c->sc))
            st = hm_errf(err, HM_ERR_NOMEM, "out of memory");
    free(norm);
    return st;
}

/* The special token starting at s[0..n), longest first; -1 if none. */
static int32_t special_at(const hm_tokenizer *t, const char *s, size_t n, bool parse_special) {
    unsigned char f = (unsigned char)s[0];
    for (uint32_t k = t->spec_start[f]; k < t->spec_start[f + 1]; k++) {
        int32_t id = t->spec[k];
        if (!parse_special && t->type[id] == HM_TT_CONTROL) continue;
        uint32_t l = t->text_len[id];
        if (l <= n && memcmp(s, t->text + t->text_off[id], l) == 0) return id;
    }
    return -1;
}

void hm_tokenize_opts_default(const hm_tokenizer *t, hm_tokenize_opts *o) {
    o->add_bos = t->add_bos;
    o->parse_special = true;
}

hm_status hm_tokenize(const hm_tokenizer *t, const char *text, size_t len, const hm_tokenize_opts *o,
                      int32_t **ids, size_t *n_ids, hm_err *err) {
    *ids = NULL;
    *n_ids = 0;
    hm_tokenize_opts def;
    if (!o) {
        hm_tokenize_opts_default(t, &def);
        o = &def;
    }
    hm_status st = HM_OK;
    tok_ctx c = {.t = t, .spm_prev_special = true};
    char *clean = NULL;
    if (!hm_utf8_valid(text, len)) {
        clean = hm_utf8_sanitize(text, len, &len);
        if (!clean) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
        text = clean;
    }
    if (t->n_rx > 0) {
        c.md = pcre2_match_data_create(1, NULL);
        c.mc = pcre2_match_context_create(NULL);
        c.js = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, NULL);
        if (!c.md || !c.mc || !c.js) {
            st = hm_errf(err, HM_ERR_NOMEM, "out of memory");
            goto done;
        }
        pcre2_jit_stack_assign(c.mc, NULL, c.js);
    }
    if (o->add_bos && t->bos >= 0 && !hm_idvec_push(&c.out, t->bos)) goto nomem;
    size_t seg = 0;
    for (size_t i = 0; i < len;) {
        unsigned char f = (unsigned char)text[i];
        int32_t id = t->spec_start[f] == t->spec_start[f + 1] ? -1
                                                              : special_at(t, text + i, len - i, o->parse_special);
        if (id < 0) { i++; continue; }
        if (i > seg && (st = text_segment(&c, text + seg, i - seg, err)) != HM_OK) goto done;
        if (!hm_idvec_push(&c.out, id)) goto nomem;
        c.spm_prev_special = true;
        i += t->text_len[id];
        seg = i;
    }
    if (len > seg && (st = text_segment(&c, text + seg, len - seg, err)) != HM_OK) goto done;
    if (t->add_eos && t->eos >= 0 && !hm_idvec_push(&c.out, t->eos)) goto nomem;
    if (!c.out.v && !(c.out.v = malloc(sizeof *c.out.v))) goto nomem; /* never NULL on success */
    *ids = c.out.v;
    *n_ids = c.out.n;
    c.out.v = NULL;
    goto done;
nomem:
    st = hm_errf(err, HM_ERR_NOMEM, "out of memory");
done:
    free(c.out.v);
    free(c.sc.buf);
    free(c.sc2.buf);
    free(c.a.v);
    free(c.b.v);
    pcre2_match_data_free(c.md);
    pcre2_match_context_free(c.mc);
    pcre2_jit_stack_free(c.js);
    free(clean);
    return st;
}
