"""EncodeUnits: one work unit of corpus -> a token-stream file, a rejects file and a summary.

The stream file holds int32 first-stage ids with TOKEN_EOD after every document;
patches are not stored here because they are one table gather away (done when
writing shards). Unit files keep the conversion restartable and the memory flat:
a unit is encoded in batches and streamed to disk.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from hbpe.pipeline.beam import fs
from hbpe.pipeline.corpus.documents import Document, RecordPolicy, count_words
from hbpe.pipeline.corpus.files import WorkUnit, iter_unit
from hbpe.schemas.symbols import TOKEN_EOD


def unit_stream_path(staging: str, index: int) -> str:
    return fs.join(staging, "units", f"unit-{index:06d}.bin")


def unit_rejects_path(staging: str, index: int) -> str:
    return fs.join(staging, "rejects", f"unit-{index:06d}.jsonl")


@dataclass
class UnitSummary:
    index: int
    stream_patches: int = 0  # length of this unit's stream (tokens + EODs)
    documents_read: int = 0
    documents_written: int = 0
    documents_rejected: int = 0
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    bytes: int = 0
    words: int = 0
    tokens: int = 0
    symbols: int = 0
    histogram: list[int] = field(default_factory=list)


class _EncodeUnitFn(beam.DoFn):
    """Holds only picklable config; the tokenizer is loaded once per worker in setup()."""

    def __init__(self, tokenizer_dir: str, staging: str, policy: RecordPolicy, text_unit: str, batch_docs: int) -> None:
        self.tokenizer_dir, self.staging, self.policy = tokenizer_dir, staging, policy
        self.text_unit, self.batch_docs = text_unit, batch_docs
        self.docs_read = Metrics.counter("hbpe", "documents_read")
        self.docs_rejected = Metrics.counter("hbpe", "documents_rejected")
        self.tokens_out = Metrics.counter("hbpe", "tokens")
        self.bytes_in = Metrics.counter("hbpe", "bytes")

    def setup(self) -> None:
        from hbpe.pipeline.tokenizer import artifact

        self.tok = artifact.load(self.tokenizer_dir)

    def process(self, unit: WorkUnit):
        tok = self.tok
        s = UnitSummary(index=unit.index, histogram=[0] * (tok.max_patch_size + 1))
        hist = np.zeros(tok.max_patch_size + 1, dtype=np.int64)
        batch: list[str] = []
        eod = np.array([TOKEN_EOD], dtype=np.int32)

        def flush(out: fs.AtomicWriter) -> None:
            # one thread: Beam already runs a worker process per core, and tiktoken threads
            # contend for the GIL (2 threads on 2 cores gave 1.15x, 2 processes 1.6x)
            for arr in tok.encode_batch(batch, num_threads=1):
                out.write(arr.tobytes())
                out.write(eod.tobytes())
                lengths = tok.patch_lengths[arr]
                s.tokens += len(arr)
                s.symbols += int(lengths.sum())
                hist[:] += np.bincount(lengths, minlength=len(hist))[: len(hist)]
            batch.clear()

        with (
            fs.AtomicWriter(unit_stream_path(self.staging, unit.index)) as out,
            fs.AtomicWriter(unit_rejects_path(self.staging, unit.index)) as rejects,
        ):
            for rec in iter_unit(unit, self.policy, text_unit=self.text_unit):
                s.documents_read += 1
                if isinstance(rec, Document):
                    s.documents_written += 1
                    data = rec.text.encode("utf-8")
                    s.bytes += len(data)
                    s.words += count_words(data)
                    batch.append(rec.text)
                    if len(batch) >= self.batch_docs:
                        flush(out)
                else:
                    s.documents_rejected += 1
                    s.rejected_by_reason[rec.reason] = s.rejected_by_reason.get(rec.reason, 0) + 1
                    rejects.write((json.dumps(rec.to_dict(), ensure_ascii=False, sort_keys=True) + "\n").encode())
            if batch:
                flush(out)
        s.stream_patches = s.tokens + s.documents_written  # one EOD per document
        s.histogram = hist.tolist()
        self.docs_read.inc(s.documents_read)
        self.docs_rejected.inc(s.documents_rejected)
        self.tokens_out.inc(s.tokens)
        self.bytes_in.inc(s.bytes)
        yield s


class EncodeUnits(beam.PTransform):
    """PCollection[WorkUnit] -> PCollection[UnitSummary], writing unit files under staging."""

    def __init__(self, tokenizer_dir: str, staging: str, policy: RecordPolicy, text_unit: str, batch_docs: int) -> None:
        super().__init__()
        self._fn = _EncodeUnitFn(tokenizer_dir, staging, policy, text_unit, batch_docs)

    def expand(self, units):
        return (
            units
            | "SpreadUnits" >> beam.Reshuffle()  # (unit,) spread over workers
            | "TokenizeUnit" >> beam.ParDo(self._fn)  # UnitSummary
        )
