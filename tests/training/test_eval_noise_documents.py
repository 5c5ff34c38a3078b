"""Which document each block of an experiment's eval set stands for (hbpe/experiments/eval_noise.py), on real
shards of many short documents: a block is its middle sample's document, and the bootstrap's per-document sums
add up the blocks of each. Before (issue 35), nothing failed when a block was given its first sample's document."""

from __future__ import annotations

import numpy as np
import pytest

from hbpe.experiments.eval_noise import describe_eval_set, document_sums
from hbpe.pipeline.shards.reader import ShardDir
from hbpe.schemas.symbols import TOKEN_EOD
from tests.helpers import convert

pytestmark = pytest.mark.e2e  # converts a corpus (conftest.py: the tiers)

WORDS = ["the", "union", "state", "congress", "people", "nation", "war", "peace", "law", "trade"]


@pytest.fixture(scope="module")
def short_documents(tmp_path_factory, gpt2_tokenizer_dir):
    """Shards of 30 documents of 4 to 26 words at 8 patches a sample: most documents span two or three samples."""
    root = tmp_path_factory.mktemp("eval-noise")
    docs = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(4 + (7 * i) % 23)) for i in range(30)]
    corpus = root / "docs.jsonl"
    corpus.write_text("".join(f'{{"text": "{d}."}}\n' for d in docs))
    convert(gpt2_tokenizer_dir, [corpus], root / "shards", seq_len=8)
    return root / "shards"


def _documents_by_hand(shards) -> tuple[list[int], list[int]]:
    """Each sample's document (the EODs before it: the one it starts in) and its text bytes."""
    doc, nbytes, eods = [], [], 0
    for s in ShardDir(shards).samples():
        doc.append(eods)
        nbytes.append(int(s["num_bytes"]))
        eods += int(np.count_nonzero(np.asarray(s["tokens"]) == TOKEN_EOD))
    return doc, nbytes


def test_a_block_is_its_middle_samples_document(short_documents):
    doc, nbytes = _documents_by_hand(short_documents)
    e = describe_eval_set(short_documents, blocks=4, block=4)
    assert len(doc) >= 40 and len(e["blocks"]) == 4
    # the case this test is for: blocks whose first sample starts in another document than their middle one
    assert sum(doc[start] != doc[start + n // 2] for start, n, _, _ in e["blocks"]) >= 2
    for start, n, document, block_bytes in e["blocks"]:
        assert n == 4 and document == doc[start + 2]
        assert block_bytes == sum(nbytes[start : start + 4])
    assert e["documents"] == len({doc[start + 2] for start, *_ in e["blocks"]})
    assert (e["samples"], e["bytes"]) == (16, sum(b[3] for b in e["blocks"]))
    assert e["held_out"] == {"samples": len(doc), "bytes": sum(nbytes), "documents": doc[-1] + 1}
    assert e["held_out"]["documents"] in (29, 30)  # the last document's EOD may lie in the tail no sample holds


def test_document_sums_add_up_the_blocks_of_each_document(short_documents):
    doc, _ = _documents_by_hand(short_documents)
    e = describe_eval_set(short_documents, blocks=len(doc) // 2, block=2)  # every sample, in blocks of 2
    n_blocks = len(e["blocks"])
    nll = [float(2**i) for i in range(n_blocks)]  # one per block: each sum tells which blocks went into it
    nbytes = [3 * 2**i for i in range(n_blocks)]
    expected: dict[int, list[float]] = {}
    for (start, n, *_), x, b in zip(e["blocks"], nll, nbytes, strict=True):
        sums = expected.setdefault(doc[start + n // 2], [0.0, 0])
        sums[0] += x
        sums[1] += b
    assert len(expected) < n_blocks  # documents of several blocks: their sums add up
    sums = document_sums({"eval_batch_nll": nll, "eval_batch_bytes": nbytes}, e)
    assert sums is not None
    got_nll, got_bytes = sums
    assert list(got_nll) == [expected[d][0] for d in sorted(expected)]  # in document order
    assert list(got_bytes) == [expected[d][1] for d in sorted(expected)]
    # a run whose final evaluation is not one batch per block (or kept no sums) has no document sums
    assert document_sums({"eval_batch_nll": nll[:-1], "eval_batch_bytes": nbytes[:-1]}, e) is None
    assert document_sums({"bpb": 1.0}, e) is None
