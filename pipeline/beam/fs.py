"""Filesystem helpers over Beam's FileSystems, so local paths and gs:// / s3:// behave alike.

Every file the pipeline produces is written to a temporary name and renamed into
place, so a retried bundle overwrites a whole file and a failed one leaves none.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

RAW = CompressionTypes.UNCOMPRESSED


def is_remote(path: str) -> bool:
    return "://" in path


def join(base: str, *parts: str) -> str:
    return FileSystems.join(base, *parts)


def exists(path: str) -> bool:
    return FileSystems.exists(path)


def write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:12]}"
    if not is_remote(path):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with FileSystems.create(tmp, compression_type=RAW) as f:
        f.write(data)
    rename(tmp, path)


def rename(src: str, dst: str) -> None:
    if not is_remote(src):
        os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
        os.replace(src, dst)  # atomic, and overwrites a retried attempt's file
        return
    if FileSystems.exists(dst):
        FileSystems.delete([dst])
    FileSystems.rename([src], [dst])


class AtomicWriter:
    """A binary file that appears under its final name only when closed without error."""

    def __init__(self, path: str) -> None:
        self.path, self.tmp = path, f"{path}.tmp-{uuid.uuid4().hex[:12]}"
        if not is_remote(path):
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self._f = FileSystems.create(self.tmp, compression_type=RAW)

    def write(self, data: bytes) -> None:
        self._f.write(data)

    def __enter__(self) -> AtomicWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._f.close()
        if exc_type is None:
            rename(self.tmp, self.path)
        else:
            FileSystems.delete([self.tmp])


def read_range(path: str, start: int, length: int) -> bytes:
    with FileSystems.open(path, compression_type=RAW) as f:
        f.seek(start)
        return f.read(length)


def read_bytes(path: str) -> bytes:
    with FileSystems.open(path, compression_type=RAW) as f:
        return f.read()


def delete_tree(path: str) -> None:
    if is_remote(path):
        if FileSystems.exists(path):
            FileSystems.delete([path])
    else:
        shutil.rmtree(path, ignore_errors=True)


def copy_dir_to(local_dir: str, dest: str) -> None:
    for p in sorted(Path(local_dir).iterdir()):
        if p.is_file():
            write_atomic(join(dest, p.name), p.read_bytes())


def localize_dir(path: str, names: list[str]) -> str:
    """A local directory with the given files of `path` (itself if already local)."""
    if not is_remote(path):
        return path
    local = tempfile.mkdtemp(prefix="hbpe-")
    for n in names:
        Path(local, n).write_bytes(read_bytes(join(path, n)))
    return local


def is_nonempty_dir(path: str) -> bool:
    if is_remote(path):
        return bool(FileSystems.match([join(path, "*")])[0].metadata_list)
    return os.path.isdir(path) and any(os.scandir(path))
