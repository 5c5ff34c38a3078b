"""The tokenizer artifact: one self-contained directory that loads offline anywhere.

Layout:
    DIR/tokenizer.json        this spec (format, version, both stages, fingerprint)
    DIR/first_stage.tiktoken  the first-stage rank file ("base64(token) rank" per line)

The fingerprint is the sha256 of the canonical JSON of everything except the
fingerprint itself; the first-stage block hashes the rank file, so any edit to
either file is detected on load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from schemas import symbols
from schemas.canonical import canonical_json, sha256_hex
from schemas.errors import ArtifactError

FORMAT_NAME = "hbpe-tokenizer"
SCHEMA_VERSION = 1
SPEC_FILENAME = "tokenizer.json"
RANK_FILENAME = "first_stage.tiktoken"
MODES = ("full", "minimal")


@dataclass(frozen=True)
class FirstStageSpec:
    """A tiktoken-compatible byte-level BPE: rank file + split pattern + special tokens."""

    name: str
    pattern: str
    special_tokens: dict[str, int]
    rank_file_sha256: str
    n_vocab: int
    rank_file: str = RANK_FILENAME

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pattern": self.pattern,
            "special_tokens": dict(sorted(self.special_tokens.items())),
            "rank_file": self.rank_file,
            "rank_file_sha256": self.rank_file_sha256,
            "n_vocab": self.n_vocab,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FirstStageSpec:
        return cls(
            name=d["name"],
            pattern=d["pattern"],
            special_tokens={k: int(v) for k, v in d["special_tokens"].items()},
            rank_file_sha256=d["rank_file_sha256"],
            n_vocab=int(d["n_vocab"]),
            rank_file=d.get("rank_file", RANK_FILENAME),
        )

    @property
    def fingerprint(self) -> str:
        """Identity of the first stage alone: shards with the same one can be re-patched."""
        d = self.to_dict()
        d.pop("rank_file")  # the file's name is layout, its hash is content
        return sha256_hex(canonical_json(d))


@dataclass(frozen=True)
class SecondStageSpec:
    """The hierarchical BPE: merges learned by Algorithm 1 for a maximum patch size S."""

    max_patch_size: int
    mode: str
    merges: tuple[tuple[int, int], ...]
    id_layout: dict[str, Any] = field(default_factory=lambda: dict(symbols.ID_LAYOUT))

    def __post_init__(self) -> None:
        if self.max_patch_size < 2:
            raise ArtifactError(f"max_patch_size must be >= 2 (one byte + EOP), got {self.max_patch_size}")
        if self.mode not in MODES:
            raise ArtifactError(f"mode must be one of {MODES}, got {self.mode!r}")

    @property
    def vocab_size(self) -> int:
        """V' = 259 + number of merges: the local models' vocabulary."""
        return symbols.FIRST_MERGE_ID + len(self.merges)

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_patch_size": self.max_patch_size,
            "mode": self.mode,
            "id_layout": self.id_layout,
            "vocab_size": self.vocab_size,
            "merges": [list(m) for m in self.merges],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SecondStageSpec:
        return cls(
            max_patch_size=int(d["max_patch_size"]),
            mode=d["mode"],
            merges=tuple((int(a), int(b)) for a, b in d["merges"]),
            id_layout=d.get("id_layout", dict(symbols.ID_LAYOUT)),
        )


@dataclass(frozen=True)
class TokenizerSpec:
    """Both stages, versioned, with a fingerprint over the canonical content."""

    first_stage: FirstStageSpec
    second_stage: SecondStageSpec
    hbpe_version: str = ""

    def content_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "version": SCHEMA_VERSION,
            "first_stage": self.first_stage.to_dict(),
            "second_stage": self.second_stage.to_dict(),
        }

    @property
    def fingerprint(self) -> str:
        return sha256_hex(canonical_json(self.content_dict()))

    def to_dict(self) -> dict[str, Any]:
        d = self.content_dict()
        d["fingerprint"] = self.fingerprint
        d["hbpe_version"] = self.hbpe_version  # informational, outside the fingerprint
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, source: str = "tokenizer.json") -> TokenizerSpec:
        if d.get("format") != FORMAT_NAME:
            raise ArtifactError(
                f"{source}: format is {d.get('format')!r}, expected {FORMAT_NAME!r}; "
                "is this an hbpe tokenizer directory?"
            )
        if d.get("version") != SCHEMA_VERSION:
            raise ArtifactError(
                f"{source}: schema version {d.get('version')!r} is not supported (this hbpe "
                f"reads version {SCHEMA_VERSION}); retrain with `hbpe tokenizer train` or "
                "upgrade hbpe"
            )
        try:
            spec = cls(
                first_stage=FirstStageSpec.from_dict(d["first_stage"]),
                second_stage=SecondStageSpec.from_dict(d["second_stage"]),
                hbpe_version=d.get("hbpe_version", ""),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ArtifactError(f"{source}: malformed tokenizer spec ({e!r})") from e
        if d.get("fingerprint") != spec.fingerprint:
            raise ArtifactError(
                f"{source}: fingerprint mismatch (stored {d.get('fingerprint')!r}, content "
                f"hashes to {spec.fingerprint!r}): the file was edited; retrain or restore it"
            )
        return spec
