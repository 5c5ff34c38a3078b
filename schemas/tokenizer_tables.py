"""The built tables of a tokenizer artifact: what loading would compute, kept beside the spec.

Layout (inside the tokenizer directory of schemas/tokenizer_artifact.py):
    DIR/hbpe_tokenizer_tables.json  this manifest: the tokenizer fingerprint the tables belong to, the data
                                    file's name, size and sha256, and every array's dtype, shape and offset
    DIR/hbpe_tokenizer_tables.bin   the arrays back to back in ARRAYS order, each starting on a 64-byte boundary

Arrays (N first-stage tokens, B bytes of them, R = first_stage.n_vocab rows, S = max_patch_size):
    token_ids      (N,)        int32   first-stage ids of the (non-special) tokens, ascending
    token_offsets  (N + 1,)    int32   token k is token_bytes[token_offsets[k]:token_offsets[k + 1]]
    token_bytes    (B,)        uint8   the rank file's tokens as raw bytes, not base64
    patch_table    (R + 2, S)  uint16  the second stage's patch of every id (pipeline/tokenizer/hierarchical.py)
    patch_lengths  (R + 2,)    uint8   symbols in each patch
    token_nbytes   (R + 2,)    int32   bytes of each token

The tables are derived data: an artifact without them is complete, and the tokenizer's
fingerprint does not cover them. They belong to one fingerprint, recorded here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hbpe.schemas.errors import ArtifactError
from hbpe.schemas.names import is_plain_file_name

TABLES_FORMAT = "hbpe-tokenizer-tables"
TABLES_VERSION = 1  # the layout of the data file: another one is rebuilt, never read
TABLES_MANIFEST_FILENAME = "hbpe_tokenizer_tables.json"
TABLES_DATA_FILENAME = "hbpe_tokenizer_tables.bin"
TABLES_FILENAMES = (TABLES_MANIFEST_FILENAME, TABLES_DATA_FILENAME)
ALIGN = 64
# (name, dtype as numpy spells it, little-endian explicit, so the bytes are the same on every machine; ndim)
ARRAYS = (
    ("token_ids", "<i4", 1),  # int32, as the `tokens` shard column
    ("token_offsets", "<i4", 1),  # a rank file of 2 GiB would not fit; tables.encode refuses one
    ("token_bytes", "|u1", 1),
    ("patch_table", "<u2", 2),
    ("patch_lengths", "|u1", 1),
    ("token_nbytes", "<i4", 1),
)
_ITEMSIZE = {"|u1": 1, "<u2": 2, "<i4": 4}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ArtifactError(message)


def _padded(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class ArrayEntry:
    """One array of the data file: where it starts and what it holds."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        n = _ITEMSIZE[self.dtype]
        for d in self.shape:
            n *= d
        return n

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "offset": self.offset}


def layout(shapes: dict[str, tuple[int, ...]]) -> tuple[ArrayEntry, ...]:
    """The entries of ARRAYS with these shapes, each at the next 64-byte boundary after the one before.

    >>> [e.offset for e in layout({"token_ids": (3,), "token_offsets": (4,), "token_bytes": (7,),
    ...     "patch_table": (5, 2), "patch_lengths": (5,), "token_nbytes": (5,)})]
    [0, 64, 128, 192, 256, 320]
    """
    entries, offset = [], 0
    for name, dtype, _ in ARRAYS:
        entry = ArrayEntry(name, dtype, tuple(shapes[name]), offset)
        entries.append(entry)
        offset = _padded(offset + entry.nbytes)
    return tuple(entries)


def data_size(entries: tuple[ArrayEntry, ...]) -> int:
    """Bytes of the data file: every array, each padded to 64 bytes."""
    return _padded(entries[-1].offset + entries[-1].nbytes) if entries else 0


@dataclass(frozen=True)
class TablesManifest:
    """hbpe_tokenizer_tables.json: which tokenizer the tables are for, and how to check and slice the data file."""

    tokenizer_fingerprint: str
    sha256: str
    arrays: tuple[ArrayEntry, ...]
    file: str = TABLES_DATA_FILENAME

    def __post_init__(self) -> None:
        for key in ("tokenizer_fingerprint", "sha256"):
            value = getattr(self, key)
            _require(
                isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value),
                f"{key} must be 64 lowercase hex digits, got {value!r:.80}",
            )
        # the data file is read from the tokenizer directory: a path here could read any file on the machine
        _require(
            is_plain_file_name(self.file),
            f"file must be a plain file name inside the tokenizer directory (like {TABLES_DATA_FILENAME!r}), "
            f"got {self.file!r:.80}",
        )

    @property
    def size(self) -> int:
        return data_size(self.arrays)

    def shape(self, name: str) -> tuple[int, ...]:
        return next(e.shape for e in self.arrays if e.name == name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": TABLES_FORMAT,
            "version": TABLES_VERSION,
            "tokenizer_fingerprint": self.tokenizer_fingerprint,
            "file": self.file,
            "size": self.size,
            "sha256": self.sha256,
            "arrays": [e.to_dict() for e in self.arrays],
        }

    @classmethod
    def from_dict(cls, d: Any) -> TablesManifest:
        """A manifest of TABLES_VERSION, checked: the arrays are ARRAYS, laid out as `layout` lays them out.

        The caller checks `format` and `version` first (another version is rebuilt, not an error).
        """
        _require(isinstance(d, dict), f"expected a JSON object, got {type(d).__name__}")
        for key in ("tokenizer_fingerprint", "file", "size", "sha256", "arrays"):
            _require(key in d, f"no {key!r} entry")
        raw = d["arrays"]
        names = [name for name, _, _ in ARRAYS]
        _require(
            isinstance(raw, list) and all(isinstance(e, dict) for e in raw) and [e.get("name") for e in raw] == names,
            f"arrays must list {names} in that order",
        )
        shapes = {}
        for e, (name, dtype, ndim) in zip(raw, ARRAYS):
            shape = e.get("shape")
            _require(e.get("dtype") == dtype, f"array {name} must have dtype {dtype!r}, got {e.get('dtype')!r:.40}")
            _require(
                isinstance(shape, list) and len(shape) == ndim and all(_is_int(n) and n >= 0 for n in shape),
                f"array {name} must have a shape of {ndim} non-negative integers, got {shape!r:.80}",
            )
            shapes[name] = tuple(shape)
        entries = layout(shapes)
        offsets = [e.get("offset") for e in raw]
        _require(offsets == [e.offset for e in entries], f"array offsets {offsets!r:.120} are not the 64-byte layout")
        manifest = cls(
            tokenizer_fingerprint=d["tokenizer_fingerprint"], sha256=d["sha256"], arrays=entries, file=d["file"]
        )
        _require(
            d["size"] == manifest.size and _is_int(d["size"]),
            f"size is {d['size']!r:.40}, but the arrays take {manifest.size} bytes",
        )
        return manifest
