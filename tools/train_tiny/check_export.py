"""check_export.py - the export path of train.py on a machine without numpy or torch.

Writes a tiny random qwen3moe checkpoint in transformers 5's fused layout (safetensors, written
here by hand) with a byte-level BPE tokenizer.json shaped like the one train.py trains, converts it
with tools/convert_hf_to_gguf.py to F32 and Q8_0 (pure-Python path), and checks the GGUF: keys,
vocabulary, shapes, and every Q8_0 value against the F32 one (|d| <= half a quantization step).
With --hotmoe / --llama-bin it also loads both files with `hotmoe run` and llama.cpp's llama-simple.

Usage: python3 tools/train_tiny/check_export.py [--work DIR] [--hotmoe PATH] [--llama-bin DIR]
"""
import argparse
import json
import os
import random
import struct
import subprocess
import sys

TOOLS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TOOLS)
import convert_hf_to_gguf as conv  # noqa: E402
import gguf_read  # noqa: E402

CFG = dict(vocab_size=320, hidden_size=64, intermediate_size=32, moe_intermediate_size=32,
           num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
           num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, rope_theta=10000.0,
           rms_norm_eps=1e-6, max_position_embeddings=128, tie_word_embeddings=False,
           architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe")


def shapes(c):
    H, F, E, V = c["hidden_size"], c["moe_intermediate_size"], c["num_experts"], c["vocab_size"]
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    s = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,), "lm_head.weight": (V, H)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}"
        s.update({f"{p}.input_layernorm.weight": (H,), f"{p}.post_attention_layernorm.weight": (H,),
                  f"{p}.self_attn.q_proj.weight": (q, H), f"{p}.self_attn.k_proj.weight": (kv, H),
                  f"{p}.self_attn.v_proj.weight": (kv, H), f"{p}.self_attn.o_proj.weight": (H, q),
                  f"{p}.self_attn.q_norm.weight": (c["head_dim"],), f"{p}.self_attn.k_norm.weight": (c["head_dim"],),
                  f"{p}.mlp.gate.weight": (E, H), f"{p}.mlp.experts.gate_up_proj": (E, 2 * F, H),
                  f"{p}.mlp.experts.down_proj": (E, H, F)})
    return s


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, (shape, vals) in tensors.items():
        b = struct.pack(f"<{len(vals)}f", *vals)
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def tokenizer_json():
    toks = conv.gpt2_byte_tokens()
    vocab = {"<|endoftext|>": 0}
    for t in toks:
        vocab[t] = len(vocab)
    merges = []
    for a, b in [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("d", "e"), ("de", "f"), ("Ġ", "a"), ("i", "n")]:
        vocab[a + b] = len(vocab)
        merges.append([a, b])
    return {"version": "1.0", "added_tokens": [{"id": 0, "content": "<|endoftext|>", "single_word": False,
                                                "lstrip": False, "rstrip": False, "normalized": False,
                                                "special": True}],
            "normalizer": None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": conv.QWEN2_SPLIT}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
            "post_processor": None, "decoder": {"type": "ByteLevel"},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False,
                      "byte_fallback": False, "ignore_merges": False, "vocab": vocab, "merges": merges}}


def run(cmd):
    print("$", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    print((r.stdout + r.stderr)[-1500:], flush=True)
    if r.returncode:
        sys.exit(f"failed: {' '.join(cmd)}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/train_tiny_check")
    ap.add_argument("--hotmoe")
    ap.add_argument("--llama-bin")
    a = ap.parse_args()
    hf = os.path.join(a.work, "hf")
    os.makedirs(hf, exist_ok=True)
    rng = random.Random(1)
    ts = {}
    for n, s in shapes(CFG).items():
        cnt = 1
        for d in s:
            cnt *= d
        if len(s) == 1:
            ts[n] = (s, [1.0 + 0.1 * rng.gauss(0, 1) for _ in range(cnt)])
        else:
            ts[n] = (s, [struct.unpack("<f", struct.pack("<f", 0.2 * rng.gauss(0, 1)))[0] for _ in range(cnt)])
    write_safetensors(os.path.join(hf, "model.safetensors"), ts)
    json.dump(CFG, open(os.path.join(hf, "config.json"), "w"))
    json.dump(tokenizer_json(), open(os.path.join(hf, "tokenizer.json"), "w"))
    out = {}
    for t in ("f32", "q8_0"):
        out[t] = os.path.join(a.work, f"tiny-{t}.gguf")
        run([sys.executable, os.path.join(TOOLS, "convert_hf_to_gguf.py"), hf, out[t], "--type", t])

    info = {t: gguf_read.read(p) for t, p in out.items()}
    kv = info["q8_0"]["kv"]
    assert kv["tokenizer.ggml.model"] == "gpt2" and kv["tokenizer.ggml.pre"] == "qwen2"
    assert len(kv["tokenizer.ggml.tokens"]) == CFG["vocab_size"], len(kv["tokenizer.ggml.tokens"])
    assert kv["tokenizer.ggml.tokens"][0] == "<|endoftext|>" and kv["tokenizer.ggml.token_type"][0] == 3
    assert kv["tokenizer.ggml.tokens"][-1] == f"[PAD{CFG['vocab_size'] - 1}]"
    assert kv["tokenizer.ggml.merges"][2] == "Ġt he"
    assert kv["tokenizer.ggml.eos_token_id"] == 0 and kv["tokenizer.ggml.add_bos_token"] is False
    assert kv["general.file_type"] == 7 and kv["qwen3moe.expert_count"] == 4
    tf = {t["name"]: t for t in info["f32"]["tensors"]}
    blob = {k: open(p, "rb").read() for k, p in out.items()}
    nq = 0
    for t in info["q8_0"]["tensors"]:
        f = tf[t["name"]]
        assert f["ne"] == t["ne"], t["name"]
        n = 1
        for d in t["ne"]:
            n *= d
        ref = struct.unpack_from(f"<{n}f", blob["f32"], f["data_offset"])
        if t["type"] == 0:
            assert ref == struct.unpack_from(f"<{n}f", blob["q8_0"], t["data_offset"]), t["name"]
            continue
        assert t["type"] == 8, (t["name"], t["type"])
        nq += 1
        for b in range(n // 32):
            o = t["data_offset"] + 34 * b
            d = struct.unpack_from("<e", blob["q8_0"], o)[0]
            q = struct.unpack_from("<32b", blob["q8_0"], o + 2)
            for j in range(32):
                x = ref[32 * b + j]
                assert abs(q[j] * d - x) <= 0.57 * d, (t["name"], b, j, x, q[j], d)
    g = tf["blk.0.ffn_gate_exps.weight"]
    assert g["ne"] == [64, 32, 4], g["ne"]
    # gate = first half of gate_up_proj rows, up = second half
    gu = ts["model.layers.0.mlp.experts.gate_up_proj"][1]
    first = struct.unpack_from("<64f", blob["f32"], g["data_offset"])
    up = struct.unpack_from("<64f", blob["f32"], tf["blk.0.ffn_up_exps.weight"]["data_offset"])
    assert list(first) == gu[:64] and list(up) == gu[32 * 64:33 * 64]
    print(f"GGUF checks OK; the 0.57 step bound: half a step plus the f16 rounding of d at |q| = 127 ({nq} Q8_0 tensors)")

    for t, p in out.items():
        if a.hotmoe:
            run([a.hotmoe, "inspect", p])
            run([a.hotmoe, "run", "-m", p, "-p", "def the", "-n", "8", "-t", "1"])
        if a.llama_bin:
            run([os.path.join(a.llama_bin, "llama-tokenize"), "-m", p, "-p", "def the main", "--ids", "--log-disable"])
            run([os.path.join(a.llama_bin, "llama-simple"), "-m", p, "-n", "8", "def the"])
    print("all OK")


if __name__ == "__main__":
    main()
