#!/usr/bin/env bash
# multi_gpu.sh - one model on one GPU vs split over two (issue 11), hotmoe vs llama.cpp, one run.
#
#   LLAMA_CPP_DIR=/path/to/llama.cpp/build/bin bench/multi_gpu.sh MODEL.gguf PROFILE.json \
#       [THREADS] [TOTAL_GIB]
#
# T = TOTAL_GIB (default 12) GiB of expert weights in VRAM in all, N = the layers whose experts do
# not fit in T (n_layer - floor(T / expert bytes per layer)), as bench/gpu_offload.sh:
#   one GPU (CUDA_VISIBLE_DEVICES=0): llama-bench -ngl 99 --n-cpu-moe N; hotmoe --vram-budget T
#     static (--profile PROFILE);
#   two GPUs, the same total: llama-bench -ngl 99 -ts 1,1 --n-cpu-moe N; hotmoe -ts 1,1
#     --vram-budget 0:T/2,1:T/2 static, the same with --no-peer-experts (each device's slots only
#     for its own layers' units), and hotmoe -ts 1,1 --n-cpu-moe N (llama.cpp's placement);
#   two GPUs, twice the total: the same with 2T (N from 2T; hotmoe 0:T,1:T).
# pp512 and tg128 after a 512-token context, same threads and repetitions (REPS, default 3) for
# both engines. Prints one markdown table with the ratios hotmoe / llama.cpp and 2 GPUs / 1 GPU.
# Without LLAMA_CPP_DIR only hotmoe's columns are filled. A benchmark: it asserts nothing.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
exe="${HM_EXE:-$root/build/hotmoe}"
model=${1:?MODEL.gguf}
profile=${2:?PROFILE.json (a usage profile of MODEL: hotmoe or seed-1 format)}
th=${3:-16}
total=${4:-12}
reps=${REPS:-3}
llama=${LLAMA_CPP_DIR:-}
[ -x "$exe" ] || { echo "build hotmoe with CUDA first: $exe missing" >&2; exit 1; }
if [ -n "$llama" ] && [ ! -x "$llama/llama-bench" ]; then echo "no llama-bench in $llama" >&2; exit 1; fi
. "$root/bench/bench_lib.sh" # hm, lb, ratio

info=$("$exe" inspect --json "$model") || { echo "cannot inspect $model" >&2; exit 1; }
read -r n_layer expert_bytes < <(python3 -c '
import json, sys
j = json.loads(sys.argv[1])
print(j["n_layer"], j["expert_bytes"])' "$info")
per_layer=$((expert_bytes / n_layer))
echo "model $model: $n_layer layers, experts $(python3 -c "print(f'{$expert_bytes/2**30:.2f}')") GiB; threads $th, $reps repetitions; pp512 and tg128 after 512 tokens"
echo
ncmoe_for() { # GiB -> N
    local fit=$(( $(python3 -c "print(int($1 * 2**30))") / per_layer ))
    [ $fit -gt $n_layer ] && fit=$n_layer
    echo $((n_layer - fit))
}
run=(-p 512 -n 128 -d 512)
echo "| experts in VRAM | GPUs | engine / placement | pp512 t/s | tg128 t/s | VRAM hit rate (tg) | pp vs llama.cpp | tg vs llama.cpp | tg vs 1 GPU |"
echo "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
N=$(ncmoe_for "$total")
read -r l1pp l1tg < <(CUDA_VISIBLE_DEVICES=0 lb -ngl 99 -ncmoe $N "${run[@]}")
read -r h1pp h1tg h1hit < <(CUDA_VISIBLE_DEVICES=0 hm -ngl 99 --vram-budget "${total}GiB" --profile "$profile" "${run[@]}")
echo "| $total GiB | 1 | llama.cpp -ngl 99 --n-cpu-moe $N | $l1pp | $l1tg | - | | | |"
echo "| $total GiB | 1 | hotmoe static --vram-budget ${total}GiB | $h1pp | $h1tg | $h1hit % | $(ratio "$h1pp" "$l1pp") | $(ratio "$h1tg" "$l1tg") | |"
for mult in 1 2; do
    t=$(python3 -c "print(f'{$total * $mult:g}')")
    half=$(python3 -c "print(f'{$total * $mult / 2:g}')")
    N=$(ncmoe_for "$t")
    read -r lpp ltg < <(lb -ngl 99 -ts 1,1 -ncmoe $N "${run[@]}")
    echo "| $t GiB | 2 | llama.cpp -ngl 99 -ts 1,1 --n-cpu-moe $N | $lpp | $ltg | - | | | $(ratio "$ltg" "$l1tg") |"
    read -r pp tg hit < <(hm -ngl 99 -ts 1,1 --vram-budget "0:${half}GiB,1:${half}GiB" --profile "$profile" "${run[@]}")
    echo "| $t GiB | 2 | hotmoe static -ts 1,1 --vram-budget 0:${half}GiB,1:${half}GiB | $pp | $tg | $hit % | $(ratio "$pp" "$lpp") | $(ratio "$tg" "$ltg") | $(ratio "$tg" "$h1tg") |"
    if [ $mult = 1 ]; then
        read -r pp tg hit < <(hm -ngl 99 -ts 1,1 --vram-budget "0:${half}GiB,1:${half}GiB" --no-peer-experts --profile "$profile" "${run[@]}")
        echo "| $t GiB | 2 | hotmoe static -ts 1,1 --vram-budget 0:${half}GiB,1:${half}GiB --no-peer-experts | $pp | $tg | $hit % | $(ratio "$pp" "$lpp") | $(ratio "$tg" "$ltg") | $(ratio "$tg" "$h1tg") |"
    fi
    read -r pp tg hit < <(hm -ngl 99 -ts 1,1 --n-cpu-moe $N "${run[@]}")
    echo "| $t GiB | 2 | hotmoe -ts 1,1 --n-cpu-moe $N (llama.cpp's placement) | $pp | $tg | $hit % | $(ratio "$pp" "$lpp") | $(ratio "$tg" "$ltg") | $(ratio "$tg" "$h1tg") |"
done
