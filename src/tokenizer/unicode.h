/* unicode.h - the Unicode the tokenizer needs: UTF-8 decoding that never fails, the repair of
 * invalid input, NFC normalisation, and the GPT-2 byte <-> code point map.
 *
 * Invalid UTF-8 policy (documented for users in hotmoe.h): a byte sequence that is not valid
 * UTF-8 is replaced by U+FFFD per "maximal subpart" (Unicode ch. 3, the rule Python's
 * bytes.decode(errors="replace") and WHATWG follow), so the text the tokenizer sees is what a
 * Hugging Face tokenizer would have seen after Python decoded the bytes. Overlong forms,
 * surrogates and code points above U+10FFFF count as invalid. */
#ifndef HM_TOKENIZER_UNICODE_H
#define HM_TOKENIZER_UNICODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Decode one code point at s[0..n) (n >= 1). Returns its byte length (1..4); an invalid sequence
 * gives *cp = 0xFFFD and the length of its maximal subpart (>= 1). */
int hm_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);
/* Encode cp (<= 0x10FFFF) into out[0..4); returns the length. */
int hm_utf8_encode(uint32_t cp, char *out);
/* True when s[0..n) is valid UTF-8. */
bool hm_utf8_valid(const char *s, size_t n);
/* Length of the longest prefix of s[0..n) that does not end inside an incomplete (but so far
 * valid) multi-byte sequence: the bytes after it may still become a character. */
size_t hm_utf8_complete_prefix(const char *s, size_t n);

/* Copy s[0..n) into a malloc'd buffer with invalid sequences replaced by U+FFFD; NUL-terminated,
 * *out_len set. NULL on allocation failure. */
char *hm_utf8_sanitize(const char *s, size_t n, size_t *out_len);

/* True when s[0..n) (valid UTF-8) is certainly in NFC (fast check; false = "maybe not"). */
bool hm_nfc_quick(const char *s, size_t n);
/* NFC of valid UTF-8 s[0..n) into a malloc'd NUL-terminated buffer; NULL on allocation failure. */
char *hm_nfc(const char *s, size_t n, size_t *out_len);

/* GPT-2 byte-level map: byte b <-> code point hm_byte_to_cp(b) (printable bytes map to
 * themselves, the others to U+0100 + k). hm_cp_to_byte returns -1 for a code point outside it. */
uint32_t hm_byte_to_cp(uint8_t b);
int hm_cp_to_byte(uint32_t cp);

/* Generated tables (unicode_data.c). */
extern const char hm_unicode_version[];
extern const uint32_t hm_uni_ccc[][3];
extern const size_t hm_uni_ccc_n;
extern const uint32_t hm_uni_decomp[][3];
extern const size_t hm_uni_decomp_n;
extern const uint32_t hm_uni_comp[][3];
extern const size_t hm_uni_comp_n;
extern const uint32_t hm_uni_nfc_unstable[][2];
extern const size_t hm_uni_nfc_unstable_n;

#endif
