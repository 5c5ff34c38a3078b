"""`hbpe shards ...`: inspect, verify, export and summarize shard directories."""

from __future__ import annotations

import sys
from typing import Any

import click

from hbpe.cli.common import Group, check_local_paths, data_option, emit, json_option


@click.group("shards", cls=Group, context_settings={"show_default": True})
def shards() -> None:
    """Inspect, verify, export and summarize shard directories.

    \b
    Example:
      hbpe shards verify --data runs/demo/shards-train
    """


@shards.command("inspect")
@data_option
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
    emit(inspect(ShardDir(data), samples=samples), as_json, render, ensure_ascii=False)


@shards.command("verify")
@data_option
@json_option("{data, ok, problems}")
def shards_verify(data: str, as_json: bool) -> None:
    """Hashes, manifest consistency, tokens and stored patches == tokenizer(tokens) on every sample; exit 1 on a problem.

    \b
    Example:
      hbpe shards verify --data runs/demo/shards-train
    """
    from hbpe.pipeline.shards.reader import ShardDir
    from hbpe.pipeline.shards.tools import verify

    check_local_paths("--data", data)
    sd = ShardDir(data)
    problems = verify(sd)
    r = {"data": data, "ok": not problems, "problems": problems}
    if as_json:
        emit(r, True, str)
    elif problems:
        for p in problems:
            click.echo(f"FAIL {p}", err=True)
    elif sd.manifest.stores_patches:
        click.echo(f"OK {data}: hashes, manifest and every sample's patches check out")
    else:
        click.echo(f"OK {data}: hashes, manifest and every sample's tokens check out (patches are derived from them)")
    if problems:
        sys.exit(1)


@shards.command("export-text")
@data_option
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

    emit(r, as_json, render)


@shards.command("stats")
@data_option
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
    emit(stats(ShardDir(data)), as_json, render)
