"""`hbpe convert`: corpora -> MDS shards (hbpe.api.convert), and the table of its manifest."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from hbpe.cli.common import (
    Command,
    check_beam_args,
    check_local_paths,
    emit,
    is_quiet,
    is_verbose,
    json_option,
    say,
    seq_len_option,
    text_field_option,
    tokenizer_option,
)
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
        ("shards", _shards_row(m)),
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


def _shards_row(m: dict[str, Any]) -> str:
    """How many shards, and which columns they store (lean: readers derive `patches` from `tokens`)."""
    columns = m.get("columns")
    if columns is None:
        return str(len(m["shards"]))
    derived = "" if "patches" in columns else "; patches derived from tokens"
    return f"{len(m['shards'])} ({', '.join(columns)}{derived})"


# arguments hbpe does not know are Beam's pipeline options
_CONVERT_SETTINGS = {"ignore_unknown_options": True, "allow_extra_args": True, "show_default": True}


@click.command("convert", cls=Command, context_settings=_CONVERT_SETTINGS)
@tokenizer_option
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
@seq_len_option
@text_field_option
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
@click.option(
    "--shard-mb",
    type=click.IntRange(min=1),
    default=64,
    help="Target uncompressed shard size, counted with patches stored (so both layouts cut the same shards; a "
    "lean shard is about 4/(4+2S) of it).",
)
@click.option(
    "--store-patches",
    is_flag=True,
    help="Also store the second-stage patches (S uint16 per token: at S=10 about 3x the bytes on disk). By default "
    "shards hold the first-stage tokens and readers derive the patches with the shards' tokenizer.",
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
    help="Continue an interrupted conversion into --out, reusing the units it encoded (same options, inputs "
    "and tokenizer, or it is refused), or finish putting its complete output in place; an interrupted --resume "
    "run, or one that filled the disk, keeps its own units for the next one.",
)
@click.option(
    "--runner",
    default="auto",
    help="inprocess (no Beam), dask (on a Dask cluster), a Beam runner (DirectRunner, DataflowRunner, "
    "FlinkRunner, SparkRunner, PortableRunner, ...), or auto: inprocess for a local job with no Beam option, "
    "else DirectRunner.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    show_default="all cores",
    help="Worker processes of a local run (inprocess, dask's LocalCluster, or DirectRunner's "
    "--direct_num_workers), at most 4 per core; a cluster (--dask-address, a Beam cluster runner) has its own.",
)
@click.option(
    "--dask-address",
    default=None,
    show_default="a LocalCluster on this machine",
    help="With --runner dask: the Dask scheduler (tcp://host:8786), reached within HBPE_DASK_TIMEOUT "
    "seconds (30 by default; a program there that does not answer as a scheduler is refused a few seconds later).",
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
    store_patches: bool,
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
    from hbpe import api
    from hbpe.pipeline.beam.convert import ConversionInterrupted
    from hbpe.pipeline.beam.quiet import quiet_beam

    quiet_beam()  # also when this command runs without the `hbpe` group around it
    check_beam_args(ctx)
    check_local_paths("--tokenizer", tokenizer_dir)
    check_local_paths("--input", inputs)
    shown = out if is_uri(out) else os.path.abspath(out)  # a mistyped path shows at once
    try:
        result = api.convert(
            inputs,
            out,
            tokenizer=tokenizer_dir,
            seq_len=seq_len,
            overwrite=overwrite,
            resume=resume,
            runner=runner,
            workers=workers,
            dask_address=dask_address,
            progress=not is_quiet(),
            beam_args=list(ctx.args),
            on_start=lambda units: say(f"converting {len(units)} work units -> {shown}"),
            on_message=None if is_verbose() else say,  # with -v the library's log shows these lines
            excludes=excludes,
            text_field=text_field,
            id_field=id_field or None,
            tail=tail,
            invalid_utf8=invalid_utf8,
            max_doc_bytes=max_doc_bytes,
            text_unit=text_unit,
            split_bytes=split_mb << 20,
            shard_bytes=shard_mb << 20,
            store_patches=store_patches,
        )
    except ConversionInterrupted as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(128 + e.signum)  # the shell's convention for "killed by signal N"
    emit(result.as_dict(), as_json, render_summary)
