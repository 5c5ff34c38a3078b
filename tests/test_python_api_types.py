"""The typed Python API (issue 27): reports as frozen dataclasses whose as_dict() is the command's --json, a clean
`dir(hbpe)` that imports nothing heavy, `hbpe.export` / `hbpe.plot` at the top, the py.typed marker, the reference
generated from the docstrings, and `hbpe experiment list`."""

from __future__ import annotations

import dataclasses
import inspect
import json
import subprocess
import sys
import tomllib

import pytest
from click.testing import CliRunner

import hbpe
from hbpe import api
from hbpe.cli import main
from hbpe.results import ConvertResult, PlotResult, Result
from tests.conftest import REPO
from tests.training.test_plot_inputs import _good_lines


def _corpus(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "Fellow-Citizens of the Senate"}\n{"text": "and of the House of Representatives"}\n')
    return corpus


def _without_timing(m: dict) -> dict:
    """A manifest less what differs between two runs of one conversion: its clock and where it wrote."""
    return {k: v for k, v in m.items() if k not in ("timing", "config")}


def test_convert_returns_a_frozen_result_whose_as_dict_is_the_cli_json(tmp_path, gpt2_tokenizer_dir):
    corpus = _corpus(tmp_path)
    r = hbpe.convert(corpus, tmp_path / "a", tokenizer=gpt2_tokenizer_dir, seq_len=8, runner="inprocess", workers=1)
    assert isinstance(r, ConvertResult)
    m = r.as_dict()
    assert (r.documents_read, r.documents_written, r.documents_rejected) == (2, 2, 0)
    assert (r.samples, r.shards, r.seq_len) == (m["counts"]["samples"], len(m["shards"]), 8)
    assert r.bytes_per_patch == m["statistics"]["bytes_per_patch"] > 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.samples = 0  # type: ignore[misc]
    m["counts"]["samples"] = -1  # a copy: the result is unchanged
    assert r.as_dict()["counts"]["samples"] == r.samples
    assert "report" not in repr(r) and f"samples={r.samples}" in repr(r)
    # code written when these were dicts still runs, warned towards the typed field or as_dict()
    with pytest.warns(
        DeprecationWarning, match=r"ConvertResult\['counts'\] is deprecated: use \.as_dict\(\)\['counts'\]"
    ):
        assert r["counts"] == m["counts"] | {"samples": r.samples}
    with pytest.warns(DeprecationWarning, match=r"use \.seq_len"):
        assert r["seq_len"] == 8
    with pytest.raises(KeyError):
        r["no-such-key"]

    args = ["convert", "--tokenizer", str(gpt2_tokenizer_dir), "--input", str(corpus), "--out", str(tmp_path / "b")]
    cli = CliRunner().invoke(main, ["-q", *args, "--seq-len", "8", "--runner", "inprocess", "--workers", "1", "--json"])
    assert cli.exit_code == 0, cli.output
    assert _without_timing(json.loads(cli.stdout)) == _without_timing(json.loads(json.dumps(r.as_dict())))


def test_plot_is_at_the_top_and_returns_a_typed_result(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_bytes(b"\n".join(_good_lines()) + b"\n")
    r = hbpe.plot(run, out=tmp_path / "curves.png")
    assert isinstance(r, PlotResult) and hbpe.plot is api.plot
    assert (r.out, r.train_points, r.eval_points, r.last_batch, r.final_eval_bpb) == (
        str(tmp_path / "curves.png"), 4, 2, 4, 3.5,
    )  # fmt: skip
    cli = CliRunner().invoke(main, ["plot", "--checkpoint", str(run), "--out", str(tmp_path / "curves.png"), "--json"])
    assert cli.exit_code == 0, cli.output
    assert json.loads(cli.stdout) == r.as_dict()


def test_every_report_is_a_result_dataclass():
    """Each api function that reports returns a Result subclass (its annotation says which), frozen."""
    reporting = {"convert", "train", "evaluate", "score_tasks", "export", "plot"}
    for name in reporting:
        returns = inspect.signature(getattr(api, name)).return_annotation
        cls = getattr(sys.modules["hbpe.results"], returns)
        assert issubclass(cls, Result) and dataclasses.is_dataclass(cls), name
        assert cls.__dataclass_params__.frozen, name
    assert hbpe.export is api.export


def test_dir_of_hbpe_is_its_public_names_and_import_stays_light():
    assert dir(hbpe) == sorted([*hbpe.__all__, "__version__"])
    code = "import sys, hbpe; print(dir(hbpe)); print(sorted(m for m in sys.modules if m.startswith('hbpe')))"
    code += "; print([m for m in ('typing', 'importlib.metadata', 'click') if m in sys.modules])"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    names, modules, heavy = r.stdout.splitlines()
    for private in ("Any", "import_module", "PackageNotFoundError", "version", "TYPE_CHECKING"):
        assert f"'{private}'" not in names
    assert modules == "['hbpe']"  # hbpe.api (and the tokenizer it imports) wait for their first use
    assert heavy == "[]"  # nor typing or importlib.metadata (__version__ is read on first use)
    r = subprocess.run([sys.executable, "-c", "import hbpe; print(hbpe.__version__)"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip()


def test_the_py_typed_marker_ships():
    assert (REPO / "hbpe" / "py.typed").is_file()
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data["hbpe"]


def test_the_api_reference_is_generated_from_the_docstrings(tmp_path):
    r = subprocess.run(
        [sys.executable, str(REPO / "infra" / "dev" / "api_docs.py"), str(tmp_path / "api")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    top, functions, results = (tmp_path / "api" / f"{m}.html" for m in ("hbpe", "hbpe.api", "hbpe.results"))
    for name in hbpe.__all__:
        for page in (top, functions):  # its anchor, then its signature and docstring
            assert f'<a name="-{name}"><strong>{name}</strong></a>(' in page.read_text(), (page.name, name)
        words = inspect.getdoc(getattr(api, name)).split()[:2]
        assert "&nbsp;".join(words) in functions.read_text(), name  # pydoc keeps a docstring's spaces as &nbsp;
    for cls in ("ConvertResult", "TrainResult", "EvalResult", "TaskScores", "ExportResult", "PlotResult"):
        assert f'name="{cls}"' in results.read_text(), cls


def test_experiment_list_prints_one_line_per_preset():
    from hbpe.experiments.presets import PRESETS

    r = CliRunner().invoke(main, ["experiment", "list"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert [line.split()[0] for line in lines] == list(PRESETS)
    assert (
        lines[0].split(None, 1)[1]
        == "The paper's Table 1 rows at mini size on one set of shards (gpt2 first stage, S=10)"
    )
    assert all(len(line.split(None, 1)) == 2 for line in lines)  # every preset has a description
    r = CliRunner().invoke(main, ["experiment", "list", "--json"])
    assert json.loads(r.stdout).keys() == PRESETS.keys()
    r = CliRunner().invoke(main, ["experiment", "list", "batches=3"])
    assert r.exit_code == 2 and "`hbpe experiment list` takes no overrides (got batches=3)" in r.output


def test_entropy_input_is_the_spec_key_an_override_sets(tmp_path):
    """`--entropy-input F` reaches the spec through load_spec, as the override the command used to build."""
    from hbpe.experiments.presets import load_spec

    files = [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]
    given = load_spec("table1-mini", ["batches=30"], entropy_corpus=files)
    as_override = load_spec("table1-mini", ["batches=30", f"entropy_corpus={json.dumps(files)}"])
    assert given == as_override and list(given.entropy_corpus) == files
    # given last, it wins over an override of the same key, as the command's appended override did
    assert load_spec("table1-mini", ["batches=30", "entropy_corpus=[x.jsonl]"], entropy_corpus=files) == given
