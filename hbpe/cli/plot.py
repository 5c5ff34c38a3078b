"""`hbpe plot --checkpoint RUN`: a run's training and eval curves from its metrics.jsonl."""

from __future__ import annotations

from typing import Any

import click

from hbpe.cli.common import Command, emit, json_option


@click.command("plot", cls=Command)
@click.option("--checkpoint", "run", required=True, help="A `hbpe train` save folder, or its metrics.jsonl.")
@click.option(
    "--out", default=None, show_default="RUN/curves.png", help="The image to write (.png, .svg, .pdf), or a folder."
)
@click.option("--x", "x", type=click.Choice(["batches", "bytes"]), default="batches", help="The horizontal axis.")
@json_option()
def plot_cmd(run: str, out: str | None, x: str, as_json: bool) -> None:
    """Plot loss and bits per byte (train and eval) of a run from its metrics.jsonl as an image (PNG, SVG or PDF).

    Damaged lines of metrics.jsonl are skipped, and counted in the summary.

    --checkpoint is a `hbpe train` save folder (a local one; a run saved to a bucket keeps metrics.jsonl under
    runs/RUN_NAME/) or a metrics.jsonl.

    \b
    Example:
      hbpe plot --checkpoint runs/demo/train --out /tmp/curves.png
    """
    from hbpe import api

    emit(api.plot(run, out=out, x=x).as_dict(), as_json, _render)


def _render(r: dict[str, Any]) -> str:
    bpb = r["final_eval_bpb"]
    last = f"; last eval BPB {bpb:.4f}" if bpb is not None else ""
    line = f"wrote {r['out']}: {r['train_points']} train and {r['eval_points']} eval points to batch {r['last_batch']}{last}"
    if r["skipped_lines"]:
        from hbpe.training.train.plot_metrics import skipped_text

        line += f"\nskipped {skipped_text(r['skipped_lines'], where=r['metrics'])}"
    return line
