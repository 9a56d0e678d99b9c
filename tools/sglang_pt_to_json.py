"""sglang_pt_to_json.py - SGLang's expert-distribution recorder dump (expert_distribution_recorder_*.pt,
torch.save of {"rank", "logical_count": int tensor [steps, layers, experts], ...}, stat mode) to the
JSON that `hotmoe --profile` and SGLang's --init-expert-location both read. Needs torch.
The steps are summed (as SGLang's EPLB sums them), so the file is [layers][experts] however long
the recording ran.

    python3 tools/sglang_pt_to_json.py expert_distribution_recorder_1700000000.0.pt OUT.json"""
import json
import sys

import torch


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    d = torch.load(sys.argv[1], weights_only=True)
    if not isinstance(d, dict) or "logical_count" not in d:
        keys = list(d.keys()) if isinstance(d, dict) else type(d).__name__
        print(f"{sys.argv[1]}: no logical_count ({keys}); record with --expert-distribution-recorder-mode stat",
              file=sys.stderr)
        return 1
    lc = d["logical_count"]
    if hasattr(lc, "dim") and lc.dim() == 3:
        lc = lc.sum(dim=0)
    with open(sys.argv[2], "w") as f:
        json.dump({"logical_count": lc.tolist() if hasattr(lc, "tolist") else lc}, f)
        f.write("\n")
    print(f"wrote {sys.argv[2]}: logical_count {list(lc.shape) if hasattr(lc, 'shape') else '?'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
