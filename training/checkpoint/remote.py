"""Checkpoints in a bucket (s3://, gs://, ...) for eval, generate, export and consolidate: copied local first.

Everything that reads a checkpoint works on local files, which the weights-only unpickler
checks before any of it is built (checkpoint.py). A URI is therefore copied into a local
folder laid out as its run folder, so `find_run_dir` and every check work unchanged:

    INTO/hbpe_run.json, INTO/tokenizer/   the run's files (run_files.find_remote_run_dir)
    INTO/<path below the run folder>      the checkpoint: one `.pt` object, or every object
                                          under a sharded checkpoint's prefix (.metadata, *.distcp)

A URI may name what a local path may:
- a checkpoint object, `s3://b/run/ep0-ba4-rank0.pt`;
- `s3://b/run/latest-rank0.pt` or the save folder `s3://b/run`: a bucket has no symlinks, so
  the checkpoint that Composer's pointer object `latest-rank0.pt.symlink` names;
- a sharded checkpoint, `s3://b/run/ep0-ba4` (FSDP2's default);
- an `hbpe export` directory (`hbpe_model.json`), copied whole.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator

from hbpe.pipeline import storage
from hbpe.schemas.errors import ArtifactError, ConfigError
from hbpe.training.checkpoint.names import MODEL_FILE
from hbpe.training.checkpoint.run_files import download_run_files, find_remote_run_dir
from hbpe.training.checkpoint.save_folder import LATEST, SYMLINK, follow_pointer

LATEST_POINTER = LATEST.format(rank=0) + SYMLINK  # Composer's `latest-rank0.pt` in a bucket
CHECKPOINT_TIMEOUT = 3600.0  # seconds for one checkpoint object: large ones are gigabytes


@contextlib.contextmanager
def localized(uri: str) -> Iterator[tuple[str, str, str]]:
    """(a local path standing for checkpoint `uri`, the local folder it lies in, the URI that folder stands for):
    a temporary folder removed after the block (see `localize`).

    An ArtifactError or ConfigError raised in the block names the bucket's objects, not their temporary copies.
    """
    with tempfile.TemporaryDirectory(prefix="hbpe-checkpoint-") as tmp:
        local, root = localize(uri, tmp)
        try:
            yield local, tmp, root
        except (ArtifactError, ConfigError) as e:
            message = str(e)
            for copy in {os.path.realpath(tmp), tmp}:
                message = message.replace(copy, root)
            raise type(e)(message) from None


def localize(uri: str, into: str) -> tuple[str, str]:
    """Copy what checkpoint URI `uri` names into local folder `into` (see the module docstring)
    -> (its local path, the URI that `into` stands for: the run folder or the export)."""

    uri = uri.rstrip("/")
    below = storage.list_dir(uri)  # the objects under uri/: none when uri is an object
    if MODEL_FILE in below:
        storage.download_dir(uri, into, timeout=CHECKPOINT_TIMEOUT)
        return into, uri
    target = uri if ".metadata" in below else resolve(uri, below)
    sharded = ".metadata" in (below if target == uri else storage.list_dir(target))
    run_dir = find_remote_run_dir(target)
    local = storage.local_path_inside(into, target[len(run_dir) + 1 :], source=run_dir)  # before any download
    download_run_files(run_dir, into)
    if sharded:
        storage.download_dir(target, local, timeout=CHECKPOINT_TIMEOUT)
        return local, run_dir
    parent, _, name = target.rpartition("/")
    storage.localize_dir(parent, [name], into=os.path.dirname(local), timeout=CHECKPOINT_TIMEOUT)
    if not os.path.isfile(local):
        raise ArtifactError(
            f"checkpoint {target} does not exist; pass a checkpoint object, a sharded checkpoint prefix or a save "
            "folder (`hbpe train` writes latest-rank0.pt.symlink there)"
        )
    return local, run_dir


def resolve(uri: str, below: list[str]) -> str:
    """The checkpoint a URI names: a save folder's or a `latest-rank0.pt`'s pointer target, else `uri` itself."""
    if below:  # a folder: the save folder of a run
        target = follow_pointer(storage.join(uri, LATEST_POINTER))
        if target is None:
            raise ArtifactError(
                f"{uri} holds no {LATEST_POINTER} (Composer's latest-rank0.pt in a bucket); pass a checkpoint object "
                "(e.g. .../ep0-ba4-rank0.pt), a sharded checkpoint prefix, a `hbpe train` save folder or a "
                "`hbpe export` directory"
            )
        return target
    return follow_pointer(uri + SYMLINK) or uri  # as Composer's get_file: NAME.symlink stands for NAME
