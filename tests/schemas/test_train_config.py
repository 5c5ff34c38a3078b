"""TrainConfig: every field checked against its annotation, one ConfigError naming key, value, type, example."""

from __future__ import annotations

import dataclasses

import pytest

from hbpe.schemas.errors import ConfigError
from hbpe.schemas.train_config import DataConfig, ModelConfig, OptimConfig, TrainConfig, model_config
from hbpe.training.train.config_io import load_config

BASE = {"data": {"train": "shards"}}


def _build(**over):
    d = {**BASE, **over}
    return TrainConfig.from_dict(d)


@pytest.mark.parametrize(
    "over,match",
    [
        (
            {"optim": {"lr": "abc"}},
            r"^optim\.lr: got 'abc' \(a string\), expected a finite number; e\.g\. optim\.lr=0\.001$",
        ),
        ({"optim": {"lr": float("inf")}}, r"optim\.lr: got inf \(a number\), expected a finite number"),
        ({"optim": {"lr": "nan"}}, r"optim\.lr: got 'nan' \(a string\), expected a finite number"),
        (
            {"global_batch_size": "abc"},
            r"global_batch_size: got 'abc' \(a string\), expected an integer; e\.g\. global_batch_size=8",
        ),
        ({"global_batch_size": 1.5}, r"global_batch_size: got 1\.5 \(a number\), expected an integer"),
        ({"seed": True}, r"seed: got True \(a boolean\), expected an integer; e\.g\. seed=17"),
        (
            {"max_duration": "banana"},
            r"max_duration: got 'banana' \(a string\), expected a Composer time string: a number and a unit \(ba, ep, sp, tok, iter, dur\); e\.g\. max_duration=100ba",
        ),
        ({"max_duration": 100}, r"max_duration: got 100 \(an integer\), expected a Composer time string"),
        ({"max_duration": "1.5ba"}, r"max_duration=1\.5ba: ba counts whole units"),
        (
            {"max_duration": "0.5dur"},
            r"max_duration=0\.5dur: a fraction of the run \(dur\) cannot set the run's length",
        ),
        ({"max_duration": "0ba"}, r"max_duration=0ba: must be more than 0"),
        (
            {"eval_interval": "soon"},
            r"eval_interval: got 'soon' \(a string\), expected a Composer time string.*e\.g\. eval_interval=50ba",
        ),
        ({"save_interval": "-5ba"}, r"save_interval: got '-5ba'.*expected a Composer time string"),
        ({"log_interval": "2dur"}, r"log_interval=2dur: dur is a fraction of the run, from 0 to 1"),
        (
            {"optim": {"warmup": "10"}},
            r"optim\.warmup: got '10' \(a string\), expected a Composer time string.*optim\.warmup=10ba",
        ),
        (
            {"precision": "fp64"},
            r"precision: got 'fp64', expected one of auto, fp32, amp_fp16, amp_bf16; e\.g\. precision=auto",
        ),
        ({"device": "tpu"}, r"device: got 'tpu', expected one of auto, cpu, gpu, mps"),
        (
            {"device": "cpu", "precision": "amp_bf16"},
            r"precision=amp_bf16 needs a GPU .* with device=cpu use precision=fp32",
        ),
        (
            {"model": {"latent_layer": 3}},
            r"unknown config keys \['model\.latent_layer'\] \(did you mean model\.latent_layers\?\); known in model: ",
        ),
        (
            {"model": {"latent_dim": "big"}},
            r"model\.latent_dim: got 'big' \(a string\), expected an integer; e\.g\. model\.latent_dim=64",
        ),
        (
            {"model": {"tie_embeddings": "yes please"}},
            r"model\.tie_embeddings: got 'yes please' \(a string\), expected true or false",
        ),
        ({"model": {"latent_heads": 0}}, r"model\.latent_heads=0: must be at least 1"),
        (
            {"model": {"latent_dim": 60}},
            r"model\.latent_dim=60 must split into an even head size over 4 heads; e\.g\. model\.latent_dim=64",
        ),
        ({"model": {"pooling": "max"}}, r"model\.pooling: got 'max', expected one of mean, eop"),
        (
            {"model": 3},
            r"model: got 3 \(an integer\), expected a mapping of model settings; e\.g\. model\.latent_layers=4",
        ),
        ({"model_size": "huge"}, r"model_size: got 'huge', expected one of tiny, small, medium"),
        (
            {"data": {"train": "x", "shufle": False}},
            r"unknown config keys \['data\.shufle'\] \(did you mean data\.shuffle\?\)",
        ),
        (
            {"optim": {"momentum": 0.9}},
            r"unknown config keys \['optim\.momentum'\]; known in optim: \['allow_new_duration', 'alpha_f'",
        ),
        (
            {"data": 3},
            r"data: got 3 \(an integer\), expected a section with keys train, eval, .*; e\.g\. data\.train=runs/demo/shards-train",
        ),
        ({"optim": 0.1}, r"optim: got 0\.1 \(a number\), expected a section with keys lr, .*; e\.g\. optim\.lr=0\.001"),
        (
            {"optim": {"betas": [0.9]}},
            r"optim\.betas: got \[0\.9\] \(a list of 1\), expected a list of 2 numbers; e\.g\. optim\.betas=\[0\.9,0\.95\]",
        ),
        ({"optim": {"betas": [0.9, "x"]}}, r"optim\.betas: got \[0\.9, 'x'\]"),
        ({"optim": {"betas": [0.9, 1.5]}}, r"optim\.betas=\[0\.9,1\.5\]: each must be in \[0, 1\)"),
        ({"optim": {"schedule": "linear"}}, r"optim\.schedule: got 'linear', expected one of cosine, constant"),
        ({"data": {"train": "x", "max_patch_size": 1}}, r"data\.max_patch_size=1: S must be at least 2"),
        (
            {"data": {"train": "x", "eval": 5}},
            r"data\.eval: got 5 \(an integer\), expected a string or null; e\.g\. data\.eval=runs/demo/shards-eval",
        ),
        ({"fsdp": "on"}, r"fsdp: got 'on' \(a string\), expected a mapping or null; e\.g\. 'fsdp=\{version: 2\}'"),
        (
            {"log_file": False},
            r"log_file: got False \(a boolean\), expected a string or null; e\.g\. log_file=train\.log",
        ),
        (
            {"device_microbatch_size": 0},
            r"device_microbatch_size: got 0 \(an integer\), expected 'auto' or an integer >= 1",
        ),
        ({"run_name": ""}, r"run_name='': must not be empty; e\.g\. run_name=hbpe"),
        ({"nonsense_key": 1}, r"unknown config keys \['nonsense_key'\]; known: \["),
    ],
)
def test_wrong_values_name_key_value_type_and_example(over, match):
    with pytest.raises(ConfigError, match=match):
        _build(**over)


def test_messages_are_one_line_for_every_field():
    """A wrong type for any field (found from the annotations, so new fields are covered) is one line."""
    for cls, prefix in ((TrainConfig, ""), (DataConfig, "data."), (OptimConfig, "optim."), (ModelConfig, "model.")):
        for f in dataclasses.fields(cls):
            bad = [1, 2, 3]  # a list fits no field (betas wants 2 items)
            over = {f.name: bad}
            with pytest.raises(ConfigError) as e:
                if cls is TrainConfig:
                    _build(**over)
                elif cls is ModelConfig:
                    _build(model=over)
                else:
                    _build(**{cls._section: {**({"train": "x"} if cls is DataConfig else {}), **over}})
            msg = str(e.value)
            assert "\n" not in msg and msg.startswith(f"{prefix}{f.name}") and "e.g. " in msg, msg


def test_coercions_keep_working_configs():
    cfg = _build(
        optim={"lr": "3e-4", "betas": [0.9, 0.99], "weight_decay": 0, "warmup": "0ba"},  # PyYAML reads 3e-4 as text
        model={"dropout": 0, "latent_layers": 3},
        max_duration="1e3ba",
        eval_interval="2ep",
        save_interval="1000sp",
        log_interval="1tok",
        device_microbatch_size=4,
    )
    assert cfg.optim.lr == 3e-4 and type(cfg.optim.lr) is float
    assert cfg.optim.betas == (0.9, 0.99) and cfg.optim.weight_decay == 0.0
    assert cfg.model.dropout == 0.0 and type(cfg.model.dropout) is float
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg  # round trip
    assert dataclasses.replace(cfg, max_duration="5ba").max_duration == "5ba"
    with pytest.raises(ConfigError, match=r"max_duration: got 5 \(an integer\)"):
        dataclasses.replace(cfg, max_duration=5)  # code that builds configs is checked too
    assert model_config("small").latent_layers == 12
    with pytest.raises(ConfigError, match=r"unknown config keys \['model\.layers'\]"):
        model_config("tiny", layers=3)


def _load(tmp_path, text: str, *overrides: str, check_paths: bool = False):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return load_config(str(p), list(overrides), check_paths=check_paths)


def test_load_config_overrides_and_files(tmp_path):
    cfg = _load(tmp_path, "data: {train: s}\n", "optim.lr=3e-4", "optim.betas=[0.8,0.9]", "fsdp={version: 2}")
    assert cfg.optim.lr == 3e-4 and cfg.optim.betas == (0.8, 0.9) and cfg.fsdp == {"version": 2}
    with pytest.raises(ConfigError, match=r"optim\.lr: got 'abc' \(a string\), expected a finite number"):
        _load(tmp_path, "data: {train: s}\n", "optim.lr=abc")
    with pytest.raises(ConfigError, match=r"optim\.betas: got '\[0\.9' \(a string\), expected a list of 2 numbers"):
        _load(tmp_path, "data: {train: s}\n", "optim.betas=[0.9")  # not YAML: kept as text, then the type says why
    with pytest.raises(ConfigError, match=r"override optim\.lr\.x: optim\.lr is 0\.001, not a section"):
        _load(tmp_path, "data: {train: s}\noptim: {lr: 0.001}\n", "optim.lr.x=1")
    with pytest.raises(ConfigError, match=r"override 'data\.\.train=x' has an empty key part"):
        _load(tmp_path, "data: {train: s}\n", "data..train=x")
    with pytest.raises(ConfigError, match=r"c\.yaml: invalid YAML \(.*\); fix the file"):
        _load(tmp_path, "data: [unclosed\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: the top level is list, not a mapping of config keys"):
        _load(tmp_path, "- 1\n- 2\n")
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match=r"bin\.yaml: not UTF-8 text"):
        load_config(str(tmp_path / "bin.yaml"))
    with pytest.raises(
        ConfigError, match=r"config '' not found; pass a YAML file or one of the shipped configs: medium, small, tiny"
    ):
        load_config("")
    with pytest.raises(ConfigError, match=r"is a directory; pass a YAML file"):
        load_config(str(tmp_path))


def test_load_config_checks_local_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the shipped tiny config points at runs/demo/, which exists only after `make demo`
    with pytest.raises(
        ConfigError,
        match=rf"^data\.train path runs/demo/shards-train does not exist \(relative to the current directory {tmp_path}\); "
        r"set data\.train=DIR to a shard directory from `hbpe convert` \(`make demo` in the repo root writes runs/demo/\)$",
    ):
        load_config("tiny")
    (tmp_path / "shards").mkdir()
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ConfigError, match=r"data\.eval path runs/demo/shards-eval does not exist .*data\.eval=null"):
        load_config("tiny", ["data.train=shards"])
    cfg = load_config("tiny", ["data.train=shards", "data.eval=null"])
    assert cfg.data.train == "shards"
    with pytest.raises(ConfigError, match=r"data\.train path file\.txt is not a directory \(relative to"):
        load_config("tiny", ["data.train=file.txt", "data.eval=null"])
    with pytest.raises(
        ConfigError, match=rf"data\.tokenizer path {tmp_path}/nope does not exist; set data\.tokenizer=DIR"
    ):
        load_config("tiny", ["data.train=shards", "data.eval=null", f"data.tokenizer={tmp_path}/nope"])
    with pytest.raises(ConfigError, match=r"load_path path shards is not a file .*load_path=FILE"):
        load_config("tiny", ["data.train=shards", "data.eval=null", "load_path=shards"])
    # remote URIs are for their readers to check; a config built for another machine skips the check
    assert load_config("tiny", ["data.train=s3://bucket/shards", "data.eval=gs://b/e"]).data.eval == "gs://b/e"
    assert load_config("tiny", check_paths=False).data.train == "runs/demo/shards-train"
