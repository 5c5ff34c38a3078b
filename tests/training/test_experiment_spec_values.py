"""Experiment overrides are type- and range-checked in ExperimentSpec (issue 20): one `error:` line naming
the key, before anything is written. Before: `seq_len=abc` and `batches=abc` were internal TypeErrors
('<' not supported between 'str' and 'int'), `holdout_every=0` started training, `extra=3` an AttributeError.
Issue 28: `runs=[]` made OUT/data and ended in `internal error: ValueError: min() arg is an empty sequence`;
`extra: {save_folder: /elsewhere}` trained outside --out; `seq_len=1e12` converted the whole corpus first;
a bad train config value (model_size=huge) was found only once the data was made."""

from __future__ import annotations

import dataclasses
import re
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


_ONE_RUN = "name: one\ndescription: one run\nfirst_stages: {gpt2: {encoding: gpt2}}\n"
_ONE_RUN += "runs: [{name: bpe, first_stage: gpt2, model: {io: bpe}}]\n"


@pytest.mark.parametrize(
    "extra,message",
    [
        # issue 35: each of these trained, and wrote outside --out
        ("{log_file: ELSEWHERE/escape.log}", "log_file=ELSEWHERE/escape.log: the log goes in the save folder"),
        ("{log_file: ../../../../../escape.log}", "log_file=../../../../../escape.log: the log goes in the save"),
        ("{data: {cache_dir: ELSEWHERE/cache}}", "extra.data.cache_dir=ELSEWHERE/cache resolves to ELSEWHERE/cache, "
         "outside --out OUT: an experiment reads and writes only under its --out; give data.cache_dir a path"),
        ("{data: {cache_dir: cache}}", "extra.data.cache_dir=cache resolves to CWD/cache, outside --out OUT"),
        ("{loggers: {tensorboard: {log_dir: ELSEWHERE/tb}}}", "extra.loggers.tensorboard.log_dir=ELSEWHERE/tb resolves"),
        # a link inside --out to a folder outside it: the resolved path is what is written
        ("{data: {cache_dir: OUT/link/cache}}", "extra.data.cache_dir=OUT/link/cache resolves to ELSEWHERE/cache"),
        ("{load_path: ELSEWHERE/x.pt}", "extra.load_path=ELSEWHERE/x.pt resolves to ELSEWHERE/x.pt, outside --out"),
        ("{loggers: {mlflow: {tracking_uri: 'file://ELSEWHERE/ml'}}}", "extra.loggers.mlflow.tracking_uri=ELSEWHERE"),
        ("{loggers: {tensorboard: {log_dir: 'gs://b/tb'}}}", "extra.loggers.tensorboard.log_dir=gs://b/tb resolves to "
         "a bucket, outside --out"),
        # the libraries' defaults: the working directory (Composer's {run_name}/torch_traces, ./wandb, ./mlruns)
        ("{callbacks: {memory_snapshot: {}}}", "extra.callbacks.memory_snapshot.folder=one-bpe/torch_traces resolves "
         "to CWD/one-bpe/torch_traces"),
        ("{callbacks: {oom_observer: {folder: OUT, filename: ../escape}}}", "extra.callbacks.oom_observer.filename="
         "OUT/../escape resolves to CWD/escape"),
        ("{loggers: {wandb: {}}}", "extra.loggers.wandb.init_kwargs.dir=. resolves to CWD, outside --out"),
        ("{loggers: {mlflow: {}}}", "extra.loggers.mlflow.tracking_uri=mlruns resolves to CWD/mlruns, outside"),
    ],
)  # fmt: skip
def test_no_path_in_extra_reaches_outside_out(tmp_path, monkeypatch, extra, message):
    monkeypatch.chdir(tmp_path)
    for var in ("WANDB_DIR", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "link").symlink_to(tmp_path / "elsewhere")
    words = {"ELSEWHERE": str(tmp_path / "elsewhere"), "OUT": str(tmp_path / "out"), "CWD": str(tmp_path)}
    for word, value in words.items():
        extra, message = extra.replace(word, value), message.replace(word, value)
    spec = tmp_path / "one.yaml"
    spec.write_text(_ONE_RUN + f"extra: {extra}\n")
    r = CliRunner().invoke(main, ["experiment", str(spec), "--train-input", "t.jsonl", "--out", "out"])
    _fails(r, 2, "experiment one, run bpe: " + message)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["link"]  # nothing written
    assert list((tmp_path / "elsewhere").iterdir()) == []


@pytest.mark.parametrize(
    "extra",
    [
        "{log_file: logs/train.log}",
        "{data: {cache_dir: OUT/cache}}",
        "{loggers: {tensorboard: {}, mlflow: {tracking_uri: 'http://127.0.0.1:5000'}}}",
        "{loggers: {wandb: {init_kwargs: {dir: OUT/wandb}}}}",
        "{callbacks: {memory_snapshot: {folder: 'OUT/traces/{run_name}'}}}",
    ],
)
def test_paths_in_extra_inside_out_pass(tmp_path, monkeypatch, extra):
    from hbpe.experiments.runner import check_runs

    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "one.yaml"
    spec.write_text(_ONE_RUN + f"extra: {extra.replace('OUT', str(tmp_path / 'out'))}\n")
    with pytest.raises(ConfigError, match="corpus t.jsonl does not exist"):  # the runs' checks passed: the next one
        check_runs(load_spec(str(spec), train_corpus=("t.jsonl",)), tmp_path / "out")


@pytest.mark.parametrize(
    "override,message",
    [
        # issue 35: 100 s and 4.9 GB building every seed's config, then nothing
        ("seeds=100000000", "experiment seeds=100000000: expected an integer from 1 to 1000 (each seed trains every"),
        ("seeds=2 seed=4294967295", "experiment seed=4294967295: expected at most 4294967294, so that its seeds=2 "),
        ("seed=4294967296", "experiment seed=4294967296: expected an integer from 0 to 4294967295"),
    ],
)
def test_seed_counts_are_bounded(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_spec("table1-mini", override.split())


def test_seeds_are_checked_in_work_independent_of_their_count(tmp_path, monkeypatch):
    """check_runs checks the first and the last seed's configs (they differ only in the seed): 1000 seeds took
    over 100 s here, building all 6000 configs. Counted, not timed: the configs built for 1000 seeds and for 2."""
    from hbpe.experiments import runner

    built: list[int] = []
    real = runner.train_config

    def counting(spec, run, stage, run_dir, out, seed=None):
        built.append(seed)
        return real(spec, run, stage, run_dir, out, seed)

    monkeypatch.setattr(runner, "train_config", counting)

    def configs(seeds: int) -> list[int]:
        built.clear()
        spec = load_spec("table1-mini", [f"seeds={seeds}"], train_corpus=("t.jsonl",))
        with pytest.raises(ConfigError, match="corpus t.jsonl does not exist"):  # every run's configs passed
            runner.check_runs(spec, tmp_path / "out")
        return sorted(set(built))

    assert configs(2) == [17, 18]
    assert configs(1000) == [17, 1016]  # the first and the last seed only
