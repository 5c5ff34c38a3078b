"""An experiment's eval set, and the noise of having drawn it: a bootstrap over held-out documents.

Every run of an experiment is evaluated on one fixed set (training/data/eval_set.py, `data.eval_samples`):
`final_eval_batches` blocks of `global_batch_size` consecutive held-out samples, one block in the
middle of each of as many equal strata of the whole held-out split; curve points read its first
`eval_batches` blocks, spread over the split too. The runs of one first stage read the same
samples (the same shards); each block is attributed to the document its middle sample lies in
(documents counted by the EOD patches of the shards' token stream).

The seeds measure the noise of initialisation and sample order on this one set; they say nothing of
how another draw of held-out text would score. That is measured by resampling the set's documents:
BOOTSTRAP replicates, each drawing the documents with replacement and summing their blocks' NLL and
target bytes, BPB* = sum NLL / (ln 2 x sum bytes), averaged over the seeds; the standard deviation
of the replicates is the eval-sampling noise of a row's mean BPB. A gap between two runs resamples
the same documents for both (paired), so what the two runs share cancels.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from hbpe.pipeline.shards.reader import ShardDir
from hbpe.schemas.symbols import TOKEN_EOD
from hbpe.training.data.eval_set import eval_blocks

BOOTSTRAP = 2000  # replicates: the standard deviation's own error is about 1.6% of it
BOOTSTRAP_SEED = 0  # a fixed generator: a report written twice from the same results is the same


def describe_eval_set(shards: str | Path, *, blocks: int, block: int) -> dict[str, Any]:
    """What the eval set of `blocks` blocks of `block` samples over held-out `shards` holds.

    {samples, bytes, documents, blocks: [[first sample, samples, document, bytes], ...] in evaluation order,
    held_out: {samples, bytes, documents}}; bytes are the text the samples cover (the shards' num_bytes).
    """
    doc, nbytes = [], []
    seen = 0  # EODs before the sample: the index of the document it starts in
    for s in ShardDir(shards).samples():
        doc.append(seen)
        nbytes.append(int(s["num_bytes"]))
        seen += int((np.asarray(s["tokens"]) == TOKEN_EOD).sum())
    total = len(doc)
    chosen = eval_blocks(total, blocks * block, block)
    rows = [[start, n, doc[start + n // 2], sum(nbytes[start : start + n])] for start, n in chosen]
    return {
        "samples": sum(r[1] for r in rows),
        "bytes": sum(r[3] for r in rows),
        "documents": len({r[2] for r in rows}),
        "blocks": rows,
        # the documents the samples cover: the last one's EOD may lie in the tail that filled no sample
        "held_out": {"samples": total, "bytes": sum(nbytes), "documents": doc[-1] + 1 if doc else 0},
    }


def subset(eval_set: dict[str, Any], blocks: int) -> dict[str, Any]:
    """{samples, bytes, documents, blocks} of the set's first `blocks` blocks (what a curve point reads)."""
    rows = eval_set["blocks"][:blocks]
    return {"samples": sum(r[1] for r in rows), "bytes": sum(r[3] for r in rows),
            "documents": len({r[2] for r in rows}), "blocks": len(rows)}  # fmt: skip


def document_sums(run: dict[str, Any], eval_set: dict[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """(NLL in nats, target bytes) per document of the eval set from a run's final per-batch sums,
    None when its batches are not the set's blocks (one per batch)."""
    nll, nbytes = run.get("eval_batch_nll"), run.get("eval_batch_bytes")
    blocks = eval_set["blocks"]
    if nll is None or nbytes is None or len(nll) != len(blocks):
        return None
    docs = sorted({b[2] for b in blocks})
    at = {d: i for i, d in enumerate(docs)}
    out_nll, out_bytes = np.zeros(len(docs)), np.zeros(len(docs))
    for b, x, n in zip(blocks, nll, nbytes, strict=True):
        out_nll[at[b[2]]] += x
        out_bytes[at[b[2]]] += n
    return out_nll, out_bytes


def replicates(n_docs: int) -> np.ndarray:
    """(BOOTSTRAP, n_docs) counts: how often each document is drawn in each replicate."""
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    draws = rng.integers(0, n_docs, size=(BOOTSTRAP, n_docs))
    return np.stack([np.bincount(row, minlength=n_docs) for row in draws])


def _bpb(counts: np.ndarray, sums: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    nll, nbytes = sums
    return (counts @ nll) / (counts @ nbytes) / math.log(2)


def bootstrap(
    per_seed: list[tuple[np.ndarray, np.ndarray]], minus: list[tuple[np.ndarray, np.ndarray]] | None = None
) -> dict[str, Any] | None:
    """The eval-sampling noise of the seed-mean BPB of `per_seed` (or of its gap over `minus`, paired by seed
    and document): {sd, ci95: [lo, hi] (percentiles), documents, replicates}; None without documents."""
    if not per_seed or (minus is not None and len(minus) != len(per_seed)):
        return None
    n_docs = len(per_seed[0][0])
    if n_docs < 2 or any(len(s[0]) != n_docs for s in (*per_seed, *(minus or []))):
        return None
    counts = replicates(n_docs)
    values = np.mean([_bpb(counts, s) for s in per_seed], axis=0)
    if minus is not None:
        values = values - np.mean([_bpb(counts, s) for s in minus], axis=0)
    lo, hi = np.percentile(values, [2.5, 97.5])
    return {"sd": float(values.std(ddof=1)), "ci95": [float(lo), float(hi)], "documents": n_docs,
            "replicates": BOOTSTRAP}  # fmt: skip


def _sums(runs: list[dict[str, Any]], eval_sets: dict[str, Any]) -> list[tuple[np.ndarray, np.ndarray]] | None:
    sums = [document_sums(r, eval_sets[r["first_stage"]]) for r in runs if r["first_stage"] in eval_sets]
    return None if len(sums) != len(runs) or any(s is None for s in sums) else sums  # type: ignore[return-value]


def row_noise(runs: list[dict[str, Any]], eval_sets: dict[str, Any]) -> dict[str, Any] | None:
    """The eval-sampling noise of the seed-mean final BPB of one row's runs (its seeds)."""
    sums = _sums(runs, eval_sets)
    return None if sums is None else bootstrap(sums)


def gap_noise(a: list[dict[str, Any]], b: list[dict[str, Any]], eval_sets: dict[str, Any]) -> dict[str, Any] | None:
    """The eval-sampling noise of the seed-mean final gap BPB(b) - BPB(a), the runs paired by seed."""
    seeds = [r["seed"] for r in a if r["seed"] in {x["seed"] for x in b}]
    pa = [next(r for r in a if r["seed"] == s) for s in seeds]
    pb = [next(r for r in b if r["seed"] == s) for s in seeds]
    sa, sb = _sums(pa, eval_sets), _sums(pb, eval_sets)
    return None if sa is None or sb is None else bootstrap(sb, minus=sa)
