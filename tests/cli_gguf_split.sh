#!/usr/bin/env bash
# cli_gguf_split.sh - split GGUFs (llama-gguf-split's layout): `synth --split-max-tensors` /
# `--split-max-size` write PREFIX-0000i-of-0000N.gguf, and every command that opens a model
# loads them from the first file's name. References: the single-file model written with the
# same seed (logits byte-identical, CPU and SSD tier), and the files parsed by the Python GGUF
# reader (tools/gguf_read.py, not the C reader): the split keys and their types, metadata only
# in the first, the concatenated tensor list and every tensor's bytes equal the single file's;
# and, when llama.cpp's llama-gguf-split is there (HM_LLAMA_BIN or PATH), its split of the single
# file equals ours byte for byte.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
hm_tmpdir gguf_split
cd "$tmp" || exit 1

S=(synth --preset tiny --type q4_k_m --seed 7 -q)
check "synth single" test "$(code "$EXE" "${S[@]}" -o one.gguf)" = 0
check "synth 4 splits by tensors" test "$(code "$EXE" "${S[@]}" --split-max-tensors 13 -o four.gguf)" = 0
check "four files" test "$(ls four-0000?-of-00004.gguf | wc -l)" = 4
check "no single file beside them" test ! -e four.gguf
# size mode: a 2.5 MB cap over 8.3 MB of tensors
check "synth splits by size" test "$(code "$EXE" "${S[@]}" --split-max-size 2500000 -o sz.gguf)" = 0
nsz=$(ls sz-0000?-of-0000?.gguf 2>/dev/null | wc -l)
check "size mode: several files ($nsz)" test "$nsz" -ge 4

if command -v python3 >/dev/null; then
    check "layout (Python reader)" python3 - "$SRC/tools" one.gguf four sz <<'PY'
import sys, glob
sys.path.insert(0, sys.argv[1])
import gguf_read
one = gguf_read.read(sys.argv[2])
raw_one = open(sys.argv[2], "rb").read()
for prefix in sys.argv[3:]:
    files = sorted(glob.glob(prefix + "-*-of-*.gguf"))
    n = len(files)
    assert n >= 2, files
    names = []
    for i, f in enumerate(files):
        assert f == "%s-%05d-of-%05d.gguf" % (prefix, i + 1, n), f
        info = gguf_read.read(f)
        kv, raw = info["kv"], open(f, "rb").read()
        assert kv["split.no"] == i and kv["split.count"] == n, (f, kv.get("split.no"))
        assert kv["split.tensors.count"] == len(one["tensors"])
        for key, typ in (("split.no", 2), ("split.count", 2), ("split.tensors.count", 5)):  # u16 u16 i32
            at = raw.find(key.encode()) + len(key)
            assert int.from_bytes(raw[at:at + 4], "little") == typ, (f, key)
        rest = {k: v for k, v in kv.items() if not k.startswith("split.")}
        assert rest == (one["kv"] if i == 0 else {}), (f, list(rest)[:3])
        assert info["tensors"], f
        for t in info["tensors"]:
            ref = [x for x in one["tensors"] if x["name"] == t["name"]][0]
            assert (t["ne"], t["type"]) == (ref["ne"], ref["type"]), t["name"]
            nxt = [x["data_offset"] for x in one["tensors"] if x["data_offset"] > ref["data_offset"]]
            nb = (min(nxt) if nxt else len(raw_one)) - ref["data_offset"]
            a = raw[t["data_offset"]:t["data_offset"] + nb]
            b = raw_one[ref["data_offset"]:ref["data_offset"] + nb]
            assert a == b, t["name"]  # tensor bytes and their padding
            names.append(t["name"])
    assert names == [t["name"] for t in one["tensors"]], prefix
PY
fi

# llama.cpp's own splitter on the single file, when there is one (HM_LLAMA_BIN, else on PATH):
# its files must equal ours byte for byte, in both modes (2M = 2,000,000 bytes, decimal, as there)
LGS=${HM_LLAMA_BIN:+$HM_LLAMA_BIN/}llama-gguf-split
if command -v "$LGS" >/dev/null 2>&1; then
    "$LGS" --split --split-max-tensors 13 one.gguf llm >/dev/null 2>&1
    for i in 1 2 3 4; do check "llama-gguf-split split $i = ours" cmp -s "llm-0000$i-of-00004.gguf" "four-0000$i-of-00004.gguf"; done
    "$LGS" --split --split-max-size 2M one.gguf lsz >/dev/null 2>&1
    check "synth 2M" test "$(code "$EXE" "${S[@]}" --split-max-size 2M -o hsz.gguf)" = 0
    for f in lsz-*.gguf; do check "llama-gguf-split $f = ours" cmp -s "$f" "h${f#l}"; done
    check "llama's split loads" test "$(code "$EXE" logits -m llm-00001-of-00004.gguf --tokens 1,2,3,4,5,6,7,8,9 -o l.f32)" = 0
else
    echo "note: llama-gguf-split not found (set HM_LLAMA_BIN): the byte comparison with llama.cpp is skipped"
fi

# the same logits from the first split as from the single file: CPU, and the SSD tier (reads
# from each unit's own file)
T=1,2,3,4,5,6,7,8,9
check "logits single" test "$(code "$EXE" logits -m one.gguf --tokens $T -o a.f32)" = 0
check "logits split" test "$(code "$EXE" logits -m four-00001-of-00004.gguf --tokens $T -o b.f32)" = 0
check "logits byte-identical" cmp -s a.f32 b.f32
[ -f l.f32 ] && check "llama's split: logits byte-identical" cmp -s a.f32 l.f32
check "logits size mode" test "$(code "$EXE" logits -m sz-00001-of-0000$nsz.gguf --tokens $T -o c.f32)" = 0
check "logits size mode identical" cmp -s a.f32 c.f32
check "ssd tier single" test "$(code "$EXE" logits -m one.gguf --tokens $T --ram-budget 1MiB -o d.f32)" = 0
check "ssd tier split" test "$(code "$EXE" logits -m four-00001-of-00004.gguf --tokens $T --ram-budget 1MiB -o e.f32)" = 0
check "ssd tier identical" cmp -s d.f32 e.f32
check "ssd tier = mapping" cmp -s a.f32 e.f32
# other commands open it by the first name
check "inspect split" test "$(code "$EXE" inspect four-00001-of-00004.gguf)" = 0
check "inspect counts all tensors" grep -q "51 tensors" "$tmp/out"
check "bench split" test "$(code "$EXE" bench -m four-00001-of-00004.gguf -p 4 -n 2 -r 1 -t 1)" = 0
check "run split" test "$(code "$EXE" run -m four-00001-of-00004.gguf -p hello -n 3 -t 1 --temp 0)" = 0

if command -v curl >/dev/null; then # serve: a completion from the split model
    LOG=$tmp/serve.log
    pid=
    trap '[ -n "$pid" ] && kill $pid 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"' EXIT
    hm_serve_up four-00001-of-00004.gguf -t 1
    check "serve split" test "$up" = 1
    if [ "$up" = 1 ]; then
        check "serve split completion" bash -c "curl -s http://127.0.0.1:$PORT/v1/completions \
            -d '{\"prompt\":\"hi\",\"max_tokens\":3}' | grep -q '\"completion_tokens\":3'"
        kill $pid; wait $pid 2>/dev/null; pid=
    fi
fi

# clear errors: a missing split names it; a split of another model is refused; not the first
mkdir miss && cp four-0000[124]-of-00004.gguf miss/
check "missing split fails" test "$(code "$EXE" logits -m miss/four-00001-of-00004.gguf --tokens 1 -o x.f32)" != 0
check "missing split named" grep -q "four-00003-of-00004.gguf" "$tmp/err"
check "synth 3 splits" test "$(code "$EXE" "${S[@]}" --split-max-tensors 20 -o other.gguf)" = 0
mkdir mix && cp four-0000[134]-of-00004.gguf mix/ && cp other-00002-of-00003.gguf mix/four-00002-of-00004.gguf
check "foreign split fails" test "$(code "$EXE" logits -m mix/four-00001-of-00004.gguf --tokens 1 -o x.f32)" != 0
check "foreign split named" grep -q "four-00002-of-00004.gguf: split.count is 3" "$tmp/err"
check "not the first split" test "$(code "$EXE" logits -m four-00002-of-00004.gguf --tokens 1 -o x.f32)" != 0
check "first split suggested" grep -q "open the first split, four-00001-of-00004.gguf" "$tmp/err"
check "split name must end in .gguf" test "$(code "$EXE" "${S[@]}" --split-max-tensors 13 -o bad.bin)" != 0
check "bad split size" test "$(code "$EXE" "${S[@]}" --split-max-size 0 -o z.gguf)" = 2
exit $fail
