"""PlanShards and the shard writer: the global patch stream -> fixed-size samples -> MDS shards.

The stream is the concatenation of the unit streams in unit order (files sorted,
documents in file order). Sample k covers stream positions [kN, (k+1)N); shard j
holds samples [jM, (j+1)M). Once every unit's length is known, each shard knows
exactly which byte ranges of which unit files it needs, so shards are written in
parallel and deterministically, by whichever runner. A full shard's place needs less: only
the lengths of the units up to its end, in unit order, so `ReadyShards` hands it out while
later units still encode (the in-process runner writes it then) and plan_shards gives the
same task for it at the end.

Shards are encoded by `hbpe.pipeline.shards.mds_format` (byte-identical to streaming's
MDSWriter, without importing streaming in every worker). This module does not import
Beam, so the in-process runner can use it; the Beam step is `write_shards.WriteMdsShards`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from hbpe.pipeline.beam import fs
from hbpe.pipeline.beam.units import UnitSummary, unit_stream_path
from hbpe.pipeline.shards import mds_format
from hbpe.pipeline.tokenizer.hierarchical import HierarchicalTokenizer
from hbpe.schemas import shard_columns
from hbpe.schemas.symbols import TOKEN_PAD


@dataclass(frozen=True)
class ShardTask:
    index: int
    first_sample: int
    num_samples: int
    pieces: tuple[tuple[int, int, int], ...]  # (unit index, start, end) in the unit's stream
    pad: int  # TOKEN_PAD patches appended at the end (tail padding, last shard only)


@dataclass(frozen=True)
class ShardPlan:
    tasks: tuple[ShardTask, ...]
    total_patches: int
    samples: int
    tail_dropped: int  # stream positions dropped by --tail drop
    tail_padded: int  # PAD patches added by --tail pad
    tail_pieces: tuple[tuple[int, int, int], ...] = ()  # where the dropped tail lies


def _pieces(units: list[UnitSummary], starts: np.ndarray, lo: int, hi: int) -> tuple[tuple[int, int, int], ...]:
    out = []
    for k, u in enumerate(units):
        a, b = max(lo, starts[k]), min(hi, starts[k + 1])
        if a < b:
            out.append((u.index, int(a - starts[k]), int(b - starts[k])))
    return tuple(out)


def read_pieces(staging: str, pieces: tuple[tuple[int, int, int], ...]) -> np.ndarray:
    """Concatenate [start, end) slices of unit stream files."""
    parts = [
        np.frombuffer(fs.read_range(unit_stream_path(staging, u), 4 * a, 4 * (b - a)), dtype=np.int32)
        for u, a, b in pieces
    ]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def plan_shards(units: list[UnitSummary], *, seq_len: int, samples_per_shard: int, tail: str) -> ShardPlan:
    """Cut the concatenated unit streams into samples of `seq_len` patches and shards of samples.

    A piece is (unit, start, end) in that unit's stream. Two units of 5 and 6 patches at N=4
    give 2 samples (unit 0 whole, then unit 1's first 3 patches) and a dropped tail of 3:

    >>> pl = plan_shards([UnitSummary(0, stream_patches=5), UnitSummary(1, stream_patches=6)],
    ...                  seq_len=4, samples_per_shard=2, tail="drop")
    >>> pl.samples, pl.tasks[0].pieces, pl.tail_dropped, pl.tail_pieces
    (2, ((0, 0, 5), (1, 0, 3)), 3, ((1, 3, 6),))
    """
    units = sorted(units, key=lambda u: u.index)
    total = sum(u.stream_patches for u in units)
    full, rest = divmod(total, seq_len)
    samples = full + (1 if tail == "pad" and rest else 0)
    padded = (seq_len - rest) if tail == "pad" and rest else 0
    dropped = rest if tail == "drop" else 0
    starts = np.cumsum([0] + [u.stream_patches for u in units])
    tasks = []
    for j, first in enumerate(range(0, samples, samples_per_shard)):
        n = min(samples_per_shard, samples - first)
        lo, hi = first * seq_len, min((first + n) * seq_len, total)
        pad = (first + n) * seq_len - hi
        tasks.append(ShardTask(j, first, n, _pieces(units, starts, lo, hi), int(pad)))
    tail = _pieces(units, starts, total - dropped, total) if dropped else ()
    return ShardPlan(tuple(tasks), int(total), samples, int(dropped), int(padded), tail)


class ReadyShards:
    """The full shards that the units encoded so far fix, as plan_shards will cut them, handed out once each.

    Units come in any order; shard j is ready once the units of the in-order prefix reach position
    (j+1)MN of the stream. Units of 5 and 6 patches at N=4, M=1 (unit 1 first: nothing is fixed yet):

    >>> r = ReadyShards([0, 1, 2], seq_len=4, samples_per_shard=1)
    >>> [t.pieces for t in r.add(UnitSummary(1, stream_patches=6))]
    []
    >>> [t.pieces for t in r.add(UnitSummary(0, stream_patches=5))]
    [((0, 0, 4),), ((0, 4, 5), (1, 0, 3))]

    Positions 8 to 11 wait for unit 2 (they may end a shard or a sample short of one: a tail).
    Work stays linear in the units: only those the next shard may still need are kept.
    """

    def __init__(self, order: list[int], *, seq_len: int, samples_per_shard: int) -> None:
        self._order, self._spp, self._len = order, samples_per_shard, seq_len * samples_per_shard
        self._known: dict[int, UnitSummary] = {}  # encoded, not yet in the prefix
        self._prefix = 0  # units of `order` encoded, as a prefix
        self._window: deque[UnitSummary] = deque()  # prefix units the next shard may still need
        self._window_start = 0  # stream position where the window's first unit starts
        self._end = 0  # stream position where the prefix ends
        self.handed_out = 0  # shards 0 .. handed_out - 1 are ready and returned

    def add(self, unit: UnitSummary) -> list[ShardTask]:
        """Record one encoded unit; returns the shards it makes ready (in shard order, none twice)."""
        self._known[unit.index] = unit
        while self._prefix < len(self._order) and self._order[self._prefix] in self._known:
            u = self._known.pop(self._order[self._prefix])
            self._window.append(u)
            self._end += u.stream_patches
            self._prefix += 1
        tasks = []
        while (self.handed_out + 1) * self._len <= self._end:
            j = self.handed_out
            units = list(self._window)
            starts = self._window_start + np.cumsum([0] + [u.stream_patches for u in units])
            pieces = _pieces(units, starts, j * self._len, (j + 1) * self._len)
            tasks.append(ShardTask(j, j * self._spp, self._spp, pieces, 0))
            self.handed_out += 1
            # a unit that ends where the next shard starts gives it no piece
            while self._window and self._window_start + self._window[0].stream_patches <= (j + 1) * self._len:
                self._window_start += self._window.popleft().stream_patches
        return tasks


def build_samples(
    stream: np.ndarray, table: np.ndarray, token_nbytes: np.ndarray, seq_len: int, *, store_patches: bool
) -> dict[str, np.ndarray]:
    """(samples*N,) int32 stream -> tokens (B, N), num_bytes (B,), and patches (B, N, S) when stored."""
    tokens = stream.reshape(-1, seq_len)
    cols = {"tokens": tokens, "num_bytes": np.take(token_nbytes, tokens, axis=0).sum(axis=1, dtype=np.int64)}
    if store_patches:
        cols["patches"] = np.take(table, tokens, axis=0)  # (B, N, S)
    return cols


def write_shard(
    tok: HierarchicalTokenizer, staging: str, task: ShardTask, seq_len: int, *, store_patches: bool
) -> tuple[int, dict[str, Any]]:
    """Write one shard into staging/shards/ (temporary name, then renamed); returns (index, MDS index entry)."""
    stream = np.concatenate([read_pieces(staging, task.pieces), np.full(task.pad, TOKEN_PAD, dtype=np.int32)])
    cols = build_samples(stream, tok.table, tok.token_nbytes, seq_len, store_patches=store_patches)
    name = shard_columns.shard_basename(task.index)
    data, entry = mds_format.write_shard(
        shard_columns.mds_columns(seq_len, tok.max_patch_size, store_patches=store_patches),
        cols,
        basename=name,
        compression=shard_columns.COMPRESSION,
        hashes=list(shard_columns.HASHES),
    )
    fs.write_atomic(fs.join(staging, "shards", name), data)
    return task.index, entry
