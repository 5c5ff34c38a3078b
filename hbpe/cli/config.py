"""CLI commands about training configs: `hbpe config show`."""

from __future__ import annotations

import click

from hbpe.cli.common import CONTEXT_SETTINGS, Group, emit, json_option


@click.group("config", cls=Group, context_settings=CONTEXT_SETTINGS)
def config_group() -> None:
    """Look at training configs (the YAML files `hbpe train` reads).

    \b
    Example:
      hbpe config show tiny
    """


@config_group.command("show")
@click.argument("config")
@click.argument("overrides", nargs=-1)
@json_option("a list of {key, value, type, help}")
def config_show_cmd(config: str, overrides: tuple[str, ...], as_json: bool) -> None:
    """Every key of CONFIG (a path or tiny/small/medium, its base: files merged, then key=value overrides) with
    its value, type and one line of help. Local paths are not checked.

    \b
    Example:
      hbpe config show tiny optim.lr=1e-3
    """
    import dataclasses

    from hbpe.schemas.config_doc import describe, render
    from hbpe.training import load_config

    docs = describe(load_config(config, list(overrides), check_paths=False))
    emit([dataclasses.asdict(d) for d in docs] if as_json else docs, as_json, render)
