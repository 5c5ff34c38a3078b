"""Corpus files: format detection, decompression, byte-range work units, record iteration.

A work unit is a file, or a byte range of a large line-oriented file (a range owns
every line that *starts* inside it), or a span of Parquet row groups. Units are
independent, so a runner can read them in parallel while the output still follows
file order.

A compressed line file's ranges are offsets in its decompressed text: a unit
decompresses (and drops) the text before its range, so a large .zst is encoded by
several workers at the price of reading it again. Decompressing runs ~6x as fast as
converting here (~60 vs ~9 MB of text per CPU-second), so 2 units cost ~8% more CPU
than one, 8 units (MAX_PIECES) ~60%, for a wall time of ~0.6x and ~0.3x the whole
file's on as many idle workers. Its text size is the one its zstd frame header records
(zstd's CLI writes it), else an estimate from its size (COMPRESSED_TEXT_FACTOR): a range
past the real end holds nothing, and the last range runs to the end of the file whatever
it holds. The units' streams, concatenated in order, are the file's stream, so shards
and rejects are the same bytes however the file is cut (line numbers included: the
skipped text is counted).
"""

from __future__ import annotations

import bz2
import gzip
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass

from hbpe.pipeline import storage
from hbpe.pipeline.beam.stores import filesystems
from hbpe.pipeline.corpus.documents import (
    UNREADABLE_INPUT,
    Document,
    RecordPolicy,
    Reject,
    parse_json_record,
    parse_object,
    parse_text_record,
)
from hbpe.schemas.errors import ConfigError

COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bzip2"}
FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".txt": "text", ".parquet": "parquet"}
KNOWN_SUFFIXES = ".jsonl/.json/.ndjson, .txt or .parquet, optionally compressed as .gz, .zst or .bz2"
COMPRESSED_TEXT_FACTOR = 4  # a compressed corpus file holds about this much more text than its size (en-sotu: 4.3)
MAX_PIECES = 8  # a compressed file is cut into at most this many units: unit k decompresses the k before it
SPREAD_UNITS = 64  # compressed files are cut only while the job has fewer files than this (a large cluster's workers)
UTF8_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class FileInfo:
    path: str
    size: int
    mtime: float | None
    format: str
    compression: str | None


@dataclass(frozen=True)
class WorkUnit:
    """A slice of one input file: [start, end) bytes, or row groups [start, end) for Parquet."""

    index: int
    file_index: int
    path: str
    format: str
    compression: str | None
    start: int
    end: int | None


def detect(path: str) -> tuple[str, str | None]:
    """(format, compression) from the file name, e.g. 'a.jsonl.zst' -> ('jsonl', 'zstd')."""
    found = detect_or_none(path)
    if found is None:
        raise ConfigError(f"cannot tell the format of {path}: use {KNOWN_SUFFIXES}")
    return found


def detect_or_none(path: str) -> tuple[str, str | None] | None:
    name = path.lower()
    compression = None
    for suffix, kind in COMPRESSIONS.items():
        if name.endswith(suffix):
            compression, name = kind, name[: -len(suffix)]
            break
    for suffix, fmt in FORMATS.items():
        if name.endswith(suffix):
            return fmt, compression
    return None


def open_raw(path: str) -> io.RawIOBase | io.BufferedIOBase:
    """Open local paths directly and URIs (gs://, s3://, ...) through Beam's filesystems."""
    if storage.is_remote(path):
        from apache_beam.io.filesystem import CompressionTypes

        return filesystems().open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    return open(path, "rb")


def open_decompressed(path: str, compression: str | None) -> io.BufferedIOBase:
    """The file's bytes, decompressed; a compressed file of 0 bytes raises EOFError.

    gzip and zstd read an empty stream as empty text, but no compressor writes 0 bytes (even empty
    text compresses to a header): such a file is a download or copy that never got its data, and
    converting it to zero documents would lose it silently.
    """
    raw = open_raw(path)
    if compression is not None:
        if not raw.read(1):
            raw.close()
            raise EOFError(f"the file is empty (0 bytes), not a {compression} stream: a truncated download or copy?")
        raw.seek(0)
    if compression == "gzip":
        return gzip.GzipFile(fileobj=raw)
    if compression == "bzip2":
        return bz2.BZ2File(raw)
    if compression == "zstd":
        return io.BufferedReader(_ZstdReader(raw), buffer_size=1 << 20)
    return raw if isinstance(raw, io.BufferedIOBase) else io.BufferedReader(raw)


class _ZstdReader(io.RawIOBase):
    """Multi-frame zstd decompression that raises on a truncated stream, in bounded memory.

    zstandard's stream_reader returns a silent EOF when the last frame is cut
    short; a corpus converter must report that file as unreadable instead. Its
    decompressobj has no output limit, so it is fed ZSTD_FEED bytes at a time: zstd
    expands a byte to at most 32 KiB (a 4-byte RLE block makes 128 KiB), so a bomb's
    every call makes at most 8 MiB, where a 1 MiB read of one made 32 GiB.
    """

    def __init__(self, raw: io.IOBase) -> None:
        import zstandard

        self._zstd = zstandard
        self._raw, self._dobj = raw, zstandard.ZstdDecompressor().decompressobj()
        self._input, self._fed = b"", 0  # compressed bytes read, and how many of them went to the decompressor
        self._buf, self._taken = b"", 0  # decompressed bytes, and how many of them were returned
        self._in_frame = False
        self._error: OSError | None = None  # raised once the text decoded before it has been read

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while self._taken == len(self._buf):
            if self._error:
                raise self._error
            if self._fed >= len(self._input):
                self._input, self._fed = self._raw.read(1 << 20), 0
                if not self._input:
                    if self._in_frame:
                        raise EOFError("truncated zstd stream: the last frame is incomplete")
                    return 0
            self._buf, self._taken = b"", 0  # freed before the next output is made
            self._buf = self._decompress(self._input[self._fed : self._fed + ZSTD_FEED])
            self._fed += ZSTD_FEED
        n = min(len(b), len(self._buf) - self._taken)
        b[:n] = self._buf[self._taken : self._taken + n]
        self._taken += n
        return n

    def _decompress(self, chunk: bytes) -> bytes:
        out = b""
        while chunk:
            self._in_frame = True
            try:
                out += self._dobj.decompress(chunk)
            except self._zstd.ZstdError as e:
                # ZstdError is a bare Exception; as OSError it is a reject like a bad gzip, not a crash
                self._error = OSError(f"not zstd data, or corrupt: {e}")
                break
            if self._dobj.eof:  # a frame ends inside the chunk: the next one starts on what is left
                chunk = self._dobj.unused_data
                self._dobj = self._zstd.ZstdDecompressor().decompressobj()
                self._in_frame = False
            else:
                chunk = b""
        return out

    def close(self) -> None:
        self._raw.close()
        super().close()


ZSTD_FEED = 256  # compressed bytes per decompression call (see _ZstdReader)


def plan_units(files: list[FileInfo], *, split_bytes: int, text_unit: str = "file") -> list[WorkUnit]:
    """Cut files into work units: byte ranges for big line files (of the text, when compressed), row groups
    for Parquet. The cut depends only on the files and `split_bytes`, so a resumed run plans the same units."""
    units: list[WorkUnit] = []
    for fi, f in enumerate(files):
        lines = f.format == "jsonl" or (f.format == "text" and text_unit == "line")
        if f.format == "parquet":
            for start, end in _row_group_spans(f.path, split_bytes):
                units.append(WorkUnit(len(units), fi, f.path, f.format, f.compression, start, end))
        elif lines and f.compression is not None:
            for start, end in text_ranges(f, split_bytes, len(files)):
                units.append(WorkUnit(len(units), fi, f.path, f.format, f.compression, start, end))
        elif lines and f.compression is None and f.size > split_bytes:
            for start in range(0, f.size, split_bytes):
                end = min(start + split_bytes, f.size)
                units.append(
                    WorkUnit(len(units), fi, f.path, f.format, f.compression, start, end if end < f.size else None)
                )
        else:
            units.append(WorkUnit(len(units), fi, f.path, f.format, f.compression, 0, None))
    return units


def text_ranges(f: FileInfo, split_bytes: int, n_files: int) -> list[tuple[int, int | None]]:
    """The ranges of its text a compressed line file is cut into: one per `split_bytes` of its text, at most
    MAX_PIECES, and only while the job has fewer than SPREAD_UNITS files (with more, every worker has files)."""
    if n_files >= SPREAD_UNITS or f.size * COMPRESSED_TEXT_FACTOR <= split_bytes:  # (no header read for these)
        return [(0, None)]
    size = text_size(f)
    n = max(1, min(MAX_PIECES, -(-size // split_bytes), -(-SPREAD_UNITS // n_files)))
    step = -(-size // n)
    return [(k * step, (k + 1) * step if k < n - 1 else None) for k in range(n)]


def text_size(f: FileInfo) -> int:
    """About how much text a compressed file holds: what its zstd frame header records, if it does (zstd's CLI
    does for a file; a stream has none), else COMPRESSED_TEXT_FACTOR x its size."""
    if f.compression == "zstd":
        import zstandard

        try:
            with open_raw(f.path) as fh:
                size = zstandard.frame_content_size(fh.read(18))  # the longest frame header
        except (OSError, zstandard.ZstdError):  # unreadable or not zstd: reading it makes the reject
            size = -1
        if size >= f.size:  # -1: not recorded
            return size
    return f.size * COMPRESSED_TEXT_FACTOR


def _row_group_spans(path: str, split_bytes: int) -> list[tuple[int, int | None]]:
    import pyarrow.parquet as pq

    try:
        with open_raw(path) as fh:
            meta = pq.ParquetFile(fh).metadata
    except (OSError, ValueError):  # empty, cut short, not Parquet (ArrowInvalid is a ValueError)
        # one unit, all of it: reading it fails the same way, and that makes it an unreadable_input reject, as
        # a damaged .gz is, instead of an error that stops the whole conversion before any file is read
        return [(0, None)]
    spans, start, acc = [], 0, 0
    for rg in range(meta.num_row_groups):
        acc += meta.row_group(rg).total_byte_size
        if acc >= split_bytes:
            spans.append((start, rg + 1))
            start, acc = rg + 1, 0
    if start < meta.num_row_groups or not spans:
        spans.append((start, meta.num_row_groups))
    return spans


def iter_unit(unit: WorkUnit, policy: RecordPolicy, *, text_unit: str = "file") -> Iterator[Document | Reject]:
    """Every record of a unit, in order, as a Document or a Reject. Read errors become a final Reject.

    No record over `policy.max_record_bytes` is held whole: it is read on in bounded chunks, dropped,
    and becomes a too_long reject (a decompression bomb of one huge line ends as one reject, not in MemoryError).
    """
    offset = unit.start
    limit = policy.max_record_bytes(unit.format)
    try:
        if unit.format == "parquet":
            yield from _iter_parquet(unit, policy)
            return
        with open_decompressed(unit.path, unit.compression) as f:
            if unit.format == "text" and text_unit == "file":
                yield _whole_file_record(f, unit.path, policy)
                return
            parse = parse_json_record if unit.format == "jsonl" else parse_text_record
            at = None
            if unit.compression is not None and unit.start > 0:
                if (at := _skip_text(f, unit.start)) is None:
                    return  # the text ends (or cannot be read) before the range: the unit reading there says so
                offset = at[2]  # a read error before the first line is reported where a whole-file read reports it
            for offset, line_no, raw, size in _iter_lines(f, unit.start, unit.end, limit, at=at[:2] if at else None):
                where = {"source": unit.path, "offset": offset, "line": line_no}
                if raw is None:
                    yield policy.record_too_long(unit.format, size, **where)
                else:
                    yield parse(raw, **where, policy=policy)
    except (OSError, EOFError, ValueError) as e:  # truncated/corrupt gzip, bz2, zstd; unreadable file
        yield Reject(source=unit.path, offset=offset, reason=UNREADABLE_INPUT, detail=f"{type(e).__name__}: {e}")


def _strip_bom(data: bytes) -> bytes:
    """Drop a UTF-8 byte order mark: editors on Windows write one, and it is no part of the text."""
    return data[len(UTF8_BOM) :] if data.startswith(UTF8_BOM) else data


def _whole_file_record(f: io.BufferedIOBase, source: str, policy: RecordPolicy) -> Document | Reject:
    """A .txt file read as one document (text_unit "file"), read no further than the record limit."""
    limit = policy.max_record_bytes("text")
    data = _read_at_most(f, limit + len(UTF8_BOM))
    data = None if data is None else _strip_bom(data)
    where = {"source": source, "offset": 0, "line": 1}
    if data is None or len(data) > limit:
        return policy.record_too_long("text", None if data is None else len(data), **where)
    return parse_text_record(data, **where, policy=policy)


def _iter_lines(
    f: io.BufferedIOBase, start: int, end: int | None, limit: int, *, at: tuple[int, int] | None = None
) -> Iterator[tuple[int, int | None, bytes | None, int]]:
    """(offset, line number, line without its newline, its size) of every line the range owns; the line is None
    when it holds more than `limit` bytes (it was read past, never held whole). `at`: (offset, line number) of
    the range's first line, where `f` already is (compressed text, _skip_text)."""
    pos = start
    if at is not None:
        pos, line_no = at
    elif start > 0:
        f.seek(start - 1)
        pos = start - 1 + _skip_line(f)[0]  # skip the line that began in the previous range
    if at is None:
        line_no = 1 if start == 0 else None
    while end is None or pos < end:
        record_at = pos
        raw, n, size = _read_line(f, limit + _LINE_SLACK)
        if not n:
            break
        pos += n
        if raw is not None:
            if record_at == 0:
                raw = _strip_bom(raw)  # only the file's first line can carry one; json.loads rejects it
            if raw.endswith(b"\n"):
                raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
            size = len(raw)
        yield record_at, line_no, raw if size <= limit else None, size
        if line_no is not None:
            line_no += 1


_LINE_SLACK = len(UTF8_BOM) + len(b"\r\n")  # what a line may hold besides its record
_CHUNK = 1 << 20  # how much of an over-long line or file is read at a time


def _read_line(f: io.BufferedIOBase, most: int) -> tuple[bytes | None, int, int]:
    """(the next line, newline included, b"" at the end; bytes read; bytes read less the newline). The line is
    None when it holds more than `most` bytes: it is then read past in chunks and dropped, never held whole.

    Read _CHUNK at a time, not `readline(most + 1)`: that builds the line in pieces and joins them, so a line
    over hbpe's 1 GiB ceiling took twice the ceiling (2.2 GB) before it was rejected; chunks are dropped as
    soon as the line is known to be too long, so a rejected line takes at most `most` bytes and a chunk.
    """
    raw = f.readline(min(most + 1, _CHUNK))
    if raw.endswith(b"\n") or len(raw) < min(most + 1, _CHUNK):  # the whole line (or the end of the file)
        return raw, len(raw), len(raw)
    chunks, n = [raw], len(raw)
    while n <= most:
        chunk = f.readline(min(most + 1 - n, _CHUNK))
        chunks.append(chunk)
        n += len(chunk)
        if not chunk or chunk.endswith(b"\n"):
            line = b"".join(chunks)
            return line, n, n
    chunks.clear()  # over the limit: what was read goes before the rest is read past
    skipped, newline = _skip_line(f)
    return None, n + skipped, n + skipped - newline


def _skip_text(f: io.BufferedIOBase, start: int) -> tuple[int, int, int] | None:
    """Read past the text before `start` and the line that began there: (offset and line number of the first
    line starting at or after `start`, offset of the line before it), where `f` now is. None when the text ends
    first, or cannot be read: an earlier unit, reading that text, reports it (a read error is reported once)."""
    pos, lines, last_start = 0, 0, 0
    try:
        while pos < start - 1:
            chunk = f.read(min(_CHUNK, start - 1 - pos))
            if not chunk:
                return None
            if (nl := chunk.rfind(b"\n")) >= 0:
                lines += chunk.count(b"\n")
                last_start = pos + nl + 1
            pos += len(chunk)
        n, newline = _skip_line(f)  # the line that began before the range is the previous unit's
    except (OSError, EOFError, ValueError):
        return None
    if not newline:
        return None
    return pos + n, lines + 2, last_start


def _skip_line(f: io.BufferedIOBase) -> tuple[int, int]:
    """Read past the end of the current line in bounded chunks: (bytes read, 1 if they end in a newline else 0)."""
    n = 0
    while chunk := f.readline(_CHUNK):
        n += len(chunk)
        if chunk.endswith(b"\n"):
            return n, 1
    return n, 0


def _read_at_most(f: io.BufferedIOBase, most: int) -> bytes | None:
    """All that is left in `f`, or None when that is more than `most` bytes (read no further than that)."""
    chunks, n = [], 0
    while chunk := f.read(min(_CHUNK, most + 1 - n)):
        chunks.append(chunk)
        n += len(chunk)
        if n > most:
            return None
    return b"".join(chunks)


def _iter_parquet(unit: WorkUnit, policy: RecordPolicy) -> Iterator[Document | Reject]:
    import pyarrow.parquet as pq

    top = policy.text_field.split(".")[0]
    cols = [top] + ([policy.id_field.split(".")[0]] if policy.id_field else [])
    with open_raw(unit.path) as fh:
        pf = pq.ParquetFile(fh)
        names = set(pf.schema_arrow.names)
        cols = [c for c in dict.fromkeys(cols) if c in names]
        row = sum(pf.metadata.row_group(i).num_rows for i in range(unit.start))
        for rg in range(unit.start, unit.end if unit.end is not None else pf.metadata.num_row_groups):
            for obj in pf.read_row_group(rg, columns=cols).to_pylist():
                yield parse_object(obj, where={"source": unit.path, "offset": row, "line": None}, policy=policy)
                row += 1


def iter_documents(
    path: str, policy: RecordPolicy | None = None, *, text_unit: str = "file"
) -> Iterator[Document | Reject]:
    """All records of one local or remote file (no splitting)."""
    fmt, comp = detect(path)
    unit = WorkUnit(0, 0, path, fmt, comp, 0, None)
    yield from iter_unit(unit, policy or RecordPolicy(), text_unit=text_unit)


def file_info(path: str) -> FileInfo:
    fmt, comp = detect(path)
    if storage.is_remote(path):
        meta = filesystems().match([path])[0].metadata_list[0]
        return FileInfo(path, meta.size_in_bytes, getattr(meta, "last_updated_in_seconds", None), fmt, comp)
    st = os.stat(path)
    return FileInfo(path, st.st_size, st.st_mtime, fmt, comp)
