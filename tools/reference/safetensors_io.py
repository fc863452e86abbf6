#!/usr/bin/env python3
"""The file layout of .safetensors, shared by the references (dflash_ref.py, flashmap_ref.py), which
convert the raw bytes to numpy arrays / torch tensors each in their own way:
[u64 LE header length][JSON header {name: {dtype, shape, data_offsets}, __metadata__}][raw data].
"""

import json
import struct


def read_raw(path):
    """({name: (dtype string, shape list, raw bytes)}, metadata dict) of a .safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n].decode("utf-8"))
    base = 8 + n
    meta = header.pop("__metadata__", {}) or {}
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        out[name] = (info["dtype"], list(info["shape"]), data[base + b : base + e])
    return out, meta


def write_raw(path, items, metadata=None):
    """items: [(name, dtype string, shape list, raw bytes)], written in the given order (callers
    put larger elements first so that every tensor stays aligned to its element size)."""
    header, off = {}, 0
    for name, dt, shape, raw in items:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for item in items:
            f.write(item[3])
