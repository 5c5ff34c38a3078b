"""Streaming shards from `hbpe convert` into batches for the model.

The run's tokenizer is checked against the shards' manifest:
- same fingerprint, `patches` stored    -> read the stored `patches` (`hbpe convert --store-patches`);
- same fingerprint, lean shards         -> derive patches from `tokens` with the run's tokenizer,
  the one the manifest names (the default layout: no `patches` column);
- same first stage, another S or mode   -> derive patches from `tokens` with the run's
  tokenizer (how one set of shards serves many experiments);
- another first stage                   -> a clear error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hbpe.pipeline import lock_file, storage
from hbpe.pipeline.shards import mds_format
from hbpe.pipeline.shards.reader import (  # read_manifest: the trainer imports it from here
    RESTORE,
    columns_error,
    columns_problem,
    damaged_error,
    read_file,
    read_manifest,
    shard_file_problems,
)
from hbpe.pipeline.tokenizer.hierarchical import HierarchicalTokenizer
from hbpe.schemas import shard_columns
from hbpe.schemas.errors import ArtifactError, ConfigError
from hbpe.schemas.manifest import Manifest
from hbpe.schemas.symbols import TOKEN_PAD
from hbpe.training.data.batched_reads import BatchedReads
from hbpe.training.data.schemes import Scheme, TokenScheme
from hbpe.training.data.shared_memory import probes_closed

log = logging.getLogger(__name__)


def _read_bytes(shards: str, name: str) -> bytes | None:
    """A file of a local or remote shard directory, None if missing."""
    return storage.read_if_exists(storage.join(shards, name))


def read_index(shards: str) -> tuple[bytes, dict]:
    """(bytes, parsed) index.json of a shard directory; refuses unsafe shard names before streaming reads it."""
    raw = _read_bytes(shards, shard_columns.INDEX_FILENAME)
    if raw is None:
        raise ArtifactError(f"{shards} has no index.json; {RESTORE}")
    return raw, mds_format.parse_index(raw, source=storage.join(shards, shard_columns.INDEX_FILENAME))


@dataclass(frozen=True)
class ShardCheck:
    """What `check_shards` read (shard files, cached raw files, bytes, seconds) and the hash for streaming."""

    shard_files: int
    cached_files: int
    bytes: int
    seconds: float
    validate_hash: str | None  # an algorithm every shard's index entry records
    max_shard_bytes: int = 0  # the largest shard's raw + zip bytes: what streaming's cache must hold at once


def check_shards(shards: str, cache_dir: str, *, hashes: bool = True, manifest: Manifest | None = None) -> ShardCheck:
    """Refuse damaged shards and a stale or damaged stream cache before anything trains on them.

    Local shard directories: every shard's size and (with `hashes`) xxh64 against index.json.
    Remote ones (gs://, s3://) are not read here, which would download them twice: streaming
    checks each shard's hash as it downloads it (`validate_hash`) and CheckedStreamingDataset
    turns a failure into an ArtifactError. In both cases the cache is checked: an index.json
    there from another conversion, or a decompressed shard that does not match, is refused.
    """
    t = time.perf_counter()
    raw_index, index = read_index(shards)
    # index.json carries no hash of its own: an edited one must at least agree with the manifest,
    # or streaming would read sample offsets that are not there
    manifest = manifest or read_manifest(shards)
    names = [e["zip_data"]["basename"] for e in index["shards"]]
    samples = sum(e["samples"] for e in index["shards"])
    if names != manifest.shards or samples != manifest.counts.samples:
        raise ArtifactError(
            f"{shards}: index.json ({len(names)} shards, {samples} samples) does not match manifest.json "
            f"({len(manifest.shards)} shards, {manifest.counts.samples} samples); {RESTORE}"
        )
    for e in index["shards"]:
        if problem := columns_problem(e, manifest):
            raise columns_error(shards, e, problem)
    shard_files = nbytes = 0
    if not storage.is_remote(shards):
        problems = shard_file_problems(Path(shards), index, hashes=hashes)
        if problems:
            raise damaged_error(shards, problems, more=" (found before training or evaluating: nothing was read)")
        shard_files = len(index["shards"])
        nbytes = sum(e["zip_data"]["bytes"] for e in index["shards"]) if hashes else 0
    cache = Path(cache_dir)
    cached_index = read_file(cache / shard_columns.INDEX_FILENAME)
    if cached_index is not None and cached_index != raw_index:
        raise ArtifactError(
            f"stream cache {cache_dir} holds shards of another conversion (its index.json differs from {shards}'s); "
            f"delete {cache_dir} (it is only a cache) or set data.cache_dir to a new directory"
        )
    cached_files = 0
    for e in index["shards"]:
        info = e["raw_data"]
        path = cache / info["basename"]
        if not path.is_file():
            continue  # not cached yet: streaming hashes it when it decompresses the verified zip
        size = path.stat().st_size
        problem = f"{size} bytes, index.json records {info['bytes']}" if size != info["bytes"] else None
        if problem is None and hashes:
            problem = mds_format.file_problem(read_file(path), info)
        if problem:
            raise ArtifactError(
                f"{path}: the cached copy of {e['zip_data']['basename']} is damaged ({problem}); "
                f"delete {cache_dir} (it is only a cache; streaming recreates it from {shards})"
            )
        cached_files += 1
        nbytes += size if hashes else 0
    algos = set.intersection(*(set(e["zip_data"]["hashes"]) for e in index["shards"])) if index["shards"] else set()
    algo = "xxh64" if "xxh64" in algos else min(algos, default=None)
    largest = max((e["raw_data"]["bytes"] + e["zip_data"]["bytes"] for e in index["shards"]), default=0)
    return ShardCheck(shard_files, cached_files, nbytes, time.perf_counter() - t, algo, largest)


@dataclass(frozen=True)
class PatchSource:
    """How a run turns shard samples into patches."""

    derive: bool  # True: patches = run tokenizer applied to `tokens`


def check_compatible(manifest: Manifest, tok: HierarchicalTokenizer, *, where: str) -> PatchSource:
    """Where the run's patches come from: the stored column, only if the shards hold this tokenizer's."""
    if manifest.tokenizer_fingerprint == tok.fingerprint:
        return PatchSource(derive=not manifest.stores_patches)
    if manifest.first_stage_fingerprint == tok.spec.first_stage.fingerprint:
        return PatchSource(derive=True)
    raise ArtifactError(
        f"{where} was tokenized with another first-stage BPE (fingerprint {manifest.first_stage_fingerprint[:12]}) than "
        f"this run's tokenizer ({tok.spec.first_stage.name}, {tok.spec.first_stage.fingerprint[:12]}); "
        "reconvert the corpus with this tokenizer or train with the shards' own tokenizer"
    )


def innermost(scheme: Scheme) -> Scheme:
    """The scheme under its wrappers (TiledScheme, HostCounts: each keeps the one it wraps as `inner`)."""
    while hasattr(scheme, "inner"):
        scheme = scheme.inner
    return scheme


class Collator:
    """Samples -> the model's batch for its scheme (training/data/schemes.py), as tensors.

    The id columns stay narrow up to the device (`narrow_dtypes`: int32 tokens, int16 patches where V' fits):
    the model widens them there (training/model/patch_lm.py `long_ids`); the rest is int64.

    Every batch has `target_bytes` (B,): the UTF-8 bytes of the text the model predicts
    (tokens 2..N: the first token is context only), so BPB = bits / target_bytes exactly, the
    same denominator for every scheme.
    Ids outside the vocabularies are refused here, where training and eval both pass:
    `np.take` would wrap a negative id onto another row and map n_vocab and n_vocab + 1
    onto the PAD and EOD rows, and an embedding would index out of range.
    """

    def __init__(
        self,
        tok: HierarchicalTokenizer,
        source: PatchSource,
        *,
        where: str = "the shards",
        scheme: Scheme | None = None,
    ) -> None:
        self.tok, self.source, self.where = tok, source, where
        self.scheme = scheme or TokenScheme(tok, source.derive)
        self.n_vocab = tok.encoding.max_token_value + 1
        self.narrow = narrow_dtypes(tok.vocab_size)

    def __call__(self, samples: list[dict]) -> dict[str, torch.Tensor]:
        tokens = np.stack([s["tokens"] for s in samples]).astype(np.int32, copy=False)  # (B, N): one cast, not B
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < TOKEN_PAD or hi >= self.n_vocab:
            raise ArtifactError(
                f"{self.where}: column `tokens` holds id {lo if lo < TOKEN_PAD else hi}, outside -2..{self.n_vocab - 1} "
                f"(EOD -1, PAD -2, then the {self.n_vocab} ids of {self.tok.spec.first_stage.name}): the shards are "
                f"damaged or not from this first stage; run `hbpe shards verify --data {self.where}` and reconvert"
            )
        stored = None
        if isinstance(innermost(self.scheme), TokenScheme) and not self.source.derive:
            stored = np.stack([np.asarray(s["patches"]) for s in samples])  # (B, N, S)
            if int(stored.max()) >= self.tok.vocab_size:
                raise ArtifactError(
                    f"{self.where}: column `patches` holds symbol {int(stored.max())}, outside the tokenizer's "
                    f"V'={self.tok.vocab_size} symbols: the shards are damaged or were written with another second "
                    f"stage; run `hbpe shards verify --data {self.where}` and reconvert"
                )
        batch = self.scheme.batch(tokens, stored)
        # a float is a count the loader made for the host (HostCounts: FLOPs, bytes): it stays off the device
        return {
            k: v if isinstance(v, float) else torch.from_numpy(np.asarray(v).astype(self.narrow.get(k, np.int64)))
            for k, v in batch.items()
        }


def narrow_dtypes(vocab_size: int) -> dict[str, type]:
    """The batch columns that travel narrow: `tokens` (ids -2..n_vocab - 1) as int32, `patches` (symbols below
    V' = `vocab_size`; the byte schemes' 259 too) as int16 where V' fits, else int32.

    >>> narrow_dtypes(470)["patches"], narrow_dtypes(40_000)["patches"]
    (<class 'numpy.int16'>, <class 'numpy.int32'>)
    """
    return {"tokens": np.int32, "patches": np.int16 if vocab_size <= np.iinfo(np.int16).max + 1 else np.int32}


_CHECKED_DATASET = None


def _checked_dataset_class() -> type:
    """StreamingDataset whose failed shard reads raise, built on first use (importing streaming costs ~10 s).

    streaming 0.13 downloads and decompresses shards in a background thread; when that
    fails (a hash mismatch with `validate_hash`, a truncated zstd frame, a missing file)
    it logs the traceback and ends the epoch early, so training or eval silently runs on
    part of the data (measured: 35 of 152 batches with one flipped byte in shard 2 of 4).
    Here the failure is kept, named after its shard, and raised when iteration stops.
    Samples are read a chunk at a time from memory maps of the cached shards (training/data/batched_reads.py).
    """
    global _CHECKED_DATASET
    if _CHECKED_DATASET is None:
        from streaming import StreamingDataset

        class CheckedStreamingDataset(BatchedReads, StreamingDataset):
            def prepare_shard(self, shard_id: int, blocking: bool = True) -> None:
                try:
                    super().prepare_shard(shard_id, blocking)
                except Exception as e:
                    raw, zipped = self.shards[shard_id].file_pairs[0]
                    name = (zipped or raw).basename
                    remote = self.streams[self.stream_per_shard[shard_id]].remote
                    raise ArtifactError(
                        f"{remote}: shard {name} failed while streaming ({type(e).__name__}: {e}); "
                        f"{RESTORE} (`hbpe shards verify` lists every problem)"
                    ) from e

            def on_exception(self, future) -> None:
                # streaming re-raises inside the executor's callback, where it is only logged
                if future.exception() is not None:
                    self._hbpe_failure = future.exception()
                    self._event.set()  # stops the other threads, as streaming does

            def __iter__(self):
                yield from super().__iter__()
                failure = getattr(self, "_hbpe_failure", None)
                if failure is not None:
                    raise failure

        # pickled by reference (DataLoader workers under spawn): resolved by this module's __getattr__
        CheckedStreamingDataset.__module__ = __name__
        CheckedStreamingDataset.__qualname__ = "CheckedStreamingDataset"
        _CHECKED_DATASET = CheckedStreamingDataset
    return _CHECKED_DATASET


def __getattr__(name: str):
    if name == "CheckedStreamingDataset":
        return _checked_dataset_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@contextlib.contextmanager
def _one_dataset_setup_at_a_time() -> Iterator[None]:
    """Serialize StreamingDataset construction across the processes of this machine.

    streaming picks its shared-memory prefix by probing /dev/shm for a free name and then
    creating it; two processes that probe at once pick the same one and the second fails with
    `FileExistsError: '/000002_locals'` (mosaicml/streaming#884, #901). Two runs (or test
    workers) on one machine start at the same moment often enough to hit it.

    Only a job's local leader takes the lock: it alone picks the prefix, and the other ranks of
    its job meet it at streaming's barriers inside the constructor, so they must not wait for it.
    Those barriers span every node, so two "nodes" of one job simulated on one machine need a
    TMPDIR each (this lock) and a /dev/shm each (streaming's names), as tests/training/test_multinode.py gives them.
    """
    if os.environ.get("LOCAL_RANK", "0") != "0":
        yield
        return
    # a shared temporary folder: a link planted there under this name is refused, never written through
    fd = lock_file.acquire(os.path.join(tempfile.gettempdir(), "hbpe-streaming-setup.lock"), wait=True)
    try:
        yield
    finally:
        lock_file.release(fd)


@dataclass(frozen=True)
class StreamSpec:
    """One stream of a StreamingDataset: its shards, its cache, at most one weight, and its manifest if read."""

    remote: str
    local: str
    proportion: float | None = None
    repeat: float | None = None
    choose: int | None = None
    manifest: Manifest | None = None


@dataclass(frozen=True)
class StreamingOptions:
    """streaming's knobs; None is streaming 0.13's own default (streaming/base/dataset.py).

    `num_canonical_nodes=None` is the number of nodes of the run that starts (64x that for py1s and
    py2s). streaming saves the value in its state, which Composer keeps in every checkpoint, and a
    resumed run takes the saved one: the global sample order does not depend on the devices.
    """

    num_canonical_nodes: int | None = None
    predownload: int | None = None
    cache_limit: int | None = None  # bytes
    shuffle_algo: str = "py1e"
    shuffle_block_size: int | None = None
    epoch_size: int | None = None


def with_manifests(streams: Sequence[StreamSpec]) -> list[StreamSpec]:
    """Each stream with its manifest (read once here; the callers' copies are kept)."""
    return [s if s.manifest else dataclasses.replace(s, manifest=read_manifest(s.remote)) for s in streams]


def stream_source(streams: Sequence[StreamSpec], tok: HierarchicalTokenizer) -> PatchSource:
    """How the streams mixed into one batch become patches; refuses a mix that cannot share a batch.

    Every stream must hold samples, come from the run tokenizer's first stage and have the same
    seq_len. One stream of another S or mode, or of lean shards (no `patches` stored), makes every
    stream derive its patches from `tokens` (the same patches where a stream's stored ones match):
    a batch has one source.
    """
    derive = False
    first = streams[0].manifest or read_manifest(streams[0].remote)
    for s in streams:
        m = s.manifest or read_manifest(s.remote)
        if m.counts.samples == 0:
            raise ArtifactError(
                f"{s.remote} holds no samples ({m.counts.documents_written} documents written, seq_len "
                f"{m.seq_len}): convert more text, or a smaller --seq-len (`hbpe shards stats` shows the counts)"
            )
        derive |= check_compatible(m, tok, where=s.remote).derive
        if m.seq_len != first.seq_len:
            raise ArtifactError(
                f"{s.remote} has samples of {m.seq_len} patches and {streams[0].remote} of {first.seq_len}: "
                "streams mixed into one batch need one seq_len; convert them with the same --seq-len"
            )
    return PatchSource(derive=derive)


def epoch_samples(streams: Sequence[StreamSpec], epoch_size: int | None = None) -> int:
    """Samples one epoch draws across the streams, as streaming's Stream.apply_weights counts them."""
    counts = [(s.manifest or read_manifest(s.remote)).counts.samples for s in streams]
    if any(s.proportion is not None for s in streams) or epoch_size:
        return epoch_size or sum(counts)
    return sum(
        int(s.repeat * n) if s.repeat is not None else (s.choose if s.choose is not None else n)
        for s, n in zip(streams, counts)
    )


def _check_cache_limit(limit: int | None, largest: int) -> None:
    """streaming refuses a cache smaller than 4 shards (raw + zip) only once it is built; say it first."""
    if limit is not None and limit < 4 * largest:
        raise ConfigError(
            f"data.cache_limit={limit} bytes is less than 4x the largest shard ({largest} bytes raw + zip), "
            f"which streaming needs to hold at once; raise it, e.g. data.cache_limit={-(-4 * largest // 2**20)}mb"
        )


def stop_downloads(loader: torch.utils.data.DataLoader) -> None:
    """Stop the StreamingDataset's download threads of an iteration left early, and wait for them.

    Streaming copies shards into the cache from background threads that run ahead of the
    iteration; after `break` they keep copying, so deleting the cache right away raced them
    ("Directory not empty"). `_iterator.exit()` is how streaming itself ends an epoch's threads.
    """
    dataset = loader.dataset
    iterator = getattr(dataset, "_iterator", None)
    if iterator is not None:
        iterator.exit()
    executor = getattr(dataset, "_executor", None)
    if executor is not None:
        executor.shutdown(wait=True)


@dataclass(frozen=True)
class WorkerOptions:
    """The DataLoader's processes. Each worker streams its own share of the samples (streaming partitions them by
    rank and worker, the same for any count: the global order does not change with `num_workers`)."""

    num_workers: int = 0
    pin_memory: bool = False  # page-locked batches: the copy to a GPU runs asynchronously
    persistent_workers: bool = False  # workers kept across epochs (and evaluations), not started again each time
    prefetch_factor: int | None = None  # batches each worker prepares ahead (None: torch's 2)

    def dataloader_kwargs(self) -> dict[str, Any]:
        """torch.utils.data.DataLoader's arguments; the worker ones only with workers (torch refuses them without)."""
        kwargs: dict[str, Any] = {"num_workers": self.num_workers, "pin_memory": self.pin_memory}
        if self.num_workers > 0:
            kwargs["persistent_workers"] = self.persistent_workers
            if self.prefetch_factor is not None:
                kwargs["prefetch_factor"] = self.prefetch_factor
        return kwargs


@dataclass(frozen=True)
class LoaderPlan:
    """What `build_dataloader` will stream, every check done: the streams with their manifests, how their samples
    become patches, and each stream's shard check (its hash for streaming). Nothing is opened or downloaded yet."""

    streams: list[StreamSpec]
    where: str  # the shards, as messages name them
    source: PatchSource
    checks: list[ShardCheck]  # one per stream


def plan_dataloader(
    shards: str | Sequence[StreamSpec],
    tok: HierarchicalTokenizer,
    *,
    cache_dir: str | None,
    verify: str = "hash",
    manifest: Manifest | None = None,
    cache_limit: int | None = None,
) -> LoaderPlan:
    """The checks of `build_dataloader` (its arguments); writes nothing but an empty temporary cache when none is given."""
    if verify not in ("hash", "size"):
        raise ConfigError(f"verify must be 'hash' or 'size', got {verify!r}")
    if isinstance(shards, str):
        # the caller's copy of the manifest when it has read it already
        streams = [StreamSpec(shards, cache_dir or tempfile.mkdtemp(prefix="hbpe-stream-"), manifest=manifest)]
    else:
        streams = list(shards)
    streams = with_manifests(streams)
    source = stream_source(streams, tok)
    checks = [_check_stream(s, hashes=verify == "hash") for s in streams]
    _check_cache_limit(cache_limit, max(c.max_shard_bytes for c in checks))
    return LoaderPlan(streams, ", ".join(s.remote for s in streams), source, checks)


def _check_stream(s: StreamSpec, *, hashes: bool) -> ShardCheck:
    check = check_shards(s.remote, s.local, hashes=hashes, manifest=s.manifest)
    log.info(
        "checked %d shards and %d cached files of %s (%.1f MB) in %.1f ms",
        check.shard_files,
        check.cached_files,
        s.remote,
        check.bytes / 1e6,
        check.seconds * 1e3,
    )
    return check


def build_dataloader(
    shards: str | Sequence[StreamSpec],
    tok: HierarchicalTokenizer,
    *,
    batch_size: int,
    cache_dir: str | None,
    shuffle: bool,
    shuffle_seed: int,
    workers: WorkerOptions | None = None,
    drop_last: bool = True,
    verify: str = "hash",
    manifest: Manifest | None = None,
    scheme: Scheme | None = None,
    options: StreamingOptions | None = None,
) -> torch.utils.data.DataLoader:
    """A StreamingDataset over one shard directory (local dir or URI) or a weighted mix of streams.

    Local shard directories are treated as the remote too, so streaming's decompressed
    copies go to the cache (`cache_dir`, or each stream's `local`) and the shard directory
    stays exactly as written.
    Before streaming opens anything, `check_shards` refuses damaged shards and a stale
    cache, for every stream: `verify="hash"` (size and xxh64 of every file, ~1 ms per 10 MB
    from the page cache) or `"size"` (sizes only, for directories too large to read at every start).
    `scheme` builds the model's batches (training/data/schemes.py; default: the tokenizer's patches).
    `workers`: the DataLoader's processes (default: none, batches made in this process).
    """
    options = options or StreamingOptions()
    plan = plan_dataloader(
        shards, tok, cache_dir=cache_dir, verify=verify, manifest=manifest, cache_limit=options.cache_limit
    )
    ds = _streaming_dataset(plan, batch_size=batch_size, shuffle=shuffle, shuffle_seed=shuffle_seed, options=options)
    return torch.utils.data.DataLoader(
        ds,
        batch_size=batch_size,
        collate_fn=Collator(tok, plan.source, where=plan.where, scheme=scheme),
        drop_last=drop_last,
        **(workers or WorkerOptions()).dataloader_kwargs(),
    )


def _streaming_dataset(
    plan: LoaderPlan, *, batch_size: int, shuffle: bool, shuffle_seed: int, options: StreamingOptions
) -> torch.utils.data.IterableDataset:
    """The checked StreamingDataset over the plan's streams (streaming is imported here: ~10 s)."""
    from streaming import Stream

    mix = [
        Stream(
            remote=s.remote,
            local=s.local,
            proportion=s.proportion,
            repeat=s.repeat,
            choose=s.choose,
            # hashes each shard again as it enters the cache: the only check remote shards get, and it
            # covers a local file changed after check_shards
            validate_hash=c.validate_hash,
        )
        for s, c in zip(plan.streams, plan.checks)
    ]
    with _one_dataset_setup_at_a_time(), probes_closed():
        return _checked_dataset_class()(
            streams=mix,
            batch_size=batch_size,
            shuffle=shuffle,
            shuffle_seed=shuffle_seed,
            num_canonical_nodes=options.num_canonical_nodes,
            predownload=options.predownload,
            cache_limit=options.cache_limit,
            shuffle_algo=options.shuffle_algo,
            shuffle_block_size=options.shuffle_block_size,
            epoch_size=options.epoch_size,
        )
