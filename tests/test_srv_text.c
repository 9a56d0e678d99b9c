/* test_srv_text.c - the server's client-text helpers (src/server/srv_util.c), byte by byte:
 * srv_utf8_char against the well-formed UTF-8 table (RFC 3629: overlongs, surrogates, above
 * U+10FFFF and cut sequences refused), srv_text (escapes, cuts on character boundaries, "...",
 * never overflows its buffer, always valid UTF-8 out), srv_utf8_trim, and srv_error_json
 * turning any bytes into an error object instead of NULL (which the server answered as
 * "500 out of memory"). The server-level behaviour is tests/cli_server_input.sh. */
#include <string.h>

#include "server/server.h"
#include "test.h"

/* Every character of s[0..n) well-formed (an independent check: decode, then re-encode). */
static int valid_utf8(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i], len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!len || i + len > n) return 0;
        unsigned cp = len == 1 ? c : len == 2 ? c & 31 : len == 3 ? c & 15 : c & 7;
        for (unsigned k = 1; k < len; k++) {
            if ((u[i + k] & 0xc0) != 0x80) return 0;
            cp = cp << 6 | (u[i + k] & 63);
        }
        unsigned want = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
        if (want != len || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
        i += len;
    }
    return 1;
}

int main(void) {
    /* srv_utf8_char against the independent check, over every 1- and 2-byte string and the
     * 3- and 4-byte strings around each boundary of the table */
    for (unsigned a = 0; a < 256; a++) {
        char s[4] = {(char)a};
        CHECKF((srv_utf8_char(s, 1) == 1) == valid_utf8(s, 1), "byte %02x", a);
        for (unsigned b = 0; b < 256; b++) {
            s[1] = (char)b;
            int whole = valid_utf8(s, 2) && a >= 0x80; /* one 2-byte character */
            CHECKF((srv_utf8_char(s, 2) == 2) == whole, "bytes %02x %02x", a, b);
        }
    }
    static const unsigned leads[] = {0xe0, 0xe1, 0xec, 0xed, 0xee, 0xef, 0xf0, 0xf1, 0xf3, 0xf4, 0xf5, 0xff};
    static const unsigned conts[] = {0x00, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0};
    for (size_t i = 0; i < sizeof leads / sizeof *leads; i++)
        for (size_t j = 0; j < sizeof conts / sizeof *conts; j++)
            for (size_t k = 0; k < sizeof conts / sizeof *conts; k++) {
                char s[4] = {(char)leads[i], (char)conts[j], (char)conts[k], (char)0x80};
                size_t len = leads[i] >= 0xf0 ? 4 : 3;
                CHECKF((srv_utf8_char(s, len) == len) == valid_utf8(s, len), "%02x %02x %02x", leads[i], conts[j],
                       conts[k]);
                CHECK(srv_utf8_char(s, len - 1) == 0); /* cut */
            }

    char out[64];
    /* escapes */
    CHECK(srv_text(out, sizeof out, "a\xff" "b", 3, 100) == 6 && !strcmp(out, "a\\xffb"));
    CHECK(srv_text(out, sizeof out, "\n\x7f", 2, 100) == 8 && !strcmp(out, "\\x0a\\x7f"));
    CHECK(srv_text(out, sizeof out, "/\xc3", 2, 100) == 5 && !strcmp(out, "/\\xc3")); /* a cut character */
    CHECK(srv_text(out, sizeof out, "\xed\xa0\x80", 3, 100) == 12 && !strcmp(out, "\\xed\\xa0\\x80"));
    CHECK(srv_text(out, sizeof out, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 9, 100) == 9); /* é € 😀 kept */
    /* cuts: by max input bytes and by the buffer, on a character boundary, then "..." */
    CHECK(srv_text(out, sizeof out, "\xc3\xa9\xc3\xa9\xc3\xa9", 6, 3) == 5 && !strcmp(out, "\xc3\xa9..."));
    CHECK(srv_text(out, sizeof out, "abc", 3, 3) == 3 && !strcmp(out, "abc"));
    char big[1000];
    for (size_t i = 0; i + 1 < sizeof big; i += 2) memcpy(big + i, "\xc3\xa9", 2);
    for (size_t cap = 8; cap <= sizeof out; cap++) {
        memset(out, 'Z', sizeof out);
        size_t n = srv_text(out, cap, big, sizeof big - 1, sizeof big);
        CHECKF(n < cap && out[n] == 0 && (cap == sizeof out || out[cap] == 'Z'), "cap %zu: n %zu", cap, n);
        CHECKF(valid_utf8(out, n) && n >= 3 && !strcmp(out + n - 3, "..."), "cap %zu: '%s'", cap, out);
    }
    /* random bytes: always valid UTF-8 out, within the buffer */
    unsigned x = 12345;
    for (int t = 0; t < 2000; t++) {
        char in[40];
        size_t len = (size_t)(t % 40);
        for (size_t i = 0; i < len; i++) {
            x = x * 1103515245u + 12345u;
            in[i] = (char)(x >> 16);
        }
        size_t cap = 8 + (size_t)(t % 50);
        size_t n = srv_text(out, cap, in, len, (size_t)(t % 45));
        CHECKF(n < cap && strlen(out) == n && valid_utf8(out, n), "case %d", t);
    }

    /* srv_utf8_trim: what a truncating snprintf leaves */
    char s1[] = "ab\xc3", s2[] = "ab\xe2\x82", s3[] = "ab\xc3\xa9", s4[] = "ab", s5[] = "a\xf0\x9f\x98";
    srv_utf8_trim(s1);
    srv_utf8_trim(s2);
    srv_utf8_trim(s3);
    srv_utf8_trim(s4);
    srv_utf8_trim(s5);
    CHECK(!strcmp(s1, "ab") && !strcmp(s2, "ab") && !strcmp(s3, "ab\xc3\xa9") && !strcmp(s4, "ab") && !strcmp(s5, "a"));

    /* srv_error_json never gives up on bytes */
    json_t *j = srv_error_json("no endpoint /\xff\xc3", "invalid_request_error", NULL, "not_found");
    CHECK(j != NULL);
    const char *m = j ? json_string_value(json_object_get(json_object_get(j, "error"), "message")) : NULL;
    CHECK(m && !strcmp(m, "no endpoint /\\xff\\xc3"));
    json_decref(j);
    j = srv_error_json("caf\xc3\xa9", "invalid_request_error", "x", NULL);
    m = j ? json_string_value(json_object_get(json_object_get(j, "error"), "message")) : NULL;
    CHECK(m && !strcmp(m, "caf\xc3\xa9")); /* valid text untouched */
    json_decref(j);
    return test_done();
}
