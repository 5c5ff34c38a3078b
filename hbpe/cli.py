"""The `hbpe` command line: thin commands that parse, call one library function, print.

Heavy libraries (torch, composer, beam) are imported inside the commands that
need them, so `hbpe tokenizer ...` starts fast.
"""

from __future__ import annotations

import sys
from typing import Any

import click

import hbpe
from hbpe import cli_data, cli_eval, cli_experiment, cli_train
from hbpe.cli_common import _emit, _Group
from hbpe.schemas.errors import HbpeError


def _check_pattern(pattern: str | None) -> None:
    """--pattern: a known name or a regex that compiles, checked before any work starts."""
    import regex

    from hbpe.pipeline.tokenizer.first_stage import NAMED_PATTERNS, resolve_pattern

    if pattern is None:
        return
    try:
        regex.compile(resolve_pattern(pattern))
    except regex.error as e:
        raise HbpeError(
            f"--pattern {pattern!r} is neither a pattern name ({', '.join(sorted(NAMED_PATTERNS))}) "
            f"nor a valid regex ({e}); pass one of the names or fix the regex"
        ) from e


@click.group(cls=_Group)
@click.version_option(hbpe.__version__, prog_name="hbpe")
def main() -> None:
    """hbpe: hierarchical BPE tokenizers, MDS shards, and hierarchical patch LMs."""
    from hbpe.pipeline.beam.quiet import quiet_beam

    quiet_beam()


@main.command("demo")
@click.option("--out", type=click.Path(file_okay=False), default="runs/demo", show_default=True)
def demo(out: str) -> None:
    """Run the main job end to end on the bundled sample (embedded defaults)."""
    from pathlib import Path

    from hbpe.demo import render_summary, run_demo

    result = run_demo(Path(out), on_step=click.echo)
    click.echo(render_summary(result))


# --------------------------------------------------------------------------- tokenizer


@main.group(cls=_Group)
def tokenizer() -> None:
    """Train, inspect and apply the two-stage tokenizer."""


@tokenizer.command("train")
@click.option("--encoding", required=True, help="tiktoken name (gpt2, cl100k_base, ...) or a .tiktoken rank file.")
@click.option(
    "--pattern",
    default=None,
    help="Split pattern for a rank file: a name (gpt2, cl100k_base, llama3, o200k_base) or a regex.",
)
@click.option("--max-patch-size", "-S", type=click.IntRange(min=2), required=True, help="S: maximum symbols per patch.")
@click.option("--mode", type=click.Choice(["full", "minimal"]), default="full", show_default=True)
@click.option("--out", type=click.Path(file_okay=False), required=True)
@click.option("--overwrite", is_flag=True)
def tokenizer_train(
    encoding: str, pattern: str | None, max_patch_size: int, mode: str, out: str, overwrite: bool
) -> None:
    """Learn the second stage (Algorithm 1) over a first-stage vocabulary and save the artifact."""
    import time

    from hbpe.pipeline.tokenizer import artifact

    _check_pattern(pattern)
    t = time.perf_counter()
    tok = artifact.train_tokenizer(encoding, max_patch_size=max_patch_size, mode=mode, pattern=pattern)
    artifact.save(tok, out, overwrite=overwrite)
    click.echo(
        f"trained {tok.encoding.name} S={max_patch_size} mode={mode}: {len(tok.merges)} merges, "
        f"V'={tok.vocab_size} in {time.perf_counter() - t:.2f}s -> {out} (fingerprint {tok.fingerprint[:12]})"
    )


@tokenizer.command("train-bpe")
@click.option("--corpus", "corpus", multiple=True, required=True, help="jsonl / jsonl.zst / txt files (repeatable).")
@click.option("--vocab-size", type=click.IntRange(min=256), required=True)
@click.option("--pattern", default="cl100k_base", show_default=True, help="Split pattern name or regex.")
@click.option("--min-count", type=click.IntRange(min=1), default=2, show_default=True)
@click.option(
    "--first-stage-trainer",
    type=click.Choice(["hf", "hbpe"]),
    default="hf",
    show_default=True,
    help="hf: HuggingFace tokenizers' Rust trainer; hbpe: the in-house Python one. Same ranks.",
)
@click.option(
    "--out", type=click.Path(), required=True, help="Output .tiktoken path (a .json sidecar is written beside it)."
)
def tokenizer_train_bpe(
    corpus: tuple[str, ...], vocab_size: int, pattern: str, min_count: int, first_stage_trainer: str, out: str
) -> None:
    """Train a first-stage byte-level BPE on a corpus; use the result as --encoding PATH."""
    from hbpe.pipeline.tokenizer.first_stage_train import count_pretokens, train_first_stage, write_encoding
    from hbpe.pipeline.tokenizer.stats import read_texts

    _check_pattern(pattern)
    texts, _ = read_texts(corpus)
    words = count_pretokens(texts, pattern)
    ranks = train_first_stage(words, vocab_size, min_count=min_count, trainer=first_stage_trainer)
    path = write_encoding(ranks, out, pattern=pattern)
    note = "" if len(ranks) >= vocab_size else f" (stopped early: no pair occurs >= {min_count} times)"
    click.echo(
        f"trained a {len(ranks)}-token first stage ({first_stage_trainer}) on {len(words)} distinct words{note} -> {path}"
    )


@tokenizer.command("info")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True)
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="PNG of the patch-length histograms.")
def tokenizer_info(directory: str, as_json: bool, plot: str | None) -> None:
    """V', merges, S, mode and the vocabulary's patch-length histogram before/after the second stage."""
    from hbpe.pipeline.tokenizer import artifact
    from hbpe.pipeline.tokenizer import info as info_mod

    tok = artifact.load(directory)
    info = info_mod.describe(tok)
    if plot:
        info_mod.plot_histograms(info, plot)
    _emit(info, as_json, info_mod.render)


@tokenizer.command("encode")
@click.option("--tokenizer", "tokenizer_dir", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--input", "input_file", type=click.File("rb"), default="-", help="UTF-8 text (default: stdin).")
def tokenizer_encode(tokenizer_dir: str, input_file: Any) -> None:
    """Text -> JSON {"tokens": [...], "patches": [[...], ...]} (patches without PAD)."""
    from hbpe.pipeline.tokenizer import artifact, json_io

    text = json_io.text_from_bytes(input_file.read())  # before loading: a wrong input fails fast
    tok = artifact.load(tokenizer_dir)
    click.echo(json_io.dumps_encoded(json_io.encode_to_dict(tok, text)))


@tokenizer.command("decode")
@click.option("--tokenizer", "tokenizer_dir", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--input", "input_file", type=click.File("rb"), default="-", help="JSON from `encode` (default: stdin).")
def tokenizer_decode(tokenizer_dir: str, input_file: Any) -> None:
    """JSON from `encode` -> the text (from `patches`, or `tokens` when no patches are given)."""
    from hbpe.pipeline.tokenizer import artifact, json_io

    obj = json_io.parse_encoded(input_file.read())  # before loading: a wrong input fails fast
    sys.stdout.write(json_io.decode_from_dict(artifact.load(tokenizer_dir), obj))


@tokenizer.command("stats")
@click.option("--tokenizer", "tokenizer_dir", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--corpus", multiple=True, required=True, help="jsonl / jsonl.zst / txt (repeatable).")
@click.option("--text-field", default="text", show_default=True)
@click.option("--json", "as_json", is_flag=True)
def tokenizer_stats(tokenizer_dir: str, corpus: tuple[str, ...], text_field: str, as_json: bool) -> None:
    """Bytes per token, symbols per patch (in the tokenizer's mode) and fertility on a corpus."""
    from hbpe.pipeline.corpus.documents import RecordPolicy
    from hbpe.pipeline.tokenizer import artifact
    from hbpe.pipeline.tokenizer.stats import file_stats

    tok = artifact.load(tokenizer_dir)
    _emit(
        file_stats(tok, corpus, RecordPolicy(text_field=text_field)).to_dict(),
        as_json,
        lambda d: (
            f"documents {d['documents']} (rejected {d['rejected']})  bytes {d['bytes']}  tokens {d['tokens']}\n"
            f"bytes/token {d['bytes_per_token']:.3f}  symbols/patch ({tok.mode}) {d['symbols_per_patch']:.3f}  "
            f"fertility {d['fertility']:.3f}"
        ),
    )


# --------------------------------------------------------------------------- bench


@main.group(cls=_Group)
def bench() -> None:
    """Benchmarks that print numbers and ratios."""


@bench.command("tokenizer")
@click.option("--tokenizer", "tokenizer_dir", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--corpus", required=True)
@click.option("--repeat", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def bench_tokenizer_cmd(tokenizer_dir: str, corpus: str, repeat: int, as_json: bool) -> None:
    """Encoding MB/s of tiktoken alone and with the second stage, in one run; second-stage training time."""
    from hbpe.pipeline.tokenizer import artifact
    from hbpe.pipeline.tokenizer.bench import bench_tokenizer
    from hbpe.pipeline.tokenizer.stats import read_texts

    texts, _ = read_texts([corpus])
    r = bench_tokenizer(artifact.load(tokenizer_dir), texts, repeat=repeat)

    def render(r: dict) -> str:
        m = r["mb_per_s"]
        return "\n".join(
            [
                f"{r['encoding']} S={r['max_patch_size']} mode={r['mode']}: {r['merges']} merges, V'={r['vocab_size']}; "
                f"corpus {r['corpus_mb']:.2f} MB",
                f"second-stage training          {r['second_stage_train_s'] * 1000:9.1f} ms",
                f"tiktoken encode_ordinary       {m['tiktoken_encode_ordinary']:9.2f} MB/s",
                f"hbpe (tiktoken + table)        {m['hbpe_encode']:9.2f} MB/s   ratio {r['ratio_single']:.3f}",
                f"tiktoken batch ({r['threads']} threads)     {m['tiktoken_encode_ordinary_batch']:9.2f} MB/s",
                f"hbpe batch ({r['threads']} threads)         {m['hbpe_encode_batch']:9.2f} MB/s   ratio {r['ratio_batch']:.3f}",
            ]
        )

    _emit(r, as_json, render)


@bench.command("sweep")
@click.option("--encodings", default="gpt2,cl100k_base,o200k_base", show_default=True)
@click.option("--sizes", default="6,8,10", show_default=True)
@click.option("--corpus", required=True)
@click.option("--repeat", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def bench_sweep_cmd(encodings: str, sizes: str, corpus: str, repeat: int, as_json: bool) -> None:
    """Merges, V', second-stage training time and symbols/patch in both modes, per encoding and S."""
    from hbpe.pipeline.tokenizer.bench import bench_sweep
    from hbpe.pipeline.tokenizer.stats import read_texts

    try:
        max_patch_sizes = [int(s) for s in sizes.split(",")]
    except ValueError as e:
        raise HbpeError(f"--sizes {sizes!r} is not a comma-separated list of integers; e.g. --sizes 6,8,10") from e
    if min(max_patch_sizes) < 2:
        raise HbpeError(f"--sizes {sizes!r}: every S must be at least 2; e.g. --sizes 6,8,10")
    texts, _ = read_texts([corpus])
    rows = bench_sweep(encodings.split(","), max_patch_sizes, texts, repeat=repeat)

    def render(rows: list[dict]) -> str:
        head = f"{'encoding':<12} {'S':>3} {'merges':>7} {'V_prime':>7} {'train_ms':>9} {'B/patch':>8} {'sym/p full':>10} {'sym/p min':>10}"
        lines = [head]
        for r in rows:
            lines.append(
                f"{r['encoding']:<12} {r['S']:>3} {r['merges']:>7} {r['vocab_size']:>7} {r['train_s'] * 1000:>9.1f} "
                f"{r['bytes_per_patch']:>8.3f} {r['symbols_per_patch_full']:>10.3f} {r['symbols_per_patch_minimal']:>10.3f}"
            )
        return "\n".join(lines)

    _emit(rows, as_json, render)


@bench.command("first-stage")
@click.option("--corpus", "corpus", multiple=True, required=True, help="jsonl / jsonl.zst / txt files (repeatable).")
@click.option("--vocab-size", type=click.IntRange(min=256), required=True)
@click.option("--pattern", default="cl100k_base", show_default=True, help="Split pattern name or regex.")
@click.option("--min-count", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--repeat", type=click.IntRange(min=1), default=2, show_default=True, help="Runs of each trainer.")
@click.option("--json", "as_json", is_flag=True)
def bench_first_stage_cmd(
    corpus: tuple[str, ...], vocab_size: int, pattern: str, min_count: int, repeat: int, as_json: bool
) -> None:
    """In-house vs HF `tokenizers` first-stage BPE on the same word counts: seconds, peak RSS, identical ranks."""
    from hbpe.pipeline.tokenizer.bench import bench_first_stage, render_first_stage

    _check_pattern(pattern)
    r = bench_first_stage(list(corpus), vocab_size, pattern=pattern, min_count=min_count, repeat=repeat)
    _emit(r, as_json, render_first_stage)


# --------------------------------------------------------------------------- data and training commands
# defined in their own modules to keep this file small; attached here, so `main` is complete on import

for _cmd in (
    cli_data.convert,
    cli_data.shards,
    cli_train.train_cmd,
    cli_train.eval_cmd,
    cli_train.generate_cmd,
    cli_train.export_cmd,
    cli_train.checkpoint_group,
):
    main.add_command(_cmd)
main.add_command(cli_experiment.flops_cmd)
main.add_command(cli_experiment.experiment_cmd)
main.add_command(cli_eval.eval_tasks_cmd)
for _cmd in (cli_data.bench_convert, cli_train.bench_train_cmd, cli_train.bench_generate_cmd):
    bench.add_command(_cmd)


if __name__ == "__main__":  # python -m hbpe.cli
    main(prog_name="hbpe")
