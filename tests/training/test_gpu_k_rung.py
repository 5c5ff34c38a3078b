"""infra/gpu/k_rung.py (issue 36's GPU rung) at a tiny size on CPU: prepare, four processes, report, k-along."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from hbpe.cli import main
from tests.conftest import split_sample

SCRIPT = Path(__file__).resolve().parents[2] / "infra" / "gpu" / "k_rung.py"
TINY = dict(latent_layers=1, latent_dim=32, latent_ffn=64, latent_heads=2, local_dim=16, local_ffn=32, local_heads=2,
            encoder_layers=1, decoder_layers=1)  # fmt: skip


@pytest.fixture(scope="module")
def k_rung():
    spec = importlib.util.spec_from_file_location("k_rung", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cooldown_schedule_and_eval_blocks(k_rung):
    factors = [k_rung.lr_factor(s, 200, 20, 0.1) for s in range(200)]
    assert factors[:20] == pytest.approx([(s + 1) / 20 for s in range(20)])
    assert set(factors[20:180]) == {1.0}
    assert factors[180:] == pytest.approx([(200 - s) / 20 for s in range(180, 200)])  # linear to 1/20 at the end
    # rows with EOD (< 0) tokens: the document a block is attributed to is its middle row's
    rows = np.ones((40, 5), dtype=np.int32)
    rows[9, 2] = rows[19, 0] = rows[29, 3] = -1  # documents change inside rows 9, 19 and 29
    blocks = k_rung.eval_set(rows, 4, 4)
    assert blocks == [[3, 4, 0, 0], [23, 4, 2, 0], [13, 4, 1, 0], [33, 4, 3, 0]]


def test_four_runs_at_once_then_the_report_and_k_along(k_rung, tmp_path):
    from hbpe.experiments.data_prep import first_stage_tokenizer
    from hbpe.experiments.spec import FirstStageSpec
    from hbpe.pipeline.tokenizer import artifact

    data = tmp_path / "data"
    train, held = split_sample(data / "corpus")
    fs = FirstStageSpec(vocab_size=300, pattern="gpt2")  # an in-house first stage, as the rung's 4K, small
    tok = first_stage_tokenizer(fs, max_patch_size=10, train_files=[str(train)], folder=tmp_path)
    npz = tmp_path / "rows.npz"
    k_rung.prepare(npz, data, tokenizer=artifact.save(tok, tmp_path / "tok"))
    out = tmp_path / "out"
    runs = k_rung.run_all(npz, out, sizes=TINY, batch=4, tokens_per_param=0.25, budget_s=300, curve_points=4,
                          eval_blocks=6, block_rows=4)  # fmt: skip
    assert [r["name"] for r in runs] == [name for name, _, _ in k_rung.RUNS]
    for r in runs:
        assert "stopped" not in r and r["curve"][-1]["batch"] == r["steps"]
        assert r["steps"] == runs[0]["steps"] >= 10  # one budget for the pair, set by BPE-patch's parameters
        for p in r["curve"]:
            assert sum(p["eval_batch_nll"]) / math.log(2) / sum(p["eval_batch_bytes"]) == pytest.approx(p["bpb"])
            assert len(p["eval_batch_nll"]) == len(r["eval_blocks"])
    same = [r for r in runs if r["io"] == "bpe"]  # the same rows in the same order: the same bytes at every point
    assert [p["train_bytes"] for p in same[0]["curve"]] == [p["train_bytes"] for p in same[1]["curve"]]
    reading = k_rung.report(out)["reading"]
    assert reading in ("supports the paper's level", "against the paper's level", "between the two levels")
    assert "Best against best" in (out / "k_rung.md").read_text()
    res = CliRunner().invoke(main, ["experiment", "k-along", str(out), "--out", str(tmp_path / "k"), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["a"] == "bpe"
