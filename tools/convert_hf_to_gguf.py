"""convert_hf_to_gguf.py - convert a Hugging Face Qwen3-MoE or Qwen3.5-MoE model to GGUF.

The architecture comes from config.json (model_type / architectures): Qwen3MoeForCausalLM ->
qwen3moe, Qwen3_5Moe* (model_type qwen3_5_moe[_text]) -> qwen35moe (qwen35moe.py beside this file
holds that recipe). Without numpy (tiny fixtures on a bare machine) safetensors are read by
pytensor.py (qwen3moe: F32, F16 or Q8_0, quantized in pure Python; qwen35moe: F32 only); with
numpy the numpy path is used.

Vocabulary: a Hugging Face tokenizer.json beside config.json (byte-level BPE with the Qwen2 split
regex, as tools/train_tiny trains) is written as tokenizer.ggml.model "gpt2", pre "qwen2", with its
tokens, token types (added special tokens CONTROL, other added tokens USER_DEFINED), merges,
bos = eos = <|endoftext|>, add_bos false; tokens are padded to the model's vocab_size with UNUSED
"[PAD<id>]" entries. Without tokenizer.json a minimal placeholder vocabulary is written.

qwen3moe:

Follows llama.cpp's conventions for qwen3moe (key and tensor names, expert tensors stacked into
3-D {n_embd, n_ff_exp, n_expert} / {n_ff_exp, n_embd, n_expert}, Q/K not permuted since Qwen3
uses NEOX-style rotary). Works from a state_dict, so it accepts both transformers layouts: one
Linear per expert (mlp.experts.E.{gate,up,down}_proj.weight) and the fused v5 tensors
(mlp.experts.gate_up_proj [E, 2*n_ff, n_embd], mlp.experts.down_proj [E, n_embd, n_ff]).

Q8_0 goes to every 2-D+ weight except norms and the router (ffn_gate_inp), which stay F32.

Usage: python3 tools/convert_hf_to_gguf.py HF_DIR OUT.gguf [--type f32|f16|q8_0]
"""
import argparse
import json
import os
import sys

try:
    import numpy as np
except ImportError:  # pure-Python path (pytensor), F32 only
    np = None

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_write as gw  # noqa: E402
import pytensor  # noqa: E402

TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_UNUSED = 1, 3, 5
FTYPE = {"f32": 0, "f16": 1, "q8_0": 7}
GGML = {"f32": gw.GGML_F32, "f16": gw.GGML_F16, "q8_0": gw.GGML_Q8_0}


def gpt2_byte_tokens():
    """The 256 byte tokens of byte-level BPE, in GPT-2's byte -> printable unicode mapping."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def minimal_vocab(vocab_size):
    """A small valid byte-level BPE vocabulary padded to vocab_size (for random models)."""
    toks = gpt2_byte_tokens()
    merges = []
    for a, b in [("Ġ", "t"), ("h", "e"), ("i", "n"), ("Ġ", "a"), ("r", "e"), ("o", "n"),
                 ("Ġt", "he"), ("e", "r"), ("Ġ", "s"), ("a", "t")]:
        if a in toks and b in toks and a + b not in toks:
            toks.append(a + b)
            merges.append(f"{a} {b}")
    types = [TOKEN_NORMAL] * len(toks)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    for s in specials:
        toks.append(s)
        types.append(TOKEN_CONTROL)
    if len(toks) > vocab_size:
        raise ValueError(f"vocab_size {vocab_size} too small for the minimal vocabulary ({len(toks)})")
    while len(toks) < vocab_size:
        toks.append(f"[PAD{len(toks)}]")
        types.append(TOKEN_UNUSED)
    eos = toks.index("<|endoftext|>")
    return toks, types, merges, eos


def experts_from_state(sd, layer, n_expert, n_ff, n_embd):
    """Return gate, up [E, n_ff, n_embd] and down [E, n_embd, n_ff] for one layer."""
    p = f"model.layers.{layer}.mlp.experts"
    if np is None or not isinstance(sd.get(f"{p}.gate_up_proj"), (type(None), np.ndarray)):
        # pytensor path: the fused v5 layout in its natural orientation only
        if f"{p}.gate_up_proj" not in sd:
            raise ValueError(f"{p}: per-expert Linear weights need numpy")
        gu, dn = sd[f"{p}.gate_up_proj"], sd[f"{p}.down_proj"]
        if pytensor.shape(gu) != (n_expert, 2 * n_ff, n_embd) or pytensor.shape(dn) != (n_expert, n_embd, n_ff):
            raise ValueError(f"{p}: gate_up_proj {pytensor.shape(gu)} / down_proj {pytensor.shape(dn)}: "
                             "only [E, 2*n_ff, n_embd] / [E, n_embd, n_ff] without numpy")
        return pytensor.rows(gu, 0, n_ff, axis=1), pytensor.rows(gu, n_ff, 2 * n_ff, axis=1), dn
    if f"{p}.0.gate_proj.weight" in sd:
        gate = np.stack([sd[f"{p}.{e}.gate_proj.weight"] for e in range(n_expert)])
        up = np.stack([sd[f"{p}.{e}.up_proj.weight"] for e in range(n_expert)])
        down = np.stack([sd[f"{p}.{e}.down_proj.weight"] for e in range(n_expert)])
        return gate, up, down
    gu, dn = sd[f"{p}.gate_up_proj"], sd[f"{p}.down_proj"]
    if gu.shape == (n_expert, 2 * n_ff, n_embd):
        gate, up = gu[:, :n_ff, :], gu[:, n_ff:, :]
    elif gu.shape == (n_expert, n_embd, 2 * n_ff):  # stored transposed
        gate, up = gu[:, :, :n_ff].transpose(0, 2, 1), gu[:, :, n_ff:].transpose(0, 2, 1)
    else:
        raise ValueError(f"{p}.gate_up_proj: unexpected shape {gu.shape}")
    if dn.shape == (n_expert, n_embd, n_ff):
        down = dn
    elif dn.shape == (n_expert, n_ff, n_embd):
        down = dn.transpose(0, 2, 1)
    else:
        raise ValueError(f"{p}.down_proj: unexpected shape {dn.shape}")
    return np.ascontiguousarray(gate), np.ascontiguousarray(up), np.ascontiguousarray(down)


def gguf_tensors(cfg, sd):
    """Map a Qwen3-MoE state_dict (numpy float arrays) to GGUF tensor names (numpy layout)."""
    L, E = cfg["num_hidden_layers"], n_experts(cfg)
    n_embd, n_ff = cfg["hidden_size"], cfg["moe_intermediate_size"]
    out = {"token_embd.weight": sd["model.embed_tokens.weight"],
           "output_norm.weight": sd["model.norm.weight"]}
    if "lm_head.weight" in sd and not cfg.get("tie_word_embeddings", False):
        out["output.weight"] = sd["lm_head.weight"]
    for i in range(L):
        p = f"model.layers.{i}"
        b = f"blk.{i}"
        out[f"{b}.attn_norm.weight"] = sd[f"{p}.input_layernorm.weight"]
        out[f"{b}.attn_q.weight"] = sd[f"{p}.self_attn.q_proj.weight"]
        out[f"{b}.attn_k.weight"] = sd[f"{p}.self_attn.k_proj.weight"]
        out[f"{b}.attn_v.weight"] = sd[f"{p}.self_attn.v_proj.weight"]
        out[f"{b}.attn_output.weight"] = sd[f"{p}.self_attn.o_proj.weight"]
        out[f"{b}.attn_q_norm.weight"] = sd[f"{p}.self_attn.q_norm.weight"]
        out[f"{b}.attn_k_norm.weight"] = sd[f"{p}.self_attn.k_norm.weight"]
        out[f"{b}.ffn_norm.weight"] = sd[f"{p}.post_attention_layernorm.weight"]
        out[f"{b}.ffn_gate_inp.weight"] = sd[f"{p}.mlp.gate.weight"]
        g, u, d = experts_from_state(sd, i, E, n_ff, n_embd)
        out[f"{b}.ffn_gate_exps.weight"] = g
        out[f"{b}.ffn_up_exps.weight"] = u
        out[f"{b}.ffn_down_exps.weight"] = d
    return out


def write_gguf(path, cfg, tensors, out_type="f32", name="qwen3moe", tokenizer=None):
    """tokenizer: None for the minimal vocabulary, else dict(tokens, types, merges, bos, eos)."""
    a = "qwen3moe"
    w = gw.GGUFWriter(path)
    w.add_str("general.architecture", a)
    w.add_str("general.name", name)
    w.add_u32("general.file_type", FTYPE[out_type])
    w.add_u32("general.quantization_version", 2)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    w.add_u32(f"{a}.block_count", cfg["num_hidden_layers"])
    w.add_u32(f"{a}.context_length", cfg["max_position_embeddings"])
    w.add_u32(f"{a}.embedding_length", cfg["hidden_size"])
    w.add_u32(f"{a}.feed_forward_length", cfg.get("intermediate_size", cfg["moe_intermediate_size"]))
    w.add_u32(f"{a}.attention.head_count", cfg["num_attention_heads"])
    w.add_u32(f"{a}.attention.head_count_kv", cfg["num_key_value_heads"])
    w.add_u32(f"{a}.attention.key_length", head_dim)
    w.add_u32(f"{a}.attention.value_length", head_dim)
    w.add_f32(f"{a}.rope.freq_base", rope_theta(cfg))
    rs = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rtype = rs.get("rope_type") or rs.get("type") or "default"
    if rtype in ("yarn", "linear"):  # as llama.cpp's converter writes them
        w.add_str(f"{a}.rope.scaling.type", rtype)
        w.add_f32(f"{a}.rope.scaling.factor", float(rs["factor"]))
        if rtype == "yarn":
            w.add_u32(f"{a}.rope.scaling.original_context_length", int(rs["original_max_position_embeddings"]))
    elif rtype != "default":
        raise SystemExit(f"rope scaling {rtype!r}: not converted")
    w.add_f32(f"{a}.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    w.add_u32(f"{a}.expert_count", n_experts(cfg))
    w.add_u32(f"{a}.expert_used_count", cfg["num_experts_per_tok"])
    w.add_u32(f"{a}.expert_feed_forward_length", cfg["moe_intermediate_size"])
    write_tokenizer(w, cfg, tokenizer, "qwen2")
    for n, t in tensors.items():
        if not hasattr(t, "le_bytes"):  # numpy (a PyTensor goes in as it is)
            t = np.asarray(t, dtype=np.float32)
        typ = GGML[out_type] if (t.ndim >= 2 and not n.endswith("_norm.weight")
                                 and "ffn_gate_inp" not in n) else gw.GGML_F32
        w.add_tensor(n, t, typ)
    w.write()


def n_experts(cfg):
    return cfg["num_experts"] if "num_experts" in cfg else cfg["num_local_experts"]


def rope_theta(cfg):
    if "rope_theta" in cfg:
        return cfg["rope_theta"]
    return (cfg.get("rope_parameters") or {}).get("rope_theta", 1e6)


QWEN2_SPLIT = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
               "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


def hf_tokenizer(path, vocab_size):
    """tokenizer.json (byte-level BPE, Qwen2 split) -> dict(tokens, types, merges, bos, eos, pre)."""
    tj = json.load(open(path, encoding="utf-8"))
    model = tj.get("model") or {}
    if model.get("type") != "BPE":
        raise SystemExit(f"{path}: model type {model.get('type')!r}, only BPE is supported")
    pt = tj.get("pre_tokenizer") or {}
    parts = pt.get("pretokenizers", [pt]) if pt.get("type") == "Sequence" else [pt]
    splits = [p["pattern"].get("Regex") for p in parts if p.get("type") == "Split"]
    if splits != [QWEN2_SPLIT] or not any(p.get("type") == "ByteLevel" for p in parts):
        raise SystemExit(f"{path}: pre-tokenizer is not Qwen2's Split regex + ByteLevel ({splits})")
    if tj.get("normalizer"):
        raise SystemExit(f"{path}: a normalizer ({tj['normalizer'].get('type')}) is not supported")
    n = max([vocab_size] + [i + 1 for i in model["vocab"].values()] +
            [t["id"] + 1 for t in tj.get("added_tokens", [])])
    if n > vocab_size:
        raise SystemExit(f"{path}: token id {n - 1} >= the model's vocab_size {vocab_size}")
    toks, types = [None] * n, [TOKEN_UNUSED] * n
    for t, i in model["vocab"].items():
        toks[i], types[i] = t, TOKEN_NORMAL
    for t in tj.get("added_tokens", []):
        toks[t["id"]], types[t["id"]] = t["content"], TOKEN_CONTROL if t.get("special") else 4
    for i in range(n):
        if toks[i] is None:
            toks[i] = f"[PAD{i}]"
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    if "<|endoftext|>" not in toks:
        raise SystemExit(f"{path}: no <|endoftext|> token")
    eos = toks.index("<|endoftext|>")
    return {"tokens": toks, "types": types, "merges": merges, "bos": eos, "eos": eos, "pre": "qwen2"}


def write_tokenizer(w, cfg, tokenizer, pre):
    """tokenizer: None for the minimal vocabulary, else dict(tokens, types, merges, bos, eos)."""
    if tokenizer is None:
        toks, types, merges, eos = minimal_vocab(cfg["vocab_size"])
        tokenizer = {"tokens": toks, "types": types, "merges": merges, "bos": eos, "eos": eos}
    w.add_str("tokenizer.ggml.model", "gpt2")
    w.add_str("tokenizer.ggml.pre", tokenizer.get("pre", pre))
    w.add_array("tokenizer.ggml.tokens", gw.STRING, tokenizer["tokens"])
    w.add_array("tokenizer.ggml.token_type", gw.I32, tokenizer["types"])
    w.add_array("tokenizer.ggml.merges", gw.STRING, tokenizer["merges"])
    w.add_u32("tokenizer.ggml.bos_token_id", tokenizer["bos"])
    w.add_u32("tokenizer.ggml.eos_token_id", tokenizer["eos"])
    w.add_u32("tokenizer.ggml.padding_token_id", tokenizer["eos"])
    w.add_bool("tokenizer.ggml.add_bos_token", False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("hf_dir")
    ap.add_argument("out")
    ap.add_argument("--type", default="f16", choices=sorted(FTYPE))
    args = ap.parse_args()
    cfg = json.load(open(os.path.join(args.hf_dir, "config.json")))
    import convert_gemma4  # Gemma 4 lives in its own module (F32/F16 without numpy)
    if convert_gemma4.is_gemma4(cfg):
        return convert_gemma4.write_gguf(args.hf_dir, args.out, args.type)
    arch = arch_of(cfg)
    if np is None and args.type != "f32" and arch != "qwen3moe":
        sys.exit(f"--type {args.type} needs numpy; without it only --type f32 can be written")
    sd = {}
    for f in sorted(os.listdir(args.hf_dir)):
        if not f.endswith(".safetensors"):
            continue
        path = os.path.join(args.hf_dir, f)
        if np is not None:
            from safetensors.numpy import load_file
            sd.update({k: v.astype(np.float32) for k, v in load_file(path).items()})
        else:
            sd.update(pytensor.load_safetensors(path))
    name = os.path.basename(args.hf_dir.rstrip("/"))
    if arch == "qwen35moe":
        import qwen35moe
        qwen35moe.write_gguf(args.out, cfg, sd, args.type, name=name)
    else:
        tj = os.path.join(args.hf_dir, "tokenizer.json")
        tok = hf_tokenizer(tj, cfg["vocab_size"]) if os.path.exists(tj) else None
        write_gguf(args.out, cfg, gguf_tensors(cfg, sd), args.type, name=name, tokenizer=tok)
    print(f"wrote {args.out} ({arch})")


def arch_of(cfg):
    """The GGUF architecture for a config.json."""
    mt = cfg.get("model_type", "")
    archs = cfg.get("architectures") or []
    if mt.startswith("qwen3_5_moe") or any(a.startswith("Qwen3_5Moe") for a in archs):
        return "qwen35moe"
    if mt == "qwen3_moe" or "Qwen3MoeForCausalLM" in archs or not (mt or archs):
        return "qwen3moe"
    raise SystemExit(f"unsupported model: model_type '{mt}', architectures {archs} "
                     "(supported: Qwen3MoeForCausalLM, Qwen3_5Moe*)")


if __name__ == "__main__":
    main()
