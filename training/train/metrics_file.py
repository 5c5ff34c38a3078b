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
from typing import Any

from composer.core import State
from composer.loggers import Logger, LoggerDestination

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
    for rec in _records(path):
        if rec.get("kind") == "train" and rec.get("batch", math.inf) <= batch:
            best = int(rec.get("bytes", 0))
    return best


def _records(path: str) -> list[dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line a kill cut short
        if isinstance(rec, dict):
            out.append(rec)
    return out


def read_metrics(path: str) -> dict[str, list[dict[str, Any]]]:
    """{"train": [...], "eval": [...]}, each sorted by batch; a batch logged by several sessions (a resumed
    run redoes the batches after its checkpoint) keeps the last session's line."""
    by_kind: dict[str, dict[int, dict[str, Any]]] = {"train": {}, "eval": {}}
    for rec in _records(path):
        kind, batch = rec.get("kind"), rec.get("batch")
        if kind in by_kind and isinstance(batch, int):
            by_kind[kind][batch] = rec
    return {kind: [recs[b] for b in sorted(recs)] for kind, recs in by_kind.items()}
