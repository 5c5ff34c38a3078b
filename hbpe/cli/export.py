"""`hbpe export` (a self-contained model directory, hbpe.api.export) and `hbpe checkpoint consolidate`."""

from __future__ import annotations

from typing import Any

import click

from hbpe.cli.common import Command, Group, check_local_paths, checkpoint_option, emit, json_option


@click.command("export", cls=Command)
@checkpoint_option()
@click.option("--out", required=True, help="The model directory to write.")
@click.option("--overwrite", is_flag=True, help="Replace an earlier export in --out (nothing else).")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["hbpe", "hf"]),
    default="hbpe",
    show_default=True,
    help="hf: the same folder plus config.json, model and tokenizer classes that transformers loads "
    "(AutoModelForCausalLM / AutoTokenizer with trust_remote_code=True; hierarchical models).",
)
@json_option()
def export_cmd(checkpoint: str, out: str, overwrite: bool, fmt: str, as_json: bool) -> None:
    """A self-contained model directory (safetensors weights, model config, tokenizer) that eval and generate load.

    Loads without Composer state and without unpickling; tied weights are stored once and tied again on load.

    \b
    Example:
      hbpe export --checkpoint runs/demo/train --out /tmp/model
      hbpe export --checkpoint runs/demo/train --out /tmp/model-hf --format hf
    """
    from hbpe import api

    check_local_paths("--checkpoint", checkpoint)
    emit(api.export(checkpoint, out, overwrite=overwrite, format=fmt).as_dict(), as_json, _render_export)


def _render_export(r: dict[str, Any]) -> str:
    tied = ", ".join(f"{a} = {b}" for a, b in r["tied"].items()) or "none"
    return (
        f"exported {r['parameters'] / 1e6:.2f}M parameters ({r['tensors']} tensors, {r['bytes'] / 1e6:.1f} MB) to "
        f"{r['out']} in {r['seconds']:.1f}s; tied: {tied}"
    )


@click.group("checkpoint", cls=Group, context_settings={"show_default": True})
def checkpoint_group() -> None:
    """Work with training checkpoints.

    \b
    Example:
      hbpe checkpoint consolidate --checkpoint runs/fsdp-run
    """


@checkpoint_group.command("consolidate")
@click.option("--checkpoint", "path", required=True, help="A sharded checkpoint folder, or an FSDP2 run's save folder.")
@click.option(
    "--out",
    default=None,
    show_default="FOLDER-consolidated.pt beside the folder",
    help="The .pt file to write (inside the run folder).",
)
@click.option("--overwrite", is_flag=True, help="Replace an earlier consolidated file at --out.")
@json_option()
def checkpoint_consolidate_cmd(path: str, out: str | None, overwrite: bool, as_json: bool) -> None:
    """A sharded (FSDP2) checkpoint's model as one .pt file in its run folder (eval and generate also read the folder).

    \b
    Example (a run trained with fsdp, e.g. `hbpe train small --nproc 2 ...`):
      hbpe checkpoint consolidate --checkpoint runs/fsdp-run
    """
    from hbpe.training import consolidate_checkpoint

    check_local_paths("--checkpoint", path)
    emit(
        consolidate_checkpoint(path, out, overwrite=overwrite),
        as_json,
        lambda r: f"consolidated {r['checkpoint']} ({r['parameters'] / 1e6:.2f}M parameters) into {r['out']}",
    )
