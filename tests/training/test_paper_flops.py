"""The paper's Table 1 FLOPs for the byte baselines: given boundaries reproduce them, and `hbpe flops` shows
each reading of the paper's local FFN (384, 512, 768) beside the paper's numbers."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.schemas.train_config import model_config
from hbpe.training.model.flops import paper_forward_flops
from hbpe.training.model.paper_flops import PAPER_BYTES_PER_WORD, paper_setup_rows

BYTE_ROWS = {"space patch, max 6": 534, "entropy patch, max 6": 668, "entropy patch, unbounded": 509}


def test_given_boundaries_reproduce_the_papers_byte_baseline_flops():
    rows = {r["scheme"]: r for r in paper_setup_rows()}
    for label, paper in BYTE_ROWS.items():
        g = rows[label]["gflops_by_local_ffn"]
        assert rows[label]["paper_gflops"] == paper
        assert g["384"] == pytest.approx(paper, rel=0.02), label  # the reading the paper's FLOPs imply
        assert paper < g["512"] < 1.03 * paper, label  # the width trained: 2.0-2.6% more
        assert g["384"] < g["512"] < g["768"]
    assert rows["BPE-patch"]["gflops_by_local_ffn"]["384"] == pytest.approx(554, rel=0.01)


def test_eop_is_what_made_the_space_row_582():
    cfg = model_config("small", io="space")
    bpp = PAPER_BYTES_PER_WORD / 1.45
    eop = paper_forward_flops(cfg, input_bytes=8192, bytes_per_patch=bpp, symbols_per_patch=bpp + 1, vocab_size=259)
    given = paper_forward_flops(cfg, input_bytes=8192, bytes_per_patch=bpp, symbols_per_patch=bpp, vocab_size=259)
    assert eop["total"] / 1e9 == pytest.approx(582, rel=0.005)  # one EOP position more per patch, at FFN 512
    assert given["total"] / 1e9 == pytest.approx(545.5, rel=0.005)


def test_flops_command_shows_every_ffn_reading_beside_the_paper(sample_shards):
    train_dir, _ = sample_shards
    args = ["flops", "small", "--data", str(train_dir), "--samples", "4", "model.patching.boundaries=given"]
    r = CliRunner().invoke(main, [*args, "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    rows = {row["io"]: row for row in json.loads(r.output)}
    space = rows["space"]
    assert space["symbols_per_patch"] == pytest.approx(space["bytes_per_patch"])  # given: no EOP symbol
    assert space["gflops_by_local_ffn"]["512"] == pytest.approx(space["gflops"]["total"])  # small trains 512
    assert space["paper"]["gflops"] == 534 and space["paper_setup"]["paper_gflops"] == 534
    assert rows["bpe"]["gflops_by_local_ffn"]["384"] == rows["bpe"]["gflops_by_local_ffn"]["768"]  # no local models
    text = CliRunner().invoke(main, args, catch_exceptions=False).output
    assert "| FFN 384 | FFN 512 | FFN 768 | paper |" in text
    assert "| space patch, max 6 | 4.29 | 532.6 | 545.5 | 571.2 | 534 |" in text
