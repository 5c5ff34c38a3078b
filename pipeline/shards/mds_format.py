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

from hbpe.schemas.errors import ArtifactError
from hbpe.schemas.names import is_plain_file_name

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


def _hash(algo: str, data: bytes | np.ndarray) -> str:
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
) -> np.ndarray:
    """Columns of B samples (leading axis B) -> the raw (uncompressed) MDS shard, as a uint8 array.

    Built in one preallocated buffer (each column copied once into its strided slot) and handed
    on as it is: `zstd.compress` and the hashes read any contiguous array (not a memoryview), so a
    `tobytes()` copy of the whole shard (64 MiB at the default --shard-mb) would buy nothing.
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
    return buf


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
            "bytes": raw.nbytes,
            "hashes": {a: _hash(a, raw) for a in hashes},
        },
        "zip_data": {"basename": basename, "bytes": len(data), "hashes": {a: _hash(a, data) for a in hashes}},
    }
    return data, entry


def decompress(data: bytes, *, name: str = "shard") -> bytes:
    """zstd-decompress one shard; a damaged frame is an ArtifactError naming the shard, not a zstd.Error."""
    import zstd

    try:
        return zstd.decompress(data)
    except zstd.Error as e:
        raise ArtifactError(f"{name}: cannot be decompressed ({e}); restore the file or reconvert") from e


def decode_raw_shard(raw: bytes, entry: dict[str, Any], *, name: str = "shard") -> dict[str, np.ndarray]:
    """Raw MDS shard bytes -> {column: (B, ...) array}, for fixed-size columns."""
    if len(raw) < 4:
        raise ArtifactError(f"{name}: {len(raw)} bytes is too short for an MDS shard; restore the file or reconvert")
    n = int(np.frombuffer(raw[:4], np.uint32)[0])
    size = sum(entry["column_sizes"])
    if n != entry["samples"] or len(raw) < 4 * (n + 2) + n * size:
        raise ArtifactError(
            f"{name}: holds {n} samples in {len(raw)} bytes, index.json says {entry['samples']} samples of {size} "
            "bytes; restore the file or reconvert"
        )
    offsets = np.frombuffer(raw[4 : 4 + 4 * (n + 1)], np.uint32).astype(np.int64)
    if n and (not (np.diff(offsets) == size).all() or offsets[-1] != len(raw)):
        raise ArtifactError(f"{name}: shard samples are not fixed-size records: not written by hbpe")
    body = np.frombuffer(raw, np.uint8, count=n * size, offset=int(offsets[0]) if n else 0).reshape(n, size)
    out, col = {}, 0
    for name, enc, sz in zip(entry["column_names"], entry["column_encodings"], entry["column_sizes"], strict=True):
        dtype, shape = _parse_encoding(enc)
        out[name] = np.ascontiguousarray(body[:, col : col + sz]).view(dtype).reshape(n, *shape)
        col += sz
    return out


def verify_hashes(data: bytes, info: dict[str, Any]) -> list[str]:
    """Names of the hashes in an index entry's file info that do not match `data` ("size" first: it is free)."""
    if len(data) != info["bytes"]:
        return ["size"]  # a truncated or extended file: no need to hash it
    return [a for a, h in info["hashes"].items() if _hash(a, data) != h]


def file_problem(data: bytes | None, info: dict[str, Any]) -> str | None:
    """Why a shard file does not match its index.json record (None when it does)."""
    if data is None:
        return "missing"
    if len(data) != info["bytes"]:
        return f"{len(data)} bytes, index.json records {info['bytes']} (truncated or replaced)"
    bad = verify_hashes(data, info)
    return f"{'/'.join(bad)} does not match index.json (corrupted or replaced)" if bad else None


# ---- index.json ------------------------------------------------------------------------------

HASH_ALGOS = ("xxh64", "xxh32", "xxh128", "xxh3_64", "md5", "sha1", "sha224", "sha256", "sha384", "sha512")


def check_basename(name: Any, *, source: str) -> str:
    """A shard file name from index.json, refused unless it is a plain name inside the directory.

    Readers join it to the shard directory and streaming joins it to its cache directory,
    so `../x`, `/abs/x` or `a/b` would read or write outside both.
    """
    if not is_plain_file_name(name):
        raise ArtifactError(
            f"{source}: shard basename {name!r} is not a plain file name inside the shard directory "
            "(no path separators, '..' or absolute paths); the index was edited or is not from `hbpe convert`: reconvert"
        )
    return name


def _file_info(info: Any, *, source: str, what: str) -> dict[str, Any]:
    if not isinstance(info, dict):
        raise ArtifactError(f"{source}: {what} is {type(info).__name__}, not an object; reconvert")
    check_basename(info.get("basename"), source=source)
    size, hashes = info.get("bytes"), info.get("hashes")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ArtifactError(f"{source}: {what}.bytes is {size!r}, not a byte count; reconvert")
    if not isinstance(hashes, dict) or not hashes:
        raise ArtifactError(f"{source}: {what}.hashes is {hashes!r}: no hash to verify the shard against; reconvert")
    for algo, h in hashes.items():
        if algo not in HASH_ALGOS or not isinstance(h, str):
            raise ArtifactError(f"{source}: {what}.hashes has {algo!r}: {h!r}, not a known hash; reconvert")
    return info


def parse_index(raw: bytes, *, source: str = "index.json") -> dict[str, Any]:
    """index.json bytes -> the MDS index, with every field hbpe and streaming rely on checked.

    Raises ArtifactError for anything that is not a version-2 MDS index of compressed,
    fixed-size shards with safe file names, hashes and integer sizes.
    """
    try:
        index = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{source}: not valid JSON ({e}); restore it or reconvert") from e
    if not isinstance(index, dict) or index.get("version") != 2 or not isinstance(index.get("shards"), list):
        raise ArtifactError(f"{source}: not an MDS version 2 index with a list of shards; restore it or reconvert")
    seen: set[str] = set()
    for i, e in enumerate(index["shards"]):
        where = f"{source} shard {i}"
        if not isinstance(e, dict):
            raise ArtifactError(f"{where}: {type(e).__name__}, not an object; restore it or reconvert")
        if e.get("format") != "mds" or e.get("zip_data") is None:
            raise ArtifactError(f"{where}: not a compressed MDS shard (hbpe writes zstd MDS only); reconvert")
        names, encs, sizes = e.get("column_names"), e.get("column_encodings"), e.get("column_sizes")
        if not (isinstance(names, list) and isinstance(encs, list) and isinstance(sizes, list)) or not (
            len(names) == len(encs) == len(sizes) and all(isinstance(n, str) for n in names)
        ):
            raise ArtifactError(f"{where}: column_names/encodings/sizes are not matching lists; reconvert")
        for n, enc, sz in zip(names, encs, sizes, strict=True):
            try:
                dtype, shape = _parse_encoding(enc)
                ok = sz == dtype.itemsize * int(np.prod(shape, dtype=np.int64))
            except (ArtifactError, TypeError, ValueError, AttributeError):
                ok = False
            if not ok:
                raise ArtifactError(
                    f"{where}: column {n!r} has encoding {enc!r} and size {sz!r}, not a fixed-size column; reconvert"
                )
        samples = e.get("samples")
        if not isinstance(samples, int) or isinstance(samples, bool) or samples < 0:
            raise ArtifactError(f"{where}: samples is {samples!r}, not a count; reconvert")
        for what in ("zip_data", "raw_data"):
            name = _file_info(e.get(what), source=where, what=what)["basename"]
            if name in seen:
                raise ArtifactError(f"{where}: file {name} is listed twice; the index was edited: reconvert")
            seen.add(name)
    return index
