"""train.py - train hotmoe's tiny qwen3moe on the accelerator box in one run (see README.md).

Stages, all under one wall-clock deadline (--budget seconds from start):
  1. smoke pass: a quick tokenizer from a few MB, a freshly initialised model, then the whole
     export -> convert (tools/convert_hf_to_gguf.py, Q8_0 and F32) -> reload -> perplexity ->
     sample -> split path, so a bug there fails in the first half minute, not after training;
  2. corpus: Python sources (stdlib + site-packages) and English prose (.md/.rst/.txt, package
     METADATA, /usr/share/doc), deduplicated, sorted, capped; 1 % of files held out by path hash;
  3. tokenizer: byte-level BPE (Qwen2 split regex + ByteLevel), 8192 tokens, <|endoftext|> = id 0;
  4. training: transformers Qwen3MoeForCausalLM, router aux loss on, bf16 autocast, AdamW, cosine
     schedule over wall time (--train-seconds, shortened if the earlier stages ran long);
  5. export to GGUF Q8_0 (and F32), perplexity exactly as `hotmoe perplexity` computes it for the
     fp32 model and for the model carrying the Q8_0 GGUF's own (dequantized) weights, samples.

Only OUT comes back: eval.json, loss.tsv, heldout.txt, tokenizer.json and the Q8_0 GGUF split into
<= 15 MiB pieces (model-q8_0.gguf.partNN; `cat` them in order; sha256 in eval.json).

Usage: python3 -u train.py --out OUT [--train-seconds 360] [--budget 525]
"""
import argparse
import copy
import gzip
import hashlib
import json
import math
import os
import subprocess
import sys
import time
import types

T0 = time.time()
HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS = os.path.dirname(HERE)
sys.path.insert(0, TOOLS)
sys.path.insert(0, os.path.join(TOOLS, "fixtures"))

QWEN2_SPLIT = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
               "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
EOT = "<|endoftext|>"
N_CTX = 512
SEED = 1234
PIECE = 15 * 1024 * 1024
GGUF_MAX = 30 * 1000 * 1000

CONFIG = dict(vocab_size=8192, hidden_size=256, intermediate_size=128, moe_intermediate_size=128,
              num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
              num_experts=32, num_experts_per_tok=4, norm_topk_prob=True, decoder_sparse_step=1,
              mlp_only_layers=[], rope_theta=10000.0, rms_norm_eps=1e-6, max_position_embeddings=N_CTX,
              tie_word_embeddings=False, hidden_act="silu", attention_bias=False,
              output_router_logits=True, router_aux_loss_coef=0.01, initializer_range=0.02,
              bos_token_id=0, eos_token_id=0, pad_token_id=0)


def log(msg):
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def die(msg):
    log("FAILED: " + msg)
    sys.exit(1)


def hkey(s):
    """Deterministic 64-bit key of a string (held-out split, selection order)."""
    return int.from_bytes(hashlib.sha1(s.encode("utf-8", "surrogateescape")).digest()[:8], "big")


# ---------------------------------------------------------------- corpus

SKIP_NAMES = ("license", "licence", "copying", "notice", "authors", "requirements", "entry_points",
              "top_level", "dependency_links", "sources", "record", "installed-files", "namespace_packages")


def prose_ok(text):
    """Reject data files dressed as .txt: mostly letters/spaces and lines of some length."""
    n = len(text)
    if n < 300:
        return False
    sample = text[:20000]
    letters = sum(c.isalpha() or c == " " for c in sample)
    lines = [ln for ln in sample.splitlines() if ln.strip()]
    return letters >= 0.7 * len(sample) and lines and len(sample) / len(lines) >= 20


def kind_of(path, root_is_doc):
    """'code', 'prose' or None for a file path."""
    base = os.path.basename(path)
    low = base.lower()
    if low.endswith(".gz"):
        if not root_is_doc:
            return None
        low = low[:-3]
    if low.endswith(".py") and not root_is_doc:
        return "code"
    if any(low.startswith(s) for s in SKIP_NAMES):
        return None
    if low.endswith((".md", ".rst", ".txt")):
        return "prose"
    if base == "METADATA" and path.endswith(".dist-info/METADATA"):
        return "prose"
    if root_is_doc and (low.startswith("readme") or low.startswith("news")):
        return "prose"
    return None


def read_text(path, kind, max_bytes):
    try:
        if os.path.getsize(path) > max_bytes * (4 if path.endswith(".gz") else 1):
            return None
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                raw = f.read(max_bytes + 1)
        else:
            with open(path, "rb") as f:
                raw = f.read(max_bytes + 1)
    except (OSError, EOFError, gzip.BadGzipFile):
        return None
    if len(raw) > max_bytes or len(raw) < 200 or b"\0" in raw:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    text = text.replace(EOT, "<|end_of_text|>").replace("\r\n", "\n")
    if path.endswith("METADATA"):  # the long description after the RFC 822 header
        parts = text.split("\n\n", 1)
        text = parts[1] if len(parts) == 2 else ""
    if kind == "prose" and not prose_ok(text):
        return None
    return text


def corpus_roots():
    import site
    import sysconfig
    roots = []
    for p in [sysconfig.get_paths().get("stdlib")] + list(site.getsitepackages()) + \
             [sysconfig.get_paths().get("purelib"), sysconfig.get_paths().get("platlib"),
              getattr(site, "getusersitepackages", lambda: None)(), "/usr/lib/python3/dist-packages"]:
        if p and os.path.isdir(p):
            roots.append((os.path.realpath(p), False))
    if os.path.isdir("/usr/share/doc"):
        roots.append(("/usr/share/doc", True))
    out, seen = [], set()
    for r in roots:
        if r[0] not in seen:
            seen.add(r[0])
            out.append(r)
    return out


def gather(caps, max_file, time_limit):
    """Walk the roots (sorted), then take files in path-hash order until each kind's cap.
    Returns (docs [(key, kind, path, text)], stats)."""
    cand, seen_real = [], set()
    for root, is_doc in corpus_roots():
        n0 = len(cand)
        for d, dirs, files in os.walk(root):
            dirs.sort()
            dirs[:] = [x for x in dirs if x not in ("__pycache__", ".git", "site-packages", "dist-packages")]
            for f in sorted(files):
                p = os.path.join(d, f)
                k = kind_of(p, is_doc)
                if not k or os.path.islink(p):
                    continue
                rp = os.path.realpath(p)
                if rp in seen_real:
                    continue
                seen_real.add(rp)
                cand.append((hkey(rp), k, rp))
        log(f"corpus root {root}: {len(cand) - n0} candidate files")
    cand.sort()
    docs, seen_hash = [], set()
    stats = {k: {"files": 0, "bytes": 0, "cap": caps[k]} for k in caps}
    t = time.time()
    for key, k, p in cand:
        if stats[k]["bytes"] >= caps[k]:
            continue
        if time.time() - t > time_limit:
            log(f"corpus: time limit {time_limit}s reached, stopping early")
            stats["stopped_early"] = True
            break
        text = read_text(p, k, max_file[k])
        if text is None:
            continue
        h = hashlib.sha1(text.encode("utf-8")).digest()
        if h in seen_hash:
            continue
        seen_hash.add(h)
        docs.append((key, k, p, text))
        stats[k]["files"] += 1
        stats[k]["bytes"] += len(text.encode("utf-8"))
    by_root, roots = {}, [r for r, _ in corpus_roots()]
    for _, k, p, text in docs:
        top = next((r for r in roots if p.startswith(r + "/")), "other")
        e = by_root.setdefault(f"{k} {top}", [0, 0])
        e[0] += 1
        e[1] += len(text)
    stats["by_root"] = {r: {"files": v[0], "chars": v[1]} for r, v in sorted(by_root.items())}
    return docs, stats


# ---------------------------------------------------------------- tokenizer

def train_tokenizer(texts, vocab_size):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[EOT],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=tr)
    if tok.token_to_id(EOT) != 0:
        die(f"{EOT} has id {tok.token_to_id(EOT)}, expected 0")
    return tok


def encode_all(tok, texts, np):
    enc = getattr(tok, "encode_batch_fast", None) or tok.encode_batch
    out = []
    for i in range(0, len(texts), 2000):
        out += [np.asarray(e.ids, dtype=np.uint16) for e in enc(texts[i:i + 2000], add_special_tokens=False)]
    return out


def heldout_text(tok, docs, target_tokens):
    """Held-out documents (path-hash order), each cut to 6000 chars at a line end, joined by blank
    lines until about target_tokens; returns (text, token ids of exactly that text)."""
    parts, n = [], 0
    for text in docs:
        t = text[:6000]
        if len(text) > 6000 and "\n" in t:
            t = t[:t.rindex("\n") + 1]
        t = t.strip("\n")
        if not t:
            continue
        parts.append(t)
        n += len(tok.encode(t, add_special_tokens=False).ids)
        if n >= target_tokens:
            break
    text = "\n\n".join(parts) + "\n"
    return text, tok.encode(text, add_special_tokens=False).ids


# ---------------------------------------------------------------- model

def make_model(torch, vocab_size):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    c = dict(CONFIG, vocab_size=vocab_size)
    cfg = Qwen3MoeConfig(**c)
    cfg._attn_implementation = "sdpa"
    cfg._experts_implementation = "eager"
    torch.manual_seed(SEED)
    model = Qwen3MoeForCausalLM(cfg)
    for k in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "head_dim", "norm_topk_prob",
              "router_aux_loss_coef", "output_router_logits", "tie_word_embeddings"):
        if getattr(cfg, k) != c[k]:
            die(f"config field {k}: {getattr(cfg, k)!r} != {c[k]!r}")
    sd = model.state_dict()
    gu = sd.get("model.layers.0.mlp.experts.gate_up_proj")
    if gu is not None:
        want = (c["num_experts"], 2 * c["moe_intermediate_size"], c["hidden_size"])
        if tuple(gu.shape) != want or getattr(model.model.layers[0].mlp.experts, "experts_are_transposed", False):
            die(f"gate_up_proj {tuple(gu.shape)} (transposed? ) != {want}")
    log(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters, "
        f"layer 0 keys {[k.split('layers.0.')[1] for k in sd if '.layers.0.' in k]}")
    return model.cuda(), c


def experts_modules(model):
    return [m for m in model.modules() if isinstance(getattr(m, "gate_up_proj", None), type(model.lm_head.weight))]


def make_experts_forward(torch, impl):
    """An experts forward (hidden [T, H], top_k_index [T, K], top_k_weights [T, K]) -> [T, H], the same
    math as transformers' eager loop. impl 'grouped': torch._grouped_mm in bf16; 'loop': one
    F.linear pair per expert over the tokens sorted by expert."""
    F = torch.nn.functional

    def fwd(self, hidden_states, top_k_index, top_k_weights):
        T, H = hidden_states.shape
        K = top_k_index.shape[-1]
        E = self.gate_up_proj.shape[0]
        flat = top_k_index.reshape(-1)
        order = torch.argsort(flat, stable=True)
        tok = order // K
        counts = torch.bincount(flat, minlength=E)
        w = top_k_weights.reshape(-1)[order].unsqueeze(-1)
        x = hidden_states[tok]
        if impl == "grouped":
            offs = torch.cumsum(counts, 0).to(torch.int32)
            xb = x.to(torch.bfloat16)
            gu = torch._grouped_mm(xb, self.gate_up_proj.to(torch.bfloat16).transpose(-2, -1), offs=offs)
            g, u = gu.chunk(2, dim=-1)
            y = torch._grouped_mm(F.silu(g) * u, self.down_proj.to(torch.bfloat16).transpose(-2, -1), offs=offs)
        else:
            ys, a = [], 0
            for e, n in enumerate(counts.tolist()):
                if n:
                    g, u = F.linear(x[a:a + n], self.gate_up_proj[e]).chunk(2, dim=-1)
                    ys.append(F.linear(F.silu(g) * u, self.down_proj[e]))
                a += n
            y = torch.cat(ys)
        out = torch.zeros_like(hidden_states)
        out.index_add_(0, tok, (y * w.to(y.dtype)).to(out.dtype))
        return out
    return fwd


def pick_experts_impl(torch, model):
    """Patch the experts modules with the fastest implementation that matches transformers' eager
    one (forward and gradients, bf16 tolerance); None when the layout is not the fused one."""
    mods = experts_modules(model)
    if not mods:
        log("experts: not fused (per-expert Linear); training with transformers' own loop (slow)")
        return None
    m = mods[0]
    g = torch.Generator(device="cuda").manual_seed(SEED)
    T, K, E = 2048, CONFIG["num_experts_per_tok"], m.gate_up_proj.shape[0]
    x = torch.randn(T, m.gate_up_proj.shape[2], device="cuda", generator=g)
    idx = torch.rand(T, E, device="cuda", generator=g).argsort(dim=-1)[:, :K]
    wts = torch.softmax(torch.randn(T, K, device="cuda", generator=g), -1)
    saved = [p.detach().clone() for p in (m.gate_up_proj, m.down_proj)]
    with torch.no_grad():  # bigger weights than the init so errors show
        m.gate_up_proj.normal_(0, 0.1, generator=g)
        m.down_proj.normal_(0, 0.1, generator=g)

    def run(fn, autocast):
        m.zero_grad(set_to_none=True)
        xx = x.clone().requires_grad_(True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            y = fn(m, xx, idx, wts)
        (y.float() ** 2).sum().backward()
        return [t.detach().float().clone() for t in (y, xx.grad, m.gate_up_proj.grad, m.down_proj.grad)]

    torch.set_float32_matmul_precision("highest")
    ref = run(type(m).forward, False)
    chosen = None
    for impl in ("grouped", "loop"):
        fn = make_experts_forward(torch, impl)
        try:
            got = run(fn, True)
            errs = [((a - b).norm() / b.norm()).item() for a, b in zip(got, ref)]
        except Exception as e:  # noqa: BLE001 - any failure means: try the next one
            log(f"experts impl {impl}: failed ({type(e).__name__}: {str(e)[:120]})")
            continue
        log(f"experts impl {impl}: rel err out/dx/dW1/dW2 = " + " ".join(f"{v:.1e}" for v in errs))
        if max(errs) < 3e-2:
            chosen = fn
            break
    with torch.no_grad():
        m.gate_up_proj.copy_(saved[0])
        m.down_proj.copy_(saved[1])
    m.zero_grad(set_to_none=True)
    if chosen is None:
        log("experts: no fast implementation matches; training with transformers' own loop (slow)")
    return chosen


def set_experts(model, fn):
    """fn: an experts forward to patch in, or None to restore transformers' own (eager)."""
    for m in experts_modules(model):
        if fn is None:
            m.__dict__.pop("forward", None)
        else:
            m.forward = types.MethodType(fn, m)


# ---------------------------------------------------------------- export and reload

def export(torch, model, cfg, tok, d, types_=("q8_0", "f32")):
    """HF checkpoint (safetensors + config.json + tokenizer.json) in d/hf, converted by the
    project's converter to d/model-<type>.gguf. Returns {type: path}."""
    from safetensors.torch import save_file
    hf = os.path.join(d, "hf")
    os.makedirs(hf, exist_ok=True)
    sd = {k: v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(sd, os.path.join(hf, "model.safetensors"))
    conf = model.config.to_dict()
    conf.update(cfg)
    conf.update(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe")
    with open(os.path.join(hf, "config.json"), "w") as f:
        json.dump(conf, f, indent=1, default=str)
    tok.save(os.path.join(hf, "tokenizer.json"))
    out = {}
    for t in types_:
        p = os.path.join(d, f"model-{t}.gguf")
        r = subprocess.run([sys.executable, os.path.join(TOOLS, "convert_hf_to_gguf.py"), hf, p, "--type", t],
                           capture_output=True, text=True)
        if r.returncode:
            die(f"convert --type {t}: {r.stdout[-2000:]}{r.stderr[-2000:]}")
        out[t] = p
    return out


def load_gguf(np, path):
    """{name: float32 numpy array (numpy layout)} and kv of a GGUF (F32/F16/Q8_0 tensors)."""
    import gguf_read
    info = gguf_read.read(path)
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for t in info["tensors"]:
        n = 1
        for s in t["ne"]:
            n *= s
        shape = tuple(reversed(t["ne"]))
        o = t["data_offset"]
        if t["type"] == 0:
            a = np.frombuffer(mm, dtype="<f4", count=n, offset=o)
        elif t["type"] == 1:
            a = np.frombuffer(mm, dtype="<f2", count=n, offset=o).astype(np.float32)
        elif t["type"] == 8:
            b = np.frombuffer(mm, dtype=np.uint8, count=n // 32 * 34, offset=o).reshape(-1, 34)
            dd = b[:, :2].copy().view("<f2").astype(np.float32)
            a = dd * b[:, 2:].copy().view(np.int8).astype(np.float32)
        else:
            die(f"{path}: {t['name']} has ggml type {t['type']}")
        out[t["name"]] = np.array(a, dtype=np.float32).reshape(shape)
    return out, info["kv"]


def state_from_gguf(np, t, sd_keys, cfg):
    """The inverse of the converter's tensor map (written independently of it): GGUF tensors ->
    transformers state_dict entries."""
    o = {"model.embed_tokens.weight": t["token_embd.weight"], "model.norm.weight": t["output_norm.weight"],
         "lm_head.weight": t.get("output.weight", t["token_embd.weight"])}
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
             "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate": "ffn_gate_inp"}
    for i in range(cfg["num_hidden_layers"]):
        p, b = f"model.layers.{i}", f"blk.{i}"
        for hf, gg in names.items():
            o[f"{p}.{hf}.weight"] = t[f"{b}.{gg}.weight"]
        g, u, dn = (t[f"{b}.ffn_{x}_exps.weight"] for x in ("gate", "up", "down"))
        if f"{p}.mlp.experts.gate_up_proj" in sd_keys:
            o[f"{p}.mlp.experts.gate_up_proj"] = np.concatenate([g, u], axis=1)
            o[f"{p}.mlp.experts.down_proj"] = dn
        else:
            for e in range(g.shape[0]):
                for w, a in (("gate_proj", g), ("up_proj", u), ("down_proj", dn)):
                    o[f"{p}.mlp.experts.{e}.{w}.weight"] = a[e]
    if set(o) != set(sd_keys):
        die(f"GGUF -> state_dict keys differ: missing {sorted(set(sd_keys) - set(o))[:5]}, "
            f"extra {sorted(set(o) - set(sd_keys))[:5]}")
    return o


def model_from_gguf(torch, np, model, path, cfg):
    t, kv = load_gguf(np, path)
    sd = model.state_dict()
    new = state_from_gguf(np, t, list(sd), cfg)
    m2 = copy.deepcopy(model)
    m2.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in new.items()}, strict=True)
    return m2, t, kv


# ---------------------------------------------------------------- evaluation

def perplexity(torch, model, ids, n_ctx=N_CTX, batch=16, max_chunks=None):
    """`hotmoe perplexity` / llama-perplexity's method: chunks of n_ctx tokens (tail dropped), no BOS
    (the vocabulary does not add one), positions n_ctx/2 .. n_ctx-2 predict the next token; nll in
    double from the fp32 logits. Returns (ppl, +/-, n_scored, n_chunks)."""
    n_chunk = len(ids) // n_ctx
    if max_chunks:
        n_chunk = min(n_chunk, max_chunks)
    if n_chunk < 1:
        die(f"perplexity: {len(ids)} tokens < one chunk of {n_ctx}")
    first = n_ctx // 2
    chunks = torch.tensor(ids[:n_chunk * n_ctx], dtype=torch.long).view(n_chunk, n_ctx)
    s = s2 = 0.0
    cnt = 0
    with torch.no_grad():
        for b in range(0, n_chunk, batch):
            x = chunks[b:b + batch].cuda()
            lg = model(input_ids=x, use_cache=False, output_router_logits=False).logits.double()
            lp = torch.log_softmax(lg[:, first:n_ctx - 1], dim=-1)
            v = -lp.gather(-1, x[:, first + 1:].unsqueeze(-1)).squeeze(-1)
            s += v.sum().item()
            s2 += (v * v).sum().item()
            cnt += v.numel()
    mean = s / cnt
    var = s2 / cnt - mean * mean
    ppl = math.exp(mean)
    err = ppl * math.sqrt(var / (cnt - 1)) if var > 0 and cnt > 1 else 0.0
    return ppl, err, cnt, n_chunk


def greedy(torch, model, tok, prompt, n):
    ids = tok.encode(prompt, add_special_tokens=False).ids
    with torch.no_grad():
        for _ in range(n):
            x = torch.tensor([ids[-N_CTX:]], dtype=torch.long, device="cuda")
            ids.append(int(model(input_ids=x, use_cache=False, output_router_logits=False).logits[0, -1].argmax()))
    return tok.decode(ids)


def numpy_check(torch, np, model, t, cfg, n=24):
    """An independent numpy forward (tools/fixtures) over the GGUF tensors against transformers
    over the same weights: a layout error in the converter or in state_from_gguf shows here."""
    from make_qwen3moe_fixture import numpy_forward
    ids = np.arange(3, 3 + 7 * n, 7) % cfg["vocab_size"]
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(ids[None]).cuda(), use_cache=False,
                    output_router_logits=False).logits[0].double().cpu().numpy()
    mine = numpy_forward(cfg, t, ids)
    d = float(np.abs(ref - mine).max() / max(np.abs(ref).max(), 1e-9))
    return d


def eval_ready(torch):
    torch.set_float32_matmul_precision("highest")  # no TF32: fp32 logits as fp32


def write_pieces(path, outdir):
    """Split path into <= 15 MiB pieces under outdir; returns {name: sha256} and the whole's sha256."""
    res, whole = {}, hashlib.sha256()
    with open(path, "rb") as f:
        i = 0
        while True:
            b = f.read(PIECE)
            if not b:
                break
            name = f"{os.path.basename(path)}.part{i:02d}"
            with open(os.path.join(outdir, name), "wb") as g:
                g.write(b)
            res[name] = hashlib.sha256(b).hexdigest()
            whole.update(b)
            i += 1
    return res, whole.hexdigest()


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/train_tiny_work")
    ap.add_argument("--train-seconds", type=float, default=360)
    ap.add_argument("--budget", type=float, default=525, help="hard wall-clock limit of the whole run")
    ap.add_argument("--code-mb", type=float, default=140)
    ap.add_argument("--prose-mb", type=float, default=60)
    ap.add_argument("--tok-mb", type=float, default=30, help="text the tokenizer is trained on")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--heldout-tokens", type=int, default=40000)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.work, exist_ok=True)
    deadline = T0 + args.budget

    import numpy as np
    import torch
    import tokenizers
    import transformers
    transformers.logging.set_verbosity_error()
    log(f"python {sys.version.split()[0]} torch {torch.__version__} transformers {transformers.__version__} "
        f"tokenizers {tokenizers.__version__} numpy {np.__version__} cuda {torch.cuda.is_available()} "
        f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else ''}")
    if not torch.cuda.is_available():
        die("no CUDA device")
    report = {"versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                           "tokenizers": tokenizers.__version__, "python": sys.version.split()[0]}}

    # ---- 1. smoke pass: the whole export/eval path on an untrained model
    ts = time.time()
    import sysconfig
    small = []
    for d, dirs, files in os.walk(sysconfig.get_paths()["stdlib"]):
        dirs.sort()
        dirs[:] = [x for x in dirs if x not in ("site-packages", "dist-packages", "__pycache__")]
        for f in sorted(files):
            if f.endswith(".py"):
                tx = read_text(os.path.join(d, f), "code", 300000)
                if tx:
                    small.append(tx)
        if sum(map(len, small)) > 3e6:
            break
    stok = train_tokenizer(small, CONFIG["vocab_size"])
    log(f"smoke: tokenizer on {sum(map(len, small)) / 1e6:.1f} MB -> {stok.get_vocab_size()} tokens")
    model, cfg = make_model(torch, CONFIG["vocab_size"])
    fast = pick_experts_impl(torch, model)
    sd = os.path.join(args.work, "smoke")
    paths = export(torch, model, cfg, stok, sd)
    eval_ready(torch)
    model.eval()
    set_experts(model, None)
    m32, t32, _ = model_from_gguf(torch, np, model, paths["f32"], cfg)
    ref_sd = model.state_dict()
    worst = max((m32.state_dict()[k].cpu() - ref_sd[k].cpu()).abs().max().item() for k in ref_sd)
    if worst != 0:
        die(f"F32 GGUF round trip is not exact (max |d| {worst})")
    d = numpy_check(torch, np, model, t32, cfg)
    log(f"smoke: F32 round trip exact; numpy forward vs transformers rel {d:.1e}")
    if not d < 1e-3:
        die("numpy forward over the GGUF tensors disagrees with transformers")
    mq, _, kv = model_from_gguf(torch, np, model, paths["q8_0"], cfg)
    sids = stok.encode("\n\n".join(small[-40:]), add_special_tokens=False).ids
    p1 = perplexity(torch, model, sids, max_chunks=4)
    p2 = perplexity(torch, mq, sids, max_chunks=4)
    log(f"smoke: ppl fp32 {p1[0]:.2f} q8_0 {p2[0]:.2f} (untrained: ~vocab size); kv tokens "
        f"{len(kv['tokenizer.ggml.tokens'])} pre {kv['tokenizer.ggml.pre']}; "
        f"sample {greedy(torch, mq, stok, 'def main(', 3)!r}")
    write_pieces(paths["q8_0"], sd)
    qsize = os.path.getsize(paths["q8_0"])
    if qsize > GGUF_MAX:
        die(f"Q8_0 GGUF is {qsize} bytes > {GGUF_MAX}")
    smoke_s = time.time() - ts
    log(f"smoke pass OK in {smoke_s:.0f}s; Q8_0 GGUF {qsize / 1e6:.2f} MB")
    del model, m32, mq
    torch.cuda.empty_cache()

    # ---- 2. corpus
    mb = 1000 * 1000
    docs, stats = gather({"code": int(args.code_mb * mb), "prose": int(args.prose_mb * mb)},
                         {"code": 300000, "prose": 500000}, time_limit=max(20.0, 0.25 * (deadline - time.time()) - 40))
    held = [x for x in docs if x[0] % 100 == 0]
    train = [x for x in docs if x[0] % 100 != 0]
    for k in ("code", "prose"):
        stats[k]["heldout_files"] = sum(1 for x in held if x[1] == k)
    log("corpus: " + ", ".join(f"{k} {stats[k]['files']} files {stats[k]['bytes'] / mb:.1f} MB"
                               for k in ("code", "prose")) + f"; held out {len(held)} files")
    for r, v in stats["by_root"].items():
        log(f"  {r}: {v['files']} files, {v['chars'] / 1e6:.1f} M chars")
    report["corpus"] = stats

    # ---- 3. tokenizer
    tt, n = [], 0
    for x in train:
        tt.append(x[3])
        n += len(x[3])
        if n >= args.tok_mb * mb:
            break
    tok = train_tokenizer(tt, CONFIG["vocab_size"])
    tok.save(os.path.join(args.out, "tokenizer.json"))
    log(f"tokenizer: trained on {n / mb:.1f} MB, {tok.get_vocab_size()} tokens")
    ids = encode_all(tok, [x[3] for x in train], np)
    ntr = {"code": 0, "prose": 0}
    for x, i in zip(train, ids):
        ntr[x[1]] += len(i)
    # prose is scarce next to code on a bare box: repeat it up to 4x, towards a quarter of the code
    rep = max(1, min(4, round(0.25 * ntr["code"] / max(ntr["prose"], 1))))
    eos = np.zeros(1, dtype=np.uint16)
    stream = np.concatenate([a for x, i in zip(train, ids) for _ in range(rep if x[1] == "prose" else 1)
                             for a in (i, eos)])
    del ids
    htext, hids = heldout_text(tok, [x[3] for x in sorted(held)], args.heldout_tokens)
    if len(hids) < 2 * N_CTX:
        die(f"held-out text has {len(hids)} tokens, need >= {2 * N_CTX}")
    with open(os.path.join(args.out, "heldout.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(htext)
    log(f"tokens: train {len(stream) / 1e6:.1f} M (code {ntr['code'] / 1e6:.1f} M, prose {ntr['prose'] / 1e6:.1f} M, "
        f"{stats['code']['bytes'] / max(ntr['code'], 1):.2f} / {stats['prose']['bytes'] / max(ntr['prose'], 1):.2f} "
        f"bytes per token), prose repeated {rep}x; held-out eval text {len(htext)} chars, {len(hids)} tokens")
    report["tokens"] = {"train": int(len(stream)), "train_code": ntr["code"], "train_prose": ntr["prose"],
                        "heldout_text_tokens": len(hids), "prose_repeat": rep}

    # ---- 4. training
    model, cfg = make_model(torch, CONFIG["vocab_size"])
    if fast:
        set_experts(model, fast)
    torch.set_float32_matmul_precision("high")
    post = max(60.0, 1.5 * smoke_s + 30)
    train_s = min(args.train_seconds, deadline - time.time() - post)
    if train_s < 30:
        die(f"only {train_s:.0f}s left for training")
    log(f"training for {train_s:.0f}s (asked {args.train_seconds:.0f}s, {post:.0f}s kept for export/eval)")
    data = torch.from_numpy(stream.astype(np.int32)).cuda()
    del stream
    decay = [p for n_, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n_, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    ar = torch.arange(N_CTX, device="cuda")
    nv = min(16, len(hids) // N_CTX)
    hv = torch.tensor(hids[:nv * N_CTX], dtype=torch.long, device="cuda").view(nv, N_CTX)
    coef = CONFIG["router_aux_loss_coef"]
    warm = 100
    tsv = open(os.path.join(args.out, "loss.tsv"), "w")
    tsv.write("step\tseconds\ttokens\tlr\ttrain_loss\taux_loss\theldout_loss\ttok_per_s\n")
    model.train()
    t_start = time.time()
    step, acc, acc_aux, acc_n, last_t, last_step, last_val, last_print = 0, None, None, 0, t_start, 0, t_start, t_start
    while True:
        el = time.time() - t_start
        if el >= train_s:
            break
        frac = el / train_s
        lr = args.lr * min(1.0, (step + 1) / warm) * (0.1 + 0.45 * (1 + math.cos(math.pi * frac)))
        for gr in opt.param_groups:
            gr["lr"] = lr
        start = torch.randint(0, data.numel() - N_CTX, (args.batch,), device="cuda", generator=gen)
        x = data[start[:, None] + ar].long()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=x, labels=x, use_cache=False)
        loss = out.loss
        if step % 50 == 0 and not torch.isfinite(loss.detach()).item():
            die(f"loss is not finite at step {step}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        aux = out.aux_loss.detach().float() if out.aux_loss is not None else torch.zeros((), device="cuda")
        lm = loss.detach().float() - coef * aux
        acc = lm if acc is None else acc + lm
        acc_aux = aux if acc_aux is None else acc_aux + aux
        acc_n += 1
        step += 1
        now = time.time()
        if step % 50 == 0 or now - t_start >= train_s:
            val = ""
            if now - last_val >= 30 or now - t_start >= train_s:
                model.eval()
                with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                    val = model(input_ids=hv, labels=hv, use_cache=False, output_router_logits=False).loss.item()
                model.train()
                last_val = now
                val = f"{val:.4f}"
            tl, ta = (acc / acc_n).item(), (acc_aux / acc_n).item()
            tps = (step - last_step) * args.batch * N_CTX / (now - last_t)
            tsv.write(f"{step}\t{now - t_start:.1f}\t{step * args.batch * N_CTX}\t{lr:.3e}\t{tl:.4f}\t{ta:.4f}\t{val}\t{tps:.0f}\n")
            tsv.flush()
            if now - last_print >= 20 or step == 50:
                log(f"step {step} loss {tl:.3f} aux {ta:.3f} held-out {val or '-'} lr {lr:.2e} {tps / 1e3:.0f}k tok/s")
                last_print = now
            acc, acc_aux, acc_n, last_t, last_step = None, None, 0, now, step
    tsv.close()
    report["training"] = {"steps": step, "seconds": round(time.time() - t_start, 1), "batch": args.batch,
                          "n_ctx": N_CTX, "tokens_seen": step * args.batch * N_CTX, "lr": args.lr,
                          "experts_impl": "grouped/loop (patched)" if fast else "transformers"}
    log(f"training done: {step} steps, {step * args.batch * N_CTX / 1e6:.1f} M tokens")
    del data, opt

    # ---- 5. export, evaluation, samples
    model.eval()
    set_experts(model, None)
    eval_ready(torch)
    fd = os.path.join(args.work, "final")
    paths = export(torch, model, cfg, tok, fd, ("q8_0",))  # F32 was checked exact in the smoke pass
    pieces, whole = write_pieces(paths["q8_0"], args.out)
    qsize = os.path.getsize(paths["q8_0"])
    log(f"Q8_0 GGUF {qsize} bytes sha256 {whole}; pieces " + " ".join(f"{k} {v}" for k, v in pieces.items()))
    mq, tq, _ = model_from_gguf(torch, np, model, paths["q8_0"], cfg)
    dq = numpy_check(torch, np, mq, tq, cfg)
    pa = perplexity(torch, model, hids)
    pb = perplexity(torch, mq, hids)
    log(f"held-out perplexity ({pa[2]} tokens scored in {pa[3]} chunks of {N_CTX}): fp32 {pa[0]:.4f} +/- {pa[1]:.4f}, "
        f"Q8_0 weights {pb[0]:.4f} +/- {pb[1]:.4f}; numpy forward vs transformers (Q8_0) rel {dq:.1e}")
    samples = {}
    for pr in ("def parse_args(", "import os\nimport sys\n\n\ndef main():\n",
               "The following example shows how to", "This package provides"):
        if time.time() > deadline - 10:
            break
        samples[pr] = greedy(torch, mq, tok, pr, 40)
        log(f"sample (Q8_0 weights, greedy): {samples[pr]!r}")
    report.update({
        "config": cfg, "heldout_tokens": len(hids), "n_ctx": N_CTX,
        "ppl_fp32": pa[0], "ppl_fp32_err": pa[1], "ppl_q8_0": pb[0], "ppl_q8_0_err": pb[1],
        "scored_tokens": pa[2], "chunks": pa[3], "numpy_check_rel": dq,
        "gguf": {"file": "model-q8_0.gguf", "bytes": qsize, "sha256": whole, "pieces": pieces},
        "samples": samples, "seconds_total": round(time.time() - T0, 1)})
    with open(os.path.join(args.out, "eval.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    if not dq < 1e-3:
        die(f"numpy forward over the Q8_0 GGUF disagrees with transformers (rel {dq:.1e})")
    log(f"done in {time.time() - T0:.0f}s")


if __name__ == "__main__":
    main()
