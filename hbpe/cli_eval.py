"""CLI command of zero-shot evaluation: `hbpe eval-tasks` (the paper's Table 3)."""

from __future__ import annotations

import click

from hbpe.cli_common import _emit


@click.command("eval-tasks")
@click.option("--checkpoint", required=True, help="Checkpoint file or save folder (uses latest-rank0.pt).")
@click.option(
    "--tasks",
    default="hellaswag,piqa,winogrande,arc_easy,arc_challenge,lambada,mmlu",
    show_default=True,
    help="Comma-separated task names, or all.",
)
@click.option(
    "--limit", type=click.IntRange(min=1), default=None, help="First N documents per task (MMLU: per subject)."
)
@click.option("--batch-size", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("--device", default=None, help="torch device (default: cuda when available, else cpu).")
@click.option("--json", "as_json", is_flag=True)
def eval_tasks_cmd(
    checkpoint: str, tasks: str, limit: int | None, batch_size: int, device: str | None, as_json: bool
) -> None:
    """Zero-shot accuracy on HellaSwag, PIQA, WinoGrande, ARC-e/c, LAMBADA and MMLU (lm-eval's prompts, local data).

    Example: hbpe eval-tasks --checkpoint runs/demo/train --tasks piqa,arc_easy --limit 200
    """
    from hbpe.training.zero_shot.run import evaluate_tasks, render_table
    from hbpe.training.zero_shot.tasks import parse_tasks

    names = parse_tasks(tasks)  # before loading a model
    result = evaluate_tasks(checkpoint, names, limit=limit, batch_size=batch_size, device=device)
    _emit(result, as_json, render_table, ensure_ascii=False)
