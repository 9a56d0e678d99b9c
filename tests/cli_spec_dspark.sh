#!/usr/bin/env bash
# cli_spec_dspark.sh - `--spec-type draft-dspark` in `run` and `bench` on a tiny deepseek4 synth.
# hotmoe has no DSpark drafter yet (docs/ENGINE.md, "DSpark"), so:
#   - without -md it does what llama.cpp does for a draft-* type with no draft model: no speculation.
#     Checked: a loud warning on stderr, no speculation stats line (nothing was drafted), and the
#     text is exactly plain greedy's (the reference: the same run without the flag);
#   - with -md it is refused (exit 2) with a message saying what DSpark is, and no other drafter runs
#     (no speculation stats line, no generated text);
#   - the last --spec-type wins (draft-dspark then ngram-simple runs ngram-simple, and says so).
set -uo pipefail
. "$(dirname "$0")/lib.sh"
hm_tmpdir spec_dspark
check "synth deepseek4 tiny" test "$(code "$EXE" synth --arch deepseek4 --preset tiny --type q8_0 --seed 3 -q \
    -o "$tmp/m.gguf")" = 0
printf 'one two three one two three one two' >"$tmp/p.txt"

check "plain run" test "$(code "$EXE" run -m "$tmp/m.gguf" -f "$tmp/p.txt" -n 24 --temp 0 -t 1)" = 0
cp "$tmp/out" "$tmp/plain"
check "dspark run" test "$(code "$EXE" run -m "$tmp/m.gguf" -f "$tmp/p.txt" -n 24 --temp 0 -t 1 \
    --spec-type draft-dspark)" = 0
check "dspark: same text as plain greedy" cmp -s "$tmp/plain" "$tmp/out"
check "dspark: warning" grep -q "WARNING: --spec-type draft-dspark without a DSpark drafter file (-md): speculation is OFF" "$tmp/err"
check "dspark: nothing drafted" bash -c "! grep -q 'speculation (' '$tmp/err'"

check "dspark -md refused" test "$(code "$EXE" run -m "$tmp/m.gguf" -p x -n 4 -t 1 --spec-type draft-dspark \
    -md "$tmp/m.gguf")" = 2
check "dspark -md: says what DSpark is" grep -q "DSpark is DeepSeek's block drafter" "$tmp/err"
check "dspark -md: no text" test ! -s "$tmp/out"
check "dspark -md: nothing ran" bash -c "! grep -q 'speculation (' '$tmp/err'"
check "bench dspark -md refused" test "$(code "$EXE" bench -m "$tmp/m.gguf" -n 8 -t 1 --spec-type draft-dspark \
    -md "$tmp/m.gguf")" = 2

check "last type wins" test "$(code "$EXE" run -m "$tmp/m.gguf" -f "$tmp/p.txt" -n 24 --temp 0 -t 1 \
    --spec-type draft-dspark --spec-type ngram-simple --spec-ngram-simple-size-n 2)" = 0
check "last type wins: ngram-simple ran" grep -q "speculation (ngram-simple)" "$tmp/err"
check "last type wins: no dspark warning" bash -c "! grep -q 'draft-dspark' '$tmp/err'"
check "last type wins: same text" cmp -s "$tmp/plain" "$tmp/out"
exit $fail
