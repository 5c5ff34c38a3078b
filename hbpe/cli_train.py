"""CLI commands of the trainer: `hbpe train`, `eval`, `generate`, `export`, `checkpoint consolidate`, `bench train|generate`."""

from __future__ import annotations

import signal
import sys
from typing import TYPE_CHECKING, Any

import click

from hbpe.cli_common import _Command, _emit, _Group, check_local_paths, is_quiet, json_option

if TYPE_CHECKING:
    from hbpe.schemas.train_config import TrainConfig


@click.command("train", cls=_Command)
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

    \b
    Example:
      hbpe train tiny data.train=runs/demo/shards-train data.eval=runs/demo/shards-eval max_duration=20ba save_folder=/tmp/run
    On 2 nodes of 8 GPUs, the same command on node 0 and node 1 (--node-rank 1), NODE0 being node 0's address:
      hbpe train small data.train=gs://bucket/shards --nproc 8 --nnodes 2 --node-rank 0 --master-addr NODE0 --master-port 29500
    """
    from hbpe.schemas.train_config import check_world_divides_batch
    from hbpe.training import load_config

    _check_nodes(nproc, nnodes, node_rank, master_addr, master_port)
    given = click.get_current_context().get_parameter_source("rendezvous_timeout")
    if nnodes == 1 and given is click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError("--rendezvous-timeout is for several nodes: add --nnodes N")
    overrides = _quiet_console(overrides)
    cfg = load_config(config, list(overrides))  # validate before launching anything
    world = nproc * nnodes
    check_world_divides_batch(cfg, world, how=f" (--nnodes {nnodes} x --nproc {nproc})")
    if world > 1:
        nodes = dict(nnodes=nnodes, node_rank=node_rank, master_addr=master_addr, master_port=master_port)
        result = _train_on_processes(config, overrides, nproc, **nodes, rendezvous_timeout=rendezvous_timeout, cfg=cfg)
        _emit(result, as_json, _render_train)
        return
    from hbpe.training import train_model as train

    try:
        result = train(cfg)
    except (KeyboardInterrupt, SystemExit) as e:
        signum = _stop_signal(e)
        if signum is None:
            raise
        click.echo(f"error: interrupted by {signal.Signals(signum).name}; {_how_to_continue(cfg)}", err=True)
        sys.exit(128 + signum)  # the shell's convention for "killed by signal N"
    _emit(result, as_json, _render_train)


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


def _quiet_console(overrides: tuple[str, ...]) -> tuple[str, ...]:
    """With `hbpe -q`, Composer's console metric lines are off too (the last override wins)."""
    return (*overrides, "console=false") if is_quiet() else overrides


def _check_nodes(
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


def _render_train(r: dict[str, Any]) -> str:
    ev = r["eval"]
    start = r.get("resumed_at_batch", 0)
    done = f"resumed at batch {start}, trained to batch {r['batches']}" if start else f"trained {r['batches']} batches"
    return (
        f"{done} in {r['wall_s']:.1f}s on {r['device']} ({r['params'] / 1e6:.2f}M params, {r['precision']}); "
        f"{r['throughput']['bytes_per_sec'] / 1e3:.1f} KB/s, {r['throughput']['patches_per_sec']:.0f} patches/s"
        + (f"; eval BPB {ev['BitsPerByte']:.4f}" if ev else "")
        + f"\ncheckpoints: {r['save_folder']}"
    )


_DEVICE_HELP = "auto (CUDA when a GPU is visible, else CPU), cpu, cuda or cuda:N."
_CHECKPOINT_HELP = (
    "A checkpoint file, a sharded (FSDP2) checkpoint folder, a save folder (its latest-rank0.pt) or an "
    "`hbpe export` directory."
)


@click.command("eval", cls=_Command)
@click.option("--checkpoint", required=True, help=_CHECKPOINT_HELP)
@click.option("--data", required=True, help="Shard directory from `hbpe convert`.")
@click.option("--batch-size", type=click.IntRange(min=1), default=8, help="Samples per batch.")
@click.option(
    "--max-batches", type=click.IntRange(min=1), default=None, show_default="all", help="Evaluate the first N batches."
)
@click.option("--device", default="auto", help=_DEVICE_HELP)
@click.option(
    "--progress/--no-progress",
    default=None,
    show_default="when stderr is a terminal, never with hbpe -q",
    help="A progress bar on stderr.",
)
@json_option()
def eval_cmd(
    checkpoint: str,
    data: str,
    batch_size: int,
    max_batches: int | None,
    device: str,
    progress: bool | None,
    as_json: bool,
) -> None:
    """BPB, loss, bytes per patch and symbols per patch on the given shards.

    \b
    Example:
      hbpe eval --checkpoint runs/demo/train --data runs/demo/shards-eval
    """
    from hbpe.training import evaluate, resolve_device

    dev = resolve_device(device)  # before anything is loaded
    check_local_paths("--checkpoint", checkpoint)
    check_local_paths("--data", data)
    show = False if is_quiet() else sys.stderr.isatty() if progress is None else progress  # -q wins
    r = evaluate(checkpoint, data, batch_size=batch_size, max_batches=max_batches, device=dev, progress=show)
    _emit(r, as_json, _render_eval)


def _render_eval(r: dict[str, Any]) -> str:
    return (
        f"BPB {r['bpb']:.4f}  loss/symbol {r['loss_per_symbol']:.4f}  bytes/patch {r['bytes_per_patch']:.3f}  "
        f"symbols/patch {r['symbols_per_patch']:.3f}  over {r['bytes']} bytes"
    )


# a prompts file holds prompts, one per line: 16 MiB is 100,000 prompts of 160 bytes, days of generation
MAX_PROMPTS_FILE_BYTES = 16 << 20


def _read_prompts(prompts: tuple[str, ...], prompts_file: str | None) -> list[str]:
    """--prompt (repeatable), then every line of --prompts-file (UTF-8, one prompt per line)."""
    from hbpe.schemas.errors import ConfigError

    out = list(prompts)
    if prompts_file is not None:
        out += _read_prompts_file(prompts_file)
    if not out:
        raise ConfigError("no prompt: pass --prompt TEXT (repeatable) or --prompts-file FILE (one prompt per line)")
    return out


def _read_prompts_file(path: str) -> list[str]:
    """The lines of a regular file of at most MAX_PROMPTS_FILE_BYTES (/dev/zero read on until a MemoryError)."""
    from hbpe.schemas.errors import ConfigError, file_problem

    problem = file_problem(path)
    if problem is not None:
        raise ConfigError(f"--prompts-file {path} {problem}; pass a text file with one prompt per line")
    with open(path, "rb") as f:
        data = f.read(MAX_PROMPTS_FILE_BYTES + 1)
    if len(data) > MAX_PROMPTS_FILE_BYTES:
        raise ConfigError(
            f"--prompts-file {path} is over {MAX_PROMPTS_FILE_BYTES >> 20} MiB, the most hbpe generate reads; split it "
            "into smaller files and generate from each"
        )
    try:
        return data.decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"--prompts-file {path} is not UTF-8 (at byte offset {e.start}); convert it, e.g. with iconv -t UTF-8"
        ) from None


@click.command("generate", cls=_Command)
@click.option("--checkpoint", required=True, help=_CHECKPOINT_HELP)
@click.option(
    "--prompt",
    "prompts",
    multiple=True,
    show_default="none",
    help="A prompt; repeat for several, generated in batches.",
)
@click.option(
    "--prompts-file",
    type=click.Path(dir_okay=False),
    default=None,
    show_default="none",
    help="One prompt per line (UTF-8), after the --prompt ones.",
)
@click.option("--max-bytes", type=click.IntRange(min=1), default=200, help="New bytes at most per prompt.")
@click.option(
    "--temperature",
    type=click.FloatRange(min=0),
    default=0.0,
    help="Sampling temperature; 0 = greedy (the most likely symbol; --top-k, --top-p and --seed unused).",
)
@click.option(
    "--top-k",
    type=click.IntRange(min=1),
    default=None,
    show_default="none: every symbol",
    help="With --temperature: draw from the K most likely symbols (1 = greedy).",
)
@click.option(
    "--top-p",
    type=click.FloatRange(0, 1, min_open=True),
    default=None,
    show_default="none: no cut",
    help="With --temperature: draw from the most likely symbols whose probabilities sum to P (nucleus).",
)
@click.option(
    "--stop",
    "stops",
    multiple=True,
    show_default="none",
    help="End a prompt's generation at this text, left out of the output (repeatable; first match wins).",
)
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, help="Prompt i samples with seed + i.")
@click.option("--batch-size", type=click.IntRange(min=1), default=16, help="Prompts per batch.")
@click.option("--device", default="auto", help=_DEVICE_HELP)
@click.option("--no-cache", is_flag=True, help="Recompute without KV caches (slow reference).")
@json_option("one list of {prompt, text, new_bytes, ...}")
def generate_cmd(
    checkpoint: str,
    prompts: tuple[str, ...],
    prompts_file: str | None,
    max_bytes: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    stops: tuple[str, ...],
    seed: int,
    batch_size: int,
    device: str,
    no_cache: bool,
    as_json: bool,
) -> None:
    """Generate text patch by patch (at most --max-bytes new bytes, cut at a UTF-8 character boundary).

    Greedy by default (--temperature 0); a small model's greedy text often repeats itself: sample with
    e.g. --temperature 0.8 --top-p 0.9. Prompt i (0-based, --prompt ones first) samples with seed + i,
    alone or in any batch. A --stop string is searched in the generated text only and is not printed.
    The text goes to stdout, a line of numbers per prompt to stderr (not with -q).

    \b
    Example:
      hbpe generate --checkpoint runs/demo/train --prompt "Fellow-Citizens" --max-bytes 80
      hbpe generate --checkpoint runs/demo/train --prompt "Fellow-Citizens" --temperature 0.8 --top-p 0.9 --stop "."
    """
    import dataclasses

    from hbpe.training import check_generate_args, check_sampling_args, generate_batch, load_model, resolve_device

    check_local_paths("--checkpoint", checkpoint)
    texts = _read_prompts(prompts, prompts_file)
    for p in texts:  # before loading a model
        check_generate_args(p, max_bytes=max_bytes, temperature=temperature, seed=seed)
    check_sampling_args(top_k=top_k, top_p=top_p, stop=stops)
    model, tok, _ = load_model(checkpoint, device=resolve_device(device))
    gens = generate_batch(
        model,
        tok,
        texts,
        max_bytes=max_bytes,
        temperature=temperature,
        use_cache=not no_cache,
        seed=seed,
        batch_size=batch_size,
        top_k=top_k,
        top_p=top_p,
        stop=stops,
    )
    if as_json:
        _emit([{"prompt": p, **dataclasses.asdict(g)} for p, g in zip(texts, gens)], True, str, ensure_ascii=False)
        return
    why = {
        "eod": " (the model ended the document)",
        "stop": " (a --stop string, not printed)",
        "context": f" (the model's latent context, model.max_patches={model.cfg.max_patches}, is full)",
    }
    for g in gens:
        click.echo(g.text)
        if is_quiet():
            continue
        click.echo(
            f"[{g.new_bytes} bytes, {g.patches} patches, {g.symbols} symbols in {g.seconds:.2f}s; "
            f"stopped: {g.stopped}{why.get(g.stopped, '')}]",
            err=True,
        )


@click.command("export", cls=_Command)
@click.option("--checkpoint", required=True, help=_CHECKPOINT_HELP)
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
    from hbpe.training import export_model

    check_local_paths("--checkpoint", checkpoint)
    _emit(export_model(checkpoint, out, overwrite=overwrite, format=fmt), as_json, _render_export)


def _render_export(r: dict[str, Any]) -> str:
    tied = ", ".join(f"{a} = {b}" for a, b in r["tied"].items()) or "none"
    return (
        f"exported {r['parameters'] / 1e6:.2f}M parameters ({r['tensors']} tensors, {r['bytes'] / 1e6:.1f} MB) to "
        f"{r['out']} in {r['seconds']:.1f}s; tied: {tied}"
    )


@click.group("checkpoint", cls=_Group, context_settings={"show_default": True})
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
    _emit(
        consolidate_checkpoint(path, out, overwrite=overwrite),
        as_json,
        lambda r: f"consolidated {r['checkpoint']} ({r['parameters'] / 1e6:.2f}M parameters) into {r['out']}",
    )


@click.command("train", cls=_Command)
@click.argument("config")
@click.argument("overrides", nargs=-1)
@click.option("--batches", type=click.IntRange(min=2), default=20, help="Batches to time (the first one is warm-up).")
@click.option(
    "--compare",
    "variants",
    multiple=True,
    metavar='"NAME [KEY=VALUE ...]"',
    show_default="none: CONFIG alone",
    help="A model to run side by side in this process: a name, then overrides on top of CONFIG's. Repeat it; "
    "ratios are to the first.",
)
@click.option("--repeat", type=click.IntRange(min=1), default=3, help="With --compare: rounds, medians reported.")
@json_option()
def bench_train_cmd(
    config: str, overrides: tuple[str, ...], batches: int, variants: tuple[str, ...], repeat: int, as_json: bool
) -> None:
    """Training bytes/s and patches/s (and MFU on a GPU) for CONFIG (a path or tiny/small/medium) with overrides.

    With --compare, each named variant trains in turn in this one process, `--repeat` rounds interleaved,
    and the medians are printed with ratios to the first: bytes of text per second, executed and paper-count
    FLOPs per byte (and their ratio), executed FLOPs per second, the PAD share of executed FLOPs, peak memory.

    \b
    Examples:
      hbpe bench train tiny data.train=runs/demo/shards-train --batches 5
      hbpe bench train tiny data.train=runs/demo/shards-train --batches 10 --compare packed --compare "padded model.local_layout=padded"
    """
    import shlex

    from hbpe.training import bench_train, bench_train_side_by_side, load_config

    base = list(_quiet_console(overrides))
    if not variants:
        _emit(bench_train(load_config(config, base), batches=batches), as_json, _render_bench_train)
        return
    configs = {}
    for v in variants:
        name, *extra = shlex.split(v) or [""]
        if not name or "=" in name or name in configs:
            raise click.BadParameter(
                f"{v!r}: each --compare starts with a new name, then KEY=VALUE overrides; "
                'e.g. --compare "padded model.local_layout=padded"',
                param_hint="--compare",
            )
        configs[name] = load_config(config, [*base, *extra])
    _emit(bench_train_side_by_side(configs, batches=batches, repeat=repeat), as_json, _render_side_by_side)


def _render_side_by_side(r: dict[str, Any]) -> str:
    lines = [
        f"{r['batches']} batches x {r['repeat']} rounds, {r['threads']} torch threads, load {r['load']} (medians):",
        f"{'model':<12} {'params':>7} {'KB/s':>7} {'ratio':>6} {'MFLOP/B':>8} {'paper':>8} {'x':>5} {'GFLOP/s':>8} "
        f"{'PAD':>5} {'peak MB':>8} {'ratio':>6}  KB/s of each round",
    ]
    for name, v in r["variants"].items():
        lines.append(
            f"{name:<12} {v['params'] / 1e6:>6.2f}M {v['bytes_per_sec'] / 1e3:>7.1f} {v['bytes_per_sec_ratio']:>6.2f} "
            f"{v['executed_flops_per_byte'] / 1e6:>8.3f} {v['paper_flops_per_byte'] / 1e6:>8.3f} "
            f"{v['executed_flops_per_byte'] / v['paper_flops_per_byte']:>5.2f} {v['executed_flops_per_sec'] / 1e9:>8.2f} "
            f"{v['pad_share']:>5.1%} {v['peak_memory_bytes'] / 2**20:>8.1f} {v['memory_ratio']:>6.2f}  "
            + ", ".join(f"{x / 1e3:.1f}" for x in v["bytes_per_sec_all"])
        )
    return "\n".join(lines)


def _render_bench_train(r: dict[str, Any]) -> str:
    mfu = f", MFU {r['mfu']:.3f}" if r.get("mfu") else " (no GPU: MFU not measured)"
    return (
        f"{r['model_size']}: {r['params'] / 1e6:.1f}M params, batch {r['global_batch_size']} x {r['seq_len']} patches (S={r['max_patch_size']}) on {r['device']}: "
        f"{r['bytes_per_sec'] / 1e3:.1f} KB/s, {r['patches_per_sec']:.0f} patches/s over {r['timed_batches']} batches{mfu}"
    )


@click.command("generate", cls=_Command)
@click.option("--checkpoint", required=True, help=_CHECKPOINT_HELP)
@click.option("--prompt", default="The State of the Union", help="The prompt of every run.")
@click.option("--max-bytes", type=click.IntRange(min=1), default=200, help="New bytes per prompt.")
@click.option("--batch-size", type=click.IntRange(min=2), default=8, help="Prompts in the batch.")
@click.option("--repeat", type=click.IntRange(min=1), default=2, help="Best of N runs.")
@click.option("--device", default="auto", help=_DEVICE_HELP)
@json_option()
def bench_generate_cmd(
    checkpoint: str, prompt: str, max_bytes: int, batch_size: int, repeat: int, device: str, as_json: bool
) -> None:
    """Generation speed with and without KV caches, and batched vs one prompt at a time, as ratios.

    \b
    Example:
      hbpe bench generate --checkpoint runs/demo/train --max-bytes 100 --repeat 1
    """
    from hbpe.training import bench_generate, resolve_device

    check_local_paths("--checkpoint", checkpoint)
    r = bench_generate(
        checkpoint, prompt, max_bytes=max_bytes, batch_size=batch_size, repeat=repeat, device=resolve_device(device)
    )
    _emit(r, as_json, _render_bench_generate)


def _render_bench_generate(r: dict[str, Any]) -> str:
    return (
        f"with KV caches {r['cached_bytes_per_sec']:.0f} B/s ({r['cached_patches_per_sec']:.1f} patches/s); "
        f"without {r['uncached_bytes_per_sec']:.0f} B/s; speedup x{r['speedup']:.2f}; identical output: {r['identical']}\n"
        f"{r['batch_size']} prompts in one batch {r['batched_bytes_per_sec']:.0f} B/s, one at a time "
        f"{r['one_by_one_bytes_per_sec']:.0f} B/s; speedup x{r['batch_speedup']:.2f}; identical output: "
        f"{r['batch_identical']} ({r['device']}, {r['threads']} threads)"
    )
