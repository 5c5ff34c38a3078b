"""`hbpe train --json` prints the result alone on stdout, on one process or several: Composer's launcher
and its ranks write their lines to stderr (the launcher's "Waiting up to 30 seconds..." line
and rank 0's config dump came before it on stdout, and json.loads(stdout) failed)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from tests.conftest import REPO


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_train_json_on_two_processes_is_json_alone(sample_shards, tmp_path):
    train_dir, eval_dir = sample_shards
    cmd = [
        *(sys.executable, "-m", "hbpe.cli", "train", "tiny"),
        *(f"data.train={train_dir}", f"data.eval={eval_dir}", f"save_folder={tmp_path / 'run'}"),
        *("max_duration=2ba", "eval_interval=2ba", "save_interval=2ba", "eval_subset_num_batches=2"),
        *("--nproc", "2", "--master-port", str(_free_port()), "--json"),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp_path)}
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("{"), r.stdout[:2000]
    result = json.loads(r.stdout)  # the whole of stdout: nothing before or after the result
    assert result["world_size"] == 2 and result["batches"] == 2 and result["eval"]["BitsPerByte"] > 0
    # what the launcher and rank 0 print (Composer's config dump, the launcher's cleanup line) is on stderr
    assert "Waiting up to 30 seconds for all training processes to terminate" in r.stderr
    assert "composer_version: " in r.stderr
