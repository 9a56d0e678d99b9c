#!/usr/bin/env python3
"""make_fuzz_seeds.py - the smallest models each architecture loads, as fuzz seeds.

Writes fuzz/corpus/model/{qwen3moe,qwen35moe,gemma4}.gguf (a few KB each): every GGUF key the
arch's load and the tokenizer read, every tensor it binds, F32 with tiny shapes (n_embd 8, two
heads, two experts, a handful of tokens and merges). fuzz_model.c loads them; libFuzzer then
mutates their header values and tensor table. Also writes fuzz/gguf.dict, the libFuzzer
dictionary of both targets: every key the seeds hold (bare and with its GGUF u64 length prefix,
so the mutator can swap one key for another), the value type tags and the float and integer
values that break arithmetic (NaN, inf, 0, -1, 2^31, 2^63). Deterministic: the same files every
run.

usage: tools/make_fuzz_seeds.py [CORPUS_DIR [DICT]]   (default fuzz/corpus/model, fuzz/gguf.dict)
"""
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_write as gw  # noqa: E402

E, H, KV, HD, X, K, FF = 8, 2, 1, 4, 2, 1, 4


def vals(n, seed):
    """n small deterministic floats (an LCG), F32 bytes."""
    s = seed & 0xFFFFFFFF
    out = []
    for _ in range(n):
        s = (s * 1103515245 + 12345) & 0x7FFFFFFF
        out.append(((s >> 8) % 2001 - 1000) / 4000.0)
    return struct.pack(f"<{n}f", *out)


KEYS = []  # every key any seed writes, in order, for the dictionary


class Model:
    def __init__(self, path, arch):
        self.w = gw.GGUFWriter(path)
        self.arch = arch
        self.seed = 1
        self.w.add_str("general.architecture", arch)
        self.w.add_str("general.name", f"{arch}-fuzz-seed")

    def u32(self, k, v): self.w.add_u32(f"{self.arch}.{k}", v)
    def f32(self, k, v): self.w.add_f32(f"{self.arch}.{k}", v)

    def t(self, name, *ne, ones=False):
        n = 1
        for d in ne:
            n *= d
        self.seed += 1
        data = struct.pack(f"<{n}f", *([1.0] * n)) if ones else vals(n, self.seed)
        self.w.add_tensor_raw(name, list(ne), gw.GGML_F32, data)

    def norm(self, name, n): self.t(name, n, ones=True)

    def moe(self, il, gate_up_fused=False):
        b = f"blk.{il}."
        self.t(b + "ffn_gate_inp.weight", E, X)
        if gate_up_fused:
            self.t(b + "ffn_gate_up_exps.weight", E, 2 * FF, X)
        else:
            self.t(b + "ffn_gate_exps.weight", E, FF, X)
            self.t(b + "ffn_up_exps.weight", E, FF, X)
        self.t(b + "ffn_down_exps.weight", FF, E, X)

    def bpe_vocab(self, pre):
        # byte-level BPE: single letters, a space ("Ġ"), merged pairs, an end token
        toks = ["a", "b", "c", "Ġ", "ab", "abc", "Ġa", "<|end|>"]
        self.w.add_str("tokenizer.ggml.model", "gpt2")
        self.w.add_str("tokenizer.ggml.pre", pre)
        self.w.add_array("tokenizer.ggml.tokens", gw.STRING, toks)
        self.w.add_array("tokenizer.ggml.token_type", gw.I32, [1] * 7 + [3])
        self.w.add_array("tokenizer.ggml.merges", gw.STRING, ["a b", "ab c", "Ġ a"])
        self.w.add_u32("tokenizer.ggml.bos_token_id", 7)
        self.w.add_u32("tokenizer.ggml.eos_token_id", 7)
        self.w.add_u32("tokenizer.ggml.eot_token_id", 7)
        self.w.add_u32("tokenizer.ggml.padding_token_id", 7)
        self.w.add_u32("tokenizer.ggml.unknown_token_id", 0)
        self.w.add_bool("tokenizer.ggml.add_bos_token", False)
        # recognised by the family detection (chatml); </think> and <tool_response> turn its options on
        self.w.add_str("tokenizer.chat_template", "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                       "<|im_end|>\n{% endfor %}{# </think> <tool_response> enable_thinking #}")
        return len(toks)

    def write(self):
        for k, _ in self.w.kv:
            if k not in KEYS:
                KEYS.append(k)
        self.w.write()


def esc(b):
    return "".join(chr(c) if 32 <= c < 127 and c not in (34, 92) else f"\\x{c:02x}" for c in b)


def write_dict(path):
    lines = ["# gguf.dict - libFuzzer dictionary for fuzz_gguf and fuzz_model, written by",
             "# tools/make_fuzz_seeds.py (do not edit): the GGUF keys the archs and the tokenizer read,",
             "# bare and with their u64 length prefix, value type tags, and values that break arithmetic."]
    extra = ["qwen3moe.rope.scaling.type", "tokenizer.ggml.pre", "general.alignment"]
    for k in KEYS + [k for k in extra if k not in KEYS]:
        kb = k.encode()
        lines.append(f'"{esc(kb)}"')
        lines.append(f'"{esc(struct.pack("<Q", len(kb)) + kb)}"')
    for t in range(13):
        lines.append(f'"{esc(struct.pack("<I", t))}"')
    for v in [0, 1, 0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, 65535, 65536]:
        lines.append(f'"{esc(struct.pack("<I", v))}"')
    for v in [0xFFFFFFFFFFFFFFFF, 0x7FFFFFFFFFFFFFFF, 0x8000000000000000, 1 << 32]:
        lines.append(f'"{esc(struct.pack("<Q", v))}"')
    for f in [float("nan"), float("inf"), -float("inf"), 0.0, -1.0, 1e-45, 3.4e38]:
        lines.append(f'"{esc(struct.pack("<f", f))}"')
    lines += ['"GGUF"', '"gpt2"', '"llama"', '"gemma4"', '"qwen2"', '"qwen35"', '"<|im_start|>"', '"<|turn>"',
              '"</think>"', '"<tool_response>"', '"enable_thinking"']
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def qwen3moe(path):
    m = Model(path, "qwen3moe")
    for k, v in [("block_count", 1), ("context_length", 64), ("embedding_length", E), ("feed_forward_length", 16),
                 ("attention.head_count", H), ("attention.head_count_kv", KV), ("attention.key_length", HD),
                 ("attention.value_length", HD), ("rope.dimension_count", HD), ("expert_count", X),
                 ("expert_used_count", K), ("expert_feed_forward_length", FF)]:
        m.u32(k, v)
    m.f32("rope.freq_base", 10000.0)
    m.f32("attention.layer_norm_rms_epsilon", 1e-6)
    m.w.add_str("qwen3moe.rope.scaling.type", "none")
    nv = m.bpe_vocab("qwen2")
    m.t("token_embd.weight", E, nv)
    m.norm("output_norm.weight", E)
    m.t("output.weight", E, nv)
    b = "blk.0."
    m.norm(b + "attn_norm.weight", E)
    m.t(b + "attn_q.weight", E, H * HD)
    m.t(b + "attn_k.weight", E, KV * HD)
    m.t(b + "attn_v.weight", E, KV * HD)
    m.t(b + "attn_output.weight", H * HD, E)
    m.norm(b + "attn_q_norm.weight", HD)
    m.norm(b + "attn_k_norm.weight", HD)
    m.norm(b + "ffn_norm.weight", E)
    m.moe(0)
    m.write()


def qwen35moe(path):
    # layer 0 Gated DeltaNet, layer 1 gated attention (full_attention_interval 2)
    NK, DK, NV, DV, DCONV, FFSH = 1, 2, 2, 2, 2, 4
    conv = 2 * NK * DK + NV * DV
    m = Model(path, "qwen35moe")
    for k, v in [("block_count", 2), ("context_length", 64), ("embedding_length", E), ("attention.head_count", H),
                 ("attention.head_count_kv", KV), ("attention.key_length", HD), ("attention.value_length", HD),
                 ("rope.dimension_count", 2), ("expert_count", X), ("expert_used_count", K),
                 ("expert_feed_forward_length", FF), ("expert_shared_feed_forward_length", FFSH),
                 ("ssm.conv_kernel", DCONV), ("ssm.state_size", DK), ("ssm.group_count", NK),
                 ("ssm.time_step_rank", NV), ("ssm.inner_size", NV * DV), ("full_attention_interval", 2)]:
        m.u32(k, v)
    m.f32("rope.freq_base", 10000.0)
    m.f32("attention.layer_norm_rms_epsilon", 1e-6)
    m.w.add_array("qwen35moe.rope.dimension_sections", gw.I32, [1, 0, 0, 0])
    nv = m.bpe_vocab("qwen35")
    m.t("token_embd.weight", E, nv)
    m.norm("output_norm.weight", E)
    m.t("output.weight", E, nv)
    for il in range(2):
        b = f"blk.{il}."
        m.norm(b + "attn_norm.weight", E)
        m.norm(b + "post_attention_norm.weight", E)
        if il == 0:
            m.t(b + "attn_qkv.weight", E, conv)
            m.t(b + "attn_gate.weight", E, NV * DV)
            m.t(b + "ssm_conv1d.weight", DCONV, conv)
            m.t(b + "ssm_dt.bias", NV)
            m.t(b + "ssm_a", NV)
            m.t(b + "ssm_beta.weight", E, NV)
            m.t(b + "ssm_alpha.weight", E, NV)
            m.norm(b + "ssm_norm.weight", DV)
            m.t(b + "ssm_out.weight", NV * DV, E)
        else:
            m.t(b + "attn_q.weight", E, 2 * H * HD)
            m.t(b + "attn_k.weight", E, KV * HD)
            m.t(b + "attn_v.weight", E, KV * HD)
            m.t(b + "attn_output.weight", H * HD, E)
            m.norm(b + "attn_q_norm.weight", HD)
            m.norm(b + "attn_k_norm.weight", HD)
        m.moe(il)
        m.t(b + "ffn_gate_inp_shexp.weight", E, 1)
        m.t(b + "ffn_gate_shexp.weight", E, FFSH)
        m.t(b + "ffn_up_shexp.weight", E, FFSH)
        m.t(b + "ffn_down_shexp.weight", FFSH, E)
    m.write()


def gemma4(path):
    # layer 0 sliding (head dim 4), layer 1 global (head dim 8)
    HD_SWA, HD_FULL, NFF = 4, 8, 8
    m = Model(path, "gemma4")
    for k, v in [("block_count", 2), ("context_length", 64), ("embedding_length", E), ("feed_forward_length", NFF),
                 ("attention.head_count", H), ("attention.head_count_kv", KV), ("attention.key_length", HD_FULL),
                 ("attention.value_length", HD_FULL), ("attention.key_length_swa", HD_SWA),
                 ("attention.value_length_swa", HD_SWA), ("attention.sliding_window", 4),
                 ("attention.shared_kv_layers", 0), ("embedding_length_per_layer_input", 0),
                 ("rope.dimension_count", HD_FULL), ("rope.dimension_count_swa", HD_SWA), ("expert_count", X),
                 ("expert_used_count", K), ("expert_feed_forward_length", FF)]:
        m.u32(k, v)
    m.f32("rope.freq_base", 1000000.0)
    m.f32("rope.freq_base_swa", 10000.0)
    m.f32("attention.layer_norm_rms_epsilon", 1e-6)
    m.f32("final_logit_softcapping", 30.0)
    m.w.add_array("gemma4.attention.sliding_window_pattern", gw.BOOL, [True, False])
    toks = ["<pad>", "<eos>", "<bos>", "<unk>", "a", "b", "ab", "\u2581", "\u2581a", "<end_of_turn>"]
    m.w.add_str("tokenizer.ggml.model", "gemma4")
    m.w.add_array("tokenizer.ggml.tokens", gw.STRING, toks)
    m.w.add_array("tokenizer.ggml.scores", gw.F32, [0.0] * len(toks))
    m.w.add_array("tokenizer.ggml.token_type", gw.I32, [3, 3, 3, 2, 1, 1, 1, 1, 1, 3])
    m.w.add_array("tokenizer.ggml.merges", gw.STRING, ["a b", "\u2581 a"])
    m.w.add_u32("tokenizer.ggml.bos_token_id", 2)
    m.w.add_u32("tokenizer.ggml.eos_token_id", 1)
    m.w.add_u32("tokenizer.ggml.unknown_token_id", 3)
    m.w.add_u32("tokenizer.ggml.padding_token_id", 0)
    m.w.add_bool("tokenizer.ggml.add_bos_token", True)
    m.w.add_bool("tokenizer.ggml.add_space_prefix", False)
    m.w.add_str("tokenizer.chat_template", "{{ bos_token }}<|turn>user\n{{ content }}<turn|>\n<|turn>model\n")
    nv = len(toks)
    m.t("token_embd.weight", E, nv)
    m.norm("output_norm.weight", E)
    m.norm("rope_freqs.weight", HD_FULL // 2)
    for il, hd in enumerate([HD_SWA, HD_FULL]):
        b = f"blk.{il}."
        m.norm(b + "attn_norm.weight", E)
        m.t(b + "attn_q.weight", E, H * hd)
        m.t(b + "attn_k.weight", E, KV * hd)
        m.t(b + "attn_v.weight", E, KV * hd)
        m.t(b + "attn_output.weight", H * hd, E)
        m.norm(b + "attn_q_norm.weight", hd)
        m.norm(b + "attn_k_norm.weight", hd)
        m.norm(b + "post_attention_norm.weight", E)
        m.norm(b + "ffn_norm.weight", E)
        m.t(b + "ffn_gate.weight", E, NFF)
        m.t(b + "ffn_up.weight", E, NFF)
        m.t(b + "ffn_down.weight", NFF, E)
        m.norm(b + "post_ffw_norm.weight", E)
        m.norm(b + "layer_output_scale.weight", 1)
        m.norm(b + "ffn_gate_inp.scale", E)
        m.norm(b + "pre_ffw_norm_2.weight", E)
        m.norm(b + "post_ffw_norm_1.weight", E)
        m.norm(b + "post_ffw_norm_2.weight", E)
        m.norm(b + "ffn_down_exps.scale", X)
        m.moe(il, gate_up_fused=True)
    m.write()


def main():
    fuzz = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz")
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(fuzz, "corpus", "model")
    dict_path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(fuzz, "gguf.dict")
    os.makedirs(out, exist_ok=True)
    for name, fn in [("qwen3moe", qwen3moe), ("qwen35moe", qwen35moe), ("gemma4", gemma4)]:
        fn(os.path.join(out, name + ".gguf"))
    write_dict(dict_path)


if __name__ == "__main__":
    main()
