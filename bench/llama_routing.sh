#!/usr/bin/env bash
# llama_routing.sh - llama.cpp's routing of a `hotmoe synth --routing-profile` model vs the profile.
#
#   bench/llama_routing.sh MODEL.gguf PROFILE.json [TOKENS] [CTX]
#
# Builds bench/llama_routing_hist.c against the llama.cpp build in $LLAMA_CPP_DIR (its bin/ with
# libllama.so; headers from the source tree two levels up), runs TOKENS random tokens through
# llama.cpp (the same tokens as bench_synth_routing with the same seed) and prints, per layer, the
# total-variation distance between llama.cpp's selection frequencies and the profile layer the
# model layer maps to (the synth tool's rule: floor((l + 1/2) * P / L)), and the mean.
set -euo pipefail
model=${1:?MODEL.gguf}; profile=${2:?PROFILE.json}; tokens=${3:-2048}; ctx=${4:-512}
bin=${LLAMA_CPP_DIR:-/work/llama.cpp/build-cpu/bin}
src=$(cd "$bin/../.." && pwd)
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d /tmp/hm_llama_routing.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cc -O2 -Wall -I"$src/include" -I"$src/ggml/include" "$here/llama_routing_hist.c" -L"$bin" -lllama -lggml \
   -lggml-base -Wl,-rpath,"$bin" -o "$tmp/hist"
"$tmp/hist" "$model" "$tmp/counts.json" "$tokens" "$ctx" 2>"$tmp/log" || { tail -20 "$tmp/log"; exit 1; }
grep llama_routing_hist "$tmp/log" >&2
python3 - "$tmp/counts.json" "$profile" <<'PY'
import json, sys
meas = json.load(open(sys.argv[1])); prof = json.load(open(sys.argv[2]))
E = meas["n_expert"]
def layers(p):  # counts per layer, ours or the seed-1 fork's (hot + cold, else experts)
    if p["schema"] == "hotmoe.profile.v1":
        return [l["counts"] for l in p["layers"]]
    out = {}
    for l in p["layers"]:
        c = [0] * p["n_expert"]
        keys = [k for k in ("hot_experts", "cold_experts") if k in l] or ["experts"]
        for k in keys:
            for e, n in l[k]: c[e] += n
        out[l["layer"]] = c
    return [out.get(i, [0] * p["n_expert"]) for i in range(max(out) + 1)]
P, M = layers(prof), layers(meas)
if len(P[0]) != E: sys.exit("profile has %d experts, model %d" % (len(P[0]), E))
L = len(M); tvs = []
print("layer  profile  TV(llama.cpp)")
for l in range(L):
    pl = (2 * l + 1) * len(P) // (2 * L)
    a, b = sum(M[l]), sum(P[pl])
    tv = 0.5 * sum(abs(x / a - y / b) for x, y in zip(M[l], P[pl]))
    tvs.append(tv); print("%5d  %7d  %13.4f" % (l, pl, tv))
print(" mean           %13.4f" % (sum(tvs) / L))
PY
