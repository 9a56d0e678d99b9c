#!/usr/bin/env bash
# profile_slice.sh - a few layers of a seed-1 fork profile (llama.cpp.moe_layer_perf.v1 /
# moe_layer_opt_perf.v1: hot_experts + cold_experts [id, count] pairs) as a hotmoe.profile.v1 of
# those layers, renumbered 0.., so a shallow synth model built from the profile (synth
# --routing-profile --layers N maps its layers proportionally) can be placed from it.
#
# usage: bench/profile_slice.sh SEED_PROFILE.json 5,15,25,35 > P.json   (needs jq)
set -euo pipefail
src="${1:?usage: profile_slice.sh SEED_PROFILE.json L1,L2,...}"
pick="[${2:?usage: profile_slice.sh SEED_PROFILE.json L1,L2,...}]"
command -v jq >/dev/null || { echo "profile_slice: needs jq" >&2; exit 1; }
jq -c --argjson pick "$pick" '. as $s | {schema: "hotmoe.profile.v1",
  model: ("layers \($pick | map(tostring) | join(",")) of a seed-1 profile"),
  n_layer: ($pick | length), n_expert: .n_expert, k: .n_expert_used,
  tokens: .updates, prompt_tokens: 0, decode_tokens: .updates, steps: .updates,
  layers: [$pick | to_entries[] | .key as $i | .value as $l
           | ($s.layers[] | select(.layer == $l)) as $L
           | {layer: $i, counts: (reduce ($L.hot_experts + $L.cold_experts)[] as $p
                                   ([range($s.n_expert) | 0]; .[$p[0]] += $p[1]))}
           | .total = (.counts | add)]}' "$src"
