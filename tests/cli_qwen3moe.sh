#!/usr/bin/env bash
# cli_qwen3moe.sh - the engine's command lines (logits, run, perplexity, bench) as a user types
# them: help, exit codes and messages for bad input, the documented behaviour when a prompt does
# not fit the context, output sizes and formats, and determinism of seeded sampling. The numbers
# themselves are checked against references by test_qwen3moe_tiny / test_qwen3moe_hf.
set -uo pipefail
exe="${HM_EXE:-build/hotmoe}"
tmp=$(mktemp -d /tmp/hm_cli_qwen3moe.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { # check NAME COND...
    local name=$1; shift
    if "$@"; then :; else echo "FAIL: $name"; fail=1; fi
}
code() { "$@" >"$tmp/out" 2>"$tmp/err"; echo $?; }

for c in logits run perplexity bench; do
    check "$c --help" test "$(code "$exe" $c --help)" = 0
    check "$c --help text" grep -q -- "--model" "$tmp/out"
    check "$c without -m" test "$(code "$exe" $c)" = 2
    check "$c without -m says so" grep -q "no model given" "$tmp/err"
done

if ! "$exe" synth --preset tiny --type q4_k_m --seed 2 -q -o "$tmp/m.gguf" >/dev/null 2>&1; then
    echo "synth unavailable: skipping the model runs"
    [ $fail = 0 ] && exit 77 || exit 1
fi
m="$tmp/m.gguf"

# logits: n_tokens x n_vocab float32
check "logits" test "$(code "$exe" logits -m "$m" --tokens 1,2,3,4,5 -o "$tmp/l.f32" -t 2)" = 0
nv=$(sed -n 's/.*wrote 5 x \([0-9]*\) float32.*/\1/p' "$tmp/err")
check "logits n_vocab reported" test -n "$nv"
check "logits size" test "$(stat -c %s "$tmp/l.f32")" = "$((5 * ${nv:-0} * 4))"
check "logits same with -t 1" test "$(code "$exe" logits -m "$m" --tokens "1 2 3 4 5" -o "$tmp/l1.f32" -t 1)" = 0
check "logits -t 1 == -t 2 (bytes)" cmp -s "$tmp/l.f32" "$tmp/l1.f32"
check "logits too long for -c" test "$(code "$exe" logits -m "$m" --tokens 1,2,3 -c 2 -o "$tmp/x.f32")" = 1
check "logits too long message" grep -q "do not fit the context" "$tmp/err"
check "logits bad id" test "$(code "$exe" logits -m "$m" --tokens 1,999999999 -o "$tmp/x.f32")" = 1
check "logits bad id message" grep -q "outside the vocabulary" "$tmp/err"
check "logits missing file" test "$(code "$exe" logits -m "$tmp/nope.gguf" --tokens 1 -o "$tmp/x.f32")" = 1
check "logits bad -t" test "$(code "$exe" logits -m "$m" --tokens 1 -o "$tmp/x.f32" -t zero)" = 2

# run: seeded sampling is deterministic; a prompt longer than -c is an error
check "run" test "$(code "$exe" run -m "$m" -p "hello world" -n 12 --seed 7 --temp 1 -t 2)" = 0
cp "$tmp/out" "$tmp/run1"
check "run speed line" grep -q "generation .* tok/s" "$tmp/err"
check "run again" test "$(code "$exe" run -m "$m" -p "hello world" -n 12 --seed 7 --temp 1 -t 1)" = 0
check "run deterministic" cmp -s "$tmp/out" "$tmp/run1"
check "run echoes the prompt" grep -q "^hello world" "$tmp/out"
check "run prompt > ctx" test "$(code "$exe" run -m "$m" -p "one two three four five six seven eight" -c 4)" = 1
check "run prompt > ctx message" grep -q "does not fit the context" "$tmp/err"
check "run -p and -f" test "$(code "$exe" run -m "$m" -p a -f b)" = 2

# perplexity: needs 2 x CTX tokens; prints [i] values and the final line
for i in $(seq 1 40); do echo "The quick brown fox jumps over the lazy dog number $i."; done >"$tmp/text.txt"
check "perplexity" test "$(code "$exe" perplexity -m "$m" -f "$tmp/text.txt" -c 32 -t 2 --chunks 3)" = 0
check "perplexity chunks" grep -q "^\[1\][0-9.]*,\[2\][0-9.]*,\[3\][0-9.]*," "$tmp/out"
check "perplexity final" grep -qE "^Final estimate: PPL = [0-9.]+ \+/- [0-9.]+$" "$tmp/out"
check "perplexity too short" test "$(code "$exe" perplexity -m "$m" -f "$tmp/text.txt" -c 4096)" = 1
check "perplexity too short message" grep -q "you need at least 8192 tokens" "$tmp/err"

# bench
check "bench --json" test "$(code "$exe" bench -m "$m" -p 16 -n 4 -r 2 -t 2 --json)" = 0
check "bench pp_tok_s" grep -qE '"pp_tok_s": [0-9.]+' "$tmp/out"
check "bench tg_tok_s" grep -qE '"tg_tok_s": [0-9.]+' "$tmp/out"
check "bench table" test "$(code "$exe" bench -m "$m" -p 16 -n 4 -r 1)" = 0
check "bench table rows" grep -q "| pp16 |" "$tmp/out"

[ $fail = 0 ] && echo "cli_qwen3moe: all passed"
exit $fail
