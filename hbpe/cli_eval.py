"""CLI command of zero-shot evaluation: `hbpe eval-tasks` (the paper's Table 3)."""

from __future__ import annotations

import click

from hbpe.cli_common import _Command, _emit, check_local_paths, is_quiet, json_option


@click.command("eval-tasks", cls=_Command)
@click.option("--checkpoint", required=True, help="Checkpoint file or save folder (uses latest-rank0.pt).")
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
@click.option("--device", default="auto", help="auto (CUDA when a GPU is visible, else CPU), cpu, cuda or cuda:N.")
@json_option()
def eval_tasks_cmd(checkpoint: str, tasks: str, limit: int | None, batch_size: int, device: str, as_json: bool) -> None:
    """Zero-shot accuracy on HellaSwag, PIQA, WinoGrande, ARC-e/c, LAMBADA and MMLU (lm-eval's prompts, local data).

    \b
    Example:
      hbpe eval-tasks --checkpoint runs/demo/train --tasks piqa,arc_easy --limit 200
    """
    from hbpe.training import evaluate_tasks, parse_tasks
    from hbpe.training import render_task_table as render_table

    names = parse_tasks(tasks)  # before loading a model
    check_local_paths("--checkpoint", checkpoint)
    result = evaluate_tasks(
        checkpoint,
        names,
        limit=limit,
        batch_size=batch_size,
        device=None if device == "auto" else device,
        progress=not is_quiet(),
    )
    _emit(result, as_json, render_table, ensure_ascii=False)
