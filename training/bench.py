"""`hbpe bench train` and `hbpe bench generate`: throughput numbers printed as ratios."""

from __future__ import annotations

import tempfile
import time

import torch

from hbpe.schemas.train_config import TrainConfig


def bench_train(cfg: TrainConfig, *, batches: int) -> dict:
    """Train `batches` batches (no eval, no checkpoints); bytes/s, patches/s, MFU when on GPU."""
    from dataclasses import replace

    from composer.loggers import InMemoryLogger

    from hbpe.training.trainer import build_run

    with tempfile.TemporaryDirectory(prefix="hbpe-bench-") as tmp:
        cfg = replace(
            cfg, max_duration=f"{batches}ba", save_folder=tmp, log_file=None, autoresume=False, load_path=None
        )
        mem = InMemoryLogger()
        run = build_run(cfg, loggers=[mem], eval_enabled=False, save_enabled=False)
        t = time.perf_counter()
        run.trainer.fit()
        wall = time.perf_counter() - t
        data = mem.data
        run.trainer.close()

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
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def bench_generate(checkpoint: str, prompt: str, *, max_bytes: int, repeat: int = 2) -> dict:
    """Greedy generation with and without KV caches on the same prompt; they must agree."""
    from hbpe.training.checkpoint import load_model
    from hbpe.training.generate import check_generate_args, generate

    check_generate_args(prompt, max_bytes=max_bytes, temperature=0.0)  # before loading a model
    model, tok, _ = load_model(checkpoint)
    res = {}
    for use_cache in (True, False):
        best = None
        for _ in range(repeat):
            g = generate(model, tok, prompt, max_bytes=max_bytes, temperature=0.0, use_cache=use_cache)
            best = g if best is None or g.seconds < best.seconds else best
        res["cached" if use_cache else "uncached"] = best
    c, u = res["cached"], res["uncached"]
    return {
        "max_bytes": max_bytes,
        "patches": c.patches,
        "cached_bytes_per_sec": c.new_bytes / c.seconds,
        "uncached_bytes_per_sec": u.new_bytes / u.seconds,
        "cached_patches_per_sec": c.patches / c.seconds,
        "uncached_patches_per_sec": u.patches / u.seconds,
        "speedup": u.seconds / c.seconds,
        "identical": c.text == u.text,
    }
