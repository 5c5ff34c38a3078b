"""The command line that trains on several processes and nodes: Composer's launcher around `hbpe.training.launch`."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence


def launcher_command(
    config: str,
    overrides: Sequence[str],
    *,
    nproc: int,
    master_port: int | None = None,
    nnodes: int = 1,
    node_rank: int | None = None,
    master_addr: str | None = None,
) -> list[str]:
    """argv of `composer -n NPROC [multi-node flags] -m hbpe.training.launch CONFIG key=value ...`, run by this Python.

    `sys.executable -m composer.cli.launcher` rather than the `composer` script: the launcher's
    children must run in the same environment as this process, whatever is first on PATH.
    On several nodes every node runs this with its own `node_rank`; the launcher gives node R the
    global ranks R*nproc .. R*nproc+nproc-1 of `nnodes*nproc`, and all meet at master_addr:master_port.

    >>> launcher_command("tiny", ["max_duration=2ba"], nproc=2)[2:]
    ['composer.cli.launcher', '-n', '2', '-m', 'hbpe.training.launch', 'tiny', 'max_duration=2ba']
    >>> launcher_command("tiny", [], nproc=1, nnodes=2, node_rank=1, master_addr="10.0.0.1", master_port=29500)[5:13]
    ['--world_size', '2', '--node_rank', '1', '--master_addr', '10.0.0.1', '--master_port', '29500']
    """
    multinode = []
    if nnodes > 1:
        if node_rank is None or master_addr is None or master_port is None:
            raise ValueError("a multi-node launch needs node_rank, master_addr and master_port")
        multinode = ["--world_size", str(nnodes * nproc), "--node_rank", str(node_rank), "--master_addr", master_addr]
    port = [] if master_port is None else ["--master_port", str(master_port)]
    launcher = [sys.executable, "-m", "composer.cli.launcher", "-n", str(nproc), *multinode, *port]
    return [*launcher, "-m", "hbpe.training.launch", config, *overrides]


def launch(
    config: str,
    overrides: Sequence[str],
    *,
    nproc: int,
    master_port: int | None = None,
    nnodes: int = 1,
    node_rank: int | None = None,
    master_addr: str | None = None,
) -> int:
    """Run the launcher to the end; returns its exit status. Unbuffered, so every rank's lines show as they come."""
    cmd = launcher_command(
        config,
        overrides,
        nproc=nproc,
        master_port=master_port,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=master_addr,
    )
    return subprocess.call(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
