"""The `hbpe` command line: thin commands that parse, call one library function, print.

Heavy libraries (torch, composer, beam) are imported inside the commands that
need them, so `hbpe tokenizer ...` starts fast.
"""

from __future__ import annotations

import sys
from typing import Any

import click

import hbpe
from hbpe import cli_data, cli_eval, cli_experiment, cli_plot, cli_train
from hbpe.cli_common import (
    CONTEXT_SETTINGS,
    _emit,
    _Group,
    check_local_paths,
    is_quiet,
    json_option,
    say,
    set_verbosity,
)
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


@click.group(cls=_Group, context_settings=CONTEXT_SETTINGS)
@click.version_option(hbpe.__version__, prog_name="hbpe")
@click.option("--verbose", "-v", is_flag=True, help="Log hbpe's INFO and DEBUG lines on stderr.")
@click.option("--quiet", "-q", is_flag=True, help="Only warnings and errors: no progress bars or progress lines.")
@click.pass_context
def main(ctx: click.Context, verbose: bool, quiet: bool) -> None:
    """hbpe: hierarchical BPE tokenizers, MDS shards, and hierarchical patch LMs.

    Names are the same across commands: --tokenizer DIR, --input FILE (read), --out PATH
    (written), --data SHARDS, --checkpoint PATH, a positional CONFIG [key=value ...], and --json
    on every command that reports. Paths may be gs:// or s3:// URIs where the data can live there.

    \b
    Example:
      hbpe demo --out runs/demo
      hbpe -q convert --tokenizer runs/demo/tokenizer --input data/sample/en-sotu-sample.jsonl.zst --out /tmp/shards-q
    """
    from hbpe.pipeline.beam.quiet import quiet_beam

    set_verbosity(ctx, verbose=verbose, quiet=quiet)
    quiet_beam()


@main.command("demo")
@click.option("--out", default="runs/demo", help="Folder for everything the demo makes.")
@click.option(
    "--batches", type=click.IntRange(min=1), default=300, show_default=True, help="Training batches of the tiny model."
)
@json_option("the artifacts' paths and every stage's result")
def demo(out: str, batches: int, as_json: bool) -> None:
    """Run the main job end to end on the bundled sample (embedded defaults).

    Step lines go to stdout (stderr with --json; none with -q), then the summary.

    \b
    Example:
      hbpe demo --out runs/demo
    """
    from pathlib import Path

    from hbpe.demo import render_summary, run_demo

    step = say if as_json or is_quiet() else click.echo  # stdout holds the JSON alone
    result = run_demo(Path(out), train_batches=batches, on_step=step, progress=not is_quiet())
    _emit(result, as_json, render_summary)


# --------------------------------------------------------------------------- tokenizer

# what `convert --input` takes, read the same way (pipeline/corpus/inputs.py's resolve_inputs)
_INPUT_FILES_HELP = (
    "Corpus file, directory, glob (quoted: 'DIR/*.jsonl') or URI (repeatable): jsonl, txt, parquet, "
    "optionally .gz/.zst/.bz2."
)
_TOKENIZER_HELP = "Tokenizer directory from `hbpe tokenizer train`."


@main.group(cls=_Group)
def tokenizer() -> None:
    """Train, inspect and apply the two-stage tokenizer.

    \b
    Example:
      hbpe tokenizer train --encoding gpt2 -S 10 --out /tmp/tok
    """


@tokenizer.command("train")
@click.option(
    "--encoding", required=True, help="tiktoken name (gpt2, cl100k_base, ...) or a .tiktoken rank file (path or URI)."
)
@click.option(
    "--pattern",
    default=None,
    show_default="the encoding's own",
    help="Split pattern for a rank file: a name (gpt2, cl100k_base, llama3, o200k_base) or a regex.",
)
@click.option("--max-patch-size", "-S", type=click.IntRange(min=2), required=True, help="S: maximum symbols per patch.")
@click.option(
    "--mode",
    type=click.Choice(["full", "minimal"]),
    default="full",
    help="How merges apply to a patch: full (every merge, in rank order) or minimal (stop once it fits S).",
)
@click.option("--out", required=True, help="The tokenizer directory to write (or a gs:// / s3:// prefix).")
@click.option("--overwrite", is_flag=True, help="Replace an earlier tokenizer in --out (nothing else).")
@json_option()
def tokenizer_train(
    encoding: str, pattern: str | None, max_patch_size: int, mode: str, out: str, overwrite: bool, as_json: bool
) -> None:
    """Learn the second stage (Algorithm 1) over a first-stage vocabulary and save the artifact.

    \b
    Example:
      hbpe tokenizer train --encoding gpt2 -S 10 --out /tmp/tok
    """
    import time

    from hbpe.pipeline.tokenizer import artifact

    _check_pattern(pattern)
    artifact.check_out(out, overwrite=overwrite)  # a refused --out (or a missing bucket) costs no training
    t = time.perf_counter()
    tok = artifact.train_tokenizer(encoding, max_patch_size=max_patch_size, mode=mode, pattern=pattern)
    artifact.save(tok, out, overwrite=overwrite)
    r = {
        "encoding": tok.encoding.name,
        "max_patch_size": max_patch_size,
        "mode": mode,
        "merges": len(tok.merges),
        "vocab_size": tok.vocab_size,
        "seconds": round(time.perf_counter() - t, 3),
        "out": out,
        "fingerprint": tok.fingerprint,
    }
    _emit(
        r,
        as_json,
        lambda r: (
            f"trained {r['encoding']} S={r['max_patch_size']} mode={r['mode']}: {r['merges']} merges, "
            f"V'={r['vocab_size']} in {r['seconds']:.2f}s -> {r['out']} (fingerprint {r['fingerprint'][:12]})"
        ),
    )


@tokenizer.command("train-bpe")
@click.option("--input", "inputs", multiple=True, required=True, help=_INPUT_FILES_HELP)
@click.option("--vocab-size", type=click.IntRange(min=256), required=True, help="Tokens of the first stage to learn.")
@click.option("--pattern", default="cl100k_base", help="Split pattern: a name or a regex.")
@click.option("--min-count", type=click.IntRange(min=1), default=2, help="Stop when no pair occurs this often.")
@click.option(
    "--first-stage-trainer",
    type=click.Choice(["hf", "hbpe"]),
    default="hf",
    help="hf: HuggingFace tokenizers' Rust trainer; hbpe: the in-house Python one. Same ranks.",
)
@click.option(
    "--out",
    required=True,
    help="The .tiktoken rank file to write, a path or URI (a .json sidecar is written beside it).",
)
@json_option()
def tokenizer_train_bpe(
    inputs: tuple[str, ...],
    vocab_size: int,
    pattern: str,
    min_count: int,
    first_stage_trainer: str,
    out: str,
    as_json: bool,
) -> None:
    """Train a first-stage byte-level BPE on a corpus; use the result as `tokenizer train --encoding PATH`.

    \b
    Example:
      hbpe tokenizer train-bpe --input data/sample/zh-kernel-docs-sample.jsonl.zst --vocab-size 600 --out /tmp/zh.tiktoken
    """
    from hbpe.pipeline.tokenizer.first_stage_train import (
        check_out,
        count_pretokens,
        train_first_stage,
        write_encoding,
    )
    from hbpe.pipeline.tokenizer.stats import read_texts

    _check_pattern(pattern)
    check_local_paths("--input", inputs)
    check_out(out)  # a missing bucket is one error before any reading or training
    texts, _ = read_texts(inputs)
    words = count_pretokens(texts, pattern)
    ranks = train_first_stage(words, vocab_size, min_count=min_count, trainer=first_stage_trainer)
    path = write_encoding(ranks, out, pattern=pattern)
    r = {
        "trainer": first_stage_trainer,
        "vocab_size": len(ranks),
        "requested_vocab_size": vocab_size,
        "min_count": min_count,
        "distinct_words": len(words),
        "out": str(path),
    }

    def render(r: dict[str, Any]) -> str:
        short = r["vocab_size"] < r["requested_vocab_size"]
        note = f" (stopped early: no pair occurs >= {r['min_count']} times)" if short else ""
        return (
            f"trained a {r['vocab_size']}-token first stage ({r['trainer']}) on {r['distinct_words']} distinct "
            f"words{note} -> {r['out']}"
        )

    _emit(r, as_json, render)


@tokenizer.command("info")
@click.option("--tokenizer", "tokenizer_dir", required=True, help=_TOKENIZER_HELP)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False),
    default=None,
    show_default="no plot",
    help="Write a PNG of the patch-length histograms here.",
)
@json_option()
def tokenizer_info(tokenizer_dir: str, as_json: bool, plot: str | None) -> None:
    """V', merges, S, mode and the vocabulary's patch-length histogram before/after the second stage.

    \b
    Example:
      hbpe tokenizer info --tokenizer runs/demo/tokenizer --plot /tmp/histogram.png
    """
    from hbpe.pipeline.tokenizer import artifact
    from hbpe.pipeline.tokenizer import info as info_mod

    check_local_paths("--tokenizer", tokenizer_dir)
    tok = artifact.load(tokenizer_dir)
    info = info_mod.describe(tok)
    if plot:
        info_mod.plot_histograms(info, plot)
    _emit(info, as_json, info_mod.render)


@tokenizer.command("encode")
@click.option("--tokenizer", "tokenizer_dir", required=True, help=_TOKENIZER_HELP)
@click.option(
    "--input", "input_file", type=click.File("rb"), default="-", show_default="stdin", help="UTF-8 text file."
)
def tokenizer_encode(tokenizer_dir: str, input_file: Any) -> None:
    """Text -> JSON {"tokens": [...], "patches": [[...], ...]} (patches without PAD).

    \b
    Example:
      echo "Fellow-Citizens" | hbpe tokenizer encode --tokenizer runs/demo/tokenizer
    """
    from hbpe.pipeline.tokenizer import artifact, json_io

    check_local_paths("--tokenizer", tokenizer_dir)
    text = json_io.text_from_bytes(input_file.read())  # before loading: a wrong input fails fast
    tok = artifact.load(tokenizer_dir)
    click.echo(json_io.dumps_encoded(json_io.encode_to_dict(tok, text)))


@tokenizer.command("decode")
@click.option("--tokenizer", "tokenizer_dir", required=True, help=_TOKENIZER_HELP)
@click.option(
    "--input", "input_file", type=click.File("rb"), default="-", show_default="stdin", help="JSON from `encode`."
)
def tokenizer_decode(tokenizer_dir: str, input_file: Any) -> None:
    """JSON from `encode` -> the text (from `patches`, or `tokens` when no patches are given).

    \b
    Example:
      echo "Fellow-Citizens" | hbpe tokenizer encode --tokenizer runs/demo/tokenizer | hbpe tokenizer decode --tokenizer runs/demo/tokenizer
    """
    from hbpe.pipeline.tokenizer import artifact, json_io

    check_local_paths("--tokenizer", tokenizer_dir)
    obj = json_io.parse_encoded(input_file.read())  # before loading: a wrong input fails fast
    sys.stdout.write(json_io.decode_from_dict(artifact.load(tokenizer_dir), obj))


@tokenizer.command("stats")
@click.option("--tokenizer", "tokenizer_dir", required=True, help=_TOKENIZER_HELP)
@click.option("--input", "inputs", multiple=True, required=True, help=_INPUT_FILES_HELP)
@click.option("--text-field", default="text", help="Dotted path of the text in each record.")
@json_option()
def tokenizer_stats(tokenizer_dir: str, inputs: tuple[str, ...], text_field: str, as_json: bool) -> None:
    """Bytes per token, symbols per patch (in the tokenizer's mode) and fertility on a corpus.

    \b
    Example:
      hbpe tokenizer stats --tokenizer runs/demo/tokenizer --input data/sample/en-sotu-sample.jsonl.zst
    """
    from hbpe.pipeline.corpus.documents import RecordPolicy
    from hbpe.pipeline.tokenizer import artifact
    from hbpe.pipeline.tokenizer.stats import file_stats

    check_local_paths("--tokenizer", tokenizer_dir)
    check_local_paths("--input", inputs)
    tok = artifact.load(tokenizer_dir)
    _emit(
        file_stats(tok, inputs, RecordPolicy(text_field=text_field)).to_dict(),
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
    """Benchmarks that print numbers and ratios.

    \b
    Example:
      hbpe bench sweep --encodings gpt2 --sizes 6,10 --input data/sample/en-sotu-sample.jsonl.zst
    """


@bench.command("tokenizer")
@click.option("--tokenizer", "tokenizer_dir", required=True, help=_TOKENIZER_HELP)
@click.option("--input", "inputs", multiple=True, required=True, help=_INPUT_FILES_HELP)
@click.option("--repeat", type=click.IntRange(min=1), default=3, help="Runs of each encoder (the best is kept).")
@json_option()
def bench_tokenizer_cmd(tokenizer_dir: str, inputs: tuple[str, ...], repeat: int, as_json: bool) -> None:
    """Encoding MB/s of tiktoken alone and with the second stage, in one run; second-stage training time.

    \b
    Example:
      hbpe bench tokenizer --tokenizer runs/demo/tokenizer --input data/sample/en-sotu-sample.jsonl.zst --repeat 1
    """
    from hbpe.pipeline.tokenizer import artifact
    from hbpe.pipeline.tokenizer.bench import bench_tokenizer
    from hbpe.pipeline.tokenizer.stats import read_texts

    check_local_paths("--tokenizer", tokenizer_dir)
    check_local_paths("--input", inputs)
    texts, _ = read_texts(inputs)
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
@click.option("--encodings", default="gpt2,cl100k_base,o200k_base", help="Comma-separated first stages.")
@click.option("--sizes", default="6,8,10", help="Comma-separated S values.")
@click.option("--input", "inputs", multiple=True, required=True, help=_INPUT_FILES_HELP)
@click.option("--repeat", type=click.IntRange(min=1), default=3, help="Runs of each training (the best is kept).")
@json_option("the rows")
def bench_sweep_cmd(encodings: str, sizes: str, inputs: tuple[str, ...], repeat: int, as_json: bool) -> None:
    """Merges, V', second-stage training time and symbols/patch in both modes, per encoding and S.

    \b
    Example:
      hbpe bench sweep --encodings gpt2 --sizes 6,10 --input data/sample/en-sotu-sample.jsonl.zst
    """
    from hbpe.pipeline.tokenizer.bench import bench_sweep
    from hbpe.pipeline.tokenizer.stats import read_texts

    try:
        max_patch_sizes = [int(s) for s in sizes.split(",")]
    except ValueError as e:
        raise HbpeError(f"--sizes {sizes!r} is not a comma-separated list of integers; e.g. --sizes 6,8,10") from e
    if min(max_patch_sizes) < 2:
        raise HbpeError(f"--sizes {sizes!r}: every S must be at least 2; e.g. --sizes 6,8,10")
    check_local_paths("--input", inputs)
    texts, _ = read_texts(inputs)
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
@click.option("--input", "inputs", multiple=True, required=True, help=_INPUT_FILES_HELP)
@click.option("--vocab-size", type=click.IntRange(min=256), required=True, help="Tokens of the first stage to learn.")
@click.option("--pattern", default="cl100k_base", help="Split pattern: a name or a regex.")
@click.option("--min-count", type=click.IntRange(min=1), default=2, help="Stop when no pair occurs this often.")
@click.option("--repeat", type=click.IntRange(min=1), default=2, help="Runs of each trainer.")
@json_option()
def bench_first_stage_cmd(
    inputs: tuple[str, ...], vocab_size: int, pattern: str, min_count: int, repeat: int, as_json: bool
) -> None:
    """In-house vs HF `tokenizers` first-stage BPE on the same word counts: seconds, peak RSS, identical ranks.

    \b
    Example:
      hbpe bench first-stage --input data/sample/en-sotu-sample.jsonl.zst --vocab-size 1000 --repeat 1
    """
    from hbpe.pipeline.tokenizer.bench import bench_first_stage, render_first_stage

    _check_pattern(pattern)
    check_local_paths("--input", inputs)
    r = bench_first_stage(list(inputs), vocab_size, pattern=pattern, min_count=min_count, repeat=repeat)
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
main.add_command(cli_plot.plot_cmd)
for _cmd in (cli_data.bench_convert, cli_train.bench_train_cmd, cli_train.bench_generate_cmd):
    bench.add_command(_cmd)


if __name__ == "__main__":  # python -m hbpe.cli
    main(prog_name="hbpe")
