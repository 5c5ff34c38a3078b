"""`hbpe bench ...`: benchmarks that print numbers and ratios (tokenizer, conversion, training, generation)."""

from __future__ import annotations

from typing import Any

import click

from hbpe.cli.common import (
    Command,
    Group,
    check_beam_args,
    check_local_paths,
    check_pattern,
    checkpoint_option,
    data_option,
    device_option,
    emit,
    first_stage_bpe_options,
    inputs_option,
    json_option,
    quiet_console,
    seq_len_option,
    tokenizer_option,
)
from hbpe.schemas.errors import HbpeError

_BEAM_SETTINGS = {"ignore_unknown_options": True, "allow_extra_args": True, "show_default": True}


@click.group(cls=Group)
def bench() -> None:
    """Benchmarks that print numbers and ratios.

    \b
    Example:
      hbpe bench sweep --encodings gpt2 --sizes 6,10 --input data/sample/en-sotu-sample.jsonl.zst
    """


@bench.command("tokenizer")
@tokenizer_option
@inputs_option()
@click.option("--repeat", type=click.IntRange(min=1), default=3, help="Runs of each encoder (the best is kept).")
@click.option(
    "--load-repeat",
    type=click.IntRange(min=1),
    default=7,
    help="Loads of the tokenizer with and without its built tables, alternating (medians reported).",
)
@json_option()
def bench_tokenizer_cmd(
    tokenizer_dir: str, inputs: tuple[str, ...], repeat: int, load_repeat: int, as_json: bool
) -> None:
    """Encoding MB/s of tiktoken alone and with the second stage, in one run; second-stage training time; load
    time with and without the built tables.

    \b
    Example:
      hbpe bench tokenizer --tokenizer runs/demo/tokenizer --input data/sample/en-sotu-sample.jsonl.zst --repeat 1
    """
    from hbpe import api
    from hbpe.pipeline.tokenizer.bench import bench_load, bench_tokenizer
    from hbpe.pipeline.tokenizer.stats import read_texts

    check_local_paths("--tokenizer", tokenizer_dir)
    check_local_paths("--input", inputs)
    texts, _ = read_texts(inputs)
    r = bench_tokenizer(api.load_tokenizer(tokenizer_dir), texts, repeat=repeat)
    r["load"] = bench_load(tokenizer_dir, repeat=load_repeat)

    def render(r: dict) -> str:
        m, ld = r["mb_per_s"], r["load"]
        machine = " ".join(f"{x:.2f}" for x in ld["load_average"]) if ld["load_average"] else "n/a"
        return "\n".join(
            [
                f"{r['encoding']} S={r['max_patch_size']} mode={r['mode']}: {r['merges']} merges, V'={r['vocab_size']}; "
                f"corpus {r['corpus_mb']:.2f} MB",
                f"second-stage training          {r['second_stage_train_s'] * 1000:9.1f} ms",
                f"tiktoken encode_ordinary       {m['tiktoken_encode_ordinary']:9.2f} MB/s",
                f"hbpe (tiktoken + table)        {m['hbpe_encode']:9.2f} MB/s   ratio {r['ratio_single']:.3f}",
                f"tiktoken batch ({r['threads']} threads)     {m['tiktoken_encode_ordinary_batch']:9.2f} MB/s",
                f"hbpe batch ({r['threads']} threads)         {m['hbpe_encode_batch']:9.2f} MB/s   ratio {r['ratio_batch']:.3f}",
                f"load with built tables         {ld['seconds']['with_tables'] * 1000:9.1f} ms   ({ld['tables']})",
                f"load without (parse + build)   {ld['seconds']['without_tables'] * 1000:9.1f} ms   "
                f"x{ld['speedup']:.2f} slower; medians of {ld['repeat']} alternating loads, load average {machine}",
            ]
        )

    emit(r, as_json, render)


@bench.command("sweep")
@click.option("--encodings", default="gpt2,cl100k_base,o200k_base", help="Comma-separated first stages.")
@click.option("--sizes", default="6,8,10", help="Comma-separated S values.")
@inputs_option()
@click.option("--repeat", type=click.IntRange(min=1), default=3, help="Runs of each training (the best is kept).")
@json_option("the rows")
def bench_sweep_cmd(encodings: str, sizes: str, inputs: tuple[str, ...], repeat: int, as_json: bool) -> None:
    """Merges, V', second-stage training time and symbols/patch in both modes, per encoding and S.

    \b
    Example:
      hbpe bench sweep --encodings gpt2 --sizes 6,10 --input data/sample/en-sotu-sample.jsonl.zst
    """
    from hbpe.pipeline.tokenizer.bench import bench_sweep
    from hbpe.pipeline.tokenizer.stats import read_texts

    try:
        max_patch_sizes = [int(s) for s in sizes.split(",")]
    except ValueError as e:
        raise HbpeError(f"--sizes {sizes!r} is not a comma-separated list of integers; e.g. --sizes 6,8,10") from e
    if min(max_patch_sizes) < 2:
        raise HbpeError(f"--sizes {sizes!r}: every S must be at least 2; e.g. --sizes 6,8,10")
    check_local_paths("--input", inputs)
    texts, _ = read_texts(inputs)
    rows = bench_sweep(encodings.split(","), max_patch_sizes, texts, repeat=repeat)

    def render(rows: list[dict]) -> str:
        head = f"{'encoding':<12} {'S':>3} {'merges':>7} {'V_prime':>7} {'train_ms':>9} {'B/patch':>8} {'sym/p full':>10} {'sym/p min':>10}"
        lines = [head]
        for r in rows:
            lines.append(
                f"{r['encoding']:<12} {r['S']:>3} {r['merges']:>7} {r['vocab_size']:>7} {r['train_s'] * 1000:>9.1f} "
                f"{r['bytes_per_patch']:>8.3f} {r['symbols_per_patch_full']:>10.3f} {r['symbols_per_patch_minimal']:>10.3f}"
            )
        return "\n".join(lines)

    emit(rows, as_json, render)


@bench.command("first-stage")
@inputs_option()
@first_stage_bpe_options
@click.option("--repeat", type=click.IntRange(min=1), default=2, help="Runs of each trainer.")
@json_option()
def bench_first_stage_cmd(
    inputs: tuple[str, ...], vocab_size: int, pattern: str, min_count: int, repeat: int, as_json: bool
) -> None:
    """In-house vs HF `tokenizers` first-stage BPE on the same word counts: seconds, peak RSS, identical ranks.

    \b
    Example:
      hbpe bench first-stage --input data/sample/en-sotu-sample.jsonl.zst --vocab-size 1000 --repeat 1
    """
    from hbpe.pipeline.tokenizer.bench import bench_first_stage, render_first_stage

    check_pattern(pattern)
    check_local_paths("--input", inputs)
    r = bench_first_stage(list(inputs), vocab_size, pattern=pattern, min_count=min_count, repeat=repeat)
    emit(r, as_json, render_first_stage)


@bench.command("convert", cls=Command, context_settings=_BEAM_SETTINGS)
@tokenizer_option
@click.option("--input", "input_file", required=True, help="One corpus file (jsonl, jsonl.zst, txt, parquet).")
@click.option("--scale", type=click.IntRange(min=1), default=1, help="Repeat the corpus K times.")
@seq_len_option
@click.option(
    "--split-mb", type=click.IntRange(min=1), default=16, help="Byte-range size for large uncompressed files."
)
@click.option("--runner", default="auto", help="As for `hbpe convert`: auto, inprocess, DirectRunner, ...")
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    show_default="all cores",
    help="Processes (and tiktoken threads).",
)
@click.option(
    "--repeat", type=click.IntRange(min=1), default=1, help="Interleaved rounds; medians and their spread reported."
)
@json_option()
@click.pass_context
def bench_convert(
    ctx: click.Context,
    tokenizer_dir: str,
    input_file: str,
    scale: int,
    seq_len: int,
    split_mb: int,
    runner: str,
    workers: int | None,
    repeat: int,
    as_json: bool,
) -> None:
    """Conversion MB/s of lean and --store-patches shards vs tiktoken alone on the same text and cores.

    Each round times tiktoken encode_ordinary_batch, then both conversions (in alternating order);
    printed are medians, their spread, ratios to tiktoken, bytes on disk per byte of text, the
    machine's load and peak memory. Extra arguments are Beam pipeline options, as for `hbpe convert`.

    \b
    Example:
      hbpe bench convert --tokenizer runs/demo/tokenizer --input data/sample/en-sotu-sample.jsonl.zst --runner inprocess
    """
    from hbpe.pipeline.beam.bench_convert import bench_convert as run
    from hbpe.pipeline.beam.bench_convert import render
    from hbpe.pipeline.beam.quiet import quiet_beam

    quiet_beam()  # also when this command runs without the `hbpe` group around it
    check_beam_args(ctx)
    check_local_paths("--tokenizer", tokenizer_dir)
    check_local_paths("--input", input_file)
    r = run(
        tokenizer_dir,
        input_file,
        scale=scale,
        seq_len=seq_len,
        split_bytes=split_mb << 20,
        pipeline_args=list(ctx.args),
        runner=runner,
        workers=workers,
        repeat=repeat,
    )
    emit(r, as_json, lambda r: render(r, scale=scale))


@bench.command("train", cls=Command)
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
    and the medians are printed with ratios to the first: bytes of text per second (the ratio of the medians,
    and /round: the median of each round's ratio), executed and paper-count FLOPs per byte (and their ratio),
    executed FLOPs per second, the PAD share of executed FLOPs, peak memory.

    \b
    Examples:
      hbpe bench train tiny data.train=runs/demo/shards-train --batches 5
      hbpe bench train tiny data.train=runs/demo/shards-train --batches 10 --compare packed --compare "padded model.local_layout=padded"
    """
    import shlex

    from hbpe import api
    from hbpe.training import bench_train, bench_train_side_by_side

    base = list(quiet_console(overrides))
    if not variants:
        emit(bench_train(api.train_config(config, base), batches=batches), as_json, _render_bench_train)
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
        configs[name] = api.train_config(config, [*base, *extra])
    emit(bench_train_side_by_side(configs, batches=batches, repeat=repeat), as_json, _render_side_by_side)


def _render_side_by_side(r: dict[str, Any]) -> str:
    lines = [
        f"{r['batches']} batches x {r['repeat']} rounds, {r['threads']} torch threads, load {r['load']} (medians):",
        f"{'model':<12} {'params':>7} {'KB/s':>7} {'ratio':>6} {'/round':>6} {'MFLOP/B':>8} {'paper':>8} {'x':>5} "
        f"{'GFLOP/s':>8} {'PAD':>5} {'peak MB':>8} {'ratio':>6}  KB/s of each round",
    ]
    for name, v in r["variants"].items():
        lines.append(
            f"{name:<12} {v['params'] / 1e6:>6.2f}M {v['bytes_per_sec'] / 1e3:>7.1f} {v['bytes_per_sec_ratio']:>6.2f} "
            f"{v['bytes_per_sec_round_ratio']:>6.2f} "
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


@bench.command("step", cls=Command)
@click.argument("config")
@click.argument("overrides", nargs=-1)
@click.option("--batches", type=click.IntRange(min=2), default=8, help="Batches of the shards run compiled.")
@click.option(
    "--backend",
    default="aot_eager",
    show_default=True,
    help="torch.compile backend for recompiles and loss_compiled (inductor compiles C++: minutes at small on CPU).",
)
@click.option(
    "--autocast",
    type=click.Choice(["fp32", "bf16"]),
    default="fp32",
    show_default=True,
    help="The counted step's forward under CPU bf16 autocast, as CUDA's amp_bf16 (its casts).",
)
@json_option()
def bench_step_cmd(
    config: str, overrides: tuple[str, ...], batches: int, backend: str, autocast: str, as_json: bool
) -> None:
    """What one training step of CONFIG's model dispatches (CPU, fp32, the CUDA code path's counts: with
    model.packed_attention auto, the loader's tiles a GPU runs): aten ops, host syncs (data-dependent ops) in
    the step and in the loop, dynamo graph breaks, recompiles over --batches batches of its training shards,
    and the loss eager and compiled.

    \b
    Example:
      hbpe bench step tiny data.train=runs/demo/shards-train --batches 8 --json
    """
    from hbpe import api
    from hbpe.training.step_probe import probe_step

    cfg = api.train_config(config, list(quiet_console(overrides)))
    emit(probe_step(cfg, batches=batches, backend=backend, autocast=autocast), as_json, _render_bench_step)


def _render_bench_step(r: dict[str, Any]) -> str:
    return "\n".join([
        f"{r['model_size']} {r['io']} ({r['local_layout']}, attention {r['packed_attention']}), "
        f"{r['params'] / 1e6:.2f}M parameters, batch {r['batch']}, torch {r['torch']}",
        f"aten ops per step ({r['autocast']}): {r['aten_ops']} (+{r['views']} views), casts {r['casts']}, "
        f"matmuls {r['matmuls']}",
        f"host syncs per step: {r['host_syncs']} {r['host_sync_kinds']}; Composer's loop adds "
        f"{r['loop_host_syncs']} {r['loop_host_sync_kinds']}",
        f"graph breaks: {r['graph_breaks']} ({r['graphs']} graphs) {r['break_reasons']}"
        if r.get("graph_breaks_failed") is None else f"graph breaks: dynamo failed: {r['graph_breaks_failed']}",
        f"recompiles over {r['batches']} batches ({r['backend']}): {r['recompiles']}; loss eager {r['loss_eager']:.6f}, "
        f"compiled {r['loss_compiled']:.6f} (rel diff {r['loss_rel_diff']:.1e})"
        if r.get("compiled_losses_failed") is None else f"compiled: failed: {r['compiled_losses_failed']}",
    ])  # fmt: skip


@bench.command("generate", cls=Command)
@checkpoint_option()
@click.option("--prompt", default="The State of the Union", help="The prompt of every run.")
@click.option("--max-bytes", type=click.IntRange(min=1), default=200, help="New bytes per prompt.")
@click.option("--batch-size", type=click.IntRange(min=2), default=8, help="Prompts in the batch.")
@click.option("--repeat", type=click.IntRange(min=1), default=2, help="Best of N runs.")
@device_option
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
    emit(r, as_json, _render_bench_generate)


def _render_bench_generate(r: dict[str, Any]) -> str:
    return (
        f"with KV caches {r['cached_bytes_per_sec']:.0f} B/s ({r['cached_patches_per_sec']:.1f} patches/s); "
        f"without {r['uncached_bytes_per_sec']:.0f} B/s; speedup x{r['speedup']:.2f}; identical output: {r['identical']}\n"
        f"{r['batch_size']} prompts in one batch {r['batched_bytes_per_sec']:.0f} B/s, one at a time "
        f"{r['one_by_one_bytes_per_sec']:.0f} B/s; speedup x{r['batch_speedup']:.2f}; identical output: "
        f"{r['batch_identical']} ({r['device']}, {r['threads']} threads)"
    )


@bench.command("loader", cls=Command)
@data_option
@click.option("--batch-size", type=click.IntRange(min=1), default=64, help="Samples per batch.")
@click.option(
    "--workers", type=click.IntRange(min=0), default=0, help="DataLoader worker processes (0: in this process)."
)
@click.option("--repeat", type=click.IntRange(min=1), default=5, help="Interleaved rounds; medians and spread.")
@click.option("--batches", type=click.IntRange(min=1), default=100, help="Batches timed per round (after 5 warm-up).")
@click.option(
    "--eval-samples",
    type=click.IntRange(min=1),
    default=None,
    show_default="none: the training loader",
    help="Time the eval loader of data.eval_samples=N instead (a whole evaluation pass a round; --batches unused).",
)
@json_option()
def bench_loader_cmd(
    data: str, batch_size: int, workers: int, repeat: int, batches: int, eval_samples: int | None, as_json: bool
) -> None:
    """Training loader MB/s of text, streaming's per-sample reads beside batched reads, in one run.

    Both are the training loader (streaming's shuffle, the collator) over the shards' own tokenizer, or with
    --eval-samples the eval loader of data.eval_samples; rounds alternate between them. Printed: medians and
    spread of MB/s, samples/s and ms per batch, MB/s per worker, the ratio, the machine's load.

    \b
    Examples:
      hbpe bench loader --data runs/demo/shards-train --batch-size 64 --repeat 3
      hbpe bench loader --data runs/demo/shards-eval --batch-size 64 --eval-samples 2048
    """
    from hbpe.training.data.bench_loader import bench_loader

    check_local_paths("--data", data)
    r = bench_loader(
        data, batch_size=batch_size, workers=workers, repeat=repeat, batches=batches, eval_samples=eval_samples
    )
    emit(r, as_json, _render_bench_loader)


def _render_bench_loader(r: dict[str, Any]) -> str:
    def load(x: list[float] | None) -> str:
        return " ".join(f"{v:.2f}" for v in x) if x else "n/a"

    what = "train loader" if r["loader"] == "train" else f"eval set of data.eval_samples={r['eval_samples']}"
    lines = [
        f"{r['shards']} ({what}): batches of {r['batch_size']}, {r['workers']} workers, {r['repeat']} rounds of "
        f"{r['batches']} batches (medians; MB/s of each round after)",
        f"{'reads':<11} {'MB/s':>7} {'/worker':>8} {'samples/s':>10} {'ms/batch':>9}  MB/s of each round",
    ]
    for name, p in r["paths"].items():
        lines.append(
            f"{name:<11} {p['mb_per_s']:>7.2f} {p['mb_per_s_per_worker']:>8.2f} {p['samples_per_s']:>10.0f} "
            f"{p['ms_per_batch']:>9.3f}  " + ", ".join(f"{x:.2f}" for x in p["mb_per_s_all"])
        )
    lines.append(
        f"batched / per_sample: x{r['ratio']:.2f} (median of each round's ratio x{r['ratio_per_round']:.2f}); "
        f"{r['cpus']} CPUs, load average {load(r['load_before'])} before, {load(r['load_after'])} after"
    )
    return "\n".join(lines)
