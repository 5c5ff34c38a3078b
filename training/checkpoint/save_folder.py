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
from typing import TYPE_CHECKING, Any

from hbpe.pipeline import storage
from hbpe.schemas import shard_columns
from hbpe.schemas.errors import ArtifactError, ConfigError
from hbpe.schemas.names import is_relative_object_name
from hbpe.schemas.tokenizer_artifact import RANK_FILENAME, SPEC_FILENAMES
from hbpe.schemas.tokenizer_tables import TABLES_FILENAMES
from hbpe.schemas.train_config import ModelConfig, TrainConfig, nest_patching
from hbpe.training.checkpoint.names import TOKENIZER_DIR
from hbpe.training.checkpoint.run_files import RUN_FILE

if TYPE_CHECKING:
    from hbpe.pipeline.tokenizer.hierarchical import HierarchicalTokenizer

log = logging.getLogger(__name__)

LATEST = "latest-rank{rank}.pt"  # Composer's save_latest_filename
SYMLINK = ".symlink"  # Composer's suffix for the object that stands for a symlink in a bucket

# what Composer's default checkpoint names produce: ep{epoch}-ba{batch}-rank{rank}.pt, latest-rank{rank}.pt,
# and for sharded (DCP) checkpoints an ep{epoch}-ba{batch} folder holding .metadata; `.incomplete`: one a kill cut
# short, set aside by autoresume (set_aside_incomplete)
_CHECKPOINT_FILE = re.compile(r"((ep\d+-ba\d+|latest)-rank\d+\.pt|ep\d+-ba\d+-consolidated\.pt)(\.incomplete)?")
_SHARDED_CHECKPOINT = re.compile(r"ep\d+-ba\d+")
_DCP_FILE = re.compile(r"\.metadata|__\d+_\d+\.distcp")  # torch.distributed.checkpoint's files, as Composer names them
_NUMBERED = re.compile(r"ep\d+-ba(\d+)(?:-rank0\.pt)?")  # a checkpoint of rank 0 (or sharded): its batch


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
    if cfg.save_overwrite:
        check_clearable(cfg.save_folder)  # said before any work, and again right before deleting
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
        # a field added to ModelConfig since the run was written (model.patching.entropy_model_sha256) has its default
        old_model = {**_model_settings(asdict(ModelConfig())), **_model_settings(dict(old["model"]))}
        old_fingerprint = old["tokenizer_fingerprint"]
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"{path} is not a readable {RUN_FILE} ({type(e).__name__}: {e}); autoresume cannot tell which run it "
            "continues: restore the file, or set save_folder to a new folder"
        ) from None
    new_model = _model_settings(asdict(cfg.model))
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
    old_train = old.get("train_config")
    if not isinstance(old_train, dict):
        return  # a run file without its config (written before hbpe recorded it): nothing to compare
    before, now = _order_settings(old_train), _order_settings(cfg.to_dict())
    moved = [k for k in sorted(set(before) | set(now)) if before.get(k, unset) != now.get(k, unset)]
    if moved:
        raise ConfigError(
            f"autoresume=true but the run in save_folder {cfg.save_folder} was trained with another sample order ("
            + "; ".join(f"{k} {_show(before.get(k, unset))} -> {_show(now.get(k, unset))}" for k in moved)
            + "): the order of the samples depends on these, so the resumed run would continue at its saved position "
            f"in another order; resume with the run's settings ({' '.join(f'{k}={_show(before.get(k))}' for k in moved)}), "
            "or set save_folder to a new folder for a new run"
        )
    _check_same_duration(cfg, old_train)


def _check_same_duration(cfg: TrainConfig, old_train: dict[str, Any]) -> None:
    """autoresume with another max_duration than the run's recorded train config: ConfigError when the learning-rate
    schedule spans max_duration, unless optim.allow_new_duration=true.

    Composer's schedulers read the resumed clock against the new max_duration: a cosine schedule is laid over the
    new length and the learning rate jumps at the checkpoint (before: 0.00279 -> 0.00040 at batch 81), where every
    other setting of the run that changes its course is refused. The constant schedule keeps its rate.
    """
    before, now = old_train.get("max_duration"), cfg.max_duration
    if cfg.optim.allow_new_duration or not isinstance(before, str) or before == now or not spans_duration(cfg):
        return
    why = "optim.schedule=cosine" if cfg.optim.schedule == "cosine" else f"optim.warmup={cfg.optim.warmup}"
    raise ConfigError(
        f"autoresume=true but the run in save_folder {cfg.save_folder} was trained with max_duration={before}, not "
        f"{now}: its learning-rate schedule ({why}) spans max_duration, so the rate would jump to the one of a "
        f"schedule over {now} at the checkpoint; resume with max_duration={before}, or pass "
        "optim.allow_new_duration=true to continue on the schedule over the new length"
    )


def spans_duration(cfg: TrainConfig) -> bool:
    """Whether the learning rate at a batch depends on max_duration: a cosine decay, or a warm-up given in dur."""
    return cfg.optim.schedule == "cosine" or cfg.optim.warmup.lower().endswith("dur")


# what the order of the training samples depends on besides the shards (README, Multi-node): streaming's
# shuffle and partition settings, the stream weights and the global batch size
_ORDER_KEYS = ("shuffle", "shuffle_seed", "shuffle_algo", "shuffle_block_size", "num_canonical_nodes", "epoch_size")


def _model_settings(model: dict[str, Any]) -> dict[str, Any]:
    """A recorded model config by dotted key (`patching.max_bytes`); an older run's flat keys read into place."""
    out: dict[str, Any] = {}
    for key, value in nest_patching(model).items():
        out.update({f"{key}.{k}": v for k, v in value.items()} if isinstance(value, dict) else {key: value})
    return out


def _order_settings(train_config: dict[str, Any]) -> dict[str, Any]:
    """{key: value} of the settings that order the samples, from a run's recorded (untrusted) train config."""
    data = train_config.get("data")
    data = data if isinstance(data, dict) else {}
    out = {"global_batch_size": train_config.get("global_batch_size")}
    out.update({f"data.{k}": data.get(k) for k in _ORDER_KEYS})
    streams = data.get("streams")
    for i, stream in enumerate(streams if isinstance(streams, list) else []):
        stream = stream if isinstance(stream, dict) else {}
        out.update({f"data.streams.{i}.{w}": stream.get(w) for w in ("proportion", "repeat", "choose")})
    return out


def _show(value: Any) -> str:
    """A value as an override spells it (null, true, 8)."""
    return json.dumps(value) if value is None or isinstance(value, bool) else str(value)


def latest_checkpoint(cfg: TrainConfig) -> str | None:
    """What autoresume continues from: the newest complete checkpoint in the save folder, None when there is none.

    Composer saves `ep0-ba2-rank0.pt` first and moves `latest-rank0.pt` (a bucket's
    `latest-rank0.pt.symlink` object) to it after: a run killed in between leaves a checkpoint newer
    than the one latest names, or none named at all. Resuming from the one latest names would start
    over at that batch and then refuse to save over the newer one (Composer's FileExistsError, on every
    retry), so the newest complete one wins. Local: a path (`latest-rank0.pt` itself when it names that
    checkpoint); a bucket: a URI (a `.pt` object, or the sharded checkpoint's prefix the pointer names).
    """
    from composer.utils import format_name_with_dist

    folder = format_name_with_dist(cfg.save_folder, cfg.run_name)
    if not storage.is_remote(folder):
        return _newest_local(Path(folder))
    # rank 0's pointer on every rank, as Composer's autoresume does (only rank 0 writes a monolithic checkpoint)
    return _newest_remote(folder, follow_pointer(storage.join(folder, LATEST.format(rank=0) + SYMLINK)))


def checkpoint_batch(name: str) -> int | None:
    """The batch of a checkpoint name Composer writes (`ep0-ba4-rank0.pt`, a sharded `ep0-ba4`), else None."""
    m = _NUMBERED.fullmatch(name)
    return int(m.group(1)) if m else None


def _complete_local(p: Path) -> bool:
    """A checkpoint a kill did not cut short: torch.save's zip ends with its central directory, written last;
    a sharded one has the `.metadata` torch.distributed.checkpoint writes once every rank is done."""
    import zipfile

    if p.is_dir():
        return (p / ".metadata").is_file()
    return p.is_file() and p.name.endswith(".pt") and zipfile.is_zipfile(p)


def saved_checkpoint(cfg: TrainConfig) -> str | None:
    """The newest complete checkpoint in the save folder (what autoresume would continue), None when there is none;
    for a message, so nothing is logged. A bucket is listed (an object appears only once its upload completed)."""
    from composer.utils import format_name_with_dist

    folder = format_name_with_dist(cfg.save_folder, cfg.run_name)
    if not storage.is_remote(folder):
        newest = _newest_complete(Path(folder))
        return None if newest is None else str(newest)
    found = {b: n for n in top_level_names(folder) if (b := checkpoint_batch(n)) is not None}
    return storage.join(folder, found[max(found)]) if found else None


def _newest_complete(root: Path) -> Path | None:
    """The local checkpoint of the highest batch that a kill did not cut short, None when there is none."""
    found = sorted(
        ((b, p) for p in (root.iterdir() if root.is_dir() else ()) if (b := checkpoint_batch(p.name)) is not None),
        key=lambda bp: bp[0],
        reverse=True,
    )
    return next((p for _, p in found if _complete_local(p)), None)


def _newest_local(root: Path) -> str | None:
    latest = root / LATEST.format(rank=0)
    newest = _newest_complete(root)
    if newest is None:
        return str(latest) if latest.exists() else None  # Composer starts fresh when it is absent or dangling
    if latest.exists() and latest.resolve() == newest.resolve():
        return str(latest)
    if latest.is_symlink():
        why = (
            f"is newer than the checkpoint {latest.name} names ({os.readlink(latest)}; a run stopped between "
            f"saving it and moving {latest.name})"
        )
    elif latest.exists():
        why = f"is the newest checkpoint ({latest.name} is a file, not Composer's symlink)"
    else:
        why = f"has no {latest.name} naming it (a run stopped between saving it and writing {latest.name})"
    log.warning("autoresume: %s %s: continuing from it", newest.name, why)
    return str(newest)


def _newest_remote(folder: str, pointed: str | None) -> str | None:
    """The newest checkpoint object in a bucket save folder, or the pointer's target when that is newer.

    An object appears only once its upload completed (S3 and GCS commit whole objects), so every
    `.pt` listed is complete. A sharded checkpoint is many objects uploaded one by one: one newer
    than the pointer's cannot be told complete, and is named for the user to delete.
    """
    names = top_level_names(folder)
    candidates = {
        b: storage.join(folder, n) for n in names if n.endswith("-rank0.pt") and (b := checkpoint_batch(n)) is not None
    }
    if pointed is not None and (b := checkpoint_batch(pointed.rstrip("/").rsplit("/", 1)[-1])) is not None:
        candidates.setdefault(b, pointed)
    newest = max(candidates, default=None)
    if newest is None:
        return pointed
    sharded = sorted(
        n
        for n in names
        if _SHARDED_CHECKPOINT.fullmatch(n)
        and (checkpoint_batch(n) or 0) > newest
        and storage.join(folder, n) != pointed
    )
    if sharded:
        raise ConfigError(
            f"save_folder {folder} holds the sharded checkpoint {storage.join(folder, sharded[-1])}, newer than the "
            f"checkpoint autoresume would continue ({candidates[newest]}), and its objects may be incomplete (a run "
            "stopped while uploading it); delete that prefix and rerun to resume from the older one"
        )
    if pointed is not None and candidates[newest] != pointed:
        log.warning(
            "autoresume: %s is newer than the checkpoint %s names (%s; a run stopped between uploading it and "
            "the pointer): continuing from it",
            candidates[newest],
            LATEST.format(rank=0) + SYMLINK,
            pointed,
        )
    return candidates[newest]


def set_aside_incomplete(folder: str, resume_from: str | None) -> list[str]:
    """Rank 0, before autoresume trains: move local checkpoint files newer than the resume point aside -> their names.

    They are ones a kill cut short (`latest_checkpoint` takes the newest complete one), and
    Composer refuses to start beside a checkpoint name it will reach (`ep0-ba3-rank0.pt may
    conflict with a future checkpoint`). Renamed to `NAME.incomplete`, never deleted.
    """
    root = Path(folder)
    if storage.is_remote(folder) or not root.is_dir():
        return []
    start = (checkpoint_batch(Path(os.path.realpath(resume_from)).name) if resume_from else None) or 0
    moved = []
    for p in sorted(root.iterdir()):
        b = checkpoint_batch(p.name)
        if b is not None and b > start and p.is_file() and not p.is_symlink() and not _complete_local(p):
            os.replace(p, p.with_name(p.name + ".incomplete"))
            log.warning(
                "autoresume: %s is incomplete (a run stopped while saving it): kept as %s.incomplete", p.name, p.name
            )
            moved.append(p.name)
    return moved


def earlier_checkpoints(folder: str, up_to_batch: int) -> list[str]:
    """The local checkpoints rank 0 saved in `folder` up to `up_to_batch`, oldest first (what a resumed run's rotation
    takes over: KeepNewestCheckpoints).

    Only Composer's own names (`ep0-ba4-rank0.pt`), regular files: not `latest-rank0.pt` (a symlink), not a
    `.incomplete` one set aside, a consolidated copy or a user's file; a bucket keeps its objects (hbpe never deletes
    objects), and Composer's local copies of a bucket run live in a temporary folder.
    """
    root = Path(folder)
    if storage.is_remote(folder) or not root.is_dir():
        return []
    found = [
        (b, p)
        for p in root.iterdir()
        if p.name.endswith("-rank0.pt")
        and (b := checkpoint_batch(p.name)) is not None
        and b <= up_to_batch
        and p.is_file()
        and not p.is_symlink()
    ]
    return [str(p) for _, p in sorted(found, key=lambda bp: bp[0])]


def follow_pointer(pointer: str) -> str | None:
    """The URI a Composer pointer object (`latest-rank0.pt.symlink`) names, None when there is none.

    Its text is an object name in the same bucket: s3://b/run/latest-rank0.pt.symlink holding
    `run/ep0-ba4-rank0.pt` -> s3://b/run/ep0-ba4-rank0.pt.
    """
    raw = storage.read_if_exists(pointer)
    if raw is None:
        return None
    scheme, bucket, _ = storage.split_uri(pointer)
    name = raw.decode("utf-8", "replace").strip().lstrip("/")
    if not is_relative_object_name(name):
        # S3 keeps `..` in a key literally, but the local copy of the checkpoint would not stay inside its folder
        raise ArtifactError(
            f"{pointer} names {name[:200]!r}, not an object of the run: a pointer holds a plain object name "
            "(e.g. run/ep0-ba4-rank0.pt); delete the pointer or pass a checkpoint object"
        )
    return f"{scheme}://{bucket}/{name}"


def _hbpe_written(p: Path) -> set[str]:
    """The names hbpe (or Composer) writes inside a folder clear_previous_run deletes whole."""

    if p.name == TOKENIZER_DIR:
        # what artifact.save writes (wrote) into a run's tokenizer/
        return {*SPEC_FILENAMES, RANK_FILENAME, *TABLES_FILENAMES}
    return {c.name for c in p.iterdir() if _DCP_FILE.fullmatch(c.name) and c.is_file()}  # a sharded checkpoint


def check_clearable(folder: str) -> None:
    """save_overwrite deletes the old run's `tokenizer/` and sharded checkpoint folders whole: only when each
    holds nothing but the files hbpe writes there. A user's file inside (notes beside the tokenizer) is named,
    and nothing is deleted."""
    root = Path(folder)
    if storage.is_remote(folder) or not root.is_dir():
        return
    for p in sorted(root.iterdir()):
        if p.is_symlink() or not p.is_dir():
            continue
        if p.name == TOKENIZER_DIR or (_SHARDED_CHECKPOINT.fullmatch(p.name) and (p / ".metadata").exists()):
            foreign = sorted(c.name for c in p.iterdir() if c.name not in _hbpe_written(p))
            if foreign:
                listed = ", ".join(foreign[:5]) + (f" ... ({len(foreign)} in all)" if len(foreign) > 5 else "")
                raise ConfigError(
                    f"save_overwrite=true would delete {p}, which holds files hbpe did not write ({listed}); move "
                    "them out of it, or set save_folder to a new folder"
                )


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
    check_clearable(folder)
    removed = []
    for p in sorted(root.iterdir()):
        name = p.name
        if _CHECKPOINT_FILE.fullmatch(name) and (p.is_symlink() or p.is_file()):
            p.unlink()
        elif _SHARDED_CHECKPOINT.fullmatch(name) and p.is_dir() and not p.is_symlink() and (p / ".metadata").exists():
            shutil.rmtree(p)
        elif name == RUN_FILE and p.is_file():
            p.unlink()
        elif name == TOKENIZER_DIR and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            continue
        removed.append(name)
    if removed:
        log.warning("save_overwrite=true: removed the previous run's %s from %s", ", ".join(removed), folder)
    return removed
