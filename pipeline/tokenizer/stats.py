"""Corpus statistics of a tokenizer: bytes per token, symbols per patch, fertility."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import numpy as np

from hbpe.pipeline.beam import stores
from hbpe.pipeline.corpus.documents import Document, RecordPolicy, Reject, count_words
from hbpe.pipeline.corpus.files import iter_documents
from hbpe.pipeline.corpus.inputs import resolve_inputs
from hbpe.pipeline.tokenizer.hierarchical import HierarchicalTokenizer
from hbpe.schemas.errors import ConfigError
from hbpe.schemas.manifest import Counts, ratios


@dataclass
class CorpusStats:
    documents: int = 0
    rejected: int = 0
    bytes: int = 0
    words: int = 0
    tokens: int = 0
    symbols: int = 0  # real symbols of all patches, EOP included, PAD excluded
    patch_length_histogram: dict[int, int] = field(default_factory=dict)
    reject_reasons: dict[str, int] = field(default_factory=dict)

    def _ratios(self) -> dict[str, float]:
        return ratios(nbytes=self.bytes, tokens=self.tokens, symbols=self.symbols, words=self.words)

    @property
    def bytes_per_token(self) -> float:
        return self._ratios()["bytes_per_patch"]

    @property
    def symbols_per_patch(self) -> float:
        return self._ratios()["symbols_per_patch"]

    @property
    def fertility(self) -> float:
        return self._ratios()["fertility"]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["patch_length_histogram"] = {str(k): v for k, v in sorted(self.patch_length_histogram.items())}
        d.update(
            bytes_per_token=self.bytes_per_token, symbols_per_patch=self.symbols_per_patch, fertility=self.fertility
        )
        return d


def read_texts(inputs: Iterable[str], policy: RecordPolicy | None = None) -> tuple[list[str], Counter]:
    """Accepted document texts of the inputs, plus reject counts by reason.

    Inputs are what `hbpe convert --input` takes: files, directories, globs, local or URIs
    (expanded by `resolve_inputs`; remote locations are reached once first, with a deadline).

    Raises:
        ConfigError: an input matches no file, or not one document could be read, naming the
            inputs and the reasons the records were rejected.
    """
    inputs = [str(i) for i in inputs]
    stores.preflight([(i, "the input") for i in inputs])  # nothing to do (no Beam import) when all are local
    texts: list[str] = []
    rejects: Counter = Counter()
    first_reject: Reject | None = None
    for path in resolve_inputs(inputs):
        for rec in iter_documents(path, policy):
            if isinstance(rec, Document):
                texts.append(rec.text)
            else:
                rejects[rec.reason] += 1
                first_reject = first_reject or rec
    if not texts:
        raise ConfigError(_no_documents_message(inputs, rejects, first_reject))
    return texts, rejects


def _no_documents_message(inputs: list[str], rejects: Counter, first: Reject | None) -> str:
    where = f"no document could be read from --input {', '.join(inputs)}"
    if first is None:
        return f"{where}: the files hold no records; pass a corpus with at least one document"
    n = rejects.total()
    reasons = ", ".join(f"{r}: {k}" for r, k in rejects.most_common())
    return (
        f"{where}: {n} record{'s' if n != 1 else ''} rejected ({reasons}; the first, {first.source}: {first.detail}); "
        "check the files, and --text-field for records that keep their text in another field"
    )


def tally(c: Counts, hist: np.ndarray, tok: HierarchicalTokenizer, text: str, ids: np.ndarray) -> None:
    """Add one accepted document and its first-stage ids to `c` and `hist` (hist[k]: patches of k symbols).

    The one accumulator behind `hbpe tokenizer stats` and the conversion's manifest counts.
    """
    data = text.encode("utf-8")
    lengths = tok.patch_lengths[ids]
    c.documents_read += 1
    c.documents_written += 1
    c.bytes += len(data)
    c.words += count_words(data)
    c.tokens += len(ids)
    c.symbols += int(lengths.sum())
    hist += np.bincount(lengths, minlength=len(hist))[: len(hist)]


def corpus_stats(tok: HierarchicalTokenizer, texts: list[str], *, batch: int = 256) -> CorpusStats:
    c, hist = Counts(), np.zeros(tok.max_patch_size + 1, dtype=np.int64)
    for i in range(0, len(texts), batch):
        chunk = texts[i : i + batch]
        for text, ids in zip(chunk, tok.encode_batch(chunk, num_threads=2), strict=True):
            tally(c, hist, tok, text, ids)
    return CorpusStats(
        documents=c.documents_written,
        bytes=c.bytes,
        words=c.words,
        tokens=c.tokens,
        symbols=c.symbols,
        patch_length_histogram={k: int(v) for k, v in enumerate(hist) if v},
    )


def file_stats(tok: HierarchicalTokenizer, paths: Iterable[str], policy: RecordPolicy | None = None) -> CorpusStats:
    """Bytes per token, symbols per patch and fertility of the accepted documents, plus rejects by reason.

    `corpus_stats` sees texts only, so the records that never became documents (no text field,
    invalid UTF-8, ...) are counted here, where the files are read.
    """
    texts, rejects = read_texts(paths, policy)
    st = corpus_stats(tok, texts)
    st.rejected, st.reject_reasons = sum(rejects.values()), dict(rejects)
    return st
