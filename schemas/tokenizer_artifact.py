"""The tokenizer artifact: one self-contained directory that loads offline anywhere.

Layout:
    DIR/hbpe_tokenizer.json   this spec (format, version, both stages, fingerprint); artifacts written
                              before issue 19 name it tokenizer.json, which is still read
    DIR/first_stage.tiktoken  the first-stage rank file ("base64(token) rank" per line)

The fingerprint is the sha256 of the canonical JSON of everything except the
fingerprint itself; the first-stage block hashes the rank file, so any edit to
either file is detected on load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hbpe.schemas import symbols
from hbpe.schemas.canonical import canonical_json, sha256_hex
from hbpe.schemas.errors import ArtifactError
from hbpe.schemas.names import is_plain_file_name

FORMAT_NAME = "hbpe-tokenizer"
SCHEMA_VERSION = 1
SPEC_FILENAME = "hbpe_tokenizer.json"
# the spec's name before issue 19: Hugging Face's tokenizer.json is another format (tokenizers.Tokenizer.from_file
# failed on ours inside an export); read, never written. The fingerprint hashes content, not the name.
LEGACY_SPEC_FILENAME = "tokenizer.json"
SPEC_FILENAMES = (SPEC_FILENAME, LEGACY_SPEC_FILENAME)  # the order a reader tries them in
RANK_FILENAME = "first_stage.tiktoken"
MODES = ("full", "minimal")
# S is bounded by the uint8 patch lengths of the [n_vocab, S] table; V' by the uint16 `patches` shard column
MAX_PATCH_SIZE_LIMIT = 255
MAX_VOCAB_SIZE = 1 << 16
_FIX = "restore the tokenizer directory from its source or retrain it with `hbpe tokenizer train`"


def _is_int(value: Any) -> bool:
    # JSON `true` is a Python bool, an int subclass: it must not pass as 1
    return isinstance(value, int) and not isinstance(value, bool)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ArtifactError(message)


def _block(d: Any, name: str) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise ArtifactError(f"{name} must be a JSON object, got {d!r:.80}")
    return d


def _key(d: dict[str, Any], block: str, key: str) -> Any:
    _require(key in d, f"{block} has no {key!r} entry")
    return d[key]


@dataclass(frozen=True)
class FirstStageSpec:
    """A tiktoken-compatible byte-level BPE: rank file + split pattern + special tokens."""

    name: str
    pattern: str
    special_tokens: dict[str, int]
    rank_file_sha256: str
    n_vocab: int
    rank_file: str = RANK_FILENAME

    def __post_init__(self) -> None:
        for key in ("name", "pattern"):
            value = getattr(self, key)
            _require(
                isinstance(value, str) and value != "", f"first_stage.{key} must be a non-empty string, got {value!r}"
            )
        _require(
            isinstance(self.special_tokens, dict)
            and all(isinstance(k, str) and _is_int(v) and v >= 0 for k, v in self.special_tokens.items()),
            f"first_stage.special_tokens must map strings to non-negative integer ids, got {self.special_tokens!r:.80}",
        )
        sha = self.rank_file_sha256
        _require(
            isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha),
            f"first_stage.rank_file_sha256 must be 64 lowercase hex digits, got {sha!r:.80}",
        )
        _require(
            _is_int(self.n_vocab) and self.n_vocab > 0,
            f"first_stage.n_vocab must be a positive integer, got {self.n_vocab!r}",
        )
        # the rank file is read from the artifact directory: a path here could read any file on the machine
        _require(
            is_plain_file_name(self.rank_file),
            f"first_stage.rank_file must be a plain file name inside the tokenizer directory (like {RANK_FILENAME!r}), "
            f"got {self.rank_file!r}",
        )

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
        """Values are taken as they are, not cast: `__post_init__` refuses a wrong type instead of guessing."""
        d = _block(d, "first_stage")
        return cls(
            **{
                k: _key(d, "first_stage", k)
                for k in ("name", "pattern", "special_tokens", "rank_file_sha256", "n_vocab")
            },
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
        S = self.max_patch_size
        _require(_is_int(S), f"second_stage.max_patch_size must be an integer, got {S!r}")
        _require(S >= 2, f"second_stage.max_patch_size must be >= 2 (one byte + EOP), got {S}")
        _require(S <= MAX_PATCH_SIZE_LIMIT, f"second_stage.max_patch_size must be <= {MAX_PATCH_SIZE_LIMIT}, got {S}")
        _require(
            isinstance(self.mode, str) and self.mode in MODES,
            f"second_stage.mode must be one of {MODES}, got {self.mode!r}",
        )
        _require(
            self.id_layout == symbols.ID_LAYOUT,
            f"second_stage.id_layout {self.id_layout!r:.120} differs from this hbpe's {symbols.ID_LAYOUT}",
        )
        self._check_merges()

    def _check_merges(self) -> None:
        """Merge k (0-based) may only join bytes, EOP and earlier merges; anything else breaks the table build.

        A later or unknown id raises IndexError in the tokenizer, and a negative one silently
        indexes from the end; PAD and EOD are never inside a patch.
        """
        merges = self.merges
        _require(
            isinstance(merges, (tuple, list)),
            f"second_stage.merges must be a list of [left, right] id pairs, got {merges!r:.80}",
        )
        limit = MAX_VOCAB_SIZE - symbols.FIRST_MERGE_ID
        _require(
            len(merges) <= limit,
            f"second_stage.merges: {len(merges)} merges exceed the {limit} that fit uint16 patch ids",
        )
        for k, pair in enumerate(merges):
            # explicit ifs, not _require: the messages are built only on failure (o200k has thousands of merges)
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and all(_is_int(i) for i in pair)):
                shown = list(pair) if isinstance(pair, tuple) else pair  # as it reads in the JSON file
                raise ArtifactError(
                    f"second_stage.merges[{k}] must be a [left, right] pair of integer ids, got {shown!r:.80}"
                )
            top = symbols.FIRST_MERGE_ID + k  # merge k's own id: only ids below it may appear
            for i in pair:
                if not (0 <= i <= symbols.EOP or symbols.FIRST_MERGE_ID <= i < top):
                    earlier = f" or {symbols.FIRST_MERGE_ID}..{top - 1} (earlier merges)" if k else ""
                    raise ArtifactError(
                        f"second_stage.merges[{k}] = {list(pair)} uses id {i}, but merge {k} may only use ids "
                        f"0..{symbols.EOP} (bytes and EOP){earlier}; PAD {symbols.PAD} and EOD {symbols.EOD} never "
                        "appear in merges"
                    )

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
        """Values are taken as they are, not cast: `__post_init__` refuses a wrong type instead of guessing."""
        d = _block(d, "second_stage")
        merges = _key(d, "second_stage", "merges")
        if isinstance(merges, list):  # JSON pairs are lists; the spec holds tuples (checked in __post_init__)
            merges = tuple(tuple(m) if isinstance(m, list) else m for m in merges)
        spec = cls(
            max_patch_size=_key(d, "second_stage", "max_patch_size"),
            mode=_key(d, "second_stage", "mode"),
            merges=merges,
            id_layout=d.get("id_layout", dict(symbols.ID_LAYOUT)),
        )
        # vocab_size is derived (259 + merges); a stored one that disagrees means the merges were cut or padded
        stored = d.get("vocab_size", spec.vocab_size)
        _require(
            stored == spec.vocab_size and _is_int(stored),
            f"second_stage.vocab_size is {stored!r}, but {len(spec.merges)} merges give {spec.vocab_size}",
        )
        return spec


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
    def from_dict(cls, d: dict[str, Any], *, source: str = SPEC_FILENAME) -> TokenizerSpec:
        if not isinstance(d, dict):
            raise ArtifactError(f"{source}: expected a JSON object, got {type(d).__name__}; {_FIX}")
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
                first_stage=FirstStageSpec.from_dict(_key(d, SPEC_FILENAME, "first_stage")),
                second_stage=SecondStageSpec.from_dict(_key(d, SPEC_FILENAME, "second_stage")),
                hbpe_version=str(d.get("hbpe_version", "")),
            )
        except ArtifactError as e:  # one line: which file, what is wrong, the fix
            raise ArtifactError(f"{source}: malformed tokenizer spec: {e}; {_FIX}") from None
        if d.get("fingerprint") != spec.fingerprint:
            raise ArtifactError(
                f"{source}: fingerprint mismatch (stored {d.get('fingerprint')!r}, content "
                f"hashes to {spec.fingerprint!r}): the file was edited; retrain or restore it"
            )
        return spec
