"""Give back the shared memory a StreamingDataset holds once a run is done with it.

streaming 0.13 keeps every `SharedMemory` it makes alive until the process exits: each one
registers its own cleanup with `atexit`, which holds a reference to it. A dataset makes six (its
prefix's `locals`, the barrier, the epoch and cache counters, the shard states and access
times), and picking a prefix attaches to every live prefix once more to read it. So a process
that trains run after run (`hbpe experiment`, the Python API, a test worker) kept ~40 file
descriptors and six /dev/shm segments per run, and each new dataset probed, and kept open, the
segments of all the earlier ones: measured 37-42 descriptors more per run, and a test worker
that trained a few hundred runs hit the 20,000-descriptor limit (at the common default of 1,024
an experiment would stop after ~25 runs).

Two measures:
- `release(dataset)` closes and unlinks a finished dataset's own segments and drops their
  atexit entries (`training/train/trainer.py: BuiltRun.close` calls it after Composer's close);
- `probes_closed()` makes the prefix probe's attachments ordinary objects, closed when the probe
  drops them, instead of atexit-held ones (the segments belong to their creators; an attachment
  never unlinks them).
"""

from __future__ import annotations

import atexit
import contextlib
from collections.abc import Iterator
from typing import Any


def _segments(obj: Any, depth: int = 0) -> Iterator[Any]:
    """The streaming SharedMemory objects inside obj: the dataset's attributes, and theirs (SharedArray.shm,
    SharedScalar.arr.shm, SharedBarrier._arr.shm) down to three levels."""
    from streaming.base.shared.memory import SharedMemory

    if isinstance(obj, SharedMemory):
        yield obj
        return
    if depth >= 3 or not type(obj).__module__.startswith("streaming.base.shared"):
        return
    for value in vars(obj).values():
        yield from _segments(value, depth + 1)


def release(dataset: Any) -> int:
    """Close (and, where this process created it, unlink) every shared-memory segment of a StreamingDataset that
    is done, and drop its atexit entry -> how many. Idempotent; the dataset must not be iterated again."""
    released = 0
    close_maps = getattr(dataset, "close_maps", None)
    if close_maps is not None:  # its shards' memory maps too (training/data/batched_reads.py): a descriptor each
        close_maps()
    for value in list(vars(dataset).values()):
        for shm in _segments(value):
            shm.cleanup()  # created: close + unlink; attached: close
            atexit.unregister(shm.cleanup)
            shm.created_shms.clear()
            shm.opened_shms.clear()
            released += 1
    return released


@contextlib.contextmanager
def probes_closed() -> Iterator[None]:
    """While a StreamingDataset picks its prefix, the segments it only attaches to in order to read them are not
    registered with atexit (they close when the probe drops them); the ones it creates are, as before."""
    from streaming.base.shared import prefix
    from streaming.base.shared.memory import SharedMemory

    def shared_memory(
        name: str | None = None, create: bool | None = None, size: int = 0, auto_cleanup: bool = True
    ) -> SharedMemory:
        return SharedMemory(name, create, size, auto_cleanup=auto_cleanup and create is not False)

    original = prefix.SharedMemory
    prefix.SharedMemory = shared_memory
    try:
        yield
    finally:
        prefix.SharedMemory = original
