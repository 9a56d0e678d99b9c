#!/usr/bin/env bash
# gpu_offload.sh - hot experts in VRAM (hotmoe) vs layers of experts on the CPU (llama.cpp's
# -ngl 99 --n-cpu-moe N), at the same VRAM budgets for expert weights, on one model, one run.
#
#   LLAMA_CPP_DIR=/path/to/llama.cpp/build/bin bench/gpu_offload.sh MODEL.gguf PROFILE.json \
#       [THREADS] [BUDGETS_GIB] [LONG_DEPTH]
#
# For each budget B (GiB of expert weights in VRAM; default "4 8 12"):
#   hotmoe bench --vram-budget B with --policy static (--profile PROFILE), online and lru (no
#   profile: they learn during the run; the tg figure is measured after pp and a 16-token warm-up;
#   POLICIES="static online" picks a subset; static-mlock is static with --mlock: the experts
#   locked in RAM and copied to VRAM without a staging memcpy);
#   llama-bench -ngl 99 --n-cpu-moe N with N = the layers whose experts do not fit in B
#   (n_layer - floor(B / expert bytes per layer)), and hotmoe with that same layer placement.
# Both engines run pp512 and tg128 after a 512-token context (llama-bench -d 512 semantics), with
# the same threads and repetitions. Then both extremes (every expert in VRAM; every expert on the
# CPU) and, when LONG_DEPTH > 0 (default 32768), tg32 after LONG_DEPTH tokens at the largest
# budget. Prints one markdown table with the ratio hotmoe / llama.cpp, then the roofline of the
# decode: bytes per token from VRAM and from RAM (from the measured hit rate and the unit sizes)
# over the time per token. The RAM tier's bandwidth is RAM_GBS when set; else it is measured once,
# just before the roofline, by bench_cpu_ops -membw -t THREADS (HM_BENCH_CPU_OPS, else the
# bench_cpu_ops beside hotmoe); with neither the RAM time is left out. The VRAM tier's is HBM_GBS
# when set; else it is measured at the same point by bench_cuda_decode -hbm (HM_BENCH_CUDA_DECODE,
# else the bench_cuda_decode beside hotmoe; device 0 of the CUDA_VISIBLE_DEVICES this script runs
# with): its device-to-device copies' read + write traffic (reads and writes share the bandwidth
# a decode's weight reads use alone); when that cannot be measured, the
# nominal H200 figure 4300 GB/s, labelled as such. The roofline line says where each figure came
# from. Without LLAMA_CPP_DIR only hotmoe's columns are filled.
# A benchmark: it prints numbers, it asserts nothing.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
exe="${HM_EXE:-$root/build/hotmoe}"
model=${1:?MODEL.gguf}
profile=${2:?PROFILE.json (a usage profile of MODEL: hotmoe or seed-1 format)}
th=${3:-16}
budgets=${4:-"4 8 12"}
long=${5:-32768}
reps=${REPS:-3}
llama=${LLAMA_CPP_DIR:-}
[ -x "$exe" ] || { echo "build hotmoe with CUDA first: $exe missing" >&2; exit 1; }
if [ -n "$llama" ] && [ ! -x "$llama/llama-bench" ]; then echo "no llama-bench in $llama" >&2; exit 1; fi

info=$("$exe" inspect --json "$model") || { echo "cannot inspect $model" >&2; exit 1; }
read -r n_layer expert_bytes dense_bytes unit_bytes < <(python3 -c '
import json, sys
j = json.loads(sys.argv[1])
print(j["n_layer"], j["expert_bytes"], j["dense_bytes"], j["unit_bytes"])' "$info")
echo "model $model: $n_layer layers, experts $(python3 -c "print(f'{$expert_bytes/2**30:.2f}')") GiB, dense $(python3 -c "print(f'{$dense_bytes/2**30:.2f}')") GiB; threads $th, $reps repetitions"
echo

. "$root/bench/bench_lib.sh" # hm, lb, ratio

per_layer=$((expert_bytes / n_layer))
echo "| VRAM for experts | engine / placement | pp512 t/s | tg128 t/s | VRAM hit rate (tg) | pp vs llama.cpp | tg vs llama.cpp |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
declare -A ROOF
for b in $budgets; do
    bytes=$(python3 -c "print(int($b * 2**30))")
    fit=$((bytes / per_layer))
    [ $fit -gt $n_layer ] && fit=$n_layer
    ncmoe=$((n_layer - fit))
    read -r lpp ltg < <(lb -ngl 99 -ncmoe $ncmoe -p 512 -n 128 -d 512)
    echo "| $b GiB | llama.cpp -ngl 99 --n-cpu-moe $ncmoe | $lpp | $ltg | - | | |"
    read -r pp tg hit < <(hm -ngl 99 --n-cpu-moe $ncmoe -p 512 -n 128 -d 512)
    echo "| $b GiB | hotmoe --n-cpu-moe $ncmoe (llama.cpp's placement) | $pp | $tg | $hit % | $(ratio "$pp" "$lpp") | $(ratio "$tg" "$ltg") |"
    for pol in ${POLICIES:-static online lru}; do
        args=(--vram-budget "${b}GiB" --policy ${pol%-mlock} -p 512 -n 128 -d 512)
        [ ${pol%-mlock} = static ] && args+=(--profile "$profile")
        [ $pol != ${pol%-mlock} ] && args+=(--mlock)
        read -r pp tg hit < <(hm -ngl 99 "${args[@]}")
        echo "| $b GiB | hotmoe ${pol/-mlock/ --mlock} | $pp | $tg | $hit % | $(ratio "$pp" "$lpp") | $(ratio "$tg" "$ltg") |"
        [ $pol = static ] && ROOF[$b]="$tg $hit"
    done
done
read -r lpp ltg < <(lb -ngl 99 -p 512 -n 128 -d 512)
read -r pp tg hit < <(hm -ngl 99 -p 512 -n 128 -d 512)
echo "| all | llama.cpp -ngl 99 | $lpp | $ltg | - | | |"
echo "| all | hotmoe -ngl 99 | $pp | $tg | $hit % | $(ratio "$pp" "$lpp") | $(ratio "$tg" "$ltg") |"
read -r lpp ltg < <(lb -ngl 99 -ncmoe $n_layer -p 512 -n 128 -d 512)
read -r pp tg hit < <(hm -ngl 99 --cpu-moe -p 512 -n 128 -d 512)
echo "| none | llama.cpp -ngl 99 --cpu-moe | $lpp | $ltg | - | | |"
echo "| none | hotmoe -ngl 99 --cpu-moe | $pp | $tg | $hit % | $(ratio "$pp" "$lpp") | $(ratio "$tg" "$ltg") |"

if [ "$long" -gt 0 ]; then
    b=${budgets##* }
    bytes=$(python3 -c "print(int($b * 2**30))")
    fit=$((bytes / per_layer)); [ $fit -gt $n_layer ] && fit=$n_layer
    echo
    echo "tg32 after $long tokens of context, $b GiB of experts in VRAM (1 repetition):"
    read -r lpp ltg < <(lb -ngl 99 -ncmoe $((n_layer - fit)) -p 0 -n 32 -d "$long" -r 1)
    read -r pp tg hit < <(hm -ngl 99 --vram-budget "${b}GiB" --profile "$profile" -p 0 -n 32 -d "$long" -r 1)
    echo "| context | llama.cpp tg32 | hotmoe static tg32 | hit rate | ratio |"
    echo "| ---: | ---: | ---: | ---: | ---: |"
    echo "| $long | $ltg | $tg | $hit % | $(ratio "$tg" "$ltg") |"
fi

# the RAM tier's bandwidth: RAM_GBS, else bench_cpu_ops -membw with the run's threads
echo
if [ -n "${RAM_GBS:-}" ]; then
    ram_src="RAM_GBS from the environment"; ram_from="from RAM_GBS"
else
    membw_exe="${HM_BENCH_CPU_OPS:-$(dirname "$exe")/bench_cpu_ops}"
    ram_from="unmeasured"
    if [ -x "$membw_exe" ]; then
        membw_line=$("$membw_exe" -membw -t "$th" 2>&1 | tail -1)
        RAM_GBS=$(sed -n 's|^ram read bandwidth: \([0-9.]*\) GB/s .*|\1|p' <<<"$membw_line")
        if [ -n "$RAM_GBS" ]; then
            ram_src="measured now: $membw_exe -membw -t $th: $membw_line"; ram_from="measured"
        else
            ram_src="unmeasured: $membw_exe -membw -t $th said: ${membw_line:-nothing}"
        fi
    else
        ram_src="unmeasured: no bench_cpu_ops at $membw_exe (build it, or set HM_BENCH_CPU_OPS or RAM_GBS)"
    fi
fi
echo "RAM bandwidth: ${RAM_GBS:-unmeasured} GB/s ($ram_src)"

# the VRAM tier's bandwidth: HBM_GBS, else bench_cuda_decode -hbm (the read + write traffic of its
# device-to-device copies: the bandwidth a read-only stream can use), else the nominal H200 figure
if [ -n "${HBM_GBS:-}" ]; then
    hbm_src="HBM_GBS from the environment"; hbm_from="from HBM_GBS"
else
    hbm_exe="${HM_BENCH_CUDA_DECODE:-$(dirname "$exe")/bench_cuda_decode}"
    hbm_dev="${CUDA_VISIBLE_DEVICES+, CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES}"
    hbm_from="nominal H200 figure, unmeasured"
    if [ -x "$hbm_exe" ]; then
        hbm_line=$("$hbm_exe" -hbm 2>&1 | tail -1)
        HBM_GBS=$(sed -n 's|^hbm bandwidth: \([0-9.]*\) GB/s .*|\1|p' <<<"$hbm_line")
        if [ -n "$HBM_GBS" ]; then
            hbm_src="measured now: $hbm_exe -hbm$hbm_dev: $hbm_line"; hbm_from="measured"
        else
            hbm_src="nominal H200 figure, unmeasured: $hbm_exe -hbm$hbm_dev said: ${hbm_line:-nothing}"
        fi
    else
        hbm_src="nominal H200 figure, unmeasured: no bench_cuda_decode at $hbm_exe (build it, or set HM_BENCH_CUDA_DECODE or HBM_GBS)"
    fi
    HBM_GBS=${HBM_GBS:-4300}
fi
echo "HBM bandwidth: $HBM_GBS GB/s ($hbm_src)"

# roofline of the static decode: per token, dense bytes + hits x unit from VRAM, misses x unit from RAM
echo "Decode roofline (static): bytes a token reads from each tier, and the time that takes at the"
echo "tiers' bandwidth (HBM $HBM_GBS GB/s, $hbm_from; RAM ${RAM_GBS:+$RAM_GBS GB/s, }$ram_from;"
echo "HBM_GBS / RAM_GBS override them)"
k=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1]).get("n_expert_used", 8))' "$info")
for b in $budgets; do
    set -- ${ROOF[$b]:-- -} # two words: tg and hit rate, "-" when no static run
    python3 - "$b" "$1" "$2" "$n_layer" "$k" "$unit_bytes" "$dense_bytes" "$HBM_GBS" "${RAM_GBS:-0}" <<'PY'
import sys
b, tg, hit, L, k, unit, dense, hbm, ram = sys.argv[1:10]
if tg == "-" or hit == "-":
    print(f"  {b} GiB: no measurement"); sys.exit()
tg, hit, L, k, unit, dense, hbm, ram = float(tg), float(hit) / 100, int(L), int(k), int(unit), int(dense), float(hbm), float(ram)
routed = L * k * unit                    # expert bytes a token routes to
vram_b = dense + hit * routed             # an upper bound for dense (embeddings are read by row)
ram_b = (1 - hit) * routed
t = 1 / tg
line = f"  {b} GiB: {vram_b / 2**20:.0f} MiB from VRAM, {ram_b / 2**20:.0f} MiB from RAM per token; {t * 1e3:.2f} ms a token"
line += f"; HBM time {vram_b / (hbm * 1e9) * 1e3:.2f} ms"
if ram > 0:
    tr = ram_b / (ram * 1e9)
    line += f", RAM time {tr * 1e3:.2f} ms: the RAM tier bounds decode at {1 / max(tr, 1e-9):.0f} t/s, we reach {100 * tr / t:.0f} % of it"
print(line)
PY
done
