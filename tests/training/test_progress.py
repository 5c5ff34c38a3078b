"""Progress on every long step: one line for training, eval and an experiment's runs (issue 27), and `hbpe -q`
silencing the libraries' own chatter.

Before: a training run printed nothing but Composer's multi-line metric dumps (or nothing with console=false),
eval showed a bar only on a terminal or with --progress, and `hbpe -q train` still printed MLflow's INFO lines
and Composer's UserWarnings.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.experiments.runner import RunClock
from hbpe.pipeline.progress_line import INTERVAL_ENV, ProgressLine, progress_interval
from hbpe.schemas.errors import ConfigError
from tests.conftest import REPO

# `train:  50% 1/2 batches [00:03<00:03, loss 6.156, BPB 7.091, 1.50kB/s]`
TRAIN_LINE = re.compile(
    r"^train: +\d+% \d+/2 batches \[\d\d:\d\d<\d\d:\d\d, loss \d+\.\d{3}, BPB \d+\.\d{3}, [\d.]+ ?[kM]?B/s\]$"
)
EVAL_LINE = re.compile(r"^eval: +\d+% \d+/2 batches \[\d\d:\d\d<\d\d:\d\d, BPB \d+\.\d{4}, [\d.]+ ?[kM]?B/s\]$")


def _train_args(sample_shards, folder) -> list[str]:
    train_dir, eval_dir = sample_shards
    return [
        "train", "tiny", f"data.train={train_dir}", f"data.eval={eval_dir}", f"save_folder={folder}",
        "max_duration=2ba", "eval_interval=2ba", "save_interval=2ba", "eval_subset_num_batches=1",
    ]  # fmt: skip


def test_train_shows_a_progress_line_in_a_log_and_no_metric_dumps(sample_shards, tmp_path, monkeypatch):
    monkeypatch.setenv(INTERVAL_ENV, "0.001")  # a line each batch
    r = CliRunner().invoke(main, _train_args(sample_shards, tmp_path / "run"))
    assert r.exit_code == 0, r.output
    lines = r.stderr.splitlines()
    progress = [line for line in lines if line.startswith("train:")]
    assert len(progress) == 2 and all(TRAIN_LINE.match(line) for line in progress), lines
    assert progress[-1].startswith("train: 100% 2/2 batches")
    assert [line for line in lines if line.startswith("eval at batch 2: BPB ")]
    assert not any("Train loss" in line or line.startswith("[batch=") for line in lines)  # Composer's dumps


def test_console_metrics_keeps_composers_dumps(sample_shards, tmp_path):
    r = CliRunner().invoke(main, [*_train_args(sample_shards, tmp_path / "run"), "console_metrics=true"])
    assert r.exit_code == 0, r.output
    assert "Train loss/train/total" in r.output


def test_eval_shows_a_progress_line_by_default_off_a_terminal(tiny_run, sample_shards, monkeypatch):
    monkeypatch.setenv(INTERVAL_ENV, "0.001")
    args = ["eval", "--checkpoint", str(tiny_run), "--data", str(sample_shards[1]), "--max-batches", "2"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    lines = r.stderr.splitlines()
    assert len(lines) == 2 and all(EVAL_LINE.match(line) for line in lines), lines
    assert r.stdout.startswith("BPB ")
    for quiet in (["--no-progress"], []):
        r = CliRunner().invoke(main, ["-q", *args] if not quiet else [*args, *quiet])
        assert r.exit_code == 0 and r.stderr == "", r.output


def test_quiet_training_prints_no_library_info_or_warnings(sample_shards, tmp_path):
    """A real `hbpe -q train` in a process of its own (warnings and MLflow's handler write to the real stderr):
    the memory monitor warns on CPU, MLflow logs INFO lines about system metrics."""
    loggers = ["--json"]
    try:
        import mlflow  # noqa: F401

        loggers.append(f"loggers={{mlflow: {{tracking_uri: '{(tmp_path / 'mlruns').as_uri()}'}}}}")
    except ImportError:  # the loggers extra is not installed: the warning alone
        pass
    args = [*_train_args(sample_shards, tmp_path / "run"), "callbacks={memory_monitor: {}}", *loggers]
    env = {**os.environ, "MLFLOW_ALLOW_FILE_STORE": "true", "PYTHONPATH": str(REPO)}
    r = subprocess.run(
        [sys.executable, "-m", "hbpe.cli", "-q", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # no INFO line, no UserWarning, no progress line
    assert '"batches": 2' in r.stdout


def test_progress_line_in_a_log_draws_every_interval_and_at_the_end():
    out = io.StringIO()
    line = ProgressLine("eval", 3, stream=out, interval_s=3600)
    for _ in range(3):
        line.update(1, lambda: {"BPB": "1.5000"})
    line.close(lambda: {"BPB": "1.2500"})
    [last] = out.getvalue().splitlines()  # the interval never came: the closing line alone
    assert last.startswith("eval: 100% 3/3 batches [") and last.endswith(", BPB 1.2500]")
    out = io.StringIO()
    line = ProgressLine("train", 2, stream=out, interval_s=0)
    line.update(1, lambda: {"loss": "2.000", "": "1.00kB/s"})
    line.update(1, lambda: {"loss": "1.000", "": "1.00kB/s"})
    line.close(lambda: {"loss": "1.000", "": "1.00kB/s"})  # the last line drawn already says it
    assert [x.split(" [")[0] for x in out.getvalue().splitlines()] == [
        "train:  50% 1/2 batches",
        "train: 100% 2/2 batches",
    ]
    assert out.getvalue().splitlines()[0].endswith(", loss 2.000, 1.00kB/s]")


@pytest.mark.parametrize("raw", ["0", "-5", "soon", "inf"])
def test_progress_interval_must_be_seconds(monkeypatch, raw):
    monkeypatch.setenv(INTERVAL_ENV, raw)
    with pytest.raises(ConfigError, match=rf"{INTERVAL_ENV}='{raw}': must be a number of seconds > 0"):
        progress_interval()
    monkeypatch.setenv(INTERVAL_ENV, "2.5")
    assert progress_interval() == 2.5


def test_run_clock_says_runs_done_and_time_left_from_the_runs_trained():
    clock = RunClock(4)
    clock.done()  # finished earlier: no time to go by
    assert clock.line() == "1/4 runs done"
    clock.done(60.0)
    clock.done(120.0)
    assert clock.line() == "3/4 runs done, about 01:30 left"
    clock.done(90.0)
    assert clock.line() == "4/4 runs done"
