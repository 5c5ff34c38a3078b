"""The progress bar of a local conversion, read from what the workers commit to staging.

It works with every local runner (the in-process one, DirectRunner's worker processes)
because it reads files rather than asking the runner (units.py): each unit's summary when
it is done, and a small progress file while it is encoded. It shows input MB done of the
total with MB/s and the ETA (tqdm), documents and MB of text read, units and shards written;
when stderr is not a terminal (a log), one such line every 10 s.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TextIO

from hbpe.pipeline.beam.units import UnitSummary
from hbpe.pipeline.corpus.files import FileInfo, WorkUnit

BAR_FORMAT = (
    "{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} MB [{elapsed}<{remaining}, {rate_noinv_fmt}{postfix}]"
)
LOG_FORMAT = "{desc}: {percentage:3.0f}% {n:.1f}/{total:.1f} MB [{elapsed}<{remaining}, {rate_noinv_fmt}{postfix}]"


def unit_input_bytes(units: Sequence[WorkUnit], files: Sequence[FileInfo]) -> list[int]:
    """Each unit's share of its input file in bytes: its byte range, its row groups' share of a Parquet file, or
    an equal share of a compressed file cut into ranges of its text."""
    last_group: dict[int, int] = {}
    pieces: dict[int, int] = {}
    for u in units:
        if u.format == "parquet" and u.end is not None:
            last_group[u.file_index] = max(last_group.get(u.file_index, 0), u.end)
        pieces[u.file_index] = pieces.get(u.file_index, 0) + 1
    out = []
    for u in units:
        size = files[u.file_index].size
        if u.compression is not None and u.format != "parquet":
            out.append(size // pieces[u.file_index])
        elif u.format == "parquet":
            groups = last_group.get(u.file_index) or 1
            out.append(size * ((u.end if u.end is not None else groups) - u.start) // groups)
        else:
            out.append((u.end if u.end is not None else size) - u.start)
    return out


class ConvertProgress:
    """A progress bar on stderr (a line every `log_every_s` when stderr is not a terminal), read from staging."""

    def __init__(
        self,
        staging: str,
        weights: Sequence[int],
        *,
        reused: Mapping[int, UnitSummary] | None = None,
        interval: float = 0.5,
        log_every_s: float = 10.0,
        stream: TextIO | None = None,
    ) -> None:
        self.staging, self.weights = staging, list(weights)
        self.interval, self.log_every_s = interval, log_every_s
        self.stream = stream or sys.stderr
        self._tty = self.stream.isatty()
        self._done: dict[int, tuple[int, int]] = {}  # unit -> (documents, text bytes), read once from its summary
        reused = reused or {}
        self.initial_mb = sum(self.weights[i] for i in reused) / 1e6
        self.initial_text_mb = sum(u.counts.bytes for u in reused.values()) / 1e6  # not this run's: not in its rate
        self.total_mb = sum(self.weights) / 1e6
        self._t0 = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hbpe-progress", daemon=True)
        self._bar = None
        self._last = {"mb": self.initial_mb, "documents": 0, "text_mb": 0.0, "units": len(reused), "shards": 0}

    def snapshot(self) -> dict[str, float]:
        """Input MB done (units in flight count by their position), documents, MB of text, units and shards done."""
        units_dir = os.path.join(self.staging, "units")
        for name in _names(units_dir):
            if name.endswith(".json") and (i := _index(name)) is not None and i not in self._done:
                c = _read_json(os.path.join(units_dir, name)).get("counts")
                if c is not None:
                    self._done[i] = (c["documents_read"], c["bytes"])
        mb = sum(self.weights[i] for i in self._done if i < len(self.weights)) / 1e6
        docs = sum(d for d, _ in self._done.values())
        text = sum(b for _, b in self._done.values())
        progress_dir = os.path.join(self.staging, "progress")
        for name in _names(progress_dir):
            i = _index(name)
            if i is None or i in self._done or not name.endswith(".json") or i >= len(self.weights):
                continue
            p = _read_json(os.path.join(progress_dir, name))
            docs += p.get("documents", 0)
            text += p.get("text_bytes", 0)
            mb += min(p.get("input_bytes", 0), self.weights[i]) / 1e6
        shards = sum(1 for n in _names(os.path.join(self.staging, "shards")) if n.endswith(".mds.zstd"))
        return {"mb": min(mb, self.total_mb), "documents": docs, "text_mb": text / 1e6, "units": len(self._done),
                "shards": shards}  # fmt: skip

    def _postfix(self, s: dict[str, float]) -> str:
        # the bar counts input bytes (known up front, so it has an ETA); text MB/s is what the encoder does
        rate = (s["text_mb"] - self.initial_text_mb) / max(time.time() - self._t0, 1e-9)
        return (
            f", {int(s['documents']):,} docs, {s['text_mb']:.1f} MB text at {rate:.1f} MB/s, "
            f"units {int(s['units'])}/{len(self.weights)}, shards {int(s['shards'])}"
        )

    def line(self, s: dict[str, float] | None = None) -> str:
        """The state as one line: '[convert]: 45% 48.6/108.0 MB [00:03<00:04, 14.20MB/s, 1,048 docs, ...]'."""
        from tqdm import tqdm

        s = s or self.snapshot()
        return tqdm.format_meter(
            s["mb"], self.total_mb, time.time() - self._t0, unit="MB", initial=self.initial_mb,
            prefix="[convert]", postfix=self._postfix(s)[2:], bar_format=LOG_FORMAT,
        )  # fmt: skip

    def _show(self, s: dict[str, float]) -> None:
        self._last = s
        if self._bar is not None:
            self._bar.set_postfix_str(self._postfix(s)[2:], refresh=False)
            self._bar.update(max(0.0, s["mb"] - self._bar.n))
            self._bar.refresh()

    def _run(self) -> None:
        last_log = time.time()
        while not self._stop.wait(self.interval):
            s = self.snapshot()
            self._show(s)
            if self._bar is None and time.time() - last_log >= self.log_every_s:  # logs: a line every ~10 s
                self.stream.write(self.line(s) + "\n")
                self.stream.flush()
                last_log = time.time()

    def start(self) -> None:
        if self._tty:
            from tqdm import tqdm

            self._bar = tqdm(
                total=self.total_mb, initial=self.initial_mb, unit="MB", desc="[convert]", file=self.stream,
                bar_format=BAR_FORMAT, dynamic_ncols=True, mininterval=self.interval,
            )  # fmt: skip
        self._thread.start()

    def stop(self, manifest: dict | None = None) -> None:
        """End the bar: with a finished run's manifest, its final numbers; else the last state seen.

        (Staging is gone once the run is committed, so the end cannot be read from it.) A no-op
        when the bar never started or already stopped.
        """
        if not self._thread.is_alive():
            return
        self._stop.set()
        self._thread.join(timeout=2)
        s = self._last
        if manifest is not None:
            c = manifest["counts"]
            s = {"mb": self.total_mb, "documents": c["documents_read"], "text_mb": c["bytes"] / 1e6,
                 "units": len(self.weights), "shards": len(manifest["shards"])}  # fmt: skip
        if self._bar is not None:
            self._show(s)
            self._bar.close()
        else:
            self.stream.write(self.line(s) + "\n")
            self.stream.flush()


def _names(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _index(name: str) -> int | None:
    """'unit-000007.json' -> 7."""
    stem = name.split(".", 1)[0]
    return int(stem[5:]) if stem.startswith("unit-") and stem[5:].isdigit() else None


def _read_json(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            d = json.loads(f.read())
    except (OSError, ValueError):
        return {}
    return d if isinstance(d, dict) else {}
