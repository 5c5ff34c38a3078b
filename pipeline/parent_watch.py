"""A helper process ends when the process it works for is gone (kill -9 included).

A forked pool worker blocked on its task pipe never sees EOF (every worker holds a copy of the
pipe's write end), and a training rank whose launcher died trains on: without this, each ran on
for minutes, or to the end, after its launcher was killed.

On Linux the kernel does it: `prctl(PR_SET_PDEATHSIG)` signals the child when the thread that
forked it exits. Elsewhere (or if prctl fails) a daemon thread polls `os.getppid()` once a
second. (A Beam worker, which is not the launcher's child but its shell's, is reaped instead:
pipeline/beam/reaper.py.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1
POLL_S = 1.0


def _prctl() -> Callable[[int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def exit_with_parent(sig: int = signal.SIGKILL, *, parent_pid: int | None = None) -> None:
    """Call in the child: `sig` arrives when the parent dies.

    `parent_pid` is the parent as the child was started (pass it when known: if the parent died
    before this call, the child has already been re-parented and gets `sig` at once).
    """
    prctl = _prctl()
    if prctl is None or prctl(_PR_SET_PDEATHSIG, int(sig)) != 0:
        parent = os.getppid() if parent_pid is None else parent_pid
        _start_watch(lambda: os.getppid() == parent, sig)
    if parent_pid is not None and os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)


def parent_death_preexec(sig: int) -> Callable[[], None] | None:
    """A `preexec_fn` for Popen: the child gets `sig` when this process dies (None where prctl is missing).

    The function is looked up here, before the fork, so the child only makes one foreign call.
    """
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig))
        if os.getppid() != parent:  # the parent died between the fork and the prctl
            os.kill(os.getpid(), sig)

    return preexec


def _start_watch(alive: Callable[[], bool], sig: int) -> None:
    def watch() -> None:
        while alive():
            time.sleep(POLL_S)
        with contextlib.suppress(OSError):
            os.kill(os.getpid(), sig)

    threading.Thread(target=watch, name="hbpe-parent-watch", daemon=True).start()
