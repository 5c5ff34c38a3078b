"""The ladder presets and the lr sweep (issue 29, section 4): their sizes, and each narrowed, run end to end."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.experiments.presets import load_spec
from hbpe.schemas.train_config import model_config
from hbpe.training.model.build import build_model
from hbpe.training.model.patch_lm import VocabSpec, parameter_counts
from tests.conftest import split_sample

V4K = VocabSpec(vocab_size=299, max_patch_size=10, n_vocab=4097)  # the in-house 4K first stage at S=10 (en-sotu)


def _params(spec, name: str) -> dict[str, int]:
    run = next(r for r in spec.runs if r.name == name)
    return parameter_counts(build_model(model_config(spec.model_size, **run.model), V4K))


def test_the_paper_mini_has_the_papers_proportions():
    spec = load_spec("ladder-paper-mini")
    bpe, patch = _params(spec, "bpe"), _params(spec, "bpe-patch")
    assert bpe["io"] / bpe["latent"] == pytest.approx(0.44, abs=0.01)  # the 4K embedding over the 8-layer latent
    assert patch["io"] / patch["latent"] == pytest.approx(0.20, abs=0.01)  # local width 48, FFN 96
    assert bpe["latent"] == patch["latent"]


def test_the_ladders_span_the_sizes_and_data_they_promise():
    width = load_spec("ladder-width")
    totals = [_params(width, f"bpe-patch-x{f}")["total"] for f in ("0.5", "1", "2", "4")]
    assert totals == sorted(totals) and 9e6 <= totals[-1] <= 12e6 and _params(width, "bpe-x4")["total"] >= 8e6
    assert len({r.name for r in width.runs}) == 8 and width.seeds >= 2
    data = load_spec("ladder-data")
    tokens = data.batches * data.global_batch_size * data.seq_len  # about one pass of en-sotu's 2.2M tokens
    per_param = [tokens / _params(data, n)["total"] for n in ("bpe-x0.5", "bpe-patch-x0.5")]
    assert 2.1e6 < tokens < 2.3e6 and all(7 <= t <= 11.5 for t in per_param), per_param
    gpu = load_spec("ladder-gpu")
    assert 16e6 <= max(_params(gpu, r.name)["total"] for r in gpu.runs) <= 19e6
    assert [r.max_patch_size for r in load_spec("ladder-s").runs] == [None, 4, 6, 10]
    for name in ("ladder-paper-mini", "ladder-width", "ladder-data", "ladder-s", "lr-sweep-mini", "ladder-gpu"):
        spec = load_spec(name)
        assert spec.extra["optim"] == {"loss_normalization": "byte", "decay_embeddings": True}, name
        assert spec.eval_batches == spec.final_eval_batches, name  # curves and final BPB on one eval set


NARROW = [
    "batches=3",
    "eval_points=3",
    "eval_batches=2",
    "final_eval_batches=2",
    "global_batch_size=2",
    "warmup=1",
    "seeds=1",
    "model.latent_layers=1",
    "model.encoder_layers=1",
    "model.decoder_layers=1",
    "first_stages={v4096: {vocab_size: 600, pattern: gpt2}}",  # a first stage the 20-document sample can fill
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return split_sample(tmp_path_factory.mktemp("ladder-corpus"))


def _run(preset: str, out, corpus, *extra: str) -> dict:
    train, held = corpus
    args = ["experiment", preset, *NARROW, *extra, "--out", str(out), "--train-input", str(train)]
    res = CliRunner().invoke(main, [*args, "--eval-input", str(held), "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_ladder_width_pairs_each_width_and_compares_best_against_best(corpus, tmp_path):
    rep = _run("ladder-width", tmp_path / "w", corpus)
    pairs = [(p["a"], p["b"]) for p in rep["ladder"]["pairs"]]
    assert pairs == [(f"bpe-x{f}", f"bpe-patch-x{f}") for f in ("0.5", "1", "2", "4")]
    params = [p["params_b"] for p in rep["ladder"]["pairs"]]
    assert params == sorted(params)
    for p, c in zip(rep["ladder"]["pairs"], rep["crossover"], strict=True):
        assert p["tokens_per_param"] == pytest.approx(3 * 2 * 128 / p["params_b"])
        assert p["gap"] == pytest.approx(c["bytes"]["delta_at_end"][0]) and p["gap_std"] is None  # one seed
    best = rep["ladder"]["best_against_best"]
    rows = {r["name"]: r["bpb"]["mean"] for r in rep["rows"]}
    assert best["a"] == min((n for n in rows if not n.startswith("bpe-patch")), key=rows.get)
    assert best["b"] == min((n for n in rows if n.startswith("bpe-patch")), key=rows.get)
    table = (tmp_path / "w" / "table.md").read_text()
    assert "| bpe-patch-x4 − bpe-x4 |" in table and "Best against best:" in table
    assert (tmp_path / "w" / "ladder.png").stat().st_size > 1000


def test_ladder_s_pairs_every_s_with_one_bpe_run(corpus, tmp_path):
    rep = _run("ladder-s", tmp_path / "s", corpus)
    assert [(c["a"], c["b"]) for c in rep["crossover"]] == [("bpe", f"bpe-patch-s{s}") for s in (4, 6, 10)]
    runs = {r["name"]: r for r in rep["runs"]}
    assert [runs[f"bpe-patch-s{s}"]["max_patch_size"] for s in (4, 6, 10)] == [4, 6, 10]
    assert len(list((tmp_path / "s" / "data").glob("*/shards-train"))) == 1  # S=4 and 6 derived from S=10's shards
    assert (tmp_path / "s" / "s.png").is_file() and (tmp_path / "s" / "ladder.png").is_file()


def test_the_lr_sweep_prints_the_override_the_ladders_take(corpus, tmp_path):
    rep = _run("lr-sweep-mini", tmp_path / "lr", corpus)
    assert sorted({(r["io"], r["lr"]) for r in rep["runs"]}) == [
        (io, lr) for io in ("bpe", "hierarchical") for lr in (0.001, 0.003, 0.01)
    ]
    sweep = rep["lr_sweep"]
    for io, v in sweep.items():
        rows = {r["lr"]: r["bpb"]["mean"] for r in rep["rows"] if r["io"] == io}
        assert v["best"] == min(rows, key=rows.get)
    table = (tmp_path / "lr" / "table.md").read_text()
    labels = [line.split(" | ")[0] for line in table.splitlines() if line.startswith("| BPE")]
    assert len(labels) == 6 == len(set(labels)) and "| BPE-patch (lr=0.01)" in labels  # each row names its rate
    override = re.search(r"`(io_lr=\{[^`]*\})`", table).group(1)
    ladder = load_spec("ladder-width", [override])
    lrs = {r.model["io"]: ladder.run_lr(r) for r in ladder.runs}
    assert lrs == {"bpe": sweep["bpe"]["best"], "hierarchical": sweep["hierarchical"]["best"]}
    assert (tmp_path / "lr" / "lr.png").stat().st_size > 1000


def test_the_width_sweep_reuses_ladder_widths_runs_at_their_rates():
    from hbpe.experiments.runner import _fingerprint

    sweep = load_spec("lr-sweep-width")
    width = load_spec("ladder-width", ["io_lr={bpe: 0.003, hierarchical: 0.001}"])  # as the published ladder ran
    centre = {r.name: r for r in width.runs}
    shared = [r for r in sweep.runs if r.name in centre]
    assert len(shared) == 8 and len(sweep.runs) == 32
    for r in shared:  # a copy of ladder-width's seed-17 result.json is recognised, not trained again
        assert _fingerprint(sweep, r, 17) == _fingerprint(width, centre[r.name], 17), r.name
    rates = {(r.model["io"], r.model["latent_dim"]): set() for r in sweep.runs}
    for r in sweep.runs:
        rates[(r.model["io"], r.model["latent_dim"])].add(sweep.run_lr(r))
    for key, lrs in rates.items():
        assert sorted(lrs) == [0.0003, 0.001, 0.003, 0.01], key


def test_the_width_sweep_tunes_each_width_and_compares_the_tuned_models(corpus, tmp_path):
    rep = _run("lr-sweep-width", tmp_path / "lw", corpus)
    sweep, rows = rep["lr_sweep"], rep["rows"]
    assert len(sweep) == 8  # two kinds x four widths
    for v in sweep.values():
        at = {r["lr"]: r["bpb"]["mean"] for r in rows if r["io"] == v["io"] and r["model"]["latent_dim"] == v["width"]}
        assert len(at) == 4 and v["best"] == min(at, key=at.get)
    bpb = {r["name"]: r["bpb"] for r in rep["runs"]}
    tuned = rep["tuned_by_width"]
    assert [t["width"] for t in tuned] == [48, 96, 192, 384]
    for t in tuned:
        assert t["gap"] == pytest.approx(bpb[t["b"]] - bpb[t["a"]])
        best = {v["io"]: v["best"] for v in sweep.values() if v["width"] == t["width"]}
        assert {r["name"]: r["lr"] for r in rep["runs"]}[t["a"]] == best["bpe"]
    table = (tmp_path / "lw" / "table.md").read_text()
    assert "The tuned models at each width" in table and "io_lr=" not in table.split("Learning rate sweep")[1]


@pytest.mark.parametrize("preset", ["ladder-paper-mini", "ladder-data", "ladder-gpu"])
def test_the_other_ladders_run_narrowed_with_the_fair_objective(corpus, tmp_path, preset):
    rep = _run(preset, tmp_path / "x", corpus)
    (pair,) = rep["ladder"]["pairs"] if preset != "ladder-gpu" else rep["ladder"]["pairs"][:1]
    assert pair["b"].startswith("bpe-patch") and rep["eval_set"]
    run_dir = next((tmp_path / "x" / "runs").iterdir())
    optim = json.loads((run_dir / "train" / "hbpe_run.json").read_text())["train_config"]["optim"]
    assert (optim["loss_normalization"], optim["decay_embeddings"]) == ("byte", True)


def test_learning_rates_per_run_and_per_model_are_checked():
    from hbpe.schemas.errors import ConfigError

    with pytest.raises(
        ConfigError, match=r"^experiment io_lr=\{'bpe-patch': 0.01\}: expected a mapping of model kinds"
    ):
        load_spec("ladder-s", ["io_lr={bpe-patch: 0.01}"])  # a run name, not a model kind
    with pytest.raises(ConfigError, match=r"^experiment io_lr=\{'bpe': 0\}: expected"):
        load_spec("ladder-s", ["io_lr={bpe: 0}"])
    with pytest.raises(ConfigError, match=r"^run a: lr='x', expected a finite number > 0"):
        load_spec("ladder-s", ["runs=[{name: a, first_stage: v4096, model: {io: bpe}, lr: x}]"])
    spec = load_spec("lr-sweep-mini", ["io_lr={bpe: 0.5}"])  # a run's own lr wins over io_lr
    assert {spec.run_lr(r) for r in spec.runs} == {0.001, 0.003, 0.01}
    # the rate a run trains with decides its fingerprint, wherever it was set
    a = load_spec("ladder-s", ["lr=0.01"])
    b = load_spec("ladder-s", ["io_lr={bpe: 0.01, hierarchical: 0.01}"])
    assert [a.run_fingerprint(r) for r in a.runs] == [b.run_fingerprint(r) for r in b.runs]
