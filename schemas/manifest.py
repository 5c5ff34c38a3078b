"""`manifest.json`: everything about how a shard directory was made, beside plain MDS files.

`index.json` stays plain MDS (streaming's merge_index rewrites it), so all of our
metadata lives here. Fields under `timing` are the only ones that differ between
two runs with the same inputs and config.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from hbpe.schemas.errors import ArtifactError

MANIFEST_FORMAT = "hbpe-shards"
MANIFEST_VERSION = 1


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

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, source: str = "manifest.json") -> Manifest:
        if d.get("format") != MANIFEST_FORMAT or d.get("version") != MANIFEST_VERSION:
            raise ArtifactError(
                f"{source}: not an hbpe shard manifest of version {MANIFEST_VERSION} "
                f"(format={d.get('format')!r}, version={d.get('version')!r}); reconvert with this hbpe"
            )
        body = {k: v for k, v in d.items() if k not in ("format", "version")}
        try:
            body["counts"] = Counts(**body["counts"])
            return cls(**body)
        except (KeyError, TypeError) as e:
            raise ArtifactError(f"{source}: malformed manifest ({e})") from e


def derived_statistics(c: Counts, histogram: list[int]) -> dict[str, Any]:
    """Ratios from the counts; `histogram[k]` = tokens whose patch has k symbols."""
    return {
        "bytes_per_patch": c.bytes / max(c.tokens, 1),
        "symbols_per_patch": c.symbols / max(c.tokens, 1),
        "bytes_per_token": c.bytes / max(c.tokens, 1),
        "fertility": c.tokens / max(c.words, 1),
        "patch_length_histogram": histogram,
    }
