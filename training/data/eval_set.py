"""A fixed evaluation set spread over the whole held-out split (`data.eval_samples`).

Held-out shards hold their documents in order (en-sotu's: one address after another, 1799 to
2018), so the first N batches of an in-order read are the first few documents only. With
`data.eval_samples=N` an evaluation reads N samples in blocks of one device batch of consecutive
samples: the split is cut into as many strata of equal width as there are blocks, and each block
sits in the middle of its stratum. The blocks are evaluated in van der Corput order (positions
1/2, 1/4, 3/4, 1/8, ...), so that every prefix is spread too: `eval_subset_num_batches=k`
evaluates k blocks spread over the whole split. A block of consecutive samples keeps each batch
within one stretch of text (mostly of one document), so a batch's summed NLL and bytes are a unit
that a bootstrap over documents can resample (hbpe/experiments/eval_noise.py).

The selection is a function of the split's sample count, N and the block size alone: every run
evaluated on the same shards with the same N and batch reads the same samples.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hbpe.schemas.errors import ConfigError


def van_der_corput_order(n: int) -> list[int]:
    """0..n-1 in the order of the van der Corput sequence scaled to n: every prefix is spread over 0..n-1.

    >>> van_der_corput_order(5)
    [0, 2, 1, 3, 4]
    """
    order: list[int] = []
    seen = set()
    i = 0
    while len(order) < n:
        v, f, k = 0.0, 0.5, i  # the bits of i mirrored after the point: 0, 1/2, 1/4, 3/4, 1/8, ...
        while k:
            v += f * (k & 1)
            k >>= 1
            f /= 2
        j = int(v * n)
        if j not in seen:
            seen.add(j)
            order.append(j)
        i += 1
    return order


def eval_blocks(total: int, samples: int, block: int) -> list[tuple[int, int]]:
    """(first sample, samples) of each block of the eval set, in evaluation order.

    `total` samples in the split, `samples` asked for, `block` samples per block (the eval batch).
    When the split holds no more than the samples asked for, every sample is read, in blocks.

    >>> eval_blocks(100, 20, 5)  # 4 strata of 25 samples, a block of 5 in the middle of each
    [(10, 5), (60, 5), (35, 5), (85, 5)]
    >>> eval_blocks(7, 20, 5)
    [(0, 5), (5, 2)]
    """
    if total < 1 or samples < 1 or block < 1:
        raise ValueError(f"eval_blocks needs positive counts, got total={total}, samples={samples}, block={block}")
    n = max(samples // block, 1)
    if n * block >= total:
        starts = list(range(0, total, block))
        return [(s, min(block, total - s)) for s in starts]
    stride = total / n
    starts = [int(i * stride + (stride - block) / 2) for i in range(n)]
    return [(starts[j], block) for j in van_der_corput_order(n)]


def rank_blocks(blocks: list[tuple[int, int]], *, rank: int, world: int, what: str) -> list[tuple[int, int]]:
    """This rank's blocks (every world-th, from its rank), the same number on every rank: an evaluation
    runs the model on every rank in step (FSDP gathers weights for each forward), so uneven counts would hang."""
    per_rank = len(blocks) // world
    if per_rank == 0:
        raise ConfigError(
            f"{what}: {len(blocks)} block(s) of the eval set for {world} ranks; every rank needs one: "
            f"raise data.eval_samples to at least {world} x the device batch"
        )
    return blocks[rank::world][:per_rank]


class IndexedSamples(torch.utils.data.Dataset):
    """Samples of a (streaming) dataset by global index, in the order given.

    A DataLoader asks for a batch at once (`__getitems__`): a dataset with batched reads
    (training/data/batched_reads.py) reads a block's samples with one gather per shard from its memory maps,
    where streaming's `dataset[i]` opens, seeks, reads and closes the shard for each sample.
    """

    def __init__(self, dataset: Any, indices: list[int]) -> None:
        self.dataset, self.indices = dataset, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> Any:
        return self.dataset[self.indices[i]]

    def __getitems__(self, positions: list[int]) -> list[Any]:
        ids = [self.indices[i] for i in positions]
        # read_samples leaves a shard of another layout to streaming's get_item; batched_reads=False: all of them
        if getattr(self.dataset, "batched_reads", False):
            return self.dataset.read_samples(np.asarray(ids, dtype=np.int64))
        return [self.dataset[i] for i in ids]
