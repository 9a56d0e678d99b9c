#!/usr/bin/env python3
"""ds2_kv_b_gguf.py SRC.gguf DST.gguf - a deepseek2 GGUF as older llama.cpp conversions wrote it, from
an F32 one as the current converter writes it (tests/cli_llama_ref_deepseek2.sh): each layer's
attn_k_b {nope, kv_lora, n_head} and attn_v_b {kv_lora, v, n_head} back into one attn_kv_b
{kv_lora, n_head (nope + v)} (head h: its nope K rows, K_b transposed, then its v V rows), the
decompressed head sizes in attention.key_length / value_length, no key_length_mla /
value_length_mla, head_count_kv = head_count. Pure Python (no numpy); F32 tensors only; the other
tensors and keys are copied as they are."""
import struct, sys
src, dst = sys.argv[1], sys.argv[2]
b = open(src, 'rb').read()
o = 0
def rd(fmt):
    global o
    v = struct.unpack_from('<' + fmt, b, o); o += struct.calcsize('<' + fmt); return v[0] if len(v) == 1 else v
def rstr():
    global o
    n = rd('Q'); s = b[o:o + n]; o += n; return s
SZ = {0:'B',1:'b',2:'H',3:'h',4:'I',5:'i',6:'f',7:'?',10:'Q',11:'q',12:'d'}
def rval(t):
    if t == 8: return rstr()
    if t == 9:
        et = rd('I'); n = rd('Q'); return (et, [rval(et) for _ in range(n)])
    return rd(SZ[t])
assert b[:4] == b'GGUF'; o = 4
ver = rd('I'); nt = rd('Q'); nkv = rd('Q')
kvs = []
for _ in range(nkv):
    k = rstr(); t = rd('I'); kvs.append([k, t, rval(t)])
tens = []
for _ in range(nt):
    name = rstr(); nd = rd('I'); ne = [rd('Q') for _ in range(nd)]; ty = rd('I'); off = rd('Q')
    tens.append([name, ne, ty, off])
al = 32
data0 = (o + al - 1) // al * al
def tdata(t):
    n = 1
    for x in t[1]: n *= x
    assert t[2] == 0
    return list(struct.unpack_from('<%df' % n, b, data0 + t[3]))
kv = {k.decode(): v for k, t, v in kvs}
A = 'deepseek2.'
H = kv[A + 'attention.head_count']; lora = kv[A + 'attention.kv_lora_rank']; rot = kv[A + 'rope.dimension_count']
nope = kv[A + 'attention.key_length_mla'] - rot; vd = kv[A + 'attention.value_length_mla']
newkv = []
for k, t, v in kvs:
    ks = k.decode()
    if ks.endswith('key_length_mla') or ks.endswith('value_length_mla'): continue
    if ks == A + 'attention.key_length': v = nope + rot
    if ks == A + 'attention.value_length': v = vd
    if ks == A + 'attention.head_count_kv': v = H
    newkv.append([k, t, v])
out_t = []  # (name, ne, floats)
byname = {t[0].decode(): t for t in tens}
for t in tens:
    nm = t[0].decode()
    if nm.endswith('attn_v_b.weight'): continue
    if nm.endswith('attn_k_b.weight'):
        kb = tdata(t); vb = tdata(byname[nm.replace('attn_k_b', 'attn_v_b')])
        rows = []
        for h in range(H):
            for j in range(nope): rows += [kb[(h * lora + l) * nope + j] for l in range(lora)]
            for i in range(vd): rows += vb[(h * vd + i) * lora:(h * vd + i + 1) * lora]
        out_t.append((nm.replace('attn_k_b', 'attn_kv_b'), [lora, H * (nope + vd)], rows))
        continue
    out_t.append((nm, t[1], tdata(t)))
def wstr(s): return struct.pack('<Q', len(s)) + s
def wval(t, v):
    if t == 8: return wstr(v)
    if t == 9:
        et, items = v; return struct.pack('<IQ', et, len(items)) + b''.join(wval(et, x) for x in items)
    return struct.pack('<' + SZ[t], v)
hdr = b'GGUF' + struct.pack('<IQQ', 3, len(out_t), len(newkv))
for k, t, v in newkv: hdr += wstr(k) + struct.pack('<I', t) + wval(t, v)
off = 0; infos = b''; blobs = []
for nm, ne, fl in out_t:
    infos += wstr(nm.encode()) + struct.pack('<I', len(ne)) + b''.join(struct.pack('<Q', x) for x in ne) + struct.pack('<IQ', 0, off)
    d = struct.pack('<%df' % len(fl), *fl); d += b'\0' * ((al - len(d) % al) % al); blobs.append(d); off += len(d)
h = hdr + infos; h += b'\0' * ((al - len(h) % al) % al)
open(dst, 'wb').write(h + b''.join(blobs))
print('wrote', dst, len(out_t), 'tensors')
