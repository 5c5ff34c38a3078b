"""The command line that trains on several processes and nodes: Composer's launcher around `hbpe.training.train.launch`.

The launcher and its ranks run in a process group of their own, which `hbpe train` stops as one:
Composer's launcher dies on SIGTERM without stopping its ranks, which then trained to the end,
writing checkpoints, after the command had exited.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from hbpe.pipeline.parent_watch import parent_death_preexec
from hbpe.schemas.errors import ConfigError

RENDEZVOUS_TIMEOUT_ENV = "HBPE_RENDEZVOUS_TIMEOUT"
DEFAULT_RENDEZVOUS_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0  # after SIGTERM, how long the ranks have to close (uploads in flight) before SIGKILL
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class TrainingInterrupted(KeyboardInterrupt):
    """A signal stopped `hbpe train --nproc N`: every process of the run on this node was stopped."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


def launcher_command(
    config: str,
    overrides: Sequence[str],
    *,
    nproc: int,
    master_port: int | None = None,
    nnodes: int = 1,
    node_rank: int | None = None,
    master_addr: str | None = None,
    log_dir: str | None = None,
) -> list[str]:
    """argv of `composer -n NPROC [multi-node flags] -m hbpe.training.train.launch CONFIG key=value ...`, run by this Python.

    `sys.executable -m composer.cli.launcher` rather than the `composer` script: the launcher's
    children must run in the same environment as this process, whatever is first on PATH.
    On several nodes every node runs this with its own `node_rank`; the launcher gives node R the
    global ranks R*nproc .. R*nproc+nproc-1 of `nnodes*nproc`, and all meet at master_addr:master_port.
    `log_dir` holds the logs of local ranks 1.. (rank 0 writes to this terminal); by default a temporary
    folder of the launcher's, which stays behind when the launcher is killed.

    >>> launcher_command("tiny", ["max_duration=2ba"], nproc=2)[2:]
    ['composer.cli.launcher', '-n', '2', '-m', 'hbpe.training.train.launch', 'tiny', 'max_duration=2ba']
    >>> launcher_command("tiny", [], nproc=1, nnodes=2, node_rank=1, master_addr="10.0.0.1", master_port=29500)[5:13]
    ['--world_size', '2', '--node_rank', '1', '--master_addr', '10.0.0.1', '--master_port', '29500']
    """
    multinode = []
    if nnodes > 1:
        if node_rank is None or master_addr is None or master_port is None:
            raise ValueError("a multi-node launch needs node_rank, master_addr and master_port")
        multinode = ["--world_size", str(nnodes * nproc), "--node_rank", str(node_rank), "--master_addr", master_addr]
    port = [] if master_port is None else ["--master_port", str(master_port)]
    logs = [] if log_dir is None else ["--stdout", f"{log_dir}/rank{{rank}}.stdout.txt"]
    logs += [] if log_dir is None else ["--stderr", f"{log_dir}/rank{{rank}}.stderr.txt"]
    launcher = [sys.executable, "-m", "composer.cli.launcher", "-n", str(nproc), *multinode, *port, *logs]
    return [*launcher, "-m", "hbpe.training.train.launch", config, *overrides]


def launch(
    config: str,
    overrides: Sequence[str],
    *,
    nproc: int,
    master_port: int | None = None,
    nnodes: int = 1,
    node_rank: int | None = None,
    master_addr: str | None = None,
    rendezvous_timeout: float = DEFAULT_RENDEZVOUS_TIMEOUT_S,
    log_dir: str | None = None,
) -> int:
    """Run the launcher to the end; returns its exit status. Unbuffered, so every rank's lines show as they come.

    The launcher's stdout, which rank 0 inherits, goes to this process's stderr: stdout is the command's result
    alone (`hbpe train --nproc 2 --json` printed the launcher's "Starting distributed environment..." first).

    On node R > 0, node 0 must answer at master_addr:master_port within `rendezvous_timeout` seconds
    first (ConfigError otherwise). SIGINT, SIGTERM or SIGHUP stop the launcher, its ranks and their
    children (SIGKILL after STOP_GRACE_S) and raise TrainingInterrupted once all are gone.
    """
    cmd = launcher_command(
        config,
        overrides,
        nproc=nproc,
        master_port=master_port,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=master_addr,
        log_dir=log_dir,
    )
    if nnodes > 1 and node_rank:
        assert master_addr is not None and master_port is not None, "launcher_command checked them"
        wait_for_master(master_addr, master_port, node_rank=node_rank, timeout=rendezvous_timeout)
    return run_as_group(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=_stderr_fd())


def _stderr_fd() -> int:
    """This process's stderr as a file descriptor (fd 2 when sys.stderr is not a file, as under click's CliRunner)."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return 2


class _Stop(BaseException):
    def __init__(self, signum: int) -> None:
        self.signum = signum


def run_as_group(
    cmd: list[str], *, env: dict[str, str], grace_s: float = STOP_GRACE_S, stdout: int | None = None
) -> int:
    """Run `cmd` in a new process group to the end -> its exit status; a stop signal stops the whole group.

    The group, not the launcher alone: its ranks and their children (streaming's, the resource tracker)
    inherit it, and it still names them once the launcher has died and they were re-parented. The
    launcher also gets SIGTERM if this process dies without a chance to stop it (kill -9). `stdout`: a file
    descriptor for the group's standard output (default: this process's).
    """

    def on_signal(signum: int, frame: Any) -> None:
        raise _Stop(signum)

    main = sys.platform != "win32" and _in_main_thread()
    before = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS} if main else {}
    proc = None
    try:
        # a session of its own: its processes form one group, and a terminal with `stty tostop` does not stop them
        # for writing to it from outside the foreground group
        proc = subprocess.Popen(
            cmd, env=env, stdout=stdout, start_new_session=True, preexec_fn=parent_death_preexec(signal.SIGTERM)
        )
        return proc.wait()
    except _Stop as stop:
        for sig in STOP_SIGNALS:  # a second Ctrl-C while stopping does not cut the stop short
            signal.signal(sig, signal.SIG_IGN)
        if proc is not None:
            _stop_group(proc, grace_s)
        raise TrainingInterrupted(stop.signum) from None
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _stop_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to every process of the group, SIGKILL to those left after `grace_s`; back once none is left.

    The launcher first, with SIGKILL: its own cleanup (Composer's SIGTERM handler) prints a traceback,
    waits 30 s and dumps every rank's log; the ranks die of SIGTERM (launch.py), which its death also sends.
    """
    pgid = proc.pid
    proc.kill()
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, grace_s)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while True:
            proc.poll()  # collect the launcher, so that it is not left a zombie member of the group
            if not _group_members(pgid) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if not _group_members(pgid):
            return


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group: /proc on Linux; elsewhere whether the group exists."""
    if not os.path.isdir("/proc"):
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        # fields[0] is the state, fields[2] the process group
        if fields[0] != b"Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def wait_for_master(addr: str, port: int, *, node_rank: int, timeout: float) -> None:
    """Return once node 0 accepts connections at addr:port; ConfigError after `timeout` seconds.

    Node 0's first rank opens the port when it reaches the rendezvous; without this, the ranks of
    node R > 0 waited 300 s in torch's store client, then died with pages of C++ stack frames.
    """
    deadline = time.monotonic() + timeout
    why = "no answer"
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((addr, port), timeout=max(0.1, min(left, 5.0))):
                return
        except OSError as e:
            why = e.strerror or str(e) or type(e).__name__
        if time.monotonic() + 0.5 > deadline:
            break
        time.sleep(0.5)
    raise ConfigError(
        f"node {node_rank} could not reach node 0 at {addr}:{port} within {timeout:g} s ({why}): check that "
        f"node 0 runs the same command with --node-rank 0, that --master-addr {addr} and --master-port {port} "
        f"name it and the port is open between the nodes; wait longer with --rendezvous-timeout SECONDS "
        f"(or {RENDEZVOUS_TIMEOUT_ENV})"
    )
