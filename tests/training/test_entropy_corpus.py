"""An experiment's entropy model trained on a corpus of its own (`entropy_corpus`, `--entropy-input`)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.experiments.presets import PAPER_ENTROPY_TARGETS, load_spec
from hbpe.schemas.errors import ConfigError
from tests.conftest import split_sample
from tests.training.test_experiment import NARROW

RUNS = (
    "[{name: bytes, first_stage: gpt2, model: {io: bytes}},"
    " {name: entropy, first_stage: gpt2, entropy_from: bytes, model: {io: entropy, entropy_target_bytes: 3.0}}]"
)


def test_entropy_model_trains_on_the_entropy_corpus_and_stays_out_of_the_table(tmp_path):
    train, held = split_sample(tmp_path / "corpus")
    other = tmp_path / "other.jsonl"  # another corpus: the held-out documents, reversed
    other.write_text("".join(json.dumps({"text": d["text"][::-1]}) + "\n" for d in map(json.loads, held.open())))
    out = tmp_path / "exp"
    args = ["experiment", "table1-mini", *NARROW, f"runs={RUNS}", "--out", str(out), "--train-input", str(train)]
    args += ["--eval-input", str(held), "--entropy-input", str(other), "--json"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert [r["name"] for r in report["runs"]] == ["bytes", "entropy"]  # the entropy model is no row
    source = out / "runs" / "bytes-entropy-corpus"
    meta = json.loads((out / "runs" / "entropy" / "train" / "hbpe_run.json").read_text())
    assert meta["model"]["patching"]["entropy_model"].startswith(str(source / "train"))  # its checkpoint, link resolved
    trained_on = json.loads((source / "train" / "hbpe_run.json").read_text())
    assert trained_on["train_config"]["data"]["train"].endswith("shards-entropy")
    assert (out / "data" / "gpt2" / "shards-entropy" / "COMPLETED").is_file()


def test_entropy_corpus_needs_an_entropy_run_and_paper_targets():
    with pytest.raises(ConfigError, match="entropy_corpus.*no run has an entropy model"):
        load_spec("vocab-mini", ["entropy_corpus=[a.jsonl]"])
    spec = load_spec("table1-small", train_corpus=("x.jsonl",))
    targets = {r.name: r.model.get("entropy_target_bytes") for r in spec.runs}
    assert (targets["entropy-max6"], targets["entropy-unbounded"]) == PAPER_ENTROPY_TARGETS == (3.45, 4.49)
    assert all(r.model.get("patch_boundaries") == "given" for r in spec.runs if r.model["io"] in ("space", "entropy"))
    mini = {r.name: r.model for r in load_spec("table1-mini").runs}
    assert "patch_boundaries" not in mini["space-max6"] and mini["entropy-max6"]["entropy_target_bytes"] == 4.0
