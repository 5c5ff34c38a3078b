"""Experiment overrides are type- and range-checked in ExperimentSpec (issue 20): one `error:` line naming
the key, before anything is written. Before: `seq_len=abc` and `batches=abc` were internal TypeErrors
('<' not supported between 'str' and 'int'), `holdout_every=0` started training, `extra=3` an AttributeError."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.experiments.presets import PRESETS, load_spec
from hbpe.schemas.errors import ConfigError
from tests.helpers import cli_fails as _fails


@pytest.mark.parametrize(
    "override,message",
    [
        ("seq_len=abc", "experiment seq_len='abc': expected an integer >= 1; e.g. seq_len=128"),
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
