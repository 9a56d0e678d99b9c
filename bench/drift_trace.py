#!/usr/bin/env python3
"""drift_trace.py - a routing trace with drift, for `hotmoe plan --trace` (docs/POLICIES.md).

Usage: drift_trace.py PROFILE.json OUT.trace [TOKENS_PER_PHASE] [SEED]

PROFILE is a seed-1 fork profile (llama.cpp.moe_layer_perf.v1 / moe_layer_opt_perf.v1: a layer's
counts are its hot_experts + cold_experts pairs, else its experts pairs, as src/experts/profile.c
reads them). The trace (docs/PROFILE.md's binary format) has two phases of decode tokens: in
phase A each token draws, per layer, k distinct experts in proportion to the profile's counts; in
phase B the same popularity moves to other experts (a fixed random permutation of each layer's
ids): a topic shift, so a placement fitted to phase A is stale in phase B.
"""
import bisect
import json
import random
import struct
import sys


def counts_of(path):
    d = json.load(open(path))
    n_expert, k = d["n_expert"], d["n_expert_used"]
    layers = []
    for lo in d["layers"]:
        c = [0] * n_expert
        pairs = (lo.get("hot_experts") or []) + (lo.get("cold_experts") or [])
        if not pairs:
            pairs = lo.get("experts") or []
        for e, n in pairs:
            c[e] += n
        layers.append(c)
    return layers, n_expert, k


def main():
    prof, out = sys.argv[1], sys.argv[2]
    per_phase = int(sys.argv[3]) if len(sys.argv) > 3 else 4096
    rng = random.Random(int(sys.argv[4]) if len(sys.argv) > 4 else 1)
    layers, n_expert, k = counts_of(prof)
    n_layer = len(layers)
    perms = []
    for _ in range(n_layer):
        p = list(range(n_expert))
        rng.shuffle(p)
        perms.append(p)
    cums = []
    for c in layers:
        w = [x if x > 0 else 0 for x in c]
        if sum(w) == 0:
            w = [1] * n_expert
        acc, cum = 0, []
        for x in w:
            acc += x
            cum.append(acc)
        cums.append(cum)
    idb = 1 if n_expert <= 256 else 2
    with open(out, "wb") as f:
        f.write(b"HMTRACE1" + struct.pack("<6I", 1, n_layer, n_expert, k, idb, 0))
        for phase in range(2):
            for _ in range(per_phase):
                for li in range(n_layer):
                    cum, total, got = cums[li], cums[li][-1], []
                    while len(got) < k:
                        e = bisect.bisect_right(cum, rng.random() * total)
                        e = min(e, n_expert - 1)
                        if cum[e] - (cum[e - 1] if e else 0) == 0 or e in got:
                            continue
                        got.append(e)
                    if phase == 1:
                        got = [perms[li][e] for e in got]
                    f.write(struct.pack("<cBHI", b"R", 0, li, k))
                    f.write(bytes(got) if idb == 1 else struct.pack("<%dH" % k, *got))
                f.write(struct.pack("<cBHI", b"S", 0, 0, 1))


if __name__ == "__main__":
    main()
