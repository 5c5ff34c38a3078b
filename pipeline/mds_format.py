"""MDS shard files for hbpe's fixed-shape columns, written and read without importing `streaming`.

`import streaming` pulls in torch and transformers (~10 s), which every Beam worker
would pay. Our columns all have a static dtype and shape, so a sample is a
fixed-size record and a whole shard is a few numpy operations. The bytes are
exactly what streaming's MDSWriter writes (a test checks this byte for byte):

    raw shard = uint32 num_samples | uint32 offsets[num_samples + 1] | config JSON | samples
    sample    = the columns in sorted-name order, each value's raw bytes (no size header
                because every column has a static size)
    zip shard = zstd level 3 of the raw shard (the `zstd` module streaming itself uses)
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

from schemas.errors import ArtifactError

ZSTD_LEVEL = 3  # streaming's default for compression="zstd"


def _parse_encoding(enc: str) -> tuple[np.dtype, tuple[int, ...]]:
    """'ndarray:int32:1024' -> (int32, (1024,)); 'int64' -> (int64, ())."""
    parts = enc.split(":")
    if parts[0] == "ndarray" and len(parts) == 3:
        return np.dtype(parts[1]), tuple(int(x) for x in parts[2].split(","))
    if len(parts) == 1 and parts[0] in (
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float32",
        "float64",
    ):
        return np.dtype(parts[0]), ()
    raise ArtifactError(f"column encoding {enc!r} is not a fixed-size encoding hbpe can read/write")


def _hash(algo: str, data: bytes) -> str:
    if algo.startswith("xxh"):
        import xxhash

        return getattr(xxhash, algo)(data).hexdigest()
    return hashlib.new(algo, data).hexdigest()


def shard_config(columns: dict[str, str], compression: str | None, hashes: list[str]) -> dict[str, Any]:
    names = sorted(columns)
    sizes = []
    for n in names:
        dtype, shape = _parse_encoding(columns[n])
        sizes.append(int(dtype.itemsize * int(np.prod(shape, dtype=np.int64))))
    return {
        "column_encodings": [columns[n] for n in names],
        "column_names": names,
        "column_sizes": sizes,
        "compression": compression,
        "format": "mds",
        "hashes": hashes,
        "size_limit": None,
        "version": 2,
    }


def encode_raw_shard(
    columns: dict[str, str], values: dict[str, np.ndarray], *, compression: str | None, hashes: list[str]
) -> bytes:
    """Columns of B samples (leading axis B) -> the raw (uncompressed) MDS shard bytes.

    Built in one preallocated buffer (each column copied once into its strided slot),
    then one copy to bytes; a concatenate-then-join version copied every byte three times.
    """
    cfg = shard_config(columns, compression, hashes)
    n = len(next(iter(values.values())))
    config_data = json.dumps(cfg, sort_keys=True).encode("utf-8")
    size = sum(cfg["column_sizes"])
    head = 4 + 4 * (n + 1) + len(config_data)
    if head + size * n >= 1 << 32:
        raise ValueError("an MDS shard must stay under 4 GiB (uint32 offsets); lower --shard-mb")
    buf = np.empty(head + size * n, dtype=np.uint8)
    buf[:4] = np.frombuffer(np.uint32(n).tobytes(), np.uint8)
    buf[4 : 4 + 4 * (n + 1)] = (head + size * np.arange(n + 1, dtype=np.int64)).astype(np.uint32).view(np.uint8)
    buf[4 + 4 * (n + 1) : head] = np.frombuffer(config_data, np.uint8)
    body = buf[head:].reshape(n, size)
    col = 0
    for name, sz in zip(cfg["column_names"], cfg["column_sizes"], strict=True):
        dtype, shape = _parse_encoding(columns[name])
        arr = np.asarray(values[name])
        if arr.shape != (n, *shape):
            raise ValueError(f"column {name}: shape {arr.shape} != {(n, *shape)}")
        body[:, col : col + sz] = np.ascontiguousarray(arr, dtype=dtype).reshape(n, -1).view(np.uint8)
        col += sz
    return buf.tobytes()  # the zstd module takes bytes only (no memoryview)


def write_shard(
    columns: dict[str, str],
    values: dict[str, np.ndarray],
    *,
    basename: str,
    compression: str = "zstd",
    hashes: list[str],
) -> tuple[bytes, dict[str, Any]]:
    """(zip bytes, index.json entry) for one shard named `basename` (e.g. shard.00000.mds.zstd)."""
    import zstd

    if compression != "zstd":
        raise ValueError("hbpe writes zstd-compressed MDS shards only")
    raw = encode_raw_shard(columns, values, compression=compression, hashes=hashes)
    data = zstd.compress(raw, ZSTD_LEVEL)
    entry = {
        **shard_config(columns, compression, hashes),
        "samples": len(next(iter(values.values()))),
        "raw_data": {
            "basename": basename[: -len(".zstd")],
            "bytes": len(raw),
            "hashes": {a: _hash(a, raw) for a in hashes},
        },
        "zip_data": {"basename": basename, "bytes": len(data), "hashes": {a: _hash(a, data) for a in hashes}},
    }
    return data, entry


def decompress(data: bytes) -> bytes:
    import zstd

    return zstd.decompress(data)


def decode_raw_shard(raw: bytes, entry: dict[str, Any]) -> dict[str, np.ndarray]:
    """Raw MDS shard bytes -> {column: (B, ...) array}, for fixed-size columns."""
    n = int(np.frombuffer(raw[:4], np.uint32)[0])
    offsets = np.frombuffer(raw[4 : 4 + 4 * (n + 1)], np.uint32).astype(np.int64)
    size = sum(entry["column_sizes"])
    if n and not (np.diff(offsets) == size).all():
        raise ArtifactError("shard samples are not fixed-size: not written by hbpe")
    body = np.frombuffer(raw, np.uint8, count=n * size, offset=int(offsets[0]) if n else 0).reshape(n, size)
    out, col = {}, 0
    for name, enc, sz in zip(entry["column_names"], entry["column_encodings"], entry["column_sizes"], strict=True):
        dtype, shape = _parse_encoding(enc)
        out[name] = np.ascontiguousarray(body[:, col : col + sz]).view(dtype).reshape(n, *shape)
        col += sz
    return out


def verify_hashes(data: bytes, info: dict[str, Any]) -> list[str]:
    """Names of the hashes in an index entry's file info that do not match `data`."""
    bad = [a for a, h in info["hashes"].items() if _hash(a, data) != h]
    return bad + (["size"] if len(data) != info["bytes"] else [])
