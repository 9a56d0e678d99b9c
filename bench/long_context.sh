#!/usr/bin/env bash
# long_context.sh - long prompts: hotmoe with flash attention (-fa on), hotmoe with the exact
# attention kernels (-fa off, what ran before the flash kernel) and llama.cpp (llama-bench -fa 1)
# side by side, on one model, one run.
#
#   LLAMA_CPP_DIR=/path/to/llama.cpp/build/bin bench/long_context.sh MODEL.gguf PROFILE.json \
#       [THREADS] [UBATCH]
#
# Rows (issue 19's benchmark): every expert in VRAM (-ngl 99): pp4096, pp16384, pp512 after a
# 16384-token context and pp65536 (-fa off skipped there unless FULL=1: it takes minutes);
# 12 GiB of experts in VRAM (--vram-budget 12GiB --profile PROFILE; llama.cpp with the
# --n-cpu-moe N that fits the same bytes): pp16384 and tg32 after a 32768-token context;
# 4 GiB: pp16384. UBATCH (default 512) is hotmoe's -ub and llama-bench's -ub (and -b).
# OFF=0 leaves the -fa off column out. Without LLAMA_CPP_DIR the llama.cpp column is "-". A benchmark: it prints numbers, it asserts
# nothing.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
exe="${HM_EXE:-$root/build/hotmoe}"
model=${1:?MODEL.gguf}
profile=${2:?PROFILE.json (a usage profile of MODEL)}
th=${3:-16}
ub=${4:-512}
reps=${REPS:-2}
llama=${LLAMA_CPP_DIR:-}
[ -x "$exe" ] || { echo "build hotmoe with CUDA first: $exe missing" >&2; exit 1; }
if [ -n "$llama" ] && [ ! -x "$llama/llama-bench" ]; then echo "no llama-bench in $llama" >&2; exit 1; fi

info=$("$exe" inspect --json "$model") || { echo "cannot inspect $model" >&2; exit 1; }
read -r n_layer expert_bytes < <(python3 -c '
import json, sys
j = json.loads(sys.argv[1])
print(j["n_layer"], j["expert_bytes"])' "$info")
per_layer=$((expert_bytes / n_layer))
ncmoe_for() { # GiB -> llama.cpp's --n-cpu-moe for the same expert bytes in VRAM
    local fit=$(( $(python3 -c "print(int($1 * 2**30))") / per_layer ))
    [ $fit -gt $n_layer ] && fit=$n_layer
    echo $((n_layer - fit))
}

. "$root/bench/bench_lib.sh" # hm, lb, ratio

echo "model $model: $n_layer layers; threads $th, -ub $ub, $reps repetitions"
echo
echo "| experts in VRAM | test | hotmoe -fa on t/s | hotmoe -fa off t/s | llama.cpp -fa 1 t/s | on / off | on / llama.cpp |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
# row PLACEMENT-LABEL TEST-LABEL "HOTMOE-ARGS" "LLAMA-ARGS" pp|tg SKIP-OFF
row() {
    local label=$1 test=$2 hargs=$3 largs=$4 col=$5 skip_off=$6 on off ll a b c
    read -r a b c < <(hm $hargs -fa on -ub "$ub")
    [ "$col" = pp ] && on=$a || on=$b
    off="-"
    if [ "${OFF:-1}" = 1 ] && { [ "$skip_off" = 0 ] || [ "${FULL:-0}" = 1 ]; }; then
        read -r a b c < <(hm $hargs -fa off -ub "$ub")
        [ "$col" = pp ] && off=$a || off=$b
    fi
    read -r a b < <(lb $largs -fa 1 -ub "$ub" -b "$ub")
    [ "$col" = pp ] && ll=$a || ll=$b
    echo "| $label | $test | $on | $off | $ll | $(ratio "$on" "$off") | $(ratio "$on" "$ll") |"
}
n12=$(ncmoe_for 12)
n4=$(ncmoe_for 4)
row all pp4096 "-ngl 99 -p 4096 -n 0" "-ngl 99 -p 4096 -n 0" pp 0
row all pp16384 "-ngl 99 -p 16384 -n 0" "-ngl 99 -p 16384 -n 0" pp 0
row all "pp512 @ d16384" "-ngl 99 -p 512 -n 0 -d 16384" "-ngl 99 -p 512 -n 0 -d 16384" pp 0
row all pp65536 "-ngl 99 -p 65536 -n 0 -r 1" "-ngl 99 -p 65536 -n 0 -r 1" pp 1
row "12 GiB" pp16384 "--vram-budget 12GiB --profile $profile -p 16384 -n 0" "-ngl 99 -ncmoe $n12 -p 16384 -n 0" pp 0
row "12 GiB" "tg32 @ d32768" "--vram-budget 12GiB --profile $profile -p 0 -n 32 -d 32768 -r 1" \
    "-ngl 99 -ncmoe $n12 -p 0 -n 32 -d 32768 -r 1" tg 1
row "4 GiB" pp16384 "--vram-budget 4GiB --profile $profile -p 16384 -n 0" "-ngl 99 -ncmoe $n4 -p 16384 -n 0" pp 0
