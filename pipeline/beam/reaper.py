"""A small process that outlives a killed launcher just long enough to kill the Beam workers it started.

DirectRunner's multi_processing mode starts each worker as `sh -c "python -m ...sdk_worker_main"`:
the worker is the shell's child, not the launcher's, so no parent-death signal reaches it, and a
worker still starting up when the launcher was killed (kill -9: no cleanup runs) waited on its
dead gRPC channels for minutes. The launcher starts this reaper with a pipe it alone holds
(Popen closes other descriptors), and names itself in its environment (LAUNCHER_ENV), which every
process it starts inherits. When the pipe closes, the launcher has finished or died: the reaper
kills every process that still carries the name, then exits. Linux (/proc); elsewhere it only exits.

    python -m hbpe.pipeline.beam.reaper TOKEN    # stdin: the launcher's end of the pipe
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

LAUNCHER_ENV = "HBPE_LAUNCHER"


def start(token: str) -> subprocess.Popen:
    """Start the reaper for the processes started with LAUNCHER_ENV=token; close its stdin to let it act."""
    return subprocess.Popen(
        [sys.executable, "-m", "hbpe.pipeline.beam.reaper", token],
        stdin=subprocess.PIPE,
        start_new_session=True,  # a Ctrl-C on the terminal stops the launcher, not the one who cleans up after it
    )


def marked(token: str) -> list[int]:
    """Pids of the live processes started with LAUNCHER_ENV=token (our user's: others' environ is unreadable)."""
    if not os.path.isdir("/proc"):
        return []
    needle = f"{LAUNCHER_ENV}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def main(token: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stdin.buffer.read()  # EOF: the launcher closed the pipe or died
    for _ in range(10):  # again while a shell killed a moment ago may have started its worker
        pids = marked(token)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


if __name__ == "__main__":
    main(sys.argv[1])
