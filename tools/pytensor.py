"""pytensor.py - read safetensors and reshuffle tensors without numpy.

The converter's numpy-free path: a safetensors reader (8-byte little-endian header length, JSON
header, raw little-endian data; F32, F16 and BF16 are read as float32) and the few tensor
operations a conversion needs (gather along an axis, elementwise maps, squeeze). A PyTensor is
a row-major float32 buffer (array('f')) with a shape; every operation here also accepts a numpy
array, so one conversion recipe serves both paths (numpy for real models, this for tiny fixtures
on machines without numpy).
"""
import json
import math
import struct
import sys
from array import array

try:
    import numpy as np
except ImportError:  # the pure-Python path
    np = None


class PyTensor:
    """A float32 tensor: shape (tuple) and data (array('f'), row-major, native byte order)."""

    def __init__(self, shape, data):
        self.shape = tuple(int(s) for s in shape)
        self.data = data
        n = 1
        for s in self.shape:
            n *= s
        if len(data) != n:
            raise ValueError(f"PyTensor: {len(data)} values for shape {self.shape}")

    @property
    def ndim(self):
        return len(self.shape)

    def le_bytes(self):
        """The data as little-endian float32 bytes."""
        if sys.byteorder == "little":
            return self.data.tobytes()
        c = array("f", self.data)
        c.byteswap()
        return c.tobytes()


def _is_np(t):
    return np is not None and isinstance(t, np.ndarray)


def shape(t):
    return tuple(t.shape)


def take(t, axis, idx):
    """Gather indexes idx (a list) along axis: out[..., j, ...] = t[..., idx[j], ...]."""
    if _is_np(t):
        return np.ascontiguousarray(np.take(t, idx, axis=axis))
    axis %= t.ndim
    outer = 1
    for s in t.shape[:axis]:
        outer *= s
    inner = 1
    for s in t.shape[axis + 1:]:
        inner *= s
    n = t.shape[axis]
    src = t.data
    out = array("f")
    for o in range(outer):
        base = o * n
        for i in idx:
            a = (base + i) * inner
            out.extend(src[a:a + inner])
    sh = list(t.shape)
    sh[axis] = len(idx)
    return PyTensor(sh, out)


def rows(t, a, b, axis=0):
    """Indexes a..b-1 along axis."""
    return take(t, axis, list(range(a, b)))


def map_f(t, fn, np_fn):
    """Elementwise: fn on a PyTensor's floats, np_fn on a numpy array."""
    if _is_np(t):
        return np_fn(t).astype(np.float32)
    return PyTensor(t.shape, array("f", (fn(x) for x in t.data)))


def plus_one(t):
    return map_f(t, lambda x: x + 1.0, lambda a: a + 1.0)


def neg_exp(t):
    return map_f(t, lambda x: -math.exp(x), lambda a: -np.exp(a))


def squeeze(t):
    """Drop every axis of size 1."""
    if _is_np(t):
        return np.squeeze(t)
    return PyTensor([s for s in t.shape if s != 1], t.data)


# ---- safetensors ----

def _decode(dtype, raw, name):
    if dtype == "F32":
        a = array("f")
        a.frombytes(raw)
        if sys.byteorder != "little":
            a.byteswap()
        return a
    if dtype == "F16":
        return array("f", struct.unpack(f"<{len(raw) // 2}e", raw))
    if dtype == "BF16":
        h = array("H")
        h.frombytes(raw)
        if sys.byteorder != "little":
            h.byteswap()
        w = array("I", (v << 16 for v in h))
        a = array("f")
        a.frombytes(w.tobytes())
        return a
    raise ValueError(f"{name}: safetensors dtype {dtype} not supported without numpy")


def load_safetensors(path):
    """{name: PyTensor} of one .safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise ValueError(f"{path}: header length {n} past the end of the file")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        if base + b > len(blob) or a > b:
            raise ValueError(f"{path}: tensor {name} data [{a}, {b}) outside the file")
        out[name] = PyTensor(info["shape"], _decode(info["dtype"], blob[base + a:base + b], name))
    return out
