"""Sharded checkpoints (FSDP2's default): read their model weights in one process, or write them as one `.pt`.

`hbpe train` with `fsdp: {version: 2}` saves each checkpoint as a torch.distributed.checkpoint
(DCP) folder: `.metadata` plus one `__{rank}_0.distcp` per rank, every tensor split in chunks
across the ranks that held it. `read_sharded_model` reassembles the model's tensors from any
number of ranks into plain full tensors with torch's own planner, without a process group,
and never unpickles anything unsafely:

- `.metadata` goes through checkpoint.py's allow-list unpickler (torch's reader uses
  `pickle.load`);
- only tensor items are requested (their chunks are read with `torch.load(weights_only=True)`),
  so the optimizer's, the timestamp's and the RNG's non-tensor items are never opened;
- every data file named in the metadata must be a plain name inside the folder.

`consolidate_checkpoint` writes those weights as a monolithic checkpoint (`state.model`, the
layout `load_model` and `safe_torch_load` read) inside the run folder, for tools that want
one file. It holds the model only: resume training from the sharded folder (DCP reshards to
any number of processes).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from hbpe.pipeline import storage
from hbpe.schemas.errors import ArtifactError, ConfigError
from hbpe.training.checkpoint.export_format import write_file_atomic
from hbpe.training.checkpoint.load import load_model, resolve_checkpoint
from hbpe.training.checkpoint.names import MODEL_FILE, WEIGHTS_FILE
from hbpe.training.checkpoint.remote import CHECKPOINT_TIMEOUT, localized
from hbpe.training.checkpoint.run_files import find_run_dir
from hbpe.training.checkpoint.safe_load import safe_torch_load


def default_output(ckpt: Path) -> Path:
    """run/ep0-ba4/ -> run/ep0-ba4-consolidated.pt, beside it in the run folder."""
    return ckpt.parent / f"{ckpt.name}-consolidated.pt"


def consolidate_checkpoint(checkpoint: str, out: str | None = None, *, overwrite: bool = False) -> dict[str, Any]:
    """A sharded checkpoint (folder, or a save folder whose latest is one) -> one monolithic `.pt` of its model.

    The output stays inside the run folder (eval and generate read `hbpe_run.json` and
    `tokenizer/` beside a checkpoint); for a self-contained copy elsewhere use `hbpe export`.
    A checkpoint in a bucket is consolidated from a local copy, and the file uploaded beside it.
    """

    if storage.is_remote(checkpoint):
        return _consolidate_remote(checkpoint, out, overwrite=overwrite)
    t0 = time.perf_counter()
    _refuse_export(Path(checkpoint))
    ckpt = resolve_checkpoint(checkpoint)
    if not ckpt.is_dir():
        raise ConfigError(
            f"{ckpt} is already a monolithic checkpoint (one file): nothing to consolidate; pass a sharded checkpoint "
            "folder (with .metadata) or the save folder of an FSDP2 run"
        )
    target = Path(out) if out else default_output(ckpt)
    run = find_run_dir(str(ckpt))
    try:
        target_run = find_run_dir(str(target))
    except ArtifactError:
        target_run = None
    if target_run != run:
        raise ConfigError(
            f"--out {target}: a consolidated checkpoint must stay inside its run folder {run} (eval reads "
            "hbpe_run.json and tokenizer/ beside it); omit --out, or use `hbpe export` for a self-contained copy"
        )
    if target.is_dir():
        raise ConfigError(f"--out {target} is a directory; pass a file name ending in .pt")
    if target.exists() or target.is_symlink():
        if not overwrite:
            raise ConfigError(f"{target} exists; pass --overwrite to replace it, or choose another --out")
        _check_replaceable(target, str(target))
    model, _, _ = load_model(str(ckpt))  # reassembled, and checked against hbpe_run.json
    weights = {f"model.{k}": v for k, v in model.state_dict().items()}  # tied tensors: one storage, saved once
    blob = {"state": {"model": weights}, "consolidated_from": ckpt.name}
    write_file_atomic(target, lambda tmp: torch.save(blob, tmp))
    return {
        "checkpoint": str(ckpt),
        "out": str(target),
        "tensors": len(weights),
        "parameters": sum(p.numel() for p in model.parameters()),
        "bytes": target.stat().st_size,
        "seconds": round(time.perf_counter() - t0, 3),
    }


def _refuse_export(folder: Path) -> None:
    """An export's weights are one file already (its `hbpe_model.json` also names no checkpoint to resolve)."""

    if folder.is_dir() and (folder / MODEL_FILE).is_file():
        raise ConfigError(
            f"{folder} is an `hbpe export` directory: its weights are already a single file ({WEIGHTS_FILE}), so "
            "there is nothing to consolidate; eval, generate and export read it as it is"
        )


def _is_consolidated(path: Path) -> bool:
    """Whether `path` is a file this command wrote: a weights-only checkpoint that records `consolidated_from`."""

    if path.is_symlink() or not path.is_file():
        return False
    try:
        blob = safe_torch_load(path, mmap=True)
    except ArtifactError:
        return False
    return isinstance(blob, dict) and isinstance(blob.get("consolidated_from"), str) and set(blob) == _CONSOLIDATED


_CONSOLIDATED = {"state", "consolidated_from"}  # the keys of what consolidate_checkpoint saves


def _check_replaceable(local: Path, shown: str) -> None:
    """--overwrite replaces an earlier consolidated file only: never the run's own files (hbpe_run.json, its
    tokenizer, a checkpoint), which --out can name inside the run folder."""
    if not _is_consolidated(local):
        raise ConfigError(
            f"--out {shown} exists and is not a consolidated checkpoint (hbpe checkpoint consolidate writes those): "
            "--overwrite replaces only an earlier one; choose another --out, or omit it for the default name"
        )


def _consolidate_remote(checkpoint: str, out: str | None, *, overwrite: bool) -> dict[str, Any]:
    """`consolidate_checkpoint` of a bucket checkpoint: on its local copy (laid out as its run folder), then the
    file is uploaded to its place in the bucket's run folder."""

    t0 = time.perf_counter()
    with localized(checkpoint) as (local, tmp, run_dir):
        _refuse_export(Path(local))
        target = out or storage.join(run_dir, default_output(Path(local)).relative_to(tmp).as_posix())
        if not target.startswith(run_dir + "/"):
            raise ConfigError(
                f"--out {target}: a consolidated checkpoint must stay inside its run folder {run_dir} (eval reads "
                "hbpe_run.json and tokenizer/ beside it); omit --out, or use `hbpe export` for a self-contained copy"
            )
        parent, _, name = target.rpartition("/")
        listed = storage.list_dir(parent)
        if any(n.startswith(name + "/") for n in listed):
            raise ConfigError(f"--out {target} is a folder in the bucket; pass a file name ending in .pt")
        if name in listed:
            if not overwrite:
                raise ConfigError(f"{target} exists; pass --overwrite to replace it, or choose another --out")
            existing = os.path.join(tmp, ".hbpe-existing", name)  # the object itself, beside the run's local copy
            storage.localize_dir(parent, [name], into=os.path.dirname(existing), timeout=CHECKPOINT_TIMEOUT)
            _check_replaceable(Path(existing), target)
        # written under a fresh name in the local copy of the run folder, whatever the run's objects are called
        local_out = os.path.join(tmp, ".hbpe-consolidated", name)
        os.makedirs(os.path.dirname(local_out), exist_ok=True)
        summary = consolidate_checkpoint(local, local_out)
        storage.upload_file(local_out, target)
    return {**summary, "checkpoint": checkpoint, "out": target, "seconds": round(time.perf_counter() - t0, 3)}
