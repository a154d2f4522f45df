"""Safetensors writer and reader (numpy only), plus the official checkpoint number formats.

write_file(path, tensors, metadata=None): tensors is {name: (dtype_str, shape, bytes)} or
{name: numpy array}; arrays of float32/int64/int32/uint8/int8 map to F32/I64/I32/U8/I8.
For BF16/F8 data pass (dtype, shape, raw bytes) — see the encoders below.
write_sharded(dir, tensors, shard_bytes): model-NNNNN-of-NNNNN.safetensors + model.safetensors.index.json.
read_file(path) -> {name: (dtype, shape, bytes)}; read_dir(dir) follows the index (shard_files).
"""
import json
import os
import struct

import numpy as np

DTYPE_SIZE = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "I32": 4, "I64": 8}
NP_TO_DT = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64", np.dtype(np.int32): "I32",
            np.dtype(np.uint8): "U8", np.dtype(np.int8): "I8", np.dtype(np.float16): "F16"}


def _entry(v):
    if isinstance(v, np.ndarray):
        a = np.ascontiguousarray(v)
        return NP_TO_DT[a.dtype], list(a.shape), a.tobytes()
    dt, shape, raw = v
    return dt, list(shape), bytes(raw)


def _header(entries, metadata):
    hdr, off = {}, 0
    if metadata:
        hdr["__metadata__"] = metadata
    for name, (dt, shape, raw) in entries:
        n = len(raw)
        assert n == int(np.prod(shape, dtype=np.int64)) * DTYPE_SIZE[dt], (name, dt, shape, n)
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    blob = json.dumps(hdr, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    return blob


def write_file(path, tensors, metadata=None):
    entries = [(k, _entry(v)) for k, v in tensors.items()]
    blob = _header(entries, metadata)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for _, (_, _, raw) in entries:
            f.write(raw)


def write_sharded(outdir, tensors, shard_bytes=1 << 30):
    """Split tensors (in insertion order) into shards of about shard_bytes; writes the index."""
    items = [(k, _entry(v)) for k, v in tensors.items()]
    shards, cur, size = [], [], 0
    for k, e in items:
        if cur and size + len(e[2]) > shard_bytes:
            shards.append(cur); cur, size = [], 0
        cur.append((k, e)); size += len(e[2])
    if cur:
        shards.append(cur)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        fname = "model-%05d-of-%05d.safetensors" % (i + 1, len(shards))
        write_file(os.path.join(outdir, fname), {k: e for k, e in shard})
        for k, e in shard:
            weight_map[k] = fname
            total += len(e[2])
    with open(os.path.join(outdir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)


def read_file(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = (v["dtype"], v["shape"], data[a:b])
    return out


def shard_files(d):
    """The checkpoint's shard file names: the index's, else every *.safetensors in d."""
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        return sorted(set(json.load(open(idx))["weight_map"].values()))
    return sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))


def read_dir(d):
    out = {}
    for f in shard_files(d):
        out.update(read_file(os.path.join(d, f)))
    return out


# ---- number formats (deepseek_v4.md §7) -------------------------------------------------------

def bf16_round(x):
    """Round float32 values to bfloat16 (nearest even), returned as float32."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return (u.astype(np.uint32) << 16).view(np.float32)


def bf16_bytes(x):
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16).tobytes()


def bf16_decode(raw, shape):
    return (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)


def _grid(mant_bits, min_exp, max_val):
    """All non-negative finite values of a small float format."""
    vals = [0.0]
    for m in range(1, 1 << mant_bits):      # subnormals
        vals.append(m / (1 << mant_bits) * 2.0 ** min_exp)
    e = min_exp
    while True:
        for m in range(1 << mant_bits):
            v = (1 + m / (1 << mant_bits)) * 2.0 ** e
            if v > max_val:
                return np.array(sorted(set(vals)))
            vals.append(v)
        e += 1


E4M3_GRID = _grid(3, -6, 448.0)      # 0 .. 448
E2M1_GRID = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float64)


def round_to_grid(x, grid):
    """Nearest grid value, ties to the even code (grid index), saturating; keeps sign."""
    x = np.asarray(x, dtype=np.float64)
    a = np.minimum(np.abs(x), grid[-1])
    hi = np.clip(np.searchsorted(grid, a), 0, len(grid) - 1)
    lo = np.clip(hi - 1, 0, len(grid) - 1)
    dlo, dhi = a - grid[lo], grid[hi] - a
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    return np.sign(x) * grid[pick], pick


def e4m3_encode(x):
    """float -> E4M3 bytes (values must already be on the grid or are rounded)."""
    v, idx = round_to_grid(x, E4M3_GRID)
    # grid index -> code: index 0..7 are exponent field 0 (subnormals incl. 0), then 8 per exponent
    code = idx.astype(np.uint8)
    return (code | np.where(np.signbit(v) & (v != 0), 0x80, 0).astype(np.uint8)).astype(np.uint8)


def e4m3_decode(b):
    b = np.asarray(b, dtype=np.uint8)
    mag = E4M3_GRID[np.minimum(b & 0x7F, len(E4M3_GRID) - 1)]
    return np.where(b & 0x80, -mag, mag)


def fp8_quantize_weight(w):
    """[out,in] float -> (E4M3 bytes [out,in], E8M0 scale bytes [ceil(out/128), ceil(in/128)])."""
    out_f, in_f = w.shape
    so, si = -(-out_f // 128), -(-in_f // 128)
    scale = np.zeros((so, si), dtype=np.uint8)
    q = np.zeros(w.shape, dtype=np.uint8)
    for i in range(so):
        for j in range(si):
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            amax = max(float(np.abs(blk).max()), 1e-12)
            e = int(np.ceil(np.log2(amax / 448.0)))
            scale[i, j] = e + 127
            q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = e4m3_encode(blk / 2.0 ** e)
    return q, scale


def fp8_dequantize(q, scale):
    w = e4m3_decode(q)
    s = 2.0 ** (scale.astype(np.float64) - 127)
    return w * np.repeat(np.repeat(s, 128, 0), 128, 1)[: w.shape[0], : w.shape[1]]


def fp4_quantize_weight(w):
    """[out,in] float -> (packed I8 [out,in/2] low nibble = even column, E8M0 [out,in/32])."""
    out_f, in_f = w.shape
    g = w.reshape(out_f, in_f // 32, 32)
    amax = np.maximum(np.abs(g).max(axis=2), 1e-12)
    e = np.ceil(np.log2(amax / 6.0)).astype(np.int64)
    v, idx = round_to_grid(g / (2.0 ** e)[..., None], E2M1_GRID)
    code = idx.astype(np.uint8) | np.where(np.signbit(v) & (v != 0), 8, 0).astype(np.uint8)
    code = code.reshape(out_f, in_f)
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).astype(np.uint8)
    return packed.view(np.int8), (e + 127).astype(np.uint8)


def fp4_dequantize(packed, scale):
    p = packed.view(np.uint8)
    codes = np.empty((p.shape[0], p.shape[1] * 2), dtype=np.uint8)
    codes[:, 0::2] = p & 0xF
    codes[:, 1::2] = p >> 4
    mag = E2M1_GRID[codes & 7]
    v = np.where(codes & 8, -mag, mag)
    s = 2.0 ** (scale.astype(np.float64) - 127)
    return v * np.repeat(s, 32, axis=1)
