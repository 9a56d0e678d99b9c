/* cmd_tokenize.c - `hotmoe tokenize`: print the token ids of a text with a model's tokenizer
 * (works on vocab-only GGUF files), and `--vocab-from` to write such a file from a Hugging Face
 * tokenizer.json. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: hotmoe tokenize -m FILE [--no-bos] [--no-special] [--ids] [--per-line] (-p TEXT | -f FILE)\n"
            "       hotmoe tokenize --vocab-from tokenizer.json [--vocab-config tokenizer_config.json] -o OUT.gguf\n"
            "\n"
            "Tokenize TEXT (or the bytes of FILE) with the tokenizer of the GGUF model FILE (a full model\n"
            "or a vocab-only file) and print one line per token, `ID -> 'PIECE'`.\n"
            "\n"
            "  -m, --model FILE   GGUF file with tokenizer.* keys\n"
            "  -p, --prompt TEXT  text to tokenize\n"
            "  -f, --file FILE    read the text from FILE ('-' = standard input)\n"
            "  --ids              print only the ids, space-separated on one line\n"
            "  --per-line         tokenize each line of the text on its own (without its newline);\n"
            "                     with --ids, one output line per input line\n"
            "  --no-bos           do not add BOS even if the model asks for it\n"
            "  --no-special       treat control tokens (<|im_start|>, ...) in the text as plain text\n"
            "  --vocab-from JSON  write a vocab-only GGUF from a Hugging Face tokenizer.json (byte-level BPE)\n"
            "  --vocab-config CFG its tokenizer_config.json (special ids, add_bos, chat template)\n"
            "  -o, --output OUT   where --vocab-from writes\n");
}

static char *read_all(const char *path, size_t *len) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    if (buf && ferror(f)) { free(buf); buf = NULL; }
    if (f != stdin) fclose(f);
    if (buf) buf[n] = 0;
    *len = n;
    return buf;
}

/* print a piece with non-printable bytes escaped */
static void print_piece(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') fputs("\\n", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c == '\r') fputs("\\r", stdout);
        else if (c == '\\') fputs("\\\\", stdout);
        else if (c == '\'') fputs("\\'", stdout);
        else if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
        else putchar(c);
    }
}

static int tokenize_print(const hm_tokenizer *t, const char *text, size_t len, const hm_tokenize_opts *o,
                          bool ids_only) {
    int32_t *ids;
    size_t n;
    hm_err err = {{0}};
    if (hm_tokenize(t, text, len, o, &ids, &n, &err) != HM_OK) {
        fprintf(stderr, "tokenize: %s\n", err.msg);
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        if (ids_only) {
            printf(i ? " %d" : "%d", ids[i]);
            continue;
        }
        size_t pl;
        const char *p = hm_token_piece(t, ids[i], &pl);
        printf("%8d -> '", ids[i]);
        print_piece(p, pl);
        fputs("'\n", stdout);
    }
    if (ids_only) putchar('\n');
    free(ids);
    return 0;
}

int hm_cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *prompt = NULL, *file = NULL, *vocab_from = NULL, *vocab_cfg = NULL,
               *out = NULL;
    bool no_bos = false, no_special = false, ids_only = false, per_line = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_val = i + 1 < argc;
        if (hm_cli_is_help(a)) { usage(stdout); return 0; }
        else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has_val) model = argv[++i];
        else if ((!strcmp(a, "-p") || !strcmp(a, "--prompt")) && has_val) prompt = argv[++i];
        else if ((!strcmp(a, "-f") || !strcmp(a, "--file")) && has_val) file = argv[++i];
        else if ((!strcmp(a, "-o") || !strcmp(a, "--output")) && has_val) out = argv[++i];
        else if (!strcmp(a, "--vocab-from") && has_val) vocab_from = argv[++i];
        else if (!strcmp(a, "--vocab-config") && has_val) vocab_cfg = argv[++i];
        else if (!strcmp(a, "--no-bos")) no_bos = true;
        else if (!strcmp(a, "--no-special")) no_special = true;
        else if (!strcmp(a, "--ids")) ids_only = true;
        else if (!strcmp(a, "--per-line")) per_line = true;
        else {
            fprintf(stderr, "tokenize: unknown option or missing value: '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    hm_err err = {{0}};
    if (vocab_from) {
        if (!out) {
            fprintf(stderr, "tokenize: --vocab-from needs -o OUT.gguf\n");
            return 2;
        }
        if (hm_tokenizer_write_vocab_gguf(vocab_from, vocab_cfg, out, &err) != HM_OK) {
            fprintf(stderr, "tokenize: %s\n", err.msg);
            return 1;
        }
        fprintf(stderr, "tokenize: wrote %s\n", out);
        return 0;
    }
    if (!model || (!prompt == !file)) {
        fprintf(stderr, "tokenize: need -m FILE and one of -p TEXT / -f FILE\n");
        usage(stderr);
        return 2;
    }
    size_t len = 0;
    char *text = NULL;
    if (file) {
        text = read_all(file, &len);
        if (!text) {
            fprintf(stderr, "tokenize: cannot read %s: %s\n", file, strerror(errno));
            return 1;
        }
    } else {
        len = strlen(prompt);
    }
    hm_tokenizer *t = NULL;
    if (hm_tokenizer_open(&t, model, &err) != HM_OK) {
        fprintf(stderr, "tokenize: %s\n", err.msg);
        free(text);
        return 1;
    }
    hm_tokenize_opts o;
    hm_tokenize_opts_default(t, &o);
    if (no_bos) o.add_bos = false;
    if (no_special) o.parse_special = false;
    const char *src = text ? text : prompt;
    int rc = 0;
    if (per_line) {
        for (size_t s = 0; s < len && rc == 0;) {
            const char *nl = memchr(src + s, '\n', len - s);
            size_t e = nl ? (size_t)(nl - src) : len;
            rc = tokenize_print(t, src + s, e - s, &o, ids_only);
            s = e + 1;
        }
    } else {
        rc = tokenize_print(t, src, len, &o, ids_only);
    }
    hm_tokenizer_close(t);
    free(text);
    return rc;
}
