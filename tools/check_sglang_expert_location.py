"""check_sglang_expert_location.py - load a logical_count JSON (`hotmoe profile --export sglang`)
the way SGLang's --init-expert-location does and build the tensors it would build, asserting the
shapes SGLang requires. Written from the facts in docs/CLUSTER.md (SGLang's
python/sglang/srt/eplb/expert_location.py and eplb_algorithms/deepseek.py), not from its code.

    python3 tools/check_sglang_expert_location.py F.json --num-layers L --num-experts E \
        [--ep-size N] [--redundant R] [--hotmoe-plan EP.json]

The steps SGLang takes (init_by_eplb, algorithm "deepseek": one group, one node):
  1. the file is JSON (.json, or a JSON text) or torch.save (.pt); a dict with
     "physical_to_logical_map" takes another branch, so an exported file must not have that key;
     "logical_count" is read;
  2. logical_count becomes a tensor; a 2-D one gets a leading dimension: [steps, L, E]; L must be
     the model's num_hidden_layers and E its routed experts (num_logical_experts);
  3. physical experts P = E + ep_num_redundant_experts, a multiple of the EP size;
  4. weight = logical_count summed over steps; the P - E replicas go one at a time to the expert
     with the most weight per copy; the P physical experts are packed heaviest first onto the GPU
     with the least weight that has a free slot (P / N each): physical_to_logical_map [L, P],
     logical_to_all_physical_map [L, E, X] (-1 padded), the replica counts [L, E];
  5. _init_raw pads logical_to_all_physical_map to [L, E, P] with -1 and counts the valid entries
     ([L, E]); ExpertLocationMetadata asserts the three agree on L, E and P.
Without torch only the JSON-level checks of steps 1-3 run (the script says so and exits 0).
With --hotmoe-plan (the JSON of `hotmoe plan --profile F.json --ep N --ep-redundant R --json`) the
per-layer device loads of step 4 are compared with hotmoe's C placement (same loads expected)."""
import argparse
import json
import sys
from pathlib import Path


def load(arg):
    if arg.endswith(".pt"):
        import torch  # noqa: PLC0415 (a .pt needs torch anyway)
        return torch.load(arg, weights_only=True)
    if arg.endswith(".json"):
        return json.loads(Path(arg).read_text())
    return json.loads(arg)


def shape_of(x):
    dims = []
    while isinstance(x, list):
        dims.append(len(x))
        x = x[0] if x else None
    return dims


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def replicate(torch, weight, num_phy):
    """weight [L, E] -> phy2log [L, P], replica rank [L, P], copies [L, E]."""
    L, E = weight.shape
    phy2log = torch.arange(num_phy, dtype=torch.int64).repeat(L, 1)
    rank = torch.zeros(L, num_phy, dtype=torch.int64)
    copies = torch.ones(L, E, dtype=torch.int64)
    rows = torch.arange(L)
    for p in range(E, num_phy):
        best = (weight / copies).max(dim=-1).indices
        phy2log[:, p] = best
        rank[:, p] = copies[rows, best]
        copies[rows, best] += 1
    return phy2log, rank, copies


def pack(torch, load, n_packs):
    """load [L, P] -> pack index and rank in pack [L, P], P / n_packs items per pack."""
    L, P = load.shape
    per = P // n_packs
    idx = torch.full((L, P), -1, dtype=torch.int64)
    rnk = torch.full((L, P), -1, dtype=torch.int64)
    for l in range(L):
        w = [0.0] * n_packs
        n = [0] * n_packs
        for item in load[l].sort(descending=True, stable=True).indices.tolist():
            b = min((d for d in range(n_packs) if n[d] < per), key=lambda d: w[d])
            idx[l, item], rnk[l, item] = b, n[b]
            w[b] += float(load[l, item])
            n[b] += 1
    return idx, rnk


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file", help="the exported JSON (or a .pt, or a JSON text)")
    ap.add_argument("--num-layers", type=int, required=True, help="the model's num_hidden_layers")
    ap.add_argument("--num-experts", type=int, required=True, help="routed experts per layer")
    ap.add_argument("--ep-size", type=int, default=8)
    ap.add_argument("--redundant", type=int, default=None, help="ep_num_redundant_experts (default: ep size)")
    ap.add_argument("--hotmoe-plan", help="`hotmoe plan --ep N --json` output to compare the loads with")
    a = ap.parse_args()
    L, E, N = a.num_layers, a.num_experts, a.ep_size
    R = N if a.redundant is None else a.redundant

    d = load(a.file)
    if not isinstance(d, dict):
        fail("the file is not an object")
    if "physical_to_logical_map" in d:
        fail("has physical_to_logical_map: SGLang would take the mapping branch, not logical_count")
    if "logical_count" not in d:
        fail(f"no logical_count (keys {list(d.keys())}): SGLang raises NotImplementedError")
    lc = d["logical_count"]
    if not isinstance(lc, list):
        lc = lc.tolist()  # a tensor from a .pt
    shp = shape_of(lc)
    if len(shp) == 2:
        shp = [1] + shp
    if len(shp) != 3 or shp[1:] != [L, E]:
        fail(f"logical_count has shape {shape_of(lc)}; SGLang needs [{L}, {E}] or [steps, {L}, {E}]")
    P = E + R
    if P % N:
        fail(f"{E} experts + {R} redundant = {P} is not a multiple of ep size {N}")
    print(f"ok: logical_count {shape_of(lc)} -> [steps, {L}, {E}]; {P} physical experts, {P // N} per GPU")

    try:
        import torch
    except ImportError:
        print("torch is not installed: the tensor steps were skipped (run this on a machine with torch)")
        return 0

    t = torch.tensor(lc)
    if t.dim() == 2:
        t = t.unsqueeze(0)
    assert tuple(t.shape[1:]) == (L, E), t.shape
    if (t < 0).any():
        fail("negative counts")
    weight = t.sum(dim=0).float()
    phy2log, prank, copies = replicate(torch, weight, P)
    per_phy = (weight / copies).gather(-1, phy2log)
    pidx, prk = pack(torch, per_phy, N)
    slot = pidx * (P // N) + prk  # physical -> its packed position
    inv = torch.empty_like(slot)
    inv.scatter_(1, slot, torch.arange(P, dtype=torch.int64).expand(L, P))
    p2l = phy2log.gather(-1, inv)  # physical_to_logical_map [L, P]
    rank = prank.gather(-1, inv)
    X = int(copies.max())
    l2p = torch.full((L, E, X), -1, dtype=torch.int64)
    l2p.view(L, -1).scatter_(-1, p2l * X + rank, torch.arange(P, dtype=torch.int64).expand(L, P))
    padded = torch.nn.functional.pad(l2p, (0, P - X), value=-1)  # _init_raw
    valid = torch.count_nonzero(padded != -1, dim=-1)

    assert tuple(p2l.shape) == (L, P), p2l.shape
    assert tuple(padded.shape) == (L, E, P), padded.shape
    assert tuple(valid.shape) == (L, E), valid.shape
    assert int(p2l.min()) >= 0 and int(p2l.max()) < E
    assert torch.equal(valid, copies), "replica counts disagree"
    for l in range(L):  # every physical expert listed once, under its own logical expert
        got = sorted(x for x in padded[l].flatten().tolist() if x != -1)
        assert got == list(range(P)), f"layer {l}: physical ids {got[:8]}..."
        for e in range(E):
            for p in padded[l, e].tolist():
                if p != -1:
                    assert int(p2l[l, p]) == e
    dev = torch.zeros(L, N)
    dev.scatter_add_(1, (torch.arange(P) // (P // N)).expand(L, P), per_phy.gather(-1, inv))
    tot = dev.sum(dim=1)
    moe = tot > 0
    imb = (dev.max(dim=1).values / (tot / N))[moe]
    print(f"ok: physical_to_logical_map {list(p2l.shape)}, logical_to_all_physical_map {list(padded.shape)}, "
          f"num_valid {list(valid.shape)}; max replicas {X}")
    print(f"EPLB over {N} GPUs with {R} redundant: mean imbalance (max/mean per layer) {float(imb.mean()):.6f} "
          f"over {int(moe.sum())} MoE layers, worst {float(imb.max()):.6f}")
    if a.hotmoe_plan:
        hp = json.loads(Path(a.hotmoe_plan).read_text())
        ours = torch.tensor(hp["eplb"]["layer_device_load"], dtype=torch.float64)
        if ours.shape != dev.shape:
            fail(f"hotmoe's plan has loads {list(ours.shape)}, this {list(dev.shape)}")
        # each layer's device loads as a sorted list: which device is which may differ on ties
        diff = (ours.sort(dim=1).values - dev.double().sort(dim=1).values).abs().max().item()
        scale = max(1.0, float(tot.max()))
        if diff > 1e-4 * scale:
            fail(f"hotmoe's EPLB loads differ by {diff} (layer loads up to {scale})")
        print(f"ok: hotmoe plan --ep agrees: largest load difference {diff:.3g}, mean imbalance "
              f"{hp['eplb']['mean_imbalance']:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
