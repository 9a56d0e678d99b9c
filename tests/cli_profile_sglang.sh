#!/usr/bin/env bash
# cli_profile_sglang.sh - profiles that travel, as a user types it: the seed-1 profile (Qwen3.6-35B-A3B,
# 40 layers x 256 experts) exported to SGLang's logical_count and read back with the same counts;
# a SGLang file placing a tiny model as its hotmoe twin does (plan's static hit rate 58/136, derived
# in cli_plan.sh); `plan --ep` on the seed profile, its contiguous split checked against the same
# imbalance computed here with jq; .pt files and bad flags refused with a message.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
hm_need jq
hm_tmpdir sglang
SEED=$SRC/tests/data/seed1_profile_qwen36_coding.json # a copy of shared/data/seed-profiles/qwen36-35b-a3b-coding.perf.json
near() { awk -v a="$1" -v b="$2" -v t="${3:-1e-9}" 'BEGIN { d = a - b; exit !(d < t && d > -t) }'; }

# ---- export and back ----
if [ -f "$SEED" ]; then
    check "export sglang" test "$(code "$EXE" profile -i "$SEED" --export sglang -o "$tmp/s.json")" = 0
    check "40 rows x 256" test "$(jq -c '[(.logical_count | length), (.logical_count | map(length) | unique)]' "$tmp/s.json")" = '[40,[256]]'
    check "rows = seed counts (hot + cold)" test "$(jq -c '.logical_count' "$tmp/s.json")" = \
        "$(jq -c '[.layers | sort_by(.layer)[] | [range(256)] as $e | (((.hot_experts // []) + (.cold_experts // [])) | group_by(.[0]) | map({key: (.[0][0] | tostring), value: (map(.[1]) | add)}) | from_entries) as $m | $e | map($m[tostring] // 0)]' "$SEED")"
    check "back to hotmoe" test "$(code "$EXE" profile --profile "$tmp/s.json" --export hotmoe -o "$tmp/h.json")" = 0
    check "seed to hotmoe" test "$(code "$EXE" profile -i "$SEED" --export hotmoe -o "$tmp/h0.json")" = 0
    check "identical counts" test "$(jq -c '[.layers[].counts]' "$tmp/h.json")" = "$(jq -c '[.layers[].counts]' "$tmp/h0.json")"
    check "k and tokens kept" test "$(jq -c '[.k, .tokens]' "$tmp/h.json")" = "$(jq -c '[.k, .tokens]' "$tmp/h0.json")"

    # ---- plan --ep 8: 32 experts per device; contiguous = experts 32d..32d+31 ----
    check "plan --ep 8 --json" test "$(code "$EXE" plan --profile "$tmp/s.json" --ep 8 --json)" = 0
    cp "$tmp/out" "$tmp/ep.json"
    want=$(jq '[.logical_count[] | [range(8) as $d | .[32*$d:32*$d+32] | add] as $l | ($l | max) / (($l | add) / 8)] | add / length' "$tmp/s.json")
    got=$(jq .contiguous.mean_imbalance "$tmp/ep.json")
    check "contiguous imbalance $got = jq's $want" near "$got" "$want" 1e-9
    check "eplb: 8 replicas, 33 slots" test "$(jq -c '[.eplb.replicas, .eplb.slots_per_device]' "$tmp/ep.json")" = '[8,33]'
    check "every placement carries each layer's load" test "$(jq --slurpfile s "$tmp/s.json" '[$s[0].logical_count[] | add] as $t | [.contiguous, .balanced, .eplb | [.layer_device_load[] | add] as $g | [range($t | length)] | all($g[.] - $t[.] | fabs < 1e-6)] | all' "$tmp/ep.json")" = true
    check "eplb beats contiguous" test "$(jq '.eplb.mean_imbalance >= 1 and .eplb.mean_imbalance < .contiguous.mean_imbalance and .balanced.mean_imbalance < .contiguous.mean_imbalance' "$tmp/ep.json")" = true
    echo "seed profile, --ep 8: contiguous $(jq .contiguous.mean_imbalance "$tmp/ep.json"), balanced $(jq .balanced.mean_imbalance "$tmp/ep.json"), eplb $(jq .eplb.mean_imbalance "$tmp/ep.json")"
    # the file as SGLang's loader takes it (tools/check_sglang_expert_location.py; the tensor steps
    # and the comparison with plan's loads need torch, without it the shape checks only)
    if command -v python3 >/dev/null; then
        check "SGLang loader check" python3 "$SRC/tools/check_sglang_expert_location.py" "$tmp/s.json" --num-layers 40 \
            --num-experts 256 --ep-size 8 --redundant 8 --hotmoe-plan "$tmp/ep.json"
        check "loader check: 48 layers is not this file" test "$(code python3 "$SRC/tools/check_sglang_expert_location.py" \
            "$tmp/s.json" --num-layers 48 --num-experts 256)" = 1
    fi
    check "plan --ep text" test "$(code "$EXE" plan --profile "$SEED" --ep 32)" = 0
    check "text names the SGLang flags" grep -q -- "--ep-num-redundant-experts 32" "$tmp/out"
    check "--ep 3 --ep-redundant 0 refused (256 % 3)" test "$(code "$EXE" plan --profile "$SEED" --ep 3 --ep-redundant 0)" = 2
    check "says why" grep -q "split evenly" "$tmp/err"
else
    echo "seed profile not found: its checks skipped"
fi

# ---- a SGLang file places a tiny model as its hotmoe twin (cli_plan.sh: 4 x 16, expert e routed 16 - e times) ----
check "synth tiny" test "$(code "$EXE" synth --preset tiny --type q4_k_m --seed 1 -q -o "$tmp/tiny.gguf")" = 0
row=$(seq 16 -1 1 | paste -sd, -)
printf '{"logical_count": [[%s],[%s],[%s],[%s]]}\n' "$row" "$row" "$row" "$row" >"$tmp/tiny_sg.json"
check "plan with a SGLang profile" test "$(code "$EXE" plan -m "$tmp/tiny.gguf" --profile "$tmp/tiny_sg.json" --budget 25% --no-calibrate --json)" = 0
check "static hit 58/136" near "$(jq .hit_rate "$tmp/out")" "$(awk 'BEGIN { printf "%.12f", 58 / 136 }')"
check "profile -i -m checks the shape" test "$(code "$EXE" profile -i "$tmp/tiny_sg.json" -m "$tmp/tiny.gguf" --export hotmoe -o "$tmp/t.json")" = 0
printf '{"logical_count": [[%s],[%s],[%s]]}\n' "$row" "$row" "$row" >"$tmp/tiny3.json"
check "3 rows for a 4-layer model refused" test "$(code "$EXE" profile -i "$tmp/tiny3.json" -m "$tmp/tiny.gguf" --export hotmoe -o "$tmp/t3.json")" = 1
check "names num_hidden_layers" grep -q "num_hidden_layers" "$tmp/err"
check "nothing written" test ! -e "$tmp/t3.json"

# ---- refused with a message ----
printf 'PK\003\004\024\000\000\000archive/data.pkl' >"$tmp/rec.pt"
check ".pt refused" test "$(code "$EXE" plan --profile "$tmp/rec.pt" --ep 2)" = 1
check ".pt: how to convert" grep -q "tools/sglang_pt_to_json.py" "$tmp/err"
check "--ep 0" test "$(code "$EXE" plan --profile "$tmp/tiny_sg.json" --ep 0)" = 2
check "--ep-redundant alone" test "$(code "$EXE" plan --profile "$tmp/tiny_sg.json" --ep-redundant 2)" = 2
check "--ep with a budget and --json" test "$(code "$EXE" plan --profile "$tmp/tiny_sg.json" --ep 2 --budget 25% --json)" = 2
check "--export bogus" test "$(code "$EXE" profile -i "$tmp/tiny_sg.json" --export pickle -o "$tmp/x.json")" = 2
check "-i and -f" test "$(code "$EXE" profile -i "$tmp/tiny_sg.json" -f "$tmp/tiny_sg.json" -o "$tmp/x.json")" = 2
exit $fail
