"""What the launcher of a run does beside the pipeline: stopping its worker processes when it
is interrupted, and letting the output swap finish before a signal lands. (The progress bar
is progress_bar.py.)
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator

from hbpe.pipeline.beam import reaper


class StopWorkersOnExit:
    """While the pipeline runs, SIGTERM stops the launcher like SIGINT does, and the Beam worker
    processes it started are killed on every way out, so none outlives it or writes after cleanup.

    DirectRunner's multi_processing mode starts each worker as `sh -c "python -m
    apache_beam.runners.worker.sdk_worker_main"` (SubprocessSdkWorker). Without this a SIGTERM
    killed the launcher outright: its cleanup never ran, the staging folder stayed, and the
    workers were left to notice the closed gRPC channel on their own.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._before: set[int] = set()
        self._handlers: dict[int, object] = {}
        self._quieted: tuple | None = None
        self._launcher_env: str | None = None
        self._reaper: subprocess.Popen | None = None

    def __enter__(self) -> StopWorkersOnExit:
        self._before = {pid for pid, _ in _descendants()}
        # and a kill -9 of the launcher, which runs no cleanup: the workers inherit this name, and the reaper
        # kills them once the launcher is gone (reaper.py); a pool worker of the in-process runner watches its
        # parent itself (inprocess.py)
        self._launcher_env = os.environ.get(reaper.LAUNCHER_ENV)
        token = f"{os.getpid()}-{os.urandom(6).hex()}"
        os.environ[reaper.LAUNCHER_ENV] = token
        with contextlib.suppress(OSError):  # no reaper (no fork left?): only kill -9 goes uncovered
            self._reaper = reaper.start(token)
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._handlers[sig] = signal.signal(sig, self._on_signal)
        return self

    def _on_signal(self, signum: int, frame) -> None:
        self._quiet_beam()
        self.kill_workers()  # first: Beam's own shutdown joins the workers and would wait for them
        if self.signum is None:
            self.signum = signum
            raise KeyboardInterrupt

    def _quiet_beam(self) -> None:
        """Beam's threads report every worker we stopped with a traceback; the user asked for the stop."""
        if self._quieted is None:
            log = logging.getLogger("apache_beam")
            self._quieted = (threading.excepthook, log.level)
            threading.excepthook = lambda args: None
            log.setLevel(logging.CRITICAL + 1)  # workers relay their own KeyboardInterrupt at CRITICAL

    def kill_workers(self, grace_s: float = 3.0) -> None:
        doomed = [pid for pid, cmd in _descendants() if pid not in self._before and b"apache_beam" in cmd]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in doomed:
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + grace_s
            while (doomed := [pid for pid in doomed if _alive(pid)]) and time.monotonic() < deadline:
                time.sleep(0.05)
            if not doomed:
                return

    def __exit__(self, *exc) -> None:
        try:
            self.kill_workers()
        finally:
            if self._launcher_env is None:
                os.environ.pop(reaper.LAUNCHER_ENV, None)
            else:
                os.environ[reaper.LAUNCHER_ENV] = self._launcher_env
            if self._reaper is not None:
                self._reaper.stdin.close()  # type: ignore[union-attr]
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._reaper.wait(timeout=5)
            for sig, handler in self._handlers.items():
                signal.signal(sig, handler)
            if self._quieted is not None:
                threading.excepthook, level = self._quieted
                logging.getLogger("apache_beam").setLevel(level)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block is done, then arrive as they would have."""
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {sig: signal.signal(sig, lambda signum, frame: got.append(signum)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if got:
            signal.raise_signal(got[0])


def _descendants() -> list[tuple[int, bytes]]:
    """(pid, command line) of every process below this one: /proc on Linux, psutil elsewhere if present."""
    if not os.path.isdir("/proc"):
        try:
            import psutil
        except ImportError:
            return []
        out = []
        for c in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                out.append((c.pid, " ".join(c.cmdline()).encode()))
        return out
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    parent[int(entry)] = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    found, stack = [], [os.getpid()]
    while stack:
        for child in children.get(stack.pop(), []):
            stack.append(child)
            try:
                with open(f"/proc/{child}/cmdline", "rb") as f:
                    found.append((child, f.read().replace(b"\0", b" ")))
            except OSError:
                continue
    return found


def _alive(pid: int) -> bool:
    """Running (a zombie has exited: only its parent has yet to collect the status)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False
