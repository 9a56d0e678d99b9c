#!/usr/bin/env bash
# policy_report.sh - hit rate vs fast-tier budget for the static, online and lru policies and
# for llama.cpp's layer split (--n-cpu-moe), from a usage profile, by driving `hotmoe plan --json`.
# Prints a Markdown table (docs/POLICIES.md holds one run of it). A benchmark, not a test.
#
# usage: bench/policy_report.sh [PROFILE.json] [UNIT_BYTES] [SEED]
#   default: the seed-1 fork's coding profile (Qwen3.6-35B-A3B, 40 x 256 experts, k 8) and its
#   Q4_K_M unit size (gate + up Q4_K 2 x 589824, down Q6_K 860160 = 2039808 bytes).
# Needs jq. HM_EXE overrides the binary (default build/hotmoe).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
exe="${HM_EXE:-$here/build/hotmoe}"
profile="${1:-$here/tests/data/seed1_profile_qwen36_coding.json}"
unit="${2:-2039808}"
seed="${3:-1}"
command -v jq >/dev/null || { echo "policy_report: needs jq" >&2; exit 1; }

echo "| units in VRAM | static (in-sample) | static | online | lru | llama.cpp --n-cpu-moe | its hit rate |"
echo "|---:|---:|---:|---:|---:|---:|---:|"
for pct in 5 10 20 30 40 50 60 70 80; do
    j=$("$exe" plan --profile "$profile" --unit-bytes "$unit" --budget "$pct%" --seed "$seed" --json)
    echo "$j" | jq -r --arg pct "$pct" '"| \($pct) % (\(.units_fit)) | \(.compare.static_in_sample*1000|round/10) % | \(.compare.static*1000|round/10) % | \(.compare.online*1000|round/10) % | \(.compare.lru*1000|round/10) % | \(.n_cpu_moe.n) | \(.n_cpu_moe.hit_rate*1000|round/10) % |"'
done
echo
echo "routing: $(echo "$j" | jq -r .compare.routing)"
