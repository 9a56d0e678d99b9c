#!/usr/bin/env bash
# seed1_compare.sh - hotmoe vs llama.cpp (-ngl 99 --n-cpu-moe N) vs the seed-1 fork
# (adrianhoehne/llama.cpp cached-experts-v2: -ngl 99 --cpu-moe --moe-hot-cache PROFILE
# --moe-hot-cache-max-mib MIB) at one VRAM budget for expert weights, on one model (issues 9, 10).
#
#   bench/seed1_compare.sh --hotmoe BIN --llama-bench PATH --seed1-bench PATH --model GGUF \
#       --profile FILE [--budget-gib 12] [--threads 16] [--reps 3] [-p 512] [-n 128] [-d 512]
#       [--hit-gen 32] [--seed1-args "ARGS"] [--log-dir DIR] [--json-out FILE] [--hotmoe-ncmoe] [--cpu]
#
# Conventions of bench/gpu_offload.sh: pp = one batch of -p tokens and tg = -n decodes, both after
# -d tokens of context (llama-bench -d semantics), same threads and repetitions for every engine;
# N = the layers whose experts do not fit in the budget (n_layer - floor(budget / expert bytes per
# layer)). PROFILE is the usage profile both hot caches are placed from (seed-1 v1 or hotmoe's
# format for hotmoe; the fork reads only llama.cpp.moe_layer_perf.v1 / moe_layer_opt_perf.v1,
# e.g. `hotmoe profile --format seed1`).
# Hit rates: hotmoe's tg_vram_hit_rate (routed units computed from VRAM during the tg runs);
# llama.cpp's is (n_layer - N) / n_layer (every layer routes k units per token); the fork's is
# summary.hot_slot_ratio of its --moe-layer-perf-out JSON, from two extra runs with -r 1 (pp -p
# tokens; tg --hit-gen tokens), because that collection syncs at every MoE layer and would slow
# the timed runs. --seed1-args: more flags for the fork's hot-cache runs (default: its README's
# one-GPU setting "--moe-hot-cache-pp-reduce-merge on"; llama-bench's own default is off).
# A path given as "-" skips that engine. --hotmoe-ncmoe adds hotmoe with llama.cpp's layer
# placement. --cpu checks the plumbing on a machine without a GPU: hotmoe runs
# without -ngl/--vram-budget, the fork without a hot-cache budget (one probe run with it shows
# that the fork parsed the profile before asking for a GPU), llama.cpp with the same flags.
# A benchmark: it prints numbers, it asserts nothing. Needs python3.
set -uo pipefail

hm=""; lb=""; sb=""; model=""; profile=""; budget=12; th=16; reps=3; pp=512; tg=128; depth=512
hitgen=32; s1args="--moe-hot-cache-pp-reduce-merge on"; logdir=""; jsonout=""; hmncmoe=0; cpu=0
usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        --hotmoe) hm=${2:?}; shift ;;
        --llama-bench) lb=${2:?}; shift ;;
        --seed1-bench) sb=${2:?}; shift ;;
        --model) model=${2:?}; shift ;;
        --profile) profile=${2:?}; shift ;;
        --budget-gib) budget=${2:?}; shift ;;
        --threads) th=${2:?}; shift ;;
        --reps) reps=${2:?}; shift ;;
        -p) pp=${2:?}; shift ;;
        -n) tg=${2:?}; shift ;;
        -d) depth=${2:?}; shift ;;
        --hit-gen) hitgen=${2:?}; shift ;;
        --seed1-args) s1args=$2; shift ;;
        --log-dir) logdir=${2:?}; shift ;;
        --json-out) jsonout=${2:?}; shift ;;
        --hotmoe-ncmoe) hmncmoe=1 ;;
        --cpu) cpu=1 ;;
        -h|--help) usage ;;
        *) echo "seed1_compare: unknown option $1" >&2; usage ;;
    esac
    shift
done
[ -n "$hm" ] && [ -n "$lb" ] && [ -n "$sb" ] && [ -n "$model" ] && [ -n "$profile" ] || usage
[ -f "$model" ] || { echo "seed1_compare: no model $model" >&2; exit 1; }
[ -f "$profile" ] || { echo "seed1_compare: no profile $profile" >&2; exit 1; }
for b in "$hm" "$lb" "$sb"; do
    [ "$b" = - ] || [ -x "$b" ] || { echo "seed1_compare: $b is not executable" >&2; exit 1; }
done
[ "$hm" != - ] || { echo "seed1_compare: --hotmoe is needed (it sizes the model)" >&2; exit 1; }
[ -n "$logdir" ] || logdir=$(mktemp -d /tmp/seed1_compare.XXXXXX)
mkdir -p "$logdir"
tmo=${RUN_TIMEOUT:-300}   # seconds per engine run

info=$("$hm" inspect --json "$model") || { echo "seed1_compare: cannot inspect $model" >&2; exit 1; }
read -r arch n_layer expert_bytes dense_bytes < <(python3 -c '
import json, sys
j = json.loads(sys.argv[1])
print(j["arch"], j["n_layer"], j["expert_bytes"], j["dense_bytes"])' "$info")
per_layer=$((expert_bytes / n_layer))
bytes=$(python3 -c "print(int($budget * 2**30))")
mib=$(python3 -c "print(int($budget * 1024))")
fit=$((bytes / per_layer)); [ $fit -gt $n_layer ] && fit=$n_layer
ncmoe=$((n_layer - fit))
gib() { python3 -c "print(f'{$1/2**30:.2f}')"; }
echo "model $(basename "$model"): $arch, $n_layer layers, experts $(gib $expert_bytes) GiB, dense $(gib $dense_bytes) GiB"
echo "budget $budget GiB of expert weights in VRAM ($mib MiB; llama.cpp --n-cpu-moe $ncmoe = $fit layers of experts on the GPU)"
echo "profile $profile; threads $th, $reps repetitions, pp$pp and tg$tg after $depth tokens; logs in $logdir"
[ $cpu = 1 ] && echo "--cpu: plumbing check, no GPU flags for hotmoe and no hot-cache budget for the fork"
echo

# hotmoe bench -> "pp tg hit note"; retries at -d 0 when the depth cannot be set up (note d0)
hm_run() {
    local tag=$1; shift
    local args=(bench -m "$model" -t "$th" -r "$reps" -p "$pp" -n "$tg" --json "$@")
    local d=$depth note=""
    timeout "$tmo" "$hm" "${args[@]}" -d "$d" > "$logdir/$tag.json" 2> "$logdir/$tag.err"
    if [ "$d" -gt 0 ] && grep -q "cannot trim" "$logdir/$tag.err"; then
        note="d0"; d=0
        timeout "$tmo" "$hm" "${args[@]}" -d 0 > "$logdir/$tag.json" 2>> "$logdir/$tag.err"
    fi
    python3 - "$logdir/$tag.json" "$note" <<'PY'
import json, sys
note = sys.argv[2] or "-"
try:
    r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
except Exception:
    print("- - -", note); sys.exit()
h = r.get("tg_vram_hit_rate")
print("%.1f" % r["pp_tok_s"] if r.get("pp_tok_s") else "-", "%.2f" % r["tg_tok_s"] if r.get("tg_tok_s") else "-",
      "%.1f" % (100 * h) if h is not None else "-", note)
PY
    [ -s "$logdir/$tag.json" ] || { echo "  hotmoe ($tag) failed:" >&2; tail -3 "$logdir/$tag.err" >&2; }
}

# llama-bench (either build) -> "pp tg build"
lb_run() {
    local bin=$1 tag=$2; shift 2
    timeout "$tmo" "$bin" -m "$model" -t "$th" -r "$reps" -p "$pp" -n "$tg" -d "$depth" -o json "$@" \
        > "$logdir/$tag.json" 2> "$logdir/$tag.err"
    python3 - "$logdir/$tag.json" <<'PY'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))
except Exception:
    print("- - -"); sys.exit()
p = [r["avg_ts"] for r in rows if r.get("n_prompt", 0) > 0 and r.get("n_gen", 0) == 0]
g = [r["avg_ts"] for r in rows if r.get("n_gen", 0) > 0 and r.get("n_prompt", 0) == 0]
b = rows[0].get("build_commit", "-") if rows else "-"
print("%.1f" % p[0] if p else "-", "%.2f" % g[0] if g else "-", b or "-")
PY
    [ -s "$logdir/$tag.json" ] || { echo "  $tag failed:" >&2; tail -3 "$logdir/$tag.err" >&2; }
}

# the fork's hot_slot_ratio over one run with --moe-layer-perf-out -> "percent"
sb_hit() {
    local tag=$1; shift
    rm -f "$logdir/$tag.perf.json"
    timeout "$tmo" "$sb" -m "$model" -t "$th" -r 1 -o json --moe-layer-perf-out "$logdir/$tag.perf.json" "$@" \
        > "$logdir/$tag.json" 2> "$logdir/$tag.err"
    python3 - "$logdir/$tag.perf.json" <<'PY'
import json, sys
try:
    s = json.load(open(sys.argv[1]))["summary"]
    print("%.1f" % (100 * s["hot_slot_ratio"]))
except Exception:
    print("-")
PY
}

ratio() { python3 -c 'import sys
a, b = sys.argv[1], sys.argv[2]
print("%.2fx" % (float(a) / float(b)) if a != "-" and b != "-" and float(b) > 0 else "-")' "$1" "$2"; }

gpu=(-ngl 99)
# 1. llama.cpp with its layer split
lpp=- ltg=- lbuild=-
if [ "$lb" != - ]; then
    read -r lpp ltg lbuild < <(lb_run "$lb" llama "${gpu[@]}" -ncmoe "$ncmoe")
fi
lhit=$(python3 -c "print(f'{100 * ($n_layer - $ncmoe) / $n_layer:.1f}')")

# 2. the seed-1 fork: every expert on the CPU plus its hot cache
spp=- stg=- sbuild=- shpp=- shtg=- splan=""
if [ "$sb" != - ]; then
    read -r -a s1extra <<< "$s1args"
    hc=(--moe-hot-cache "$profile" --moe-hot-cache-max-mib "$mib" "${s1extra[@]}")
    if [ $cpu = 1 ]; then
        timeout "$tmo" "$sb" -m "$model" -t "$th" -r 1 -p 0 -n 1 "${gpu[@]}" -cmoe "${hc[@]}" -v \
            > /dev/null 2> "$logdir/seed1-probe.err"
        splan=$(grep -E "hot-cache weighting|requires a GPU|error loading" "$logdir/seed1-probe.err" | head -3)
        hc=()
    fi
    read -r spp stg sbuild < <(lb_run "$sb" seed1 "${gpu[@]}" -cmoe "${hc[@]}")
    # -v: llama-bench drops the library's log otherwise; the hot-cache plan lines are in it
    [ "$pp" -gt 0 ] && shpp=$(sb_hit seed1-hit-pp -p "$pp" -n 0 "${gpu[@]}" -cmoe "${hc[@]}" -v)
    [ $cpu = 1 ] || splan=$(grep -E "hot-cache weighting|selected [0-9]+ hot-cache experts|expert lane 0 plan|error" \
        "$logdir/seed1-hit-pp.err" | head -4)
    [ "$tg" -gt 0 ] && shtg=$(sb_hit seed1-hit-tg -p 0 -n "$hitgen" "${gpu[@]}" -cmoe "${hc[@]}")
fi

# 3. hotmoe: hot units placed from the profile (static policy); optionally llama.cpp's split
if [ $cpu = 1 ]; then hmargs=(--profile "$profile"); else hmargs=(-ngl 99 --vram-budget "${budget}GiB" --profile "$profile"); fi
read -r hpp htg hhit hnote < <(hm_run hotmoe "${hmargs[@]}")
if [ $hmncmoe = 1 ]; then
    if [ $cpu = 1 ]; then nargs=(); else nargs=(-ngl 99 --n-cpu-moe "$ncmoe"); fi
    read -r npp ntg nhit nnote < <(hm_run hotmoe-ncmoe "${nargs[@]}")
fi

echo "| engine / placement | pp$pp t/s | tg$tg t/s | hit rate pp | hit rate tg | pp vs llama.cpp | tg vs llama.cpp | tg vs seed-1 |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
echo "| llama.cpp -ngl 99 --n-cpu-moe $ncmoe ($lbuild) | $lpp | $ltg | $lhit % (layers) | $lhit % (layers) | | | |"
echo "| seed-1 fork -ngl 99 --cpu-moe, hot cache $mib MiB${s1args:+ $s1args} ($sbuild) | $spp | $stg | $shpp % | $shtg % | $(ratio "$spp" "$lpp") | $(ratio "$stg" "$ltg") | |"
dn=""; [ "$hnote" = d0 ] && dn=" (at -d 0: depth failed)"
[ $cpu = 1 ] && dn="$dn (--cpu: not passed)"
echo "| hotmoe static, --vram-budget ${budget}GiB$dn | $hpp | $htg | - | $hhit % | $(ratio "$hpp" "$lpp") | $(ratio "$htg" "$ltg") | $(ratio "$htg" "$stg") |"
if [ $hmncmoe = 1 ]; then
    dn=""; [ "$nnote" = d0 ] && dn=" (at -d 0: depth failed)"
    echo "| hotmoe --n-cpu-moe $ncmoe (llama.cpp's placement)$dn | $npp | $ntg | - | $nhit % | $(ratio "$npp" "$lpp") | $(ratio "$ntg" "$ltg") | $(ratio "$ntg" "$stg") |"
fi
echo
echo "seed-1 hit rates: summary.hot_slot_ratio of --moe-layer-perf-out, one run each (pp$pp; tg$hitgen at depth 0)."
[ -n "$splan" ] && { echo "seed-1 fork:"; echo "$splan" | sed 's/^/  /'; }
grep -h "hit rate" "$logdir/hotmoe.err" 2>/dev/null | sed 's/^/  /'

if [ -n "$jsonout" ]; then
    python3 - "$jsonout" <<PY
import json, sys
def num(x):
    try: return float(x)
    except ValueError: return None
json.dump({"model": "$model", "arch": "$arch", "n_layer": $n_layer, "budget_gib": $budget,
           "n_cpu_moe": $ncmoe, "threads": $th, "reps": $reps, "pp": $pp, "tg": $tg, "depth": $depth,
           "cpu_plumbing": $cpu == 1,
           "llama": {"pp": num("$lpp"), "tg": num("$ltg"), "hit": num("$lhit"), "build": "$lbuild"},
           "seed1": {"pp": num("$spp"), "tg": num("$stg"), "hit_pp": num("$shpp"), "hit_tg": num("$shtg"), "build": "$sbuild"},
           "hotmoe": {"pp": num("$hpp"), "tg": num("$htg"), "hit_tg": num("$hhit"), "depth0": "$hnote" == "d0"}},
          open(sys.argv[1], "w"), indent=1)
PY
fi
