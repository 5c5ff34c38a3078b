"""The command line that trains on several local processes: Composer's launcher around `hbpe.training.launch`."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence


def launcher_command(config: str, overrides: Sequence[str], *, nproc: int, master_port: int | None = None) -> list[str]:
    """argv of `composer -n NPROC -m hbpe.training.launch CONFIG key=value ...`, run by this Python.

    `sys.executable -m composer.cli.launcher` rather than the `composer` script: the launcher's
    children must run in the same environment as this process, whatever is first on PATH.

    >>> launcher_command("tiny", ["max_duration=2ba"], nproc=2)[2:]
    ['composer.cli.launcher', '-n', '2', '-m', 'hbpe.training.launch', 'tiny', 'max_duration=2ba']
    """
    port = [] if master_port is None else ["--master_port", str(master_port)]
    launcher = [sys.executable, "-m", "composer.cli.launcher", "-n", str(nproc), *port]
    return [*launcher, "-m", "hbpe.training.launch", config, *overrides]


def launch(config: str, overrides: Sequence[str], *, nproc: int, master_port: int | None = None) -> int:
    """Run the launcher to the end; returns its exit status. Unbuffered, so every rank's lines show as they come."""
    cmd = launcher_command(config, overrides, nproc=nproc, master_port=master_port)
    return subprocess.call(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
