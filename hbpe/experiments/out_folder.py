"""An experiment's output folder is its own while it runs, and never takes over files it did not write.

Two experiments on one `--out` used to run side by side, each replacing the other's data and
results (both exiting 0), and an `--out` holding a user's own results.json or table.md had them
overwritten. Now `claim` refuses files of those names that hbpe did not write, then holds an
exclusive lock on OUT/.lock (pipeline/lock_file.py: never through a link; released by the kernel
however the process ends) for the whole run; a second experiment is refused, naming the process that holds it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from hbpe.pipeline import lock_file
from hbpe.schemas.errors import ConfigError

log = logging.getLogger(__name__)
LOCK_FILE = ".lock"
RESULTS_FORMAT = "hbpe-experiment-results"  # results.json's "format": how a rerun knows the file is hbpe's
REPORT_FILES = ("results.json", "table.md")


@contextlib.contextmanager
def claim(out: Path) -> Iterator[None]:
    """Hold `out` for one experiment: foreign report files refused, then the lock taken (ConfigError if held)."""
    check_not_foreign(out)
    out.mkdir(parents=True, exist_ok=True)
    fd = _lock(out)
    try:
        yield
    finally:
        if fd is not None:
            lock_file.release(fd)  # the file stays: check_not_foreign reads it as "an experiment held this folder"


def _lock(out: Path) -> int | None:
    path = out / LOCK_FILE
    try:
        fd = lock_file.acquire(str(path))
    except lock_file.LockHeld as e:
        raise ConfigError(
            f"{out} is in use by another hbpe experiment (pid {e.holder[:32] or 'unknown'}); wait until it ends, "
            "or pass another --out"
        ) from None
    except OSError as e:
        if e.errno not in lock_file.NO_LOCKS:
            raise
        # a file system without locks (some NFS): run, as before, unguarded
        log.warning("cannot lock %s (%s): nothing stops a second experiment on this folder", path, e)
        return None
    lock_file.write_holder(fd, f"{os.getpid()}\n")
    return fd


def check_not_foreign(out: Path) -> None:
    """ConfigError when `out` holds a results.json or table.md that no hbpe experiment wrote."""
    results = out / "results.json"
    ours = is_hbpe_results(results)
    # table.md is written just before results.json: alone, it is ours only in a folder an experiment has held
    foreign = [results] if results.exists() and not ours else []
    table = out / "table.md"
    if table.exists() and not ours and (results.exists() or not (out / LOCK_FILE).is_file()):
        foreign.append(table)
    if foreign:
        names = " and ".join(p.name for p in foreign)
        raise ConfigError(
            f"{out} holds {names} that no hbpe experiment wrote, and an experiment would overwrite "
            f"{'them' if len(foreign) > 1 else 'it'}; move {'them' if len(foreign) > 1 else 'it'} away "
            "or pass another --out"
        )


def is_hbpe_results(path: Path) -> bool:
    """A results.json of `hbpe experiment`: its format field (or, written before it had one, its shape)."""
    if not path.is_file():
        return False
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(d, dict):
        return False
    if d.get("format") == RESULTS_FORMAT:
        return True
    return isinstance(d.get("spec"), dict) and isinstance(d.get("runs"), list) and "experiment" in d
