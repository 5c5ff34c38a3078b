"""What the functions of `hbpe.api` return: small frozen dataclasses.

Each holds the figures one reads first as typed fields (`hbpe.evaluate(...).bpb`) and the library's whole report,
which `as_dict()` gives back as the plain dict the command's `--json` prints (a copy: changing it changes nothing
here). `from_report` builds one from that dict.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Self


@dataclass(frozen=True, kw_only=True)
class Result:
    """The library's report of one call; subclasses add its headline figures as fields."""

    report: Mapping[str, Any] = field(repr=False)

    @classmethod
    def from_report(cls, r: Mapping[str, Any]) -> Self:
        """Each headline field from the report's key of the same name; a subclass whose fields are computed
        from the report overrides this."""
        return cls(report=r, **{f.name: r[f.name] for f in fields(cls) if f.name != "report"})

    def as_dict(self) -> dict[str, Any]:
        """The whole report as plain JSON-ready data: what the command's `--json` prints."""
        return copy.deepcopy(dict(self.report))

    def __getitem__(self, key: str) -> Any:
        """`result["bpb"]`, as when these functions returned dicts: still answered from the report, with a
        DeprecationWarning naming the typed field or `as_dict()`, so code written for the dicts keeps running."""
        import warnings

        typed = key in {f for f in self.__dataclass_fields__ if f != "report"}
        use = f".{key}" if typed else f".as_dict()[{key!r}]"
        warnings.warn(f"{type(self).__name__}[{key!r}] is deprecated: use {use}", DeprecationWarning, stacklevel=2)
        return copy.deepcopy(self.report[key])


@dataclass(frozen=True, kw_only=True)
class ConvertResult(Result):
    """`hbpe.convert`: the manifest written beside the shards (`report`), and its counts."""

    documents_read: int
    documents_written: int
    documents_rejected: int
    samples: int
    shards: int
    seq_len: int
    bytes_per_patch: float

    @classmethod
    def from_report(cls, manifest: Mapping[str, Any]) -> Self:
        c = manifest["counts"]
        return cls(
            report=manifest,
            documents_read=c["documents_read"],
            documents_written=c["documents_written"],
            documents_rejected=c["documents_rejected"],
            samples=c["samples"],
            shards=len(manifest["shards"]),
            seq_len=manifest["seq_len"],
            bytes_per_patch=manifest["statistics"]["bytes_per_patch"],
        )


@dataclass(frozen=True, kw_only=True)
class TrainResult(Result):
    """`hbpe.train`: the run's summary (`hbpe train --json`)."""

    batches: int
    eval_bpb: float | None  # the final evaluation's bits per byte; None without eval data
    save_folder: str
    device: str
    params: int
    wall_s: float

    @classmethod
    def from_report(cls, r: Mapping[str, Any]) -> Self:
        return cls(
            report=r,
            batches=r["batches"],
            eval_bpb=(r.get("eval") or {}).get("BitsPerByte"),
            save_folder=r["save_folder"],
            device=r["device"],
            params=r["params"],
            wall_s=r["wall_s"],
        )


@dataclass(frozen=True, kw_only=True)
class EvalResult(Result):
    """`hbpe.evaluate`: bits per byte and patch sizes on a shard directory (`hbpe eval --json`)."""

    bpb: float
    loss_per_symbol: float
    bytes_per_patch: float
    symbols_per_patch: float
    bytes: int


@dataclass(frozen=True, kw_only=True)
class TaskScores(Result):
    """`hbpe.score_tasks`: zero-shot accuracy per task (`hbpe eval-tasks --json`; `report["tasks"]` has the rest)."""

    accuracy: Mapping[str, float]
    limit: int | None

    @classmethod
    def from_report(cls, r: Mapping[str, Any]) -> Self:
        return cls(report=r, accuracy={name: t["acc"] for name, t in r["tasks"].items()}, limit=r["limit"])


@dataclass(frozen=True, kw_only=True)
class ExportResult(Result):
    """`hbpe.export`: the model directory written (`hbpe export --json`)."""

    out: str
    format: str
    parameters: int
    tensors: int
    bytes: int


@dataclass(frozen=True, kw_only=True)
class PlotResult(Result):
    """`hbpe.plot`: the image written from a run's metrics.jsonl (`hbpe plot --json`)."""

    out: str
    train_points: int
    eval_points: int
    last_batch: int
    final_eval_bpb: float | None
