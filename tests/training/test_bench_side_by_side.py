"""`hbpe bench train --compare`: models trained side by side in one process, with ratios to the first."""

from __future__ import annotations

import json
import statistics

import pytest
from click.testing import CliRunner

from hbpe.cli import main


def test_packed_and_padded_side_by_side_report_what_each_ran(sample_shards):
    args = ["bench", "train", "tiny", f"data.train={sample_shards[0]}", f"data.eval={sample_shards[1]}", "model.encoder_layers=2",
            "model.decoder_layers=2", "--batches", "3", "--repeat", "2", "--compare", "packed",
            "--compare", "padded model.local_layout=padded", "--json"]  # fmt: skip
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)
    packed, padded = r["variants"]["packed"], r["variants"]["padded"]
    assert r["repeat"] == 2 and len(packed["bytes_per_sec_all"]) == len(padded["bytes_per_sec_all"]) == 2
    assert packed["bytes_per_sec_ratio"] == 1.0 == packed["bytes_per_sec_round_ratio"]
    assert padded["bytes_per_sec_ratio"] == pytest.approx(padded["bytes_per_sec"] / packed["bytes_per_sec"])
    rounds = [b / a for a, b in zip(packed["bytes_per_sec_all"], padded["bytes_per_sec_all"], strict=True)]
    assert padded["bytes_per_sec_round_ratio"] == pytest.approx(statistics.median(rounds))
    # the same batches, another layout: padded executes the PAD that packed leaves out, the paper's count is one
    assert packed["paper_flops_per_byte"] == pytest.approx(padded["paper_flops_per_byte"])
    assert packed["pad_share"] < 0.01 < 0.3 < padded["pad_share"]
    assert padded["executed_flops_per_byte"] > 1.5 * packed["executed_flops_per_byte"]
    assert packed["executed_flops_per_byte"] < 1.35 * packed["paper_flops_per_byte"]  # issue 25's bound


def test_a_compare_without_a_name_is_refused_in_one_line(sample_shards):
    res = CliRunner().invoke(main, ["bench", "train", "tiny", f"data.train={sample_shards[0]}", "data.eval=null", "--batches", "2",
                                    "--compare", "model.local_layout=padded"])  # fmt: skip
    assert res.exit_code == 2 and "each --compare starts with a new name" in res.output
    assert "Traceback" not in res.output
