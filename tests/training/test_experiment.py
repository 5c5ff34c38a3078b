"""`hbpe experiment`: the shipped presets, narrowed, run end to end on the bundled sample."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.experiments.presets import PRESETS, load_spec
from hbpe.schemas.errors import ConfigError
from tests.conftest import split_sample

# every preset at its own structure, with a budget and sizes that run in seconds
NARROW = [
    "batches=4",
    "eval_points=2",
    "eval_batches=1",
    "final_eval_batches=1",
    "global_batch_size=2",
    "model.latent_layers=1",
    "model.encoder_layers=1",
    "model.decoder_layers=1",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return split_sample(tmp_path_factory.mktemp("exp-corpus"))


def _run(preset: str, out, corpus, *extra: str):
    train, held = corpus
    args = ["experiment", preset, *NARROW, *extra, "--out", str(out), "--train-input", str(train)]
    res = CliRunner().invoke(main, [*args, "--eval-input", str(held), "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_table1_mini_runs_every_scheme_at_an_equal_byte_budget(corpus, tmp_path):
    out = tmp_path / "t1"
    report = _run("table1-mini", out, corpus)
    runs = {r["name"]: r for r in report["runs"]}
    assert list(runs) == ["bytes", "entropy-max6", "entropy-unbounded", "space-max6", "bpe", "bpe-patch"]
    assert len({r["train_bytes"] for r in runs.values()}) == 1  # the same samples, the same bytes, every scheme
    for r in runs.values():
        assert 0 < r["bpb"] < 12 and len(r["curve"]) == 2, r["name"]
        assert r["curve"][-1]["train_bytes"] == r["train_bytes"]
    assert runs["bytes"]["gflops"]["total"] > 3 * runs["bpe-patch"]["gflops"]["total"]
    assert runs["entropy-max6"]["model"]["patching"]["entropy_threshold"] > 0  # chosen on the shards, recorded
    assert runs["entropy-max6"]["bytes_per_patch"] <= 6.0
    table = (out / "table.md").read_text()
    assert "| BPE-patch |" in table and "| entropy patch, unbounded |" in table
    assert (out / "curve.png").stat().st_size > 1000

    # a rerun skips finished runs (no retraining: the results are the files already written)
    before = {n: (out / "runs" / n / "result.json").stat().st_mtime_ns for n in runs}
    again = _run("table1-mini", out, corpus)
    assert [r["bpb"] for r in again["runs"]] == [r["bpb"] for r in report["runs"]]
    assert before == {n: (out / "runs" / n / "result.json").stat().st_mtime_ns for n in runs}
    # ... and refuses results written under another budget instead of mixing them into the table
    train, held = corpus
    with pytest.raises(ConfigError, match="another spec"):
        from hbpe.experiments.runner import run_experiment

        spec = load_spec("table1-mini", [*NARROW, "batches=6"], train_corpus=[str(train)], eval_corpus=[str(held)])
        run_experiment(spec, out)


def test_s_ablation_derives_every_s_from_one_set_of_shards(corpus, tmp_path):
    out = tmp_path / "s"
    report = _run("s-ablation-mini", out, corpus, "runs=" + json.dumps([
        {"name": f"s{s}", "first_stage": "gpt2", "max_patch_size": s, "model": {"io": "hierarchical"}} for s in (4, 10)
    ]))  # fmt: skip
    assert [r["max_patch_size"] for r in report["runs"]] == [4, 10]
    assert len(list((out / "data").glob("*/shards-train"))) == 1  # one conversion
    assert (out / "s.png").is_file()
    s4, s10 = report["runs"]
    assert s4["symbols_per_patch"] < s10["symbols_per_patch"] and s4["bytes_per_patch"] == s10["bytes_per_patch"]


def test_specs_are_checked_before_anything_runs(tmp_path):
    for name in PRESETS:
        if name not in ("table1-small", "table3-medium"):
            load_spec(name)  # every preset is a valid spec
    with pytest.raises(ConfigError, match="--train-input"):
        load_spec("table1-small")
    assert load_spec("table1-small", train_corpus=["x.jsonl"]).model_size == "small"
    with pytest.raises(ConfigError, match="unknown experiment keys"):
        load_spec("table1-mini", ["batchez=3"])
    with pytest.raises(ConfigError, match="unknown preset"):
        load_spec("table9")
    with pytest.raises(ConfigError, match="model.latent_dim"):
        load_spec("table1-mini", ["model.latent_dim=abc"])
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: x\ndescription: y\nfirst_stages: {g: {encoding: gpt2}}\n"
        "runs:\n - {name: e, first_stage: g, model: {io: entropy, entropy_target_bytes: 4}, entropy_from: b}\n"
        " - {name: b, first_stage: g, model: {io: bytes}}\n"
    )
    with pytest.raises(ConfigError, match="earlier bytes run"):
        load_spec(str(bad))
