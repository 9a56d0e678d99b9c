"""convert_gemma4.py - Hugging Face Gemma 4 text model (Gemma4ForCausalLM, or the text part of
Gemma4ForConditionalGeneration) to GGUF arch `gemma4`, the way llama.cpp's converter writes it
(conversion/gemma.py Gemma4Model at llama.cpp 82bb485):

- keys: the Gemma-3 set (context, heads, rms eps, softcap, sliding_window, freq_base = the
  full-attention theta, freq_base_swa) plus key/value_length = the global head dim,
  key/value_length_swa = the sliding head dim, sliding_window_pattern (one bool per layer),
  head_count_kv per layer when global layers have their own count, rope.dimension_count = global
  head dim ("proportional" RoPE is done with rope_freqs), rope.dimension_count_swa,
  expert_feed_forward_length, shared_kv_layers, embedding_length_per_layer_input;
- tensors: norms are stored as they are (Gemma 4's RMSNorm multiplies by w, not 1 + w);
  router.proj -> ffn_gate_inp.weight, router.scale -> ffn_gate_inp.scale,
  router.per_expert_scale -> ffn_down_exps.scale, experts.gate_up_proj [E, 2*n_ff, n_embd] ->
  ffn_gate_up_exps {n_embd, 2*n_ff, E} (gate rows first), experts.down_proj -> ffn_down_exps,
  layer_scalar -> layer_output_scale.weight, plus the generated rope_freqs.weight
  [global_head_dim / 2]: 1 for the rotated pairs, 1e30 (angle 0) for the rest;
  lm_head is dropped when the embeddings are tied. Global layers with attention_k_eq_v have no
  attn_v (V = K before k_norm / RoPE).
- tokenizer: tokenizer.json's BPE vocabulary and merges when present, else a minimal 'gemma4'
  BPE vocabulary (specials, <0xNN> bytes, ▁ + letters) padded to vocab_size.

No numpy needed: safetensors are read with pytensor (safetensors.numpy when numpy is there) and
written as F32 (or F16) bytes.
"""
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_write as gw  # noqa: E402
import pytensor  # noqa: E402

ARCH = "gemma4"
TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_USER, TT_UNUSED, TT_BYTE = 1, 2, 3, 4, 5, 6
FTYPE = {"f32": 0, "f16": 1, "q8_0": 7}


def is_gemma4(cfg):
    mt = cfg.get("model_type", "")
    archs = cfg.get("architectures") or []
    return mt in ("gemma4", "gemma4_text") or any(a.startswith("Gemma4") for a in archs)


def text_config(cfg):
    return cfg["text_config"] if "text_config" in cfg else cfg


def layer_shapes(h):
    """Per layer: (is_swa, head_dim, n_head_kv), from layer_types and per_layer_config (or
    global_head_dim / num_global_key_value_heads as in the released configs)."""
    types = h.get("layer_types")
    n = h["num_hidden_layers"]
    if types is None:
        types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n)]
    plc = h.get("per_layer_config") or {}
    out = []
    for i, t in enumerate(types):
        swa = t == "sliding_attention"
        hd, kv = h.get("head_dim", 256), h.get("num_key_value_heads", 4)
        if not swa:
            hd = h.get("global_head_dim", hd if plc else 512)
            if h.get("num_global_key_value_heads") is not None and h.get("attention_k_eq_v", True):
                kv = h["num_global_key_value_heads"]
        o = plc.get(str(i), plc.get(i, {}))
        hd, kv = o.get("head_dim", hd), o.get("num_key_value_heads", kv)
        out.append((swa, hd, kv))
    return out


def minimal_vocab(n_vocab):
    toks = [("<pad>", TT_CONTROL), ("<eos>", TT_CONTROL), ("<bos>", TT_CONTROL), ("<unk>", TT_UNKNOWN),
            ("<mask>", TT_USER), ("<|turn>", TT_CONTROL), ("<turn|>", TT_CONTROL)]
    toks += [(f"<0x{b:02X}>", TT_BYTE) for b in range(256)]
    chars = ["\u2581"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + \
        [chr(c) for c in range(ord("A"), ord("Z") + 1)] + list("0123456789.,!?'\"-:;()\n")
    toks += [(c, TT_NORMAL) for c in chars]
    merges = []
    for a, b in [("\u2581", "t"), ("h", "e"), ("i", "n"), ("\u2581", "a"), ("r", "e"), ("o", "n"),
                 ("\u2581t", "he"), ("e", "r"), ("\u2581", "s"), ("a", "t")]:
        toks.append((a + b, TT_NORMAL))
        merges.append(f"{a} {b}")
    if len(toks) > n_vocab:
        raise ValueError(f"vocab_size {n_vocab} is too small for the minimal vocabulary ({len(toks)})")
    i = 0
    while len(toks) < n_vocab:
        toks.append((f"<unused{i}>", TT_UNUSED))
        i += 1
    return {"tokens": [t for t, _ in toks], "types": [k for _, k in toks], "scores": [0.0] * len(toks),
            "merges": merges, "bos": 2, "eos": 1, "pad": 0, "unk": 3}


def hf_vocab(hf_dir, n_vocab):
    """Vocabulary from tokenizer.json (BPE model + added tokens); None when absent."""
    p = os.path.join(hf_dir, "tokenizer.json")
    if not os.path.exists(p):
        return None
    tj = json.load(open(p, encoding="utf-8"))
    model = tj["model"]
    toks = [None] * n_vocab
    types = [TT_NORMAL] * n_vocab
    for t, i in model["vocab"].items():
        if i < n_vocab:
            toks[i] = t
            if len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
                types[i] = TT_BYTE
    for a in tj.get("added_tokens", []):
        if a["id"] < n_vocab:
            toks[a["id"]] = a["content"]
            types[a["id"]] = TT_CONTROL if a.get("special") else TT_USER
    for i, t in enumerate(toks):
        if t is None:
            toks[i], types[i] = f"<unused_pad{i}>", TT_UNUSED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    ids = {t: i for i, t in enumerate(toks)}
    return {"tokens": toks, "types": types, "scores": [0.0] * n_vocab, "merges": merges,
            "bos": ids.get("<bos>", 2), "eos": ids.get("<eos>", 1), "pad": ids.get("<pad>", 0),
            "unk": ids.get("<unk>", 3)}


def map_name(name, tied):
    """HF name (text part, 'model.' prefix) -> GGUF name, or None to drop."""
    if name == "lm_head.weight":
        return None if tied else "output.weight"
    simple = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    if name in simple:
        return simple[name]
    if not name.startswith("model.layers."):
        return None
    rest = name[len("model.layers."):]
    bid, sub = rest.split(".", 1)
    per = {
        "input_layernorm.weight": "attn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "self_attn.q_norm.weight": "attn_q_norm.weight",
        "self_attn.k_norm.weight": "attn_k_norm.weight",
        "post_attention_layernorm.weight": "post_attention_norm.weight",
        "pre_feedforward_layernorm.weight": "ffn_norm.weight",
        "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
        "router.proj.weight": "ffn_gate_inp.weight",
        "router.scale": "ffn_gate_inp.scale",
        "router.per_expert_scale": "ffn_down_exps.scale",
        "experts.gate_up_proj": "ffn_gate_up_exps.weight",
        "experts.down_proj": "ffn_down_exps.weight",
        "post_feedforward_layernorm_1.weight": "post_ffw_norm_1.weight",
        "post_feedforward_layernorm_2.weight": "post_ffw_norm_2.weight",
        "pre_feedforward_layernorm_2.weight": "pre_ffw_norm_2.weight",
        "layer_scalar": "layer_output_scale.weight",
    }
    if sub not in per:
        raise ValueError(f"{name}: no GGUF name for this tensor")
    return f"blk.{bid}.{per[sub]}"


def safetensors_dir(hf_dir):
    """(name, tensor) over every *.safetensors file of hf_dir: numpy arrays or pytensor.PyTensor."""
    files = sorted(f for f in os.listdir(hf_dir) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"{hf_dir}: no .safetensors files")
    for f in files:
        path = os.path.join(hf_dir, f)
        if gw.np is not None:
            from safetensors.numpy import load_file
            yield from load_file(path).items()
        else:
            yield from pytensor.load_safetensors(path).items()


def f32_bytes(t):
    if hasattr(t, "le_bytes"):
        return t.le_bytes()
    return gw.np.ascontiguousarray(t, dtype="<f4").tobytes()


def text_tensors(hf_dir):
    """(name, tensor) of the text model, names normalised to 'model.*' / 'lm_head.weight'."""
    for name, t in safetensors_dir(hf_dir):
        if name.startswith("model.language_model."):
            name = "model." + name[len("model.language_model."):]
        elif name.startswith(("model.vision", "model.audio", "model.embed_vision", "model.embed_audio")):
            continue
        yield name, t


def write_gguf(hf_dir, out_path, out_type="f32", name=None):
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    h = text_config(cfg)
    shapes = layer_shapes(h)
    n_layer = h["num_hidden_layers"]
    swa_hd = [hd for swa, hd, _ in shapes if swa]
    full_hd = [hd for swa, hd, _ in shapes if not swa]
    hd_swa = swa_hd[0] if swa_hd else h.get("head_dim", 256)
    hd_full = full_hd[0] if full_hd else hd_swa
    if any(x != hd_swa for x in swa_hd) or any(x != hd_full for x in full_hd):
        raise ValueError("every sliding (and every global) layer must have the same head_dim")
    if h.get("hidden_size_per_layer_input"):
        raise ValueError("per-layer input embeddings (Gemma 4 E2B/E4B) are not supported by this converter")
    if h.get("num_kv_shared_layers"):
        raise ValueError("num_kv_shared_layers > 0 is not supported by this converter")
    rp = h.get("rope_parameters") or {}
    full_rp, swa_rp = rp.get("full_attention", {}), rp.get("sliding_attention", {})
    tied = h.get("tie_word_embeddings", cfg.get("tie_word_embeddings", True))
    n_vocab = h["vocab_size"]

    w = gw.GGUFWriter(out_path)
    w.add_str("general.architecture", ARCH)
    w.add_str("general.name", name or os.path.basename(os.path.abspath(hf_dir)))
    w.add_u32(f"{ARCH}.block_count", n_layer)
    w.add_u32(f"{ARCH}.context_length", h.get("max_position_embeddings", 131072))
    w.add_u32(f"{ARCH}.embedding_length", h["hidden_size"])
    w.add_u32(f"{ARCH}.feed_forward_length", h["intermediate_size"])
    w.add_u32(f"{ARCH}.attention.head_count", h.get("num_attention_heads", 8))
    kvs = [kv for _, _, kv in shapes]
    if all(k == kvs[0] for k in kvs):
        w.add_u32(f"{ARCH}.attention.head_count_kv", kvs[0])
    else:
        w.add_array(f"{ARCH}.attention.head_count_kv", gw.I32, kvs)
    w.add_f32(f"{ARCH}.rope.freq_base", full_rp.get("rope_theta", 1_000_000.0))
    if "rope_theta" in swa_rp:
        w.add_f32(f"{ARCH}.rope.freq_base_swa", swa_rp["rope_theta"])
    w.add_f32(f"{ARCH}.attention.layer_norm_rms_epsilon", h.get("rms_norm_eps", 1e-6))
    if h.get("num_experts"):
        w.add_u32(f"{ARCH}.expert_count", h["num_experts"])
        w.add_u32(f"{ARCH}.expert_used_count", h["top_k_experts"])
    w.add_u32(f"{ARCH}.attention.key_length", hd_full)
    w.add_u32(f"{ARCH}.attention.value_length", hd_full)
    w.add_u32(f"{ARCH}.attention.key_length_swa", hd_swa)
    w.add_u32(f"{ARCH}.attention.value_length_swa", hd_swa)
    w.add_u32("general.file_type", FTYPE[out_type])
    w.add_u32("general.quantization_version", 2)
    if h.get("final_logit_softcapping"):
        w.add_f32(f"{ARCH}.final_logit_softcapping", h["final_logit_softcapping"])
    w.add_u32(f"{ARCH}.attention.sliding_window", h["sliding_window"])
    w.add_u32(f"{ARCH}.attention.shared_kv_layers", h.get("num_kv_shared_layers", 0))
    w.add_u32(f"{ARCH}.embedding_length_per_layer_input", h.get("hidden_size_per_layer_input") or 0)
    w.add_array(f"{ARCH}.attention.sliding_window_pattern", gw.BOOL, [swa for swa, _, _ in shapes])
    if h.get("moe_intermediate_size"):
        w.add_u32(f"{ARCH}.expert_feed_forward_length", h["moe_intermediate_size"])
    w.add_u32(f"{ARCH}.rope.dimension_count", hd_full)
    w.add_u32(f"{ARCH}.rope.dimension_count_swa", int(hd_swa * rp.get("partial_rotary_factor", 1.0)))

    voc = hf_vocab(hf_dir, n_vocab) or minimal_vocab(n_vocab)
    w.add_str("tokenizer.ggml.model", "gemma4")
    w.add_array("tokenizer.ggml.tokens", gw.STRING, voc["tokens"])
    w.add_array("tokenizer.ggml.scores", gw.F32, voc["scores"])
    w.add_array("tokenizer.ggml.token_type", gw.I32, voc["types"])
    w.add_array("tokenizer.ggml.merges", gw.STRING, voc["merges"])
    w.add_u32("tokenizer.ggml.bos_token_id", voc["bos"])
    w.add_u32("tokenizer.ggml.eos_token_id", voc["eos"])
    w.add_u32("tokenizer.ggml.unknown_token_id", voc["unk"])
    w.add_u32("tokenizer.ggml.padding_token_id", voc["pad"])
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_bool("tokenizer.ggml.add_space_prefix", False)
    tmpl = os.path.join(hf_dir, "chat_template.jinja")
    if os.path.exists(tmpl):
        w.add_str("tokenizer.chat_template", open(tmpl, encoding="utf-8").read())

    seen = set()
    for hf_name, t in text_tensors(hf_dir):
        g = map_name(hf_name, tied)
        if g is None:
            continue
        if g == "token_embd.weight" and t.shape[0] > n_vocab:
            raise ValueError(f"{hf_name}: {t.shape[0]} rows > vocab_size {n_vocab}")
        ne = list(reversed(t.shape))
        data = f32_bytes(t)
        typ = gw.GGML_F32
        if out_type != "f32" and len(t.shape) >= 2 and "ffn_gate_inp" not in g:
            typ = gw.GGML_F16 if out_type == "f16" else gw.GGML_Q8_0
            data = to_type(bytes(data), typ, ne, g)
        w.add_tensor_raw(g, ne, typ, data)
        seen.add(g)
    for il, (swa, _, _) in enumerate(shapes):
        need = ["attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]
        if swa or not h.get("attention_k_eq_v"):
            need.append("attn_v")
        for n in need:
            if f"blk.{il}.{n}.weight" not in seen:
                raise ValueError(f"{hf_dir}: tensor for blk.{il}.{n}.weight missing")
    if full_hd:
        # proportional RoPE on the global layers: rotate only the first pairs (see module doc)
        n_rot = int(hd_full * full_rp.get("partial_rotary_factor", 1.0) / 2)
        vals = [1.0] * n_rot + [1e30] * (hd_full // 2 - n_rot)
        w.add_tensor_raw("rope_freqs.weight", [len(vals)], gw.GGML_F32, struct.pack(f"<{len(vals)}f", *vals))
    w.write()


def to_type(f32, typ, ne, name):
    n = len(f32) // 4
    if typ == gw.GGML_F16:
        return struct.pack(f"<{n}e", *struct.unpack(f"<{n}f", f32))
    if gw.np is None:
        raise ValueError(f"{name}: q8_0 output needs numpy")
    return gw.quantize_q8_0(gw.np.frombuffer(f32, dtype="<f4").reshape(list(reversed(ne))))


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description="Gemma 4 (HF) -> GGUF gemma4")
    ap.add_argument("hf_dir")
    ap.add_argument("out")
    ap.add_argument("--type", default="f32", choices=sorted(FTYPE))
    a = ap.parse_args(argv)
    write_gguf(a.hf_dir, a.out, a.type)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
