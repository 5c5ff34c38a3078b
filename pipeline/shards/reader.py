"""Read a committed shard directory: manifest, MDS index, tokenizer copy, samples.

`read_manifest` is the one reader of manifest.json, and `ShardDir` the one reader of a whole
directory, for local and remote (gs://, s3://) directories alike; training uses them too.

Shards are decoded by `hbpe.pipeline.shards.mds_format` in memory (streaming's dataset would
copy them to a cache directory, and importing it costs ~10 s). Every shard is
checked against index.json (size, then xxh64) before it is decoded, so a damaged
file is an ArtifactError naming it, never a zstd traceback or silently wrong samples.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hbpe.pipeline import storage
from hbpe.pipeline.shards import mds_format
from hbpe.pipeline.tokenizer import artifact
from hbpe.schemas import shard_columns
from hbpe.schemas.errors import ArtifactError
from hbpe.schemas.manifest import Manifest

if TYPE_CHECKING:
    from hbpe.pipeline.tokenizer.hierarchical import HierarchicalTokenizer

RESTORE = "restore the file from a copy or reconvert with `hbpe convert --overwrite`"


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def parse_manifest(raw: bytes, *, source: str) -> Manifest:
    """manifest.json bytes -> Manifest, refusing bad JSON and values of the wrong type.

    `Manifest.from_dict` checks the format and the field names; the types are checked here
    because a count stored as a string would otherwise surface as a TypeError (or, for
    `seq_len`, as string repetition) deep inside `verify` or training.
    """
    try:
        d = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{source}: not valid JSON ({e}); {RESTORE}") from e
    if not isinstance(d, dict):
        raise ArtifactError(f"{source}: a JSON {type(d).__name__}, not an hbpe shard manifest; {RESTORE}")
    try:
        m = Manifest.from_dict(d, source=source)
    except ArtifactError as e:
        if "malformed" not in str(e):
            raise  # its own message already says to reconvert
        raise ArtifactError(f"{e}; {RESTORE}") from e
    wrong = [
        f"{k}={getattr(m, k)!r}"
        for k in ("shard_schema_version", "max_patch_size", "seq_len")
        if not _is_count(getattr(m, k)) or getattr(m, k) == 0
    ]
    wrong += [
        f"{k}={getattr(m, k)!r}"
        for k in ("hbpe_version", "tokenizer_fingerprint", "first_stage_fingerprint", "mode")
        if not isinstance(getattr(m, k), str)
    ]
    wrong += [
        f"{k} is not an object" for k in ("config", "statistics", "timing") if not isinstance(getattr(m, k), dict)
    ]
    if not isinstance(m.inputs, list):
        wrong.append("inputs is not a list")
    if m.columns not in (list(shard_columns.LEAN_COLUMNS), list(shard_columns.STORED_COLUMNS)):
        wrong.append(
            f"columns={m.columns!r} (hbpe shards store {list(shard_columns.LEAN_COLUMNS)}, or "
            f"{list(shard_columns.STORED_COLUMNS)} with --store-patches)"
        )
    if not isinstance(m.shards, list) or not all(isinstance(s, str) for s in m.shards):
        wrong.append("shards is not a list of file names")
    counts = {k: v for k, v in vars(m.counts).items() if k != "rejected_by_reason"}
    wrong += [f"counts.{k}={v!r}" for k, v in counts.items() if not _is_count(v)]
    reasons = m.counts.rejected_by_reason
    if not isinstance(reasons, dict) or not all(_is_count(v) for v in reasons.values()):
        wrong.append(f"counts.rejected_by_reason={reasons!r}")
    if wrong:
        raise ArtifactError(f"{source}: values of the wrong type or range: {', '.join(wrong[:6])}; {RESTORE}")
    if m.shard_schema_version > shard_columns.SHARD_SCHEMA_VERSION:
        raise ArtifactError(
            f"{source}: shard schema {m.shard_schema_version} is newer than this hbpe reads "
            f"({shard_columns.SHARD_SCHEMA_VERSION}, written by hbpe {m.hbpe_version!r}): upgrade hbpe"
        )
    return m


def columns_problem(entry: dict, manifest: Manifest) -> str | None:
    """How a shard's index.json entry disagrees with the columns the manifest says every shard stores (None: it agrees).

    Readers take `patches` from the shards when the manifest lists it and derive it from `tokens` when
    not: a shard of the other layout would fail (or decode wrongly) deep inside training.
    """
    got = dict(zip(entry["column_names"], entry["column_encodings"], strict=True))
    want = manifest.mds_columns()
    if got == want:
        return None
    layout = "with `patches`" if manifest.stores_patches else "without `patches` (derived from `tokens`)"
    return (
        f"stores columns {got}, manifest.json says every shard stores {want} ({layout}; seq_len {manifest.seq_len}, "
        f"S={manifest.max_patch_size}): index.json and manifest.json are not from the same conversion"
    )


def columns_error(where: str | os.PathLike, entry: dict, problem: str) -> ArtifactError:
    """The one error of a shard whose columns disagree with the manifest, naming its file, with the fix."""
    return ArtifactError(f"{where}: shard {entry['zip_data']['basename']} {problem}; {RESTORE}")


def read_manifest(shards: str | os.PathLike) -> Manifest:
    """The manifest of a finished shard directory (local, or a URI), refused unless it has COMPLETED.

    A remote directory gets the same check: streaming would otherwise train on whatever
    shards an unfinished or failed conversion left there.
    """
    shards = str(shards)
    mpath = storage.join(shards, shard_columns.MANIFEST_FILENAME)
    if storage.read_if_exists(storage.join(shards, shard_columns.COMPLETED_FILENAME)) is None:
        # only on failure: was it a conversion at all? (two more reads, remote ones included)
        ipath = storage.join(shards, shard_columns.INDEX_FILENAME)
        if storage.read_if_exists(mpath) is None and storage.read_if_exists(ipath) is None:
            if storage.is_remote(shards):
                storage.check_bucket(shards)  # a missing bucket is named as such, not as "no index.json"
            raise ArtifactError(
                f"{shards} is not a shard directory (no index.json or manifest.json); run `hbpe convert` first"
            )
        raise ArtifactError(
            f"{shards} has no COMPLETED marker: the conversion did not finish (or an --overwrite swap was cut short); "
            "rerun the same `hbpe convert` with --resume, or with --overwrite to start over"
        )
    raw = storage.read_if_exists(mpath)
    if raw is None:
        raise ArtifactError(f"{mpath}: missing from a completed shard directory; {RESTORE}")
    return parse_manifest(raw, source=mpath)


def read_file(path: Path) -> bytes | None:
    """The file's bytes, or None when it does not exist."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def read_shard_file(directory: str | Path, info: dict) -> bytes | None:
    """The bytes of shard file `info` (an index.json `zip_data`) in a local or remote directory; None when missing.

    A remote read gets the storage deadline plus time for the size index.json records.
    """
    if not storage.is_remote(directory):
        return read_file(Path(directory) / info["basename"])
    timeout = storage.default_timeout() + int(info.get("bytes") or 0) / storage.MIN_RATE
    return storage.read_if_exists(storage.join(directory, info["basename"]), timeout=timeout)


def shard_file_problems(directory: str | Path, index: dict, *, hashes: bool = True) -> list[str]:
    """'NAME: problem' for every shard file of `index` that is missing, resized or (with hashes) altered.

    A remote directory's files are always read and hashed: a bucket has no cheap size lookup here.
    """
    problems = []
    for e in index["shards"]:
        info = e["zip_data"]
        path = Path(directory) / info["basename"]
        if hashes or storage.is_remote(directory):
            problem = mds_format.file_problem(read_shard_file(directory, info), info)
        elif not path.is_file():
            problem = "missing"
        elif (size := path.stat().st_size) != info["bytes"]:
            problem = f"{size} bytes, index.json records {info['bytes']} (truncated or replaced)"
        else:
            problem = None
        if problem:
            problems.append(f"{info['basename']}: {problem}")
    return problems


def damaged_error(where: str | Path, problems: list[str], *, more: str = "") -> ArtifactError:
    """One error for every damaged shard file, with the fix."""
    shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
    noun = "shard file is" if len(problems) == 1 else f"{len(problems)} shard files are"
    return ArtifactError(f"{where}: {noun} damaged: {shown}; {RESTORE}{more}")


def load_shard_tokenizer(shards: str | os.PathLike, manifest: Manifest | None = None) -> HierarchicalTokenizer:
    """The tokenizer copy of a shard directory (local or a URI), refused unless the manifest's fingerprint is its.

    Another valid tokenizer (say an S=6 one copied over the S=10 one) loads fine but decodes
    the symbols into garbage or fails on patch shapes: every reader goes through this check.
    """

    m = manifest or read_manifest(shards)
    tdir = storage.join(str(shards), shard_columns.TOKENIZER_DIRNAME)
    tok = artifact.load(tdir)
    if tok.fingerprint != m.tokenizer_fingerprint:
        raise ArtifactError(
            f"{tdir} does not match the manifest: its fingerprint {tok.fingerprint[:12]} "
            f"(S={tok.max_patch_size}, {tok.mode}) != manifest {m.tokenizer_fingerprint[:12]} "
            f"(S={m.max_patch_size}, {m.mode}); restore it from the tokenizer used for the conversion "
            "or reconvert with `hbpe convert --overwrite`"
        )
    return tok


class ShardDir:
    """A shard directory written by `hbpe convert`, local or a URI (refused unless COMPLETED).

    `path` is a Path for a local directory and the URI (without a trailing /) for a remote one;
    a remote directory's files are read through `hbpe.pipeline.storage`, one shard at a time.
    """

    def __init__(self, path: str | Path) -> None:
        self.path: str | Path = str(path).rstrip("/") if storage.is_remote(path) else Path(path)
        self.manifest = read_manifest(self.path)
        ipath = storage.join(self.path, shard_columns.INDEX_FILENAME)
        raw = storage.read_if_exists(ipath)
        if raw is None:
            raise ArtifactError(f"{ipath}: missing from a completed shard directory; {RESTORE}")
        self.index = mds_format.parse_index(raw, source=str(ipath))
        for e in self.index["shards"]:
            if problem := columns_problem(e, self.manifest):
                raise columns_error(self.path, e, problem)
        self._tok = None

    @property
    def remote(self) -> bool:
        return storage.is_remote(self.path)

    def file_path(self, name: str) -> str:
        """Where file `name` of the directory is (a path, or a URI)."""
        return storage.join(self.path, name)

    @property
    def tokenizer(self) -> HierarchicalTokenizer:
        """The tokenizer copy, refused unless it is the one the shards were encoded with."""
        if self._tok is None:
            self._tok = load_shard_tokenizer(self.path, self.manifest)
        return self._tok

    @property
    def shard_entries(self) -> list[dict]:
        return self.index["shards"]

    def check_files(self, *, hashes: bool = True) -> None:
        """Raise one ArtifactError naming every shard file that does not match index.json."""
        problems = shard_file_problems(self.path, self.index, hashes=hashes)
        if problems:
            raise damaged_error(
                self.path, problems, more=f" (`hbpe shards verify --data {self.path}` lists every problem)"
            )

    def read_raw(self, entry: dict) -> bytes:
        """The decompressed shard, after checking the file and the result against index.json."""
        name = entry["zip_data"]["basename"]
        data = read_shard_file(self.path, entry["zip_data"])
        problem = mds_format.file_problem(data, entry["zip_data"])
        if problem:
            raise damaged_error(self.path, [f"{name}: {problem}"])
        raw = mds_format.decompress(data, name=self.file_path(name))
        problem = mds_format.file_problem(raw, entry["raw_data"])
        if problem:
            raise damaged_error(self.path, [f"{name}: decompressed data {problem}"])
        return raw

    def read_columns(self, entry: dict, raw: bytes | None = None) -> dict[str, np.ndarray]:
        name = self.file_path(entry["zip_data"]["basename"])
        return mds_format.decode_raw_shard(self.read_raw(entry) if raw is None else raw, entry, name=name)

    def patches(self, columns: dict[str, np.ndarray]) -> np.ndarray:
        """`patches` of decoded columns (or of one sample): stored, or derived from `tokens` with the shards' tokenizer.

        Lean shards (the default) store no `patches`: every patch is the tokenizer's table row of its token.
        """
        return columns["patches"] if "patches" in columns else self.tokenizer.patches(columns["tokens"])

    def iter_samples(self, entry: dict, raw: bytes | None = None) -> Iterator[dict[str, np.ndarray]]:
        cols = self.read_columns(entry, raw)
        for i in range(entry["samples"]):
            yield {k: v[i] for k, v in cols.items()}

    def samples(self) -> Iterator[dict[str, np.ndarray]]:
        for entry in self.shard_entries:
            yield from self.iter_samples(entry)
