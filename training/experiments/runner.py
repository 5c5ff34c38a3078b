"""Run an experiment: prepare its data, train every run at the same byte budget, evaluate, report.

OUT/
  data/            the held-out split, a tokenizer and train/eval shards per first stage
  runs/NAME/       train/ (checkpoint, hbpe_run.json, train.log) and result.json
  results.json     every run's result, the spec, BPB at equal training bytes and FLOPs
  table.md         the paper's Table 1 form
  *.png            the plots the spec asks for (training curves, vocabulary, S)

A rerun skips every run whose result.json was written for the same run spec, data and budget
(its fingerprint); one written for another spec is refused rather than mixed into the table.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from composer import Callback, Logger, State

from hbpe.schemas.errors import ConfigError
from hbpe.training.experiments.data_prep import StageData, prepare
from hbpe.training.experiments.spec import ExperimentSpec, RunSpec

log = logging.getLogger(__name__)
RESULT_FILE = "result.json"
STATS_SAMPLES = 256  # samples of the training shards that measure each run's patching (FLOPs, fertility)


class EvalCurve(Callback):
    """Held-out BPB at every evaluation, with the training bytes seen so far: the training curve."""

    def __init__(self) -> None:
        self.bytes = 0
        self.points: list[dict[str, float]] = []

    def batch_end(self, state: State, logger: Logger) -> None:
        self.bytes += int(state.batch["target_bytes"].sum())

    def eval_end(self, state: State, logger: Logger) -> None:
        metrics = state.eval_metrics.get("eval", {})
        if "BitsPerByte" in metrics:
            self.points.append(
                {
                    "batch": int(state.timestamp.batch),
                    "train_bytes": self.bytes,
                    "bpb": float(metrics["BitsPerByte"].compute()),
                }
            )


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def train_config(spec: ExperimentSpec, run: RunSpec, stage: StageData, run_dir: Path, out: Path) -> dict[str, Any]:
    """The `hbpe train` config of one run (a dict, as a YAML config would read)."""
    model = dict(run.model)
    if run.entropy_from:
        model["entropy_model"] = str(out / "runs" / run.entropy_from / "train" / "latest-rank0.pt")
    data = {"train": str(stage.train), "eval": str(stage.eval), "tokenizer": str(stage.tokenizer)}
    if run.max_patch_size is not None:
        data["max_patch_size"] = run.max_patch_size
    cfg = {
        "run_name": f"{spec.name}-{run.name}",
        "seed": spec.seed,
        "model_size": spec.model_size,
        "model": model,
        "data": data,
        "optim": {"lr": spec.lr, "warmup": f"{spec.warmup}ba"},
        "global_batch_size": spec.global_batch_size,
        "max_duration": f"{spec.batches}ba",
        "eval_interval": f"{max(spec.batches // spec.eval_points, 1)}ba",
        "eval_subset_num_batches": spec.eval_batches,
        "save_folder": str(run_dir / "train"),
        "save_interval": f"{spec.batches}ba",
        "save_num_checkpoints_to_keep": 1,
        "save_overwrite": True,  # an interrupted attempt of this run is replaced, never resumed half-way
        "console": False,
    }
    return _merge(cfg, spec.extra)


def _fingerprint(spec: ExperimentSpec, run: RunSpec) -> str:
    fp = spec.run_fingerprint(run)
    if run.entropy_from:  # the entropy model is that run's result: its spec is part of this one's
        src = next(r for r in spec.runs if r.name == run.entropy_from)
        fp += "+" + _fingerprint(spec, src)
    return fp


def finished_result(run_dir: Path, fingerprint: str) -> dict[str, Any] | None:
    path = run_dir / RESULT_FILE
    if not path.is_file():
        return None
    result = json.loads(path.read_text())
    if result.get("fingerprint") != fingerprint:
        raise ConfigError(
            f"{path} was written by another spec of run {run_dir.name} (another budget, model or corpus); "
            f"use another --out, or delete {run_dir} to run it again"
        )
    return result


def run_one(spec: ExperimentSpec, run: RunSpec, stage: StageData, out: Path) -> dict[str, Any]:
    """Train one run, evaluate it on the held-out shards, measure its patching and FLOPs."""
    from hbpe.schemas.train_config import ModelConfig, TrainConfig
    from hbpe.training.scheme_stats import count_words, measure, read_token_rows, table1_row
    from hbpe.training.schemes import build_scheme, vocabulary_bytes
    from hbpe.training.trainer import build_run

    run_dir = out / "runs" / run.name
    cfg = TrainConfig.from_dict(train_config(spec, run, stage, run_dir, out))
    curve = EvalCurve()
    built = build_run(cfg, callbacks=[curve])
    t = time.perf_counter()
    built.trainer.fit()
    wall = time.perf_counter() - t
    points = list(curve.points)  # the final evaluation below is the table's BPB, not a point of the curve
    built.trainer.eval(subset_num_batches=spec.final_eval_batches)  # the same held-out samples for every run
    final = {k: float(v.compute()) for k, v in built.trainer.state.eval_metrics["eval"].items()}
    built.trainer.close()

    model_cfg = ModelConfig.from_dict(built.info["model"])  # entropy: with the threshold chosen on the shards
    tok = built.tokenizer
    tokens = read_token_rows(str(stage.train), tok, samples=STATS_SAMPLES)
    entropy = None
    if model_cfg.io == "entropy":
        from hbpe.training.entropy_model import EntropyModel

        entropy = EntropyModel.load(model_cfg.entropy_model)
    scheme = build_scheme(model_cfg, tok, derive=True, entropy_model=entropy)
    stats = measure(scheme, model_cfg.io, tokens, count_words(tokens, vocabulary_bytes(tok)))
    row = table1_row(model_cfg, tok, stats, input_bytes=8192)
    train_flops_per_byte = 3 * row["gflops"]["total"] * 1e9 / 8192  # forward + backward, the paper's count
    for p in points:
        p["train_flops"] = p["train_bytes"] * train_flops_per_byte
    return {
        "name": run.name,
        "first_stage": run.first_stage,
        "first_stage_vocab": tok.encoding.max_token_value + 1,
        "max_patch_size": tok.max_patch_size,
        **row,
        "model": built.info["model"],
        "bpb": final["BitsPerByte"],
        "final_eval_batches": spec.final_eval_batches,
        "train_bytes": curve.bytes,
        "train_flops": curve.bytes * train_flops_per_byte,
        "train_seconds": wall,
        "train_bytes_per_sec": built.meter.summary()["bytes_per_sec"],
        "curve": points,
        # unbounded entropy patches longer than byte_patching.UNBOUNDED_SAFETY_LIMIT, in the measured samples
        "forced_splits": getattr(scheme, "forced_splits", 0),
    }


def run_experiment(
    spec: ExperimentSpec,
    out: str | Path,
    *,
    on_event: Callable[[str], None] = log.info,
    progress: bool = True,
    pipeline_args: list[str] | None = None,
) -> dict[str, Any]:
    """Every run of `spec` (finished ones skipped), then results.json, table.md and the plots in `out`."""
    from hbpe.training.experiments.report import write_report

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    on_event(f"{spec.name}: preparing data in {out / 'data'}")
    data = prepare(spec, out, progress=progress, pipeline_args=pipeline_args)
    results = []
    for i, run in enumerate(spec.runs, 1):
        run_dir = out / "runs" / run.name
        fingerprint = _fingerprint(spec, run)
        result = finished_result(run_dir, fingerprint)
        if result is not None:
            on_event(f"[{i}/{len(spec.runs)}] {run.name}: finished earlier, BPB {result['bpb']:.4f} (skipped)")
        else:
            on_event(f"[{i}/{len(spec.runs)}] {run.name}: training {spec.batches} batches ({run.model.get('io')})")
            result = {**run_one(spec, run, data[run.first_stage], out), "fingerprint": fingerprint}
            tmp = run_dir / (RESULT_FILE + ".partial")
            tmp.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
            tmp.replace(run_dir / RESULT_FILE)
            on_event(
                f"[{i}/{len(spec.runs)}] {run.name}: BPB {result['bpb']:.4f} after {result['train_bytes'] / 1e6:.2f} MB "
                f"in {result['train_seconds']:.0f} s"
            )
        results.append(result)
    return write_report(spec, results, out)
