"""Samples of cached MDS shards read a chunk at a time from a memory map, inside streaming's epoch.

streaming 0.13 reads every sample on its own (`MDSReader.get_sample_data`): an open, two seeks
and reads and a close of the raw shard, then each column's encoding string parsed again. That was
82% of a loader worker's time (17.7-19.6 ms per batch of 64 at seq_len 128, 2.2-2.4 MB/s of text).
hbpe's columns all have a static dtype and shape, so a raw shard is a header and fixed-size
records (training/data/mds_records.py), and the samples of a chunk are one fancy index per
column into a memory map of the file streaming cached.

`BatchedReads.__iter__` is streaming's own `__iter__`: its shuffle, partition over ranks and
workers, resumption state, downloads, hash checks and cache eviction are streaming's, and so is
every sample id in its order. What goes a chunk (a device batch) at a
time instead of a sample at a time: the yield loop, which reads the chunk's samples together,
and the prepare and ready threads, which visit each shard of a chunk once (streaming took a file
lock per sample there, competing with the reader for the GIL). A shard of any other layout (a
variable-size column, a pickled one, another format) is read by streaming's `get_item`, sample
by sample, as before.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterator
from time import sleep, time_ns
from typing import Any

import numpy as np

from hbpe.training.data.mds_records import MappedShard, record_layout

MAPS_HELD = 16  # memory maps a process keeps open: the shards a shuffle block spans, a few at a time
# how long the ready thread and the yield loop wait before they look again. streaming's TICK (7 ms) was longer
# than a reader takes to yield a predownload window of 8 batches (~0.7 ms each), so the reader waited on it
POLL = 0.001


class BatchedReads:
    """A StreamingDataset mixin: each epoch yields the same samples in the same order as streaming's
    `__iter__`, read a chunk at a time (up to one device batch of ready samples) from memory maps.

    `batched_reads = False` gives streaming's own per-sample path (`hbpe bench loader` times both).
    """

    batched_reads: bool = True
    _PER_PROCESS = ("_hbpe_maps", "_hbpe_layouts")  # open maps are not picklable (spawned loader workers)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k not in self._PER_PROCESS}

    def close_maps(self) -> None:
        """Unmap the shards this process holds open (each map keeps a file descriptor); they reopen when read."""
        vars(self).pop("_hbpe_maps", None)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if not self.batched_reads:
            yield from super().__iter__()  # type: ignore[misc]
            return
        yield from self._iter_batched()

    def _iter_batched(self) -> Iterator[dict[str, Any]]:
        """streaming 0.13's StreamingDataset.__iter__, line for line, but for its threads and last loop, which
        go a chunk of samples at a time (see the module doc)."""
        from concurrent.futures import ThreadPoolExecutor, wait
        from threading import Event

        from streaming.base.dataset import _Iterator

        if hasattr(self, "_iterator"):
            self._iterator.exit()
        if not hasattr(self, "_executor"):
            self._executor = ThreadPoolExecutor()
        if not hasattr(self, "_event"):
            self._event = Event()
        elif self._event.is_set():
            raise RuntimeError("Background thread failed. Check other traceback.")
        self._unique_worker_world = self._unique_rank_world.detect_workers()
        self._parallel_worker_world = self._parallel_rank_world.detect_workers()
        epoch, sample_in_epoch = self._resume_incr_epoch()
        sample_ids = self._get_work(epoch, sample_in_epoch)
        if not len(sample_ids):  # resumed at the end of the epoch
            return
        self._iterator = it = _Iterator(sample_ids)
        prepare_future = self._executor.submit(self._prepare_chunks, it)
        prepare_future.add_done_callback(self.on_exception)
        ready_future = self._executor.submit(self._ready_chunks, it)
        ready_future.add_done_callback(self.on_exception)
        for ids in self._each_ready_chunk(it):
            yield from self.read_samples(ids)
        wait([prepare_future, ready_future], return_when="FIRST_EXCEPTION")
        it.exit()

    def _chunk_end(self, it: Any, start: int) -> int:
        """End of the next chunk from `start`: a device batch of samples, no further than `predownload` past the
        yield index (streaming's threads stop there: `predownload < index - yield_index` waits)."""
        stop = min(it.total, start + max(1, self.batch_size or 64))
        if self.predownload is not None:
            stop = min(stop, it.yield_index + self.predownload + 1)
        return stop

    def _shards_of(self, ids: np.ndarray) -> list[int]:
        """The shards of sample ids (-1: padding, none), each once, in the order the ids first reach them."""
        ids = ids[ids != -1]
        shards = np.searchsorted(self.spanner.shard_bounds, ids, side="right") - 1
        _, first = np.unique(shards, return_index=True)
        return shards[np.sort(first)].tolist()

    def _all_cached(self, ids: np.ndarray) -> bool:
        """Whether every shard of these sample ids is cached: then they are read without waiting for the ready
        thread to pass them (a thread that a loaded machine wakes late), as streaming's get_item reads a sample
        whenever its shard is there."""
        from streaming.base.dataset import _ShardState

        shards = np.searchsorted(self.spanner.shard_bounds, ids[ids != -1], side="right") - 1
        return bool((self._shard_states.numpy()[shards] == _ShardState.LOCAL).all())

    def _stopped(self, it: Any) -> bool:
        return it.should_exit() or self._event.is_set()

    def _prepare_chunks(self, it: Any) -> None:
        """streaming's `_prepare_thread` a chunk at a time: each shard of the chunk prepared once (downloaded,
        decompressed, hash-checked, its access time touched) where streaming prepares it once per sample (a file
        lock and shared-memory reads each: measured 0.1-0.4 ms, ahead of every sample, in the reading process)."""
        from streaming.base.constant import TICK

        while not self._stopped(it):
            if it.prepare_index == it.total or it.ready_index == it.total:
                it.prepare_index = it.total
                break
            stop = self._chunk_end(it, it.prepare_index)
            if stop <= it.prepare_index:
                sleep(TICK)
                continue
            for shard_id in self._shards_of(it.sample_ids[it.prepare_index : stop]):
                self.prepare_shard(shard_id, False)
            it.prepare_index = stop
        it.on_exit()

    def _ready_chunks(self, it: Any) -> None:
        """streaming's `_ready_thread` a chunk at a time: the chunk is ready once each of its shards is cached
        (prepared here if it is not: evicted since, or never reached by the prepare thread)."""
        from streaming.base.dataset import _ShardState

        while not self._stopped(it) and it.ready_index != it.total:
            stop = self._chunk_end(it, it.ready_index)
            if stop <= it.ready_index:
                sleep(POLL)
                continue
            for shard_id in self._shards_of(it.sample_ids[it.ready_index : stop]):
                if self._shard_states[shard_id] == _ShardState.REMOTE:
                    self.prepare_shard(shard_id, False)
                while self._shard_states[shard_id] != _ShardState.LOCAL and not self._event.is_set():
                    sleep(POLL)
            it.ready_index = stop
        it.on_exit()

    def _each_ready_chunk(self, it: Any) -> Iterator[np.ndarray]:
        """streaming's `_each_sample_id` a chunk at a time: the next sample ids (up to a device batch, -1 padding
        left out) that the ready thread has passed, or whose shards are all cached. The yield index moves past a
        chunk once its samples are consumed, as streaming's moves past one sample (the threads' predownload
        counts from it)."""

        chunk = max(1, self.batch_size or 64)
        while not self._stopped(it) and it.yield_index != it.total:
            stop = min(it.total, it.yield_index + chunk)
            if it.ready_index < stop and not self._all_cached(it.sample_ids[it.yield_index : stop]):
                stop = it.ready_index
                if stop <= it.yield_index:
                    sleep(POLL)
                    continue
            ids = it.sample_ids[it.yield_index : stop]
            ids = ids[ids != -1]
            if len(ids):
                yield ids
            it.yield_index = stop
        it.on_exit()

    def read_samples(self, ids: np.ndarray) -> list[dict[str, Any]]:
        """The samples of global ids `ids`, in that order: each shard's share in one gather, others by `get_item`."""
        bounds = self.spanner.shard_bounds  # (shards + 1,) first global id of each shard
        shard_of = np.searchsorted(bounds, ids, side="right") - 1
        rows = ids - bounds[shard_of]
        out: list[Any] = [None] * len(ids)
        for shard_id in np.unique(shard_of).tolist():
            at = np.flatnonzero(shard_of == shard_id)
            columns = self._gather(shard_id, rows[at])
            if columns is None:
                for j in at.tolist():
                    out[j] = self.get_item(int(ids[j]))
                continue
            names = list(columns)
            for k, j in enumerate(at.tolist()):
                out[j] = {name: columns[name][k] for name in names}
        return out

    def _gather(self, shard_id: int, rows: np.ndarray) -> dict[str, np.ndarray] | None:
        mapped = self._mapped(shard_id)
        if mapped is None:
            return None
        self._shard_access_times[shard_id] = time_ns()  # what streaming's get_item records, for its eviction
        return mapped.gather(rows)

    def _mapped(self, shard_id: int, attempts: int = 8) -> MappedShard | None:
        """The shard's map (opened once, kept among the last MAPS_HELD), or None: read it by streaming's get_item.

        A shard missing from the cache is prepared (downloaded, decompressed, hash-checked) by streaming, as its
        get_item does, and tried again. With a cache limit a shard can be evicted while mapped: its map is
        dropped once streaming no longer counts it as cached, so an evicted file's space is not held.
        """
        from streaming.base.dataset import _ShardState

        maps = vars(self).setdefault("_hbpe_maps", OrderedDict())
        if self.cache_limit:
            states = self._shard_states.numpy()
            for held in [s for s in maps if states[s] != _ShardState.LOCAL]:
                del maps[held]
        if shard_id in maps:
            maps.move_to_end(shard_id)
            return maps[shard_id]
        layouts = vars(self).setdefault("_hbpe_layouts", {})
        if shard_id not in layouts:
            layouts[shard_id] = record_layout(self.shards[shard_id])
        layout = layouts[shard_id]
        if layout is None:
            return None
        shard = self.shards[shard_id]
        path = os.path.join(shard.dirname, shard.split or "", shard.file_pairs[0][0].basename)
        for _ in range(attempts):
            try:
                mapped = MappedShard.open(path, layout, shard.samples)
                break
            except FileNotFoundError:
                self.prepare_shard(shard_id)
        else:
            return None  # streaming's get_item retries once more and raises its own error
        maps[shard_id] = mapped
        while len(maps) > MAPS_HELD:
            maps.popitem(last=False)
        return mapped
