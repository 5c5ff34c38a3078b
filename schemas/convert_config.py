"""Configuration of one `hbpe convert` run (recorded whole in the manifest)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from hbpe.schemas.errors import ConfigError
from hbpe.schemas.train_config import MODEL_SIZE_LIMITS

# training predicts patches 1..N-1 from the ones before: N=1 leaves nothing to predict
MIN_SEQ_LEN = 2
# a sample is one latent context, so no model trains on one longer than model.max_patches' limit; without a
# bound, --seq-len 100000000000 "succeeded" with 0 samples (every document shorter) and the refusal came at training
MAX_SEQ_LEN = MODEL_SIZE_LIMITS["max_patches"]


@dataclass(frozen=True)
class ConvertConfig:
    inputs: tuple[str, ...]
    output: str
    tokenizer: str
    excludes: tuple[str, ...] = ()  # globs of files that directory and glob inputs leave out, e.g. "*.md"
    seq_len: int = 1024  # N: patches per sample
    text_field: str = "text"
    id_field: str | None = "id"
    tail: str = "drop"  # "drop" the last partial sample (counted) or "pad" it with PAD
    invalid_utf8: str = "reject"  # or "replace"
    max_doc_bytes: int | None = None
    text_unit: str = "file"  # .txt files: one document per "file" or per "line"
    split_bytes: int = 64 << 20  # large uncompressed line files are cut into ranges of this size
    shard_bytes: int = 64 << 20  # target uncompressed shard size; fixes samples per shard
    encode_batch_docs: int = 256
    # also store the second-stage `patches` column (shard_columns.py); by default readers derive it from `tokens`
    store_patches: bool = False

    def __post_init__(self) -> None:
        if not self.inputs:
            raise ConfigError("no --input given: pass at least one file, directory glob or URI")
        if self.seq_len < MIN_SEQ_LEN:
            raise ConfigError(
                f"seq_len must be >= 2, got {self.seq_len}: a sample needs one context patch and one predicted "
                "patch; pass --seq-len 2 or more"
            )
        if self.seq_len > MAX_SEQ_LEN:
            raise ConfigError(
                f"seq_len must be <= {MAX_SEQ_LEN}, got {self.seq_len}: a sample is one latent context, and no "
                f"model trains on one longer (model.max_patches is at most {MAX_SEQ_LEN}); pass e.g. --seq-len 1024"
            )
        if self.tail not in ("drop", "pad"):
            raise ConfigError(f"tail must be 'drop' or 'pad', got {self.tail!r}")
        if self.invalid_utf8 not in ("reject", "replace"):
            raise ConfigError(f"invalid_utf8 must be 'reject' or 'replace', got {self.invalid_utf8!r}")
        if self.text_unit not in ("file", "line"):
            raise ConfigError(f"text_unit must be 'file' or 'line', got {self.text_unit!r}")
        if self.split_bytes < 1 << 16:
            raise ConfigError(f"split_bytes must be >= 65536, got {self.split_bytes}")
        if self.max_doc_bytes is not None and self.max_doc_bytes < 1:
            raise ConfigError(f"max_doc_bytes must be >= 1, got {self.max_doc_bytes}")
        if not isinstance(self.store_patches, bool):
            raise ConfigError(f"store_patches must be True or False, got {self.store_patches!r}")

    def samples_per_shard(self, max_patch_size: int) -> int:
        """Samples per shard, from the size of a sample with `patches` stored in both layouts.

        So a lean conversion cuts the same shards as a --store-patches one, and streaming (whose
        shuffle works on shards) draws the same samples in the same order from either; a lean
        shard's raw size is then about 4 / (4 + 2S) of `shard_bytes` (a sixth at S=10).
        """
        per_sample = self.seq_len * (4 + 2 * max_patch_size) + 8
        return max(1, self.shard_bytes // per_sample)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["inputs"] = list(self.inputs)
        d["excludes"] = list(self.excludes)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ConvertConfig:
        """The config a manifest records; one without `store_patches` (hbpe before it) stored them."""
        return cls(
            **{
                **d,
                "inputs": tuple(d["inputs"]),
                "excludes": tuple(d.get("excludes", ())),
                "store_patches": d.get("store_patches", True),
            }
        )
