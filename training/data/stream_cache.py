"""A run's stream cache on this node: one folder per shard directory, and one run at a time.

streaming copies shards into a local cache folder and registers it in shared memory. Two runs
on one cache at once (two runs left at the default run_name with their checkpoints in a bucket
both cache under runs/<run_name>/stream-cache) fail inside streaming ("Reused local directory")
or evict each other's shards. `claim` takes an advisory lock (flock) on a file in the cache, held
until the process ends: the kernel releases it on any exit, kill -9 included, so a crashed run
never leaves a stale lock (pipeline/lock_file.py, which never opens the file through a link). The file records who holds it, for the message of the one refused.
Each shard directory gets a folder named by where it lives, so a cache is never one built for
other data.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time

from hbpe.pipeline import lock_file, storage
from hbpe.schemas.errors import ConfigError

LOCK_FILE = "hbpe-run.lock"
_held: dict[str, int] = {}  # lock path -> the open file that holds its flock (this process's claims)


def stream_cache(root: str, remote: str, kind: str) -> str:
    """The cache folder of shard directory `remote` under `root`: `root/kind/<name>-<hash of where it lives>`.

    Named by the shard directory, not by its role: a run on other shards (the same run_name, another
    data.train) gets another folder instead of a cache of other data.
    """
    where = remote if storage.is_remote(remote) else os.path.abspath(remote)
    name = os.path.basename(remote.rstrip("/")) or "stream"
    return os.path.join(root, kind, f"{name}-{hashlib.sha256(where.encode()).hexdigest()[:10]}")


def claim(root: str, *, run_name: str, save_folder: str, fix: str = "") -> None:
    """Hold the stream cache `root` for this process until it ends, or refuse: another live run holds it.

    `fix`: how this run gets a cache of its own (it depends on where the cache root came from).
    Claiming again in the same process is a no-op (the experiment runner builds runs one by one).
    """
    path = os.path.abspath(os.path.join(root, LOCK_FILE))
    if path in _held:
        return
    os.makedirs(root, exist_ok=True)
    try:
        fd = lock_file.acquire(path)
    except lock_file.LockHeld as e:
        raise ConfigError(
            f"stream cache {root} is in use by another run ({_owner(e.holder)}): two runs at once need caches of "
            f"their own; {fix or 'set data.cache_dir to a folder of its own'}"
        ) from None
    me = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "run_name": run_name,
        "save_folder": save_folder,
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    lock_file.write_holder(fd, json.dumps(me))
    _held[path] = fd


def release(root: str) -> None:
    """Give up this process's claim on `root` (the file stays: removing it would race a run waiting for it)."""
    fd = _held.pop(os.path.abspath(os.path.join(root, LOCK_FILE)), None)
    if fd is not None:
        lock_file.release(fd)


def _owner(holder: str) -> str:
    """Who holds the lock, from its file (written by the holder; shown, never trusted)."""
    try:
        who = json.loads(holder)
        return (
            f"pid {int(who['pid'])} on {str(who['host'])[:64]}, run_name {str(who['run_name'])[:64]}, "
            f"save_folder {str(who['save_folder'])[:200]}, since {str(who['since'])[:32]}"
        )
    except (ValueError, KeyError, TypeError, OSError):
        return "one that has not yet written who it is"
