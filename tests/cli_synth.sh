#!/usr/bin/env bash
# cli_synth.sh - the `hotmoe synth` and `hotmoe inspect` command lines: help, the README demo,
# --json values (hand-derived), exit codes and messages for bad input. test_synth.c checks the
# numbers in depth; this checks what a user types.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
hm_tmpdir synth

check "synth --help" test "$(code "$EXE" synth --help)" = 0
check "synth --help text" grep -q -- "--preset" "$tmp/out"
check "inspect --help" test "$(code "$EXE" inspect --help)" = 0
check "inspect --help text" grep -q -- "--budget" "$tmp/out"

# the README demo
check "synth tiny" test "$(code "$EXE" synth --arch qwen3moe --preset tiny --type q4_k_m --seed 1 -o "$tmp/tiny.gguf")" = 0
check "synth progress" grep -q "synth: 100%" "$tmp/err"
check "inspect tiny" test "$(code "$EXE" inspect "$tmp/tiny.gguf" --budget 2MiB)" = 0
check "inspect experts line" grep -q "4 layers x 16 experts = 64 units" "$tmp/out"
check "inspect budget line" grep -q "holds 16 of 64 units" "$tmp/out"

# --json: q8_0, 2 layers. One unit = gate + up (256 rows of 256) + down (256 rows of 256), each
# row 256/32 blocks of 34 bytes = 272: 3 * 256 * 272 = 208896; expert bytes 2 * 16 * 208896.
check "synth q8_0" test "$(code "$EXE" synth --preset tiny --layers 2 --type q8_0 --seed 3 -q -o "$tmp/q8.gguf")" = 0
check "synth -q is quiet" test ! -s "$tmp/err"
check "inspect --json" test "$(code "$EXE" inspect --json --budget 1MiB "$tmp/q8.gguf")" = 0
for kv in '"arch": "qwen3moe"' '"n_layer": 2' '"n_expert": 16' '"n_expert_used": 4' '"n_vocab": 384' \
          '"unit_bytes": 208896' '"expert_bytes": 6684672' '"units_in_budget": 5'; do
    check "json has $kv" grep -qF "$kv" "$tmp/out"
done
check "json is one object" test "$(head -c1 "$tmp/out")" = "{"

# --fast-experts: documented; the same experts view as the regular file, other bytes
check "help names --fast-experts" sh -c "'$EXE' synth --help | grep -q 'for I/O benchmarks: expert values are random blocks'"
check "synth --fast-experts" test "$(code "$EXE" synth --preset tiny --layers 2 --type q8_0 --seed 3 -q --fast-experts -o "$tmp/q8f.gguf")" = 0
check "fast: other bytes" sh -c "! cmp -s '$tmp/q8f.gguf' '$tmp/q8.gguf'"
check "inspect fast" test "$(code "$EXE" inspect --json --budget 1MiB "$tmp/q8f.gguf")" = 0
check "fast: same expert bytes" grep -qF '"expert_bytes": 6684672' "$tmp/out"

# the low-bit mixes: one unit = gate + up (256 rows of 256) + down (256 rows of 256); q2_k: Q2_K
# gate/up (84 bytes per 256), Q3_K down (110): 2 * 256 * 84 + 256 * 110 = 71168; q3_k_m: Q3_K
# gate/up, Q4_K down (144; layers < 2 / 16 = 0 get Q5_K): 2 * 256 * 110 + 256 * 144 = 93184.
# Each file also runs (greedy, 4 tokens).
for tu in q2_k:71168 q3_k_m:93184; do
    t=${tu%%:*}
    check "synth $t" test "$(code "$EXE" synth --preset tiny --layers 2 --type $t --seed 3 -q -o "$tmp/$t.gguf")" = 0
    check "inspect $t" test "$(code "$EXE" inspect --json "$tmp/$t.gguf")" = 0
    check "$t unit_bytes" grep -qF "\"unit_bytes\": ${tu#*:}" "$tmp/out"
    check "run $t" test "$(code "$EXE" run -m "$tmp/$t.gguf" -p "hello" -n 4 --temp 0 -t 2)" = 0
done
# the llama-quantize and ud-* mixes on the other archs (types by hand: test_synth's check_arch_mixes)
for at in "gemma4 gemma4-tiny q3_k_m" "deepseek4 tiny iq2_m" "qwen3next tiny ud-iq2_m"; do
    set -- $at
    check "synth $1 $3" test "$(code "$EXE" synth --arch $1 --preset $2 --type $3 --seed 3 -q -t 2 -o "$tmp/a.gguf")" = 0
    check "run $1 $3" test "$(code "$EXE" run -m "$tmp/a.gguf" -p "hello" -n 2 --temp 0 -t 2)" = 0
done
# --imatrix: a file that is not an importance matrix is refused, naming it
printf 'GGUF\003\000\000\000garbage' >"$tmp/im.gguf"
check "bad imatrix exit 1" test "$(code "$EXE" synth --preset tiny --type iq2_m --imatrix "$tmp/im.gguf" -q -o "$tmp/i.gguf")" = 1
check "bad imatrix named" grep -q "im.gguf" "$tmp/err"
printf '\001\000\000\000' >"$tmp/im.dat"
check "truncated legacy imatrix exit 1" test "$(code "$EXE" synth --preset tiny --type iq2_m --imatrix "$tmp/im.dat" -q -o "$tmp/i.gguf")" = 1
check "truncated legacy imatrix says so" grep -q "entry 1 of 1" "$tmp/err"

# errors: exit 1 with the file named for bad files, 2 for bad usage
check "missing file exit 1" test "$(code "$EXE" inspect "$tmp/nope.gguf")" = 1
check "missing file named" grep -q "nope.gguf" "$tmp/err"
printf 'GGUF\003\000\000\000garbage' >"$tmp/bad.gguf"
check "corrupt file exit 1" test "$(code "$EXE" inspect "$tmp/bad.gguf")" = 1
check "corrupt file message" grep -q "bad.gguf" "$tmp/err"
check "inspect no file exit 2" test "$(code "$EXE" inspect)" = 2
check "inspect bad option exit 2" test "$(code "$EXE" inspect --frobnicate "$tmp/q8.gguf")" = 2
check "inspect bad budget exit 2" test "$(code "$EXE" inspect --budget lots "$tmp/q8.gguf")" = 2
check "synth bad type exit 2" test "$(code "$EXE" synth --preset tiny --type q3_k -o "$tmp/x.gguf")" = 2
check "synth bad type lists types" grep -q "q4_k_m" "$tmp/err"
check "synth no output exit 2" test "$(code "$EXE" synth --preset tiny --type f16)" = 2
check "synth bad dir exit 1" test "$(code "$EXE" synth --preset tiny --type f16 -q -o "$tmp/no/dir/x.gguf")" = 1
check "no partial file" test ! -e "$tmp/x.gguf"
# an arch without --preset takes its main real shape (a valid preset: the run gets as far as the
# type, which is wrong on purpose so that no multi-GB file is written); qwen3moe still asks
for a in qwen35moe qwen3next gemma4 deepseek2 deepseek4 glm4moe olmoe llama gpt-oss; do
    check "synth --arch $a without --preset: exit 2" test "$(code "$EXE" synth --arch $a --type bogus -q -o "$tmp/x.gguf")" = 2
    check "synth --arch $a without --preset: the preset resolved" grep -q "unknown type 'bogus'" "$tmp/err"
done
check "synth qwen3moe without --preset exit 2" test "$(code "$EXE" synth --type q8_0 -q -o "$tmp/x.gguf")" = 2
check "synth qwen3moe without --preset says so" grep -q -- "--preset is required" "$tmp/err"

exit $fail
