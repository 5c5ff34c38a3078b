"""Read and write local paths and object-store URIs alike, without Beam.

The tokenizer, the shard reader, the shard tools and the trainer read a few files
(tokenizer.json, the rank file, manifest.json, index.json, COMPLETED, shards) that may live in a
bucket. Local paths use the standard library; URIs (s3://, gs://: schemas/locations.SUPPORTED_SCHEMES)
go through mosaicml-streaming's downloaders and uploaders, the object-store clients training
already depends on, imported only when a URI is used (importing streaming costs seconds: it
imports torch). Beam's filesystems stay in `hbpe.pipeline.beam.fs`, the only code that runs
inside Beam. Every remote call has a deadline (`HBPE_STORAGE_TIMEOUT`, 60 s by default): the
stores' clients retry an unreachable endpoint for minutes.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from hbpe.schemas.errors import ArtifactError
from hbpe.schemas.locations import is_uri
from hbpe.schemas.names import is_relative_object_name

TIMEOUT_ENV = "HBPE_STORAGE_TIMEOUT"
DEFAULT_TIMEOUT = 60.0  # seconds for one small file or call: a slower one is a stuck one


def default_timeout() -> float:
    """Seconds one remote call may take before it is a stuck one: $HBPE_STORAGE_TIMEOUT, else 60."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    try:
        value = float(raw) if raw else DEFAULT_TIMEOUT
    except ValueError:
        raise ArtifactError(f"{TIMEOUT_ENV}={raw!r} is not a number of seconds; set it to e.g. 60") from None
    if value <= 0:
        raise ArtifactError(f"{TIMEOUT_ENV}={raw!r} must be > 0 seconds; set it to e.g. 60")
    return value


# what the object stores' clients raise for an object that is not there (botocore puts the code in
# `response`; google-cloud-storage raises NotFound; azure ResourceNotFoundError; huggingface_hub
# EntryNotFoundError); anything else (no credentials, no network, 403) is an error, not "missing"
_MISSING_CODES = {"404", "NoSuchKey", "NotFound"}
_MISSING_TYPES = {"FileNotFoundError", "NotFound", "NoSuchKey", "ResourceNotFoundError", "EntryNotFoundError"}

# what each store's clients read from the environment, for the messages of a failed remote call
_STORE_ENV = {
    "s3": "S3_ENDPOINT_URL or --s3_endpoint_url, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS, GOOGLE_CLOUD_PROJECT, and STORAGE_EMULATOR_HOST for an emulator",
}


def scheme(uri: str | os.PathLike) -> str:
    """s3://bucket/a -> "s3" ("" for a local path)."""
    return str(uri).split("://", 1)[0].lower() if is_remote(uri) else ""


def store_vars(uri: str | os.PathLike) -> str:
    """The settings a store's clients read, e.g. for s3:// S3_ENDPOINT_URL and the AWS_* credentials."""
    return _STORE_ENV.get(scheme(uri), "the credentials its client reads")


def store_hint(uri: str | os.PathLike) -> str:
    """What to check when a store cannot be used, naming the variables its clients read."""
    return f"check the URI, that its bucket exists, the network, and the store's endpoint and credentials ({store_vars(uri)})"


def is_remote(path: str | os.PathLike) -> bool:
    """True for a URI with a scheme (s3://bucket/x), False for a local path."""
    return is_uri(str(path))


def join(base: str | os.PathLike, *names: str) -> str:
    """`names` inside `base`, in order; a URI keeps its `scheme://` (os.path.join would too, but not on Windows).

    A URI's parts are joined as Beam's S3 and GCS filesystems join them, one `/` between two:
    >>> join("s3://b/out/", "units", "u.json"), join("runs/a", "units", "u.json")
    ('s3://b/out/units/u.json', 'runs/a/units/u.json')
    """
    base = str(base)
    if not is_remote(base):
        return os.path.join(base, *names)
    for name in names:
        base = f"{base.rstrip('/')}/{name.lstrip('/')}"
    return base


def read_if_exists(path: str | os.PathLike, *, timeout: float | None = None) -> bytes | None:
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


def read_bytes(path: str | os.PathLike, *, timeout: float | None = None) -> bytes:
    """The bytes of a local file or remote object; ArtifactError naming it when it is missing or unreadable."""
    data = read_if_exists(path, timeout=timeout)
    if data is None:
        raise ArtifactError(f"{path} not found; check the path (and for a URI, the bucket and prefix)")
    return data


def localize_dir(
    path: str | os.PathLike, names: list[str], *, into: str | None = None, timeout: float | None = None
) -> str:
    """A local directory holding the files `names` of directory `path` (`path` itself when local).

    A remote directory's files are downloaded into `into` (a new temporary directory by default,
    which the caller owns). Names missing remotely are left out, so the caller's own checks name
    the missing file as they would locally.
    """
    if not is_remote(path):
        return str(path)
    local = into or tempfile.mkdtemp(prefix="hbpe-")
    targets = [(name, local_path_inside(local, name, source=str(path))) for name in names]
    for name, target in targets:
        _download(join(path, name), target, timeout)
    return local


def local_path_inside(root: str | os.PathLike, name: str, *, source: str = "") -> str:
    """The local path for remote object name `name` (`/`-separated, relative) below local folder `root`.

    An object store's names are plain strings: `a/../../x` or `/etc/x` is a valid key that a
    naive join would turn into a path outside `root`. Such a name is refused (ArtifactError
    naming it and `source`) before anything is written, as are `.`, empty parts, backslashes.

    >>> local_path_inside("/tmp/into", "ckpt/ep0-ba4/.metadata")
    '/tmp/into/ckpt/ep0-ba4/.metadata'
    >>> local_path_inside("/tmp/into", "evil/../../x")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    hbpe.schemas.errors.ArtifactError: refusing object name 'evil/../../x': it would be written outside /tmp/into ...
    """
    parts = name.split("/")
    if not is_relative_object_name(name):
        where = f" under {source}" if source else ""
        raise ArtifactError(
            f"refusing object name {name!r}{where}: it would be written outside {root} (a name with a '..', '.' "
            "or empty part, a leading '/', a backslash or NUL is never copied); remove that object from the store"
        )
    path = os.path.join(str(root), *parts)
    real_root = os.path.realpath(root)
    if os.path.commonpath([real_root, os.path.realpath(path)]) != real_root:  # a symlink already inside root
        raise ArtifactError(f"refusing object name {name!r}: {path} resolves outside {root}")
    return path


def _download(uri: str, local: str, timeout: float | None) -> bool:
    """Download `uri` to `local` within `timeout` seconds; False when the object does not exist."""
    timeout = default_timeout() if timeout is None else timeout

    def fetch() -> bool:
        downloader = _downloader(uri, timeout)
        try:
            downloader.download(uri, local, timeout)
        except Exception as e:
            if is_missing(e):
                return False
            raise
        finally:
            if _is_unsigned(downloader):  # streaming fell back to anonymous reads (a 400): not for the next object
                _forget_downloaders()
        return True

    try:
        return with_deadline(fetch, f"cannot read {uri}", timeout, uri=uri)
    except ArtifactError:
        _forget_downloaders()  # a client that failed or hung is not kept: the next read starts from a new one
        raise


def _is_unsigned(downloader: Any) -> bool:
    client = getattr(downloader, "_s3_client", None)
    if client is None:
        return False
    from botocore import UNSIGNED

    return client.meta.config.signature_version is UNSIGNED


_DOWNLOADERS: dict[tuple, Any] = {}
_DOWNLOADERS_LOCK = threading.Lock()
_MAX_DOWNLOADERS = 8  # a process that switches stores and environments keeps a few, not one per switch


def _downloader(uri: str, timeout: float) -> Any:
    """streaming's downloader for `uri`'s store, made once and reused: each makes its own boto3 / GCS client
    on first use (~0.15 s), which a shard-by-shard read (`hbpe shards verify` on a bucket) paid per file.

    Keyed on what the client is built from: the scheme, the read timeout it is given, the environment
    (endpoint, credentials) and the process (a forked child makes its own: clients are not fork-safe).
    """
    from streaming.base.storage.download import CloudDownloader

    key = (uri.partition("://")[0], timeout, os.getpid(), frozenset(os.environ.items()))
    with _DOWNLOADERS_LOCK:
        downloader = _DOWNLOADERS.get(key)
        if downloader is None:
            if len(_DOWNLOADERS) >= _MAX_DOWNLOADERS:
                _DOWNLOADERS.pop(next(iter(_DOWNLOADERS)))  # the oldest
            downloader = _DOWNLOADERS[key] = CloudDownloader.get(uri)
    return downloader


def _forget_downloaders() -> None:
    with _DOWNLOADERS_LOCK:
        _DOWNLOADERS.clear()


def is_missing(e: BaseException) -> bool:
    """Whether a store's client error means "no such object" (or bucket), not "cannot tell"."""
    response = getattr(e, "response", None)  # a dict for botocore; other clients put other things there
    code = str(response.get("Error", {}).get("Code")) if isinstance(response, dict) else None
    return code in _MISSING_CODES or any(t.__name__ in _MISSING_TYPES for t in type(e).__mro__)


def missing_bucket_message(uri: str, what: str = "") -> str:
    """One line for a bucket that is not there: its name, and the settings that decide which store is asked."""
    prefix = f"{what} {uri}" if what else uri
    return (
        f"{prefix}: bucket {split_uri(uri)[1]!r} does not exist (or is not visible with these credentials); create it "
        f"or fix the URI, and check the store's endpoint and credentials ({store_vars(uri)})"
    )


def check_bucket(uri: str, *, timeout: float | None = None) -> None:
    """Before a write to `uri`: its bucket exists and answers; ArtifactError naming the bucket otherwise."""
    timeout = default_timeout() if timeout is None else timeout
    with tempfile.TemporaryDirectory(prefix="hbpe-storage-") as tmp:
        try:  # streaming's uploader asks for the bucket when it is made
            with_deadline(lambda: _uploader(uri.rstrip("/"), tmp), f"cannot write to {uri}", timeout, uri=uri)
        except ArtifactError as e:
            if e.__cause__ is not None and is_missing(e.__cause__):
                raise ArtifactError(missing_bucket_message(uri)) from e.__cause__
            raise


# ---- writing and listing: the trainer's run files, checkpoints and exports in a bucket ----
# streaming's uploaders (the same clients as its downloaders above): `upload_file(name)` copies
# `local/name` to `remote/name`, `list_objects()` lists the keys under `remote/`. Object stores
# have no directories: a "directory" here is every object under the prefix `uri/`.

T = TypeVar("T")
MIN_RATE = 1 << 20  # bytes/s: a transfer slower than this (after DEFAULT_TIMEOUT) is a stuck one


def list_dir(path: str | os.PathLike, *, timeout: float | None = None) -> list[str]:
    """Every file under directory `path`, as sorted `/`-separated names relative to it ([] when absent).

    >>> import tempfile; d = tempfile.mkdtemp(); os.makedirs(f"{d}/tokenizer"); open(f"{d}/tokenizer/a.json", "w").close()
    >>> list_dir(d), list_dir(f"{d}/missing")
    (['tokenizer/a.json'], [])
    """
    if not is_remote(path):
        root = Path(path)
        return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    uri = str(path).rstrip("/")
    with tempfile.TemporaryDirectory(prefix="hbpe-storage-") as tmp:
        keys = with_deadline(lambda: _uploader(uri, tmp).list_objects() or [], f"cannot list {uri}", timeout)
    prefix = split_uri(uri)[2]
    prefix = f"{prefix}/" if prefix else ""
    return sorted(k[len(prefix) :] for k in keys if k.startswith(prefix) and not k.endswith("/"))


def write_bytes(path: str | os.PathLike, data: bytes, *, timeout: float | None = None) -> None:
    """`data` as the local file or object `path`: complete or absent (temp file, rename; an upload is whole)."""
    if not is_remote(path):
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
        return
    parent, _, name = str(path).rpartition("/")
    with tempfile.TemporaryDirectory(prefix="hbpe-storage-") as tmp:
        Path(tmp, name).write_bytes(data)
        _upload_files(tmp, parent, [name], timeout=timeout)


def upload_dir(local: str | os.PathLike, remote: str, *, timeout: float | None = None) -> list[str]:
    """Every file under local directory `local` to the same names under URI `remote` -> the names uploaded."""
    names = list_dir(local)
    _upload_files(str(local), remote.rstrip("/"), names, timeout=timeout)
    return names


def download_dir(remote: str, local: str | os.PathLike, *, timeout: float | None = None) -> list[str]:
    """Every object under URI `remote` to the same names under `local` -> the names downloaded.

    A large object gets more time than `timeout`: its size is not known before the download,
    so the deadline is the larger of `timeout` and 10 minutes for anything but small files.
    """
    timeout = default_timeout() if timeout is None else timeout
    names = list_dir(remote, timeout=timeout)
    # every name checked before the first byte is written: one bad object refuses the whole copy
    targets = [local_path_inside(local, name, source=remote) for name in names]
    for name, target in zip(names, targets, strict=True):
        _download(join(remote, name), target, max(timeout, 600.0))
    return names


def split_uri(uri: str) -> tuple[str, str, str]:
    """A URI's (scheme, bucket, object name or prefix inside the bucket).

    >>> split_uri("s3://bucket/runs/a/"), split_uri("gs://bucket")
    (('s3', 'bucket', 'runs/a'), ('gs', 'bucket', ''))
    """
    scheme, _, rest = uri.partition("://")
    bucket, _, key = rest.partition("/")
    return scheme, bucket, key.strip("/")


def _uploader(remote: str, local: str) -> Any:
    """streaming's uploader between directory `local` and URI `remote`; it keeps the local files."""
    import logging

    from streaming.base.storage.upload import CloudUploader

    # exist_ok: `local` holds the files to upload, which streaming would otherwise refuse (and warn about)
    quiet = logging.getLogger("streaming.base.storage.upload")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return CloudUploader.get(out=(local, remote), keep_local=True, exist_ok=True)
    finally:
        quiet.setLevel(level)


def _upload_files(local: str, remote: str, names: list[str], *, timeout: float | None) -> None:
    if not names:
        return
    timeout = default_timeout() if timeout is None else timeout
    uploader = with_deadline(lambda: _uploader(remote, local), f"cannot write to {remote}", timeout)
    for name in names:
        deadline = timeout + os.path.getsize(os.path.join(local, name)) / MIN_RATE
        with_deadline(lambda n=name: uploader.upload_file(n), f"cannot write {join(remote, name)}", deadline)


def with_deadline(work: Callable[[], T], what: str, timeout: float | None, *, uri: str | None = None) -> T:
    """`work()` in a daemon thread, waited for `timeout` s; its failure (or the wait) as one ArtifactError naming `what`.

    The stores' clients retry an unreachable endpoint for minutes and their timeouts bound
    one read, not the retries: the deadline does; a daemon thread cannot keep the process
    alive after the error is raised. `uri` picks the store whose variables the message names.
    """
    timeout = default_timeout() if timeout is None else timeout
    where = uri or what.rpartition(" ")[2]  # "cannot list s3://b/x" -> s3://b/x
    refused = unreachable_endpoint(where)
    if refused:
        raise ArtifactError(f"{what}: {refused}; check the endpoint ({store_vars(where)}) and that its server runs")
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = work()
        except BaseException as e:  # handed to the caller's thread
            result["error"] = e

    worker = threading.Thread(target=run, name=f"hbpe-storage {what}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise ArtifactError(
            f"{what}: no answer within {timeout:g} s; check the network and the store's endpoint and credentials "
            f"({store_vars(where)}), then retry (${TIMEOUT_ENV} sets the deadline)"
        )
    e = result.get("error")
    if e is not None:
        raise ArtifactError(
            f"{what} ({type(e).__name__}: {' '.join(str(e).split())[:300]}); {store_hint(where)}"
        ) from e
    return result["value"]


_GCS_ENDPOINT = ("storage.googleapis.com", 443)
_reached: set[tuple[str, int]] = set()  # endpoints that answered once in this process: not probed again


def unreachable_endpoint(uri: str) -> str | None:
    """Why a gs:// URI's endpoint cannot be reached at all (refused, unknown host), None when it may be.

    google-cloud-storage retries a refused connection for its whole retry deadline (over 60 s, so
    the user waited for `with_deadline` to say "no answer"), where boto3 gives up in a second.
    One TCP connect says it at once. Only a definite answer fails here: a slow or filtered
    endpoint, or a proxy (HTTPS_PROXY), is left to the client and its deadline.
    """
    if scheme(uri) != "gs" or os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy"):
        return None
    from urllib.parse import urlsplit

    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    if emulator:
        parts = urlsplit(emulator if "://" in emulator else f"http://{emulator}")
        endpoint = (parts.hostname or "localhost", parts.port or (443 if parts.scheme == "https" else 80))
    else:
        endpoint = _GCS_ENDPOINT
    if endpoint in _reached:
        return None
    import socket

    try:
        socket.create_connection(endpoint, timeout=5).close()
    except ConnectionRefusedError:
        return f"connection refused by {endpoint[0]}:{endpoint[1]}"
    except socket.gaierror as e:
        return f"cannot resolve {endpoint[0]} ({e.strerror})"
    except OSError:
        return None  # timed out, unreachable network...: the client's own error (and retries) say more
    _reached.add(endpoint)
    return None


def upload_file(local: str | os.PathLike, uri: str, *, timeout: float | None = None) -> None:
    """Local file `local` as object `uri` (any name: the file is linked or copied beside it under that name)."""
    parent, _, name = uri.rpartition("/")
    with tempfile.TemporaryDirectory(prefix="hbpe-storage-") as tmp:
        staged = os.path.join(tmp, name)
        try:
            os.link(local, staged)  # no copy of a large file where the filesystem allows it
        except OSError:
            import shutil

            shutil.copyfile(local, staged)
        _upload_files(tmp, parent, [name], timeout=timeout)
