"""`hbpe bench loader`: the training loader's text throughput, streaming's per-sample reads beside batched reads.

Both loaders are `build_dataloader` as training builds it (streaming's shuffle, the collator, the
scheme of the shards' own tokenizer); one reads each sample by streaming's `get_item`, the other a
chunk at a time from memory maps (training/data/batched_reads.py). Each has its own warm stream
cache; rounds alternate between them (A B, B A, ...) so that a change in the machine's load falls
on both, and each round times `batches` batches after `warmup` batches of a new epoch.

With `eval_samples` both are the eval loader of `data.eval_samples` instead (training/data/streams.py
`spread_eval_loader`: the held-out loader in order, narrowed to the eval set's blocks, read by index):
each round times one whole evaluation pass, after one untimed pass that fills the stream cache.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from typing import Any

from hbpe.pipeline.shards.reader import load_shard_tokenizer, read_manifest
from hbpe.schemas.errors import ConfigError
from hbpe.training.data.loader import WorkerOptions, build_dataloader
from hbpe.training.data.shared_memory import release
from hbpe.training.data.streams import spread_eval_loader

PATHS = {"per_sample": False, "batched": True}  # name -> BatchedReads.batched_reads


def bench_loader(
    shards: str,
    *,
    batch_size: int = 64,
    workers: int = 0,
    repeat: int = 5,
    batches: int = 100,
    warmup: int = 5,
    eval_samples: int | None = None,
) -> dict[str, Any]:
    """Per path: text MB/s (the `target_bytes` the model predicts), samples/s and ms per batch, medians over
    `repeat` rounds with their spread; MB/s per worker; the ratio of batched to per-sample; the machine's load.
    `eval_samples`: time the eval loader of data.eval_samples (a whole evaluation pass a round) instead."""
    samples = read_manifest(shards).counts.samples
    epoch = samples // batch_size
    if eval_samples is None and epoch < warmup + 1:
        raise ConfigError(
            f"{shards} has {samples} samples: {epoch} batches of {batch_size} an epoch, fewer than the {warmup} warm-up "
            f"batches and one timed; convert more text or lower --batch-size, e.g. --batch-size {samples // (warmup + 2)}"
        )
    batches = min(batches, epoch - warmup)
    tok = load_shard_tokenizer(shards)
    caches = {name: tempfile.mkdtemp(prefix=f"hbpe-bench-loader-{name}-") for name in PATHS}
    load_before = _load()
    try:
        loaders = {}
        for name, batched in PATHS.items():
            dl = build_dataloader(
                shards,
                tok,
                batch_size=batch_size,
                cache_dir=caches[name],
                shuffle=eval_samples is None,
                shuffle_seed=17,
                drop_last=eval_samples is None,
                workers=WorkerOptions(workers, persistent_workers=workers > 0),
            )
            dl.dataset.batched_reads = batched
            if eval_samples is not None:
                dl = _eval_set_loader(dl, samples, eval_samples, batch_size)
                _time_pass(dl)  # untimed: the stream cache filled, as at every evaluation after the first
            loaders[name] = dl
        rounds: dict[str, list[dict[str, float]]] = {name: [] for name in PATHS}
        for r in range(repeat):
            order = list(PATHS) if r % 2 == 0 else list(reversed(PATHS))
            for name in order:
                if eval_samples is None:
                    rounds[name].append(_time_round(loaders[name], batches=batches, warmup=warmup))
                else:
                    rounds[name].append(_time_pass(loaders[name]))
        if eval_samples is not None:
            batches, warmup = len(loaders["batched"]), 0
        _close(loaders)
    finally:
        for cache in caches.values():
            shutil.rmtree(cache, ignore_errors=True)
    out = {name: _summary(rs, workers) for name, rs in rounds.items()}
    per_round = [b["mb_per_s"] / p["mb_per_s"] for b, p in zip(rounds["batched"], rounds["per_sample"], strict=True)]
    return {
        "shards": shards,
        "loader": "train" if eval_samples is None else "eval_set",
        "eval_samples": eval_samples,
        "batch_size": batch_size,
        "workers": workers,
        "repeat": repeat,
        "batches": batches,
        "warmup": warmup,
        "paths": out,
        "ratio": out["batched"]["mb_per_s"] / out["per_sample"]["mb_per_s"],
        "ratio_per_round": statistics.median(per_round),
        # both loaders read the same epochs (or eval set): each round the same samples, so the same bytes of text
        "same_samples": all(
            b["bytes"] == p["bytes"] for b, p in zip(rounds["batched"], rounds["per_sample"], strict=True)
        ),
        "cpus": os.cpu_count(),
        "load_before": load_before,
        "load_after": _load(),
    }


def _eval_set_loader(held: Any, total: int, eval_samples: int, batch_size: int) -> Any:
    """The eval loader of data.eval_samples over the held-out loader `held`, as training builds it."""
    return spread_eval_loader(held, total, eval_samples, device_batch=batch_size)


def _time_pass(loader: Any) -> dict[str, float]:
    """One whole pass over `loader` (an evaluation), timed."""
    nbytes = nsamples = nbatches = 0
    t = time.perf_counter()
    for batch in loader:
        nbytes += int(batch["target_bytes"].sum())
        nsamples += len(batch["target_bytes"])
        nbatches += 1
    seconds = time.perf_counter() - t
    return {
        "bytes": nbytes,
        "mb_per_s": nbytes / seconds / 1e6,
        "samples_per_s": nsamples / seconds,
        "ms_per_batch": seconds / nbatches * 1e3,
    }


def _time_round(loader: Any, *, batches: int, warmup: int) -> dict[str, float]:
    """One new epoch: `warmup` batches untimed (threads and workers starting), then `batches` timed."""
    it = iter(loader)
    for _ in range(warmup):
        next(it)
    nbytes = nsamples = 0
    t = time.perf_counter()
    for _ in range(batches):
        batch = next(it)
        nbytes += int(batch["target_bytes"].sum())
        nsamples += len(batch["target_bytes"])
    seconds = time.perf_counter() - t
    _end_epoch(loader)
    return {
        "bytes": nbytes,
        "mb_per_s": nbytes / seconds / 1e6,
        "samples_per_s": nsamples / seconds,
        "ms_per_batch": seconds / batches * 1e3,
    }


def _end_epoch(loader: Any) -> None:
    """Stop the download and ready threads of the epoch left unfinished (in this process), so that they do not run
    beside the next round: measured, the per-sample path's left running tripled the next batched round's time."""
    iterator = vars(loader.dataset).get("_iterator")
    if iterator is not None:
        iterator.exit()


def _summary(rounds: list[dict[str, float]], workers: int) -> dict[str, Any]:
    med = {k: statistics.median(r[k] for r in rounds) for k in ("mb_per_s", "samples_per_s", "ms_per_batch")}
    return {
        **med,
        "mb_per_s_per_worker": med["mb_per_s"] / max(1, workers),
        "mb_per_s_all": [round(r["mb_per_s"], 3) for r in rounds],
        "ms_per_batch_all": [round(r["ms_per_batch"], 3) for r in rounds],
    }


def _close(loaders: dict[str, Any]) -> None:
    """Stop each loader's download threads and workers and give back streaming's shared memory."""
    for dl in loaders.values():
        _end_epoch(dl)
        dataset = getattr(dl.dataset, "dataset", dl.dataset)  # the eval set's: the streaming dataset it indexes
        executor = vars(dataset).pop("_executor", None)
        if executor is not None:
            executor.shutdown(wait=True)
        if getattr(dl, "_iterator", None) is not None:
            dl._iterator._shutdown_workers()  # persistent workers: gone now, before the caches are deleted
        release(dataset)


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
