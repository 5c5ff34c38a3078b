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
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hbpe.pipeline.parent_watch import parent_death_preexec
from hbpe.schemas.errors import ConfigError, HbpeError

# where rank 0 writes the result as JSON (set by `hbpe train --nproc N`); unset: an `HBPE_RESULT {json}` line.
# Here, not in launch.py (which imports Composer), so that the launching process reads it for free
RESULT_FILE_ENV = "HBPE_RESULT_FILE"
RENDEZVOUS_TIMEOUT_ENV = "HBPE_RENDEZVOUS_TIMEOUT"
RENDEZVOUS_MARKS_ENV = "HBPE_RENDEZVOUS_MARKS"  # the folder where each rank marks its rendezvous (rendezvous_marked)
DEFAULT_RENDEZVOUS_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0  # after SIGTERM, how long the ranks have to close (uploads in flight) before SIGKILL
WATCH_INTERVAL_S = 0.2
# a watch (RendezvousWatch) stops ranks that have saved nothing yet, often blocked in C++ where SIGTERM's Python
# handler never runs: SIGKILL soon
WATCH_STOP_GRACE_S = 1.0
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
    first, and each rank must then join the rendezvous within `rendezvous_timeout` seconds of reaching it
    (ConfigError otherwise: whatever answers on the port, torch's store client could wait without end). SIGINT,
    SIGTERM or SIGHUP stop the launcher, its ranks and their children (SIGKILL after STOP_GRACE_S) and raise
    TrainingInterrupted once all are gone.
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
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if not (nnodes > 1 and node_rank):
        return run_as_group(cmd, env=env, stdout=_stderr_fd())
    assert master_addr is not None and master_port is not None, "launcher_command checked them"
    wait_for_master(master_addr, master_port, node_rank=node_rank, timeout=rendezvous_timeout)
    with tempfile.TemporaryDirectory(prefix="hbpe-rendezvous-") as marks:
        watch = RendezvousWatch(
            marks, nproc=nproc, timeout=rendezvous_timeout, node_rank=node_rank, master=f"{master_addr}:{master_port}"
        )
        return run_as_group(cmd, env={**env, RENDEZVOUS_MARKS_ENV: marks}, stdout=_stderr_fd(), watch=watch)


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
    cmd: list[str],
    *,
    env: dict[str, str],
    grace_s: float = STOP_GRACE_S,
    stdout: int | None = None,
    watch: Callable[[], bool] | None = None,
) -> int:
    """Run `cmd` in a new process group to the end -> its exit status; a stop signal stops the whole group.

    The group, not the launcher alone: its ranks and their children (streaming's, the resource tracker)
    inherit it, and it still names them once the launcher has died and they were re-parented. The
    launcher also gets SIGTERM if this process dies without a chance to stop it (kill -9). `stdout`: a file
    descriptor for the group's standard output (default: this process's). `watch`, called every
    WATCH_INTERVAL_S until it returns False, may raise an HbpeError: the group is stopped (SIGKILL after
    WATCH_STOP_GRACE_S), then the error raised.
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
        while watch is not None and proc.poll() is None and watch():
            time.sleep(WATCH_INTERVAL_S)
        return proc.wait()
    except _Stop as stop:
        for sig in STOP_SIGNALS:  # a second Ctrl-C while stopping does not cut the stop short
            signal.signal(sig, signal.SIG_IGN)
        if proc is not None:
            _stop_group(proc, grace_s)
        raise TrainingInterrupted(stop.signum) from None
    except HbpeError:  # the watch's
        if proc is not None:
            _stop_group(proc, WATCH_STOP_GRACE_S)
        raise
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


@contextmanager
def rendezvous_marked() -> Iterator[None]:
    """Around a rank's rendezvous: `LOCAL_RANK.started` before it and `LOCAL_RANK.joined` after it, in the folder
    RENDEZVOUS_MARKS_ENV names (set by `hbpe train` on node R > 0; unset, e.g. under `composer -n N`: nothing)."""
    folder = os.environ.get(RENDEZVOUS_MARKS_ENV)
    rank = os.environ.get("LOCAL_RANK", "0")
    if folder:
        Path(folder, f"{rank}.started").touch()
    yield
    if folder:
        Path(folder, f"{rank}.joined").touch()


class RendezvousWatch:
    """`run_as_group`'s watch on node R > 0: ConfigError once a rank has waited in the rendezvous for `timeout` s.

    wait_for_master only sees that something accepts connections at the master's port; a program other than
    node 0's store there (an HTTP server answers and closes) left torch's store client waiting without end.
    The clock starts when a rank reaches the rendezvous (`rendezvous_marked`), after its imports.
    """

    def __init__(self, marks: str, *, nproc: int, timeout: float, node_rank: int, master: str) -> None:
        self.marks, self.nproc, self.timeout = Path(marks), nproc, timeout
        self.node_rank, self.master = node_rank, master
        self.started: dict[str, float] = {}  # rank -> when this watch first saw it wait

    def __call__(self) -> bool:
        """True while some rank has yet to join."""
        now = time.monotonic()
        joined = {p.stem for p in self.marks.glob("*.joined")}
        for p in self.marks.glob("*.started"):
            since = self.started.setdefault(p.stem, now)
            if p.stem not in joined and now - since > self.timeout:
                raise ConfigError(
                    f"node {self.node_rank} reached {self.master}, but its rank {p.stem} did not join node 0's "
                    f"rendezvous there within {self.timeout:g} s: what answers on that port is not node 0 of this "
                    "run (another program, or a run of other nodes?); check that node 0 runs the same command with "
                    "--node-rank 0 and that --master-addr and --master-port name it; wait longer with "
                    f"--rendezvous-timeout SECONDS (or {RENDEZVOUS_TIMEOUT_ENV}); stopped this node's training processes"
                )
        return len(joined) < self.nproc
