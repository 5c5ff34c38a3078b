"""`manifest.json`: everything about how a shard directory was made, beside plain MDS files.

`index.json` stays plain MDS (streaming's merge_index rewrites it), so all of our
metadata lives here. Fields under `timing` are the only ones that differ between
two runs with the same inputs and config.

Versions: 1 (hbpe before issue 39) has no `columns`: its shards store every column of shard
schema 1 (`patches` included). 2 adds `columns`, the columns every shard stores.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from hbpe.schemas import shard_columns
from hbpe.schemas.errors import ArtifactError

MANIFEST_FORMAT = "hbpe-shards"
MANIFEST_VERSION = 2
READABLE_VERSIONS = (1, 2)


@dataclass
class Counts:
    documents_read: int = 0
    documents_written: int = 0
    documents_rejected: int = 0
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    bytes: int = 0  # UTF-8 bytes of accepted documents
    words: int = 0  # whitespace-separated words (for fertility)
    tokens: int = 0  # first-stage tokens of accepted documents
    symbols: int = 0  # real second-stage symbols of those tokens (EOP in, PAD out)
    patches: int = 0  # patches in the stream: tokens + one EOD per document
    samples: int = 0
    tail_patches_dropped: int = 0
    tail_tokens_dropped: int = 0
    tail_patches_padded: int = 0

    def balanced(self) -> bool:
        return self.documents_read == self.documents_written + self.documents_rejected

    def reject(self, reason: str) -> None:
        """Count one record set aside for `reason`."""
        self.documents_read += 1
        self.documents_rejected += 1
        self.rejected_by_reason[reason] = self.rejected_by_reason.get(reason, 0) + 1

    def add(self, other: Counts) -> None:
        """Merge another worker's counts into these (every field is a sum)."""
        for f in fields(self):
            if f.name == "rejected_by_reason":
                for reason, n in other.rejected_by_reason.items():
                    self.rejected_by_reason[reason] = self.rejected_by_reason.get(reason, 0) + n
                self.rejected_by_reason = dict(sorted(self.rejected_by_reason.items()))
            else:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass
class Manifest:
    hbpe_version: str
    shard_schema_version: int
    tokenizer_fingerprint: str
    first_stage_fingerprint: str
    max_patch_size: int
    mode: str
    seq_len: int
    config: dict[str, Any]
    inputs: list[dict[str, Any]]
    counts: Counts
    statistics: dict[str, Any]
    shards: list[str]
    timing: dict[str, Any] = field(default_factory=dict)
    # input paths left out because their file or folder was read under another path (symlink loops, links):
    # {"path", "reason", "same_as"} each; or that a folder or glob holds besides files (FIFOs, devices, links to
    # nothing): {"path", "reason"}
    skipped_inputs: list[dict[str, Any]] = field(default_factory=list)
    # the columns every shard stores, sorted (shard_columns.LEAN_COLUMNS or STORED_COLUMNS)
    columns: list[str] = field(default_factory=lambda: list(shard_columns.STORED_COLUMNS))

    @property
    def stores_patches(self) -> bool:
        """Whether the shards hold `patches`; without them readers derive patches from `tokens`."""
        return "patches" in self.columns

    def mds_columns(self) -> dict[str, str]:
        """The column encodings every shard of this directory has (index.json must agree)."""
        return shard_columns.mds_columns(self.seq_len, self.max_patch_size, store_patches=self.stores_patches)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, source: str = "manifest.json") -> Manifest:
        """A manifest of any version this hbpe reads; version 1 gets the columns its shards have."""
        version = d.get("version")
        if d.get("format") != MANIFEST_FORMAT or isinstance(version, bool) or version not in READABLE_VERSIONS:
            raise ArtifactError(
                f"{source}: not an hbpe shard manifest of version {' or '.join(map(str, READABLE_VERSIONS))} "
                f"(format={d.get('format')!r}, version={version!r}); read it with the hbpe that wrote it, "
                "or reconvert with this hbpe"
            )
        body = {k: v for k, v in d.items() if k not in ("format", "version")}
        if version == 1:
            if "columns" in body:
                raise ArtifactError(f"{source}: malformed manifest (version 1 has no columns)")
            body["columns"] = list(shard_columns.STORED_COLUMNS)
        elif "columns" not in body:
            raise ArtifactError(f"{source}: malformed manifest (version {version} without columns)")
        try:
            body["counts"] = Counts(**body["counts"])
            return cls(**body)
        except (KeyError, TypeError) as e:
            raise ArtifactError(f"{source}: malformed manifest ({e})") from e


def ratios(*, nbytes: int, tokens: int, symbols: int, words: int) -> dict[str, float]:
    """The corpus ratios hbpe reports everywhere (a text patch is one first-stage token).

    >>> ratios(nbytes=10, tokens=2, symbols=6, words=2)
    {'bytes_per_patch': 5.0, 'symbols_per_patch': 3.0, 'fertility': 1.0}
    """
    return {
        "bytes_per_patch": nbytes / max(tokens, 1),
        "symbols_per_patch": symbols / max(tokens, 1),  # EOP included, PAD not
        "fertility": tokens / max(words, 1),  # first-stage tokens per whitespace-separated word
    }


def derived_statistics(c: Counts, histogram: list[int]) -> dict[str, Any]:
    """Ratios from the counts; `histogram[k]` = tokens whose patch has k symbols."""
    return {
        **ratios(nbytes=c.bytes, tokens=c.tokens, symbols=c.symbols, words=c.words),
        "patch_length_histogram": histogram,
    }
