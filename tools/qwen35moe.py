"""qwen35moe.py - the Qwen3.5-MoE (Qwen3.5/3.6-35B-A3B, ...) recipe of convert_hf_to_gguf.py.

Writes what llama.cpp's converter writes for arch `qwen35moe` (same keys, tensor names, shapes and
value transforms), so llama.cpp and hotmoe load the same file:
  - Qwen3.5's RMSNorms compute x * (1 + w): every `*norm.weight` except the gated DeltaNet norm
    (linear_attn.norm) is stored as w + 1;
  - A_log -> ssm_a = -exp(A_log); dt_bias -> ssm_dt.bias; conv1d [C, 1, K] -> ssm_conv1d [C, K];
  - DeltaNet V heads: HF groups them by K head (k0: v0..v{r-1}, k1: ...); the GGUF holds them tiled
    (v head j uses k head j % n_k_heads), so the V rows of in_proj_qkv, in_proj_z, in_proj_a/b,
    A_log, dt_bias, the V channels of conv1d and the columns of out_proj are permuted alike;
  - in_proj_qkv -> attn_qkv, in_proj_z -> attn_gate, in_proj_b -> ssm_beta, in_proj_a ->
    ssm_alpha, out_proj -> ssm_out, linear_attn.norm -> ssm_norm;
  - full attention's q_proj keeps its per-head [q | gate] interleave (attn_q is 2 * n_head * hd);
  - post_attention_layernorm -> post_attention_norm; experts' gate_up_proj split into
    ffn_gate_exps / ffn_up_exps; shared expert -> ffn_{gate,up,down}_shexp, its sigmoid gate
    -> ffn_gate_inp_shexp;
  - rope.dimension_sections defaults to [11, 11, 10, 0] (interleaved M-RoPE); MTP layers
    (mtp.*) are not converted.
Multimodal checkpoints (model.language_model.*, text_config) are reduced to the text model.
"""
import gguf_write as gw
import pytensor as T
from convert_hf_to_gguf import FTYPE, GGML, write_tokenizer

ARCH = "qwen35moe"


def text_config(cfg):
    return {**cfg, **cfg.get("text_config", {})}


def _v_perm(n_k, n_v, hd):
    """Row permutation grouped -> tiled over n_v heads of hd rows: new row (r, k, d) <- old (k, r, d)."""
    r_per_k = n_v // n_k
    return [(k * r_per_k + r) * hd + d for r in range(r_per_k) for k in range(n_k) for d in range(hd)]


def gguf_tensors(cfg, sd):
    """{gguf name: tensor} in GGUF order (numpy arrays or PyTensors, row-major)."""
    c = text_config(cfg)
    sd = {k.replace("model.language_model.", "model.", 1): v for k, v in sd.items()}
    L, E = c["num_hidden_layers"], c["num_experts"]
    n_k, n_v = c["linear_num_key_heads"], c["linear_num_value_heads"]
    hk, hv = c["linear_key_head_dim"], c["linear_value_head_dim"]
    if n_v % n_k:
        raise ValueError(f"linear_num_value_heads {n_v} is not a multiple of linear_num_key_heads {n_k}")
    vperm = _v_perm(n_k, n_v, hv)
    hperm = _v_perm(n_k, n_v, 1)
    qk = 2 * n_k * hk
    chan_perm = list(range(qk)) + [qk + i for i in vperm]
    types = c.get("layer_types") or ["full_attention" if (i + 1) % c.get("full_attention_interval", 4) == 0
                                     else "linear_attention" for i in range(L)]

    def get(name):
        if name not in sd:
            raise KeyError(f"missing tensor {name}")
        return sd[name]

    out = {"token_embd.weight": get("model.embed_tokens.weight")}
    for i in range(L):
        p, b = f"model.layers.{i}", f"blk.{i}"
        out[f"{b}.attn_norm.weight"] = T.plus_one(get(f"{p}.input_layernorm.weight"))
        out[f"{b}.post_attention_norm.weight"] = T.plus_one(get(f"{p}.post_attention_layernorm.weight"))
        if types[i] == "full_attention":
            a = f"{p}.self_attn"
            out[f"{b}.attn_q.weight"] = get(f"{a}.q_proj.weight")
            out[f"{b}.attn_k.weight"] = get(f"{a}.k_proj.weight")
            out[f"{b}.attn_v.weight"] = get(f"{a}.v_proj.weight")
            out[f"{b}.attn_output.weight"] = get(f"{a}.o_proj.weight")
            out[f"{b}.attn_q_norm.weight"] = T.plus_one(get(f"{a}.q_norm.weight"))
            out[f"{b}.attn_k_norm.weight"] = T.plus_one(get(f"{a}.k_norm.weight"))
        else:
            a = f"{p}.linear_attn"
            out[f"{b}.attn_qkv.weight"] = T.take(get(f"{a}.in_proj_qkv.weight"), 0, chan_perm)
            out[f"{b}.attn_gate.weight"] = T.take(get(f"{a}.in_proj_z.weight"), 0, vperm)
            out[f"{b}.ssm_conv1d.weight"] = T.take(T.squeeze(get(f"{a}.conv1d.weight")), 0, chan_perm)
            out[f"{b}.ssm_dt.bias"] = T.take(get(f"{a}.dt_bias"), 0, hperm)
            out[f"{b}.ssm_a"] = T.take(T.neg_exp(get(f"{a}.A_log")), 0, hperm)
            out[f"{b}.ssm_beta.weight"] = T.take(get(f"{a}.in_proj_b.weight"), 0, hperm)
            out[f"{b}.ssm_alpha.weight"] = T.take(get(f"{a}.in_proj_a.weight"), 0, hperm)
            out[f"{b}.ssm_norm.weight"] = get(f"{a}.norm.weight")
            out[f"{b}.ssm_out.weight"] = T.take(get(f"{a}.out_proj.weight"), 1, vperm)
        m = f"{p}.mlp"
        out[f"{b}.ffn_gate_inp.weight"] = get(f"{m}.gate.weight")
        if f"{m}.experts.gate_up_proj" in sd:
            gu = get(f"{m}.experts.gate_up_proj")  # [E, 2 * n_ff, n_embd]
            n_ff = T.shape(gu)[1] // 2
            if T.shape(gu)[0] != E or T.shape(gu)[1] != 2 * n_ff:
                raise ValueError(f"{m}.experts.gate_up_proj: unexpected shape {T.shape(gu)}")
            out[f"{b}.ffn_gate_exps.weight"] = T.rows(gu, 0, n_ff, axis=1)
            out[f"{b}.ffn_up_exps.weight"] = T.rows(gu, n_ff, 2 * n_ff, axis=1)
            out[f"{b}.ffn_down_exps.weight"] = get(f"{m}.experts.down_proj")  # [E, n_embd, n_ff]
        else:  # one Linear per expert: numpy only (real checkpoints)
            import numpy as np
            for w, g in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")):
                out[f"{b}.ffn_{g}_exps.weight"] = np.stack([get(f"{m}.experts.{e}.{w}.weight") for e in range(E)])
        out[f"{b}.ffn_gate_inp_shexp.weight"] = get(f"{m}.shared_expert_gate.weight")
        out[f"{b}.ffn_gate_shexp.weight"] = get(f"{m}.shared_expert.gate_proj.weight")
        out[f"{b}.ffn_up_shexp.weight"] = get(f"{m}.shared_expert.up_proj.weight")
        out[f"{b}.ffn_down_shexp.weight"] = get(f"{m}.shared_expert.down_proj.weight")
    out["output_norm.weight"] = T.plus_one(get("model.norm.weight"))
    if "lm_head.weight" in sd and not c.get("tie_word_embeddings", False):
        out["output.weight"] = sd["lm_head.weight"]
    return out


def write_gguf(path, cfg, sd, out_type="f32", name="qwen35moe", tokenizer=None):
    c = text_config(cfg)
    rp = c.get("rope_parameters") or {}
    a = ARCH
    w = gw.GGUFWriter(path)
    w.add_str("general.architecture", a)
    w.add_str("general.name", name)
    w.add_u32(f"{a}.block_count", c["num_hidden_layers"])
    w.add_u32(f"{a}.context_length", c["max_position_embeddings"])
    w.add_u32(f"{a}.embedding_length", c["hidden_size"])
    if "intermediate_size" in c:
        w.add_u32(f"{a}.feed_forward_length", c["intermediate_size"])
    w.add_u32(f"{a}.attention.head_count", c["num_attention_heads"])
    w.add_u32(f"{a}.attention.head_count_kv", c["num_key_value_heads"])
    w.add_f32(f"{a}.rope.freq_base", rp.get("rope_theta", c.get("rope_theta", 10000.0)))
    w.add_f32(f"{a}.attention.layer_norm_rms_epsilon", c["rms_norm_eps"])
    w.add_u32(f"{a}.expert_count", c["num_experts"])
    w.add_u32(f"{a}.expert_used_count", c["num_experts_per_tok"])
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    w.add_u32(f"{a}.attention.key_length", head_dim)
    w.add_u32(f"{a}.attention.value_length", head_dim)
    w.add_u32("general.file_type", FTYPE[out_type])
    w.add_u32(f"{a}.expert_feed_forward_length", c["moe_intermediate_size"])
    w.add_u32(f"{a}.expert_shared_feed_forward_length", c["shared_expert_intermediate_size"])
    w.add_u32(f"{a}.ssm.conv_kernel", c["linear_conv_kernel_dim"])
    w.add_u32(f"{a}.ssm.state_size", c["linear_key_head_dim"])
    w.add_u32(f"{a}.ssm.group_count", c["linear_num_key_heads"])
    w.add_u32(f"{a}.ssm.time_step_rank", c["linear_num_value_heads"])
    w.add_u32(f"{a}.ssm.inner_size", c["linear_value_head_dim"] * c["linear_num_value_heads"])
    w.add_u32(f"{a}.full_attention_interval", c.get("full_attention_interval", 4))
    prf = rp.get("partial_rotary_factor", c.get("partial_rotary_factor", 0.25))
    w.add_u32(f"{a}.rope.dimension_count", int(head_dim * prf))
    sections = list(rp.get("mrope_section", [11, 11, 10])) + [0, 0, 0, 0]
    w.add_array(f"{a}.rope.dimension_sections", gw.I32, sections[:4])
    w.add_u32("general.quantization_version", 2)
    write_tokenizer(w, c, tokenizer, "qwen35")
    for n, t in gguf_tensors(cfg, sd).items():
        nd = len(T.shape(t))
        keep_f32 = nd < 2 or n.endswith("norm.weight") or "ffn_gate_inp" in n or "ssm_conv1d" in n
        w.add_tensor(n, t, gw.GGML_F32 if keep_f32 or out_type == "f32" else GGML[out_type])
    w.write()
