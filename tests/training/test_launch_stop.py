"""`hbpe train --nproc N` stops every process of its run when it is stopped, and a node that cannot reach
node 0 says so in one line instead of waiting 300 s in torch's store client."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest
from click.testing import CliRunner

from hbpe.cli import main
from tests.conftest import REPO
from tests.helpers import free_port


def _checkpoint_batches(folder) -> list[int]:
    return sorted(int(m[1]) for p in folder.glob("ep*-rank0.pt") if (m := re.search(r"-ba(\d+)-", p.name)))


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_sigterm_stops_every_rank_before_the_command_exits(sample_shards, tmp_path):
    train_dir, eval_dir = sample_shards
    folder = tmp_path / "run"
    cmd = [
        *(sys.executable, "-m", "hbpe.cli", "train", "tiny"),
        *(f"data.train={train_dir}", "data.eval=null", f"save_folder={folder}", "console=false"),
        *("max_duration=100000ba", "save_interval=2ba", "fsdp={version: 2, state_dict_type: full}"),
        *("--nproc", "2", "--master-port", str(free_port())),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    with open(tmp_path / "out.txt", "w") as out, open(tmp_path / "err.txt", "w") as err:
        cli = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=err)
    procs: list[psutil.Process] = []
    try:
        while not (folder / "latest-rank0.pt").exists():  # a checkpoint is whole (its pointer is written after it)
            assert cli.poll() is None, (tmp_path / "err.txt").read_text()[-3000:]
            time.sleep(0.2)
        procs = psutil.Process(cli.pid).children(recursive=True)  # the launcher, the 2 ranks, their helpers
        ranks = [p for p in procs if p.cmdline()[1:3] == ["-m", "hbpe.training.train.launch"]]
        assert len(ranks) == 2
        saved = _checkpoint_batches(folder)
        cli.send_signal(signal.SIGTERM)
        assert cli.wait(timeout=60) == 128 + signal.SIGTERM
        # the command returns only once every process of its run is gone: nothing can write after it
        assert [p.pid for p in procs if not _gone(p.pid)] == []
        lines = (tmp_path / "err.txt").read_text().splitlines()
        assert lines[-1] == (
            "error: interrupted by SIGTERM: stopped the 2 training processes on this node; the checkpoints saved "
            f"before are in {folder} (continue with autoresume=true)"
        )
        # at most the checkpoint in flight when the signal came (save_interval=2ba), none after it
        assert _checkpoint_batches(folder)[-1] <= saved[-1] + 2
        # what the 2 FSDP2 ranks saved before the signal is one whole model (the full state dict, gathered
        # on rank 0) that eval reads and scores
        first = folder / f"ep0-ba{saved[0]}-rank0.pt"
        r = CliRunner().invoke(
            main, ["eval", "--checkpoint", str(first), "--data", str(eval_dir), "--max-batches", "2", "--json"]
        )
        assert r.exit_code == 0, r.output
        assert 0 < json.loads(r.stdout)["bpb"] < 20
    finally:  # on a failure, leave no trainer behind
        for p in [psutil.Process(cli.pid), *procs] if cli.poll() is None else procs:
            if not _gone(p.pid):
                p.kill()


@pytest.mark.parametrize("how", ["option", "env"])
def test_a_node_that_cannot_reach_node_0_says_so_after_the_rendezvous_timeout(how, tmp_path, monkeypatch):
    port = free_port()  # nobody listens there
    nodes = ["--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port", str(port)]
    if how == "option":
        nodes += ["--rendezvous-timeout", "3"]
    else:
        monkeypatch.setenv("HBPE_RENDEZVOUS_TIMEOUT", "3")
    r = CliRunner().invoke(main, ["train", "tiny", f"data.train={tmp_path}", "data.eval=null", *nodes])
    assert r.exit_code == 2, r.output
    assert [ln for ln in r.output.splitlines() if ln.strip()] == [
        f"error: node 1 could not reach node 0 at 127.0.0.1:{port} within 3 s (Connection refused): check that "
        f"node 0 runs the same command with --node-rank 0, that --master-addr 127.0.0.1 and --master-port {port} "
        "name it and the port is open between the nodes; wait longer with --rendezvous-timeout SECONDS "
        "(or HBPE_RENDEZVOUS_TIMEOUT)"
    ]


def test_the_rendezvous_timeout_is_for_several_nodes(tmp_path):
    r = CliRunner().invoke(main, ["train", "tiny", f"data.train={tmp_path}", "--rendezvous-timeout", "3"])
    assert r.exit_code == 2
    assert "Error: --rendezvous-timeout is for several nodes: add --nnodes N" in r.output
