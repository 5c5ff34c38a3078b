"""`hbpe train`: a run in this process (hbpe.api.train), or on several processes and nodes (Composer's launcher)."""

from __future__ import annotations

import signal
import sys
from typing import TYPE_CHECKING, Any

import click

from hbpe.cli.common import Command, emit, json_option, quiet_console

if TYPE_CHECKING:
    from hbpe.schemas.train_config import TrainConfig


@click.command("train", cls=Command)
@click.argument("config")
@click.argument("overrides", nargs=-1)
@click.option(
    "--nproc",
    type=click.IntRange(min=1),
    default=1,
    help="Processes on this node (Composer's launcher).",
)
@click.option("--nnodes", type=click.IntRange(min=1), default=1, help="Nodes of the run (each runs this).")
@click.option(
    "--node-rank",
    type=click.IntRange(min=0),
    default=None,
    show_default="none: one node",
    help="This node's rank, 0..nnodes-1 (with --nnodes > 1).",
)
@click.option(
    "--master-addr",
    default=None,
    show_default="none: one node",
    help="Address of node 0, where the ranks meet (with --nnodes > 1).",
)
@click.option(
    "--master-port",
    type=click.IntRange(1, 65535),
    default=None,
    show_default="a free port on one node",
    help="Port on node 0 (with --nproc > 1 or --nnodes > 1).",
)
@click.option(
    "--rendezvous-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    envvar="HBPE_RENDEZVOUS_TIMEOUT",
    show_envvar=True,
    help="Seconds node R > 0 waits for node 0 to answer at --master-addr:--master-port (with --nnodes > 1).",
)
@json_option("the training result")
def train_cmd(
    config: str,
    overrides: tuple[str, ...],
    nproc: int,
    nnodes: int,
    node_rank: int | None,
    master_addr: str | None,
    master_port: int | None,
    rendezvous_timeout: float,
    as_json: bool,
) -> None:
    """Train from a YAML config (a path or tiny/small/medium) with key=value overrides.

    Every key with its value, type and help: `hbpe config show tiny`. A config may build on others
    (`base: tiny` or `base: [common.yaml, gpu.yaml]`, relative to it). In a log, progress is a line
    every HBPE_PROGRESS_INTERVAL seconds (30); console_metrics=true adds Composer's metric blocks.

    \b
    Example:
      hbpe train tiny data.train=runs/demo/shards-train data.eval=runs/demo/shards-eval max_duration=20ba save_folder=/tmp/run
    On 2 nodes of 8 GPUs, the same command on node 0 and node 1 (--node-rank 1), NODE0 being node 0's address:
      hbpe train small data.train=gs://bucket/shards --nproc 8 --nnodes 2 --node-rank 0 --master-addr NODE0 --master-port 29500
    """
    from hbpe import api
    from hbpe.schemas.train_config import check_world_divides_batch

    check_nodes(nproc, nnodes, node_rank, master_addr, master_port)
    given = click.get_current_context().get_parameter_source("rendezvous_timeout")
    if nnodes == 1 and given is click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError("--rendezvous-timeout is for several nodes: add --nnodes N")
    overrides = quiet_console(overrides)
    cfg = api.train_config(config, list(overrides))  # validate before launching anything
    world = nproc * nnodes
    check_world_divides_batch(cfg, world, how=f" (--nnodes {nnodes} x --nproc {nproc})")
    if world > 1:
        nodes = dict(nnodes=nnodes, node_rank=node_rank, master_addr=master_addr, master_port=master_port)
        result = _train_on_processes(config, overrides, nproc, **nodes, rendezvous_timeout=rendezvous_timeout, cfg=cfg)
        emit(result, as_json, render_train)
        return
    try:
        result = api.train(cfg).as_dict()
    except (KeyboardInterrupt, SystemExit) as e:
        signum = _stop_signal(e)
        if signum is None:
            raise
        click.echo(f"error: interrupted by {signal.Signals(signum).name}; {_how_to_continue(cfg)}", err=True)
        sys.exit(128 + signum)  # the shell's convention for "killed by signal N"
    emit(result, as_json, render_train)


def _stop_signal(e: BaseException) -> int | None:
    """The signal that stopped training in this process, None for another exit: Ctrl-C, or Composer's handler of
    SIGINT and SIGTERM (composer.core.engine), which turns them into sys.exit(128 + N) so that its atexit close runs."""
    if isinstance(e, KeyboardInterrupt):
        return signal.SIGINT
    stops = {128 + s: s for s in (signal.SIGINT, signal.SIGTERM)}
    return stops.get(e.code) if isinstance(e, SystemExit) and isinstance(e.code, int) else None


def _how_to_continue(cfg: TrainConfig, *, node_rank: int | None = None) -> str:
    """What a stopped run leaves: the checkpoint autoresume continues from and how, or that none was saved yet
    (on node R > 0 of several, that this node's save_folder holds none: node 0's first rank saves them)."""
    from hbpe.pipeline import storage
    from hbpe.schemas.errors import HbpeError, one_line
    from hbpe.training.checkpoint.save_folder import saved_checkpoint

    try:
        last = saved_checkpoint(cfg)
    except (HbpeError, OSError) as e:  # a bucket that does not answer now
        return f"could not list save_folder {cfg.save_folder} ({one_line(str(e))}) for the last checkpoint saved"
    if last is None and node_rank and not storage.is_remote(cfg.save_folder):
        return f"this node's save_folder {cfg.save_folder} holds no checkpoint (node 0 saves them: look there)"
    if last is None:
        return (
            f"no checkpoint was saved yet (save_interval={cfg.save_interval}): nothing to continue; run the command "
            "again to start over"
        )
    return f"the last checkpoint saved is {last}: continue from it with the same command and autoresume=true"


def check_nodes(
    nproc: int, nnodes: int, node_rank: int | None, master_addr: str | None, master_port: int | None
) -> None:
    """What Composer's launcher needs on several nodes, said before anything starts (and nothing silently ignored)."""
    if nnodes > 1:
        missing = [
            flag
            for flag, value in (
                ("--node-rank", node_rank),
                ("--master-addr", master_addr),
                ("--master-port", master_port),
            )
            if value is None
        ]
        if missing:
            raise click.UsageError(
                f"--nnodes {nnodes} needs {', '.join(missing)}: every node runs the same command with its own "
                "--node-rank, and all name node 0 with --master-addr and --master-port"
            )
        if node_rank >= nnodes:  # type: ignore[operator]
            raise click.UsageError(f"--node-rank {node_rank} is not a node of --nnodes {nnodes} (0..{nnodes - 1})")
        return
    if node_rank is not None or master_addr is not None:
        raise click.UsageError("--node-rank and --master-addr are for several nodes: add --nnodes N")
    if master_port is not None and nproc == 1:
        raise click.UsageError("--master-port is for several processes: add --nproc N or --nnodes N")


def _train_on_processes(
    config: str,
    overrides: tuple[str, ...],
    nproc: int,
    *,
    nnodes: int = 1,
    node_rank: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    rendezvous_timeout: float = 60.0,
    cfg: TrainConfig,
) -> dict[str, Any]:
    """Composer's launcher over this node's `nproc` ranks (training `cfg`) -> the result its first rank wrote (a
    failed rank has printed its `error:` line). A signal stops every process of the run on this node before this
    exits, saying which checkpoint to continue from."""
    import json
    import os
    import tempfile
    from pathlib import Path

    from hbpe.training import RESULT_FILE_ENV, TrainingInterrupted, launch

    with tempfile.TemporaryDirectory(prefix="hbpe-train-") as tmp:
        result_file = Path(tmp, "result.json")
        os.environ[RESULT_FILE_ENV] = str(result_file)  # the launcher's ranks inherit this environment
        try:
            status = launch(
                config,
                overrides,
                nproc=nproc,
                nnodes=nnodes,
                node_rank=node_rank,
                master_addr=master_addr,
                master_port=master_port,
                rendezvous_timeout=rendezvous_timeout,
                log_dir=tmp,
            )
        except TrainingInterrupted as e:
            click.echo(
                f"error: {e}: stopped the {nproc} training processes on this node; "
                + _how_to_continue(cfg, node_rank=node_rank),
                err=True,
            )
            sys.exit(128 + e.signum)  # the shell's convention for "killed by signal N"
        finally:
            del os.environ[RESULT_FILE_ENV]
        if status != 0:
            sys.exit(status)
        return json.loads(result_file.read_text())


def render_train(r: dict[str, Any]) -> str:
    ev = r["eval"]
    start = r.get("resumed_at_batch", 0)
    done = f"resumed at batch {start}, trained to batch {r['batches']}" if start else f"trained {r['batches']} batches"
    return (
        f"{done} in {r['wall_s']:.1f}s on {r['device']} ({r['params'] / 1e6:.2f}M params, {r['precision']}); "
        f"{r['throughput']['bytes_per_sec'] / 1e3:.1f} KB/s, {r['throughput']['patches_per_sec']:.0f} patches/s"
        + (f"; eval BPB {ev['BitsPerByte']:.4f}" if ev else "")
        + f"\ncheckpoints: {r['save_folder']}"
    )
