"""CLI commands of the paper's experiments: `hbpe flops` (Table 1's columns) and `hbpe experiment`."""

from __future__ import annotations

import click

from hbpe.cli.common import Command, emit, is_quiet, json_option, say


@click.command("flops", cls=Command)
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
    emit(
        rows,
        as_json,
        lambda rs: (
            f"forward pass on {input_bytes} bytes of {shards}\n{render_table1(rs)}\n\n"
            f"{render_ffn_readings(rs)}\n\n{render_paper_setup(paper_setup_rows())}"
        ),
    )


@click.command("experiment", cls=Command)
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
@click.option(
    "--only",
    multiple=True,
    metavar="RUN",
    show_default="every run of the spec",
    help="Train only these runs of the spec (repeatable): two processes can share an experiment's runs, each "
    "in its own --out, and the report covers the runs given.",
)
@json_option("results.json instead of the table")
def experiment_cmd(
    preset: str, overrides: tuple[str, ...], out: str | None, train_input: tuple[str, ...],
    eval_input: tuple[str, ...], entropy_input: tuple[str, ...], only: tuple[str, ...], as_json: bool,
) -> None:  # fmt: skip
    """Run an experiment: a preset (table1-mini, chinese-mini, vocab-mini, s-ablation-mini,
    crossover-mini, ladder-paper-mini, ladder-width, ladder-data, ladder-s, lr-sweep-mini, lr-sweep-width, k-along-training,
    k-along-training-lr, ladder-gpu,
    table1-small, table3-medium) or a YAML file, with key=value overrides of its spec
    (`batches=100`, `model.latent_layers=4` for every run). Writes results.json, table.md and
    PNG plots to --out. `hbpe experiment list` prints each preset with its description;
    `hbpe experiment summary FOLDER...` puts the ladder pairs of finished experiments in one table and
    one plot (rungs.md, rungs.png in --out): the gap and k against parameters and tokens per parameter;
    `hbpe experiment k-along FOLDER...` reads k along training from k-along-training's runs, with
    document-bootstrap intervals (k_along.md, k_along.json, k_along.png in --out).

    \b
    Example:
      hbpe experiment table1-mini --out runs/experiments/table1-mini
      hbpe experiment list
      hbpe experiment summary docs/experiments/ladder-width docs/experiments/ladder-data --out /tmp/rungs
    """
    from pathlib import Path

    if preset == "list":
        _list_presets(overrides, as_json)
        return
    if preset == "summary":
        _summary(overrides, out, as_json)
        return
    if preset == "k-along":
        _k_along(overrides, out, as_json)
        return
    from hbpe.experiments.presets import load_spec, only_runs
    from hbpe.experiments.runner import run_experiment

    spec = load_spec(preset, overrides, train_corpus=train_input, eval_corpus=eval_input, entropy_corpus=entropy_input)
    if only:
        spec = only_runs(spec, only)
    folder = Path(out or Path("runs", "experiments", spec.name))
    report = run_experiment(spec, folder, on_event=say, progress=not is_quiet())
    emit(report, as_json, lambda r: r["table"] + "\n" + "\n".join(f"plot: {p}" for p in r["plots"]))


def _summary(folders: tuple[str, ...], out: str | None, as_json: bool) -> None:
    """`hbpe experiment summary FOLDER...`: every rung of the ladders in one table and plot (rungs.py)."""
    from pathlib import Path

    from hbpe.experiments.rungs import write_summary

    if not folders:
        raise click.UsageError(
            "`hbpe experiment summary` takes the folders of finished experiments (e.g. runs/experiments/ladder-width)"
        )
    report = write_summary([Path(f) for f in folders], Path(out or Path("runs", "experiments", "summary")))
    emit(report, as_json, lambda r: r["table"] + "\n" + "\n".join(f"plot: {p}" for p in r["files"][1:]))


def _k_along(folders: tuple[str, ...], out: str | None, as_json: bool) -> None:
    """`hbpe experiment k-along FOLDER...`: k along training from k-along-training's runs (k_along.py)."""
    from pathlib import Path

    from hbpe.experiments.k_along import write_readout

    if not folders:
        raise click.UsageError(
            "`hbpe experiment k-along` takes the folders of finished k-along-training runs (and k-along-training-lr's)"
        )
    report = write_readout([Path(f) for f in folders], Path(out or Path("runs", "experiments", "k-along")))
    emit(report["analysis"], as_json, lambda r: report["table"] + "\n".join(f"file: {p}" for p in report["files"]))


def _list_presets(overrides: tuple[str, ...], as_json: bool) -> None:
    """`hbpe experiment list`: one line per preset, its name and the first line of its description."""
    from hbpe.experiments.presets import describe_presets

    if overrides:
        raise click.UsageError(f"`hbpe experiment list` takes no overrides (got {' '.join(overrides)})")
    presets = describe_presets()
    width = max(map(len, presets))
    emit(presets, as_json, lambda d: "\n".join(f"{name:<{width}}  {line}" for name, line in d.items()))
