"""Filesystem helpers over Beam's FileSystems, so local paths and gs:// / s3:// behave alike.

Every file the pipeline produces is written to a temporary name and renamed into
place, so a retried bundle overwrites a whole file and a failed one leaves none.
Local paths go straight to the OS and Beam is imported only for a URI: the in-process
runner converts a local corpus without loading Beam at all (about 1 s of imports).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from pathlib import Path

from hbpe.pipeline import storage
from hbpe.pipeline.beam.stores import filesystems, write_empty
from hbpe.pipeline.storage import is_remote, join  # fs.is_remote and fs.join are storage's: one definition
from hbpe.pipeline.tokenizer import artifact
from hbpe.schemas.tokenizer_artifact import SPEC_FILENAME, SPEC_FILENAMES
from hbpe.schemas.tokenizer_tables import TABLES_DATA_FILENAME, TABLES_MANIFEST_FILENAME


def _beam_fs():
    """Beam's FileSystems (configured for the stores: stores.py) and the 'uncompressed' flag, imported on a URI."""
    from apache_beam.io.filesystem import CompressionTypes

    return filesystems(), CompressionTypes.UNCOMPRESSED


# stores where an object appears only once its upload completes and a copy replaces its target
# (not HDFS, whose rename refuses an existing target and whose files are visible while written)
_OBJECT_STORES = ("s3", "gs", "azfs")


def _object_store(path: str) -> bool:
    return storage.scheme(path) in _OBJECT_STORES


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
    """A file's bytes through Beam's filesystems, not storage.read_bytes: on a runner's workers the S3 endpoint
    travels in the pipeline options, not the environment streaming's clients read, and a missing file is an
    OSError (FileNotFoundError, BeamIOError) that resuming reads as "encode it again"."""
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

    if not is_remote(path):
        return artifact.load(path)
    with tempfile.TemporaryDirectory(prefix="hbpe-tokenizer-") as local:
        # a tokenizer written before issue 19 names its spec tokenizer.json
        name = next((n for n in SPEC_FILENAMES if size(join(path, n)) is not None), SPEC_FILENAME)
        Path(local, name).write_bytes(read_bytes(join(path, name)))
        rank_file = artifact.load_spec(local).first_stage.rank_file  # a plain name inside the directory
        Path(local, rank_file).write_bytes(read_bytes(join(path, rank_file)))
        for name in (TABLES_DATA_FILENAME, TABLES_MANIFEST_FILENAME):  # the built tables, where there are
            if size(join(path, name)) is not None:
                Path(local, name).write_bytes(read_bytes(join(path, name)))
        return artifact.load(local)


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


def list_files(path: str) -> list[str]:
    """Paths relative to `path` ('/'-separated) of every file under it, sorted; [] when there is none."""
    if is_remote(path):
        return sorted(_remote_files(path))
    found = []
    for dirpath, _, filenames in os.walk(path):
        rel = os.path.relpath(dirpath, path)
        found += [f if rel == "." else f"{rel}/{f}".replace(os.sep, "/") for f in filenames]
    return sorted(found)


def copy_files(pairs: list[tuple[str, str]]) -> None:
    """Copy each file `src` to `dst`, replacing what `dst` holds; the sources stay.

    Locally a hard link (no data copied; a copy where links are not supported) under a
    temporary name, renamed over `dst`; on object stores one server-side copy per object,
    in one batch.
    """
    remote = [(s, d) for s, d in pairs if is_remote(d)]
    for src, dst in (p for p in pairs if not is_remote(p[1])):
        if os.path.exists(dst) and os.path.samefile(src, dst):
            continue  # linked by an earlier try (renaming a link over its twin would do nothing, tmp left behind)
        os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
        tmp = f"{dst}.tmp-{uuid.uuid4().hex[:12]}"
        try:
            os.link(src, tmp)
        except OSError:  # another filesystem below, or one without hard links (FAT, some network mounts)
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    if remote:
        fsys = _beam_fs()[0]
        if not _object_store(remote[0][1]):  # HDFS's copy refuses an existing target
            fsys.delete([d for _, d in remote if fsys.exists(d)])
        fsys.copy([s for s, _ in remote], [d for _, d in remote])


def delete_files(root: str, rels: list[str]) -> None:
    """Delete these files (paths relative to `root`), and locally the folders they leave empty."""
    if not rels:
        return
    if is_remote(root):
        _beam_fs()[0].delete([join(root, r) for r in rels])
        return
    for r in rels:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(root, r))
    for d in sorted({os.path.dirname(r) for r in rels if "/" in r}, key=len, reverse=True):
        while d:
            with contextlib.suppress(OSError):  # not empty: a file that stays
                os.rmdir(os.path.join(root, d))
            d = os.path.dirname(d)
