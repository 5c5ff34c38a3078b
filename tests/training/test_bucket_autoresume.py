"""Autoresume into a bucket after a kill, against moto's real S3 server (issue 20).

Composer uploads `ep0-ba2-rank0.pt` and only then `latest-rank0.pt.symlink`: a kill in between leaves
a checkpoint newer than the pointer names, or no pointer at all. Before: autoresume started over at the
pointer's batch (or batch 0) and died at its next save with Composer's internal FileExistsError, on
every retry. Now it continues from the newest checkpoint and finishes (the training itself, on both stores:
tests/training/test_object_stores.py). Also: two runs left at the
default run_name share runs/<run_name>/stream-cache, and the second is told to set run_name.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.schemas.errors import ConfigError
from hbpe.training.checkpoint.save_folder import latest_checkpoint
from hbpe.training.train.config_io import load_config
from tests.helpers import CacheHolder
from tests.helpers import cli_fails as _fails

EACH_BATCH = ("eval_interval=100ba", "save_interval=1ba", "console=false", "log_interval=100ba")


@pytest.fixture
def s3(s3_server, monkeypatch, tmp_path):
    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)  # the local caches (runs/<run_name>/) go here
    return s3_server


def test_bucket_autoresume_after_a_kill_between_checkpoint_and_pointer(s3, sample_shards, caplog):
    """Which checkpoint autoresume takes, from the names in the bucket (it lists them; an object appears only once
    whole). Training on from a bucket a kill left without its pointer, on both stores, is the autoresume step of
    tests/training/test_object_stores.py::test_training_and_everything_after_it_in_a_bucket."""
    run = f"{s3.new_bucket()}/run"
    pointer = f"{run}/latest-rank0.pt.symlink"
    for batch in (1, 2, 3):
        s3.put(f"{run}/ep0-ba{batch}-rank0.pt", b"a checkpoint")
    cfg = load_config(
        "tiny", [f"data.train={sample_shards[0]}", "data.eval=null", f"save_folder={run}", "run_name=kill-run"]
    )
    # killed before the first pointer was uploaded (or it was lost): the newest one is taken
    assert latest_checkpoint(cfg) == f"{run}/ep0-ba3-rank0.pt"

    # killed after ep0-ba3 was uploaded, before the pointer moved from ep0-ba2: the newest one is taken
    s3.put(pointer, b"run/ep0-ba2-rank0.pt")
    assert latest_checkpoint(cfg) == f"{run}/ep0-ba3-rank0.pt"
    assert (
        f"autoresume: {run}/ep0-ba3-rank0.pt is newer than the checkpoint latest-rank0.pt.symlink names" in caplog.text
    )
    # a sharded checkpoint's objects are uploaded one by one: a newer one may be incomplete, and is named
    s3.put(f"{run}/ep0-ba4/.metadata", b"")
    with pytest.raises(ConfigError, match=rf"holds the sharded checkpoint {run}/ep0-ba4, newer than the checkpoint"):
        latest_checkpoint(cfg)


def test_a_second_default_named_bucket_run_is_told_to_set_run_name(s3, sample_shards, tmp_path):
    bucket = s3.new_bucket()
    holder = CacheHolder(tmp_path / "runs" / "hbpe-tiny" / "stream-cache", save_folder=f"{bucket}/first")
    try:
        args = [f"data.train={sample_shards[0]}", "data.eval=null", f"save_folder={bucket}/second"]
        r = CliRunner().invoke(main, ["train", "tiny", *args, "max_duration=1ba", *EACH_BATCH])  # run_name: default
        _fails(r, 2, f"stream cache runs/hbpe-tiny/stream-cache is in use by another run (pid {holder.proc.pid} ")
        assert "set run_name to a name of its own, e.g. run_name=hbpe-tiny-2" in r.output
        assert s3.list(f"{bucket}/second") == []
    finally:
        holder.end()
