"""A live progress line for local runs: watches the staging directory from a thread.

Works with any local runner (DirectRunner's worker processes included) because it
counts committed unit and shard files rather than asking the runner.
"""

from __future__ import annotations

import os
import sys
import threading
import time


class ProgressLine:
    def __init__(self, staging: str, *, n_units: int, interval: float = 1.0) -> None:
        self.staging, self.n_units, self.interval = staging, n_units, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hbpe-progress", daemon=True)
        self._tty = sys.stderr.isatty()
        self._t0 = time.time()

    def _count(self, sub: str, suffix: str) -> int:
        try:
            return sum(1 for n in os.listdir(os.path.join(self.staging, sub)) if n.endswith(suffix))
        except FileNotFoundError:
            return 0

    def line(self) -> str:
        units = self._count("units", ".bin")
        shards = self._count("shards", ".zstd")
        return (
            f"[convert] {time.time() - self._t0:6.1f}s  units encoded {units}/{self.n_units}  shards written {shards}"
        )

    def _run(self) -> None:
        last = ""
        while not self._stop.wait(self.interval):
            cur = self.line()
            if self._tty:
                sys.stderr.write("\r" + cur)
            elif cur != last and int(time.time() - self._t0) % 10 == 0:
                sys.stderr.write(cur + "\n")  # logs: a line every ~10 s, only when it changed
            sys.stderr.flush()
            last = cur

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        if self._tty:
            sys.stderr.write("\n")
