"""Filesystem helpers over Beam's FileSystems, so local paths and gs:// / s3:// behave alike.

Every file the pipeline produces is written to a temporary name and renamed into
place, so a retried bundle overwrites a whole file and a failed one leaves none.
Local paths go straight to the OS and Beam is imported only for a URI: the in-process
runner converts a local corpus without loading Beam at all (about 1 s of imports).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

from hbpe.pipeline import storage


def _beam_fs():
    """Beam's FileSystems (configured for the stores: stores.py) and the 'uncompressed' flag, imported on a URI."""
    from apache_beam.io.filesystem import CompressionTypes

    from hbpe.pipeline.beam.stores import filesystems

    return filesystems(), CompressionTypes.UNCOMPRESSED


def is_remote(path: str) -> bool:
    return storage.is_remote(path)


# stores where an object appears only once its upload completes and a copy replaces its target
# (not HDFS, whose rename refuses an existing target and whose files are visible while written)
_OBJECT_STORES = ("s3", "gs", "azfs")


def _object_store(path: str) -> bool:
    return storage.scheme(path) in _OBJECT_STORES


def join(base: str, *parts: str) -> str:
    if not is_remote(base):
        return os.path.join(base, *parts)  # what Beam's LocalFileSystem.join does
    return _beam_fs()[0].join(base, *parts)


def _create(path: str):
    if not is_remote(path):
        return open(path, "wb")
    return _RemoteFile(path)


class _RemoteFile:
    """A Beam file created at the first write, so an empty one can be written another way.

    Beam's S3 writer cannot finish an empty object (a multipart upload of no parts is refused
    as MalformedXML), and hbpe writes empty files: COMPLETED, a unit's rejects when it has none.
    """

    def __init__(self, path: str) -> None:
        self.path, self._f = path, None

    def write(self, data: bytes) -> None:
        if not data:
            return
        if self._f is None:
            fsys, raw = _beam_fs()
            self._f = fsys.create(self.path, compression_type=raw)
        self._f.write(data)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            return
        from hbpe.pipeline.beam.stores import write_empty

        write_empty(self.path)

    def discard(self) -> None:
        """Drop what was written (after a failure): nothing is left under `path`."""
        if self._f is not None:
            self._f.close()
            _beam_fs()[0].delete([self.path])

    def __enter__(self) -> _RemoteFile:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()


def _open(path: str):
    if not is_remote(path):
        return open(path, "rb")
    fsys, raw = _beam_fs()
    return fsys.open(path, compression_type=raw)


def write_atomic(path: str, data: bytes) -> None:
    if _object_store(path):
        # an object appears whole when its upload completes, or not at all: no temporary name needed
        # (on S3 a temporary object and its rename cost three more requests, and Beam a new client each)
        with _create(path) as f:
            f.write(data)
        return
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:12]}"
    if not is_remote(path):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with _create(tmp) as f:
        f.write(data)
    rename(tmp, path)


def rename(src: str, dst: str) -> None:
    if not is_remote(src):
        os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
        os.replace(src, dst)  # atomic, and overwrites a retried attempt's file
        return
    fsys = _beam_fs()[0]
    if not _object_store(dst) and fsys.exists(dst):  # an object store's copy replaces dst itself
        fsys.delete([dst])
    fsys.rename([src], [dst])


class AtomicWriter:
    """A binary file that appears under its final name only when closed without error.

    It hashes what it writes (xxh64, ~10 GB/s): a unit's summary records the hash, so a
    resume can tell a complete file from one a machine crash left truncated or zeroed.
    """

    def __init__(self, path: str) -> None:
        import xxhash

        self.path, self.tmp = path, f"{path}.tmp-{uuid.uuid4().hex[:12]}"
        self._hash = xxhash.xxh64()
        if not is_remote(path):
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self._f = _create(self.tmp)

    def write(self, data: bytes) -> None:
        self._f.write(data)
        self._hash.update(data)

    def hexdigest(self) -> str:
        """xxh64 of everything written so far."""
        return self._hash.hexdigest()

    def __enter__(self) -> AtomicWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self._f.close()
            rename(self.tmp, self.path)
        elif not is_remote(self.tmp):
            self._f.close()
            os.remove(self.tmp)
        else:
            self._f.discard()


def read_range(path: str, start: int, length: int) -> bytes:
    with _open(path) as f:
        f.seek(start)
        return f.read(length)


def read_bytes(path: str) -> bytes:
    with _open(path) as f:
        return f.read()


def size(path: str) -> int | None:
    """A file's size in bytes, None when it does not exist."""
    if not is_remote(path):
        try:
            return os.path.getsize(path)
        except OSError:
            return None
    try:
        found = _beam_fs()[0].match([path])[0].metadata_list
    except Exception:  # BeamIOError: some stores raise for a missing object instead of matching nothing
        return None
    return found[0].size_in_bytes if found else None


def delete_tree(path: str) -> None:
    if is_remote(path):
        # an object store has no folders: `exists` is False for a prefix, so delete what is under it
        fsys = _beam_fs()[0]
        doomed = [join(path, rel) for rel in _remote_files(path)]
        if not doomed and fsys.exists(path):
            doomed = [path]
        if doomed:
            fsys.delete(doomed)
    else:
        shutil.rmtree(path, ignore_errors=True)


def copy_dir_to(local_dir: str, dest: str) -> None:
    for p in sorted(Path(local_dir).iterdir()):
        if p.is_file():
            write_atomic(join(dest, p.name), p.read_bytes())


def load_tokenizer(path: str):
    """The tokenizer artifact at `path`, read through Beam's filesystems.

    Workers read the staged copy under the output, whose scheme is whatever the runner's
    filesystems serve (gs://, s3://, ...); the library's own storage module knows only the
    object stores streaming supports, so the files are fetched here and loaded locally.
    """
    from hbpe.pipeline.tokenizer import artifact
    from hbpe.schemas.tokenizer_artifact import SPEC_FILENAME

    if not is_remote(path):
        return artifact.load(path)
    with tempfile.TemporaryDirectory(prefix="hbpe-tokenizer-") as local:
        Path(local, SPEC_FILENAME).write_bytes(read_bytes(join(path, SPEC_FILENAME)))
        rank_file = artifact.load_spec(local).first_stage.rank_file  # a plain name inside the directory
        Path(local, rank_file).write_bytes(read_bytes(join(path, rank_file)))
        return artifact.load(local)


def localize_dir(path: str, names: list[str]) -> str:
    """A local directory with the given files of `path` (itself if already local)."""
    if not is_remote(path):
        return path
    local = tempfile.mkdtemp(prefix="hbpe-")
    for n in names:
        Path(local, n).write_bytes(read_bytes(join(path, n)))
    return local


def top_entries(path: str) -> list[str]:
    """Names directly inside a directory (an object-store prefix: the first component of each object)."""
    if not is_remote(path):
        return sorted(os.listdir(path)) if os.path.isdir(path) else []
    return sorted({rel.split("/", 1)[0] for rel in _remote_files(path)})


def _remote_files(path: str) -> list[str]:
    """Paths relative to `path` of every object under it."""
    base = path.rstrip("/") + "/"
    found = _beam_fs()[0].match([base + "**"])[0].metadata_list
    return [m.path[len(base) :] for m in found if m.path.startswith(base)]


def delete_entries(path: str, names: list[str]) -> None:
    """Delete these files or folders directly inside `path` (and nothing else)."""
    if not is_remote(path):
        for n in names:
            p = os.path.join(path, n)
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p, ignore_errors=True)
            elif os.path.lexists(p):
                os.unlink(p)
        return
    wanted = set(names)
    doomed = [join(path, rel) for rel in _remote_files(path) if rel.split("/", 1)[0] in wanted]
    if doomed:
        _beam_fs()[0].delete(doomed)


def move_entries(src: str, dst: str, *, last: str) -> None:
    """Rename everything directly inside `src` to the same name inside `dst`, the entry `last` last.

    Locally one rename per entry (a folder moves whole); object stores rename object by object.
    """
    if not is_remote(src):
        for name in sorted(os.listdir(src), key=lambda n: n == last):
            os.rename(os.path.join(src, name), os.path.join(dst, name))
        return
    for rel in sorted(_remote_files(src), key=lambda r: r.split("/", 1)[0] == last):
        rename(join(src, rel), join(dst, rel))
