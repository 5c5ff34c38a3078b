"""Path-valued config keys (issue 35). Every train-config key that holds a path is marked in the schema
(schemas/config_check.py: path_field), so what must stay inside a folder asks the schema, not a hand list that
rots. `log_file` is "in the save folder", as its help says: before, `hbpe train log_file=../../x.log` wrote the
log two folders above it (and an absolute log_file anywhere)."""

from __future__ import annotations

import inspect
import re
import typing
from dataclasses import fields

import pytest
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.schemas.config_check import annotations_of, path_keys, path_values, section_in
from hbpe.schemas.errors import ConfigError
from hbpe.schemas.train_config import ARGUMENT_PATHS, CALLBACK_CLASSES, LOGGER_CLASSES, TrainConfig
from hbpe.training.train.config_io import load_config
from tests.helpers import cli_fails as _fails

SHORT = ("max_duration=2ba", "eval_interval=2ba", "save_interval=2ba", "console=false", "eval_subset_num_batches=1")

# every text-valued key of the train config that is NOT a path, each with the reason; a new text key must be put
# here or be made a path_field, so that a new path cannot slip past what confines them (an experiment's --out)
NOT_PATHS = {
    "run_name": "a name (a bucket run's local root is runs/<run_name>, derived from save_folder's rule)",
    "model_size": "a preset name",
    "max_duration": "a Composer time",
    "eval_interval": "a Composer time",
    "save_interval": "a Composer time",
    "log_interval": "a Composer time",
    "precision": "a choice",
    "device": "a choice",
    "device_microbatch_size": "'auto' or a number",
    "model.pooling": "a choice",
    "model.conditioning": "a choice",
    "model.io": "a scheme name",
    "model.local_layout": "a choice",
    "model.packed_attention": "a choice",
    "model.patching.boundaries": "a choice",
    "model.patching.entropy_model_sha256": "a digest",
    "data.mode": "a choice",
    "data.cache_limit": "a size",
    "data.shuffle_algo": "a choice",
    "optim.warmup": "a Composer time",
    "optim.schedule": "a choice",
    "optim.loss_normalization": "a choice",
}
# free-form blocks: Composer's arguments (ARGUMENT_PATHS names their paths) or FSDP's (no path among them)
FREE_BLOCKS = {"loggers", "callbacks", "fsdp"}


def _text_and_block_keys(cls: type, prefix: str = "") -> tuple[set[str], set[str]]:
    """(keys whose annotation admits text, keys that are free mappings) of section `cls`, sections walked."""
    text, blocks = set(), set()
    for f in fields(cls):
        key, tp = f"{prefix}{f.name}", annotations_of(cls)[f.name]
        inner = section_in(tp)
        if inner is not None:
            t, b = _text_and_block_keys(inner, f"{key}.")
            text, blocks = text | t, blocks | b
        elif tp is dict or typing.get_origin(tp) is dict or dict in map(typing.get_origin, typing.get_args(tp)):
            blocks.add(key)
        elif tp is str or str in typing.get_args(tp):
            text.add(key)
    return text, blocks


def test_every_text_key_of_the_schema_is_a_path_or_said_not_to_be():
    text, blocks = _text_and_block_keys(TrainConfig)
    paths = set(path_keys(TrainConfig))
    assert paths == {
        "data.train", "data.eval", "data.tokenizer", "data.cache_dir", "data.streams.remote", "data.streams.local",
        "model.patching.entropy_model", "save_folder", "load_path", "log_file",
    }  # fmt: skip
    assert text - paths == set(NOT_PATHS), "a new text key: make it a path_field, or add it to NOT_PATHS"
    assert blocks == FREE_BLOCKS
    writes = {k for k, m in path_keys(TrainConfig).items() if m["path"] == "writes"}
    assert writes == {"data.cache_dir", "data.streams.local", "save_folder", "log_file"}
    assert path_keys(TrainConfig)["log_file"]["under"] == "save_folder"


def test_every_path_argument_of_the_loggers_and_callbacks_is_named():
    """A Composer logger or callback argument whose name says file, folder, dir, path or uri is in ARGUMENT_PATHS
    (or is a bucket object's name): a new version's new one fails here."""
    import composer.callbacks
    import composer.loggers

    remote_names = {"callbacks.memory_snapshot.remote_file_name", "callbacks.oom_observer.remote_file_name"}
    found = set()
    for kind, module, classes in (("loggers", composer.loggers, LOGGER_CLASSES),
                                  ("callbacks", composer.callbacks, CALLBACK_CLASSES)):  # fmt: skip
        for name, cls in classes.items():
            for arg in inspect.signature(getattr(module, cls).__init__).parameters:
                if re.search(r"dir|folder|file|path|uri", arg):
                    found.add(f"{kind}.{name}.{arg}")
    named = {f"{block}.{arg.split('.')[0]}" for block, args in ARGUMENT_PATHS.items() for arg in args}
    named = {n for n in named if not n.endswith(".init_kwargs")}  # wandb's dir is inside its init_kwargs
    assert found - remote_names == named


def test_path_values_lists_the_set_ones_with_stream_indexes(tmp_path):
    cfg = load_config(
        "tiny",
        [
            "data.train=null",
            "data.streams=[{remote: a, local: /c/a}, {remote: b}]",
            "data.cache_dir=cache",
            "data.eval=null",
            "save_folder=s",
        ],
        check_paths=False,
    )
    got = {k: v for k, v, _ in path_values(cfg)}
    assert got == {
        "data.streams[0].remote": "a", "data.streams[0].local": "/c/a", "data.streams[1].remote": "b",
        "data.cache_dir": "cache", "save_folder": "s", "log_file": "train.log",
    }  # fmt: skip


@pytest.mark.parametrize("name", ["../../x.log", "/tmp/x.log", "a/../../x.log", "gs://b/x.log", ".", "a/.."])
def test_log_file_out_of_the_save_folder_is_refused(name):
    with pytest.raises(ConfigError, match=rf"^log_file={re.escape(name)}: the log goes in the save folder \(runs/r\)"):
        load_config("tiny", ["data.train=x", "save_folder=runs/r", f"log_file={name}"], check_paths=False)
    load_config("tiny", ["data.train=x", "log_file=logs/../train.log"], check_paths=False)  # stays inside: fine


def test_hbpe_train_log_file_cannot_write_out_of_the_save_folder(sample_shards, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train_dir, eval_dir = sample_shards
    args = ["train", "tiny", f"data.train={train_dir}", f"data.eval={eval_dir}", "save_folder=a/b/run", *SHORT]
    r = CliRunner().invoke(main, [*args, "log_file=../../x.log"])
    _fails(r, 2, "log_file=../../x.log: the log goes in the save folder (a/b/run), so log_file is a file name inside")
    assert not (tmp_path / "a").exists() and not (tmp_path / "x.log").exists()  # before: a/x.log, a trained run


def test_a_symlink_in_the_save_folder_cannot_carry_the_log_out(sample_shards, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train_dir, eval_dir = sample_shards
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "logs").symlink_to(tmp_path / "elsewhere")
    args = ["train", "tiny", f"data.train={train_dir}", f"data.eval={eval_dir}", "save_folder=run", *SHORT]
    r = CliRunner().invoke(main, [*args, "log_file=logs/train.log"])
    _fails(r, 2, f"log_file=logs/train.log resolves to {tmp_path / 'elsewhere' / 'train.log'}, outside the save folder")
    assert list((tmp_path / "elsewhere").iterdir()) == []
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["logs"]  # refused before anything was written
