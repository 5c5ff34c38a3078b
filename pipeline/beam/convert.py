"""`hbpe convert`: the Beam pipeline from corpus files to MDS shards, and its launcher.

    units    = plan (files sorted, cut into byte ranges)      # [WorkUnit]
    summary  = units | EncodeUnits                           # UnitSummary per unit
    plan     = summaries | ToList | PlanShards               # ShardPlan (singleton)
    entries  = plan.tasks | WriteMdsShards                   # (shard index, MDS entry)
    manifest = entries | ToList | FinalizeOutput             # commit: index, manifest, COMPLETED

DirectRunner on all local cores is the default; any other runner (Dataflow, Flink,
Spark, Portable) comes from standard Beam pipeline options, with no code change.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Callable

import apache_beam as beam
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

from pipeline.beam import fs
from pipeline.beam.encode import EncodeUnits
from pipeline.beam.finalize import FinalizeContext, finalize_output
from pipeline.beam.progress import ProgressLine
from pipeline.beam.shards import WriteMdsShards, plan_shards
from pipeline.corpus_files import FileInfo, WorkUnit, file_info, plan_units
from pipeline.documents import RecordPolicy
from schemas.convert_config import ConvertConfig
from schemas.errors import ConfigError, HbpeError
from schemas.shard_columns import MANIFEST_FILENAME

STAGING = ".hbpe-staging"


def resolve_inputs(patterns: tuple[str, ...]) -> list[str]:
    """Expand files, directories and globs (local or URI) into a sorted, de-duplicated list."""
    from apache_beam.io.filesystems import FileSystems

    found: set[str] = set()
    for pat in patterns:
        if fs.is_remote(pat):
            matches = [m.path for m in FileSystems.match([pat])[0].metadata_list]
        elif os.path.isdir(pat):
            matches = [p for p in glob.glob(os.path.join(pat, "**", "*"), recursive=True) if os.path.isfile(p)]
        else:
            matches = [p for p in glob.glob(pat, recursive=True) if os.path.isfile(p)]
        if not matches:
            raise ConfigError(f"--input {pat!r} matches no file; check the path or quote the glob")
        found.update(matches)
    return sorted(found)


def default_pipeline_options(pipeline_args: list[str]) -> PipelineOptions:
    joined = " ".join(pipeline_args)
    if "--default_sdk_harness_log_level" not in joined:
        pipeline_args = [*pipeline_args, "--default_sdk_harness_log_level=ERROR"]
    opts = PipelineOptions(pipeline_args)
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
    tokenizer_spec: dict,
    started_at: float,
) -> None:
    from schemas.tokenizer_artifact import SecondStageSpec

    staging = fs.join(cfg.output, STAGING)
    tok_dir = fs.join(staging, "tokenizer")
    policy = RecordPolicy(cfg.text_field, cfg.id_field, cfg.invalid_utf8, cfg.max_doc_bytes)
    S = SecondStageSpec.from_dict(tokenizer_spec["second_stage"]).max_patch_size
    ctx = FinalizeContext(
        output=cfg.output,
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
    """Run the whole conversion; returns the manifest as a dict. Raises HbpeError on user mistakes."""
    import json

    from pipeline import tokenizer_io

    started = time.time()
    tok_spec = tokenizer_io.load(cfg.tokenizer).spec  # validates artifact and rank file before any worker starts
    if fs.is_nonempty_dir(cfg.output):
        if not overwrite:
            raise ConfigError(f"output {cfg.output} exists and is not empty; pass --overwrite to replace it")
        fs.delete_tree(cfg.output)
    paths = resolve_inputs(cfg.inputs)
    files = [file_info(p) for p in paths]
    units = plan_units(files, split_bytes=cfg.split_bytes, text_unit=cfg.text_unit)
    staging = fs.join(cfg.output, STAGING)
    fs.copy_dir_to(cfg.tokenizer, fs.join(staging, "tokenizer"))
    if on_start:
        on_start(units)

    opts = default_pipeline_options(list(pipeline_args or []))
    ticker = ProgressLine(staging, n_units=len(units)) if progress and not fs.is_remote(cfg.output) else None
    try:
        if ticker:
            ticker.start()
        with beam.Pipeline(options=opts) as p:
            build_pipeline(p, cfg, units, files, tok_spec.to_dict(), started)
    except HbpeError:
        fs.delete_tree(staging)
        raise
    except Exception as e:
        fs.delete_tree(staging)
        raise HbpeError(
            f"the conversion failed and nothing was committed to {cfg.output}: {type(e).__name__}: {e}"
        ) from e
    finally:
        if ticker:
            ticker.stop()
    return json.loads(fs.read_bytes(fs.join(cfg.output, MANIFEST_FILENAME)))
