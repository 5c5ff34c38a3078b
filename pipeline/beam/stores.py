"""Object stores under Beam: the filesystem options hbpe hands Beam, and a preflight with a deadline.

Beam's S3 filesystem takes its endpoint from pipeline options (S3Options' `--s3_endpoint_url`),
not from the variable streaming and Composer read (S3_ENDPOINT_URL); without one it retries
https://BUCKET.s3.amazonaws.com for six minutes. hbpe fills the option from the environment
(an explicit `--s3_endpoint_url` wins), so one setting serves the launcher's own filesystem calls
(listing inputs, checking and clearing the output, staging, commit, resume), the pipeline's
workers (the option travels with the pipeline) and training.

Before a conversion starts, `preflight` touches each remote location once through Beam's own
clients within a deadline, so a wrong endpoint, missing credentials or a missing bucket is one
error naming the location and the settings to check, in seconds, not a hang in a worker.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping, Sequence

from hbpe.pipeline import storage
from hbpe.schemas.errors import ArtifactError

# streaming's and Composer's variable first, then the ones botocore itself reads (AWS CLI v2 style)
S3_ENDPOINT_VARS = ("S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
S3_ENDPOINT_OPTION = "--s3_endpoint_url"


def store_args(pipeline_args: Sequence[str] = (), environ: Mapping[str, str] | None = None) -> list[str]:
    """Beam options to add to `pipeline_args` so Beam reaches the stores the environment names.

    >>> store_args([], {"S3_ENDPOINT_URL": "http://127.0.0.1:9000"})
    ['--s3_endpoint_url=http://127.0.0.1:9000']
    >>> store_args(["--s3_endpoint_url=http://a"], {"S3_ENDPOINT_URL": "http://b"})
    []
    """
    env = os.environ if environ is None else environ
    given = any(a == S3_ENDPOINT_OPTION or a.startswith(S3_ENDPOINT_OPTION + "=") for a in pipeline_args)
    endpoint = next((env[v] for v in S3_ENDPOINT_VARS if env.get(v)), None)
    # region and credentials are not copied: boto3 reads them from the environment itself, and
    # pipeline options are shown in runners' UIs (no secrets there)
    return [f"{S3_ENDPOINT_OPTION}={endpoint}"] if endpoint and not given else []


def filesystem_options(pipeline_args: Sequence[str] = ()):
    """Beam PipelineOptions for its filesystems: the user's options plus `store_args`."""
    from apache_beam.options.pipeline_options import PipelineOptions

    args = list(pipeline_args)
    return PipelineOptions([*args, *store_args(args)])


def use_filesystem_options(pipeline_args: Sequence[str] = ()):
    """Configure Beam's FileSystems for the calls hbpe makes outside a pipeline (a Pipeline sets its own) -> the options."""
    from apache_beam.io.filesystems import FileSystems

    options = filesystem_options(pipeline_args)
    FileSystems.set_options(options)
    return options


def filesystems():
    """Beam's FileSystems, configured from the environment when nothing configured them yet.

    Without options Beam's S3 filesystem refuses every call ("Must provide one of client or
    options"); a Pipeline or `use_filesystem_options` sets them (Beam keeps them in a class field).
    """
    from apache_beam.io.filesystems import FileSystems

    current = FileSystems._pipeline_options
    # unset, or set (by an earlier pipeline in this process) without the endpoint the environment now names
    if current is None or (store_args() and not current.get_all_options().get("s3_endpoint_url")):
        use_filesystem_options()
    share_botocore_data()
    return FileSystems


def share_botocore_data() -> None:
    """One botocore data loader for every boto3 session in this process.

    Beam's S3 filesystem makes a new boto3 session, hence client, for every call (exists,
    open, rename, ...), and each new session parses botocore's JSON service data again: 80 ms
    of CPU a call, most of a small conversion's time on S3. Sessions that share the loader
    share its parsed data, as the clients of one session always do (measured: 80 -> 11 ms a
    client). Called wherever Beam's filesystems are, Beam's worker processes included.
    """
    try:
        import botocore.session
    except ImportError:  # no boto3: no S3 either
        return
    if getattr(botocore.session.create_loader, "hbpe_shared", False):
        return
    shared = functools.lru_cache(maxsize=8)(botocore.session.create_loader)  # keyed by the data path
    shared.hbpe_shared = True
    botocore.session.create_loader = shared


def preflight(
    locations: Iterable[tuple[str, str]], pipeline_args: Sequence[str] = (), *, timeout: float | None = None
) -> None:
    """Touch each remote (uri, what) once through Beam's clients, within `timeout` s each.

    Lists at most one object under the location and, for s3://, asks for its bucket (Beam's S3
    listing reads a missing bucket as an empty one). Local paths are skipped, and Beam is not
    imported when every location is local.

    Raises:
        ArtifactError: naming `what`, the URI and the settings to check (a missing bucket by name).
    """
    remote = list(dict.fromkeys((uri, what) for uri, what in locations if storage.is_remote(uri)))
    if not remote:
        return
    options = use_filesystem_options(pipeline_args)
    for uri, what in remote:
        try:
            storage.with_deadline(lambda u=uri: _touch(u, options), f"cannot reach {what} {uri}", timeout, uri=uri)
        except ArtifactError as e:
            if _missing_bucket(e.__cause__):
                raise ArtifactError(storage.missing_bucket_message(uri, what)) from e.__cause__
            raise


def _touch(uri: str, options) -> None:
    if storage.scheme(uri) == "s3":
        from apache_beam.io.aws.clients.s3.boto3_client import Client

        Client(options).client.head_bucket(Bucket=storage.split_uri(uri)[1])  # Beam's own boto3 client and options
    filesystems().match([_listing_pattern(uri)], limits=[1])


def _listing_pattern(uri: str) -> str:
    """A pattern that lists at most the objects under `uri` (or its folder part before a wildcard).

    >>> _listing_pattern("s3://b"), _listing_pattern("s3://b/out/"), _listing_pattern("gs://b/in/*.jsonl")
    ('s3://b/*', 's3://b/out*', 'gs://b/in/*')
    """
    scheme, rest = uri.split("://", 1)
    folder = []
    for part in rest.rstrip("/").split("/"):
        if any(c in part for c in "*?["):
            break
        folder.append(part)
    base = f"{scheme}://{'/'.join(folder)}"
    return f"{base}/*" if len(folder) <= 1 or len(folder) < len(rest.rstrip("/").split("/")) else f"{base}*"


def _missing_bucket(e: BaseException | None) -> bool:
    """Whether `e` (or an error Beam wrapped in it) says the bucket is not there."""
    seen = 0
    todo = [e]
    while todo and seen < 20:
        x = todo.pop()
        seen += 1
        if x is None:
            continue
        if storage.is_missing(x) or "NoSuchBucket" in str(x):
            return True
        details = getattr(x, "exception_details", None)  # BeamIOError: {path: error}
        if isinstance(details, dict):
            todo += [d for d in details.values() if isinstance(d, BaseException)]
        todo.append(x.__cause__)
    return False


def write_empty(uri: str) -> None:
    """An empty object at `uri` through Beam's client for its store.

    Beam's S3 filesystem writes by multipart upload, which cannot hold zero parts: an empty
    object is one PutObject with the same client and options. Other stores write it as usual.
    """
    fsys = filesystems()
    if storage.scheme(uri) != "s3":
        from apache_beam.io.filesystem import CompressionTypes

        fsys.create(uri, compression_type=CompressionTypes.UNCOMPRESSED).close()
        return
    from apache_beam.io.aws.clients.s3.boto3_client import Client

    _, bucket, key = storage.split_uri(uri)
    Client(fsys._pipeline_options).client.put_object(Bucket=bucket, Key=key, Body=b"")
