/* srv_util.c - small helpers of the server: growable byte buffers, clocks, client text made safe
 * for messages, OpenAI error objects.
 * Invariant of srv_buf: p is NULL or NUL-terminated at p[len] (so text can be used as a C string).
 * Invariant of the error objects: their message is valid UTF-8 whatever bytes went into it (jansson
 * refuses anything else, and a refused error object would turn a 4xx into a 500). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/server.h"

bool srv_buf_add(srv_buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return false;
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return true;
}

bool srv_buf_str(srv_buf *b, const char *s) { return srv_buf_add(b, s, strlen(s)); }

bool srv_buf_printf(srv_buf *b, const char *fmt, ...) {
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return false;
    if ((size_t)n < sizeof tmp) return srv_buf_add(b, tmp, (size_t)n);
    char *big = malloc((size_t)n + 1);
    if (!big) return false;
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    bool ok = srv_buf_add(b, big, (size_t)n);
    free(big);
    return ok;
}

void srv_buf_consume(srv_buf *b, size_t n) {
    if (n >= b->len) {
        b->len = 0;
        if (b->p) b->p[0] = 0;
        return;
    }
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
    b->p[b->len] = 0;
}

void srv_buf_free(srv_buf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

double srv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int64_t srv_unix_time(void) { return (int64_t)time(NULL); }

size_t srv_utf8_char(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    if (n == 0) return 0;
    if (u[0] < 0x80) return 1;
    size_t len;
    unsigned lo = 0x80, hi = 0xbf; /* the range of the second byte (overlongs and surrogates excluded) */
    if (u[0] >= 0xc2 && u[0] <= 0xdf) len = 2;
    else if (u[0] >= 0xe0 && u[0] <= 0xef) {
        len = 3;
        if (u[0] == 0xe0) lo = 0xa0;
        if (u[0] == 0xed) hi = 0x9f;
    } else if (u[0] >= 0xf0 && u[0] <= 0xf4) {
        len = 4;
        if (u[0] == 0xf0) lo = 0x90;
        if (u[0] == 0xf4) hi = 0x8f;
    } else {
        return 0;
    }
    if (n < len || u[1] < lo || u[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if (u[i] < 0x80 || u[i] > 0xbf) return 0;
    return len;
}

size_t srv_text(char *out, size_t cap, const char *s, size_t n, size_t max) {
    static const char hex[] = "0123456789abcdef";
    size_t o = 0, i = 0;
    if (cap == 0) return 0;
    if (cap < 8) { /* no room for an escape and the "..." */
        out[0] = 0;
        return 0;
    }
    while (i < n) {
        size_t k = srv_utf8_char(s + i, n - i);
        unsigned char c = (unsigned char)s[i];
        bool esc = k == 0 || c < 0x20 || c == 0x7f;
        size_t w = esc ? 4 : k;
        if (i + (esc ? 1 : k) > max || o + w + 4 > cap) { /* room left for "..." and the NUL */
            memcpy(out + o, "...", 3);
            o += 3;
            break;
        }
        if (esc) {
            out[o] = '\\';
            out[o + 1] = 'x';
            out[o + 2] = hex[c >> 4];
            out[o + 3] = hex[c & 15];
            i += 1;
        } else {
            memcpy(out + o, s + i, k);
            i += k;
        }
        o += w;
    }
    out[o] = 0;
    return o;
}

void srv_utf8_trim(char *s) {
    size_t n = strlen(s), start = n;
    /* the last character's first byte: at most 3 continuation bytes back */
    while (start > 0 && n - start < 4 && ((unsigned char)s[start - 1] & 0xc0) == 0x80) start--;
    if (start == 0 || ((unsigned char)s[start - 1] & 0xc0) != 0xc0) return; /* no lead byte: not a cut */
    start--;
    if (srv_utf8_char(s + start, n - start) != n - start) s[start] = 0;
}

json_t *srv_error_json(const char *message, const char *type, const char *param, const char *code) {
    size_t n = strlen(message);
    char *safe = NULL;
    for (size_t i = 0, k; i < n; i += k) {
        if ((k = srv_utf8_char(message + i, n - i)) == 0) { /* escape every byte that is not text */
            size_t cap = 4 * n + 8;
            if (!(safe = malloc(cap))) return NULL;
            srv_text(safe, cap, message, n, n);
            message = safe;
            break;
        }
    }
    json_t *j = json_pack("{s:{s:s, s:s, s:s?, s:s?}}", "error", "message", message, "type", type, "param", param,
                          "code", code);
    free(safe);
    return j;
}
