#!/usr/bin/env bash
# cli_spec.sh - the speculative decoding flags of `run` and `bench` on the bundled model:
#   - `run --temp 0` with --spec-type ngram-simple, ngram-cache and with -md (draft-simple, the model itself)
#     prints exactly the text of `run --temp 0` without them, and the stats line on stderr;
#   - `bench -f` with --spec-type prints both rates and says the tokens were the same;
#   - refusals: llama.cpp's types we do not run (named), an unknown type, draft-simple without -md,
#     -md with ngram-simple, n-min above n-max, --spec-type in bench without -f, draft-dspark -md (saying
#     what DSpark is; without -md: cli_spec_dspark.sh), draft-mtp on a model without an MTP layer (naming it), a draft model of
#     another vocabulary (a synth: its tokenizer differs).
set -uo pipefail
. "$(dirname "$0")/lib.sh"
hm_tmpdir spec
M="$SRC/models/tiny-qwen3moe-q8_0.gguf"
[ -f "$M" ] || { echo "skipped: $M absent"; exit 77; }
printf 'def add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b\n\ndef add(a, b):\n    return a + b\n\n' > "$tmp/p.txt"

check "plain run" test "$(code "$EXE" run -m "$M" -f "$tmp/p.txt" -n 80 --temp 0 -t 2)" = 0
cp "$tmp/out" "$tmp/plain"
check "ngram-simple run" test "$(code "$EXE" run -m "$M" -f "$tmp/p.txt" -n 80 --temp 0 -t 2 --spec-type ngram-simple \
    --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 8)" = 0
check "ngram-simple: same text" cmp -s "$tmp/plain" "$tmp/out"
check "ngram-simple: stats" grep -q "speculation (ngram-simple): [0-9]* drafted, [0-9]* accepted" "$tmp/err"
check "ngram-cache run" test "$(code "$EXE" run -m "$M" -f "$tmp/p.txt" -n 80 --temp 0 -t 2 --spec-type ngram-cache)" = 0
check "ngram-cache: same text" cmp -s "$tmp/plain" "$tmp/out"
check "draft-simple run" test "$(code "$EXE" run -m "$M" -f "$tmp/p.txt" -n 80 --temp 0 -t 2 -md "$M" --spec-draft-n-max 4)" = 0
check "draft-simple: same text" cmp -s "$tmp/plain" "$tmp/out"
check "draft-simple: stats" grep -q "speculation (draft-simple)" "$tmp/err"

check "bench -f" test "$(code "$EXE" bench -m "$M" -p 0 -n 32 -r 1 -t 2 -f "$tmp/p.txt" --spec-type ngram-simple \
    --spec-ngram-simple-size-n 3)" = 0
check "bench: both rows" test "$(grep -c 'greedy 32' "$tmp/out")" = 2
check "bench: same tokens" grep -q "tokens identical to plain greedy" "$tmp/err"
check "bench -f ngram-cache" test "$(code "$EXE" bench -m "$M" -p 0 -n 32 -r 2 -t 2 -f "$tmp/p.txt" --spec-type ngram-cache)" = 0
check "bench ngram-cache: same tokens (its cache rebuilt each run)" grep -q "tokens identical to plain greedy" "$tmp/err"

check "later type refused" test "$(code "$EXE" run -m "$M" -p x --spec-type draft-eagle3)" = 2
check "later type named" grep -q "draft-eagle3 is llama.cpp's, not implemented" "$tmp/err"
check "draft-dspark -md refused" test "$(code "$EXE" run -m "$M" -p x --spec-type draft-dspark -md "$M")" = 2
check "draft-dspark: what it is" grep -q "DSpark is DeepSeek's block drafter" "$tmp/err"
check "draft-mtp without MTP refused" test "$(code "$EXE" run -m "$M" -p x -n 4 --spec-type draft-mtp)" = 1
check "draft-mtp without MTP named" grep -q "no multi-token-prediction layer (qwen3moe" "$tmp/err"
check "unknown type" test "$(code "$EXE" run -m "$M" -p x --spec-type foo)" = 2
check "draft-simple needs -md" test "$(code "$EXE" run -m "$M" -p x --spec-type draft-simple)" = 2
check "-md with ngram" test "$(code "$EXE" run -m "$M" -p x --spec-type ngram-simple -md "$M")" = 2
check "n-min > n-max" test "$(code "$EXE" run -m "$M" -p x -md "$M" --spec-draft-n-max 2 --spec-draft-n-min 3)" = 2
check "bench spec without -f" test "$(code "$EXE" bench -m "$M" -n 8 --spec-type ngram-simple)" = 2
"$EXE" synth --preset tiny --type q8_0 -o "$tmp/syn.gguf" >/dev/null 2>&1
check "other vocabulary refused" test "$(code "$EXE" run -m "$M" -p x -n 4 -md "$tmp/syn.gguf")" = 1
check "other vocabulary named" grep -q "draft model: vocabulary" "$tmp/err"
exit $fail
