"""`hbpe experiment summary`: every rung of the published ladders in one table and plot (hbpe/experiments/rungs.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.experiments import rungs as rungs_module
from hbpe.experiments.rungs import read_results, rungs_of, write_summary
from hbpe.schemas.errors import ConfigError

DOCS = Path(__file__).resolve().parents[2] / "docs" / "experiments"
LADDERS = [DOCS / "ladder-width", DOCS / "ladder-data", DOCS / "ladder-paper-mini"]


def test_the_summary_holds_every_published_pair_with_its_numbers(tmp_path):
    report = write_summary(LADDERS, tmp_path / "s")
    sources = {f.name: json.loads((f / "results.json").read_text()) for f in LADDERS}
    expected = [(name, p) for name, d in sources.items() for p in d["ladder"]["pairs"]]
    assert len(report["rungs"]) == len(expected) == 6
    for name, p in expected:
        (r,) = [r for r in report["rungs"] if r["experiment"] == name and r["b"] == p["b"]]
        assert (r["gap"], r["params_b"], r["tokens_per_param"], r["k"]) == (
            p["gap"], p["params_b"], p["tokens_per_param"], p["k"],
        )  # fmt: skip
    table = (tmp_path / "s" / "rungs.md").read_text()
    assert "| ladder-paper-mini | bpe-patch − bpe | equal width | 1.28M / 1.06M | 2.07 | +0.301" in table
    assert "≤ 0.25" in table  # ladder-width's k: BPE-patch's BPB lies outside BPE's 160-batch curve
    assert (tmp_path / "s" / "rungs.png").stat().st_size > 10_000


def test_a_width_sweep_gives_its_tuned_pairs_at_its_own_tokens_per_parameter():
    d = copy.deepcopy(read_results(DOCS / "ladder-width"))
    d["experiment"] = "lr-sweep-width"
    d["ladder"] = None
    d["tuned_by_width"] = [{"width": 384, "a": "bpe-x4", "b": "bpe-patch-x4", "gap": 0.25, "gap_std": None,
                            "eval_noise": {"sd": 0.01}}]  # fmt: skip
    (r,) = rungs_of(d, "sweep")
    params_b = next(x for x in d["rows"] if x["name"] == "bpe-patch-x4")["params"]["total"]
    assert (r["kind"], r["gap"], r["params_b"], r["eval_sd"]) == ("tuned lr", 0.25, params_b, 0.01)
    assert r["tokens_per_param"] == pytest.approx(160 * 8 * 128 / params_b)


def test_files_that_are_not_finished_experiments_get_one_clear_error(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="no results.json of a finished experiment"):
        read_results(tmp_path)
    (tmp_path / "results.json").write_text('{"rows": []}')
    with pytest.raises(ConfigError, match="not written by `hbpe experiment`"):
        read_results(tmp_path)
    (tmp_path / "results.json").write_text("[" * 100_000)
    with pytest.raises(ConfigError, match="is not JSON"):
        read_results(tmp_path)
    monkeypatch.setattr(rungs_module, "MAX_RESULTS_BYTES", 1000)
    with pytest.raises(ConfigError, match="over the 0 MiB"):
        read_results(DOCS / "ladder-data")
    monkeypatch.undo()
    bad = read_results(DOCS / "ladder-data")
    bad["ladder"]["pairs"][0]["gap"] = "NaN"
    with pytest.raises(ConfigError, match="a ladder pair without a gap"):
        rungs_of(bad, "x")
    with pytest.raises(ConfigError, match="none of these experiments has ladder pairs"):
        write_summary([DOCS / "lr-sweep-mini"], tmp_path / "out")


def test_the_cli_writes_the_summary_and_refuses_no_folders(tmp_path):
    res = CliRunner().invoke(main, ["experiment", "summary", *map(str, LADDERS), "--out", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    assert len(json.loads(res.stdout)["rungs"]) == 6
    res = CliRunner().invoke(main, ["experiment", "summary"])
    assert res.exit_code == 2 and "takes the folders of finished experiments" in res.output
    res = CliRunner().invoke(main, ["experiment", "summary", str(tmp_path / "missing")])
    assert res.exit_code != 0 and "no results.json of a finished experiment" in res.output
    assert "Traceback" not in res.output


def test_the_summary_never_writes_through_a_link(tmp_path):
    (tmp_path / "victim.md").write_text("keep")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "rungs.md").symlink_to(tmp_path / "victim.md")
    with pytest.raises(ConfigError, match="is a link or not a regular file"):
        write_summary(LADDERS, tmp_path / "out")
    assert (tmp_path / "victim.md").read_text() == "keep"
