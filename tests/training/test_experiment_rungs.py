"""`hbpe experiment summary`: every rung of the published ladders in one table and plot (hbpe/experiments/rungs.py)."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.experiments import rungs as rungs_module
from hbpe.experiments.rungs import read_results, rungs_of, write_summary
from hbpe.schemas.errors import ConfigError
from tests.helpers import cli_fails

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
    with pytest.raises(ConfigError, match=r'x: ladder\.pairs\[0\]\.gap is "NaN": expected a number in \[-100, 100\]'):
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


def _hostile(tmp_path: Path, name: str, edit) -> Path:
    """A copy of ladder-data's results.json as a folder of its own, `edit`ed (a function of the parsed file)."""
    d = read_results(DOCS / "ladder-data")
    edit(d)
    folder = tmp_path / name
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps(d))
    return folder


P0 = "ladder.pairs[0]"


def _pair0(**values):
    """ladder-data's first pair with these values."""
    return lambda d: d["ladder"]["pairs"][0].update(values)


def _every_number(value):
    """Each number of the ladder pair set to value(number)."""

    def edit(d):
        for p in d["ladder"]["pairs"]:
            for key in ("gap", "gap_std", "gap_eval_sd", "params_a", "params_b", "tokens_per_param", "k"):
                p[key] = value(p[key])
            p["k_ci95"] = [value(x) for x in p["k_ci95"]]

    return edit


@pytest.mark.parametrize(
    ("name", "edit", "field", "shown"),
    [
        # before: internal error: OverflowError (float() of an integer past float's range)
        ("huge", _every_number(lambda x: 10**400), P0 + ".k", "an integer of 401 digits"),
        # before: internal error: ValueError: 'yerr' must not contain negative values
        ("negative", _every_number(lambda x: -abs(x)), P0 + ".k", "-0.1119"),
        # before: internal error: ValueError: Data cannot be log-scaled because all values are <= 0
        ("zeros", _every_number(lambda x: 0), P0 + ".k", "0"),
        # before: internal error: ValueError: 'yerr' must not contain negative values (the seeds' spread)
        ("negative-std", _pair0(gap_std=-0.01), P0 + ".gap_std", "-0.01"),
        ("zero-params", _pair0(params_b=0), P0 + ".params_b", "0"),
        # before: internal error: AttributeError: 'list' object has no attribute 'get'
        ("ladder-list", lambda d: d.update(ladder=[1, 2]), "ladder", "[1, 2]"),
        ("pairs-number", lambda d: d["ladder"].update(pairs=5), "ladder.pairs", "5"),
        ("pair-list", lambda d: d["ladder"].update(pairs=[[1]]), P0, "[1]"),
        ("no-name", lambda d: d["ladder"]["pairs"][0].pop("a"), P0 + ".a", "None"),
        ("long-name", lambda d: d.update(experiment="x" * 10**6), "experiment", '"xxxxxxxx'),  # the legend draws it
        # an interval that does not hold k: before, a negative error bar in the plot
        ("interval", _pair0(k_ci95=[0.5, 0.6]), P0 + ".k_ci95", "[0.5"),
        ("interval-text", _pair0(k_ci95=["a", "b"]), P0 + ".k_ci95[0]", '"a"'),
        ("bound", _pair0(k=None, k_bound=["<=", -1]), P0 + ".k_bound[1]", "-1"),
    ],
)
def test_a_hostile_results_json_is_one_error_naming_the_file_and_field_and_writes_nothing(
    tmp_path, name, edit, field, shown
):
    folder = _hostile(tmp_path, name, edit)
    out = tmp_path / "out"
    out.mkdir()
    (out / "rungs.md").write_text("the summary of an earlier run\n")  # left as it was: nothing half-written
    r = CliRunner().invoke(main, ["experiment", "summary", str(DOCS / "ladder-width"), str(folder), "--out", str(out)])
    cli_fails(r, 2, f"{folder / 'results.json'}: {field} is {shown}")
    assert sorted(p.name for p in out.iterdir()) == ["rungs.md"]
    assert (out / "rungs.md").read_text() == "the summary of an earlier run\n"


def test_a_tuned_pair_without_its_row_is_refused(tmp_path):
    d = copy.deepcopy(read_results(DOCS / "lr-sweep-width"))
    d["tuned_by_width"][0]["b"] = "no-such-run"  # before: TypeError sorting None among the parameters
    with pytest.raises(ConfigError, match=r"sweep: tuned_by_width\[0\]\.b is 'no-such-run': no row of that name"):
        rungs_of(d, "sweep")
    d["tuned_by_width"][0] = {**d["tuned_by_width"][1], "eval_noise": [0.1]}  # before: AttributeError
    with pytest.raises(ConfigError, match=r"tuned_by_width\[0\]\.eval_noise is \[0\.1\]: expected an object"):
        rungs_of(d, "sweep")


def test_the_table_is_written_only_once_the_plot_is_made(tmp_path, monkeypatch):
    """Before: rungs.md was written, then the plot failed, leaving a table without its plot (or beside an older
    one). Now both are made first, then written to temporary files renamed over their names."""
    out = tmp_path / "out"

    def failing(*args, **kwargs):
        raise RuntimeError("the plot failed")

    monkeypatch.setattr(rungs_module, "_plot", failing)
    with pytest.raises(RuntimeError, match="the plot failed"):
        write_summary(LADDERS, out)
    assert not out.exists() or not list(out.iterdir())
    monkeypatch.undo()
    write_summary(LADDERS, out)
    assert sorted(p.name for p in out.iterdir()) == ["rungs.md", "rungs.png"]  # no temporary file left
    assert (out / "rungs.md").stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
