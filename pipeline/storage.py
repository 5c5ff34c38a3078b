"""Read local paths and object-store URIs alike, without Beam.

The tokenizer, the shard reader and the trainer read a few small files (tokenizer.json,
the rank file, manifest.json, index.json, COMPLETED) that may live in a bucket. Local
paths use the standard library; URIs (s3://, gs://, oci://, azure://, hf://, ...) go through
mosaicml-streaming's downloaders, the object-store client training already depends on,
imported only when a URI is read (importing streaming costs seconds: it imports torch).
Beam's filesystems stay in `hbpe.pipeline.beam.fs`, the only code that runs inside Beam.
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

from hbpe.schemas.errors import ArtifactError

DEFAULT_TIMEOUT = 60.0  # seconds for one file: metadata files are small, so a slow one is a stuck one

# what the object stores' clients raise for an object that is not there (botocore puts the code in
# `response`; google-cloud-storage raises NotFound; azure ResourceNotFoundError; huggingface_hub
# EntryNotFoundError); anything else (no credentials, no network, 403) is an error, not "missing"
_MISSING_CODES = {"404", "NoSuchKey", "NotFound"}
_MISSING_TYPES = {"FileNotFoundError", "NotFound", "NoSuchKey", "ResourceNotFoundError", "EntryNotFoundError"}


def is_remote(path: str | os.PathLike) -> bool:
    """True for a URI with a scheme (s3://bucket/x), False for a local path."""
    return "://" in str(path)


def join(base: str | os.PathLike, name: str) -> str:
    """`name` inside `base`; a URI keeps its `scheme://` (os.path.join would too, but not on Windows)."""
    base = str(base)
    return f"{base.rstrip('/')}/{name}" if is_remote(base) else os.path.join(base, name)


def read_if_exists(path: str | os.PathLike, *, timeout: float = DEFAULT_TIMEOUT) -> bytes | None:
    """The bytes of a local file or remote object, None when it does not exist.

    Raises:
        ArtifactError: a remote read failed for another reason (credentials, network, timeout,
            an unsupported scheme), naming the URI.
    """
    if not is_remote(path):
        try:
            return Path(path).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):  # not a file there
            return None
    with tempfile.TemporaryDirectory(prefix="hbpe-storage-") as tmp:
        local = os.path.join(tmp, "object")
        if not _download(str(path), local, timeout):
            return None
        return Path(local).read_bytes()


def read_bytes(path: str | os.PathLike, *, timeout: float = DEFAULT_TIMEOUT) -> bytes:
    """The bytes of a local file or remote object; ArtifactError naming it when it is missing or unreadable."""
    data = read_if_exists(path, timeout=timeout)
    if data is None:
        raise ArtifactError(f"{path} not found; check the path (and for a URI, the bucket and prefix)")
    return data


def localize_dir(
    path: str | os.PathLike, names: list[str], *, into: str | None = None, timeout: float = DEFAULT_TIMEOUT
) -> str:
    """A local directory holding the files `names` of directory `path` (`path` itself when local).

    A remote directory's files are downloaded into `into` (a new temporary directory by default,
    which the caller owns). Names missing remotely are left out, so the caller's own checks name
    the missing file as they would locally.
    """
    if not is_remote(path):
        return str(path)
    local = into or tempfile.mkdtemp(prefix="hbpe-")
    for name in names:
        _download(join(path, name), os.path.join(local, name), timeout)
    return local


def _download(uri: str, local: str, timeout: float) -> bool:
    """Download `uri` to `local` within `timeout` seconds; False when the object does not exist."""
    result: dict[str, BaseException | None] = {"error": None}

    def run() -> None:
        try:
            from streaming.base.storage.download import CloudDownloader

            CloudDownloader.direct_download(uri, local, timeout)  # read timeout of the store's client
        except BaseException as e:  # handed to the caller's thread
            result["error"] = e

    # a thread with a deadline: streaming's timeout bounds each read, not the connection retries
    # (an unroutable endpoint would otherwise hang for minutes); a daemon thread cannot keep the
    # process alive after the error is raised
    worker = threading.Thread(target=run, name=f"hbpe-download {uri}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise ArtifactError(
            f"cannot read {uri}: no answer within {timeout:g} s; check the network and the store's endpoint "
            "(e.g. S3_ENDPOINT_URL), then retry"
        )
    e = result["error"]
    if e is None:
        return True
    if _is_missing(e):
        return False
    raise ArtifactError(
        f"cannot read {uri} ({type(e).__name__}: {e}); check the URI, the credentials for its store "
        "(e.g. AWS_* or S3_ENDPOINT_URL for s3://, GOOGLE_APPLICATION_CREDENTIALS for gs://) and the network"
    ) from e


def _is_missing(e: BaseException) -> bool:
    response = getattr(e, "response", None)  # a dict for botocore; other clients put other things there
    code = str(response.get("Error", {}).get("Code")) if isinstance(response, dict) else None
    return code in _MISSING_CODES or any(t.__name__ in _MISSING_TYPES for t in type(e).__mro__)
