"""CLI commands of the paper's experiments: `hbpe flops` (Table 1's columns) and `hbpe experiment`."""

from __future__ import annotations

import click

from hbpe.cli_common import _Command, _emit, is_quiet, json_option, say


@click.command("flops", cls=_Command)
@click.argument("config")
@click.argument("overrides", nargs=-1)
@click.option(
    "--data",
    default=None,
    show_default="the config's data.train",
    help="Shard directory to measure patch lengths on.",
)
@click.option("--bytes", "input_bytes", type=click.IntRange(min=1), default=8192, help="Text per forward pass.")
@click.option("--samples", type=click.IntRange(min=1), default=256, help="Samples measured.")
@json_option("the rows")
def flops_cmd(
    config: str, overrides: tuple[str, ...], data: str | None, input_bytes: int, samples: int, as_json: bool
) -> None:
    """The paper's Table 1 columns for every scheme at CONFIG's sizes: forward GFLOPs (local
    encoder, local decoder, latent, total) for --bytes of text, fertility, parameters, bytes and
    symbols per patch, from the patch lengths measured on the shards. The entropy rows need
    model.entropy_model (and a threshold or target) in the config or the overrides. Every row also
    shows its GFLOPs under each reading of the paper's local FFN (384, 512, 768) beside the paper's,
    and a last table checks the paper's own setup (small, its patch lengths, given boundaries).

    \b
    Example:
      hbpe flops small data.train=runs/demo/shards-train --bytes 8192
    """
    from hbpe.training import (
        flops_table,
        load_config,
        paper_setup_rows,
        render_ffn_readings,
        render_paper_setup,
        render_table1,
        resolve_tokenizer,
        with_measured_data,
    )

    cfg = load_config(config, list(overrides), check_paths=False)
    cfg = with_measured_data(cfg, data)  # --data replaces the config's data paths (checked after)
    shards = cfg.data.train_sources[0]  # with data.streams: the first stream
    tok, _ = resolve_tokenizer(cfg)
    rows = flops_table(cfg.model, tok, shards, input_bytes=input_bytes, samples=samples)
    _emit(
        rows,
        as_json,
        lambda rs: (
            f"forward pass on {input_bytes} bytes of {shards}\n{render_table1(rs)}\n\n"
            f"{render_ffn_readings(rs)}\n\n{render_paper_setup(paper_setup_rows())}"
        ),
    )


@click.command("experiment", cls=_Command)
@click.argument("preset")
@click.argument("overrides", nargs=-1)
@click.option(
    "--out",
    default=None,
    show_default="runs/experiments/PRESET",
    help="Output folder, one experiment's at a time; a rerun skips finished runs of unchanged inputs.",
)
@click.option(
    "--train-input",
    multiple=True,
    show_default="the preset's corpus",
    help="Training corpus files (jsonl, jsonl.zst, txt; repeatable).",
)
@click.option(
    "--eval-input",
    multiple=True,
    show_default="every 10th document of the training corpus",
    help="Held-out corpus files (repeatable).",
)
@click.option(
    "--entropy-input",
    multiple=True,
    show_default="the training split (the bytes run itself)",
    help="Corpus files the entropy rows' entropy model is trained on, as the paper's came from other data (repeatable).",
)
@json_option("results.json instead of the table")
def experiment_cmd(
    preset: str, overrides: tuple[str, ...], out: str | None, train_input: tuple[str, ...],
    eval_input: tuple[str, ...], entropy_input: tuple[str, ...], as_json: bool,
) -> None:  # fmt: skip
    """Run an experiment: a preset (table1-mini, chinese-mini, vocab-mini, s-ablation-mini,
    crossover-mini, ladder-paper-mini, ladder-width, ladder-data, ladder-s, lr-sweep-mini, ladder-gpu,
    table1-small, table3-medium) or a YAML file, with key=value overrides of its spec
    (`batches=100`, `model.latent_layers=4` for every run). Writes results.json, table.md and
    PNG plots to --out.

    \b
    Example:
      hbpe experiment table1-mini --out runs/experiments/table1-mini
    """
    from pathlib import Path

    from hbpe.experiments.presets import load_spec
    from hbpe.experiments.runner import run_experiment

    if entropy_input:  # the spec key entropy_corpus, as an override would set it
        import json

        overrides = (*overrides, f"entropy_corpus={json.dumps(list(entropy_input))}")
    spec = load_spec(preset, overrides, train_corpus=train_input, eval_corpus=eval_input)
    folder = Path(out or Path("runs", "experiments", spec.name))
    report = run_experiment(spec, folder, on_event=say, progress=not is_quiet())
    _emit(report, as_json, lambda r: r["table"] + "\n" + "\n".join(f"plot: {p}" for p in r["plots"]))
