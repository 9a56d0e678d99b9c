#!/usr/bin/env bash
# cli_gpu_split.sh - the several-GPU flags (issue 11) as a user types them: --vram-budget per device
# (0:11GiB,1:11GiB), -ts/--tensor-split, env GGML_CUDA_MOE_CACHE_BUDGET_MB_DEVICES. Bad forms are
# exit 2 with a message naming the token; good ones are accepted and, with a model, end where this
# machine allows: no CUDA in the build, no device, a device the machine lacks, or a run (several
# GPUs run qwen3moe models). The plan itself is checked by test_gpu_split, the run by
# test_multi_gpu_gpu.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
hm_tmpdir gpu_split

check "help names -ts" bash -c "'$EXE' run --help 2>&1 | grep -q -- '--tensor-split'"
check "help names the per-device form" bash -c "'$EXE' run --help 2>&1 | grep -q -- '0:11GiB,1:11GiB'"

# refusals: exit 2 before any model is read, the message names the flag, the value and the token
bad() { # bad NAME WANT ARGS...
    local name=$1 want=$2
    shift 2
    check "$name: exit 2" test "$(code "$EXE" bench -m "$tmp/none.gguf" "$@")" = 2
    check "$name: message" grep -qF -- "$want" "$tmp/err"
}
bad "bad device" "--vram-budget 0:11GiB,x: bad device 'x'" --vram-budget 0:11GiB,x
bad "device out of range" "bad device '16'" --vram-budget 16:1GiB
bad "device twice" "device 0 is given twice" --vram-budget 0:1GiB,0:2GiB
bad "bad size" "bad size '11GX' for device 1" --vram-budget 0:1GiB,1:11GX
bad "no size" "no size for device 1" --vram-budget 0:1GiB,1
bad "single form junk" "--vram-budget lots: expects a size" --vram-budget lots
bad "bad share" "-ts 3,x: bad share 'x' for device 1" -ts 3,x
bad "negative share" "--tensor-split -1,1: bad share '-1'" --tensor-split -1,1
bad "empty share" "empty entry" -ts ,1
bad "too many shares" "more than 16 entries" -ts 1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1
check "serve refuses too" test "$(code "$EXE" serve -m "$tmp/none.gguf" --vram-budget x:1GiB)" = 2
check "serve message" grep -qF "bad device 'x'" "$tmp/err"

if ! "$EXE" synth --preset tiny --type q4_k_m --seed 3 -q -o "$tmp/m.gguf" >/dev/null 2>&1; then
    echo "synth unavailable: skipping the model runs"
    [ $fail = 0 ] && exit 77 || exit 1
fi
m="$tmp/m.gguf"

# Good forms reach the model open. Where they end depends on the machine; each way out is exit 1
# with its reason (a CPU build, no device, a device this machine lacks).
runs_or_says() { # NAME ARGS...: exit 0, or 1 with one of the known reasons
    local name=$1
    shift
    local rc
    rc=$(code "$EXE" run -m "$m" -p hi -n 2 "$@")
    if [ "$rc" = 0 ]; then return 0; fi
    check "$name: exit 1" test "$rc" = 1
    check "$name: reason" grep -Eq "built without CUDA|no CUDA device found|but there (is|are) [0-9]+ CUDA device" "$tmp/err"
}
runs_or_says "two budgets" --vram-budget 0:1GiB,1:1GiB
runs_or_says "three budgets" --vram-budget 0:11GiB,1:11GiB,2:5GiB
runs_or_says "one budget per device" --vram-budget 0:64MiB
runs_or_says "-ts 3,1" -ngl 99 -ts 3,1
runs_or_says "-ts 3/1 with auto" --vram-budget auto --tensor-split 3/1
# a plan of one device or none is not refused for being several
check "-ts 1 is one device" test "$(code "$EXE" run -m "$m" -p hi -n 2 -ts 1)" != 2
check "-ts 1: not several" bash -c "! grep -q 'several GPUs' '$tmp/err'"
check "-ts 0,0 asks for nothing: runs on the CPU" test "$(code "$EXE" run -m "$m" -p hi -n 2 -ts 0,0)" = 0
# the env alias (cli_env.c): read (on two devices a layer split; without CUDA or a device named in a
# warning, and the run goes on, on the CPU); a bad value is an error naming it
rc=$(GGML_CUDA_MOE_CACHE_BUDGET_MB_DEVICES=0:11800,1:11800 code "$EXE" run -m "$m" -p hi -n 2)
# (one GPU: device 1 is missing, refused as the flag would be)
check "env per device is read" bash -c "[ $rc = 1 ] || { [ $rc = 0 ] && grep -Eq '(built without CUDA|no CUDA device found): ..._BUDGET_MB_DEVICES' '$tmp/err'; }"
check "env bad value is an error" test "$(GGML_CUDA_MOE_CACHE_BUDGET_MB_DEVICES=0:11GiB code "$EXE" run -m "$m" -p hi -n 2)" != 0
check "env bad value message" grep -qF "GGML_CUDA_MOE_CACHE_BUDGET_MB_DEVICES='0:11GiB': bad size '11GiB' for device 0" "$tmp/err"

[ $fail = 0 ] && echo "cli_gpu_split: all passed"
exit $fail
