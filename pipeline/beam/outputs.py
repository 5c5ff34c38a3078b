"""Where a conversion builds its output, decided before anything is written.

A new or empty OUTPUT is built in place; an earlier conversion is replaced (--overwrite)
by building OUTPUT/.hbpe-new-XXXXXXXX and swapping it in once complete; an interrupted
one is continued where it was built (--resume). Folders that hold files hbpe did not
write are never touched, and inputs or a tokenizer inside the output are refused (an
--overwrite would replace them). A local output is one conversion's at a time (`locked`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hbpe.pipeline import lock_file
from hbpe.pipeline.beam import fs, resume
from hbpe.pipeline.beam.finalize import STAGING_DIRNAME, discard_hbpe_entries, is_hbpe_entry
from hbpe.schemas.errors import ConfigError
from hbpe.schemas.locations import check_output_prefix
from hbpe.schemas.manifest import MANIFEST_FORMAT
from hbpe.schemas.shard_columns import COMPLETED_FILENAME, MANIFEST_FILENAME

# held in a local output while a conversion decides what it holds and writes it, removed when it ends;
# no is_hbpe_entry name, so no swap or discard deletes it under its holder
LOCK_FILENAME = ".hbpe-convert.lock"


@dataclass(frozen=True)
class Build:
    path: str  # where this run writes: the output itself, or OUTPUT/.hbpe-new-XXXXXXXX
    replacing: bool  # swap `path` in over an earlier output once complete
    resumed: bool  # an interrupted run's staging, reused
    finished: bool = False  # a complete output already (an --overwrite whose swap was cut short): only its swap is left

    @property
    def staging(self) -> str:
        return fs.join(self.path, STAGING_DIRNAME)


def output_dir(path: str) -> str:
    """The output as the launcher handles it: a local path made absolute, symlinks resolved.

    A missing parent is created, like `mkdir -p` (as `hbpe tokenizer train --out` and
    streaming's MDSWriter do): a mistyped parent then makes a new folder, which loses
    nothing and is printed at the start, while refusing would cost every `runs/<new>/shards`.
    """
    if fs.is_remote(path):
        check_output_prefix(path, where=f"--out {path}")
        return path.rstrip("/")
    real = os.path.realpath(path)
    if os.path.exists(real) and not os.path.isdir(real):
        raise ConfigError(
            f"--out {path} is a file, not a directory: give the path of a directory (a new one is created)"
        )
    up = os.path.dirname(real)
    while not os.path.exists(up):
        up = os.path.dirname(up)
    if not os.path.isdir(up):
        raise ConfigError(f"--out {path} cannot be created: {up} is a file; give a directory path")
    return real


def glob_base(pattern: str) -> str:
    """The folder part of a glob before its first wildcard: 'data/*/x.jsonl' -> 'data'."""
    parts = []
    for part in pattern.split("/"):
        if any(c in part for c in "*?["):
            break
        parts.append(part)
    return "/".join(parts) or "."


def refuse_inside(path: str, output: str, what: str, shown: str) -> None:
    """Inputs and the tokenizer may not live in the output: an --overwrite would replace them."""
    real = path.rstrip("/") if fs.is_remote(path) else os.path.realpath(path)
    if real == output or real.startswith(output.rstrip("/") + "/"):
        raise ConfigError(
            f"{what} lies inside the output directory {shown}, which the conversion replaces: "
            f"move or copy it out of {shown} first, or choose another --out"
        )


@contextlib.contextmanager
def locked(output: str, shown: str) -> Iterator[None]:
    """Hold the local output `output` for this conversion (ConfigError naming the holder if another has it).

    Two conversions on one output used to run at once: on a new folder both failed or one was told to
    --resume the live one, and two --overwrite runs deleted each other's build. The lock file goes
    when the run ends, and with it a folder this run created, if nothing else is left in it.
    A bucket output has no lock (an object store has no flock): one conversion at a time there
    is the user's to keep, and an --overwrite's own build folder (.hbpe-new-XXXXXXXX) at least
    keeps two runs' new files apart.
    """
    if fs.is_remote(output):
        yield
        return
    created = not os.path.isdir(output)
    os.makedirs(output, exist_ok=True)  # parents too, like mkdir -p (see output_dir)
    path = os.path.join(output, LOCK_FILENAME)
    try:
        fd = lock_file.acquire(path)
    except lock_file.LockHeld as e:
        raise ConfigError(
            f"{shown} is being written by another hbpe convert (pid {e.holder[:32] or 'unknown'}); "
            "wait for it or choose another --out"
        ) from None
    except OSError as e:
        if e.errno not in lock_file.NO_LOCKS:
            raise
        fd = None  # a file system without locks (some NFS): converted, as before, unguarded
    try:
        if fd is not None:
            lock_file.write_holder(fd, f"{os.getpid()}\n")
        yield
    finally:
        if fd is not None:
            lock_file.release(fd, path)
        if created:
            with contextlib.suppress(OSError):  # a failed run leaves no new folder behind (a full one stays)
                os.rmdir(output)


def choose_build(output: str, shown: str, *, overwrite: bool, resume_: bool, record: dict[str, Any]) -> Build:
    """Where this run writes; refuses an output it may not touch, and a resume of another conversion.

    A folder counts as a previous conversion only by what only hbpe writes (COMPLETED, a
    staging or build folder, a manifest.json of format "hbpe-shards"), never by file names
    alone: a user's own index.json or tokenizer/ must not be replaced.
    """
    names = [n for n in fs.top_entries(output) if n != LOCK_FILENAME]
    if not names:
        return Build(output, replacing=False, resumed=False)
    previous = _is_previous_conversion(output, names)
    foreign = [n for n in names if not (previous and is_hbpe_entry(n))]
    if foreign:
        listed = ", ".join(foreign[:5]) + (f" ... ({len(foreign)} in all)" if len(foreign) > 5 else "")
        if not previous:
            raise ConfigError(
                f"output {shown} is not empty and holds files hbpe did not write: {listed}; it is not an earlier "
                "conversion (no COMPLETED, .hbpe-staging/ or hbpe manifest.json), so --overwrite does not replace "
                "it: choose a new or empty --out, or move those files away"
            )
        raise ConfigError(
            f"output {shown} is not empty and holds files hbpe did not write: {listed}; "
            "--overwrite only replaces an earlier conversion (shard.*.mds.zstd, index.json, manifest.json, "
            "rejects/, tokenizer/, COMPLETED): choose a new or empty --out, or move those files away"
        )
    unfinished = resume.unfinished_builds(output)
    if resume_ and unfinished:
        return _resumable(output, shown, unfinished, record)
    if not overwrite:
        what = "" if COMPLETED_FILENAME in names else " (an unfinished conversion: no COMPLETED)"
        if unfinished:
            how = "pass --overwrite to replace it, or --resume to continue the interrupted conversion"
        elif resume_:
            how = "it holds no interrupted conversion to resume: pass --overwrite to replace it"
        else:
            how = "pass --overwrite to replace it"
        raise ConfigError(f"output {shown} exists and is not empty{what}; {how}")
    return Build(fs.join(output, f".hbpe-new-{uuid.uuid4().hex[:8]}"), replacing=True, resumed=False)


def _resumable(output: str, shown: str, builds: list[str], record: dict[str, Any]) -> Build:
    """The interrupted build whose record is this run's; otherwise the reason the newest one is not."""
    why = None
    for b in builds:
        finished = resume.is_complete(b)
        # a complete build's staging is gone: its manifest says what was converted
        found = resume.record_of_manifest(b) if finished else resume.read_record(fs.join(b, STAGING_DIRNAME))
        if found is None:
            why = why or (
                "its complete build has no readable manifest.json" if finished else
                "its staging has no resume record (written by an older hbpe, or killed before it began)"
            )  # fmt: skip
            continue
        problem = resume.mismatch(found, record)
        if problem is None:
            return Build(b, replacing=b != output, resumed=True, finished=finished)
        why = why or problem
    raise resume.refuse(shown, why or "nothing to resume")


def _is_previous_conversion(output: str, names: list[str]) -> bool:
    """Whether `output` holds what only `hbpe convert` writes (finished, or killed before it finished)."""
    if COMPLETED_FILENAME in names or any(n == STAGING_DIRNAME or n.startswith(".hbpe-new-") for n in names):
        return True
    if MANIFEST_FILENAME not in names:
        return False
    try:
        d = json.loads(fs.read_bytes(fs.join(output, MANIFEST_FILENAME)))
    except (OSError, ValueError):
        return False
    return isinstance(d, dict) and d.get("format") == MANIFEST_FORMAT


def discard(build: Build) -> None:
    """Remove what a failed run wrote: its build folder inside the old output, or hbpe's files in a new one
    (the new folder itself goes with the lock: `locked`)."""
    if build.replacing:
        fs.delete_tree(build.path)
        return
    discard_hbpe_entries(build.path)


# a full disk or quota, or a file size limit: the run can go on once there is room, so its units are kept
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_NO_SPACE_TEXT = tuple(os.strerror(n) for n in _NO_SPACE)  # what a Beam worker's error, passed on as text, says


def out_of_space(e: BaseException) -> bool:
    """Whether `e` (or an exception it was raised from) says the disk, a quota or a file size limit is full."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _NO_SPACE:
            return True
        if any(text in str(e) for text in _NO_SPACE_TEXT):
            return True
        e = e.__cause__ or e.__context__
    return False


def keep_or_discard(build: Build, *, keep: bool, full: bool = False) -> str:
    """After a failure: what becomes of the build, said as the end of the error message.

    With --resume (`keep`), or when the disk was full (`full`: the user can free space and go on), the
    encoded units stay for the next --resume, less the half-written shards and temporary files
    (room the user needs); otherwise everything the run wrote goes.
    """
    if not (keep or full):
        discard(build)
        return ""
    with contextlib.suppress(OSError):
        resume.clean_staging(build.staging)
    n = sum(1 for name in fs.top_entries(fs.join(build.staging, "units")) if name.endswith(".json"))
    if full:
        return (
            f"; the disk is full: its {n} encoded unit(s) are kept in {build.staging}: free space and rerun with "
            "--resume to continue"
        )
    return f"; its {n} encoded unit(s) are kept in {build.staging}: rerun with --resume to continue"
