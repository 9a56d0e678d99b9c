"""gguf_read.py - a minimal pure-Python GGUF reader used to check files the tools write.

Returns (kv dict, tensor list) with tensor entries {name, ne, type, offset, data_offset}; no numpy.
"""
import struct

_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
        11: "<q", 12: "<d"}


def read(path):
    with open(path, "rb") as f:
        buf = f.read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, buf, pos)[0]
        pos += struct.calcsize(fmt)
        return v

    def string():
        nonlocal pos
        n = take("<Q")
        s = buf[pos:pos + n].decode("utf-8", "replace")
        pos += n
        return s

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("<I"), take("<Q")
            return [value(et) for _ in range(n)]
        return take(_FMT[t])

    if buf[:4] != b"GGUF":
        raise ValueError("not a GGUF file")
    pos = 4
    version, n_t, n_kv = take("<I"), take("<Q"), take("<Q")
    kv = {}
    for _ in range(n_kv):
        k = string()
        kv[k] = value(take("<I"))
    tensors = []
    for _ in range(n_t):
        name = string()
        nd = take("<I")
        ne = [take("<Q") for _ in range(nd)]
        t, off = take("<I"), take("<Q")
        tensors.append({"name": name, "ne": ne, "type": t, "offset": off})
    align = kv.get("general.alignment", 32)
    data_off = (pos + align - 1) // align * align
    for t in tensors:
        t["data_offset"] = data_off + t["offset"]
    return {"version": version, "kv": kv, "tensors": tensors, "size": len(buf)}


if __name__ == "__main__":
    import sys
    info = read(sys.argv[1])
    for k, v in info["kv"].items():
        s = repr(v)
        print(f"{k} = {s[:100]}")
    for t in info["tensors"]:
        print(t["name"], t["ne"], t["type"])
