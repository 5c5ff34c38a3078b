"""CLI commands of the conversion pipeline: `hbpe convert`, `hbpe shards ...`, `hbpe bench convert`."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from hbpe.cli_common import _emit, _Group
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
    w = max(len(k) for k, _ in rows)
    ok = "OK" if Counts(**c).balanced() else "MISMATCH"
    return "\n".join([f"{k:<{w}}  {v}" for k, v in rows] + [f"{'accounting':<{w}}  read = written + rejected: {ok}"])


@click.command("convert", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.option("--tokenizer", "tokenizer_dir", required=True, help="Tokenizer directory from `hbpe tokenizer train`.")
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
    help="Leave out files whose name or path matches this glob, e.g. '*.md' (repeatable).",
)
@click.option(
    "--output",
    required=True,
    help="Output directory (local or gs://, s3://); missing parent folders are created.",
)
@click.option("--seq-len", type=click.IntRange(min=1), default=1024, show_default=True, help="Patches per sample (N).")
@click.option("--text-field", default="text", show_default=True, help="Dotted path of the text in each record.")
@click.option("--id-field", default="id", show_default=True, help="Dotted path of an id carried into reject records.")
@click.option("--tail", type=click.Choice(["drop", "pad"]), default="drop", show_default=True)
@click.option("--invalid-utf8", type=click.Choice(["reject", "replace"]), default="reject", show_default=True)
@click.option("--max-doc-bytes", type=click.IntRange(min=1), default=None, help="Reject documents larger than this.")
@click.option(
    "--text-unit",
    type=click.Choice(["file", "line"]),
    default="file",
    show_default=True,
    help=".txt: one document per file or per line.",
)
@click.option(
    "--split-mb",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="Byte-range size for large uncompressed files.",
)
@click.option(
    "--shard-mb", type=click.IntRange(min=1), default=64, show_default=True, help="Target uncompressed shard size."
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace an earlier conversion's output, once the new one is complete (files hbpe did not write "
    "are never deleted: such an output is refused).",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Continue an interrupted conversion into OUTPUT, reusing the units it encoded (same options, inputs "
    "and tokenizer, or it is refused); an interrupted --resume run keeps its own units for the next one.",
)
@click.option(
    "--runner",
    default="auto",
    show_default=True,
    help="inprocess (no Beam), a Beam runner (DirectRunner, DataflowRunner, FlinkRunner, SparkRunner, "
    "PortableRunner, ...), or auto: inprocess for a local job with no Beam option, else DirectRunner.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Worker processes of a local run (inprocess, or DirectRunner's --direct_num_workers). [default: all cores]",
)
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
@click.pass_context
def convert(
    ctx: click.Context,
    tokenizer_dir: str,
    inputs: tuple[str, ...],
    excludes: tuple[str, ...],
    output: str,
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
    as_json: bool,
) -> None:
    """Tokenize corpora into MDS shards, with an Apache Beam pipeline or in process.

    Arguments hbpe does not know are Beam pipeline options (e.g. --project=... with
    --runner DataflowRunner); one Beam does not know either is an error. A local job with
    no Beam option runs in process (no Beam start-up cost), the others on Beam's
    DirectRunner on all local cores unless --runner names another; the choice is
    printed. The output is the same either way.
    """
    from hbpe.pipeline.beam.convert import ConversionInterrupted, run_convert
    from hbpe.pipeline.beam.quiet import quiet_beam
    from hbpe.schemas.convert_config import ConvertConfig

    quiet_beam()  # also when this command runs without the `hbpe` group around it
    if ctx.args:  # hbpe's own names make the hint: --seq_len 64 -> --seq-len
        from hbpe.pipeline.beam.options import check_pipeline_args

        check_pipeline_args(ctx.args, hbpe_options=[o for p in ctx.command.params for o in p.opts])
    cfg = ConvertConfig(
        inputs=inputs,
        excludes=excludes,
        output=output,
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
    shown = output if "://" in output else os.path.abspath(output)  # a mistyped path shows at once
    try:
        m = run_convert(
            cfg,
            list(ctx.args),
            overwrite=overwrite,
            resume=resume,
            runner=runner,
            workers=workers,
            on_start=lambda units: click.echo(f"converting {len(units)} work units -> {shown}", err=True),
            on_message=lambda line: click.echo(line, err=True),
        )
    except ConversionInterrupted as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(128 + e.signum)  # the shell's convention for "killed by signal N"
    _emit(m, as_json, render_summary)


@click.group("shards", cls=_Group)
def shards() -> None:
    """Inspect, verify, export and summarize shard directories."""


@shards.command("inspect")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--samples", type=click.IntRange(min=0), default=2, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def shards_inspect(directory: str, samples: int, as_json: bool) -> None:
    """Manifest, counts, columns and a few decoded samples."""
    from hbpe.pipeline.shards.reader import ShardDir
    from hbpe.pipeline.shards.tools import inspect

    def render(info: dict[str, Any]) -> str:
        c = info["counts"]
        lines = [
            f"{directory}: {info['shards']} shards, {info['samples']} samples x {info['seq_len']} patches, S={info['max_patch_size']} ({info['mode']})",
            f"tokenizer {info['tokenizer_fingerprint'][:16]}  inputs {len(info['inputs'])}  on disk {info['bytes_on_disk'] / 1e6:.2f} MB (x{info['compression_ratio']:.1f} compression)",
            f"documents {c['documents_written']} written, {c['documents_rejected']} rejected {c['rejected_by_reason'] or ''}",
            "columns: " + ", ".join(f"{k}={v}" for k, v in info["columns"].items()),
        ]
        lines += [f"--- sample {s['sample']} ({s['num_bytes']} bytes)\n{s['text']}" for s in info["samples_preview"]]
        return "\n".join(lines)

    # the samples' text as it is, not as \u escapes: the preview is for reading
    _emit(inspect(ShardDir(directory), samples=samples), as_json, render, ensure_ascii=False)


@shards.command("verify")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
def shards_verify(directory: str) -> None:
    """Hashes, manifest consistency and patches == tokenizer(tokens) on every sample."""
    from hbpe.pipeline.shards.reader import ShardDir
    from hbpe.pipeline.shards.tools import verify

    problems = verify(ShardDir(directory))
    if problems:
        for p in problems:
            click.echo(f"FAIL {p}", err=True)
        sys.exit(1)
    click.echo(f"OK {directory}: hashes, manifest and every sample's patches check out")


@shards.command("export-text")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--output", required=True, type=click.Path(dir_okay=False))
def shards_export(directory: str, output: str) -> None:
    """Rebuild the documents from the shards' patches as JSON lines with `text`."""
    from hbpe.pipeline.shards.reader import ShardDir
    from hbpe.pipeline.shards.tools import export_text_to

    r = export_text_to(output, ShardDir(directory))
    note = (
        f" ({r['truncated_tail_documents']} document cut by --tail drop not written)"
        if r["truncated_tail_documents"]
        else ""
    )
    click.echo(f"wrote {r['documents']} documents to {output}{note}")


@shards.command("stats")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True)
def shards_stats(directory: str, as_json: bool) -> None:
    """Counts and statistics of a shard directory."""
    from hbpe.pipeline.shards.reader import ShardDir
    from hbpe.pipeline.shards.tools import stats

    def render(st: dict[str, Any]) -> str:
        s, c = st["statistics"], st["counts"]
        return (
            f"shards {st['shards']}  samples {st['samples']}  tokens {c['tokens']}  bytes {c['bytes']}\n"
            f"bytes/patch {s['bytes_per_patch']:.3f}  symbols/patch {s['symbols_per_patch']:.3f}  fertility {s['fertility']:.3f}  "
            f"on disk {st['bytes_on_disk'] / 1e6:.2f} MB"
        )

    _emit(stats(ShardDir(directory)), as_json, render)


@click.command("convert", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.option("--tokenizer", "tokenizer_dir", required=True)
@click.option("--corpus", required=True)
@click.option("--scale", type=click.IntRange(min=1), default=1, show_default=True, help="Repeat the corpus K times.")
@click.option("--seq-len", type=click.IntRange(min=1), default=1024, show_default=True)
@click.option("--split-mb", type=click.IntRange(min=1), default=16, show_default=True)
@click.option(
    "--runner", default="auto", show_default=True, help="As for `hbpe convert`: auto, inprocess, DirectRunner, ..."
)
@click.option(
    "--workers", type=click.IntRange(min=1), default=None, help="Processes (and tiktoken threads). [default: all cores]"
)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def bench_convert(
    ctx: click.Context,
    tokenizer_dir: str,
    corpus: str,
    scale: int,
    seq_len: int,
    split_mb: int,
    runner: str,
    workers: int | None,
    as_json: bool,
) -> None:
    """Conversion MB/s vs tiktoken encode_ordinary_batch alone on the same text and cores; peak memory.

    Extra arguments are Beam pipeline options, as for `hbpe convert`.
    """
    from hbpe.pipeline.beam.bench_convert import bench_convert as run
    from hbpe.pipeline.beam.quiet import quiet_beam

    quiet_beam()  # also when this command runs without the `hbpe` group around it
    if ctx.args:
        from hbpe.pipeline.beam.options import check_pipeline_args

        check_pipeline_args(ctx.args, hbpe_options=[o for p in ctx.command.params for o in p.opts])
    r = run(
        tokenizer_dir,
        corpus,
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
