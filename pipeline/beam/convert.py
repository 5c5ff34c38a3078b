"""`hbpe convert`: the Beam pipeline from corpus files to MDS shards, and its launcher.

    units    = plan (files sorted, cut into byte ranges)      # [WorkUnit]
    summary  = units | EncodeUnits                           # UnitSummary per unit
    plan     = summaries | ToList | PlanShards               # ShardPlan (singleton)
    entries  = plan.tasks | WriteMdsShards                   # (shard index, MDS entry)
    manifest = entries | ToList | FinalizeOutput             # commit: index, manifest, COMPLETED

DirectRunner on all local cores is the default; any other runner (Dataflow, Flink,
Spark, Portable) comes from standard Beam pipeline options, with no code change.

The launcher checks everything it can before it writes anything (tokenizer, inputs,
Beam options, what the output holds), builds a new output into an empty folder
(OUTPUT itself when it is new or empty, else OUTPUT/.hbpe-new-XXXXXXXX, on the same
filesystem or bucket) and puts it in place only when it is complete. A failure, SIGINT or SIGTERM removes what
the run wrote, stops its Beam worker processes, and leaves a previous output as it was.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import time
import uuid
from collections.abc import Callable

import apache_beam as beam
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

from hbpe.pipeline.beam import fs
from hbpe.pipeline.beam.encode import EncodeUnits
from hbpe.pipeline.beam.finalize import (
    STAGING_DIRNAME,
    FinalizeContext,
    discard_hbpe_entries,
    finalize_output,
    is_hbpe_entry,
    replace_output,
)
from hbpe.pipeline.beam.progress import ProgressLine, StopWorkersOnExit, signals_deferred
from hbpe.pipeline.beam.shards import WriteMdsShards, plan_shards
from hbpe.pipeline.corpus.documents import RecordPolicy
from hbpe.pipeline.corpus.files import FileInfo, WorkUnit, file_info, plan_units, resolve_inputs
from hbpe.schemas.convert_config import ConvertConfig
from hbpe.schemas.errors import ConfigError, HbpeError
from hbpe.schemas.manifest import MANIFEST_FORMAT
from hbpe.schemas.shard_columns import COMPLETED_FILENAME, MANIFEST_FILENAME
from hbpe.schemas.tokenizer_artifact import TokenizerSpec

STAGING = STAGING_DIRNAME


class ConversionInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped the run; its workers were stopped and nothing was committed."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = signum


def default_pipeline_options(pipeline_args: list[str]) -> PipelineOptions:
    """Beam options with hbpe's local defaults; a malformed option is a ConfigError, not argparse's exit."""
    joined = " ".join(pipeline_args)
    if "--default_sdk_harness_log_level" not in joined:
        pipeline_args = [*pipeline_args, "--default_sdk_harness_log_level=ERROR"]
    opts = PipelineOptions(pipeline_args)
    err = io.StringIO()
    try:
        # Beam parses its options lazily, at the first view_as, and argparse then exits the process:
        # parse them all now, before anything is written, and say which one is wrong
        with contextlib.redirect_stderr(err):
            opts.get_all_options()
    except SystemExit:
        why = next((ln for ln in reversed(err.getvalue().splitlines()) if "error:" in ln), err.getvalue().strip())
        raise ConfigError(
            f"bad Beam pipeline option: {why.split('error:', 1)[-1].strip()}; fix or drop it "
            "(Beam options follow hbpe's own, e.g. --direct_num_workers=2)"
        ) from None
    if not opts.view_as(StandardOptions).runner:
        opts.view_as(StandardOptions).runner = "DirectRunner"
        direct = opts.view_as(DirectOptions)
        if "--direct_num_workers" not in joined:
            direct.direct_num_workers = os.cpu_count() or 1
        if "--direct_running_mode" not in joined:
            direct.direct_running_mode = "multi_processing"
    return opts


def build_pipeline(
    p: beam.Pipeline,
    cfg: ConvertConfig,
    units: list[WorkUnit],
    files: list[FileInfo],
    tokenizer_spec: TokenizerSpec,
    started_at: float,
    *,
    output: str | None = None,
) -> None:
    """Add the conversion's steps to `p`; they write into `output` (default cfg.output)."""
    output = output or cfg.output
    staging = fs.join(output, STAGING)
    tok_dir = fs.join(staging, "tokenizer")
    policy = RecordPolicy(cfg.text_field, cfg.id_field, cfg.invalid_utf8, cfg.max_doc_bytes)
    S = tokenizer_spec.second_stage.max_patch_size
    ctx = FinalizeContext(
        output=output,
        staging=staging,
        config=cfg.to_dict(),
        inputs=[{"path": f.path, "size": f.size, "mtime": f.mtime} for f in files],
        tokenizer_spec=tokenizer_spec,
        started_at=started_at,
    )
    summaries = (
        p
        | "CreateUnits" >> beam.Create(units)  # WorkUnit
        | "EncodeUnits" >> EncodeUnits(tok_dir, staging, policy, cfg.text_unit, cfg.encode_batch_docs)  # UnitSummary
    )
    unit_list = summaries | "CollectUnits" >> beam.combiners.ToList()  # [UnitSummary]
    plan = unit_list | "PlanShards" >> beam.Map(
        lambda us: plan_shards(us, seq_len=cfg.seq_len, samples_per_shard=cfg.samples_per_shard(S), tail=cfg.tail)
    )  # ShardPlan
    entries = (
        plan
        | "ListShardTasks" >> beam.FlatMap(lambda pl: pl.tasks)  # ShardTask
        | "WriteMdsShards" >> WriteMdsShards(tok_dir, staging, cfg.seq_len)  # (index, entry)
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


def run_convert(
    cfg: ConvertConfig,
    pipeline_args: list[str] | None = None,
    *,
    overwrite: bool = False,
    progress: bool = True,
    on_start: Callable[[list[WorkUnit]], None] | None = None,
) -> dict:
    """Run the whole conversion; returns the manifest as a dict.

    Raises HbpeError on user mistakes and failed runs (nothing committed, a previous output
    intact), ConversionInterrupted (a KeyboardInterrupt) on SIGINT or SIGTERM.
    """
    from hbpe.pipeline.tokenizer import artifact

    started = time.time()
    output = _output_dir(cfg.output)
    # the whole load, table included, proves the artifact usable (rank-file hash, merges that fit this
    # first stage and S) before any worker starts; only the spec travels on into the pipeline
    tok_spec = artifact.load(cfg.tokenizer).spec
    _refuse_inside(cfg.tokenizer, output, f"--tokenizer {cfg.tokenizer}", cfg.output)
    for pat in cfg.inputs:
        _refuse_inside(_glob_base(pat), output, f"--input {pat}", cfg.output)
    own = () if fs.is_remote(output) else (output + os.sep,)
    paths = resolve_inputs(cfg.inputs, excludes=cfg.excludes, skip_prefixes=own)
    files = [file_info(p) for p in paths]
    opts = default_pipeline_options(list(pipeline_args or []))
    try:
        p = beam.Pipeline(options=opts)
    except ValueError as e:  # an unknown --runner
        raise ConfigError(f"bad Beam pipeline option: {e}") from None
    replacing = _check_existing(output, cfg.output, overwrite)
    units = plan_units(files, split_bytes=cfg.split_bytes, text_unit=cfg.text_unit)

    tag = uuid.uuid4().hex[:8]
    build = fs.join(output, f".hbpe-new-{tag}") if replacing else output
    created = not replacing and not fs.is_remote(output) and not os.path.isdir(output)
    staging = fs.join(build, STAGING)
    ticker = ProgressLine(staging, n_units=len(units)) if progress and not fs.is_remote(output) else None
    was = f"; {cfg.output} is as it was" if replacing else ""
    guard = StopWorkersOnExit()
    try:
        with guard:
            if not fs.is_remote(build):
                os.makedirs(build, exist_ok=True)  # parents too, like mkdir -p (see _output_dir)
            fs.copy_dir_to(cfg.tokenizer, fs.join(staging, "tokenizer"))
            if on_start:
                on_start(units)
            if ticker:
                ticker.start()
            try:
                with p:
                    build_pipeline(p, cfg, units, files, tok_spec, started, output=build)
            finally:
                if ticker:
                    ticker.stop()
    except BaseException as e:
        _discard(build, replacing=replacing, created=created)
        if isinstance(e, KeyboardInterrupt):
            signum = guard.signum or signal.SIGINT
            raise ConversionInterrupted(
                signum,
                f"interrupted by {signal.Signals(signum).name}: the Beam workers were stopped and nothing was "
                f"committed to {cfg.output}{was}",
            ) from None
        if not isinstance(e, Exception):
            raise
        # an HbpeError here comes from a worker (its message names a staging file that is gone now): keep its
        # type and fix, and say what became of the output
        why = str(e) if isinstance(e, HbpeError) else f"{type(e).__name__}: {e}"
        raise (type(e) if isinstance(e, HbpeError) else HbpeError)(
            f"the conversion failed and nothing was committed to {cfg.output}{was}: {why}"
        ) from e
    if replacing:
        try:
            with signals_deferred():  # a swap cut short leaves no COMPLETED: let it finish
                replace_output(build, output)
        except OSError as e:
            raise HbpeError(
                f"the new output is complete in {build} but could not replace {cfg.output}'s files ({e}); "
                f"move its contents up into {cfg.output} by hand"
            ) from e
    return json.loads(fs.read_bytes(fs.join(output, MANIFEST_FILENAME)))


def _output_dir(path: str) -> str:
    """The output as the launcher handles it: a local path made absolute, symlinks resolved.

    A missing parent is created, like `mkdir -p` (as `hbpe tokenizer train --out` and
    streaming's MDSWriter do): a mistyped parent then makes a new folder, which loses
    nothing and is printed at the start, while refusing would cost every `runs/<new>/shards`.
    """
    if fs.is_remote(path):
        return path.rstrip("/")
    real = os.path.realpath(path)
    if os.path.exists(real) and not os.path.isdir(real):
        raise ConfigError(
            f"--output {path} is a file, not a directory: give the path of a directory (a new one is created)"
        )
    up = os.path.dirname(real)
    while not os.path.exists(up):
        up = os.path.dirname(up)
    if not os.path.isdir(up):
        raise ConfigError(f"--output {path} cannot be created: {up} is a file; give a directory path")
    return real


def _glob_base(pattern: str) -> str:
    """The folder part of a glob before its first wildcard: 'data/*/x.jsonl' -> 'data'."""
    parts = []
    for part in pattern.split("/"):
        if any(c in part for c in "*?["):
            break
        parts.append(part)
    return "/".join(parts) or "."


def _refuse_inside(path: str, output: str, what: str, shown: str) -> None:
    """Inputs and the tokenizer may not live in the output: an --overwrite would replace them."""
    real = path.rstrip("/") if fs.is_remote(path) else os.path.realpath(path)
    if real == output or real.startswith(output.rstrip("/") + "/"):
        raise ConfigError(
            f"{what} lies inside the output directory {shown}, which the conversion replaces: "
            f"move or copy it out of {shown} first, or choose another --output"
        )


def _check_existing(output: str, shown: str, overwrite: bool) -> bool:
    """True when a previous conversion is to be replaced; refuses anything else that is not empty.

    A folder counts as a previous conversion only by what only hbpe writes (COMPLETED, a
    staging or build folder, a manifest.json of format "hbpe-shards"), never by file names
    alone: a user's own index.json or tokenizer/ must not be replaced.
    """
    names = fs.top_entries(output)
    if not names:
        return False
    previous = _is_previous_conversion(output, names)
    foreign = [n for n in names if not (previous and is_hbpe_entry(n))]
    if foreign:
        listed = ", ".join(foreign[:5]) + (f" ... ({len(foreign)} in all)" if len(foreign) > 5 else "")
        if not previous:
            raise ConfigError(
                f"output {shown} is not empty and holds files hbpe did not write: {listed}; it is not an earlier "
                "conversion (no COMPLETED, .hbpe-staging/ or hbpe manifest.json), so --overwrite does not replace "
                "it: choose a new or empty --output, or move those files away"
            )
        raise ConfigError(
            f"output {shown} is not empty and holds files hbpe did not write: {listed}; "
            "--overwrite only replaces an earlier conversion (shard.*.mds.zstd, index.json, manifest.json, "
            "rejects/, tokenizer/, COMPLETED): choose a new or empty --output, or move those files away"
        )
    if not overwrite:
        unfinished = "" if COMPLETED_FILENAME in names else " (an unfinished conversion: no COMPLETED)"
        raise ConfigError(f"output {shown} exists and is not empty{unfinished}; pass --overwrite to replace it")
    return True


def _is_previous_conversion(output: str, names: list[str]) -> bool:
    """Whether `output` holds what only `hbpe convert` writes (finished, or killed before it finished)."""
    if COMPLETED_FILENAME in names or any(n == STAGING or n.startswith(".hbpe-new-") for n in names):
        return True
    if MANIFEST_FILENAME not in names:
        return False
    try:
        d = json.loads(fs.read_bytes(fs.join(output, MANIFEST_FILENAME)))
    except (OSError, ValueError):
        return False
    return isinstance(d, dict) and d.get("format") == MANIFEST_FORMAT


def _discard(build: str, *, replacing: bool, created: bool) -> None:
    """Remove what a failed run wrote: its build folder inside the old output, or hbpe's files in a new one."""
    if replacing:
        fs.delete_tree(build)
        return
    discard_hbpe_entries(build)
    if created:
        with contextlib.suppress(OSError):
            os.rmdir(build)
