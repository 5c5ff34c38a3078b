"""`hbpe bench train` and `hbpe bench generate`: throughput numbers printed as ratios."""

from __future__ import annotations

import tempfile
import time

import torch

from hbpe.schemas.train_config import TrainConfig
from hbpe.training.checkpoint.load import load_model
from hbpe.training.inference.generate import check_generate_args, generate, generate_batch
from hbpe.training.train.trainer import build_run


def bench_train(cfg: TrainConfig, *, batches: int) -> dict:
    """Train `batches` batches (no eval, no checkpoints); bytes/s, patches/s, executed FLOPs, peak memory
    above the start (GPU: allocated; CPU: resident), MFU when on GPU."""
    from dataclasses import replace

    from composer.loggers import InMemoryLogger

    with tempfile.TemporaryDirectory(prefix="hbpe-bench-") as tmp, PeakMemory() as peak:
        cfg = replace(
            cfg, max_duration=f"{batches}ba", save_folder=tmp, log_file=None, autoresume=False, load_path=None
        )
        mem = InMemoryLogger()
        run = build_run(cfg, loggers=[mem], eval_enabled=False, save_enabled=False)
        t = time.perf_counter()
        run.trainer.fit()
        wall = time.perf_counter() - t
        data = mem.data
        run.close()

    def last(key: str) -> float | None:
        return float(data[key][-1][1]) if key in data and data[key] else None

    return {
        **run.info,
        "model_size": cfg.model_size,
        "batches": batches,
        "global_batch_size": cfg.global_batch_size,
        "wall_s": wall,
        **run.meter.summary(),
        "flops_per_sec": last("throughput/device/flops_per_sec"),
        "mfu": last("throughput/device/mfu"),
        "peak_memory_bytes": peak.bytes,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def bench_train_side_by_side(variants: dict[str, TrainConfig], *, batches: int, repeat: int = 3) -> dict:
    """`bench_train` of each named config in turn, `repeat` rounds interleaved (A B A B ...: drift in the
    machine's load falls on every variant alike) -> per variant the medians, and ratios to the first.

    A ratio measured in one process is what this shared machine can compare; absolute numbers move with load.
    """
    import statistics

    runs: dict[str, list[dict]] = {name: [] for name in variants}
    for _ in range(repeat):
        for name, cfg in variants.items():
            runs[name].append(bench_train(cfg, batches=batches))
    keys = (
        "bytes_per_sec",
        "executed_flops_per_sec",
        "executed_flops_per_byte",
        "paper_flops_per_byte",
        "peak_memory_bytes",
        "pad_share",
    )
    out = {}
    for name, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in keys}
        out[name] = {**rs[0], **med, "bytes_per_sec_all": [r["bytes_per_sec"] for r in rs]}
    first_name = next(iter(out))
    first = out[first_name]
    for name, r in out.items():
        r["bytes_per_sec_ratio"] = r["bytes_per_sec"] / first["bytes_per_sec"]
        # each round's ratio to the first variant's rate in the same round, then their median: a pairing that a
        # drift of the machine's load between rounds moves less than it moves the ratio of the two medians
        r["bytes_per_sec_round_ratio"] = statistics.median(
            a["bytes_per_sec"] / b["bytes_per_sec"] for a, b in zip(runs[name], runs[first_name], strict=True)
        )
        r["memory_ratio"] = r["peak_memory_bytes"] / max(first["peak_memory_bytes"], 1)
    load = _load_average()
    return {"variants": out, "repeat": repeat, "batches": batches, "threads": torch.get_num_threads(), "load": load}


def _load_average() -> list[float] | None:
    try:
        import os

        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


class PeakMemory:
    """Peak memory of the work inside `with`, above what was in use at its start.

    On a GPU the allocator's own high-water mark (torch.cuda.max_memory_allocated); on the CPU the
    process's resident set, sampled every 2 ms by a thread (torch's CPU allocator keeps no peak),
    so a spike shorter than that can be missed.
    """

    def __enter__(self) -> PeakMemory:
        import threading

        import psutil

        self.bytes = 0
        self._cuda = torch.cuda.is_available()
        if self._cuda:
            torch.cuda.synchronize()
            self._start = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            return self
        _release_freed_memory()  # what an earlier run freed but the C allocator kept would hide this one's peak
        proc = psutil.Process()
        self._start = self._peak = proc.memory_info().rss
        self._stop = threading.Event()

        def sample() -> None:
            while not self._stop.wait(0.002):
                self._peak = max(self._peak, proc.memory_info().rss)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._cuda:
            torch.cuda.synchronize()
            self.bytes = torch.cuda.max_memory_allocated() - self._start
            return
        self._stop.set()
        self._thread.join()
        self.bytes = self._peak - self._start


# openings for the batched measurement: different lengths, so rows are ragged as in real use
BENCH_PROMPTS = (
    "Fellow-Citizens of the Senate and House of Representatives:",
    "Mr. Speaker, Mr. Vice President, Members of Congress",
    "To the Congress of the United States:",
    "My fellow Americans,",
    "Gentlemen of the Senate and House of Representatives: In",
    "We the People",
    "Tonight",
)


def _best(repeat: int, run):
    """(fastest wall seconds, its result) over `repeat` runs."""
    best = None
    for _ in range(repeat):
        t = time.perf_counter()
        out = run()
        wall = time.perf_counter() - t
        best = (wall, out) if best is None or wall < best[0] else best
    return best


def bench_generate(
    checkpoint: str,
    prompt: str,
    *,
    max_bytes: int,
    repeat: int = 2,
    batch_size: int = 8,
    device: str | torch.device = "cpu",
) -> dict:
    """Greedy generation with and without KV caches on the same prompt (they must agree); then
    `batch_size` prompts in one batch vs one after another, both cached (each prompt must agree)."""

    check_generate_args(prompt, max_bytes=max_bytes, temperature=0.0)  # before loading a model
    model, tok, _ = load_model(checkpoint, device=device)
    runs = {}
    for use_cache in (True, False):
        _, runs[use_cache] = _best(
            repeat, lambda c=use_cache: generate(model, tok, prompt, max_bytes=max_bytes, use_cache=c)
        )
    c, u = runs[True], runs[False]
    prompts = [prompt, *BENCH_PROMPTS] * (1 + batch_size // (1 + len(BENCH_PROMPTS)))
    prompts = prompts[:batch_size]
    batched_s, batched = _best(
        repeat, lambda: generate_batch(model, tok, prompts, max_bytes=max_bytes, batch_size=batch_size)
    )
    one_s, one = _best(repeat, lambda: [generate(model, tok, p, max_bytes=max_bytes) for p in prompts])
    new_bytes = sum(g.new_bytes for g in batched)
    return {
        "max_bytes": max_bytes,
        "device": str(next(model.parameters()).device),
        "threads": torch.get_num_threads(),
        "patches": c.patches,
        "cached_bytes_per_sec": c.new_bytes / c.seconds,
        "uncached_bytes_per_sec": u.new_bytes / u.seconds,
        "cached_patches_per_sec": c.patches / c.seconds,
        "uncached_patches_per_sec": u.patches / u.seconds,
        "speedup": u.seconds / c.seconds,
        "identical": c.text == u.text,
        "batch_size": batch_size,
        "batched_bytes_per_sec": new_bytes / batched_s,
        "one_by_one_bytes_per_sec": sum(g.new_bytes for g in one) / one_s,
        "batch_speedup": one_s / batched_s,
        "batch_identical": [g.text for g in batched] == [g.text for g in one],
    }


def _release_freed_memory() -> None:
    """Return freed heap pages to the OS (glibc's malloc_trim), so resident memory counts live memory only."""
    import contextlib
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: the start may then include freed pages
        ctypes.CDLL("libc.so.6").malloc_trim(0)
