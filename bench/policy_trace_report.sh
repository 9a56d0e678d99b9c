#!/usr/bin/env bash
# policy_trace_report.sh - hit rate vs fast-tier budget on a routing trace RECORDED FROM THE ENGINE
# (`hotmoe profile ... --trace-out T` or `hotmoe run ... --trace-out T`), so the trace carries the
# workload's temporal locality (the synthetic trace of policy_report.sh has none). Drives
# `hotmoe plan --json`; prints a Markdown table (docs/POLICIES.md holds one run of it). A
# benchmark, not a test.
#
# usage: bench/policy_trace_report.sh MODEL.gguf TRACE.bin [PROFILE.json]
#   static (oracle)   static placed from the trace's own counts: knows the future, an upper bound
#   static (profile)  static placed from PROFILE (another workload's counts), replayed on the trace
#   online, lru       replayed on the trace, starting empty
#   --n-cpu-moe N     llama.cpp's layer split with the same bytes, and its hit rate on the trace
# Needs jq. HM_EXE overrides the binary (default build/hotmoe). Budgets: 5 % ... 80 % of the units.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
exe="${HM_EXE:-$here/build/hotmoe}"
model="${1:?usage: policy_trace_report.sh MODEL.gguf TRACE.bin [PROFILE.json]}"
trace="${2:?usage: policy_trace_report.sh MODEL.gguf TRACE.bin [PROFILE.json]}"
profile="${3:-}"
command -v jq >/dev/null || { echo "policy_trace_report: needs jq" >&2; exit 1; }

if [ -n "$profile" ]; then
    echo "| units in VRAM | static (oracle) | static (profile) | online | lru | llama.cpp --n-cpu-moe | its hit rate |"
    echo "|---:|---:|---:|---:|---:|---:|---:|"
else
    echo "| units in VRAM | static (oracle) | online | lru | llama.cpp --n-cpu-moe | its hit rate |"
    echo "|---:|---:|---:|---:|---:|---:|"
fi
pc() { jq -r "$1 * 1000 | round / 10"; }
for pct in 5 10 20 30 40 50 60 70 80; do
    j=$("$exe" plan -m "$model" --no-calibrate --trace "$trace" --budget "$pct%" --json)
    row="| $pct % ($(echo "$j" | jq -r .units_fit)) | $(echo "$j" | pc .compare.static) % |"
    if [ -n "$profile" ]; then
        jp=$("$exe" plan -m "$model" --no-calibrate --profile "$profile" --trace "$trace" --budget "$pct%" --json)
        row="$row $(echo "$jp" | pc .compare.static) % |"
    fi
    row="$row $(echo "$j" | pc .compare.online) % | $(echo "$j" | pc .compare.lru) % | $(echo "$j" | jq -r .n_cpu_moe.n) | $(echo "$j" | pc .n_cpu_moe.hit_rate) % |"
    echo "$row"
done
