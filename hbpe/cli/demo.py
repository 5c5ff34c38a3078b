"""`hbpe demo`: the main job end to end on the bundled sample (hbpe/demo.py does the work)."""

from __future__ import annotations

import click

from hbpe.cli.common import Command, emit, is_quiet, json_option, say


@click.command("demo", cls=Command)
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
    emit(result, as_json, render_summary)
