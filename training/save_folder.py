"""The save folder, local or in a bucket: one run per folder, what autoresume continues, clearing an old run.

A save folder is a local directory or a bucket prefix (`s3://b/runs/a`, `gs://...`). Composer
writes the checkpoints (into a bucket through its RemoteUploader), run_files.py writes
`hbpe_run.json` and `tokenizer/`. A bucket has no symlinks: where a local folder has
Composer's `latest-rank0.pt -> ep0-ba4-rank0.pt`, a bucket has the object
`latest-rank0.pt.symlink` holding the latest checkpoint's object name (`runs/a/ep0-ba4-rank0.pt`).
Everything here reads a bucket through hbpe.pipeline.storage (streaming's clients).
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from hbpe.pipeline import storage
from hbpe.schemas.errors import ArtifactError, ConfigError
from hbpe.schemas.train_config import TrainConfig
from hbpe.training.run_files import RUN_FILE

if TYPE_CHECKING:
    from hbpe.pipeline.tokenizer.hierarchical import HierarchicalTokenizer

log = logging.getLogger(__name__)

LATEST = "latest-rank{rank}.pt"  # Composer's save_latest_filename
SYMLINK = ".symlink"  # Composer's suffix for the object that stands for a symlink in a bucket

# what Composer's default checkpoint names produce: ep{epoch}-ba{batch}-rank{rank}.pt, latest-rank{rank}.pt,
# and for sharded (DCP) checkpoints an ep{epoch}-ba{batch} folder holding .metadata
_CHECKPOINT_FILE = re.compile(r"(ep\d+-ba\d+|latest)-rank\d+\.pt|ep\d+-ba\d+-consolidated\.pt")
_SHARDED_CHECKPOINT = re.compile(r"ep\d+-ba\d+")


def top_level_names(folder: str) -> set[str]:
    """The names directly in `folder` (files and folders; for a bucket, the first part of each object's name)."""
    if storage.is_remote(folder):
        try:
            return {name.split("/", 1)[0] for name in storage.list_dir(folder)}
        except ArtifactError as e:
            if e.__cause__ is not None and storage.is_missing(e.__cause__):
                raise ConfigError(storage.missing_bucket_message(folder, "save_folder")) from None
            raise
    p = Path(folder)
    return {c.name for c in p.iterdir()} if p.is_dir() else set()


def check_save_folder(cfg: TrainConfig) -> None:
    """Refuse to train into a folder that holds another run, unless asked to resume or replace it.

    Composer would otherwise overwrite the old checkpoints as the new ones are saved (or fail
    only at the first save), and `hbpe_run.json` would describe the new model beside old weights.
    """
    if cfg.autoresume and cfg.save_overwrite:
        raise ConfigError("autoresume=true and save_overwrite=true contradict each other: resume or replace, not both")
    names = top_level_names(cfg.save_folder)  # one listing of a bucket for both checks
    check_save_folder_is_not_data(cfg, names)
    if cfg.autoresume or cfg.save_overwrite:
        return
    checkpoints = sorted(
        n for n in names if n.endswith(".pt") or n.endswith(".pt" + SYMLINK) or _SHARDED_CHECKPOINT.fullmatch(n)
    )
    if checkpoints:
        previous = sorted({*checkpoints[:3], *(names & {RUN_FILE})})
        raise ConfigError(
            f"save_folder {cfg.save_folder} already holds a run ({', '.join(previous)}); pass autoresume=true to "
            "continue it, save_overwrite=true to replace it, or choose another save_folder"
        )
    if RUN_FILE in names:
        # a run that stopped before its first checkpoint (bad shards, Ctrl-C): nothing to keep or resume,
        # so a plain rerun takes the folder and rewrites its run files
        log.warning("save_folder %s holds %s but no checkpoint: replacing that run's files", cfg.save_folder, RUN_FILE)


def _overlap(folder: str, data: str) -> str | None:
    """How save_folder `folder` and shard directory `data` overlap ("is", "lies inside", "contains"), or None."""
    if storage.is_remote(folder) != storage.is_remote(data):
        return None
    if storage.is_remote(folder):  # prefixes of object names: a/b lies inside a, not inside a-b
        f, d = folder.rstrip("/") + "/", data.rstrip("/") + "/"
        return "is" if f == d else "lies inside" if f.startswith(d) else "contains" if d.startswith(f) else None
    fp, dp = Path(folder).resolve(), Path(data).resolve()
    return (
        "is" if fp == dp else "lies inside" if fp.is_relative_to(dp) else "contains" if dp.is_relative_to(fp) else None
    )


def check_save_folder_is_not_data(cfg: TrainConfig, names: set[str] | None = None) -> None:
    """The run writes `tokenizer/` and `hbpe_run.json` into save_folder: never into (or around) shards.

    A shard directory used as save_folder would get the run's tokenizer over its own `tokenizer/`
    (the shards then no longer verify), and a folder inside one is deleted with it. `names`:
    the folder's `top_level_names`, when already listed.
    """
    from hbpe.schemas import shard_columns

    sources = [("data.train", cfg.data.train), ("data.eval", cfg.data.eval)]
    sources += [(f"data.streams[{i}].remote", s.remote) for i, s in enumerate(cfg.data.streams or ())]
    for key, value in sources:
        where = _overlap(cfg.save_folder, value) if value else None
        if where:
            raise ConfigError(
                f"save_folder {cfg.save_folder} {where} the shard directory {key}={value}: the run's tokenizer/ and "
                "checkpoints would be written among the shards; set save_folder to a folder of its own, e.g. "
                f"save_folder=runs/{cfg.run_name}"
            )
    names = top_level_names(cfg.save_folder) if names is None else names
    shard_files = (shard_columns.MANIFEST_FILENAME, shard_columns.INDEX_FILENAME, shard_columns.COMPLETED_FILENAME)
    found = [name for name in shard_files if name in names]
    if found:
        raise ConfigError(
            f"save_folder {cfg.save_folder} holds a shard directory's files ({', '.join(found)}): the run's tokenizer/ "
            f"would overwrite the shards' own; set save_folder to a folder of its own, e.g. save_folder=runs/{cfg.run_name}"
        )


def check_resume_matches(cfg: TrainConfig, tok: HierarchicalTokenizer) -> None:
    """autoresume continues the run in save_folder only with that run's model and tokenizer.

    Otherwise hbpe_run.json would be rewritten for the new model, Composer would then fail to load
    the old weights (an internal KeyError), and the old checkpoints could no longer be evaluated.
    """
    from dataclasses import asdict

    if not cfg.autoresume:
        return
    path = storage.join(cfg.save_folder, RUN_FILE)
    raw = storage.read_if_exists(path)
    if raw is None:
        return
    try:
        old = json.loads(raw)
        old_model, old_fingerprint = dict(old["model"]), old["tokenizer_fingerprint"]
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"{path} is not a readable {RUN_FILE} ({type(e).__name__}: {e}); autoresume cannot tell which run it "
            "continues: restore the file, or set save_folder to a new folder"
        ) from None
    new_model = asdict(cfg.model_config)
    unset = "(unset)"
    changed = [
        f"model.{k} {old_model.get(k, unset)} -> {new_model.get(k, unset)}"
        for k in sorted(set(old_model) | set(new_model))
        if old_model.get(k, unset) != new_model.get(k, unset)
    ]
    if old_fingerprint != tok.fingerprint:
        changed.append(f"tokenizer fingerprint {str(old_fingerprint)[:12]} -> {tok.fingerprint[:12]}")
    if changed:
        raise ConfigError(
            f"autoresume=true but save_folder {cfg.save_folder} holds a run with another model or tokenizer "
            f"({'; '.join(changed)}); resume with that run's settings, or set save_folder to a new folder "
            "(save_overwrite=true instead of autoresume replaces the old run)"
        )


def latest_checkpoint(cfg: TrainConfig) -> str | None:
    """What autoresume continues from: the local `latest-rank{rank}.pt` (when it resolves), or the checkpoint
    a bucket's `latest-rank0.pt.symlink` names, as a URI (a `.pt` object, or a sharded checkpoint's prefix)."""
    from composer.utils import format_name_with_dist

    if not storage.is_remote(cfg.save_folder):
        latest = format_name_with_dist(os.path.join(cfg.save_folder, LATEST), cfg.run_name)
        return latest if os.path.exists(latest) else None  # Composer starts fresh when it is absent or dangling
    # rank 0's pointer on every rank, as Composer's autoresume does (only rank 0 writes a monolithic checkpoint)
    pointer = format_name_with_dist(storage.join(cfg.save_folder, LATEST.format(rank=0) + SYMLINK), cfg.run_name)
    return follow_pointer(pointer)


def follow_pointer(pointer: str) -> str | None:
    """The URI a Composer pointer object (`latest-rank0.pt.symlink`) names, None when there is none.

    Its text is an object name in the same bucket: s3://b/run/latest-rank0.pt.symlink holding
    `run/ep0-ba4-rank0.pt` -> s3://b/run/ep0-ba4-rank0.pt.
    """
    raw = storage.read_if_exists(pointer)
    if raw is None:
        return None
    scheme, bucket, _ = storage.split_uri(pointer)
    return f"{scheme}://{bucket}/{raw.decode().strip().lstrip('/')}"


def clear_previous_run(folder: str) -> list[str]:
    """With save_overwrite: remove the old run's checkpoints and run files, and nothing else -> names removed.

    Composer's save_overwrite only replaces a checkpoint of the same name: old ones the new run does
    not reach would stay beside the new ones, and eval would read them with the new hbpe_run.json.
    In a bucket nothing is deleted (hbpe's storage clients only read and write): the run files and
    the checkpoints of the same names are replaced, and any others are named in a warning.
    """
    import shutil

    if storage.is_remote(folder):
        stale = sorted(
            n for n in top_level_names(folder) if _CHECKPOINT_FILE.fullmatch(n) or _SHARDED_CHECKPOINT.fullmatch(n)
        )
        if stale:
            log.warning(
                "save_overwrite=true: %s keeps the previous run's %s until the new run saves checkpoints of the same "
                "names (hbpe does not delete objects); delete the ones it will not reach, or use a new save_folder",
                folder,
                ", ".join(stale),
            )
        return []
    root = Path(folder)
    if not root.is_dir():
        return []
    removed = []
    for p in sorted(root.iterdir()):
        name = p.name
        if _CHECKPOINT_FILE.fullmatch(name) and (p.is_symlink() or p.is_file()):
            p.unlink()
        elif _SHARDED_CHECKPOINT.fullmatch(name) and p.is_dir() and not p.is_symlink() and (p / ".metadata").exists():
            shutil.rmtree(p)
        elif name == RUN_FILE and p.is_file():
            p.unlink()
        elif name == "tokenizer" and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            continue
        removed.append(name)
    if removed:
        log.warning("save_overwrite=true: removed the previous run's %s from %s", ", ".join(removed), folder)
    return removed
