"""`metrics.jsonl`: every metric a run logs, one JSON line per trained batch and one per evaluation.

A Composer LoggerDestination, so it sees what TensorBoard, wandb and MLflow see, under the same
names (`loss/train/total`, `metrics/train/BitsPerByte`, `metrics/eval/BitsPerByte`,
`lr-AdamW/group0`, `throughput/bytes_per_sec`, ...), plus where the run is:

    {"kind": "start", "batch": 0, "time": 1732512345.1, "world_size": 1}
    {"kind": "train", "batch": 1, "samples": 8, "bytes": 5312, "loss/train/total": 6.1, ...}
    {"kind": "eval", "batch": 20, "samples": 160, "bytes": 101234, "metrics/eval/BitsPerByte": 3.4, ...}

`batch` counts trained batches (the line of batch k is written once batch k is done), `bytes` the
text bytes predicted so far over every rank. Composer logs a batch's metrics at several events and
with steps that differ by one (the loss before the batch counter moves, the learning rate after),
so lines are cut at events instead: everything logged from one BATCH_START to the next is that
batch's line, and everything between EVAL_START and EVAL_END the evaluation's. A resumed session
appends after a "start" line; `read_metrics` keeps, for each batch, the last session's values.
Only global rank 0 writes.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from composer.core import State
from composer.loggers import Logger, LoggerDestination

from hbpe.schemas.errors import ConfigError

METRICS_FILE = "metrics.jsonl"


def _scalar(value: Any) -> float | None:
    """A logged value as a float, or None for what is not one number (tensors of several values, strings)."""
    try:
        if hasattr(value, "numel") and value.numel() != 1:
            return None
        out = float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


class MetricsFile(LoggerDestination):
    """Writes `path` (JSON lines); `append` continues an earlier session's file (autoresume, load_path)."""

    def __init__(self, path: str, *, append: bool) -> None:
        super().__init__()
        self.path, self.append = path, append
        self._file: Any = None
        self._train: dict[str, Any] | None = None
        self._eval: dict[str, Any] | None = None
        self._bytes = 0  # predicted text bytes so far, over every rank

    def fit_start(self, state: State, logger: Logger) -> None:
        from composer.utils import dist

        resumed_at = int(state.timestamp.batch)
        self._bytes = _bytes_at(self.path, resumed_at) if self.append and resumed_at else 0
        if dist.get_global_rank() != 0:
            return
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        self._file = open(self.path, "a" if self.append else "w", encoding="utf-8")  # noqa: SIM115 (open until close)
        self._write({"kind": "start", "batch": resumed_at, "time": time.time(), "world_size": dist.get_world_size()})

    def batch_start(self, state: State, logger: Logger) -> None:
        self._flush_train()
        self._train = {}

    def batch_end(self, state: State, logger: Logger) -> None:
        from composer.utils import dist

        # every rank runs BATCH_END, so the sum over ranks is a safe collective here
        nbytes = state.device.tensor_to_device(state.batch["target_bytes"].sum().reshape(1).long())
        dist.all_reduce(nbytes)
        self._bytes += int(nbytes.item())
        if self._train is not None:
            self._train.update(self._where("train", state))

    def eval_start(self, state: State, logger: Logger) -> None:
        self._flush_train()
        self._eval = self._where("eval", state)

    def eval_end(self, state: State, logger: Logger) -> None:
        if self._eval is not None:
            self._write(self._eval)
        self._eval = None

    def fit_end(self, state: State, logger: Logger) -> None:
        self._flush_train()

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        target = self._eval if self._eval is not None else self._train
        if target is None:
            return
        for key, value in metrics.items():
            if key.startswith("time/"):  # batch and samples come from the state, at the right event
                continue
            v = _scalar(value)
            if v is not None:
                target[key] = v

    def close(self, state: State, logger: Logger) -> None:
        self._flush_train()
        if self._file is not None:
            self._file.close()
            self._file = None

    def _where(self, kind: str, state: State) -> dict[str, Any]:
        ts = state.timestamp
        return {"kind": kind, "batch": int(ts.batch), "samples": int(ts.sample), "bytes": self._bytes}

    def _flush_train(self) -> None:
        if self._train and "batch" in self._train:  # a batch that reached BATCH_END
            self._write(self._train)
        self._train = None

    def _write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            return
        head = {k: record[k] for k in ("kind", "batch", "samples", "bytes") if k in record}
        self._file.write(json.dumps({**head, **record}) + "\n")
        self._file.flush()  # a killed run keeps every line written before


def _bytes_at(path: str, batch: int) -> int:
    """The bytes count of the last train line at or before `batch` in an earlier session's file (0 if none)."""
    best = 0
    for rec in _records(path, Counter()):
        if rec.get("kind") == "train" and rec["batch"] <= batch:
            best = rec.get("bytes", 0)
    return best


# what a line may hold: anything past these is damage (an edit, a bad disk), never a run's number; a line
# with every metric of a large model's optimizer_monitor is tens of KB
MAX_LINE_BYTES = 1 << 20
MAX_FILE_BYTES = 256 << 20  # half a million batches of ~500 bytes; every record is kept in memory to plot
_COUNTS = {"batch": 10**10, "samples": 10**15, "bytes": 10**18}  # whole numbers 0..this
_LOSSES = ("loss/train/total", "metrics/train/BitsPerByte", "metrics/eval/LossPerSymbol", "metrics/eval/BitsPerByte")
MAX_LOSS = 1e6  # nats or bits: a uniform guess over 2**20 symbols is 14 nats; a diverged run a few thousand
CUT_SHORT = "cut short"  # the last line without its newline: a run writing it, or one a kill stopped


def _problem(rec: Any) -> str | None:
    """Why a parsed line is no record of a run (None: it is one): a record holds a whole `batch` and sane numbers."""
    if not isinstance(rec, dict):
        return "not a JSON object"
    for key, top in _COUNTS.items():  # every line has its batch; a start line has no samples or bytes
        value = rec.get(key, 0 if key != "batch" else None)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
            return "value out of range"
    for key in _LOSSES:
        value = rec.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_LOSS:
            return "value out of range"  # NaN fails the comparison too
    return None


def _parse(raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """One line -> (its record, None), (None, why it is damaged), or (None, None) for a blank line."""
    if len(raw) > MAX_LINE_BYTES:
        return None, "too long"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not UTF-8"
    if not text.strip():
        return None, None
    try:
        rec = json.loads(text)
    except json.JSONDecodeError:
        return None, "not JSON"
    except RecursionError:  # json's parser recurses once per [ or {
        return None, "nested too deep"
    why = _problem(rec)
    return (None, why) if why else (rec, None)


def _lines(f: Any) -> Iterator[tuple[bytes, bool]]:
    """(line, whether it ended with a newline) of a binary file; a line over MAX_LINE_BYTES is read in bounded
    pieces and comes back as its first MAX_LINE_BYTES + 1 bytes."""
    while line := f.readline(MAX_LINE_BYTES + 1):
        ended = line.endswith(b"\n")
        if not ended and len(line) > MAX_LINE_BYTES:
            while (rest := f.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                pass  # skip the rest of a too-long line
            ended = bool(rest)
        yield line.rstrip(b"\r\n"), ended


def _records(path: str, skipped: Counter[str]) -> list[dict[str, Any]]:
    """The records of a metrics file, in order; each damaged line counted in `skipped` under why."""
    try:
        f = open(path, "rb")  # noqa: SIM115 (closed below; bytes: one bad byte spoils its line only)
    except FileNotFoundError:
        return []
    out = []
    with f:
        for raw, ended in _lines(f):
            rec, why = _parse(raw)
            if why is not None:
                skipped[why if ended or why == "too long" else CUT_SHORT] += 1
            elif rec is not None:
                out.append(rec)
    return out


def read_metrics(path: str) -> dict[str, Any]:
    """{"train": [...], "eval": [...], "skipped": {why: lines}}, each list sorted by batch; a batch logged by several
    sessions (a resumed run redoes the batches after its checkpoint) keeps the last session's line.

    A damaged line (not UTF-8, not a JSON object, too long or nested too deep, a batch that is no whole number or a
    loss that is no sane number) is skipped and counted under why; ConfigError for a file over MAX_FILE_BYTES.
    """
    size = os.path.getsize(path)
    if size > MAX_FILE_BYTES:
        raise ConfigError(
            f"{path} is {size} bytes, more than hbpe reads from a metrics file ({MAX_FILE_BYTES >> 20} MiB): a "
            f"run's lines are a few hundred bytes each; plot a copy of its last lines, e.g. tail -n 100000 {path} > "
            "/tmp/metrics.jsonl && hbpe plot --checkpoint /tmp/metrics.jsonl"
        )
    skipped: Counter[str] = Counter()
    by_kind: dict[str, dict[int, dict[str, Any]]] = {"train": {}, "eval": {}}
    for rec in _records(path, skipped):
        if rec.get("kind") in by_kind:
            by_kind[rec["kind"]][rec["batch"]] = rec
    out: dict[str, Any] = {kind: [recs[b] for b in sorted(recs)] for kind, recs in by_kind.items()}
    out["skipped"] = dict(skipped)
    return out
