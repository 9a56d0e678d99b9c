#!/usr/bin/env bash
# cli_plan.sh - `hotmoe plan` as a user types it: a tiny synth model with a hand-made profile
# (hit rates derived below), the budget as bytes and as a share, a trace, and bad input.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
command -v jq >/dev/null || { echo "skipped: jq not installed"; exit 77; }
hm_tmpdir plan
near() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; exit !(d < 1e-9 && d > -1e-9) }'; }

check "plan --help" test "$(code "$EXE" plan --help)" = 0
check "plan --help text" grep -q -- "--n-cpu-moe" "$tmp/out"
check "synth tiny" test "$(code "$EXE" synth --preset tiny --type q4_k_m --seed 1 -q -o "$tmp/tiny.gguf")" = 0

# tiny: 4 layers x 16 experts, k 4. Every layer routes expert e (16 - e) times: 136 per layer.
# 25 % of 64 units = 16 slots: the top counts 16, 15, 14, 13 of each layer (ties go to the lower
# layer, and the four layers tie) -> 4 units per layer, hit rate 58 / 136.
# --n-cpu-moe with 16 slots' bytes: one layer (16 units) on the GPU -> N 3, hit rate 1/4.
row=$(seq 16 -1 1 | paste -sd, -)
{
    printf '{"schema": "hotmoe.profile.v1", "model": "tiny", "arch": "qwen3moe", "n_layer": 4, "n_expert": 16, "k": 4,'
    printf ' "tokens": 34, "decode_tokens": 34, "layers": ['
    for l in 0 1 2 3; do printf '%s{"layer": %d, "counts": [%s]}' "$([ $l = 0 ] || echo ,)" $l "$row"; done
    printf ']}\n'
} >"$tmp/p.json"
check "plan -m --json" test "$(code "$EXE" plan -m "$tmp/tiny.gguf" --profile "$tmp/p.json" --budget 25% --json -t 2)" = 0
j="$tmp/out"
check "units_fit 16" test "$(jq .units_fit "$j")" = 16
check "policy static" test "$(jq -r .policy "$j")" = static
check "static hit 58/136" near "$(jq .hit_rate "$j")" "$(awk 'BEGIN { printf "%.12f", 58 / 136 }')"
check "4 units per layer" test "$(jq -c '[.layers[].resident]' "$j")" = "[4,4,4,4]"
check "layer 2 experts" test "$(jq -c '.layers[2].experts' "$j")" = "[0,1,2,3]"
check "n-cpu-moe 3" test "$(jq .n_cpu_moe.n "$j")" = 3
check "n-cpu-moe hit 1/4" near "$(jq .n_cpu_moe.hit_rate "$j")" 0.25
check "cpu calibrated" test "$(jq '.cpu.us_per_unit > 0 and .cpu.threads == 2' "$j")" = true
check "compare has lru" test "$(jq '.compare.lru >= 0' "$j")" = true
# the GPU side: measured with a CUDA build on a device (the tiny model's units are too small for
# the GPU expert kernels, so only the upload is sure to be there); otherwise it names why not.
if [ "$(jq .gpu.measured "$j")" = true ]; then
    check "gpu device named" test "$(jq '.gpu.device | length > 0' "$j")" = true
    check "gpu upload measured" test "$(jq '.gpu.upload_gb_per_s > 0' "$j")" = true
else
    check "gpu: why not" test "$(jq '.gpu.note | test("built without CUDA|no CUDA device")' "$j")" = true
fi
check "gpu text" test "$(code "$EXE" plan -m "$tmp/tiny.gguf" --profile "$tmp/p.json" --budget 25% -t 2)" = 0
check "gpu text: block or why not" grep -Eq "^GPU \(.*, measured\): upload [0-9.]+ GB/s|^GPU: not measured \((built without CUDA|no CUDA device)\)" "$tmp/out"
check "gpu text: no placeholder" test "$(grep -c "not measured yet" "$tmp/out")" = 0

check "plan text" test "$(code "$EXE" plan -m "$tmp/tiny.gguf" --profile "$tmp/p.json" --budget 25% --no-calibrate)" = 0
check "text: units fit" grep -q "16 of 64 units fit" "$tmp/out"
check "text: n-cpu-moe" grep -q -- "--n-cpu-moe 3" "$tmp/out"
check "text: hit rate" grep -q "expected hit rate 42.6 %" "$tmp/out"
check "text: gpu skipped" grep -q "GPU: not measured (--no-calibrate)" "$tmp/out"

# without a model: the unit size from --unit-bytes; 1 MiB budget = 4 units of 256 KiB
check "plan --unit-bytes" test "$(code "$EXE" plan --profile "$tmp/p.json" --budget 1MiB --unit-bytes 256KiB --json)" = 0
check "4 units fit" test "$(jq .units_fit "$tmp/out")" = 4
check "top 4 = 16+16+16+16 of 544" near "$(jq .hit_rate "$tmp/out")" "$(awk 'BEGIN { printf "%.12f", 64 / 544 }')"

# a trace: 1 layer x 4 experts, k 1, routing 0 1 0 2 1 0 3 0; lru with 2 slots hits twice
# (test_experts.c derives it step by step).
{
    printf 'HMTRACE1\x01\0\0\0\x01\0\0\0\x04\0\0\0\x01\0\0\0\x01\0\0\0\0\0\0\0'
    for e in 0 1 0 2 1 0 3 0; do printf "R\\0\\0\\0\\x01\\0\\0\\0\\x0$e"; printf 'S\0\0\0\x01\0\0\0'; done
} >"$tmp/t.bin"
check "plan --trace" test "$(code "$EXE" plan --trace "$tmp/t.bin" --budget 50% --unit-bytes 1MiB --policy lru --json)" = 0
check "trace lru 2/8" near "$(jq .hit_rate "$tmp/out")" 0.25

# --ram-budget (the RAM+SSD tiers). tiny's slot is 140 KiB (124.5 KiB aligned); 50 % of the 7.3 MiB
# of units = 26 buffers, 13 of them staging (half the pool, below 2 x 16) -> 13 RAM slots: the
# top counts 16, 15, 14 of every layer and one 13 -> static hit (45 x 4 + 13) / 544 = 193 / 544.
check "ram 50%" test "$(code "$EXE" plan -m "$tmp/tiny.gguf" --profile "$tmp/p.json" --ram-budget 50% --json -t 2)" = 0
cp "$tmp/out" "$tmp/r50.json"
check "ram: 13 slots" test "$(jq .ram.units_fit "$tmp/r50.json")" = 13
check "ram: static 193/544" near "$(jq .ram.hit_rate "$tmp/r50.json")" "$(awk 'BEGIN { printf "%.12f", 193 / 544 }')"
check "ram: ssd MiB = (1 - hit) x routed" test "$(jq '.ram | (.ssd_mib_per_token - (1 - .hit_rate_vram_ram) * .routed_mib_per_token) | fabs < 1e-9' "$tmp/r50.json")" = true
check "ram: routed = 16 units" test "$(jq '.ram.routed_mib_per_token * 1048576 / 16 - .expert_bytes / .n_units | fabs < 1e-6' "$tmp/r50.json")" = true
check "ram: ssd read or why not" test "$(jq '(.ram.ssd.us_per_unit_qd1 > 0 and .ram.ssd.us_per_unit_qd > 0) or (.ram.ssd_note | length > 0)' "$tmp/r50.json")" = true
if [ "$(jq '.ram.ssd != null' "$tmp/r50.json")" = true ]; then
    check "ram: both bounds" test "$(jq '.ram.predicted | .tok_s_overlap >= .tok_s_no_overlap and .tok_s_no_overlap > 0' "$tmp/r50.json")" = true
    check "ram: serial = cpu + ssd" test "$(jq '.ram.predicted | (.ms_per_token_no_overlap - .ms_cpu - .ms_ssd) | fabs < 1e-9' "$tmp/r50.json")" = true
fi
prev=-1
for b in 25% 50% 75% 95%; do
    check "ram $b" test "$(code "$EXE" plan -m "$tmp/tiny.gguf" --profile "$tmp/p.json" --ram-budget $b --no-calibrate --json)" = 0
    for pol in static online lru; do
        h=$(jq ".ram.compare_vram_ram.$pol" "$tmp/out")
        eval "p_$pol=\${p_$pol:--1}"
        check "ram $b $pol hit rises" awk -v a="$h" -v b="$(eval echo \$p_$pol)" 'BEGIN { exit !(a >= b) }'
        eval "p_$pol=$h"
    done
    h=$(jq .ram.hit_rate "$tmp/out")
    check "ram $b hit rises" awk -v a="$h" -v b="$prev" 'BEGIN { exit !(a > b) }'
    prev=$h
done
check "ram all: plain mmap" test "$(code "$EXE" plan -m "$tmp/tiny.gguf" --profile "$tmp/p.json" --ram-budget 1GiB --no-calibrate --json)" = 0
check "ram all: no SSD reads" test "$(jq '.ram.plain_mmap and .ram.ssd_mib_per_token == 0' "$tmp/out")" = true
# with a VRAM budget: exclusive tiers, one static placement of 16 + 13 units: the top 7 counts of
# every layer and one 9 -> (91 x 4 + 9) / 544 together, less VRAM's 58 / 136.
check "vram + ram" test "$(code "$EXE" plan -m "$tmp/tiny.gguf" --profile "$tmp/p.json" --budget 25% --ram-budget 50% --no-calibrate --json)" = 0
check "vram + ram: vram unchanged" near "$(jq .hit_rate "$tmp/out")" "$(awk 'BEGIN { printf "%.12f", 58 / 136 }')"
check "vram + ram: together 373/544" near "$(jq .ram.hit_rate_vram_ram "$tmp/out")" "$(awk 'BEGIN { printf "%.12f", 373 / 544 }')"
check "vram + ram: ram 141/544" near "$(jq .ram.hit_rate "$tmp/out")" "$(awk 'BEGIN { printf "%.12f", 141 / 544 }')"
check "ram text" test "$(code "$EXE" plan -m "$tmp/tiny.gguf" --profile "$tmp/p.json" --ram-budget 50% --no-calibrate)" = 0
check "ram text: slots" grep -q "13 of 64 units in RAM slots" "$tmp/out"
check "ram text: hit" grep -q "expected RAM hit rate 35.5 %" "$tmp/out"
check "ram text: ssd MiB" grep -q "SSD read per token: " "$tmp/out"
check "ram text: run line" grep -q -- "--ram-budget 4MiB --policy static" "$tmp/out"
check "ram 0 exit 2" test "$(code "$EXE" plan --profile "$tmp/p.json" --ram-budget 0 --unit-bytes 1M)" = 2
check "ram 150% exit 2" test "$(code "$EXE" plan --profile "$tmp/p.json" --ram-budget 150% --unit-bytes 1M)" = 2
check "ram junk exit 2" test "$(code "$EXE" plan --profile "$tmp/p.json" --ram-budget lots --unit-bytes 1M)" = 2
check "ram below a buffer exit 2" test "$(code "$EXE" plan --profile "$tmp/p.json" --ram-budget 1KiB --unit-bytes 1M)" = 2
check "ram below a buffer message" grep -q "staging" "$tmp/err"

# bad input: 2 for usage, 1 for files
check "no budget exit 2" test "$(code "$EXE" plan --profile "$tmp/p.json")" = 2
check "no usage data exit 2" test "$(code "$EXE" plan --budget 1GiB)" = 2
check "bad policy exit 2" test "$(code "$EXE" plan --profile "$tmp/p.json" --budget 10% --unit-bytes 1M --policy fifo)" = 2
check "bad policy message" grep -q "unknown policy 'fifo'" "$tmp/err"
check "no unit size exit 2" test "$(code "$EXE" plan --profile "$tmp/p.json" --budget 10%)" = 2
check "no unit size message" grep -q -- "--unit-bytes" "$tmp/err"
check "missing profile exit 1" test "$(code "$EXE" plan --profile "$tmp/nope.json" --budget 10% --unit-bytes 1M)" = 1
check "missing profile named" grep -q "nope.json" "$tmp/err"
sed 's/"n_expert": 16/"n_expert": 8/' "$tmp/p.json" >"$tmp/bad.json"
check "mismatch exit" test "$(code "$EXE" plan -m "$tmp/tiny.gguf" --profile "$tmp/bad.json" --budget 10%)" != 0
check "bad share exit 2" test "$(code "$EXE" plan --profile "$tmp/p.json" --budget 150% --unit-bytes 1M)" = 2

# several GPUs: --budget 0:8MiB,1:8MiB -ts 1,1 with 1 MiB units -> 8 units a device. llama.cpp's
# split of 4 layers + the output at shares 1,1: layer il to the first device whose cumulative share
# (0.5, 1) is above il / 5 -> layers 0-2 on device 0, layer 3 (and the output) on device 1. Static
# ranks by count, ties to the lower layer: home first, device 0 takes L0-L2's experts 0 and 1 and
# L0's and L1's expert 2 (8), device 1 L3's experts 0-3; with peer units the rest of the global top
# 16 (L2 e2, L0-L2 e3: 4 units) goes to device 1's 4 free slots: the same 16 units as one pool of
# 16 slots, so the same hits on the same routing. Without peer units device 1 takes L3's experts
# 0-7 instead: fewer routed pairs (221 vs 232 of 544 by the profile's counts).
check "plan several GPUs" test "$(code "$EXE" plan --profile "$tmp/p.json" --unit-bytes 1MiB --budget 0:8MiB,1:8MiB \
    -ts 1,1 --json)" = 0
check "gpus: two devices" test "$(jq '.gpus.devices | length' "$j")" = 2
check "gpus: layer split" test "$(jq -c '[.gpus.devices[] | [.layer_begin, .layer_end]]' "$j")" = "[[0,3],[3,4]]"
check "gpus: 8 units each" test "$(jq -c '[.gpus.devices[].units_fit]' "$j")" = "[8,8]"
check "gpus: 4 peer units on device 1" test "$(jq -c '[.gpus.devices[].peer_units]' "$j")" = "[0,4]"
check "gpus: peer = one pool" near "$(jq .gpus.hit_rate "$j")" "$(jq .gpus.hit_rate_one_pool "$j")"
check "gpus: one pool = 16 slots" test "$(jq .units_fit "$j")" = 16
check "gpus: no peer is lower" test "$(jq '.gpus.hit_rate_no_peer < .gpus.hit_rate' "$j")" = true
check "plan several GPUs text" test "$(code "$EXE" plan --profile "$tmp/p.json" --unit-bytes 1MiB --budget 0:8MiB,1:8MiB \
    -ts 1,1)" = 0
check "text names gpu 1" grep -q "gpu 1: layers 3-3" "$tmp/out"
check "text run line" grep -q -- "--vram-budget 0:8MiB,1:8MiB -ts 1,1" "$tmp/out"
check "-ts needs per-device budgets" test "$(code "$EXE" plan --profile "$tmp/p.json" --unit-bytes 1MiB --budget 8MiB \
    -ts 1,1)" = 2
# a device that -ts gives no layers takes no slots (as the engine, which warns): one pool of 8
check "-ts 1,0: device 1 idle" test "$(code "$EXE" plan --profile "$tmp/p.json" --unit-bytes 1MiB \
    --budget 0:8MiB,1:8MiB -ts 1,0 --json)" = 0
check "-ts 1,0: units 8 and 0" test "$(jq -c '[.gpus.devices[].units_fit]' "$j")" = "[8,0]"
check "-ts 1,0: all layers on device 0" test "$(jq -c '[.gpus.devices[] | [.layer_begin, .layer_end]]' "$j")" = \
    "[[0,4],[4,4]]"
check "per-device auto refused" test "$(code "$EXE" plan --profile "$tmp/p.json" --unit-bytes 1MiB \
    --budget 0:auto,1:8MiB)" != 0
check "per-device auto message" grep -q "auto needs the device" "$tmp/err"
exit $fail
