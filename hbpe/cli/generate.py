"""`hbpe generate`: text from a checkpoint, patch by patch (hbpe.api.load_model, then the library's generate_batch,
whose per-prompt numbers the command prints)."""

from __future__ import annotations

import click

from hbpe.cli.common import Command, check_local_paths, checkpoint_option, device_option, emit, is_quiet, json_option

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


@click.command("generate", cls=Command)
@checkpoint_option()
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
@device_option
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

    from hbpe import api
    from hbpe.training import check_generate_args, check_sampling_args, generate_batch

    check_local_paths("--checkpoint", checkpoint)
    texts = _read_prompts(prompts, prompts_file)
    for p in texts:  # before loading a model
        check_generate_args(p, max_bytes=max_bytes, temperature=temperature, seed=seed)
    check_sampling_args(top_k=top_k, top_p=top_p, stop=stops)
    model, tok, _ = api.load_model(checkpoint, device=device)
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
        emit([{"prompt": p, **dataclasses.asdict(g)} for p, g in zip(texts, gens)], True, str, ensure_ascii=False)
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
