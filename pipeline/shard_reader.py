"""Read a committed shard directory: manifest, MDS index, tokenizer copy, samples.

Shards are decoded by `pipeline.mds_format` in memory (streaming's dataset would
copy them to a cache directory, and importing it costs ~10 s).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from pipeline import mds_format
from schemas import shard_columns
from schemas.errors import ArtifactError
from schemas.manifest import Manifest


class ShardDir:
    """A local shard directory written by `hbpe convert` (refused unless COMPLETED)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if (
            not (self.path / shard_columns.INDEX_FILENAME).is_file()
            and not (self.path / shard_columns.MANIFEST_FILENAME).is_file()
        ):
            raise ArtifactError(
                f"{self.path} is not a shard directory (no index.json or manifest.json); run `hbpe convert` first"
            )
        if not (self.path / shard_columns.COMPLETED_FILENAME).is_file():
            raise ArtifactError(
                f"{self.path} has no COMPLETED marker: the conversion did not finish; rerun `hbpe convert --overwrite`"
            )
        mpath = self.path / shard_columns.MANIFEST_FILENAME
        try:
            self.manifest = Manifest.from_dict(json.loads(mpath.read_text()), source=str(mpath))
            self.index = json.loads((self.path / shard_columns.INDEX_FILENAME).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ArtifactError(f"{self.path}: cannot read manifest.json/index.json ({e})") from e
        self._tok = None

    @property
    def tokenizer(self):
        if self._tok is None:
            from pipeline import tokenizer_io

            self._tok = tokenizer_io.load(self.path / shard_columns.TOKENIZER_DIRNAME)
        return self._tok

    @property
    def shard_entries(self) -> list[dict]:
        return self.index["shards"]

    def read_raw(self, entry: dict) -> bytes:
        return mds_format.decompress((self.path / entry["zip_data"]["basename"]).read_bytes())

    def read_columns(self, entry: dict, raw: bytes | None = None) -> dict[str, np.ndarray]:
        return mds_format.decode_raw_shard(self.read_raw(entry) if raw is None else raw, entry)

    def iter_samples(self, entry: dict, raw: bytes | None = None) -> Iterator[dict[str, np.ndarray]]:
        cols = self.read_columns(entry, raw)
        for i in range(entry["samples"]):
            yield {k: v[i] for k, v in cols.items()}

    def samples(self) -> Iterator[dict[str, np.ndarray]]:
        for entry in self.shard_entries:
            yield from self.iter_samples(entry)
