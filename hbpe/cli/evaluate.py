"""`hbpe eval` (bits per byte on shards, hbpe.api.evaluate) and `hbpe eval-tasks` (zero-shot accuracy, the paper's
Table 3, hbpe.api.score_tasks)."""

from __future__ import annotations

from typing import Any

import click

from hbpe.cli.common import (
    Command,
    check_local_paths,
    checkpoint_option,
    data_option,
    device_option,
    emit,
    is_quiet,
    json_option,
)


@click.command("eval", cls=Command)
@checkpoint_option()
@data_option
@click.option("--batch-size", type=click.IntRange(min=1), default=8, help="Samples per batch.")
@click.option(
    "--max-batches", type=click.IntRange(min=1), default=None, show_default="all", help="Evaluate the first N batches."
)
@device_option
@click.option(
    "--progress/--no-progress",
    default=None,
    show_default="on, never with hbpe -q",
    help="A progress line on stderr: live on a terminal, else a line every HBPE_PROGRESS_INTERVAL seconds (30).",
)
@json_option()
def eval_cmd(
    checkpoint: str,
    data: str,
    batch_size: int,
    max_batches: int | None,
    device: str,
    progress: bool | None,
    as_json: bool,
) -> None:
    """BPB, loss, bytes per patch and symbols per patch on the given shards.

    \b
    Example:
      hbpe eval --checkpoint runs/demo/train --data runs/demo/shards-eval
    """
    from hbpe import api
    from hbpe.training import resolve_device

    resolve_device(device)  # a wrong --device is refused before anything is read
    check_local_paths("--checkpoint", checkpoint)
    check_local_paths("--data", data)
    show = not is_quiet() and progress is not False  # -q wins
    r = api.evaluate(checkpoint, data, batch_size=batch_size, max_batches=max_batches, device=device, progress=show)
    emit(r.as_dict(), as_json, _render_eval)


def _render_eval(r: dict[str, Any]) -> str:
    return (
        f"BPB {r['bpb']:.4f}  loss/symbol {r['loss_per_symbol']:.4f}  bytes/patch {r['bytes_per_patch']:.3f}  "
        f"symbols/patch {r['symbols_per_patch']:.3f}  over {r['bytes']} bytes"
    )


# a prompts file holds prompts, one per line: 16 MiB is 100,000 prompts of 160 bytes, days of generation


@click.command("eval-tasks", cls=Command)
@checkpoint_option("Checkpoint file or save folder (uses latest-rank0.pt).")
@click.option(
    "--tasks",
    default="hellaswag,piqa,winogrande,arc_easy,arc_challenge,lambada,mmlu",
    help="Comma-separated task names, or all.",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    show_default="every document",
    help="First N documents per task (MMLU: per subject).",
)
@click.option("--batch-size", type=click.IntRange(min=1), default=16, help="Requests scored per batch.")
@device_option
@json_option()
def eval_tasks_cmd(checkpoint: str, tasks: str, limit: int | None, batch_size: int, device: str, as_json: bool) -> None:
    """Zero-shot accuracy on HellaSwag, PIQA, WinoGrande, ARC-e/c, LAMBADA and MMLU (lm-eval's prompts, local data).

    \b
    Example:
      hbpe eval-tasks --checkpoint runs/demo/train --tasks piqa,arc_easy --limit 200
    """
    from hbpe import api
    from hbpe.training import parse_tasks
    from hbpe.training import render_task_table as render_table

    names = parse_tasks(tasks)  # before loading a model
    check_local_paths("--checkpoint", checkpoint)
    result = api.score_tasks(
        checkpoint, names, limit=limit, batch_size=batch_size, device=device, progress=not is_quiet()
    )
    emit(result.as_dict(), as_json, render_table, ensure_ascii=False)
