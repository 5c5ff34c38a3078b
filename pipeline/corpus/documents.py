"""One raw record -> an accepted document or a reject with its reason.

Every input record ends as exactly one of the two, so a run can check
`documents_read == documents_written + documents_rejected`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

# Reject reasons, stable strings: they key the manifest's per-reason counts.
MALFORMED_JSON = "malformed_json"
NOT_AN_OBJECT = "not_an_object"
MISSING_TEXT_FIELD = "missing_text_field"
NON_STRING_TEXT = "non_string_text"
INVALID_UTF8 = "invalid_utf8"
EMPTY_TEXT = "empty_text"
BLANK_LINE = "blank_line"
TOO_LONG = "too_long"
UNREADABLE_INPUT = "unreadable_input"  # a file (or its remainder) that cannot be read or decompressed

# the most bytes one raw record (a line, a whole .txt file) may take without --max-doc-bytes: a record is
# held whole while it is parsed, so a longer one (a decompression bomb: a 13 MB .gz of one 3 GB line) is
# rejected as too_long while it is read, in bounded chunks, instead of ending the run in MemoryError
DEFAULT_MAX_RECORD_BYTES = 1 << 30
JSON_BYTES_PER_TEXT_BYTE = 6  # JSON may spell one byte of text in six ("\u0001")
JSON_OTHER_FIELDS_BYTES = 1 << 20  # room for a JSON record's other fields (id, metadata) besides its text


@dataclass(frozen=True)
class Document:
    text: str
    source: str
    offset: int  # byte offset of the record in the (uncompressed) file, or row index for Parquet
    line: int | None = None  # 1-based line number when known (not for mid-file byte ranges)
    doc_id: str | None = None


@dataclass(frozen=True)
class Reject:
    source: str
    offset: int
    reason: str
    detail: str
    line: int | None = None
    doc_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class RecordPolicy:
    """How records become documents: which field, and what to do with bad text."""

    text_field: str = "text"
    id_field: str | None = "id"
    invalid_utf8: str = "reject"  # or "replace" (U+FFFD)
    max_doc_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.invalid_utf8 not in ("reject", "replace"):
            raise ValueError(f"invalid_utf8 must be 'reject' or 'replace', got {self.invalid_utf8!r}")
        if self.max_doc_bytes is not None and self.max_doc_bytes <= 0:
            raise ValueError(f"max_doc_bytes must be positive, got {self.max_doc_bytes}")

    def max_record_bytes(self, fmt: str) -> int:
        """The most bytes one raw record of format `fmt` may take; a longer one is rejected unread.

        With max_doc_bytes: that many for text, whose record is its text; for JSON, room for a text
        of max_doc_bytes however it is escaped, plus 1 MiB of other fields. Without: DEFAULT_MAX_RECORD_BYTES.
        """
        if self.max_doc_bytes is None:
            return DEFAULT_MAX_RECORD_BYTES
        if fmt == "text":
            return self.max_doc_bytes
        return JSON_BYTES_PER_TEXT_BYTE * self.max_doc_bytes + JSON_OTHER_FIELDS_BYTES

    def record_too_long(self, fmt: str, nbytes: int | None, **where: Any) -> Reject:
        """The reject of a record over max_record_bytes(fmt) (`nbytes` None: a file read no further than that)."""
        limit = self.max_record_bytes(fmt)
        if self.max_doc_bytes is None:
            why = "hbpe's ceiling without --max-doc-bytes"
        elif fmt == "text":
            why = f"max_doc_bytes={self.max_doc_bytes}"
        else:
            why = f"{JSON_BYTES_PER_TEXT_BYTE} x max_doc_bytes={self.max_doc_bytes} + 1 MiB for JSON escapes and fields"
        size = f"{nbytes} bytes" if nbytes is not None else f"more than {limit} bytes"
        return Reject(reason=TOO_LONG, detail=f"a record of {size} > {limit} ({why}): skipped unread", **where)


def get_dotted(obj: Any, path: str) -> tuple[bool, Any]:
    """(found, value) for a dotted path like 'meta.body' in nested dicts."""
    for part in path.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return False, None
        obj = obj[part]
    return True, obj


def _check_text(text: str, where: dict[str, Any], policy: RecordPolicy) -> Document | Reject:
    try:
        nbytes = len(text.encode("utf-8"))
    except UnicodeEncodeError:  # lone surrogates from JSON escapes like "\ud800"
        if policy.invalid_utf8 == "reject":
            return Reject(reason=INVALID_UTF8, detail="text holds unpaired surrogates", **where)
        text = text.encode("utf-8", errors="replace").decode("utf-8")
        nbytes = len(text.encode("utf-8"))
    if not text:
        return Reject(reason=EMPTY_TEXT, detail="text is empty", **where)
    if policy.max_doc_bytes is not None and nbytes > policy.max_doc_bytes:
        return Reject(reason=TOO_LONG, detail=f"{nbytes} bytes > max_doc_bytes={policy.max_doc_bytes}", **where)
    return Document(text=text, **where)


def _decode(raw: bytes, policy: RecordPolicy) -> tuple[str | None, str]:
    try:
        return raw.decode("utf-8"), ""
    except UnicodeDecodeError as e:
        if policy.invalid_utf8 == "replace":
            return raw.decode("utf-8", errors="replace"), ""
        return None, f"invalid UTF-8 at byte {e.start}"


def parse_json_record(
    raw: bytes, *, source: str, offset: int, line: int | None, policy: RecordPolicy
) -> Document | Reject:
    where: dict[str, Any] = {"source": source, "offset": offset, "line": line}
    if not raw.strip():
        return Reject(reason=BLANK_LINE, detail="blank line", **where)
    s, why = _decode(raw, policy)
    if s is None:
        return Reject(reason=INVALID_UTF8, detail=why, **where)
    try:
        obj = json.loads(s)
    except json.JSONDecodeError as e:
        return Reject(reason=MALFORMED_JSON, detail=str(e), **where)
    return parse_object(obj, where=where, policy=policy)


def parse_object(obj: Any, *, where: dict[str, Any], policy: RecordPolicy) -> Document | Reject:
    if not isinstance(obj, dict):
        return Reject(reason=NOT_AN_OBJECT, detail=f"a JSON {type(obj).__name__}, not an object", **where)
    if policy.id_field:
        found, doc_id = get_dotted(obj, policy.id_field)
        if found and doc_id is not None:
            where = {**where, "doc_id": str(doc_id)}
    found, text = get_dotted(obj, policy.text_field)
    if not found or text is None:  # null counts as missing (Parquet structs fill absent fields with null)
        return Reject(reason=MISSING_TEXT_FIELD, detail=f"no field {policy.text_field!r} (or null)", **where)
    if not isinstance(text, str):
        return Reject(reason=NON_STRING_TEXT, detail=f"field {policy.text_field!r} is a {type(text).__name__}", **where)
    return _check_text(text, where, policy)


def parse_text_record(
    raw: bytes, *, source: str, offset: int, line: int | None, policy: RecordPolicy
) -> Document | Reject:
    where: dict[str, Any] = {"source": source, "offset": offset, "line": line}
    s, why = _decode(raw, policy)
    if s is None:
        return Reject(reason=INVALID_UTF8, detail=why, **where)
    return _check_text(s, where, policy)


def count_words(data: bytes) -> int:
    """Whitespace-separated words (ASCII whitespace), from UTF-8 bytes: fertility's denominator.

    A word starts wherever a non-space byte follows a space byte (or the start).
    Vectorized because `str.split()` cost ~1 s per 100 MB on the conversion's hot path.
    """
    import numpy as np

    if not data:
        return 0
    nonspace = _NONSPACE_TABLE[np.frombuffer(data, dtype=np.uint8)]
    return int(nonspace[0]) + int(np.count_nonzero(nonspace[1:] & ~nonspace[:-1]))


def _nonspace_table():
    import numpy as np

    t = np.ones(256, dtype=bool)
    t[list(b" \t\n\r\x0b\x0c")] = False
    return t


_NONSPACE_TABLE = _nonspace_table()
