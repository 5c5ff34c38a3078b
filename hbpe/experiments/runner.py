"""Run an experiment: prepare its data, train every run at the same byte budget, evaluate, report.

OUT/
  data/            the held-out split, a tokenizer and train/eval shards per first stage
  runs/NAME/       train/ (checkpoint, hbpe_run.json, train.log) and result.json (runs/NAME/seed-K/ with seeds: N > 1)
  results.json     every run's result (every seed), the spec, BPB at equal training bytes and at equal spent compute
  table.md         the paper's Table 1 form
  *.png            the plots the spec asks for (training curves, vocabulary, S)
  .lock            held while an experiment runs here (out_folder.py)

A rerun skips every run whose result.json was written for the same run spec, data and budget
(its fingerprint) from the same bytes (the corpora and rank files: its `inputs`, data_prep.py);
one made from other bytes is trained again, one written for another spec is refused rather
than mixed into the table.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from composer import Callback, Logger, State

from hbpe.experiments.compute import context_row, executed_batch_flops, paper_train_flops_per_byte
from hbpe.experiments.data_prep import StageData, corpus_files, prepare
from hbpe.experiments.eval_noise import describe_eval_set
from hbpe.experiments.inputs import combine
from hbpe.experiments.out_folder import claim
from hbpe.experiments.report import write_report
from hbpe.experiments.seeds import run_folder, seed_values
from hbpe.experiments.spec import ExperimentSpec, RunSpec
from hbpe.schemas.errors import ConfigError
from hbpe.schemas.train_config import ModelConfig, TrainConfig
from hbpe.training import (
    build_run,
    check_finite_bpb,
    count_words,
    measure,
    read_token_rows,
    scheme_for,
    table1_row,
    vocabulary_bytes,
)
from hbpe.training.train.config_io import local_places
from hbpe.training.train.host_counts import HOST_BYTES

log = logging.getLogger(__name__)
RESULT_FILE = "result.json"
STATS_SAMPLES = 256  # samples of the training shards that measure each run's patching (FLOPs, fertility)


class EvalCurve(Callback):
    """Held-out BPB at every evaluation, with the training bytes and executed FLOPs so far: the training curve.

    Also each evaluation's summed NLL and target bytes per eval batch (one block of the eval set each,
    eval_noise.py: what the bootstrap over documents resamples; microbatches of a batch are added up),
    and each training batch's bytes per second (their median is the run's throughput: robust to the
    stalls of shared cores, which a total-bytes-over-total-seconds rate is not).
    """

    def __init__(self) -> None:
        self.bytes = 0
        self.executed_flops = self.pad_flops = 0.0
        self.points: list[dict[str, Any]] = []
        self.batch_nll: list[float] = []  # the latest evaluation's, one per eval batch
        self.batch_bytes: list[int] = []
        self.rates: list[float] = []  # training bytes per second, one per batch after the first
        self._t0 = 0.0

    def batch_start(self, state: State, logger: Logger) -> None:
        self._t0 = time.perf_counter()

    def batch_end(self, state: State, logger: Logger) -> None:
        nbytes = _batch_bytes(state.batch)
        if int(state.timestamp.batch) > 1:  # the first batch pays warm-up costs
            self.rates.append(nbytes / max(time.perf_counter() - self._t0, 1e-9))
        self.bytes += nbytes
        flops = executed_batch_flops(state)
        self.executed_flops += flops["executed"]
        self.pad_flops += flops["pad"]

    def eval_start(self, state: State, logger: Logger) -> None:
        self.batch_nll, self.batch_bytes = [], []

    def eval_batch_start(self, state: State, logger: Logger) -> None:
        self.batch_nll.append(0.0)
        self.batch_bytes.append(0)

    def eval_after_forward(self, state: State, logger: Logger) -> None:
        self.batch_nll[-1] += float(state.outputs["nll_sum"])
        self.batch_bytes[-1] += _batch_bytes(state.batch)

    def eval_end(self, state: State, logger: Logger) -> None:
        metrics = state.eval_metrics.get("eval", {})
        if "BitsPerByte" in metrics:
            self.points.append(
                {
                    "batch": int(state.timestamp.batch),
                    "train_bytes": self.bytes,
                    "train_flops_executed": self.executed_flops,
                    "bpb": float(metrics["BitsPerByte"].compute()),
                    # per block of the eval set (eval_noise.py): what a document bootstrap of k, its slope and
                    # the gap along training resamples, paired across runs
                    "eval_batch_nll": list(self.batch_nll),
                    "eval_batch_bytes": list(self.batch_bytes),
                }
            )


def eval_set_samples(spec: ExperimentSpec) -> int:
    """The samples of the experiment's eval set: `final_eval_batches` blocks of one batch (eval_noise.py)."""
    return spec.final_eval_batches * spec.global_batch_size


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def train_config(
    spec: ExperimentSpec, run: RunSpec, stage: StageData, run_dir: Path, out: Path, seed: int | None = None
) -> dict[str, Any]:
    """The `hbpe train` config of one run at one seed (a dict, as a YAML config would read)."""
    seed = spec.seed if seed is None else seed
    model = dict(run.model)
    if run.entropy_from:  # the bytes run of the same seed (its copy on the entropy corpus, when the spec has one)
        src = run_folder(out, entropy_source(spec, run).name, seed, spec.seeds)
        model["entropy_model"] = str(src / "train" / "latest-rank0.pt")
    # the seed sets the sample order too: the runs of one seed read the same samples
    data = {"train": str(stage.train), "eval": str(stage.eval), "tokenizer": str(stage.tokenizer), "shuffle_seed": seed}
    data["eval_samples"] = eval_set_samples(spec)  # one fixed set spread over the held-out split, every run
    if run.max_patch_size is not None:
        data["max_patch_size"] = run.max_patch_size
    cfg = {
        "run_name": f"{spec.name}-{run.name}",
        "seed": seed,
        "model_size": spec.model_size,
        "model": model,
        "data": data,
        "optim": {"lr": spec.run_lr(run), "warmup": f"{spec.warmup}ba", "schedule": spec.schedule},
        "global_batch_size": spec.global_batch_size,
        "max_duration": f"{spec.batches}ba",
        "eval_interval": f"{max(spec.batches // spec.eval_points, 1)}ba",
        "eval_subset_num_batches": spec.eval_batches,  # the eval set's first blocks: spread too (eval_noise.py)
        "save_folder": str(run_dir / "train"),
        "save_interval": f"{spec.batches}ba",
        "save_num_checkpoints_to_keep": 1,
        "save_overwrite": True,  # an interrupted attempt of this run is replaced, never resumed half-way
        "console": False,
    }
    return _merge(cfg, spec.extra)


ENTROPY_CORPUS_SUFFIX = "-entropy-corpus"


def entropy_source(spec: ExperimentSpec, run: RunSpec) -> RunSpec:
    """The run whose final checkpoint is `run`'s entropy model: its `entropy_from` run, or, with the spec's
    entropy_corpus, a copy of it named NAME-entropy-corpus trained on that corpus (not a row of the table)."""
    import dataclasses

    src = next(r for r in spec.runs if r.name == run.entropy_from)
    return dataclasses.replace(src, name=src.name + ENTROPY_CORPUS_SUFFIX) if spec.entropy_corpus else src


def _entropy_jobs(spec: ExperimentSpec) -> list[RunSpec]:
    """The entropy-corpus copies to train before the runs of a seed (none without an entropy_corpus)."""
    if not spec.entropy_corpus:
        return []
    names = dict.fromkeys(r.entropy_from for r in spec.runs if r.entropy_from)
    return [entropy_source(spec, next(r for r in spec.runs if r.entropy_from == n)) for n in names]


def _fingerprint(spec: ExperimentSpec, run: RunSpec, seed: int | None = None) -> str:
    # one seed's result does not depend on how many seeds the experiment has: more seeds reuse it
    import dataclasses

    if seed is not None and (seed, 1) != (spec.seed, spec.seeds):
        spec = dataclasses.replace(spec, seed=seed, seeds=1)
    fp = spec.run_fingerprint(run)
    if run.entropy_from:  # the entropy model is that run's result: its spec is part of this one's
        src = entropy_source(spec, run)
        fp += "+" + _fingerprint(spec, src)
    return fp


def _inputs(spec: ExperimentSpec, run: RunSpec, data: dict[str, StageData]) -> str:
    """The key of the bytes a run's result comes from: its first stage's data, and its entropy model's."""
    keys = [data[run.first_stage].inputs]
    if run.entropy_from:
        keys.append(_inputs(spec, entropy_source(spec, run), data))
    return combine(*keys)


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


def run_one(
    spec: ExperimentSpec, run: RunSpec, stage: StageData, out: Path, seed: int | None = None, *, progress: bool = False
) -> dict[str, Any]:
    """Train one run at one seed, evaluate it on the held-out shards, measure its patching and FLOPs.

    `progress`: the run's training progress line on stderr (training/train/callbacks.py: TrainProgress).
    """

    seed = spec.seed if seed is None else seed
    run_dir = run_folder(out, run.name, seed, spec.seeds)
    cfg = TrainConfig.from_dict({**train_config(spec, run, stage, run_dir, out, seed), "console": progress})
    check_inside_out(cfg, out)  # check_runs did, before the data was made: here for a caller of run_one alone
    curve = EvalCurve()
    built = build_run(cfg, callbacks=[curve])
    add_evaluations(built.trainer, early_eval_batches(spec))
    t = time.perf_counter()
    built.trainer.fit()
    wall = time.perf_counter() - t
    points = list(curve.points)  # the final evaluation below is the table's BPB, not a point of the curve
    # the whole eval set (final_eval_batches blocks, fewer on a small split): the same samples for every run
    built.trainer.eval(subset_num_batches=spec.final_eval_batches)
    final = {k: float(v.compute()) for k, v in built.trainer.state.eval_metrics["eval"].items()}
    built.close()

    where = f"experiment {spec.name}, run {run.name} (in {run_dir})"
    check_finite_bpb(final["BitsPerByte"], where, fix="run it again with a lower lr or more warmup")  # never a row

    model_cfg = ModelConfig.from_dict(built.info["model"])  # entropy: with the threshold chosen on the shards
    tok = built.tokenizer
    tokens = read_token_rows(str(stage.train), tok, samples=STATS_SAMPLES)
    scheme = scheme_for(model_cfg, tok, derive=True)
    stats = measure(scheme, model_cfg.io, tokens, count_words(tokens, vocabulary_bytes(tok)))
    row = table1_row(model_cfg, tok, stats, input_bytes=8192)  # the paper's convention, for its Table 1 only
    # the paper's count at this run's own context (the text bytes of one sample as trained), forward + backward
    ctx = context_row(model_cfg, tok, stats, train_bytes=curve.bytes, samples=spec.batches * spec.global_batch_size)
    paper_per_byte = paper_train_flops_per_byte(ctx)
    for p in points:
        p["train_flops_paper"] = p["train_bytes"] * paper_per_byte
    return {
        "name": run.name,
        "seed": seed,
        "schedule": spec.schedule,
        "lr": spec.run_lr(run),
        "first_stage": run.first_stage,
        "first_stage_vocab": tok.encoding.max_token_value + 1,
        "max_patch_size": tok.max_patch_size,
        **row,
        "model": built.info["model"],
        "bpb": final["BitsPerByte"],
        "final_eval_batches": spec.final_eval_batches,
        "eval_batch_nll": curve.batch_nll,  # the final evaluation's, per block of the eval set (eval_noise.py)
        "eval_batch_bytes": curve.batch_bytes,
        "train_bytes": curve.bytes,
        "context_bytes": ctx["input_bytes"],
        "gflops_context": ctx["gflops"],  # forward, one sample, the paper's count at its own context
        "train_flops_paper": curve.bytes * paper_per_byte,
        "train_flops_executed": curve.executed_flops,
        # packed: only the encoder's all-PAD tail patches
        "pad_share_executed": curve.pad_flops / max(curve.executed_flops, 1.0),
        "local_layout": built.info["model"]["local_layout"],
        "train_seconds": wall,
        "train_bytes_per_sec": built.meter.summary()["bytes_per_sec"],
        "train_bytes_per_sec_median": float(np.median(curve.rates)) if curve.rates else None,
        "curve": points,
        # unbounded entropy patches longer than byte_patching.UNBOUNDED_SAFETY_LIMIT, in the measured samples
        "forced_splits": getattr(scheme, "forced_splits", 0),
    }


def early_eval_batches(spec: ExperimentSpec) -> list[int]:
    """The spec's early evaluations: `early_eval_points` batches spaced evenly in log from the end of the
    warm-up (at least 1) to the first regular point, that point left out.

    >>> from hbpe.experiments.presets import preset
    >>> early_eval_batches(preset("k-along-training"))
    [20, 27, 35, 47, 62, 82, 109, 144]
    """
    n = spec.early_eval_points
    first = max(spec.batches // spec.eval_points, 1)
    start = max(spec.warmup, 1)
    if n < 1 or first <= start:
        return []
    return sorted({int(round(b)) for b in np.geomspace(start, first, n + 1)[:-1]} - {first})


def add_evaluations(trainer: Any, batches: list[int]) -> None:
    """Evaluate also at the end of each of `batches`, besides the trainer's own interval (Composer asks each
    evaluator's `eval_interval(state, event)` at every batch end)."""
    if not batches:
        return
    from composer.core import Event

    extra = frozenset(batches)
    for evaluator in trainer.state.evaluators:
        regular = evaluator.eval_interval

        def either(state: State, event: Event, regular=regular) -> bool:
            return regular(state, event) or (event == Event.BATCH_END and int(state.timestamp.batch) in extra)

        evaluator.eval_interval = either


class RunClock:
    """An experiment's runs done of the total, and the time left at the mean time of the runs trained so far
    (training, eval and measuring; a skipped run costs nothing and is not in the mean)."""

    def __init__(self, total: int) -> None:
        self.total, self.finished = total, 0
        self.seconds: list[float] = []

    def done(self, seconds: float | None = None) -> None:
        self.finished += 1
        if seconds is not None:
            self.seconds.append(seconds)

    def line(self) -> str:
        """'3/10 runs done, about 12:30 left' (no estimate before a run has trained here)."""
        from tqdm import tqdm

        out = f"{self.finished}/{self.total} runs done"
        left = self.total - self.finished
        if left and self.seconds:
            out += f", about {tqdm.format_interval(left * sum(self.seconds) / len(self.seconds))} left"
        return out


def run_experiment(
    spec: ExperimentSpec,
    out: str | Path,
    *,
    on_event: Callable[[str], None] = log.info,
    progress: bool = True,
    pipeline_args: list[str] | None = None,
) -> dict[str, Any]:
    """Every run of `spec` (finished ones skipped), then results.json, table.md and the plots in `out`.

    `out` is this experiment's alone while it runs (out_folder.claim: a second one is refused), and
    a results.json or table.md there that hbpe did not write is refused rather than overwritten.
    """
    out = Path(out)
    check_runs(spec, out)
    with claim(out):
        return _run_experiment(spec, out, on_event=on_event, progress=progress, pipeline_args=pipeline_args)


def check_runs(spec: ExperimentSpec, out: Path) -> None:
    """Every run's train config, and the corpora, checked before anything is written: a bad value in `extra` or
    model_size, or a path out of `out`, fails now, not once the data is made (ConfigError naming the run).

    The configs of one run differ from seed to seed only in the seed (and the seed-K folder): the first and the
    last seed stand for all of them, so the check costs the same for seeds=1 and seeds=1000.
    """
    seeds = seed_values(spec.seed, spec.seeds)
    for seed in dict.fromkeys((seeds[0], seeds[-1])):
        for run in (*_entropy_jobs(spec), *spec.runs):
            folder = out / "data" / run.first_stage  # where prepare makes its data (its form is checked, not made)
            stage = StageData(folder / "tokenizer", folder / "shards-train", folder / "shards-eval")
            run_dir = run_folder(out, run.name, seed, spec.seeds)
            try:
                check_inside_out(TrainConfig.from_dict(train_config(spec, run, stage, run_dir, out, seed)), out)
            except ConfigError as e:
                raise ConfigError(f"experiment {spec.name}, run {run.name}: {e}") from None
    corpus_files(spec)


def check_inside_out(cfg: TrainConfig, out: Path) -> None:
    """Every path a run reads or writes resolves inside `out`, symlinks followed (the runner's own are there: only
    `extra` can name another place, or leave a library's default in the working directory); ConfigError if not."""
    root = out.resolve()
    for key, value, place in local_places(cfg):
        if place is None or not place.is_relative_to(root):
            raise ConfigError(
                f"extra.{key}={value} resolves to {place or 'a bucket'}, outside --out {root}: an experiment reads "
                f"and writes only under its --out; give {key} a path inside it, or remove it from extra"
            )


def _run_experiment(
    spec: ExperimentSpec,
    out: Path,
    *,
    on_event: Callable[[str], None],
    progress: bool,
    pipeline_args: list[str] | None,
) -> dict[str, Any]:

    on_event(f"{spec.name}: preparing data in {out / 'data'}")
    data = prepare(spec, out, progress=progress, pipeline_args=pipeline_args)
    eval_sets = {
        key: describe_eval_set(stage.eval, blocks=spec.final_eval_batches, block=spec.global_batch_size)
        for key, stage in data.items()
    }
    results = []
    # seed by seed, every run of a seed before the next: a stopped experiment leaves complete seeds
    extra = _entropy_jobs(spec)  # trained first in each seed, kept out of the table
    jobs = [(seed, run) for seed in seed_values(spec.seed, spec.seeds) for run in (*extra, *spec.runs)]
    clock = RunClock(len(jobs))
    for i, (seed, run) in enumerate(jobs, 1):
        run_dir = run_folder(out, run.name, seed, spec.seeds)
        fingerprint = _fingerprint(spec, run, seed)
        label = f"[{i}/{len(jobs)}] {run.name}" + (f" (seed {seed})" if spec.seeds > 1 else "")
        result = finished_result(run_dir, fingerprint)
        inputs = _inputs(spec, run, data)
        if result is not None and result.get("inputs") != inputs:  # the same spec over other bytes
            on_event(f"{label}: its corpus or rank file changed since it finished; training it again")
            result = None
        if result is not None:
            clock.done()
            on_event(f"{label}: finished earlier, BPB {result['bpb']:.4f} (skipped); {clock.line()}")
        else:
            on_event(f"{label}: training {spec.batches} batches ({run.model.get('io')})")
            # streaming's copy of the shards an earlier attempt read: of other bytes, the trainer would refuse it
            shutil.rmtree(run_dir / "train" / "stream-cache", ignore_errors=True)
            stage = data[run.first_stage]
            if run in extra:  # an entropy model trained on the entropy corpus's shards
                stage = dataclasses.replace(stage, train=stage.entropy_train)
            started = time.monotonic()
            result = {**run_one(spec, run, stage, out, seed, progress=progress), "fingerprint": fingerprint}
            clock.done(time.monotonic() - started)
            result["inputs"] = inputs
            tmp = run_dir / (RESULT_FILE + ".partial")
            tmp.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
            tmp.replace(run_dir / RESULT_FILE)
            on_event(
                f"{label}: BPB {result['bpb']:.4f} after {result['train_bytes'] / 1e6:.2f} MB "
                f"in {result['train_seconds']:.0f} s; {clock.line()}"
            )
        if run not in extra:
            results.append(result)
    return write_report(spec, results, out, eval_sets)


def _batch_bytes(batch: dict) -> int:
    """The batch's target bytes: the loader's host count (HostCounts) where it made one, no device read."""
    return int(batch[HOST_BYTES]) if HOST_BYTES in batch else int(batch["target_bytes"].sum())
