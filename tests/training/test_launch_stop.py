"""`hbpe train --nproc N` stops every process of its run when it is stopped, and a node that cannot reach
node 0 says so in one line instead of waiting 300 s in torch's store client, or without end when another program
answers on node 0's port. A stopped run names the checkpoint to continue from (issue 28)."""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import zipfile
from contextlib import contextmanager

import psutil
import pytest
from click.testing import CliRunner

from hbpe.cli import main
from tests.conftest import REPO
from tests.helpers import free_port


def _checkpoint_batches(folder) -> list[int]:
    return sorted(int(m[1]) for p in folder.glob("ep*-rank0.pt") if (m := re.search(r"-ba(\d+)-", p.name)))


def _wait_until(condition, cli: subprocess.Popen, err, what: str, *, deadline_s: float = 180.0) -> None:
    """Poll `condition` until it holds; fail with the CLI's stderr when the CLI ends first or `deadline_s` passes."""
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert cli.poll() is None, f"the CLI ended before {what}: {err.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} within {deadline_s:g} s: {err.read_text()[-3000:]}"
        time.sleep(0.2)


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
        # a checkpoint is whole (its pointer is written after it)
        _wait_until((folder / "latest-rank0.pt").exists, cli, tmp_path / "err.txt", "checkpoint")
        procs = psutil.Process(cli.pid).children(recursive=True)  # the launcher, the 2 ranks, their helpers
        ranks = [p for p in procs if p.cmdline()[1:3] == ["-m", "hbpe.training.train.launch"]]
        assert len(ranks) == 2
        saved = _checkpoint_batches(folder)
        cli.send_signal(signal.SIGTERM)
        assert cli.wait(timeout=60) == 128 + signal.SIGTERM
        # the command returns only once every process of its run is gone: nothing can write after it
        assert [p.pid for p in procs if not _gone(p.pid)] == []
        lines = (tmp_path / "err.txt").read_text().splitlines()
        last = re.fullmatch(
            "error: interrupted by SIGTERM: stopped the 2 training processes on this node; the last checkpoint saved "
            f"is {re.escape(str(folder))}/ep0-ba(\\d+)-rank0.pt: continue from it with the same command and autoresume=true",
            lines[-1],
        )
        assert last and int(last[1]) >= saved[-1], lines[-1]
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


@contextmanager
def _http_server():
    """A plain HTTP server on 127.0.0.1 (python -m http.server's handler) -> (its port, the time.monotonic() of each
    connection it accepted: a list that grows)."""
    contacts: list[float] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def setup(self) -> None:
            contacts.append(time.monotonic())
            super().setup()

        def log_message(self, *args) -> None:  # quiet: the store client's bytes are a "bad request"
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], contacts
    finally:
        server.shutdown()
        server.server_close()


def _node_1_of_2(port: int, timeout: str) -> list[str]:
    return [*("--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port", str(port)),
            *("--rendezvous-timeout", timeout)]  # fmt: skip


def test_another_program_on_node_0s_port_fails_after_the_rendezvous_timeout(tmp_path):
    """Before: the rank waited in torch's store client without end (an HTTP server answers and closes)."""
    with _http_server() as (port, contacts):
        args = ["train", "tiny", f"data.train={tmp_path}", "data.eval=null", f"save_folder={tmp_path / 'run'}"]
        r = CliRunner().invoke(main, [*args, *_node_1_of_2(port, "3")])
        waited = time.monotonic() - contacts[1]  # [0]: wait_for_master's probe; then the rank's store client
    assert r.exit_code == 2, r.output
    assert [ln for ln in r.output.splitlines() if ln.strip()] == [
        f"error: node 1 reached 127.0.0.1:{port}, but its rank 0 did not join node 0's rendezvous there within 3 s: "
        "what answers on that port is not node 0 of this run (another program, or a run of other nodes?); check "
        "that node 0 runs the same command with --node-rank 0 and that --master-addr and --master-port name it; wait "
        "longer with --rendezvous-timeout SECONDS (or HBPE_RENDEZVOUS_TIMEOUT); stopped this node's training processes"
    ]
    assert 2 < waited < 30  # 3 s in the rendezvous, SIGKILL 1 s after SIGTERM (on a loaded machine: seconds more)
    assert not (tmp_path / "run").exists()


def test_ctrl_c_in_the_rendezvous_names_no_save_folder_without_checkpoints(tmp_path):
    """Before: "the checkpoints saved before are in SAVE_FOLDER", a folder that did not exist."""
    folder = tmp_path / "run"
    with _http_server() as (port, contacts):
        cmd = [sys.executable, "-m", "hbpe.cli", "train", "tiny", f"data.train={tmp_path}", "data.eval=null"]
        cmd += [f"save_folder={folder}", *_node_1_of_2(port, "600")]
        tmp = tmp_path / "tmp"  # where `hbpe train` makes its rendezvous marks folder (tempfile)
        tmp.mkdir()
        env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp)}
        with open(tmp_path / "err.txt", "w") as err:
            cli = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err)
        try:

            def in_rendezvous() -> bool:
                """The rank marked that it reached the rendezvous (rendezvous_marked) and its store client has
                connected ([0]: wait_for_master's probe, before the launcher starts; then the rank's store client)."""
                return bool(list(tmp.glob("hbpe-rendezvous-*/0.started"))) and len(contacts) >= 2

            _wait_until(in_rendezvous, cli, tmp_path / "err.txt", "rank in the rendezvous")
            assert not list(tmp.glob("hbpe-rendezvous-*/0.joined"))  # waiting there, as node 0 never answers
            cli.send_signal(signal.SIGINT)
            assert cli.wait(timeout=60) == 130, (tmp_path / "err.txt").read_text()[-3000:]
        finally:
            if cli.poll() is None:
                cli.kill()
    assert (tmp_path / "err.txt").read_text().splitlines()[-1] == (
        "error: interrupted by SIGINT: stopped the 1 training processes on this node; this node's save_folder "
        f"{folder} holds no checkpoint (node 0 saves them: look there)"
    )
    assert not folder.exists()


def _tiny_cli(sample_shards, folder, *extra: str) -> list[str]:
    train_dir, _ = sample_shards
    return [
        *(sys.executable, "-m", "hbpe.cli", "train", "tiny", f"data.train={train_dir}", "data.eval=null"),
        *(f"save_folder={folder}", "console=false", "max_duration=100000ba", "global_batch_size=2"),
        *("model.latent_layers=1", "model.encoder_layers=1", "model.decoder_layers=1", *extra),
    ]


@pytest.mark.parametrize("saved", [True, False])
def test_ctrl_c_names_the_last_checkpoint_and_how_to_continue(sample_shards, tmp_path, saved):
    """Before: exit 130 and not a word (Composer's SIGINT handler exits quietly)."""
    folder = tmp_path / "run"
    cmd = _tiny_cli(sample_shards, folder, f"save_interval={2 if saved else 100000}ba")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open(tmp_path / "err.txt", "w") as err:
        cli = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        # a checkpoint is whole once the pointer names it; without checkpoints, wait for a trained batch
        ready = (folder / "latest-rank0.pt") if saved else (folder / "metrics.jsonl")

        def done() -> bool:
            return ready.exists() and (saved or '"kind": "train"' in ready.read_text())

        _wait_until(done, cli, tmp_path / "err.txt", "checkpoint" if saved else "trained batch")
        whole = int(re.search(r"-ba(\d+)-", os.readlink(ready))[1]) if saved else None
        cli.send_signal(signal.SIGINT)
        assert cli.wait(timeout=120) == 130, (tmp_path / "err.txt").read_text()[-3000:]
    finally:
        if cli.poll() is None:
            cli.kill()
    line = (tmp_path / "err.txt").read_text().splitlines()[-1]
    if not saved:
        assert line == (
            "error: interrupted by SIGINT; no checkpoint was saved yet (save_interval=100000ba): nothing to continue; run the "
            "command again to start over"
        )
        return
    last = re.fullmatch(
        f"error: interrupted by SIGINT; the last checkpoint saved is ({re.escape(str(folder))}/ep0-ba(\\d+)-rank0.pt): "
        "continue from it with the same command and autoresume=true",
        line,
    )
    assert last and int(last[2]) >= whole and zipfile.is_zipfile(last[1]), line  # a whole one, the newest
