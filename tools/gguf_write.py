"""gguf_write.py - a small GGUF v3 writer for hotmoe's Python tools.

Writes metadata of every GGUF value type (incl. string arrays) and tensors in F32, F16 or Q8_0
(ggml's block layout: fp16 scale + 32 int8). Tensor data is aligned to 32 bytes; the file is
written to PATH.tmp and renamed onto PATH when complete (atomic).

Without numpy, tensors go in as bytes already in their GGML layout (add_tensor_raw) or as
pytensor.PyTensor (F32, F16 or Q8_0, quantized in pure Python: slow, for tiny fixtures only).

Shapes: pass numpy arrays in row-major order; GGUF stores ne[] reversed (ne[0] = last numpy axis,
the contiguous one), which this writer does for you.
"""
import os
import struct

try:
    import numpy as np
except ImportError:  # add_tensor_raw, PyTensors (F32) and metadata work without numpy
    np = None

# GGUF metadata value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_SCALAR_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
               BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}
# ggml tensor types
GGML_F32, GGML_F16, GGML_Q8_0 = 0, 1, 8
ALIGN = 32


def _str(s):
    b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    return struct.pack("<Q", len(b)) + b


def quantize_q8_0(x):
    """ggml's reference Q8_0: per 32 values d = amax/127, q = round(x/d) (half away from zero)."""
    x = np.asarray(x, dtype=np.float32).reshape(-1, 32)
    amax = np.abs(x).max(axis=1)
    d = amax / 127.0
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1), 0.0).astype(np.float32)
    q = np.round(x * inv[:, None])  # numpy rounds half to even; ggml uses roundf (half away)
    v = x * inv[:, None]
    half = np.abs(v - np.trunc(v)) == 0.5
    q = np.where(half, np.trunc(v) + np.sign(v), q).astype(np.int8)
    out = np.zeros((x.shape[0], 34), dtype=np.uint8)
    out[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.tobytes()


def _f32(v):
    """v rounded to the nearest float32 (Python floats are doubles)."""
    return struct.unpack("<f", struct.pack("<f", v))[0]


def quantize_q8_0_py(values):
    """quantize_q8_0 without numpy, bit for bit: the same float32 steps as ggml's
    quantize_row_q8_0_ref (d = amax/127, id = d ? 1/d : 0, q = roundf(x*id)). values: floats
    (already float32), a multiple of 32 of them."""
    out = bytearray()
    for b in range(0, len(values), 32):
        blk = values[b:b + 32]
        amax = max(abs(x) for x in blk)
        d = _f32(amax / 127.0)
        inv = _f32(1.0 / d) if d else 0.0
        q = []
        for x in blk:
            v = _f32(x * inv)
            r = int(abs(v) + 0.5)  # roundf: half away from zero
            q.append(-r if v < 0 else r)
        out += struct.pack("<e", d) + struct.pack("<32b", *q)
    return bytes(out)


class GGUFWriter:
    def __init__(self, path):
        self.path = path
        self.kv = []       # (key, bytes of type+value)
        self.tensors = []  # (name, ne list, ggml type, bytes)

    # ---- metadata ----
    def add(self, key, vtype, value):
        self.kv.append((key, struct.pack("<I", vtype) + self._val(vtype, value)))

    def add_array(self, key, elem_type, values):
        body = struct.pack("<IQ", elem_type, len(values))
        body += b"".join(self._val(elem_type, v) for v in values)
        self.kv.append((key, struct.pack("<I", ARRAY) + body))

    def _val(self, vtype, value):
        if vtype == STRING:
            return _str(value)
        if vtype == ARRAY:
            elem_type, values = value
            return struct.pack("<IQ", elem_type, len(values)) + b"".join(self._val(elem_type, v) for v in values)
        return struct.pack(_SCALAR_FMT[vtype], value)

    def add_str(self, key, v): self.add(key, STRING, v)
    def add_u32(self, key, v): self.add(key, U32, int(v))
    def add_i32(self, key, v): self.add(key, I32, int(v))
    def add_f32(self, key, v): self.add(key, F32, float(v))
    def add_bool(self, key, v): self.add(key, BOOL, bool(v))

    # ---- tensors ----
    def add_tensor(self, name, array, ggml_type=GGML_F32):
        if hasattr(array, "le_bytes"):  # pytensor.PyTensor
            ne = list(reversed(array.shape))
            if ggml_type == GGML_F32:
                data = array.le_bytes()
            elif ggml_type == GGML_F16:
                data = struct.pack(f"<{len(array.data)}e", *array.data)
            elif ggml_type == GGML_Q8_0:
                if ne[0] % 32:
                    raise ValueError(f"{name}: Q8_0 needs rows of a multiple of 32, got {ne[0]}")
                data = quantize_q8_0_py(array.data)
            else:
                raise ValueError(f"{name}: unsupported ggml type {ggml_type}")
            self.tensors.append((name, ne, ggml_type, data))
            return
        a = np.ascontiguousarray(array)
        ne = list(reversed(a.shape))
        if ggml_type == GGML_F32:
            data = a.astype("<f4").tobytes()
        elif ggml_type == GGML_F16:
            data = a.astype("<f2").tobytes()
        elif ggml_type == GGML_Q8_0:
            if ne[0] % 32:
                raise ValueError(f"{name}: Q8_0 needs rows of a multiple of 32, got {ne[0]}")
            data = quantize_q8_0(a)
        else:
            raise ValueError(f"{name}: unsupported ggml type {ggml_type}")
        self.tensors.append((name, ne, ggml_type, data))

    def add_tensor_raw(self, name, ne, ggml_type, data):
        """A tensor given as bytes in ggml's layout; ne[0] is the contiguous dimension."""
        self.tensors.append((name, list(ne), ggml_type, data))

    def write(self):
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(b"GGUF" + struct.pack("<IQQ", 3, len(self.tensors), len(self.kv)))
            for key, body in self.kv:
                f.write(_str(key) + body)
            offset = 0
            for name, ne, t, data in self.tensors:
                f.write(_str(name) + struct.pack("<I", len(ne)))
                f.write(b"".join(struct.pack("<Q", n) for n in ne))
                f.write(struct.pack("<IQ", t, offset))
                offset += (len(data) + ALIGN - 1) // ALIGN * ALIGN
            pad = (-f.tell()) % ALIGN
            f.write(b"\0" * pad)
            for _, _, _, data in self.tensors:
                f.write(data)
                f.write(b"\0" * ((-len(data)) % ALIGN))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
