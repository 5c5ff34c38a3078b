"""EncodeUnits: the Beam step that encodes work units into their staging files (units.py does the work).

Unit files keep the conversion restartable (`--resume` reuses every unit whose summary is
committed) and the memory flat: a unit is encoded in batches and streamed to disk.
"""

from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics

from hbpe.pipeline.beam import fs
from hbpe.pipeline.beam.units import (  # noqa: F401  (UnitSummary and the paths: re-exported as they were)
    UnitSummary,
    encode_unit,
    unit_rejects_path,
    unit_stream_path,
)
from hbpe.pipeline.corpus.documents import RecordPolicy
from hbpe.pipeline.corpus.files import WorkUnit


class _EncodeUnitFn(beam.DoFn):
    """Holds only picklable config; the tokenizer is loaded once per worker in setup()."""

    def __init__(
        self,
        tokenizer_dir: str,
        staging: str,
        policy: RecordPolicy,
        text_unit: str,
        batch_docs: int,
        keys: dict[int, str] | None = None,
    ) -> None:
        self.tokenizer_dir, self.staging, self.policy = tokenizer_dir, staging, policy
        self.text_unit, self.batch_docs, self.keys = text_unit, batch_docs, keys or {}
        self.docs_read = Metrics.counter("hbpe", "documents_read")
        self.docs_rejected = Metrics.counter("hbpe", "documents_rejected")
        self.tokens_out = Metrics.counter("hbpe", "tokens")
        self.bytes_in = Metrics.counter("hbpe", "bytes")
        self.units_done = Metrics.counter("hbpe", "units_encoded")

    def setup(self) -> None:
        self.tok = fs.load_tokenizer(self.tokenizer_dir)

    def process(self, unit: WorkUnit):
        # one thread: Beam already runs a worker process per core
        s = encode_unit(
            self.tok,
            unit,
            self.staging,
            self.policy,
            text_unit=self.text_unit,
            batch_docs=self.batch_docs,
            key=self.keys.get(unit.index, ""),
        )
        c = s.counts
        self.docs_read.inc(c.documents_read)
        self.docs_rejected.inc(c.documents_rejected)
        self.tokens_out.inc(c.tokens)
        self.bytes_in.inc(c.bytes)
        self.units_done.inc()
        yield s


class EncodeUnits(beam.PTransform):
    """PCollection[WorkUnit] -> PCollection[UnitSummary], writing unit files under staging."""

    def __init__(
        self,
        tokenizer_dir: str,
        staging: str,
        policy: RecordPolicy,
        text_unit: str,
        batch_docs: int,
        keys: dict[int, str] | None = None,
    ) -> None:
        super().__init__()
        self._fn = _EncodeUnitFn(tokenizer_dir, staging, policy, text_unit, batch_docs, keys)

    def expand(self, units):
        return (
            units
            | "SpreadUnits" >> beam.Reshuffle()  # (unit,) spread over workers
            | "TokenizeUnit" >> beam.ParDo(self._fn)  # UnitSummary
        )
