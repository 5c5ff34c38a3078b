"""CLI commands of the trainer: `hbpe train`, `hbpe eval`, `hbpe generate`, `hbpe bench train|generate`."""

from __future__ import annotations

import sys
from typing import Any

import click

from hbpe.cli_common import _emit


@click.command("train")
@click.argument("config")
@click.argument("overrides", nargs=-1)
@click.option(
    "--nproc",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Processes on this node (Composer's launcher).",
)
@click.option("--json", "as_json", is_flag=True)
def train_cmd(config: str, overrides: tuple[str, ...], nproc: int, as_json: bool) -> None:
    """Train from a YAML config (a path or tiny/small/medium) with key=value overrides.

    Example: hbpe train tiny data.train=runs/demo/shards-train max_duration=200ba
    """
    from hbpe.training.config_io import load_config

    cfg = load_config(config, list(overrides))  # validate before launching anything
    if nproc > 1:
        _emit(_train_on_processes(config, overrides, nproc), as_json, _render_train)
        return
    from hbpe.training.trainer import train

    _emit(train(cfg), as_json, _render_train)


def _train_on_processes(config: str, overrides: tuple[str, ...], nproc: int) -> dict[str, Any]:
    """Composer's launcher over `nproc` ranks -> rank 0's result (a failed rank has printed its `error:` line)."""
    import json
    import os
    import tempfile
    from pathlib import Path

    from hbpe.training.launch import RESULT_FILE_ENV
    from hbpe.training.launch_command import launch

    with tempfile.TemporaryDirectory(prefix="hbpe-train-") as tmp:
        result_file = Path(tmp, "result.json")
        os.environ[RESULT_FILE_ENV] = str(result_file)  # the launcher's ranks inherit this environment
        try:
            status = launch(config, overrides, nproc=nproc)
        finally:
            del os.environ[RESULT_FILE_ENV]
        if status != 0:
            sys.exit(status)
        return json.loads(result_file.read_text())


def _render_train(r: dict[str, Any]) -> str:
    ev = r["eval"]
    return (
        f"trained {r['batches']} batches in {r['wall_s']:.1f}s on {r['device']} ({r['params'] / 1e6:.2f}M params, {r['precision']}); "
        f"{r['throughput']['bytes_per_sec'] / 1e3:.1f} KB/s, {r['throughput']['patches_per_sec']:.0f} patches/s"
        + (f"; eval BPB {ev['BitsPerByte']:.4f}" if ev else "")
        + f"\ncheckpoints: {r['save_folder']}"
    )


@click.command("eval")
@click.option("--checkpoint", required=True, help="Checkpoint file or save folder (uses latest-rank0.pt).")
@click.option("--data", required=True, help="Shard directory from `hbpe convert`.")
@click.option("--batch-size", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--max-batches", type=click.IntRange(min=1), default=None)
@click.option("--json", "as_json", is_flag=True)
def eval_cmd(checkpoint: str, data: str, batch_size: int, max_batches: int | None, as_json: bool) -> None:
    """BPB, loss, bytes per patch and symbols per patch on the given shards."""
    from hbpe.training.evaluate import evaluate

    _emit(evaluate(checkpoint, data, batch_size=batch_size, max_batches=max_batches), as_json, _render_eval)


def _render_eval(r: dict[str, Any]) -> str:
    return (
        f"BPB {r['bpb']:.4f}  loss/symbol {r['loss_per_symbol']:.4f}  bytes/patch {r['bytes_per_patch']:.3f}  "
        f"symbols/patch {r['symbols_per_patch']:.3f}  over {r['bytes']} bytes"
    )


@click.command("generate")
@click.option("--checkpoint", required=True)
@click.option("--prompt", required=True)
@click.option("--max-bytes", type=click.IntRange(min=1), default=200, show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0), default=0.0, show_default=True, help="0 = greedy.")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True)
@click.option("--no-cache", is_flag=True, help="Recompute without KV caches (slow reference).")
def generate_cmd(checkpoint: str, prompt: str, max_bytes: int, temperature: float, seed: int, no_cache: bool) -> None:
    """Generate text patch by patch (at most --max-bytes new bytes, cut at a UTF-8 character boundary)."""
    from hbpe.training.checkpoint import load_model
    from hbpe.training.generate import check_generate_args, generate

    check_generate_args(prompt, max_bytes=max_bytes, temperature=temperature, seed=seed)  # before loading a model
    model, tok, _ = load_model(checkpoint)
    g = generate(model, tok, prompt, max_bytes=max_bytes, temperature=temperature, use_cache=not no_cache, seed=seed)
    click.echo(g.text)
    why = {
        "eod": " (the model ended the document)",
        "context": f" (the model's latent context, model.max_patches={model.cfg.max_patches}, is full)",
    }.get(g.stopped, "")
    click.echo(
        f"[{g.new_bytes} bytes, {g.patches} patches, {g.symbols} symbols in {g.seconds:.2f}s; stopped: {g.stopped}{why}]",
        err=True,
    )


@click.command("train")
@click.option("--config", "config", default="tiny", show_default=True)
@click.option("--batches", type=click.IntRange(min=2), default=20, show_default=True)
@click.argument("overrides", nargs=-1)
@click.option("--json", "as_json", is_flag=True)
def bench_train_cmd(config: str, batches: int, overrides: tuple[str, ...], as_json: bool) -> None:
    """Training bytes/s and patches/s (and MFU on a GPU) for a config."""
    from hbpe.training.bench import bench_train
    from hbpe.training.config_io import load_config

    _emit(bench_train(load_config(config, list(overrides)), batches=batches), as_json, _render_bench_train)


def _render_bench_train(r: dict[str, Any]) -> str:
    mfu = f", MFU {r['mfu']:.3f}" if r.get("mfu") else " (no GPU: MFU not measured)"
    return (
        f"{r['model_size']}: {r['params'] / 1e6:.1f}M params, batch {r['global_batch_size']} x {r['seq_len']} patches (S={r['max_patch_size']}) on {r['device']}: "
        f"{r['bytes_per_sec'] / 1e3:.1f} KB/s, {r['patches_per_sec']:.0f} patches/s over {r['timed_batches']} batches{mfu}"
    )


@click.command("generate")
@click.option("--checkpoint", required=True)
@click.option("--prompt", default="The State of the Union", show_default=True)
@click.option("--max-bytes", type=click.IntRange(min=1), default=200, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def bench_generate_cmd(checkpoint: str, prompt: str, max_bytes: int, as_json: bool) -> None:
    """Generation speed with and without KV caches, as a ratio, in one run."""
    from hbpe.training.bench import bench_generate

    _emit(bench_generate(checkpoint, prompt, max_bytes=max_bytes), as_json, _render_bench_generate)


def _render_bench_generate(r: dict[str, Any]) -> str:
    return (
        f"with KV caches {r['cached_bytes_per_sec']:.0f} B/s ({r['cached_patches_per_sec']:.1f} patches/s); "
        f"without {r['uncached_bytes_per_sec']:.0f} B/s; speedup x{r['speedup']:.2f}; identical output: {r['identical']}"
    )
