#!/usr/bin/env bash
# cli_ppmodel.sh - the prompt-processing model flags (issue 25) of `run`, `bench` and `serve`:
#   - `run --temp 0` with --prompt-processing-model equal to the main model prints exactly the text
#     of `run --temp 0` without it (the bundled model and a synth qwen3moe), with and without refresh,
#     and the stderr line says the prompt-processing model prefilled;
#   - a copy at another quantisation (synth q4_0 from the main q8_0's seed) runs, and twice gives the
#     same text (greedy after the hand-over is deterministic);
#   - --prompt-processing-min-tokens above the prompt: the main model prefills (said on stderr) and
#     the text is the plain run's;
#   - refusals naming what differs: another seed (a norm's values), another depth (block_count),
#     a bad flag value;
#   - bench: the pp test through the copy and --e2e's line; serve: a long request prefilled by the
#     copy (its stderr line and /metrics counter), a short one not.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
hm_tmpdir ppmodel
B="$SRC/models/tiny-qwen3moe-q8_0.gguf"
[ -f "$B" ] || { echo "skipped: $B absent"; exit 77; }
for t in q8_0 q4_0; do
    check "synth $t" test "$(code "$EXE" synth --preset tiny --type "$t" --seed 5 -q -t 2 -o "$tmp/$t.gguf")" = 0
done
check "synth other seed" test "$(code "$EXE" synth --preset tiny --type q8_0 --seed 6 -q -t 2 -o "$tmp/s6.gguf")" = 0
check "synth other depth" test "$(code "$EXE" synth --preset tiny --layers 3 --type q8_0 --seed 5 -q -t 2 -o "$tmp/l3.gguf")" = 0
printf 'def add(a, b):\n    return a + b\n\nclass Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n' > "$tmp/p.txt"

for M in "$B" "$tmp/q8_0.gguf"; do
    n=$(basename "$M")
    check "$n: plain run" test "$(code "$EXE" run -m "$M" -f "$tmp/p.txt" -n 40 --temp 0 -t 2)" = 0
    cp "$tmp/out" "$tmp/plain"
    check "$n: the copy = the main model" test "$(code "$EXE" run -m "$M" -f "$tmp/p.txt" -n 40 --temp 0 -t 2 \
        --prompt-processing-model "$M" --prompt-processing-min-tokens 8 -ub 16)" = 0
    check "$n: same text" cmp -s "$tmp/plain" "$tmp/out"
    check "$n: the copy prefilled" grep -q "prefill: prompt-processing model [0-9]* tokens" "$tmp/err"
    check "$n: with refresh" test "$(code "$EXE" run -m "$M" -f "$tmp/p.txt" -n 40 --temp 0 -t 2 \
        --prompt-processing-model "$M" --prompt-processing-min-tokens 8 --prompt-processing-refresh 5)" = 0
    check "$n: refresh: same text" cmp -s "$tmp/plain" "$tmp/out"
    check "$n: refresh: 5 by the main model" grep -q "main model refresh 5 tokens" "$tmp/err"
    check "$n: short prompt" test "$(code "$EXE" run -m "$M" -f "$tmp/p.txt" -n 40 --temp 0 -t 2 \
        --prompt-processing-model "$M" --prompt-processing-min-tokens 100000)" = 0
    check "$n: short: same text" cmp -s "$tmp/plain" "$tmp/out"
    check "$n: short: the main model prefilled" grep -q "prefill: main model" "$tmp/err"
done

# a real copy at another quantisation: deterministic, and it is the copy's cache (the text may differ)
check "q4_0 copy" test "$(code "$EXE" run -m "$tmp/q8_0.gguf" -f "$tmp/p.txt" -n 40 --temp 0 -t 2 \
    --prompt-processing-model "$tmp/q4_0.gguf" --prompt-processing-min-tokens 8)" = 0
cp "$tmp/out" "$tmp/q4a"
check "q4_0 copy: prefilled by it" grep -q "prefill: prompt-processing model" "$tmp/err"
check "q4_0 copy: the norms held once" grep -Eq "prompt-processing model .*q4_0.gguf: [1-9][0-9]* tensors \([0-9.]+ MiB\) identical to the main model's, held once" "$tmp/err"
check "q4_0 copy again" test "$(code "$EXE" run -m "$tmp/q8_0.gguf" -f "$tmp/p.txt" -n 40 --temp 0 -t 1 \
    --prompt-processing-model "$tmp/q4_0.gguf" --prompt-processing-min-tokens 8)" = 0
check "q4_0 copy: deterministic (and across thread counts)" cmp -s "$tmp/q4a" "$tmp/out"

# refusals
check "other seed refused" test "$(code "$EXE" run -m "$tmp/q8_0.gguf" -p hi -n 1 \
    --prompt-processing-model "$tmp/s6.gguf")" = 1
check "other seed: names the tensor" grep -q "tensor blk.0.attn_norm.weight has other values" "$tmp/err"
check "other depth refused" test "$(code "$EXE" run -m "$tmp/q8_0.gguf" -p hi -n 1 \
    --prompt-processing-model "$tmp/l3.gguf")" = 1
check "other depth: names the key" grep -q "key qwen3moe.block_count = 3, the main model's 4" "$tmp/err"
check "another vocabulary refused" test "$(code "$EXE" run -m "$B" -p hi -n 1 --prompt-processing-model "$tmp/q8_0.gguf")" = 1
check "another vocabulary: named" grep -q "is not the same model as" "$tmp/err"
check "missing file" test "$(code "$EXE" run -m "$B" -p hi -n 1 --prompt-processing-model "$tmp/none.gguf")" = 1
check "missing file: named" grep -q "prompt-processing model: .*none.gguf" "$tmp/err"
check "bad min-tokens" test "$(code "$EXE" run -m "$B" -p hi --prompt-processing-min-tokens 0)" = 2
check "bad refresh" test "$(code "$EXE" run -m "$B" -p hi --prompt-processing-refresh -1)" = 2

# bench: the pp test goes through the copy; --e2e prints its line
check "bench" test "$(code "$EXE" bench -m "$tmp/q8_0.gguf" -p 64 -n 8 -r 1 -t 2 --e2e \
    --prompt-processing-model "$tmp/q4_0.gguf" --prompt-processing-min-tokens 32 --json)" = 0
check "bench: e2e fields" grep -q '"e2e_ttft_s": [0-9.]*, "e2e_decode_tok_s"' "$tmp/out"
check "bench: e2e line" grep -q "e2e run 1: prompt 64 tokens, time to first token" "$tmp/err"
check "bench: the copy prefilled" grep -q "prefill: prompt-processing model" "$tmp/err"

# serve: per request, by prompt length
if command -v curl >/dev/null; then
    LOG=$tmp/log
    pid=
    trap '[ -n "$pid" ] && kill $pid 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"' EXIT
    hm_serve_up "$tmp/q8_0.gguf" -t 2 --prompt-processing-model "$tmp/q4_0.gguf" --prompt-processing-min-tokens 40 \
        --prompt-processing-refresh 4
    check "serve up" test "$up" = 1
    if [ "$up" = 1 ]; then
        long=$(printf 'word%.0s ' $(seq 1 80))
        curl -s "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
            -d "{\"prompt\": \"$long\", \"max_tokens\": 4, \"temperature\": 0}" > "$tmp/r1"
        check "serve: long request answered" grep -q '"choices"' "$tmp/r1"
        check "serve: the copy prefilled it" grep -Eq "slot 0: prompt of [0-9]+ tokens \(0 cached\): [0-9]+ prefilled by the prompt-processing model, 4 by the main model" "$LOG"
        curl -s "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
            -d '{"prompt": "hi", "max_tokens": 4, "temperature": 0}' > "$tmp/r2"
        check "serve: short request answered" grep -q '"choices"' "$tmp/r2"
        check "serve: one request by the copy" bash -c "curl -s http://127.0.0.1:$PORT/metrics | grep -Eq '^hotmoe_requests_pp_total 1$'"
        kill $pid; wait $pid 2>/dev/null; pid=
    fi
fi
exit $fail
