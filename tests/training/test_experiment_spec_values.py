"""Experiment overrides are type- and range-checked in ExperimentSpec (issue 20): one `error:` line naming
the key, before anything is written. Before: `seq_len=abc` and `batches=abc` were internal TypeErrors
('<' not supported between 'str' and 'int'), `holdout_every=0` started training, `extra=3` an AttributeError.
Issue 28: `runs=[]` made OUT/data and ended in `internal error: ValueError: min() arg is an empty sequence`;
`extra: {save_folder: /elsewhere}` trained outside --out; `seq_len=1e12` converted the whole corpus first;
a bad train config value (model_size=huge) was found only once the data was made."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.experiments.presets import PRESETS, load_spec
from hbpe.schemas.errors import ConfigError
from tests.helpers import cli_fails as _fails


@pytest.mark.parametrize(
    "override,message",
    [
        ("seq_len=abc", "experiment seq_len='abc': expected an integer from 2 to 1048576 (a sample is one latent"),
        ("seq_len=1000000000000", "experiment seq_len=1000000000000: expected an integer from 2 to 1048576"),
        ("seq_len=1", "experiment seq_len=1: expected an integer from 2 to 1048576"),
        ("runs=[]", "experiment runs=[]: expected at least one run"),
        ("extra={save_folder: /elsewhere}", "experiment extra.save_folder: set by the experiment for every run"),
        ("extra={data: {train: x, shuffle: false}}", "experiment extra.data.train: set by the experiment"),
        ("extra={optim: {lr: 1}}", "experiment extra.optim.lr: set by the experiment for every run (its key lr)"),
        ("extra={run_name: x}", "experiment extra.run_name: set by the experiment"),
        ("model_size=huge", "experiment table1-mini, run bytes: model_size: got 'huge', expected one of"),
        ("extra={optim: {weight_decay: -1}}", "experiment table1-mini, run bytes: optim.weight_decay"),
        ("holdout_every=0", "experiment holdout_every=0: expected an integer >= 2; e.g. holdout_every=10"),
        ("batches=abc", "experiment batches='abc': expected an integer >= 1; e.g. batches=200"),
        ("lr=abc", "experiment lr='abc': expected a finite number > 0; e.g. lr=0.003"),
        ("max_patch_size=300", "experiment max_patch_size=300: expected an integer <= 255"),
        ("plots=[curve, pie]", "experiment plots=['curve', 'pie']: expected a list of curve, vocab, s"),
        ("extra=3", "experiment extra=3: expected a mapping of train config overrides"),
    ],
)
def test_experiment_overrides_are_checked_through_the_cli(tmp_path, monkeypatch, override, message):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["experiment", "table1-mini", override, "--out", "tmp"])
    _fails(r, 2, message)
    assert not (tmp_path / "tmp").exists()  # refused before anything was written


@pytest.mark.parametrize(
    "override,key",
    [
        ("seq_len=1.5", "seq_len"),
        ("global_batch_size=0", "global_batch_size"),
        ("holdout_every=1", "holdout_every"),
        ("eval_batches=-1", "eval_batches"),
        ("final_eval_batches=x", "final_eval_batches"),
        ("warmup=-1", "warmup"),
        ("seed=true", "seed"),
        ("lr=.inf", "lr"),
        ("name=3", "name"),
        ("model_size=[tiny]", "model_size"),
        ("train_corpus=3", "train_corpus"),
        ("train_corpus=[]", "train_corpus"),
        ("first_stages=3", "first_stages"),
        ("runs=3", "runs"),
    ],
)
def test_every_field_is_checked(override, key):
    with pytest.raises(ConfigError, match=rf"^experiment {key}="):
        load_spec("table1-mini", [override])


def test_presets_and_one_corpus_name_pass():
    for name in PRESETS:
        load_spec(name, train_corpus=("corpus.jsonl",))
    assert load_spec("table1-mini", ["train_corpus=a.jsonl"]).train_corpus == ("a.jsonl",)


def test_an_experiment_yaml_cannot_train_outside_out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "one.yaml"
    spec.write_text(
        "name: one\ndescription: one run\nfirst_stages: {gpt2: {encoding: gpt2}}\n"
        "runs: [{name: bpe, first_stage: gpt2, model: {io: bpe}}]\n"
        f"extra: {{save_folder: {tmp_path / 'elsewhere'}, data: {{train: {tmp_path / 'x'}}}}}\n"
    )
    r = CliRunner().invoke(main, ["experiment", str(spec), "--train-input", "t.jsonl", "--out", "out"])
    _fails(r, 2, "experiment extra.save_folder: set by the experiment for every run (each run trains in --out/runs/")
    assert not (tmp_path / "out").exists() and not (tmp_path / "elsewhere").exists()


def test_every_key_the_runner_sets_is_refused_in_extra():
    """OWNED_KEYS follows runner.train_config: a key it sets and `extra` could override would go unnoticed."""
    from hbpe.experiments.data_prep import StageData
    from hbpe.experiments.runner import train_config
    from hbpe.experiments.spec import OWNED_KEYS

    stage, nested, keys = StageData(Path("tok"), Path("train"), Path("eval")), ("data", "optim"), set()
    for name in PRESETS:  # every run of every preset (only some set data.max_patch_size)
        spec = dataclasses.replace(load_spec(name, train_corpus=("corpus.jsonl",)), extra={})  # the runner's own keys
        for run in spec.runs:
            cfg = train_config(spec, run, stage, Path("run"), Path("out"))
            keys |= {k for k in cfg if k not in nested} | {f"{k}.{sub}" for k in nested for sub in cfg[k]}
    assert keys == set(OWNED_KEYS) - {"data.streams"}  # data.streams: it would replace data.train
