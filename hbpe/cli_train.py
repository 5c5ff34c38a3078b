"""CLI commands of the trainer (`hbpe train`, `hbpe eval`, `hbpe generate`)."""

from __future__ import annotations

import click


def register(main: click.Group, bench: click.Group) -> None:
    """Attach the training commands to the top-level group."""
