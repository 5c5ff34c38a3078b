"""hbpe's MDS records: a raw shard of fixed-size columns read as numpy arrays over a memory map.

A column encoding with a static dtype and shape (`ndarray:int32:128`, `int64`) has no per-sample
size header, so a raw shard (pipeline/shards/mds_format.py, or streaming's MDSWriter with such
columns) is a header and records of one size:

    raw shard = uint32 n | uint32 offsets[n + 1] | config JSON | n records of `size` bytes
    record    = each column's value bytes, in the index's column order

and any set of samples is one fancy index per column. Anything else (a variable-size column, a
pickled one, another format) has no `RecordLayout` here and is left to streaming's reader.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

# the MDS encodings of one value with a static dtype and size (streaming's format/mds/encodings.py)
_NUMERIC = {"uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float16", "float32", "float64"}


@dataclass(frozen=True)
class Column:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]  # () for a scalar column
    offset: int  # of its bytes in a record

    @property
    def size(self) -> int:
        return self.dtype.itemsize * int(np.prod(self.shape, dtype=np.int64))


@dataclass(frozen=True)
class RecordLayout:
    """A shard's fixed-size record: its columns in stored order and the record's size in bytes."""

    columns: tuple[Column, ...]
    size: int


def parse_fixed(encoding: str) -> tuple[np.dtype, tuple[int, ...]] | None:
    """An MDS column encoding -> (dtype, shape) when every value has that static dtype and shape, else None.

    >>> parse_fixed("ndarray:uint16:128,10")
    (dtype('uint16'), (128, 10))
    >>> parse_fixed("int64"), parse_fixed("ndarray:int32"), parse_fixed("str")
    ((dtype('int64'), ()), None, None)
    """
    if encoding in _NUMERIC:
        return np.dtype(encoding), ()
    parts = encoding.split(":")
    if len(parts) != 3 or parts[0] != "ndarray" or parts[1] not in _NUMERIC:
        return None
    try:
        shape = tuple(int(x) for x in parts[2].split(","))
    except ValueError:
        return None
    return (np.dtype(parts[1]), shape) if shape and min(shape) >= 1 else None


def record_layout(shard: Any) -> RecordLayout | None:
    """The record layout of a streaming shard reader, or None when its samples are not fixed-size MDS records."""
    from streaming.base.format.mds.reader import MDSReader

    if not isinstance(shard, MDSReader) or len(shard.file_pairs) != 1:
        return None
    names, encodings, sizes = shard.column_names, shard.column_encodings, shard.column_sizes
    columns, offset = [], 0
    for name, encoding, size in zip(names, encodings, sizes, strict=True):
        fixed = parse_fixed(encoding)
        if fixed is None:
            return None
        column = Column(name, fixed[0], fixed[1], offset)
        if size != column.size:  # the index disagrees with the encoding: leave it to streaming's own reader
            return None
        columns.append(column)
        offset += column.size
    return RecordLayout(tuple(columns), offset) if columns else None


class MappedShard:
    """A raw shard's records as an (n, size) byte array over a read-only memory map of the file.

    The header is checked once: n samples, and offsets that step by exactly the record size
    (what a fixed-size layout implies; any other file is left to streaming's reader).
    """

    def __init__(self, records: np.ndarray, layout: RecordLayout) -> None:
        self.records, self.layout = records, layout  # (n, size) uint8

    @classmethod
    def open(cls, path: str, layout: RecordLayout, samples: int) -> MappedShard | None:
        """The shard at `path` mapped, or None when its header does not describe `samples` fixed-size records.

        Raises FileNotFoundError when the file is not in the cache (streaming then prepares it)."""
        with open(path, "rb") as f:
            length = os.fstat(f.fileno()).st_size
            if length < 4 * (samples + 2):
                return None
            # the map outlives the file object; it is unmapped when the last array over it is dropped
            data = np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), np.uint8)
        if int(data[:4].view(np.uint32)[0]) != samples:
            return None
        n = samples
        offsets = data[4 : 4 * (n + 2)].view(np.uint32).astype(np.int64)  # (n + 1,)
        begin = int(offsets[0])
        if int(offsets[-1]) > length or not np.array_equal(offsets, begin + layout.size * np.arange(n + 1)):
            return None
        return cls(data[begin : begin + n * layout.size].reshape(n, layout.size), layout)

    def gather(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """{column: (k, *shape)} for the samples `rows` of this shard (k,), one copy per column, read-only as
        streaming's decoded arrays are."""
        out = {}
        for c in self.layout.columns:
            values = self.records[rows, c.offset : c.offset + c.size].view(c.dtype).reshape(len(rows), *c.shape)
            values.flags.writeable = False
            out[c.name] = values
        return out
