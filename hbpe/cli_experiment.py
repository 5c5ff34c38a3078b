"""CLI commands of the paper's experiments: `hbpe flops` (Table 1's columns) and `hbpe experiment`."""

from __future__ import annotations

import click

from hbpe.cli_common import _emit


@click.command("flops")
@click.argument("config")
@click.argument("overrides", nargs=-1)
@click.option("--data", default=None, help="Shards to measure patching on (default: the config's data.train).")
@click.option(
    "--bytes", "input_bytes", type=click.IntRange(min=1), default=8192, show_default=True, help="Text per forward pass."
)
@click.option("--samples", type=click.IntRange(min=1), default=256, show_default=True, help="Samples measured.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def flops_cmd(
    config: str, overrides: tuple[str, ...], data: str | None, input_bytes: int, samples: int, as_json: bool
) -> None:
    """The paper's Table 1 columns for every scheme at CONFIG's sizes: forward GFLOPs (local
    encoder, local decoder, latent, total) for --bytes of text, fertility, parameters, bytes and
    symbols per patch, from the patch lengths measured on the shards. The entropy rows need
    model.entropy_model (and a threshold or target) in the config or the overrides.

    Example: hbpe flops small data.train=runs/demo/shards-train --bytes 8192
    """
    from hbpe.training.config_io import load_config
    from hbpe.training.scheme_stats import flops_table, render_table1
    from hbpe.training.trainer import resolve_tokenizer

    cfg = load_config(config, list(overrides))
    shards = data or cfg.data.train_sources[0]  # with data.streams: the first stream
    tok, _ = resolve_tokenizer(cfg)
    rows = flops_table(cfg.model_config, tok, shards, input_bytes=input_bytes, samples=samples)
    _emit(rows, as_json, lambda rs: f"forward pass on {input_bytes} bytes of {shards}\n" + render_table1(rs))


@click.command("experiment")
@click.argument("preset")
@click.argument("overrides", nargs=-1)
@click.option(
    "--out", default=None, help="Output folder (default: runs/experiments/PRESET). A rerun skips finished runs."
)
@click.option("--train-corpus", multiple=True, help="Training corpus files (jsonl, jsonl.zst, txt; repeatable).")
@click.option(
    "--eval-corpus", multiple=True, help="Held-out corpus files (default: every 10th document of the training corpus)."
)
@click.option("--json", "as_json", is_flag=True, help="Print results.json instead of the table.")
def experiment_cmd(
    preset: str, overrides: tuple[str, ...], out: str | None, train_corpus: tuple[str, ...],
    eval_corpus: tuple[str, ...], as_json: bool,
) -> None:  # fmt: skip
    """Run an experiment: a preset (table1-mini, chinese-mini, vocab-mini, s-ablation-mini,
    table1-small, table3-medium) or a YAML file, with key=value overrides of its spec
    (`batches=100`, `model.latent_layers=4` for every run). Writes results.json, table.md and
    PNG plots to --out.

    Example: hbpe experiment table1-mini --out runs/experiments/table1-mini
    """
    from pathlib import Path

    from hbpe.training.experiments.presets import load_spec
    from hbpe.training.experiments.runner import run_experiment

    spec = load_spec(preset, overrides, train_corpus=train_corpus, eval_corpus=eval_corpus)
    folder = Path(out or Path("runs", "experiments", spec.name))
    report = run_experiment(spec, folder, on_event=lambda line: click.echo(line, err=True))
    _emit(report, as_json, lambda r: r["table"] + "\n" + "\n".join(f"plot: {p}" for p in r["plots"]))
