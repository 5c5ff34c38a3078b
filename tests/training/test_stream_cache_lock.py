"""Two runs on one stream cache (issue 20): a run refuses a cache another live run holds and names the fix;
a run on other shards gets a cache folder of its own. Before: two default-named runs on one cache collided
inside streaming, and a run on other data stopped at "holds shards of another conversion"."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile

import pytest
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.schemas.errors import ConfigError
from hbpe.training.data import loader
from hbpe.training.data.stream_cache import LOCK_FILE, claim, release
from tests.helpers import CacheHolder
from tests.helpers import cli_fails as _fails

SHORT = ("max_duration=1ba", "eval_interval=1ba", "save_interval=1ba", "console=false", "log_interval=100ba")


def _train(sample_shards, *args: str):
    return CliRunner().invoke(
        main, ["train", "tiny", f"data.train={sample_shards[0]}", "data.eval=null", *SHORT, *args]
    )


def test_a_cache_held_by_a_live_run_is_refused(sample_shards, tmp_path):
    shared = tmp_path / "shared-cache"
    holder = CacheHolder(shared)
    try:
        r = _train(sample_shards, f"save_folder={tmp_path / 'run'}", f"data.cache_dir={shared}")
        _fails(r, 2, f"stream cache {shared} is in use by another run (pid {holder.proc.pid} on ")
        assert "run_name other-run, save_folder s3://bucket/other, since " in r.output
        assert "two runs at once need caches of their own; set data.cache_dir to a folder of its own" in r.output
        assert not (tmp_path / "run" / "hbpe_run.json").exists()
    finally:
        holder.end()
    r = _train(sample_shards, f"save_folder={tmp_path / 'run'}", f"data.cache_dir={shared}")
    assert r.exit_code == 0, r.output  # the holder was killed: no stale lock
    who = json.loads((shared / LOCK_FILE).read_text())
    assert who["pid"] == os.getpid() and who["save_folder"] == str(tmp_path / "run")


def test_a_run_on_other_shards_gets_its_own_cache_folder(sample_shards, tmp_path):
    """Same cache root (one data.cache_dir, or one run_name with a bucket save folder), other data.train."""
    shared = tmp_path / "shared-cache"
    for name, shards in (("a", sample_shards[0]), ("b", sample_shards[1])):
        args = [f"data.train={shards}", f"save_folder={tmp_path / name}", f"data.cache_dir={shared}"]
        r = CliRunner().invoke(main, ["train", "tiny", "data.eval=null", *SHORT, *args])
        assert r.exit_code == 0, r.output
    caches = sorted(p.name.rsplit("-", 1)[0] for p in (shared / "train").iterdir())
    assert caches == ["eval", "train"]  # named by the shard directories


def test_claim_is_per_process_and_released(tmp_path):
    root = tmp_path / "cache"
    claim(str(root), run_name="a", save_folder="x")
    claim(str(root), run_name="a", save_folder="x")  # the same process again: fine (runs built one by one)
    code = "import sys; from hbpe.training.data.stream_cache import claim; claim(sys.argv[1], run_name='b', save_folder='y')"
    other = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True)
    assert other.returncode != 0 and f"is in use by another run (pid {os.getpid()} on " in other.stderr
    release(str(root))
    CacheHolder(root).end(signal.SIGTERM)  # released: another process takes it


def test_no_lock_of_a_run_is_taken_through_a_link(tmp_path, monkeypatch):
    """A link planted as a lock file (issue 28) is refused, its target left as it was: the stream cache's, and the
    streaming setup lock in the shared temporary folder."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    root = tmp_path / "cache"
    root.mkdir()
    (root / LOCK_FILE).symlink_to(victim)
    with pytest.raises(ConfigError, match=f"^{root / LOCK_FILE} is a symbolic link, where hbpe keeps a lock file"):
        claim(str(root), run_name="a", save_folder="x")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    (tmp / "hbpe-streaming-setup.lock").symlink_to(victim)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with pytest.raises(ConfigError, match="hbpe-streaming-setup.lock is a symbolic link"):
        loader._one_dataset_setup_at_a_time().__enter__()
    assert victim.read_text() == "precious\n"
