"""Read a committed shard directory: manifest, MDS index, tokenizer copy, samples.

Decoding uses streaming's own MDS reader for the sample layout; shards are
decompressed in memory here (streaming's dataset would copy them to a cache
directory, which inspection tools do not need).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

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
        import zstandard

        data = (self.path / entry["zip_data"]["basename"]).read_bytes()
        return zstandard.ZstdDecompressor().decompress(data, max_output_size=entry["raw_data"]["bytes"])

    def iter_samples(self, entry: dict, raw: bytes | None = None) -> Iterator[dict[str, np.ndarray]]:
        from streaming.base.format import reader_from_json

        reader = reader_from_json(str(self.path), None, entry)
        raw = self.read_raw(entry) if raw is None else raw
        n = int(np.frombuffer(raw[:4], np.uint32)[0])
        offsets = np.frombuffer(raw[4 : 4 + 4 * (n + 1)], np.uint32)
        for i in range(n):
            yield reader.decode_sample(raw[offsets[i] : offsets[i + 1]])

    def samples(self) -> Iterator[dict[str, np.ndarray]]:
        for entry in self.shard_entries:
            yield from self.iter_samples(entry)
