"""`data.eval_samples`: one fixed eval set spread over the whole held-out split (issue 29, section 1).

Before: an evaluation read the held-out shards in order, so its first batches were the first
documents of the split only (en-sotu: the 1799 and 1809 addresses for a 4-batch curve point).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hbpe.pipeline.shards.reader import ShardDir
from hbpe.schemas.errors import ConfigError
from hbpe.training.data.eval_set import eval_blocks, rank_blocks, van_der_corput_order
from hbpe.training.model.patch_io import IGNORE
from hbpe.training.train.trainer import build_run
from tests.helpers import train_cfg


def test_blocks_sit_one_per_stratum_and_every_prefix_is_spread():
    total, block = 1980, 8
    blocks = eval_blocks(total, 320, block)
    assert len(blocks) == 40 and all(n == block for _, n in blocks)
    stride = total / 40
    assert sorted(int(s // stride) for s, _ in blocks) == list(range(40))  # one block in each stratum
    for k in (2, 4, 8, 16):  # the first k blocks cover the split, not its beginning
        starts = sorted(s for s, _ in blocks[:k])
        assert starts[0] < total / k and starts[-1] > total * (1 - 2 / k), (k, starts)
    assert blocks == eval_blocks(total, 320, block)  # a function of its arguments: every run reads the same
    assert sorted(van_der_corput_order(40)) == list(range(40))
    assert eval_blocks(20, 320, 8) == [(0, 8), (8, 8), (16, 4)]  # a small split: all of it
    assert rank_blocks(blocks, rank=1, world=3, what="x") == blocks[1::3][:13]
    with pytest.raises(ConfigError, match="data.eval_samples=8: 1 block.* for 2 ranks"):
        rank_blocks(eval_blocks(total, 8, 8), rank=0, world=2, what="data.eval_samples=8")


def test_the_eval_loader_reads_the_spread_samples_in_their_order(sample_shards, tmp_path):
    _, held = sample_shards
    total = ShardDir(held).manifest.counts.samples
    rows = [s["tokens"] for s in ShardDir(held).samples()]
    assert total >= 12
    cfg = train_cfg(sample_shards, tmp_path / "run", "global_batch_size=2", "data.eval_samples=6")
    run = build_run(cfg)
    try:
        loader = run.trainer.state.evaluators[0].dataloader.dataloader
        blocks = eval_blocks(total, 6, 2)
        assert len(blocks) == 3 and blocks[0][0] > 0  # not the split's first samples
        batches = list(loader)
        assert len(batches) == 3
        for (start, n), batch in zip(blocks, batches, strict=True):
            assert np.array_equal(batch["tokens"].numpy(), np.stack(rows[start : start + n]).astype(np.int64))
        run.trainer.eval()  # Composer evaluates it as any loader
        bpb = float(run.trainer.state.eval_metrics["eval"]["BitsPerByte"].compute())
        # by hand, from each block's summed NLL (torch's cross entropy on the model's logits) and target bytes
        model = run.trainer.state.model.model
        model.eval()
        nll, nbytes = [], []
        with torch.no_grad():
            for batch in batches:
                logits, targets = model(batch)  # (N, V), (N,): IGNORE where nothing is predicted
                nll.append(float(F.cross_entropy(logits.float(), targets, ignore_index=IGNORE, reduction="sum")))
                nbytes.append(int(batch["target_bytes"].sum()))
        assert all(n > 0 for n in nbytes)
        assert bpb == pytest.approx(sum(nll) / sum(nbytes) / math.log(2), rel=1e-5)
    finally:
        run.close()
