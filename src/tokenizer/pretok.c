/* pretok.c - the table of known pre-tokenizers (see pretok.h). The regex strings are the
 * originals from each model family's tokenizer.json (gpt-4o's is llama.cpp's form, and deepseek-llm's
 * classes take no spaces as in llama.cpp, see there). Characters that NFC would change (Greek
 * Extended and letterlike singletons such as U+1F7D, U+2126, U+212A) are written as \x{...}
 * escapes so no editor or tool can silently normalise the source. */
#include "pretok.h"

#include <string.h>

#define RX_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

static const hm_pretok_def defs[] = {
    {"qwen2",
     {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
      "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     true, false},
    {"qwen35",
     {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}"
      "| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     true, false},
    {"llama-bpe",
     {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
      "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     false, true},
    {"deepseek-llm",
     {"[\\r\\n]",
      "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\\x{1F7D}ᾀ-ᾴᾶ-ᾼ\\x{1FBE}ῂ-ῄῆ-ῌῐ-\\x{1FD3}ῖ-\\x{1FDB}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\\x{2126}ℨ\\x{212A}-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
      /* llama.cpp turns every non-ASCII space into \v before it matches these regexes, so no
       * space is ever in their literal classes: tokenizer.json's U+3000-U+3002 here becomes
       * U+3001-U+3002, and the CJK class below (U+0800-U+4E00 holds U+2000-U+200A, U+3000...)
       * takes no space (?!\s), to split as llama.cpp does */
      "\\s?[!-/:-~！-／：-～‘-‟、-。]+", "\\s+$", "(?:(?!\\s)[一-龥ࠀ-一가-퟿])+", "\\p{N}+"},
     false, false},
    {"deepseek-v3",
     {"\\p{N}{1,3}", "[一-龥\\x{3040}-ゟ゠-ヿ]+",
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
      "| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     false, false},
    {"gpt-2", {RX_GPT2}, false, false},
    /* llama.cpp's own, for files without tokenizer.ggml.pre (it warns that quality suffers):
     * punctuation runs first, then GPT-2's regex, digit runs cut in threes */
    {"default",
     {"[\\p{P}\\$\\+<=>\\^~\\|]+", "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
      "\\p{N}+", "[0-9][0-9][0-9]"},
     false, false},
    /* GLM-4 / GLM-4.5: Llama 3's regex, but merges always run (llama.cpp's CHATGLM4) */
    {"glm4",
     {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
      "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     false, false},
    /* o200k (gpt-oss, GPT-4o, Llama 4). Not the tokenizer.json original but llama.cpp's form of
     * it: the original's letter classes [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]* / [\p{Ll}\p{Lm}\p{Lo}\p{M}]+
     * become "a letter that is not a-z" / "a letter that is not A-Z", so outside ASCII every
     * letter counts as both cases and combining marks (\p{M}) are not letters. llama.cpp
     * tokenizes gpt-oss's GGUFs with this one; we give the same ids (docs/ENGINE.md). */
    {"gpt-4o",
     {"[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+"
      "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
      "|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*"
      "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
      "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     false, false},
};

static const struct {
    const char *alias, *name;
} aliases[] = {
    {"gpt2", "gpt-2"},   {"llama3", "llama-bpe"},
    {"deepseek3-llm", "deepseek-v3"}, {"deepseek-llm", "deepseek-llm"},
    /* llama.cpp's synonyms: the same regexes and flags there */
    {"olmo", "gpt-2"}, {"chatglm-bpe", "glm4"}, {"llama4", "gpt-4o"},
    /* DeepSeek-V4's GGUFs: its tokenizer hashes as JoyAI-LLM's in llama.cpp's converter */
    {"joyai-llm", "deepseek-v3"},
};

const hm_pretok_def *hm_pretok_at(size_t i) {
    return i < sizeof defs / sizeof defs[0] ? &defs[i] : NULL;
}

static const hm_pretok_def *find_exact(const char *name, size_t len) {
    for (size_t i = 0; i < sizeof defs / sizeof defs[0]; i++)
        if (strlen(defs[i].name) == len && memcmp(defs[i].name, name, len) == 0) return &defs[i];
    return NULL;
}

const hm_pretok_def *hm_pretok_find(const char *name, size_t len) {
    const hm_pretok_def *d = find_exact(name, len);
    if (d) return d;
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (strlen(aliases[i].alias) == len && memcmp(aliases[i].alias, name, len) == 0)
            return find_exact(aliases[i].name, strlen(aliases[i].name));
    return NULL;
}
