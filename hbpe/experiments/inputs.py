"""What an experiment's results depend on besides its spec: the bytes of its corpora and rank files.

A spec names its inputs by path, and a path says nothing about what is in the file: a corpus
edited in place under the same name left every finished run "finished earlier (skipped)" with
BPBs of the old text, and the held-out split and shards of the old text in OUT/data. The
prepared data and every run's result record a key over the bytes themselves (sha256 of each
local file, read once per invocation: about 1 s per GB; a bucket's own checksum of an object),
and are redone when it changes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from hbpe.pipeline import storage
from hbpe.pipeline.beam.stores import filesystems
from hbpe.pipeline.corpus.files import open_raw
from hbpe.pipeline.corpus.inputs import resolve_inputs

CHUNK = 1 << 20


def content_key(inputs: Iterable[str]) -> str:
    """sha256 over the bytes of every file the inputs name (files, directories, globs, URIs: as `hbpe convert
    --input` expands them), in their order; a few hex digits are enough to tell versions apart."""

    total = hashlib.sha256()
    for path in resolve_inputs([str(i) for i in inputs]):
        total.update(_digest(path))
    return total.hexdigest()[:16]


def file_key(path: str) -> str:
    """The key of one file (a rank file), local or URI."""
    return hashlib.sha256(_digest(path)).hexdigest()[:16]


def _digest(path: str) -> bytes:

    if storage.is_remote(path):  # the store's own checksum of the bytes (S3's ETag, GCS's hash): no download
        try:
            return hashlib.sha256(f"{filesystems().checksum(path)}".encode()).digest()
        except Exception:  # a store without checksums: read the bytes
            pass
    one = hashlib.sha256()
    with open_raw(path) as f:
        while chunk := f.read(CHUNK):
            one.update(chunk)
    return one.digest()


def combine(*keys: str) -> str:
    """One key over several (the corpus's and a rank file's, a run's and its entropy source's)."""
    return hashlib.sha256("+".join(keys).encode()).hexdigest()[:16]
