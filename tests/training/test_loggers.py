"""The `loggers:` and `callbacks:` blocks build Composer's own loggers and callbacks (llm-foundry's names).

TensorBoard runs for real (it writes local event files, read back here); wandb and mlflow are not in
the stack, so their block must say which package to install rather than fail inside Composer.
"""

from __future__ import annotations

import sys

import composer.callbacks
import composer.loggers
import pytest
from composer.loggers import InMemoryLogger

from hbpe.schemas.errors import ConfigError
from hbpe.schemas.train_config import CALLBACKS, LOGGERS
from hbpe.training.train.config_io import load_config
from hbpe.training.train.loggers import CALLBACK_CLASSES, LOGGER_CLASSES, build_callbacks, build_loggers
from hbpe.training.train.trainer import build_run


def test_every_configurable_name_is_a_composer_class():
    assert set(LOGGER_CLASSES) == set(LOGGERS) and set(CALLBACK_CLASSES) == set(CALLBACKS)
    for name in LOGGER_CLASSES.values():
        assert isinstance(getattr(composer.loggers, name), type), name
    for name in CALLBACK_CLASSES.values():
        assert issubclass(getattr(composer.callbacks, name), composer.Callback), name


def test_tensorboard_logs_what_the_trainer_logged(sample_shards, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train_dir, eval_dir = sample_shards
    cfg = load_config(
        "tiny",
        [
            f"data.train={train_dir}",
            "data.eval=null",
            f"save_folder={tmp_path / 'run'}",
            "run_name=tb-test",
            "max_duration=3ba",
            "save_interval=3ba",
            "console=false",
            f"loggers.tensorboard.log_dir={tmp_path / 'tb'}",
            "loggers.tensorboard.flush_interval=1",
            "callbacks={optimizer_monitor: {batch_log_interval: 1}, speed_monitor: {window_size: 2}}",
        ],
    )
    mem = InMemoryLogger()
    run = build_run(cfg, loggers=[mem])
    speed = [c for c in run.trainer.state.callbacks if isinstance(c, composer.callbacks.SpeedMonitor)]
    assert len(speed) == 1  # the block's arguments reach hbpe's default SpeedMonitor, not a second one
    assert speed[0].history_samples.maxlen == 3  # window_size=2 from the block (Composer keeps window + 1)
    run.trainer.fit()
    run.close()
    events = tmp_path / "tb" / "tb-test"  # Composer's layout: log_dir/run_name/ (a new events file per flush)
    assert any(p.name.startswith("events.out.tfevents.") for p in events.iterdir())
    acc = EventAccumulator(str(events))
    acc.Reload()
    logged = [(e.step, e.value) for e in acc.Scalars("loss/train/total")]
    want = [float(v) for _, v in mem.data["loss/train/total"]]
    assert [s for s, _ in logged] == [0, 1, 2]
    assert [v for _, v in logged] == pytest.approx(want, rel=1e-6)  # float32 in the event file
    assert "l2_norm/grad/global" in acc.Tags()["scalars"]  # the optimizer_monitor callback ran


def test_tensorboard_defaults_beside_the_run(tmp_path):
    [tb] = build_loggers({"tensorboard": None}, log_root=str(tmp_path))
    assert tb.log_dir == f"{tmp_path}/tensorboard"  # not Composer's ./tensorboard_logs in whatever cwd


@pytest.mark.parametrize(
    "block,build,match",
    [
        (
            {"tensorboard": {"logdir": "x"}},
            "loggers",
            r"^loggers\.tensorboard\.logdir is not an argument of Composer's TensorboardLogger \(did you mean "
            r"loggers\.tensorboard\.log_dir\?\); it takes: log_dir, flush_interval, rank_zero_only$",
        ),
        (
            {"speed_monitor": {"window": 5}},
            "callbacks",
            r"^callbacks\.speed_monitor\.window is not an argument of Composer's SpeedMonitor \(did you mean "
            r"callbacks\.speed_monitor\.window_size\?\)",
        ),
        (
            {"early_stopper": {"monitor": "BitsPerByte", "dataloader_label": "eval", "comp": "bigger"}},
            "callbacks",
            r"^callbacks\.early_stopper: Composer's EarlyStopper refused .*: Unrecognized comp string",
        ),
        (
            {"early_stopper": {"monitor": "BitsPerByte"}},
            "callbacks",
            r"^callbacks\.early_stopper needs dataloader_label \(Composer's EarlyStopper has no default for them\); "
            r"e\.g\. callbacks\.early_stopper\.dataloader_label=VALUE$",
        ),
    ],
)
def test_wrong_arguments_name_the_ones_composer_takes(tmp_path, block, build, match):
    with pytest.raises(ConfigError, match=match):
        build_loggers(block, log_root=str(tmp_path)) if build == "loggers" else build_callbacks(block)


@pytest.mark.parametrize("name", ["wandb", "mlflow"])
def test_a_tracker_that_is_not_installed_names_its_package(name, tmp_path, monkeypatch):
    # `make` installs both (the loggers extra): hide the package as if it were not (None in sys.modules
    # makes `import name` raise ImportError, as a missing package does)
    monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(
        ConfigError, match=rf"^loggers\.{name} needs a package that is not installed: .*mosaicml\[{name}\]"
    ):
        build_loggers({name: {}}, log_root=str(tmp_path))


def test_config_blocks_are_checked_by_name(tmp_path):
    base = ["data.train=s", f"save_folder={tmp_path}"]
    with pytest.raises(
        ConfigError, match=r"^unknown logger loggers\.tensorbord \(did you mean loggers\.tensorboard\?\)"
    ):
        load_config("tiny", [*base, "loggers.tensorbord.log_dir=x"], check_paths=False)
    with pytest.raises(
        ConfigError, match=r"^loggers\.wandb: got 'enabled' \(a string\), expected a mapping of its arguments"
    ):
        load_config("tiny", [*base, "loggers.wandb=enabled"], check_paths=False)
    with pytest.raises(
        ConfigError, match=r"^unknown callback callbacks\.memory \(did you mean callbacks\.memory_monitor"
    ):
        load_config("tiny", [*base, "callbacks.memory={}"], check_paths=False)
