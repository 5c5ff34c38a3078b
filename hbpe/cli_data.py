"""CLI commands of the conversion pipeline (`hbpe convert`, `hbpe shards ...`)."""

from __future__ import annotations

import click


def register(main: click.Group, bench: click.Group) -> None:
    """Attach the data commands to the top-level group."""
