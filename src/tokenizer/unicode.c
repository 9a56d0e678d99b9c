/* unicode.c - UTF-8 decoding with U+FFFD repair, NFC normalisation over the generated tables
 * (unicode_data.c), and the GPT-2 byte-level map. See unicode.h for the policies. */
#include "unicode.h"

#include <stdlib.h>
#include <string.h>

/* Valid range of the second byte for each lead byte (Unicode table 3-7); 0/0 = invalid lead. */
static void utf8_lead(unsigned char b, int *len, unsigned char *lo, unsigned char *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (b < 0x80) *len = 1;
    else if (b >= 0xC2 && b <= 0xDF) *len = 2;
    else if (b == 0xE0) { *len = 3; *lo = 0xA0; }
    else if (b == 0xED) { *len = 3; *hi = 0x9F; }
    else if (b >= 0xE1 && b <= 0xEF) *len = 3;
    else if (b == 0xF0) { *len = 4; *lo = 0x90; }
    else if (b >= 0xF1 && b <= 0xF3) *len = 4;
    else if (b == 0xF4) { *len = 4; *hi = 0x8F; }
    else *len = 0;
}

int hm_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    int len;
    unsigned char lo, hi;
    utf8_lead(s[0], &len, &lo, &hi);
    if (len == 1) { *cp = s[0]; return 1; }
    if (len == 0) { *cp = 0xFFFD; return 1; }
    uint32_t c = s[0] & (0xFFu >> (len + 1));
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n) { *cp = 0xFFFD; return i; }
        unsigned char b = s[i];
        if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) { *cp = 0xFFFD; return i; }
        c = (c << 6) | (b & 0x3Fu);
    }
    *cp = c;
    return len;
}

int hm_utf8_encode(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) { o[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

bool hm_utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) { i++; continue; }
        uint32_t cp;
        int l = hm_utf8_decode(u + i, n - i, &cp);
        if (cp == 0xFFFD && !(l == 3 && u[i] == 0xEF && u[i + 1] == 0xBF && u[i + 2] == 0xBD))
            return false;
        i += (size_t)l;
    }
    return true;
}

size_t hm_utf8_complete_prefix(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    /* find the start of the last sequence: at most 3 continuation bytes back */
    size_t start = n;
    for (int k = 1; k <= 4 && (size_t)k <= n; k++) {
        unsigned char b = u[n - (size_t)k];
        if ((b & 0xC0) != 0x80) { start = n - (size_t)k; break; }
    }
    if (start == n) return n;
    int len;
    unsigned char lo, hi;
    utf8_lead(u[start], &len, &lo, &hi);
    if (len <= 1 || n - start >= (size_t)len) return n; /* ASCII, invalid lead, or complete */
    /* incomplete: hold it back only if what is there is a valid prefix */
    for (size_t i = start + 1; i < n; i++) {
        unsigned char b = u[i];
        if (i == start + 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return n;
    }
    return start;
}

char *hm_utf8_sanitize(const char *s, size_t n, size_t *out_len) {
    /* worst case: every byte becomes U+FFFD (3 bytes) */
    char *out = malloc(n * 3 + 1);
    if (!out) return NULL;
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, o = 0;
    while (i < n) {
        if (u[i] < 0x80) { out[o++] = (char)u[i++]; continue; }
        uint32_t cp;
        int l = hm_utf8_decode(u + i, n - i, &cp);
        if (cp == 0xFFFD) o += (size_t)hm_utf8_encode(cp, out + o);
        else { memcpy(out + o, s + i, (size_t)l); o += (size_t)l; }
        i += (size_t)l;
    }
    out[o] = 0;
    *out_len = o;
    return out;
}

/* ---- NFC ---- */

#define SBASE 0xAC00u
#define LBASE 0x1100u
#define VBASE 0x1161u
#define TBASE 0x11A7u
#define LCOUNT 19u
#define VCOUNT 21u
#define TCOUNT 28u
#define NCOUNT (VCOUNT * TCOUNT)
#define SCOUNT (LCOUNT * NCOUNT)

static int ccc_of(uint32_t cp) {
    if (cp < 0x300) return 0;
    size_t lo = 0, hi = hm_uni_ccc_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < hm_uni_ccc[mid][0]) hi = mid;
        else if (cp > hm_uni_ccc[mid][1]) lo = mid + 1;
        else return (int)hm_uni_ccc[mid][2];
    }
    return 0;
}

static const uint32_t *decomp_of(uint32_t cp) {
    size_t lo = 0, hi = hm_uni_decomp_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < hm_uni_decomp[mid][0]) hi = mid;
        else if (cp > hm_uni_decomp[mid][0]) lo = mid + 1;
        else return hm_uni_decomp[mid];
    }
    return NULL;
}

static uint32_t compose_pair(uint32_t a, uint32_t b) {
    if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
        return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE &&
        b < TBASE + TCOUNT)
        return a + (b - TBASE);
    size_t lo = 0, hi = hm_uni_comp_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const uint32_t *e = hm_uni_comp[mid];
        if (a < e[0] || (a == e[0] && b < e[1])) hi = mid;
        else if (a > e[0] || b > e[1]) lo = mid + 1;
        else return e[2];
    }
    return 0;
}

static bool nfc_unstable(uint32_t cp) {
    if (cp < 0x300) return false;
    size_t lo = 0, hi = hm_uni_nfc_unstable_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < hm_uni_nfc_unstable[mid][0]) hi = mid;
        else if (cp > hm_uni_nfc_unstable[mid][1]) lo = mid + 1;
        else return true;
    }
    return false;
}

bool hm_nfc_quick(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0xCC) { i += u[i] < 0x80 ? 1 : 2; continue; } /* lead < 0xCC: cp < U+0300 */
        uint32_t cp;
        i += (size_t)hm_utf8_decode(u + i, n - i, &cp);
        if (nfc_unstable(cp)) return false;
    }
    return true;
}

/* Append the full canonical decomposition of cp to buf (capacity checked by the caller: at most
 * 4 code points per input code point in Unicode's data, and the caller reserves that). */
static size_t decompose(uint32_t cp, uint32_t *buf) {
    if (cp >= SBASE && cp < SBASE + SCOUNT) {
        uint32_t si = cp - SBASE;
        buf[0] = LBASE + si / NCOUNT;
        buf[1] = VBASE + (si % NCOUNT) / TCOUNT;
        if (si % TCOUNT == 0) return 2;
        buf[2] = TBASE + si % TCOUNT;
        return 3;
    }
    const uint32_t *d = decomp_of(cp);
    if (!d) { buf[0] = cp; return 1; }
    size_t k = decompose(d[1], buf);
    if (d[2]) k += decompose(d[2], buf + k);
    return k;
}

char *hm_nfc(const char *s, size_t n, size_t *out_len) {
    const unsigned char *u = (const unsigned char *)s;
    /* a code point decomposes into at most 4 (Unicode 14: max 4 for U+1F82 etc.); 1 byte in gives
     * at most 1 code point, so n * 4 + 4 bounds the buffer */
    uint32_t *cps = malloc((n * 4 + 4) * sizeof *cps);
    char *out = malloc(n * 3 + 4 + 1); /* composition never grows the UTF-8 length by more */
    if (!cps || !out) { free(cps); free(out); return NULL; }
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += (size_t)hm_utf8_decode(u + i, n - i, &cp);
        m += decompose(cp, cps + m);
    }
    /* canonical ordering: stable insertion sort within each run of non-starters */
    for (size_t i = 1; i < m; i++) {
        int c = ccc_of(cps[i]);
        if (c == 0) continue;
        size_t j = i;
        uint32_t v = cps[i];
        while (j > 0 && ccc_of(cps[j - 1]) > c) { cps[j] = cps[j - 1]; j--; }
        cps[j] = v;
    }
    /* canonical composition: cp combines with the last starter unless blocked (a character
     * between them has ccc 0 or ccc >= cp's) */
    size_t w = 0, starter = (size_t)-1;
    int last_ccc = 0; /* ccc of cps[w - 1] */
    for (size_t i = 0; i < m; i++) {
        uint32_t cp = cps[i];
        int c = ccc_of(cp);
        if (starter != (size_t)-1) {
            bool blocked = w > starter + 1 && (last_ccc == 0 || last_ccc >= c);
            uint32_t comp = blocked ? 0 : compose_pair(cps[starter], cp);
            if (comp) {
                cps[starter] = comp;
                continue;
            }
        }
        if (c == 0) starter = w;
        last_ccc = c;
        cps[w++] = cp;
    }
    size_t o = 0;
    for (size_t i = 0; i < w; i++) o += (size_t)hm_utf8_encode(cps[i], out + o);
    out[o] = 0;
    free(cps);
    *out_len = o;
    return out;
}

/* ---- GPT-2 byte-level map ---- */

static bool byte_printable(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

uint32_t hm_byte_to_cp(uint8_t b) {
    if (byte_printable(b)) return b;
    /* the k-th non-printable byte (in byte order) maps to 256 + k */
    unsigned k = 0;
    for (unsigned x = 0; x < b; x++) k += !byte_printable(x);
    return 256 + k;
}

int hm_cp_to_byte(uint32_t cp) {
    if (cp < 256) return byte_printable(cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1; /* 68 non-printable bytes */
    unsigned k = cp - 256;
    for (unsigned x = 0; x < 256; x++)
        if (!byte_printable(x) && k-- == 0) return (int)x;
    return -1;
}
