#!/usr/bin/env bash
# cli_qwen3moe.sh - the engine's command lines (logits, run, perplexity, bench, profile) as a user
# types them: help, exit codes and messages for bad input, the documented behaviour when a prompt
# does not fit the context, output sizes and formats, and determinism of seeded sampling; the
# expert usage flags (--profile-out/--profile-format/--trace-out/--profile/--policy/--vram-budget):
# files that `hotmoe plan` reads, per-layer totals, and the refusals. The numbers themselves are
# checked against references by test_qwen3moe_tiny (routing included) / test_qwen3moe_hf.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
hm_tmpdir qwen3moe

for c in logits run perplexity bench profile; do
    check "$c --help" test "$(code "$EXE" $c --help)" = 0
    check "$c --help text" grep -q -- "--model" "$tmp/out"
    check "$c without -m" test "$(code "$EXE" $c)" = 2
    check "$c without -m says so" grep -q "no model given" "$tmp/err"
done

if ! "$EXE" synth --preset tiny --type q4_k_m --seed 2 -q -o "$tmp/m.gguf" >/dev/null 2>&1; then
    echo "synth unavailable: skipping the model runs"
    [ $fail = 0 ] && exit 77 || exit 1
fi
m="$tmp/m.gguf"

# logits: n_tokens x n_vocab float32
check "logits" test "$(code "$EXE" logits -m "$m" --tokens 1,2,3,4,5 -o "$tmp/l.f32" -t 2)" = 0
nv=$(sed -n 's/.*wrote 5 x \([0-9]*\) float32.*/\1/p' "$tmp/err")
check "logits n_vocab reported" test -n "$nv"
check "logits size" test "$(stat -c %s "$tmp/l.f32")" = "$((5 * ${nv:-0} * 4))"
check "logits same with -t 1" test "$(code "$EXE" logits -m "$m" --tokens "1 2 3 4 5" -o "$tmp/l1.f32" -t 1)" = 0
check "logits -t 1 == -t 2 (bytes)" cmp -s "$tmp/l.f32" "$tmp/l1.f32"
check "logits too long for -c" test "$(code "$EXE" logits -m "$m" --tokens 1,2,3 -c 2 -o "$tmp/x.f32")" = 1
check "logits too long message" grep -q "do not fit the context" "$tmp/err"
check "logits bad id" test "$(code "$EXE" logits -m "$m" --tokens 1,999999999 -o "$tmp/x.f32")" = 1
check "logits bad id message" grep -q "outside the vocabulary" "$tmp/err"
check "logits missing file" test "$(code "$EXE" logits -m "$tmp/nope.gguf" --tokens 1 -o "$tmp/x.f32")" = 1
check "logits bad -t" test "$(code "$EXE" logits -m "$m" --tokens 1 -o "$tmp/x.f32" -t zero)" = 2

# run: seeded sampling is deterministic; a prompt longer than -c is an error
check "run" test "$(code "$EXE" run -m "$m" -p "hello world" -n 12 --seed 7 --temp 1 -t 2)" = 0
cp "$tmp/out" "$tmp/run1"
check "run speed line" grep -q "generation .* tok/s" "$tmp/err"
check "run again" test "$(code "$EXE" run -m "$m" -p "hello world" -n 12 --seed 7 --temp 1 -t 1)" = 0
check "run deterministic" cmp -s "$tmp/out" "$tmp/run1"
check "run echoes the prompt" grep -q "^hello world" "$tmp/out"
check "run prompt > ctx" test "$(code "$EXE" run -m "$m" -p "one two three four five six seven eight" -c 4)" = 1
check "run prompt > ctx message" grep -q "does not fit the context" "$tmp/err"
check "run -p and -f" test "$(code "$EXE" run -m "$m" -p a -f b)" = 2

# perplexity: needs 2 x CTX tokens; prints [i] values and the final line
for i in $(seq 1 40); do echo "The quick brown fox jumps over the lazy dog number $i."; done >"$tmp/text.txt"
check "perplexity" test "$(code "$EXE" perplexity -m "$m" -f "$tmp/text.txt" -c 32 -t 2 --chunks 3)" = 0
check "perplexity chunks" grep -q "^\[1\][0-9.]*,\[2\][0-9.]*,\[3\][0-9.]*," "$tmp/out"
check "perplexity final" grep -qE "^Final estimate: PPL = [0-9.]+ \+/- [0-9.]+$" "$tmp/out"
check "perplexity too short" test "$(code "$EXE" perplexity -m "$m" -f "$tmp/text.txt" -c 4096)" = 1
check "perplexity too short message" grep -q "you need at least 8192 tokens" "$tmp/err"

# bench
check "bench --json" test "$(code "$EXE" bench -m "$m" -p 16 -n 4 -r 2 -t 2 --json)" = 0
check "bench pp_tok_s" grep -qE '"pp_tok_s": [0-9.]+' "$tmp/out"
check "bench tg_tok_s" grep -qE '"tg_tok_s": [0-9.]+' "$tmp/out"
check "bench json: nothing locked, nothing streamed" grep -qE '"mlocked_bytes": 0, "prefill_stream_units": 0' "$tmp/out"
# --mlock: the experts locked (bench reports their bytes), or refused naming RLIMIT_MEMLOCK (exit 1)
rcm=$(code "$EXE" bench -m "$m" -p 8 -n 2 -r 1 -t 2 --json --mlock)
if [ "$rcm" = 0 ]; then
    check "bench --mlock locks the experts" grep -qE '"mlocked_bytes": [1-9][0-9]*' "$tmp/out"
else
    check "bench --mlock refused, saying why" grep -q "RLIMIT_MEMLOCK" "$tmp/err"
fi
check "bench table" test "$(code "$EXE" bench -m "$m" -p 16 -n 4 -r 1)" = 0
check "bench table rows" grep -q "| pp16 |" "$tmp/out"
# -d with a recurrent state (qwen35moe's DeltaNet cannot be trimmed back): rebuilt before each run
q35="$SRC/tests/fixtures/hf_ref/qwen35moe/model.gguf"
check "bench -d on qwen35moe" test "$(code "$EXE" bench -m "$q35" -p 8 -n 4 -d 16 -r 2 -t 2)" = 0
check "bench -d qwen35moe rows" grep -q "| tg4 @ d16 |" "$tmp/out"
# RoPE scaling is not implemented for qwen35moe: asked for, the load refuses rather than ignore it
check "qwen35moe refuses --rope-scaling linear" test "$(code "$EXE" bench -m "$q35" -p 4 -n 0 -r 1 -t 2 --rope-scaling linear --rope-scale 2)" = 1
check "qwen35moe: the refusal says why" grep -q "RoPE scaling.*not implemented" "$tmp/err"
check "qwen35moe runs with --rope-scaling none" test "$(code "$EXE" bench -m "$q35" -p 4 -n 0 -r 1 -t 2 --rope-scaling none)" = 0

# expert usage: profiles and traces from every command, read by plan; refusals
nl=$("$EXE" inspect "$m" 2>/dev/null | sed -n 's/.*block_count *\([0-9]*\).*/\1/p')
k=$("$EXE" inspect "$m" 2>/dev/null | sed -n 's/.*expert_used_count *\([0-9]*\).*/\1/p')
check "logits --profile-out --trace-out" test "$(code "$EXE" logits -m "$m" --tokens 1,2,3,4,5,6,7 -o "$tmp/l.f32" -ub 3 --profile-out "$tmp/p.json" --trace-out "$tmp/t.bin")" = 0
check "profile written message" grep -q "wrote the expert usage profile" "$tmp/err"
check "profile schema" grep -q '"schema":"hotmoe.profile.v1"' "$tmp/p.json"
if command -v jq >/dev/null && [ -n "$nl" ] && [ -n "$k" ]; then
    # all logits wanted: every layer routes all 7 tokens, k each
    check "profile: every layer's counts sum to 7 x k" test "$(jq -c "[.layers[] | (.counts | add)] | unique" "$tmp/p.json")" = "[$((7 * k))]"
    check "profile: $nl layers, 7 prompt tokens, 3 steps" test "$(jq -c "[(.layers | length), .prompt_tokens, .decode_tokens, .steps]" "$tmp/p.json")" = "[$nl,7,0,3]"
fi
check "trace size: header + per step and layer" test "$(stat -c %s "$tmp/t.bin")" -gt 32
if [ -w /dev/full ]; then # a full disk: the run finishes, the trace's close fails loudly, exit 1
    check "logits --trace-out /dev/full exits 1" test "$(code "$EXE" logits -m "$m" --tokens 1,2,3 -o "$tmp/x.f32" --trace-out /dev/full)" = 1
    check "full disk message names the file and the cause" grep -q "/dev/full: trace write failed: No space left on device" "$tmp/err"
fi
check "plan reads the profile" test "$(code "$EXE" plan --profile "$tmp/p.json" --budget 20%)" = 0
check "plan reads the trace" test "$(code "$EXE" plan -m "$m" --no-calibrate --trace "$tmp/t.bin" --budget 20%)" = 0
check "seed1 format" test "$(code "$EXE" logits -m "$m" --tokens 1,2,3 -o "$tmp/l.f32" --moe-layer-perf-out "$tmp/s.json" --profile-format seed1)" = 0
check "seed1 schema" grep -q '"schema":"llama.cpp.moe_layer_perf.v1"' "$tmp/s.json"
check "plan reads the seed1 profile" test "$(code "$EXE" plan -m "$m" --no-calibrate --profile "$tmp/s.json" --budget 20%)" = 0
check "--profile loads (static)" test "$(code "$EXE" logits -m "$m" --tokens 1,2 -o "$tmp/l.f32" --moe-hot-cache "$tmp/p.json")" = 0
check "--policy online --update-rate" test "$(code "$EXE" logits -m "$m" --tokens 1,2 -o "$tmp/l.f32" --policy online --moe-hot-cache-update-rate 0.1)" = 0
check "--policy without a fast tier says so" grep -q "no fast tier" "$tmp/err"
check "--policy static without a profile" test "$(code "$EXE" logits -m "$m" --tokens 1,2 -o "$tmp/l.f32" --policy static)" = 1
check "--policy bad" test "$(code "$EXE" logits -m "$m" --tokens 1,2 -o "$tmp/l.f32" --policy fastest)" = 2
check "--profile-format bad" test "$(code "$EXE" logits -m "$m" --tokens 1,2 -o "$tmp/l.f32" --profile-format csv)" = 2
# a VRAM budget needs a CUDA build and a device; without them the refusal names the reason
rc=$(code "$EXE" run -m "$m" -p hi -n 2 --vram-budget 1GiB)
if [ "$rc" != 0 ]; then
    check "--vram-budget refused without a GPU" test "$rc" = 1
    check "--vram-budget message" grep -Eq "no CUDA device found|built without CUDA" "$tmp/err"
    check "--moe-hot-cache-max-mib refused" test "$(code "$EXE" bench -m "$m" -p 4 -n 0 -r 1 --moe-hot-cache-max-mib 512)" = 1
    check "-ngl refused" test "$(code "$EXE" bench -m "$m" -p 4 -n 0 -r 1 -ngl 99)" = 1
    # the variable (cli_env.c), unlike the flag: without CUDA or a device it is named in a warning
    # and the run goes on, on the CPU (a seed command line still runs)
    check "GGML_CUDA_MOE_CACHE_BUDGET_MB is read" test "$(GGML_CUDA_MOE_CACHE_BUDGET_MB=64 code "$EXE" bench -m "$m" -p 4 -n 0 -r 1)" = 0
    check "GGML_CUDA_MOE_CACHE_BUDGET_MB named" grep -Eq '(built without CUDA|no CUDA device found): GGML_CUDA_MOE_CACHE_BUDGET_MB' "$tmp/err"
fi
# the KV cache's RAM: shown by inspect -c (tiny: 4 layers x K,V x 2 kv heads x 64 x 2 bytes = 2048
# per position), and a context whose cache cannot fit in the available RAM refused at load
check "inspect -c" test "$(code "$EXE" inspect "$m" -c 1000 --json)" = 0
check "inspect -c: 2048 bytes a position" grep -q '"kv_bytes": 2048000' "$tmp/out"
check "inspect -c text" test "$(code "$EXE" inspect "$m" -c 1000 --budget 4MiB)" = 0
check "inspect -c text line" grep -q "kv cache:   1000 positions: 1.95 MiB" "$tmp/out"
check "inspect -c 0 refused" test "$(code "$EXE" inspect "$m" -c 0)" = 2
avail_kib=$(sed -n 's/^MemAvailable: *\([0-9]*\) kB/\1/p' /proc/meminfo)
if [ -n "$avail_kib" ] && [ "$avail_kib" -lt $((60 * 1024 * 1024)) ]; then # f32: 4 KiB x 2^24 = 64 GiB
    check "a KV cache beyond the RAM is refused" test "$(code "$EXE" bench -m "$m" -c 16777216 --kv-type f32 -p 4 -n 0 -r 1)" = 1
    check "the refusal has the numbers" grep -q "needs 64.00 GiB of RAM but .* GiB is available: use a smaller context (-c [0-9]* or less), an f16 cache" "$tmp/err"
else
    echo "note: $avail_kib KiB available: the KV refusal check needs a machine with less than 60 GiB free"
fi
# llama.cpp's -b / -ub: -b caps the micro-batch; both take llama.cpp's sizes
check "-b and -ub 4096" test "$(code "$EXE" bench -m "$m" -p 64 -n 0 -r 1 -t 2 -b 16 --ubatch-size 4096)" = 0
check "-b 0 refused" test "$(code "$EXE" bench -m "$m" -p 4 -n 0 -r 1 -b 0)" = 2
# llama.cpp's cache-type flags: -ctk / -ctv name one type here, and say so when they differ
check "-ctk f16 -ctv f16" test "$(code "$EXE" bench -m "$m" -p 4 -n 0 -r 1 -t 2 -ctk f16 -ctv f16)" = 0
check "-ctk f32 -ctv f16 refused" test "$(code "$EXE" bench -m "$m" -p 4 -n 0 -r 1 -ctk f32 -ctv f16)" = 2
check "-ctk/-ctv mismatch says why" grep -q "one type for both" "$tmp/err"
check "-ctk q8_0 -ctv q8_0" test "$(code "$EXE" bench -m "$m" -p 4 -n 2 -r 1 -t 2 -ctk q8_0 -ctv q8_0 --json)" = 0
check "... a q8_0 cache" grep -q '"kv_type": "q8_0"' "$tmp/out"
check "-ctv q5_1 refused" test "$(code "$EXE" bench -m "$m" -p 4 -n 0 -r 1 -ctv q5_1)" = 2
check "-ctv q5_1 names the types there are" grep -q "f16, f32, bf16, q8_0 or q4_0" "$tmp/err"
# RoPE scaling flags (their effect is checked against transformers by test_qwen3moe_hf)
check "--rope-scaling yarn needs its keys" test "$(code "$EXE" bench -m "$m" -p 4 -n 0 -r 1 --rope-scaling yarn)" = 1
check "--rope-scaling yarn: names the missing key" grep -q "rope.scaling.factor" "$tmp/err"
check "--rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 64" test "$(code "$EXE" bench -m "$m" -p 4 -n 0 -r 1 -t 2 --rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 64)" = 0
check "--rope-scaling bogus refused" test "$(code "$EXE" bench -m "$m" -p 4 -n 0 -r 1 --rope-scaling bogus)" = 2
# --split-mode: layer is what hotmoe does, none is one GPU, row is refused with the reason
check "-sm layer" test "$(code "$EXE" bench -m "$m" -p 4 -n 0 -r 1 -t 2 -sm layer)" = 0
check "-sm row refused" test "$(code "$EXE" bench -m "$m" -p 4 -n 0 -r 1 -sm row)" = 2
check "-sm row says why" grep -q "row is not implemented" "$tmp/err"
# -fa as llama.cpp takes it: on|off|auto, or bare (= on); it changes only the GPU's attention
check "-fa off" test "$(code "$EXE" bench -m "$m" -p 4 -n 0 -r 1 -t 2 -fa off)" = 0
check "bare -fa then a flag" test "$(code "$EXE" bench -fa -m "$m" -p 4 -n 0 -r 1 -t 2)" = 0
check "-fa with a bad value" test "$(code "$EXE" bench -m "$m" -p 4 -n 0 -r 1 -fa sometimes)" = 2
check "bad --vram-budget" test "$(code "$EXE" bench -m "$m" -p 4 -n 0 -r 1 --vram-budget lots)" = 2
check "bad --n-cpu-moe" test "$(code "$EXE" bench -m "$m" -p 4 -n 0 -r 1 --n-cpu-moe -3)" = 2
check "--vram-budget 0 is fine" test "$(code "$EXE" bench -m "$m" -p 4 -n 2 -r 1 --vram-budget 0 --profile-out "$tmp/b.json")" = 0
check "bench profile" test -s "$tmp/b.json"
check "run --profile-out" test "$(code "$EXE" run -m "$m" -p "hello" -n 3 --seed 1 --profile-out "$tmp/r.json")" = 0
if command -v jq >/dev/null; then
    check "run profile: 3 decode steps after the prompt" test "$(jq .decode_tokens "$tmp/r.json")" = 3
fi
check "perplexity --profile-out" test "$(code "$EXE" perplexity -m "$m" -f "$tmp/text.txt" -c 32 --chunks 1 --profile-out "$tmp/ppl.json")" = 0
check "perplexity profile" test -s "$tmp/ppl.json"

# hotmoe profile: prompts file -> profile
printf 'hello world\n\nthe quick brown fox\nint main(void) { return 0; }\n' >"$tmp/prompts.txt"
check "profile" test "$(code "$EXE" profile -m "$m" -f "$tmp/prompts.txt" -o "$tmp/pp.json" -n 4 -t 2)" = 0
check "profile progress" grep -q "\[3/3\]" "$tmp/err"
check "profile says where" grep -q "wrote the expert usage profile to" "$tmp/err"
check "profile stdout empty" test ! -s "$tmp/out"
if command -v jq >/dev/null; then
    check "profile: 3 prompts x 4 decoded tokens" test "$(jq .decode_tokens "$tmp/pp.json")" = 12
fi
check "plan reads hotmoe profile's output" test "$(code "$EXE" plan --profile "$tmp/pp.json" --budget 20%)" = 0
check "profile --format seed1" test "$(code "$EXE" profile -m "$m" -f "$tmp/prompts.txt" -o "$tmp/pp1.json" -n 0 --format seed1)" = 0
check "profile seed1 schema" grep -q '"schema":"llama.cpp.moe_layer_perf.v1"' "$tmp/pp1.json"
check "profile without -o" test "$(code "$EXE" profile -m "$m" -f "$tmp/prompts.txt")" = 2
check "profile empty prompts" test "$(code "$EXE" profile -m "$m" -f /dev/null -o "$tmp/x.json")" = 1
check "profile bad --format" test "$(code "$EXE" profile -m "$m" -f "$tmp/prompts.txt" -o "$tmp/x.json" --format xml)" = 2

[ $fail = 0 ] && echo "cli_qwen3moe: all passed"
exit $fail
