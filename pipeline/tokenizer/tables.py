"""Write and read a tokenizer's built tables (schemas/tokenizer_tables.py), so loading neither parses nor builds.

Without them, loading gpt2 at S=10 spends most of its time on two things (cProfile): parsing the
base64 rank file line by line into tiktoken's `{token bytes: rank}` and running the merges over
the whole vocabulary for the `[n_vocab + 2, S]` patch table. The tables hold both results as flat
arrays; reading them is one file read, one sha256, and slicing the token bytes into the dict that
tiktoken's Encoding takes.

Nothing is trusted blindly: the data file must have the manifest's size and sha256, the manifest
the tokenizer's fingerprint, and every shape the spec's vocabulary and S; any mismatch is one
ArtifactError naming the file and the command that rebuilds the tables.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import NamedTuple

import numpy as np

from hbpe.pipeline.tokenizer.first_stage import vocabulary_tokens
from hbpe.pipeline.tokenizer.hierarchical import HierarchicalTokenizer, PatchTables
from hbpe.schemas.canonical import pretty_json, sha256_hex
from hbpe.schemas.errors import ArtifactError, file_problem
from hbpe.schemas.tokenizer_artifact import TokenizerSpec
from hbpe.schemas.tokenizer_tables import (
    TABLES_DATA_FILENAME,
    TABLES_FORMAT,
    TABLES_MANIFEST_FILENAME,
    TABLES_VERSION,
    TablesManifest,
    data_size,
    layout,
)


class LoadedTables(NamedTuple):
    """What the tables give the loader: tiktoken's mergeable ranks and the second stage's arrays."""

    ranks: dict[bytes, int]
    patches: PatchTables


def rebuild_hint(shown: str | os.PathLike) -> str:
    return f"`hbpe tokenizer tables --tokenizer {shown}`"


# ---- writing --------------------------------------------------------------------------------


def arrays_of(tok: HierarchicalTokenizer) -> dict[str, np.ndarray]:
    """The arrays of ARRAYS for `tok`, in the dtypes the data file stores."""
    vocab = vocabulary_tokens(tok.encoding)  # (id, bytes), ascending ids
    lengths = np.fromiter((len(b) for _, b in vocab), dtype=np.int64, count=len(vocab))
    return {
        "token_ids": np.fromiter((i for i, _ in vocab), dtype=np.int64, count=len(vocab)),
        "token_offsets": np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(lengths)]),
        "token_bytes": np.frombuffer(b"".join(b for _, b in vocab), dtype=np.uint8),
        "patch_table": tok.table,
        "patch_lengths": tok.patch_lengths,
        "token_nbytes": tok.token_nbytes,
    }


def encode(tok: HierarchicalTokenizer) -> tuple[bytes, bytes]:
    """(data file, manifest file) of `tok`'s tables: the same bytes for the same tokenizer, on any machine."""
    arrays = arrays_of(tok)
    top = max(arrays["token_offsets"][-1], arrays["token_ids"][-1] if len(arrays["token_ids"]) else 0)
    if top >= 2**31:  # a first stage of 2 GiB of token bytes, or an id past int32
        raise ArtifactError(
            f"the first stage does not fit the tables' int32 ids and offsets ({top}); save the tokenizer without "
            "tables (with_tables=False)"
        )
    entries = layout({name: a.shape for name, a in arrays.items()})
    data = bytearray()
    for e in entries:
        data += bytes(e.offset - len(data))  # zero padding up to the array's 64-byte boundary
        data += np.ascontiguousarray(arrays[e.name], dtype=e.dtype).tobytes()
    data += bytes(data_size(entries) - len(data))
    manifest = TablesManifest(tokenizer_fingerprint=tok.fingerprint, sha256=sha256_hex(data), arrays=entries)
    return bytes(data), pretty_json(manifest.to_dict()).encode()


def write(tok: HierarchicalTokenizer, folder: str | os.PathLike) -> dict[str, int]:
    """Write the tables into `folder` -> {file name: bytes}. The data file goes first, the manifest last, each
    renamed into place: a crash leaves the old tables, or new data the old manifest refuses (a clear error)."""
    data, manifest = encode(tok)
    files = {TABLES_DATA_FILENAME: data, TABLES_MANIFEST_FILENAME: manifest}
    for name, content in files.items():
        _write_atomic(Path(folder) / name, content)
    return {name: len(content) for name, content in files.items()}


def _write_atomic(path: Path, data: bytes) -> None:
    # a fresh name opened with "x" gets the umask's mode, as any new file (mkstemp's 0o600 would hide a
    # shared tokenizer's tables from the other users)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# ---- reading --------------------------------------------------------------------------------


def read_manifest(folder: str | os.PathLike, *, shown: str) -> TablesManifest | None:
    """The tables' manifest in `folder`; None when there is none or it is of another TABLES_VERSION (rebuild)."""
    path = Path(folder) / TABLES_MANIFEST_FILENAME
    if not path.exists():
        return None
    where, fix = f"{shown}/{TABLES_MANIFEST_FILENAME}", f"rebuild the tables with {rebuild_hint(shown)}"
    problem = file_problem(path)
    if problem is not None:
        raise ArtifactError(f"{where} {problem}; {fix}")
    try:
        raw = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{where}: not valid JSON ({e}); {fix}") from None
    if not isinstance(raw, dict) or raw.get("format") != TABLES_FORMAT:
        raise ArtifactError(f"{where}: not an hbpe tokenizer tables manifest (format {TABLES_FORMAT!r}); {fix}")
    if raw.get("version") != TABLES_VERSION:
        return None
    try:
        return TablesManifest.from_dict(raw)
    except ArtifactError as e:
        raise ArtifactError(f"{where}: malformed: {e}; {fix}") from None


def read(
    folder: str | os.PathLike, manifest: TablesManifest, spec: TokenizerSpec, *, rank_file_size: int, shown: str
) -> LoadedTables:
    """The tables of `manifest`, checked against it and against `spec` before and after reading the data file.

    `rank_file_size` bounds the token bytes (base64 is longer than the bytes it encodes), so no manifest
    makes the reader allocate more than the artifact's own files justify.
    """
    data_path = Path(folder) / manifest.file
    fix = f"rebuild the tables with {rebuild_hint(shown)}"
    if manifest.tokenizer_fingerprint != spec.fingerprint:
        raise ArtifactError(
            f"{shown}/{TABLES_MANIFEST_FILENAME} is for another tokenizer (fingerprint "
            f"{manifest.tokenizer_fingerprint[:12]}, the spec's is {spec.fingerprint[:12]}); {fix}"
        )
    _check_shapes(manifest, spec, rank_file_size=rank_file_size, where=f"{shown}/{TABLES_MANIFEST_FILENAME}", fix=fix)
    where = f"{shown}/{manifest.file}"
    problem = file_problem(data_path, missing="is missing")
    if problem is not None:
        raise ArtifactError(f"{where} {problem}; {fix}")
    size = data_path.stat().st_size
    if size != manifest.size:
        raise ArtifactError(f"{where} has {size} bytes, its manifest says {manifest.size}; {fix}")
    data = bytearray(size)  # writable: the tokenizer's arrays are ordinary numpy arrays
    with open(data_path, "rb") as f:
        if f.readinto(data) != size:
            raise ArtifactError(f"{where} changed while it was read; {fix}")
    digest = sha256_hex(data)
    if digest != manifest.sha256:
        raise ArtifactError(
            f"{where} was altered: its sha256 {digest[:16]}... differs from its manifest's {manifest.sha256[:16]}...; "
            f"{fix}"
        )
    arrays = {
        e.name: np.frombuffer(data, dtype=e.dtype, count=int(np.prod(e.shape)), offset=e.offset).reshape(e.shape)
        for e in manifest.arrays
    }
    return LoadedTables(
        _ranks(arrays, where=where, fix=fix),
        PatchTables(arrays["patch_table"], arrays["patch_lengths"], arrays["token_nbytes"]),
    )


def _check_shapes(manifest: TablesManifest, spec: TokenizerSpec, *, rank_file_size: int, where: str, fix: str) -> None:
    """Every shape the spec implies: R + 2 rows of S symbols, at most R tokens, no more bytes than the rank file."""
    rows, S = spec.first_stage.n_vocab + 2, spec.second_stage.max_patch_size
    (n,), (n_bytes,) = manifest.shape("token_ids"), manifest.shape("token_bytes")
    expected = {
        "token_offsets": (n + 1,),
        "patch_table": (rows, S),
        "patch_lengths": (rows,),
        "token_nbytes": (rows,),
    }
    wrong = [f"{k} {manifest.shape(k)} (expected {v})" for k, v in expected.items() if manifest.shape(k) != v]
    if n > rows - 2:
        wrong.append(f"token_ids ({n},) (more than the spec's {rows - 2} ids)")
    if n_bytes > rank_file_size:
        wrong.append(f"token_bytes ({n_bytes},) (more than the {rank_file_size} bytes of the rank file)")
    if wrong:
        raise ArtifactError(f"{where}: shapes do not fit the tokenizer (n_vocab {rows - 2}, S={S}): {wrong[0]}; {fix}")


def _ranks(arrays: dict[str, np.ndarray], *, where: str, fix: str) -> dict[bytes, int]:
    """tiktoken's `{token bytes: rank}` from the flat arrays (a slice per token: no base64 to decode)."""
    ids, offsets, blob = arrays["token_ids"], arrays["token_offsets"], arrays["token_bytes"]
    ok = len(offsets) and offsets[0] == 0 and offsets[-1] == len(blob) and bool(np.all(np.diff(offsets) >= 0))
    if not ok or (len(ids) and not (ids[0] >= 0 and bool(np.all(np.diff(ids) > 0)))):
        raise ArtifactError(f"{where}: token offsets or ids out of order; {fix}")
    o, b = offsets.tolist(), blob.tobytes()
    ranks = dict(zip([b[i:j] for i, j in zip(o, o[1:])], ids.tolist()))
    if len(ranks) != len(ids):
        raise ArtifactError(f"{where}: a token appears twice; {fix}")
    return ranks
