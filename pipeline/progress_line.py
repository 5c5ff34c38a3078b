"""One progress line for every long step (training, eval, an experiment's runs): done/total, the step's own
numbers (loss, BPB, KB/s) and the time left.

On a terminal it is a live tqdm line; in a log (stderr not a terminal) it is a plain line every
`interval_s` seconds (HBPE_PROGRESS_INTERVAL, default 30) and one at the end, so a CI log or a
`nohup` file shows the run advancing without a line per batch. The step's numbers are asked for
only when a line is drawn (`fields` is a callable): reading a loss off a GPU waits for it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from hbpe.schemas.errors import ConfigError

INTERVAL_ENV = "HBPE_PROGRESS_INTERVAL"
DEFAULT_INTERVAL_S = 30.0
TTY_REFRESH_S = 0.5  # a live line redraws at most this often (its numbers may cost a device sync)
LINE_FORMAT = "{desc}: {percentage:3.0f}% {n_fmt}/{total_fmt} {unit} [{elapsed}<{remaining}{postfix}]"

Fields = Callable[[], Mapping[str, str]]


def progress_interval() -> float:
    """Seconds between two plain progress lines in a log: HBPE_PROGRESS_INTERVAL, else 30."""
    raw = os.environ.get(INTERVAL_ENV, "").strip()
    if not raw:
        return DEFAULT_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"{INTERVAL_ENV}={raw!r}: must be a number of seconds > 0; e.g. {INTERVAL_ENV}=30")
    return value


def rate(amount: float, seconds: float, unit: str = "B") -> str:
    """'12.3 KB/s' (SI prefixes, as tqdm writes them)."""
    from tqdm import tqdm

    return f"{tqdm.format_sizeof(amount / max(seconds, 1e-9))}{unit}/s"


class ProgressLine:
    """`desc: 40% 120/300 batches [01:02<01:33, loss 2.913, 14.2 KB/s]` on `stream` (stderr)."""

    def __init__(
        self,
        desc: str,
        total: int | None,
        *,
        unit: str = "batches",
        initial: int = 0,
        stream: TextIO | None = None,
        interval_s: float | None = None,
    ) -> None:
        self.desc, self.total, self.unit = desc, total, unit
        self.n = self.initial = initial
        self.stream = stream or sys.stderr
        self.tty = _isatty(self.stream)
        self.interval_s = progress_interval() if interval_s is None else interval_s
        self._t0 = self._last = time.monotonic()
        self._drawn = initial  # what the last plain line showed: close() does not repeat it
        self._bar: Any = None
        if self.tty:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total, initial=initial, unit=unit, desc=desc, file=self.stream, dynamic_ncols=True,
                mininterval=TTY_REFRESH_S, leave=True,
            )  # fmt: skip

    def update(self, n: int = 1, fields: Fields | None = None) -> None:
        """`n` more done; a line is drawn when its time has come (fields() is called only then)."""
        self.n += n
        now = time.monotonic()
        due = now - self._last >= (TTY_REFRESH_S if self.tty else self.interval_s)
        if self._bar is not None:
            if due and fields is not None:
                self._bar.set_postfix_str(_postfix(fields()), refresh=False)
            self._bar.update(n)
        elif due:
            self.write(self.line(fields() if fields else {}))
            self._drawn = self.n
        if due:
            self._last = now

    def line(self, fields: Mapping[str, str]) -> str:
        """The state as one plain line (what a log gets every interval)."""
        from tqdm import tqdm

        fmt = LINE_FORMAT if self.total else "{desc}: {n_fmt} {unit} [{elapsed}{postfix}]"
        return tqdm.format_meter(
            self.n, self.total, time.monotonic() - self._t0, unit=self.unit, initial=self.initial,
            prefix=self.desc, postfix=_postfix(fields), bar_format=fmt,
        )  # fmt: skip

    def write(self, text: str) -> None:
        """A line of its own (an eval result) without breaking the live line."""
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
            return
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self, fields: Fields | None = None) -> None:
        """The last line, with the final numbers."""
        if self._bar is not None:
            if fields is not None:
                self._bar.set_postfix_str(_postfix(fields()), refresh=False)
            self._bar.close()
            self._bar = None
        elif self._drawn != self.n or self.n == self.initial:
            self.write(self.line(fields() if fields else {}))


def _postfix(fields: Mapping[str, str]) -> str:
    return ", ".join(f"{k} {v}" if k else v for k, v in fields.items())


def _isatty(stream: TextIO) -> bool:
    """A terminal with a width: a pseudo-terminal of 0 columns (`script`, some CI runners) gets the plain lines,
    where tqdm would draw an empty bar."""
    try:
        return stream.isatty() and os.get_terminal_size(stream.fileno()).columns > 0
    except (AttributeError, ValueError, OSError):  # a closed or replaced stream (a test runner's)
        return False
