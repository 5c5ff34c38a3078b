"""A work unit's durable results in staging, shared by the Beam and the in-process runners.

    staging/units/unit-000007.bin      int32 first-stage ids, TOKEN_EOD after every document
    staging/rejects/unit-000007.jsonl  one JSON line per reject, in record order
    staging/units/unit-000007.json     the UnitSummary and its key: the unit's commit marker
    staging/progress/unit-000007.json  how far an encoding in flight has got (progress bar only)

Every file is written to a temporary name and renamed, and the summary comes last with
the other files' sizes and xxh64 hashes: `--resume` after a crash (SIGKILL, or a machine
that went down before its page cache reached the disk) reuses exactly the units whose
summary is there, whose files match it, and whose `key` is this run's. The key hashes all
the encoding depends on: the unit's file (path, size, mtime) and range, the record
policy, the text unit and the tokenizer fingerprint; and the summary records the xxh3 of
the input bytes the unit read (corpus/unit_bytes.py), checked again before a reuse, since
a file rewritten with the same size and mtime (`touch -r`) passes the key.

Patches are not stored: they are one table gather away (done when writing shards).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from hbpe.pipeline.beam import fs
from hbpe.pipeline.corpus.documents import Document, RecordPolicy
from hbpe.pipeline.corpus.files import FileInfo, WorkUnit, iter_unit
from hbpe.pipeline.corpus.unit_bytes import unit_input_hash
from hbpe.pipeline.tokenizer.hierarchical import HierarchicalTokenizer
from hbpe.pipeline.tokenizer.stats import tally
from hbpe.schemas.canonical import canonical_json, sha256_hex
from hbpe.schemas.manifest import Counts
from hbpe.schemas.symbols import TOKEN_EOD

UNIT_FORMAT = "hbpe-unit-v2"  # bump when the unit files' layout changes: old summaries stop matching
BATCH_TEXT_CHARS = 4 << 20  # a batch also ends at this much text: flat memory, and progress for big documents
PROGRESS_EVERY_S = 0.5


def unit_stream_path(staging: str, index: int) -> str:
    return fs.join(staging, "units", f"unit-{index:06d}.bin")


def unit_rejects_path(staging: str, index: int) -> str:
    return fs.join(staging, "rejects", f"unit-{index:06d}.jsonl")


def unit_summary_path(staging: str, index: int) -> str:
    return fs.join(staging, "units", f"unit-{index:06d}.json")


def unit_progress_path(staging: str, index: int) -> str:
    return fs.join(staging, "progress", f"unit-{index:06d}.json")


@dataclass
class UnitSummary:
    """What one work unit produced: its document counts and the length of its token stream."""

    index: int
    stream_patches: int = 0  # length of this unit's stream (tokens + EODs)
    counts: Counts = field(default_factory=Counts)  # documents, bytes, words, tokens, symbols of this unit
    histogram: list[int] = field(default_factory=list)  # histogram[k] = tokens whose patch has k symbols

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> UnitSummary:
        return cls(d["index"], d["stream_patches"], Counts(**d["counts"]), list(d["histogram"]))


def unit_key(unit: WorkUnit, file: FileInfo, policy: RecordPolicy, text_unit: str, tokenizer_fingerprint: str) -> str:
    """What a unit's encoded files depend on, hashed: a resumed run reuses a unit only under the same key."""
    return sha256_hex(
        canonical_json(
            {
                "format": UNIT_FORMAT,
                "unit": asdict(unit),
                "file": {"path": file.path, "size": file.size, "mtime": file.mtime},
                "policy": asdict(policy),
                "text_unit": text_unit,
                "tokenizer": tokenizer_fingerprint,
            }
        )
    )


def encode_unit(
    tok: HierarchicalTokenizer,
    unit: WorkUnit,
    staging: str,
    policy: RecordPolicy,
    *,
    text_unit: str,
    batch_docs: int,
    key: str = "",
    threads: int = 1,
) -> UnitSummary:
    """Encode one unit into its staging files, summary last; returns the summary.

    `threads` > 1 spreads a batch over tiktoken threads (they release the GIL): the
    in-process runner gives every unit one per core; Beam's workers, already a process
    per core, use one. Batching changes nothing in the files, only memory and speed.
    """
    s = UnitSummary(index=unit.index)
    c = s.counts
    hist = np.zeros(tok.max_patch_size + 1, dtype=np.int64)
    batch: list[str] = []
    chars = 0
    eod = np.array([TOKEN_EOD], dtype=np.int32).tobytes()
    # the record offset is a position in the file itself only for plain line files: a fraction of the range
    seekable = unit.compression is None and unit.format in ("jsonl", "text")
    report = _ProgressReport(staging, unit.index) if not fs.is_remote(staging) else None
    offset = unit.start
    # before reading: a file changed meanwhile then fails the resume's check; an unreadable file is the reader's
    # reject, and its unit (no hash) is encoded again by a resume
    input_hash = _input_hash_or_none(unit)

    # with threads, a batch encodes on a thread of its own while this one reads the next batch and writes the
    # one before: reading, counting and writing (~10% of a batch) no longer leave the cores idle; the files
    # are the same, batch after batch in order
    ahead = ThreadPoolExecutor(1, thread_name_prefix="hbpe-batch") if threads > 1 else None
    in_flight: tuple[list[str], Future, int] | None = None  # (texts, their ids to come, offset read to)

    def finish(out: fs.AtomicWriter, texts: list[str], arrs: list[np.ndarray], read_to: int) -> None:
        for text, arr in zip(texts, arrs, strict=True):
            out.write(arr.tobytes())
            out.write(eod)
            tally(c, hist, tok, text, arr)
        if report:
            report.update(c, read_to - unit.start if seekable else 0)

    def flush(out: fs.AtomicWriter) -> None:
        nonlocal batch, chars, in_flight
        texts, batch, chars = batch, [], 0
        if ahead is None:  # nothing to overlap with: at once, one batch in memory
            finish(out, texts, tok.encode_batch(texts, num_threads=threads), offset)
            return
        job = (texts, ahead.submit(tok.encode_batch, texts, num_threads=threads), offset)
        if in_flight is not None:
            finish(out, in_flight[0], in_flight[1].result(), in_flight[2])
        in_flight = job

    with (
        ahead or contextlib.nullcontext(),
        fs.AtomicWriter(unit_stream_path(staging, unit.index)) as out,
        fs.AtomicWriter(unit_rejects_path(staging, unit.index)) as rejects,
    ):
        for rec in iter_unit(unit, policy, text_unit=text_unit):
            offset = rec.offset
            if isinstance(rec, Document):
                batch.append(rec.text)
                chars += len(rec.text)
                if len(batch) >= batch_docs or chars >= BATCH_TEXT_CHARS:
                    flush(out)
            else:
                c.reject(rec.reason)
                rejects.write((json.dumps(rec.to_dict(), ensure_ascii=False, sort_keys=True) + "\n").encode())
        if batch:
            flush(out)
        if in_flight is not None:
            finish(out, in_flight[0], in_flight[1].result(), in_flight[2])
    s.stream_patches = c.tokens + c.documents_written  # one EOD per document
    s.histogram = hist.tolist()
    # the files' hashes, not an fsync per file, make the summary trustworthy after a machine crash (a preempted
    # VM): a stream the page cache never wrote out fails its hash at the resume, and the unit is encoded again
    hashes = {"stream_xxh64": out.hexdigest(), "rejects_xxh64": rejects.hexdigest(), "input_xxh3": input_hash}
    fs.write_atomic(unit_summary_path(staging, unit.index), json.dumps({"key": key, **hashes, **s.to_dict()}).encode())
    if report:
        report.remove()
    return s


def load_encoded(staging: str, index: int, key: str, unit: WorkUnit | None = None) -> UnitSummary | None:
    """The summary of a unit already encoded under `key`, if its files are there and whole; else None.

    Whole means the size and xxh64 its summary recorded: reading them back costs a fraction
    of encoding them again (about 10 ms per 16 MB unit from the page cache). With `unit`, its
    input bytes must also hash as they did when it was encoded.
    """
    import xxhash

    try:
        d = json.loads(fs.read_bytes(unit_summary_path(staging, index)))
        s = UnitSummary.from_dict(d)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if d.get("key") != key or fs.size(unit_stream_path(staging, index)) != 4 * s.stream_patches:
        return None
    for path, name in ((unit_stream_path(staging, index), "stream_xxh64"), (unit_rejects_path(staging, index), "rejects_xxh64")):  # fmt: skip
        try:
            if xxhash.xxh64(fs.read_bytes(path)).hexdigest() != d.get(name):
                return None
        except OSError:
            return None
    if unit is not None and (_input_hash_or_none(unit) or "none") != d.get("input_xxh3"):
        return None  # the file changed under the same size and mtime (or cannot be read): encode it again
    return s


def _input_hash_or_none(unit: WorkUnit) -> str | None:
    try:
        return unit_input_hash(unit)
    except (OSError, ValueError, EOFError):  # missing, unreadable, not Parquet: the encoding says why
        return None


def encoded_units(staging: str, keys: dict[int, str], units: list[WorkUnit]) -> dict[int, UnitSummary]:
    """Every unit of `keys` whose encoded files in `staging` are complete, made under the same key, from the
    same input bytes (`units` by index: what to hash)."""
    names = set(fs.top_entries(fs.join(staging, "units")))
    by_index = {u.index: u for u in units}
    return {
        i: s
        for i, key in keys.items()
        if f"unit-{i:06d}.json" in names and (s := load_encoded(staging, i, key, by_index[i])) is not None
    }


class _ProgressReport:
    """A unit's running counts in a small file the launcher's progress bar reads, at most every 0.5 s."""

    def __init__(self, staging: str, index: int) -> None:
        self.path = unit_progress_path(staging, index)
        self.last = 0.0

    def update(self, c: Counts, input_bytes: int) -> None:
        now = time.monotonic()
        if now - self.last < PROGRESS_EVERY_S:
            return
        self.last = now
        fs.write_atomic(
            self.path,
            json.dumps({"documents": c.documents_read, "text_bytes": c.bytes, "input_bytes": input_bytes}).encode(),
        )

    def remove(self) -> None:
        if self.last:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path)
