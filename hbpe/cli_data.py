"""CLI commands of the conversion pipeline: `hbpe convert`, `hbpe shards ...`, `hbpe bench convert`."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from hbpe.cli_common import _Command, _emit, _Group, check_local_paths, is_quiet, is_verbose, json_option, say
from hbpe.schemas.locations import is_uri
from hbpe.schemas.manifest import Counts


def render_summary(m: dict[str, Any]) -> str:
    """The manifest of a conversion as an aligned table, ending in the accounting check."""
    c, s = m["counts"], m["statistics"]
    rows = [
        ("documents read", c["documents_read"]),
        ("documents written", c["documents_written"]),
        ("documents rejected", c["documents_rejected"]),
        *[(f"  {reason}", n) for reason, n in c["rejected_by_reason"].items()],
        ("bytes", c["bytes"]),
        ("tokens (= text patches)", c["tokens"]),
        ("stream patches (+EOD)", c["patches"]),
        ("samples", f"{c['samples']} x {m['seq_len']} patches"),
        ("tail dropped / padded", f"{c['tail_patches_dropped']} / {c['tail_patches_padded']} patches"),
        ("bytes per patch", f"{s['bytes_per_patch']:.3f}"),
        ("symbols per patch", f"{s['symbols_per_patch']:.3f} (S={m['max_patch_size']}, {m['mode']})"),
        ("fertility", f"{s['fertility']:.3f}"),
        ("shards", len(m["shards"])),
        ("wall time", f"{m['timing'].get('wall_time_s', 0):.1f} s"),
    ]
    skipped = m.get("skipped_inputs", [])
    if others := sum("same_as" not in s for s in skipped):  # FIFOs, devices, links to nothing in a folder
        rows.insert(0, ("inputs skipped (not a file)", others))
    if once := len(skipped) - others:  # links to a folder or file read already: each read once
        rows.insert(0, ("inputs skipped (read once)", once))
    w = max(len(k) for k, _ in rows)
    ok = "OK" if Counts(**c).balanced() else "MISMATCH"
    return "\n".join([f"{k:<{w}}  {v}" for k, v in rows] + [f"{'accounting':<{w}}  read = written + rejected: {ok}"])


_CONVERT_SETTINGS = {"ignore_unknown_options": True, "allow_extra_args": True, "show_default": True}
_TOKENIZER_HELP = "Tokenizer directory from `hbpe tokenizer train`."
_DATA_HELP = "Shard directory from `hbpe convert`."


@click.command("convert", cls=_Command, context_settings=_CONVERT_SETTINGS)
@click.option("--tokenizer", "tokenizer_dir", required=True, help=_TOKENIZER_HELP)
@click.option(
    "--input",
    "inputs",
    multiple=True,
    required=True,
    help="File, directory, glob (quoted: 'DIR/*.jsonl') or URI (repeatable). Directories are read "
    "recursively, hidden files skipped.",
)
@click.option(
    "--exclude",
    "excludes",
    multiple=True,
    show_default="none",
    help="Leave out files whose name or path matches this glob, e.g. '*.md' (repeatable).",
)
@click.option(
    "--out",
    required=True,
    help="Output shard directory (local or gs://, s3://); missing parent folders are created.",
)
@click.option("--seq-len", type=click.IntRange(min=1), default=1024, help="Patches per sample (N).")
@click.option("--text-field", default="text", help="Dotted path of the text in each record.")
@click.option("--id-field", default="id", help="Dotted path of an id carried into reject records.")
@click.option(
    "--tail",
    type=click.Choice(["drop", "pad"]),
    default="drop",
    help="The last sample's short end: drop it, or pad it to --seq-len.",
)
@click.option(
    "--invalid-utf8",
    type=click.Choice(["reject", "replace"]),
    default="reject",
    help="A document that is not UTF-8: reject it, or replace the bad bytes with U+FFFD.",
)
@click.option(
    "--max-doc-bytes",
    type=click.IntRange(min=1),
    default=None,
    show_default="no limit; a line or .txt file over 1 GiB is rejected unread",
    help="Reject documents larger than this; a line far over it (6x + 1 MiB for JSON) is rejected unread.",
)
@click.option(
    "--text-unit",
    type=click.Choice(["file", "line"]),
    default="file",
    help=".txt: one document per file or per line.",
)
@click.option(
    "--split-mb",
    type=click.IntRange(min=1),
    default=64,
    help="Byte-range size for large uncompressed files.",
)
@click.option("--shard-mb", type=click.IntRange(min=1), default=64, help="Target uncompressed shard size.")
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace an earlier conversion's output, once the new one is complete (files hbpe did not write "
    "are never deleted: such an output is refused).",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Continue an interrupted conversion into --out, reusing the units it encoded (same options, inputs "
    "and tokenizer, or it is refused), or finish putting its complete output in place; an interrupted --resume "
    "run, or one that filled the disk, keeps its own units for the next one.",
)
@click.option(
    "--runner",
    default="auto",
    help="inprocess (no Beam), DaskRunner (on a Dask cluster), a Beam runner (DirectRunner, DataflowRunner, "
    "FlinkRunner, SparkRunner, PortableRunner, ...), or auto: inprocess for a local job with no Beam option, "
    "else DirectRunner.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    show_default="all cores",
    help="Worker processes of a local run (inprocess, DaskRunner's LocalCluster, or DirectRunner's "
    "--direct_num_workers).",
)
@click.option(
    "--dask-address",
    default=None,
    show_default="a LocalCluster on this machine",
    help="With --runner DaskRunner: the Dask scheduler (tcp://host:8786).",
)
@json_option("the manifest")
@click.pass_context
def convert(
    ctx: click.Context,
    tokenizer_dir: str,
    inputs: tuple[str, ...],
    excludes: tuple[str, ...],
    out: str,
    seq_len: int,
    text_field: str,
    id_field: str,
    tail: str,
    invalid_utf8: str,
    max_doc_bytes: int | None,
    text_unit: str,
    split_mb: int,
    shard_mb: int,
    overwrite: bool,
    resume: bool,
    runner: str,
    workers: int | None,
    dask_address: str | None,
    as_json: bool,
) -> None:
    """Tokenize corpora into MDS shards, with an Apache Beam pipeline or in process.

    Arguments hbpe does not know are Beam pipeline options (e.g. --project=... with
    --runner DataflowRunner); one Beam does not know either is an error. A local job with
    no Beam option runs in process (no Beam start-up cost), the others on Beam's
    DirectRunner on all local cores unless --runner names another; the choice is
    printed. The output is the same either way.

    \b
    Example:
      hbpe convert --tokenizer runs/demo/tokenizer --input data/sample/en-sotu-sample.jsonl.zst --out /tmp/shards --seq-len 128
    """
    from hbpe.pipeline.beam.convert import ConversionInterrupted, run_convert
    from hbpe.pipeline.beam.quiet import quiet_beam
    from hbpe.schemas.convert_config import ConvertConfig

    quiet_beam()  # also when this command runs without the `hbpe` group around it
    if ctx.args:  # hbpe's own names make the hint: --seq_len 64 -> --seq-len
        from hbpe.pipeline.beam.options import check_pipeline_args

        check_pipeline_args(ctx.args, hbpe_options=[o for p in ctx.command.params for o in p.opts])
    check_local_paths("--tokenizer", tokenizer_dir)
    check_local_paths("--input", inputs)
    cfg = ConvertConfig(
        inputs=inputs,
        excludes=excludes,
        output=out,
        tokenizer=tokenizer_dir,
        seq_len=seq_len,
        text_field=text_field,
        id_field=id_field or None,
        tail=tail,
        invalid_utf8=invalid_utf8,
        max_doc_bytes=max_doc_bytes,
        text_unit=text_unit,
        split_bytes=split_mb << 20,
        shard_bytes=shard_mb << 20,
    )
    shown = out if is_uri(out) else os.path.abspath(out)  # a mistyped path shows at once
    try:
        m = run_convert(
            cfg,
            list(ctx.args),
            overwrite=overwrite,
            resume=resume,
            runner=runner,
            workers=workers,
            dask_address=dask_address,
            progress=not is_quiet(),
            on_start=lambda units: say(f"converting {len(units)} work units -> {shown}"),
            on_message=None if is_verbose() else say,  # with -v the library's log shows these lines
        )
    except ConversionInterrupted as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(128 + e.signum)  # the shell's convention for "killed by signal N"
    _emit(m, as_json, render_summary)


@click.group("shards", cls=_Group, context_settings={"show_default": True})
def shards() -> None:
    """Inspect, verify, export and summarize shard directories.

    \b
    Example:
      hbpe shards verify --data runs/demo/shards-train
    """


@shards.command("inspect")
@click.option("--data", required=True, help=_DATA_HELP)
@click.option("--samples", type=click.IntRange(min=0), default=2, help="Samples to decode and show.")
@json_option()
def shards_inspect(data: str, samples: int, as_json: bool) -> None:
    """Manifest, counts, columns and a few decoded samples.

    \b
    Example:
      hbpe shards inspect --data runs/demo/shards-train --samples 1
    """
    from hbpe.pipeline.shards.reader import ShardDir
    from hbpe.pipeline.shards.tools import inspect

    def render(info: dict[str, Any]) -> str:
        c = info["counts"]
        lines = [
            f"{data}: {info['shards']} shards, {info['samples']} samples x {info['seq_len']} patches, S={info['max_patch_size']} ({info['mode']})",
            f"tokenizer {info['tokenizer_fingerprint'][:16]}  inputs {len(info['inputs'])}  on disk {info['bytes_on_disk'] / 1e6:.2f} MB (x{info['compression_ratio']:.1f} compression)",
            f"documents {c['documents_written']} written, {c['documents_rejected']} rejected {c['rejected_by_reason'] or ''}",
            "columns: " + ", ".join(f"{k}={v}" for k, v in info["columns"].items()),
        ]
        lines += [f"--- sample {s['sample']} ({s['num_bytes']} bytes)\n{s['text']}" for s in info["samples_preview"]]
        return "\n".join(lines)

    check_local_paths("--data", data)
    # the samples' text as it is, not as \u escapes: the preview is for reading
    _emit(inspect(ShardDir(data), samples=samples), as_json, render, ensure_ascii=False)


@shards.command("verify")
@click.option("--data", required=True, help=_DATA_HELP)
@json_option("{data, ok, problems}")
def shards_verify(data: str, as_json: bool) -> None:
    """Hashes, manifest consistency and patches == tokenizer(tokens) on every sample; exit 1 on a problem.

    \b
    Example:
      hbpe shards verify --data runs/demo/shards-train
    """
    from hbpe.pipeline.shards.reader import ShardDir
    from hbpe.pipeline.shards.tools import verify

    check_local_paths("--data", data)
    problems = verify(ShardDir(data))
    r = {"data": data, "ok": not problems, "problems": problems}
    if as_json:
        _emit(r, True, str)
    elif problems:
        for p in problems:
            click.echo(f"FAIL {p}", err=True)
    else:
        click.echo(f"OK {data}: hashes, manifest and every sample's patches check out")
    if problems:
        sys.exit(1)


@shards.command("export-text")
@click.option("--data", required=True, help=_DATA_HELP)
@click.option("--out", required=True, help='The JSON-lines file to write (one {"text": ...} per document).')
@json_option()
def shards_export(data: str, out: str, as_json: bool) -> None:
    """Rebuild the documents from the shards' patches as JSON lines with `text`.

    \b
    Example:
      hbpe shards export-text --data runs/demo/shards-train --out /tmp/documents.jsonl
    """
    from hbpe.pipeline.shards.reader import ShardDir
    from hbpe.pipeline.shards.tools import export_text_to

    check_local_paths("--data", data)
    r = {**export_text_to(out, ShardDir(data)), "out": out}

    def render(r: dict[str, Any]) -> str:
        cut = r["truncated_tail_documents"]
        note = f" ({cut} document cut by --tail drop not written)" if cut else ""
        return f"wrote {r['documents']} documents to {r['out']}{note}"

    _emit(r, as_json, render)


@shards.command("stats")
@click.option("--data", required=True, help=_DATA_HELP)
@json_option()
def shards_stats(data: str, as_json: bool) -> None:
    """Counts and statistics of a shard directory.

    \b
    Example:
      hbpe shards stats --data runs/demo/shards-train --json
    """
    from hbpe.pipeline.shards.reader import ShardDir
    from hbpe.pipeline.shards.tools import stats

    def render(st: dict[str, Any]) -> str:
        s, c = st["statistics"], st["counts"]
        return (
            f"shards {st['shards']}  samples {st['samples']}  tokens {c['tokens']}  bytes {c['bytes']}\n"
            f"bytes/patch {s['bytes_per_patch']:.3f}  symbols/patch {s['symbols_per_patch']:.3f}  fertility {s['fertility']:.3f}  "
            f"on disk {st['bytes_on_disk'] / 1e6:.2f} MB"
        )

    check_local_paths("--data", data)
    _emit(stats(ShardDir(data)), as_json, render)


@click.command("convert", cls=_Command, context_settings=_CONVERT_SETTINGS)
@click.option("--tokenizer", "tokenizer_dir", required=True, help=_TOKENIZER_HELP)
@click.option("--input", "input_file", required=True, help="One corpus file (jsonl, jsonl.zst, txt, parquet).")
@click.option("--scale", type=click.IntRange(min=1), default=1, help="Repeat the corpus K times.")
@click.option("--seq-len", type=click.IntRange(min=1), default=1024, help="Patches per sample (N).")
@click.option(
    "--split-mb", type=click.IntRange(min=1), default=16, help="Byte-range size for large uncompressed files."
)
@click.option("--runner", default="auto", help="As for `hbpe convert`: auto, inprocess, DirectRunner, ...")
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    show_default="all cores",
    help="Processes (and tiktoken threads).",
)
@json_option()
@click.pass_context
def bench_convert(
    ctx: click.Context,
    tokenizer_dir: str,
    input_file: str,
    scale: int,
    seq_len: int,
    split_mb: int,
    runner: str,
    workers: int | None,
    dask_address: str | None,
    as_json: bool,
) -> None:
    """Conversion MB/s vs tiktoken encode_ordinary_batch alone on the same text and cores; peak memory.

    Extra arguments are Beam pipeline options, as for `hbpe convert`.

    \b
    Example:
      hbpe bench convert --tokenizer runs/demo/tokenizer --input data/sample/en-sotu-sample.jsonl.zst --runner inprocess
    """
    from hbpe.pipeline.beam.bench_convert import bench_convert as run
    from hbpe.pipeline.beam.quiet import quiet_beam

    quiet_beam()  # also when this command runs without the `hbpe` group around it
    if ctx.args:
        from hbpe.pipeline.beam.options import check_pipeline_args

        check_pipeline_args(ctx.args, hbpe_options=[o for p in ctx.command.params for o in p.opts])
    check_local_paths("--tokenizer", tokenizer_dir)
    check_local_paths("--input", input_file)
    r = run(
        tokenizer_dir,
        input_file,
        scale=scale,
        seq_len=seq_len,
        split_bytes=split_mb << 20,
        pipeline_args=list(ctx.args),
        runner=runner,
        workers=workers,
    )
    _emit(
        r,
        as_json,
        lambda r: (
            f"corpus {r['corpus_mb']:.1f} MB ({r['documents']} documents, x{scale}), {r['units']} units, {r['workers']} workers\n"
            f"tiktoken encode_ordinary_batch ({r['threads']} threads) {r['tiktoken_mb_per_s']:8.2f} MB/s\n"
            f"hbpe convert ({r['runner']}){' ' * max(1, 32 - len(r['runner']))}{r['pipeline_mb_per_s']:8.2f} MB/s   ratio {r['ratio']:.3f}\n"
            f"peak RSS: launcher {r['peak_rss_mb_self']:.0f} MB, largest worker {r['peak_rss_mb_workers']:.0f} MB"
        ),
    )
