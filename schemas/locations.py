"""Where data lives: a local path, or a URI of an object store; and the usual ways of misspelling one.

Shared by the config schema (save_folder, data paths) and the CLI (every path option), so a
misspelt URI is the same one-line error everywhere, before any client is built: `gs:/b/x` (one
slash: as written, a local folder named `gs:`, which Composer and Beam would each read
differently), `S3://b` (schemes are lower case to every client) and `gcs://b` (no such store).
schemas imports no pipeline code: `is_uri` is also hbpe.pipeline.storage.is_remote's test.
"""

from __future__ import annotations

import difflib
import posixpath
import re

from hbpe.schemas.errors import ConfigError
from hbpe.schemas.names import is_relative_object_name

# what streaming reads (its downloaders) and what Composer saves to: training's locations
STREAMING_SCHEMES = ("s3", "gs", "oci", "azure", "azure-dl", "hf", "dbfs", "sftp", "alipan")
# what Beam's filesystems read and write besides: conversion's locations
BEAM_SCHEMES = ("s3", "gs", "hdfs", "azfs")
KNOWN_SCHEMES = tuple(sorted(set(STREAMING_SCHEMES) | set(BEAM_SCHEMES)))
# what hbpe reads and writes: the stores every command is tested against (moto's S3 and the GCS emulator). The
# others half-work (a client is installed, then a listing, a rename or a write fails with a misleading error),
# so they are refused up front
SUPPORTED_SCHEMES = ("s3", "gs")

_ONE_SLASH = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):/(?!/)")


def is_uri(value: str) -> bool:
    """s3://bucket/x and the like: a location a store's client resolves; anything else is a local path."""
    return "://" in str(value)


def check_location(value: str, *, where: str, schemes: tuple[str, ...] = SUPPORTED_SCHEMES) -> str:
    """`value` itself (`file:///x` as `/x`); ConfigError, prefixed by `where`, for a misspelt or unsupported URI.

    >>> check_location("s3://b/x", where="--out"), check_location("runs/a", where="--out")
    ('s3://b/x', 'runs/a')
    >>> check_location("file:///tmp/x", where="--out")
    '/tmp/x'
    >>> check_location("gs:/b/x", where="--out gs:/b/x")
    Traceback (most recent call last):
    hbpe.schemas.errors.ConfigError: --out gs:/b/x: a URI takes two slashes after its scheme: gs://b/x (as written it is a local folder named 'gs:')
    """
    one_slash = _ONE_SLASH.match(value)
    if one_slash and one_slash.group(1).lower() in (*KNOWN_SCHEMES, "file"):
        fixed = f"{one_slash.group(1).lower()}://{value[one_slash.end() :]}"
        raise ConfigError(
            f"{where}: a URI takes two slashes after its scheme: {fixed} (as written it is a local folder "
            f"named '{one_slash.group(1)}:')"
        )
    if not is_uri(value):
        return value
    scheme = value.split("://", 1)[0]
    if scheme.lower() == "file":
        return value[len("file://") :] or "/"
    if scheme != scheme.lower() and scheme.lower() in schemes:
        raise ConfigError(f"{where}: write the scheme in lower case: {scheme.lower()}://{value.split('://', 1)[1]}")
    if scheme in KNOWN_SCHEMES and scheme not in schemes:
        raise ConfigError(
            f"{where}: {scheme}:// is not supported (hbpe reads and writes {' and '.join(s + '://' for s in schemes)}, "
            "the stores it is tested against); copy the data to a local path or to one of those"
        )
    if scheme not in schemes:
        close = difflib.get_close_matches(scheme.lower(), schemes, n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]}://?)" if close else ""
        raise ConfigError(
            f"{where}: unsupported URI scheme {scheme}://; use a local path or one of "
            f"{', '.join(s + '://' for s in schemes)}{hint}"
        )
    if not value.split("://", 1)[1].split("/", 1)[0]:
        raise ConfigError(
            f"{where}: {scheme}:// names no bucket (an unset shell variable, such as $BUCKET in {scheme}://$BUCKET/x?); "
            f"write {scheme}://BUCKET/PATH"
        )
    return value


def check_output_prefix(value: str, *, where: str) -> None:
    """ConfigError, prefixed by `where`, for an output URI whose object names hbpe would refuse to download.

    A store keeps `s3://b/a/../b` or `s3://b/a//b` literally: the objects would be named `a/../b/...`, not
    what the path seems to say, and every download (`storage.local_path_inside`, a checkpoint pointer)
    refuses such names. The rule is theirs, `is_relative_object_name`, on the part after the bucket.

    >>> check_output_prefix("s3://b/runs/a/", where="--out"), check_output_prefix("runs/../a", where="--out")
    (None, None)
    >>> check_output_prefix("s3://b/a/../b", where="--out s3://b/a/../b")
    Traceback (most recent call last):
    hbpe.schemas.errors.ConfigError: --out s3://b/a/../b: the object prefix 'a/../b' has an empty, '.' or '..' part (or a backslash, NUL or ':'); a store keeps it as written, and hbpe refuses to download such names: write s3://b/b
    """
    if not is_uri(value):
        return
    scheme, _, rest = value.partition("://")
    bucket, _, prefix = rest.partition("/")
    prefix = prefix.rstrip("/")
    if not prefix or is_relative_object_name(prefix):
        return
    plain = posixpath.normpath(prefix).lstrip("/")
    fix = f": write {scheme}://{bucket}/{plain}" if is_relative_object_name(plain) else ""
    raise ConfigError(
        f"{where}: the object prefix {prefix!r} has an empty, '.' or '..' part (or a backslash, NUL or ':'); a store "
        f"keeps it as written, and hbpe refuses to download such names{fix}"
    )
