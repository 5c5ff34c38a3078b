"""A run's streams: its shard directories as streaming datasets, each in the run's stream cache, and the loaders.

The train loader reads `data.train` or `data.streams` (a mixture), the eval loader `data.eval`,
each cached under the run's stream cache (one per node: streaming's local rank 0 downloads, the
other ranks wait for its files), which one run holds at a time (stream_cache.py).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from hbpe.pipeline import storage
from hbpe.schemas.train_config import TrainConfig
from hbpe.training.data.eval_set import IndexedSamples, eval_blocks, rank_blocks
from hbpe.training.data.loader import (
    StreamingOptions,
    StreamSpec,
    WorkerOptions,
    build_dataloader,
    read_manifest,
    stream_source,
)
from hbpe.training.data.schemes import TiledScheme, build_scheme, symbols_per_patch, tiles_apply
from hbpe.training.data.stream_cache import claim, stream_cache

if TYPE_CHECKING:
    from hbpe.pipeline.tokenizer.hierarchical import HierarchicalTokenizer


def cache_root(cfg: TrainConfig) -> str:
    """streaming's cache: one per node, so nodes sharing a save folder (NFS) never write the same files."""
    from composer.utils import dist

    root = cfg.data.cache_dir or os.path.join(local_root(cfg), "stream-cache")
    nodes = dist.get_world_size() // dist.get_local_world_size()
    return os.path.join(root, f"node{dist.get_node_rank()}") if nodes > 1 else root


def claim_cache(cfg: TrainConfig) -> None:
    """This node's stream cache for this run alone (stream_cache.claim), with the fix for where its root came from."""

    if cfg.data.cache_dir:
        fix = "set data.cache_dir to a folder of its own"
    elif storage.is_remote(cfg.save_folder):  # caches and logs under runs/<run_name>: the default name collides
        fix = f"set run_name to a name of its own, e.g. run_name={cfg.run_name}-2 (its caches go to runs/<run_name>)"
    else:
        fix = "set save_folder to a folder of its own"
    claim(cache_root(cfg), run_name=cfg.run_name, save_folder=cfg.save_folder, fix=fix)


def train_streams(cfg: TrainConfig, train_manifests: list[Any]) -> list[Any]:
    """data.train or data.streams as StreamSpecs (with their manifests) cached under the run's stream cache."""

    root = cache_root(cfg)
    if not cfg.data.streams:
        return [StreamSpec(cfg.data.train, stream_cache(root, cfg.data.train, "train"), manifest=train_manifests[0])]
    return [
        StreamSpec(
            s.remote,
            s.local or stream_cache(root, s.remote, "train-streams"),
            proportion=s.proportion,
            repeat=s.repeat,
            choose=s.choose,
            manifest=m,
        )
        for s, m in zip(cfg.data.streams, train_manifests)
    ]


def streaming_options(cfg: TrainConfig, *, eval_loader: bool = False) -> Any:
    """The data block's streaming knobs; eval reads its shards in order, so only the cache ones apply there."""

    d = cfg.data
    if eval_loader:
        return StreamingOptions(predownload=d.predownload, cache_limit=d.cache_limit_bytes)
    return StreamingOptions(
        num_canonical_nodes=d.num_canonical_nodes,
        predownload=d.predownload,
        cache_limit=d.cache_limit_bytes,
        shuffle_algo=d.shuffle_algo,
        shuffle_block_size=d.shuffle_block_size,
        epoch_size=d.epoch_size,
    )


def loader_workers(cfg: TrainConfig, *, device: str) -> WorkerOptions:
    """The data block's loader processes, each null decided for `device` (Composer's name: "gpu" or "cpu")."""
    from composer.utils import dist

    d, on_gpu = cfg.data, device == "gpu"
    workers = d.num_workers
    if workers is None:
        workers = default_workers(_cpus(), dist.get_local_world_size(), on_gpu=on_gpu)
    return WorkerOptions(
        workers,
        pin_memory=on_gpu if d.pin_memory is None else d.pin_memory,
        persistent_workers=d.persistent_workers,
        prefetch_factor=d.prefetch_factor,
    )


def default_workers(cpus: int, processes: int, *, on_gpu: bool) -> int:
    """Loader workers per training process: on a GPU the CPUs each process has, less one for the process itself,
    at most 8 (one reads ~40 MB/s of text at seq_len 128: `hbpe bench loader`), at least 1; on CPU none,
    since the training step's threads use those cores.

    >>> default_workers(16, 1, on_gpu=True), default_workers(16, 8, on_gpu=True), default_workers(2, 1, on_gpu=False)
    (8, 1, 0)
    """
    return max(1, min(8, cpus // max(1, processes) - 1)) if on_gpu else 0


def _cpus() -> int:
    """The CPUs this process may run on (a container's or taskset's share), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def build_dataloaders(
    cfg: TrainConfig,
    tok: HierarchicalTokenizer,
    train_manifests: list[Any],
    *,
    device_batch: int,
    eval_enabled: bool,
    entropy_model: Any | None = None,
    device: str = "cpu",
) -> tuple[Any, Any | None]:
    """(train, eval or None) StreamingDataset loaders; each checks its shards against `tok` first.

    On `device` where the loader's tiles apply (training/data/schemes.py `tiles_apply`), the collator lays out
    each device microbatch's packing (training/data/tile_layout.py), so the step has static shapes and no host sync.
    """
    tiled = tiles_apply(cfg.model, device=device, symbols_per_patch=symbols_per_patch(cfg.model, tok))
    group = cfg.device_microbatch_size if isinstance(cfg.device_microbatch_size, int) else None

    def scheme(streams: list[Any]) -> Any:
        derive = stream_source(streams, tok).derive
        built = build_scheme(cfg.model, tok, derive=derive, entropy_model=entropy_model)
        return TiledScheme(built, group=group) if tiled else built

    # one cache per node: streaming's local rank 0 downloads, the other ranks wait for its files
    d = cfg.data
    streams = train_streams(cfg, train_manifests)
    train_dl = build_dataloader(
        streams,
        tok,
        batch_size=device_batch,
        cache_dir=None,
        shuffle=d.shuffle,
        shuffle_seed=d.shuffle_seed,
        workers=loader_workers(cfg, device=device),
        scheme=scheme(streams),
        options=streaming_options(cfg),
    )
    if not (eval_enabled and d.eval):
        return train_dl, None
    held = [StreamSpec(d.eval, stream_cache(cache_root(cfg), d.eval, "eval"), manifest=read_manifest(d.eval))]
    eval_dl = build_dataloader(
        held,
        tok,
        batch_size=device_batch,
        cache_dir=None,
        shuffle=False,
        shuffle_seed=d.shuffle_seed,
        drop_last=False,
        workers=loader_workers(cfg, device=device),
        scheme=scheme(held),
        options=streaming_options(cfg, eval_loader=True),
    )
    if d.eval_samples is not None:
        eval_dl = spread_eval_loader(
            eval_dl, held[0].manifest.counts.samples, d.eval_samples, device_batch=device_batch
        )
    return train_dl, eval_dl


def spread_eval_loader(loader: Any, total: int, samples: int, *, device_batch: int) -> Any:
    """`loader`'s held-out samples narrowed to the eval set of data.eval_samples (training/data/eval_set.py):
    this rank's blocks, one device batch each, read by index in evaluation order, a block at a time (batched
    reads), by `loader`'s worker processes."""
    import torch
    from composer.utils import dist

    blocks = rank_blocks(
        eval_blocks(total, samples, device_batch),
        rank=dist.get_global_rank(),
        world=dist.get_world_size(),
        what=f"data.eval_samples={samples}",
    )
    indices = [i for start, n in blocks for i in range(start, start + n)]
    return torch.utils.data.DataLoader(
        IndexedSamples(loader.dataset, indices),
        batch_size=device_batch,
        collate_fn=loader.collate_fn,
        shuffle=False,
        drop_last=False,
        **_worker_kwargs(loader),
    )


def _worker_kwargs(loader: Any) -> dict[str, Any]:
    """`loader`'s worker processes as DataLoader arguments (torch refuses the worker ones without workers)."""
    kwargs = {"num_workers": loader.num_workers, "pin_memory": loader.pin_memory}
    if loader.num_workers > 0:
        kwargs |= {"persistent_workers": loader.persistent_workers, "prefetch_factor": loader.prefetch_factor}
    return kwargs


def local_root(cfg: TrainConfig) -> str:
    """Where caches and logs go: the save folder, or runs/<run_name> when checkpoints go to a bucket."""
    return os.path.join("runs", cfg.run_name) if storage.is_remote(cfg.save_folder) else cfg.save_folder
