"""The plain-PyTorch training steps of GPU machines without the pinned stack (training/bench_step.py)."""

from __future__ import annotations

import numpy as np
import torch

from hbpe.schemas.symbols import TOKEN_EOD
from hbpe.schemas.train_config import model_config
from hbpe.training.bench_step import TokenBatches, save_token_batches, train_steps
from hbpe.training.data.schemes import TokenScheme


def test_saved_batches_give_the_token_schemes_columns_and_train(tmp_path, gpt2_tokenizer, sample_texts):
    tok = gpt2_tokenizer
    stream = np.concatenate([np.append(tok.encode(t), TOKEN_EOD) for t in sample_texts[:4]]).astype(np.int32)
    rows = stream[: 24 * 33].reshape(24, 33)
    save_token_batches(tok, {"train": rows[:20], "eval": rows[20:]}, tmp_path / "b.npz")
    data = TokenBatches(tmp_path / "b.npz", torch.device("cpu"))

    got = data.batch("train", torch.tensor([3, 0, 7]))
    want = TokenScheme(tok, derive=True).batch(rows[[3, 0, 7]], None)
    for key, value in want.items():  # the loader's scheme, column by column
        assert np.array_equal(got[key].numpy(), np.asarray(value)), key
    assert data.spread("eval", 3).tolist() == [0, 2, 3]  # first, middle, last rows, not the first three

    cfg = model_config("tiny", latent_layers=1)
    r = train_steps(cfg, data, steps=12, batch_size=4, lr=3e-3, warmup=2, eval_rows=4, timed_from=1)
    assert r["bytes_per_sec"] > 0 and r["pad_share"] < 0.1 and 0 < r["bpb"] < 12
    assert r["executed_flops_per_byte"] < 1.35 * 1.5 * r["paper_flops_per_byte"]
