"""`hbpe tokenizer ...`: train, inspect and apply the two-stage tokenizer."""

from __future__ import annotations

import sys
from typing import Any

import click

from hbpe.cli.common import (
    Group,
    check_local_paths,
    check_pattern,
    emit,
    first_stage_bpe_options,
    inputs_option,
    json_option,
    text_field_option,
    tokenizer_option,
)


@click.group(cls=Group)
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

    from hbpe import api
    from hbpe.pipeline.tokenizer import artifact

    check_pattern(pattern)
    artifact.check_out(out, overwrite=overwrite)  # a refused --out (or a missing bucket) costs no training
    t = time.perf_counter()
    tok = api.train_tokenizer(encoding, max_patch_size=max_patch_size, mode=mode, pattern=pattern)
    api.save_tokenizer(tok, out, overwrite=overwrite)
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
    emit(
        r,
        as_json,
        lambda r: (
            f"trained {r['encoding']} S={r['max_patch_size']} mode={r['mode']}: {r['merges']} merges, "
            f"V'={r['vocab_size']} in {r['seconds']:.2f}s -> {r['out']} (fingerprint {r['fingerprint'][:12]})"
        ),
    )


@tokenizer.command("tables")
@tokenizer_option
@json_option()
def tokenizer_tables(tokenizer_dir: str, as_json: bool) -> None:
    """Add the built tables to a tokenizer directory (`train` writes them), so it loads without building them.

    Rebuilt from the rank file and merges: this also replaces altered tables or ones an older hbpe wrote.

    \b
    Example:
      hbpe tokenizer tables --tokenizer runs/demo/tokenizer
    """
    from hbpe.pipeline.tokenizer import artifact

    check_local_paths("--tokenizer", tokenizer_dir)
    written = artifact.add_tables(tokenizer_dir)
    r = {"tokenizer": tokenizer_dir, "files": written}
    emit(
        r,
        as_json,
        lambda r: f"wrote {', '.join(f'{n} ({b} bytes)' for n, b in r['files'].items())} into {r['tokenizer']}",
    )


@tokenizer.command("train-bpe")
@inputs_option()
@first_stage_bpe_options
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

    check_pattern(pattern)
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

    emit(r, as_json, render)


@tokenizer.command("info")
@tokenizer_option
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
    from hbpe import api
    from hbpe.pipeline.tokenizer import info as info_mod

    check_local_paths("--tokenizer", tokenizer_dir)
    info = info_mod.describe(api.load_tokenizer(tokenizer_dir))
    if plot:
        info_mod.plot_histograms(info, plot)
    emit(info, as_json, info_mod.render)


@tokenizer.command("encode")
@tokenizer_option
@click.option(
    "--input", "input_file", type=click.File("rb"), default="-", show_default="stdin", help="UTF-8 text file."
)
def tokenizer_encode(tokenizer_dir: str, input_file: Any) -> None:
    """Text -> JSON {"tokens": [...], "patches": [[...], ...]} (patches without PAD).

    \b
    Example:
      echo "Fellow-Citizens" | hbpe tokenizer encode --tokenizer runs/demo/tokenizer
    """
    from hbpe import api
    from hbpe.pipeline.tokenizer import json_io

    check_local_paths("--tokenizer", tokenizer_dir)
    text = json_io.text_from_bytes(input_file.read())  # before loading: a wrong input fails fast
    tok = api.load_tokenizer(tokenizer_dir)
    click.echo(json_io.dumps_encoded(json_io.encode_to_dict(tok, text)))


@tokenizer.command("decode")
@tokenizer_option
@click.option(
    "--input", "input_file", type=click.File("rb"), default="-", show_default="stdin", help="JSON from `encode`."
)
def tokenizer_decode(tokenizer_dir: str, input_file: Any) -> None:
    """JSON from `encode` -> the text (from `patches`, or `tokens` when no patches are given).

    \b
    Example:
      echo "Fellow-Citizens" | hbpe tokenizer encode --tokenizer runs/demo/tokenizer | hbpe tokenizer decode --tokenizer runs/demo/tokenizer
    """
    from hbpe import api
    from hbpe.pipeline.tokenizer import json_io

    check_local_paths("--tokenizer", tokenizer_dir)
    obj = json_io.parse_encoded(input_file.read())  # before loading: a wrong input fails fast
    sys.stdout.write(json_io.decode_from_dict(api.load_tokenizer(tokenizer_dir), obj))


@tokenizer.command("stats")
@tokenizer_option
@inputs_option()
@text_field_option
@json_option()
def tokenizer_stats(tokenizer_dir: str, inputs: tuple[str, ...], text_field: str, as_json: bool) -> None:
    """Bytes per token, symbols per patch (in the tokenizer's mode) and fertility on a corpus.

    \b
    Example:
      hbpe tokenizer stats --tokenizer runs/demo/tokenizer --input data/sample/en-sotu-sample.jsonl.zst
    """
    from hbpe import api
    from hbpe.pipeline.corpus.documents import RecordPolicy
    from hbpe.pipeline.tokenizer.stats import file_stats

    check_local_paths("--tokenizer", tokenizer_dir)
    check_local_paths("--input", inputs)
    tok = api.load_tokenizer(tokenizer_dir)
    emit(
        file_stats(tok, inputs, RecordPolicy(text_field=text_field)).to_dict(),
        as_json,
        lambda d: (
            f"documents {d['documents']} (rejected {d['rejected']})  bytes {d['bytes']}  tokens {d['tokens']}\n"
            f"bytes/token {d['bytes_per_token']:.3f}  symbols/patch ({tok.mode}) {d['symbols_per_patch']:.3f}  "
            f"fertility {d['fertility']:.3f}"
        ),
    )
