"""`hbpe convert`: corpus files -> MDS shards, and its launcher.

    units    = plan (files sorted, cut into byte ranges)      # [WorkUnit]
    summary  = units | EncodeUnits                           # UnitSummary per unit (or reused from staging)
    plan     = summaries | ToList | PlanShards               # ShardPlan (singleton)
    entries  = plan.tasks | WriteMdsShards                   # (shard index, MDS entry)
    manifest = entries | ToList | FinalizeOutput             # commit: index, manifest, COMPLETED

Two runners run these steps with the same functions, so their output is byte-identical:
a Beam pipeline (DirectRunner on all local cores, or Dataflow, Flink, Spark, Portable
from standard Beam options, with no code change), and the in-process runner
(inprocess.py) that small local jobs get by default (options.py says when and why).

The launcher checks everything it can before it writes anything (tokenizer, inputs,
options, what the output holds), builds a new output into an empty folder (outputs.py)
and puts it in place only when it is complete. A failure, SIGINT or SIGTERM removes
what the run wrote, stops its worker processes, and leaves a previous output as it was;
with `resume=True`, or when the disk is full, the encoded units are kept instead, and a
later `resume=True` run, after any interruption (SIGKILL included), encodes only the units
still missing, or finishes putting a complete output in place.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hbpe.pipeline import storage
from hbpe.pipeline.beam import fs, stores
from hbpe.pipeline.beam import resume as resuming
from hbpe.pipeline.beam.dask_cluster import check_scheduler, dask_executor
from hbpe.pipeline.beam.finalize import STAGING_DIRNAME, FinalizeContext, finalize_output, replace_output
from hbpe.pipeline.beam.inprocess import run_inprocess
from hbpe.pipeline.beam.monitor import run_and_watch
from hbpe.pipeline.beam.options import (
    DASK,
    RunnerChoice,
    check_runner_args,
    choose_runner,
    default_pipeline_options,
)
from hbpe.pipeline.beam.outputs import (
    Build,
    choose_build,
    glob_base,
    keep_or_discard,
    locked,
    out_of_space,
    output_dir,
    refuse_inside,
)
from hbpe.pipeline.beam.progress_bar import ConvertProgress, unit_input_bytes
from hbpe.pipeline.beam.shard_tasks import plan_shards
from hbpe.pipeline.beam.signals import StopWorkersOnExit, signals_deferred
from hbpe.pipeline.beam.units import UnitSummary, encoded_units, unit_key
from hbpe.pipeline.corpus.documents import RecordPolicy
from hbpe.pipeline.corpus.files import FileInfo, WorkUnit, file_info, plan_units
from hbpe.pipeline.corpus.inputs import SkippedInput, find_inputs, skipped_line
from hbpe.pipeline.tokenizer import artifact
from hbpe.pipeline.tokenizer.hierarchical import HierarchicalTokenizer
from hbpe.schemas.convert_config import ConvertConfig
from hbpe.schemas.errors import ConfigError, HbpeError
from hbpe.schemas.shard_columns import MANIFEST_FILENAME
from hbpe.schemas.tokenizer_artifact import TokenizerSpec

STAGING = STAGING_DIRNAME
log = logging.getLogger("hbpe.convert")

__all__ = [
    "ConversionInterrupted",
    "ConvertPlan",
    "build_pipeline",
    "default_pipeline_options",
    "plan_convert",
    "run_convert",
]


class ConversionInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped the run; its workers were stopped and nothing was committed."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = signum


def build_pipeline(
    p,
    cfg: ConvertConfig,
    units: list[WorkUnit],
    files: list[FileInfo],
    tokenizer_spec: TokenizerSpec,
    started_at: float,
    *,
    output: str | None = None,
    done: dict[int, UnitSummary] | None = None,
    keys: dict[int, str] | None = None,
    timing: dict | None = None,
    skipped_inputs: list[dict] | None = None,
) -> None:
    """Add the conversion's steps to the Beam pipeline `p`; they write into `output` (default cfg.output).

    Units in `done` (encoded by an interrupted run) join the summaries as they are; only the others are encoded.
    """
    import apache_beam as beam

    from hbpe.pipeline.beam.encode import EncodeUnits
    from hbpe.pipeline.beam.write_shards import WriteMdsShards

    done = done or {}
    output = output or cfg.output
    staging = fs.join(output, STAGING)
    tok_dir = fs.join(staging, "tokenizer")
    policy = RecordPolicy(cfg.text_field, cfg.id_field, cfg.invalid_utf8, cfg.max_doc_bytes)
    S = tokenizer_spec.second_stage.max_patch_size
    ctx = _finalize_context(cfg, files, tokenizer_spec, started_at, output, timing or {}, skipped_inputs or [])
    encoded = (
        p
        | "CreateUnits" >> beam.Create([u for u in units if u.index not in done])  # WorkUnit
        | "EncodeUnits" >> EncodeUnits(tok_dir, staging, policy, cfg.text_unit, cfg.encode_batch_docs, keys)
    )  # UnitSummary
    reused = p | "ReusedUnits" >> beam.Create([done[i] for i in sorted(done)])  # UnitSummary
    summaries = (encoded, reused) | "AllUnits" >> beam.Flatten()  # UnitSummary
    unit_list = summaries | "CollectUnits" >> beam.combiners.ToList()  # [UnitSummary]
    plan = unit_list | "PlanShards" >> beam.Map(
        lambda us: plan_shards(us, seq_len=cfg.seq_len, samples_per_shard=cfg.samples_per_shard(S), tail=cfg.tail)
    )  # ShardPlan
    entries = (
        plan
        | "ListShardTasks" >> beam.FlatMap(lambda pl: pl.tasks)  # ShardTask
        | "WriteMdsShards" >> WriteMdsShards(tok_dir, staging, cfg.seq_len, store_patches=cfg.store_patches)
    )
    (
        entries
        | "CollectShards" >> beam.combiners.ToList()  # [(index, entry)]
        | "FinalizeOutput"
        >> beam.Map(
            lambda es, us, pl: finalize_output(es, ctx=ctx, units=us, plan=pl),
            us=beam.pvalue.AsSingleton(unit_list),
            pl=beam.pvalue.AsSingleton(plan),
        )
    )


@dataclass(frozen=True)
class ConvertPlan:
    """What a conversion will do, every check done and nothing written: `plan_convert` makes it, `run_convert`
    carries it out (under the output's lock)."""

    cfg: ConvertConfig
    output: str  # cfg.output as the launcher handles it (outputs.output_dir)
    tok: HierarchicalTokenizer  # loaded whole: the in-process runner uses it as it is
    files: list[FileInfo]
    skipped: list[SkippedInput]  # inputs left out (links to what was read, FIFOs, ...)
    choice: RunnerChoice
    units: list[WorkUnit]
    keys: dict[int, str]  # unit index -> what its encoding depends on (resume reuses a unit only under its key)
    record: dict  # the resume record of this run

    @property
    def skipped_inputs(self) -> list[dict]:
        return [s.to_dict() for s in self.skipped]


def plan_convert(
    cfg: ConvertConfig,
    pipeline_args: list[str] | None = None,
    *,
    runner: str = "auto",
    workers: int | None = None,
    dask_address: str | None = None,
) -> ConvertPlan:
    """The checks `run_convert` makes before it writes anything: stores, tokenizer, inputs, runner, units."""
    output = output_dir(cfg.output)
    beam_args = list(pipeline_args or [])
    check_runner_args(runner, beam_args, workers=workers, dask_address=dask_address)  # before the slow checks
    # every store is reached once, with a deadline, before anything else touches it (Beam's clients
    # retry an unreachable endpoint for minutes); Beam is imported only when a location is remote
    stores.preflight(
        [(cfg.tokenizer, "the tokenizer"), *((p, "the input") for p in cfg.inputs), (output, "the output")], beam_args
    )
    # the whole load, table included, proves the artifact usable (rank-file hash, merges that fit this
    # first stage and S) before any worker starts; the in-process runner then uses it as it is
    tok = artifact.load(cfg.tokenizer)
    refuse_inside(cfg.tokenizer, output, f"--tokenizer {cfg.tokenizer}", cfg.output)
    for pat in cfg.inputs:
        refuse_inside(glob_base(pat), output, f"--input {pat}", cfg.output)
    own = () if fs.is_remote(output) else (output + os.sep,)
    selection = find_inputs(cfg.inputs, excludes=cfg.excludes, skip_prefixes=own)
    files = [file_info(p) for p in selection.paths]
    choice = choose_runner(runner, list(pipeline_args or []), output=output, files=files, workers=workers,
                           dask_address=dask_address)  # fmt: skip
    if choice.dask_address:  # something else there hung distributed's Client: refused before anything is written
        check_scheduler(choice.dask_address)
    units = plan_units(files, split_bytes=cfg.split_bytes, text_unit=cfg.text_unit)
    policy = RecordPolicy(cfg.text_field, cfg.id_field, cfg.invalid_utf8, cfg.max_doc_bytes)
    fingerprint = tok.spec.fingerprint
    keys = {u.index: unit_key(u, files[u.file_index], policy, cfg.text_unit, fingerprint) for u in units}
    record = resuming.make_record(cfg, files, fingerprint, len(units))
    return ConvertPlan(cfg, output, tok, files, list(selection.skipped), choice, units, keys, record)


def run_convert(
    cfg: ConvertConfig,
    pipeline_args: list[str] | None = None,
    *,
    overwrite: bool = False,
    resume: bool = False,
    runner: str = "auto",
    workers: int | None = None,
    dask_address: str | None = None,
    progress: bool = True,
    on_start: Callable[[list[WorkUnit]], None] | None = None,
    on_message: Callable[[str], None] | None = None,
) -> dict:
    """Run the whole conversion; returns the manifest as a dict.

    `runner`: "auto", "inprocess", "dask" (on the scheduler at `dask_address`, or a LocalCluster
    of `workers` processes) or a Beam runner name (options.py); `pipeline_args` are Beam
    options (a `--runner=` among them counts as `runner`). `resume`: continue an interrupted
    run into the same output, and keep this run's encoded units if it is interrupted too.
    `on_message` gets the launcher's lines (the runner chosen and why, a resume, a remote
    job's URL and progress).

    Raises HbpeError on user mistakes and failed runs (nothing committed, a previous output
    intact), ConversionInterrupted (a KeyboardInterrupt) on SIGINT or SIGTERM.
    """

    started = time.time()

    def say(line: str) -> None:
        log.info(line)
        if on_message:
            on_message(line)

    plan = plan_convert(cfg, pipeline_args, runner=runner, workers=workers, dask_address=dask_address)
    pipeline, opts = _beam_pipeline(plan.choice, workers)
    output = plan.output
    with locked(output, cfg.output):  # one conversion at a time decides what the output holds and writes it
        build = choose_build(output, cfg.output, overwrite=overwrite, resume_=resume, record=plan.record)
        if build.finished:  # the interrupted run had converted everything: only putting it in place was left
            say(f"resuming the interrupted conversion: its output in {build.path} is complete; putting it in place")
            _put_in_place(build, output, cfg.output)
            return json.loads(fs.read_bytes(fs.join(output, MANIFEST_FILENAME)))
        ticker = _convert_into(
            plan, build, pipeline, opts, started, resume=resume, progress=progress, on_start=on_start, say=say
        )
        manifest = json.loads(fs.read_bytes(fs.join(build.path, MANIFEST_FILENAME)))
        if ticker is not None:
            ticker.stop(manifest)
        _put_in_place(build, output, cfg.output)
        return manifest


def _beam_pipeline(choice: RunnerChoice, workers: int | None) -> tuple[Any, Any]:
    """(the Beam Pipeline, its options) for a Beam runner; (None, None) for the in-process one."""
    if not choice.beam:
        return None, None
    import apache_beam as beam

    # the stores' endpoints from the environment travel with the pipeline, so its workers reach them too
    opts = default_pipeline_options([*choice.beam_args, *stores.store_args(choice.beam_args)], workers=workers)
    try:
        return beam.Pipeline(options=opts), opts
    except ValueError as e:  # an unknown --runner
        raise ConfigError(f"bad Beam pipeline option: {e}") from None


def _convert_into(
    plan: ConvertPlan,
    build: Build,
    pipeline: Any,
    opts: Any,
    started: float,
    *,
    resume: bool,
    progress: bool,
    on_start: Callable[[list[WorkUnit]], None] | None,
    say: Callable[[str], None],
) -> ConvertProgress | None:
    """Encode, shard and finalize into `build`; returns the progress ticker, still running (None without one).

    On a failure or an interruption the build is kept (resume, a full disk) or discarded, and the error
    says what became of the output."""
    cfg, choice, units = plan.cfg, plan.choice, plan.units
    staging = build.staging
    was = f"; {cfg.output} is as it was" if build.replacing else ""
    guard = StopWorkersOnExit()
    ticker: ConvertProgress | None = None
    try:
        with guard:
            done = _prepare_staging(build, plan.record, plan.keys, units, cfg.tokenizer)
            if on_start:
                on_start(units)
            if choice.deprecation:
                say(choice.deprecation)
            say(choice.describe())
            if plan.skipped:
                say(skipped_line(plan.skipped))
            if build.resumed:
                say(f"resuming the interrupted conversion: {len(done)} of {len(units)} units already encoded")
            timing = {"runner": choice.name, "units_reused": len(done)}
            if progress and not fs.is_remote(staging):  # workers write where the launcher can read
                ticker = ConvertProgress(staging, unit_input_bytes(units, plan.files), reused=done)
            if choice.beam:
                build_pipeline(pipeline, cfg, units, plan.files, plan.tok.spec, started, output=build.path,
                               done=done, keys=plan.keys, timing=timing, skipped_inputs=plan.skipped_inputs)  # fmt: skip
                if ticker:
                    ticker.start()

                run_and_watch(pipeline, opts, n_units=len(units) - len(done), say=say)
            else:
                dask = choice.name == DASK
                with dask_executor(choice.dask_address, choice.workers, say) if dask else contextlib.nullcontext() as executor:  # fmt: skip
                    run_inprocess(
                        plan.tok, cfg, pending=[u for u in units if u.index not in done], done=done, keys=plan.keys,
                        staging=staging, workers=choice.workers,
                        ctx=_finalize_context(cfg, plan.files, plan.tok.spec, started, build.path, timing,
                                              plan.skipped_inputs),
                        on_running=ticker.start if ticker else lambda: None, executor=executor,
                    )  # fmt: skip
    except BaseException as e:
        if ticker is not None:
            ticker.stop()
        kept = keep_or_discard(build, keep=resume, full=out_of_space(e))
        if not isinstance(e, (KeyboardInterrupt, Exception)):
            raise
        interrupted = isinstance(e, KeyboardInterrupt)
        raise _failure(e, f"{cfg.output}{was}", kept, beam=choice.beam, signum=guard.signum) from (
            None if interrupted else e
        )
    return ticker


def _failure(e: BaseException, output: str, kept: str, *, beam: bool, signum: int | None) -> BaseException:
    """What a failed or interrupted conversion raises: what stopped it, and what became of `output` and the build."""
    if isinstance(e, KeyboardInterrupt):
        signum = signum or signal.SIGINT
        who = "Beam workers" if beam else "workers"
        return ConversionInterrupted(
            signum,
            f"interrupted by {signal.Signals(signum).name}: the {who} were stopped and nothing was "
            f"committed to {output}{kept}",
        )
    # an HbpeError here comes from a worker (its message names a staging file that may be gone now): keep its
    # type and fix, and say what became of the output
    why = str(e) if isinstance(e, HbpeError) else f"{type(e).__name__}: {e}"
    return (type(e) if isinstance(e, HbpeError) else HbpeError)(
        f"the conversion failed and nothing was committed to {output}: {why}{kept}"
    )


def _put_in_place(build: Build, output: str, shown: str) -> None:
    """A complete build becomes the output: swapped in over the previous one, or its leftover staging removed."""
    if not build.replacing:
        if build.finished:  # killed between writing COMPLETED and removing the staging
            fs.delete_tree(build.staging)
        return
    try:
        with signals_deferred():  # SIGINT/SIGTERM wait for the swap; a kill -9 in it is finished by --resume
            replace_output(build.path, output)
    except OSError as e:
        raise HbpeError(
            f"the new output is complete in {build.path} but could not replace {shown}'s files ({e}); "
            f"{shown} holds no COMPLETED until it does: rerun with --resume to finish the swap"
        ) from e


def _prepare_staging(
    build: Build, record: dict, keys: dict[int, str], units: list[WorkUnit], tokenizer_dir: str
) -> dict[int, UnitSummary]:
    """A new staging with its resume record, or an interrupted one cleaned up; returns the units already encoded."""
    done: dict[int, UnitSummary] = {}
    if build.resumed:
        resuming.clean_staging(build.staging)
        done = encoded_units(build.staging, keys, units)
    else:
        if not fs.is_remote(build.path):
            os.makedirs(build.path, exist_ok=True)  # parents too, like mkdir -p (see output_dir)
        resuming.write_record(build.staging, record)

    with tempfile.TemporaryDirectory(prefix="hbpe-tokenizer-") as tmp:
        local = artifact.fetch(tokenizer_dir, tmp) if storage.is_remote(tokenizer_dir) else tokenizer_dir
        fs.copy_dir_to(local, fs.join(build.staging, "tokenizer"))
    return done


def _finalize_context(
    cfg: ConvertConfig,
    files: list[FileInfo],
    spec: TokenizerSpec,
    started: float,
    output: str,
    timing: dict,
    skipped: list[dict],
) -> FinalizeContext:
    return FinalizeContext(
        output=output,
        staging=fs.join(output, STAGING),
        config=cfg.to_dict(),
        inputs=[{"path": f.path, "size": f.size, "mtime": f.mtime} for f in files],
        tokenizer_spec=spec,
        started_at=started,
        timing=timing,
        skipped_inputs=skipped,
    )
