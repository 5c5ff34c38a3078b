"""Checkpoint files opened without running their code: the weights-only unpickler and its allow-list.

A `.pt` file is a zip archive around a pickle, and unpickling can call any Python
function, so a crafted checkpoint would run code on `hbpe eval` or on resumption.
Every checkpoint hbpe reads goes through `torch.load(weights_only=True)`, whose
unpickler builds only tensors, containers and primitives, plus the few extra types a
checkpoint written by `hbpe train` really holds (`_safe_globals`). Anything else is
refused with one ArtifactError line, before any of it is built.

Composer's own loading (`load_path`, `autoresume`) unpickles with `weights_only=False`
(and torch.distributed.checkpoint, for sharded FSDP checkpoints, with plain `pickle.load`);
`ensure_safe_checkpoint` is the check to run on a path before Composer opens it, and
`composer_checkpoint_validator` is the same check in the shape of Composer's
`CHECKPOINT_VALIDATION_FUNCTION` hook, which runs right before each of its loads.
"""

from __future__ import annotations

import io
import os
import pickle
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

from hbpe.pipeline import storage
from hbpe.schemas.errors import ArtifactError, file_problem
from hbpe.schemas.names import is_plain_file_name

FIX = "use a checkpoint written by `hbpe train` (its save folder's latest-rank0.pt)"


def _safe_globals() -> list[Any]:
    """The non-tensor types in a Composer checkpoint from `hbpe train`, found by loading one with none allowed.

    - datetime.timedelta: the wall-clock fields of Composer's Timestamp;
    - TorchVersion: `state.metadata.torch_version` (a str subclass);
    - numpy ndarray/dtype + `_reconstruct`: numpy's RNG state in `rng` (a uint32 array), under
      both module spellings (numpy 2 pickles `numpy._core`, numpy 1 `numpy.core`). Only numeric
      dtype classes are allowed, so numpy's pickle of an object array is refused (and any array
      could only hold what this unpickler builds anyway: no code runs).
    """
    import datetime

    import numpy as np
    from torch.torch_version import TorchVersion

    np_core = getattr(np, "_core", None) or np.core
    reconstruct = np_core.multiarray._reconstruct
    numeric = (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
    numeric += (np.float16, np.float32, np.float64)
    return [
        datetime.timedelta,
        TorchVersion,
        np.ndarray,
        np.dtype,
        (reconstruct, "numpy._core.multiarray._reconstruct"),
        (reconstruct, "numpy.core.multiarray._reconstruct"),
        *{type(np.dtype(t)) for t in numeric},
    ]


def _refused_what(err: Exception) -> str:
    """A short name for what the weights-only unpickler refused (its own message spans several lines)."""
    text = str(err)
    for pattern in (r"GLOBAL ([\w.]+)", r"got <class '([\w.]+)'>", r"(Unsupported operand \d+)"):
        m = re.search(pattern, text)
        if m:
            return m.group(1)
    return text.strip().splitlines()[-1][:200] if text.strip() else type(err).__name__


def _weights_only_load(source: Path | io.BytesIO, label: str, *, mmap: bool = False) -> Any:
    """torch.load(weights_only=True) + `_safe_globals`; every failure is one ArtifactError line about `label`."""
    try:
        with warnings.catch_warnings(), torch.serialization.safe_globals(_safe_globals()):
            # a crafted pickle may use a newer protocol; the refusal below says all there is to say
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            warnings.filterwarnings("ignore", message=".*looks like a TorchScript archive", category=UserWarning)
            return torch.load(source, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        raise ArtifactError(
            f"{label} refused: it holds {_refused_what(e)}, which a checkpoint written by `hbpe train` never "
            f"contains and whose unpickling could run code; {FIX}"
        ) from None
    except (RuntimeError, OSError, EOFError, KeyError, ValueError, TypeError, AttributeError, IndexError) as e:
        if "TorchScript" in str(e):
            raise ArtifactError(f"{label} is a TorchScript archive (code, not weights) and is refused; {FIX}") from None
        detail = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ArtifactError(f"{label} is corrupt ({type(e).__name__}: {detail}); {FIX}") from None


def safe_torch_load(path: str | os.PathLike, *, mmap: bool = False) -> Any:
    """`torch.load` that never runs code from the file: weights only, plus `_safe_globals`.

    Raises ArtifactError (one line: the file, the problem, the fix) for a missing, empty,
    truncated, random or corrupt file, and for one that holds anything but plain weights.
    `mmap=True` maps tensor storages instead of reading them: a check of a large checkpoint
    then costs the pickle, not the weights.
    """
    p = Path(path)
    problem = file_problem(p)
    if problem is not None:
        raise ArtifactError(f"checkpoint {p} {problem}; {FIX}")
    size = p.stat().st_size
    # torch.load's errors for these (EOFError, a KeyError on a byte, "failed finding central directory")
    # name neither the file nor the cause; every checkpoint `hbpe train` writes is a complete zip archive
    if not zipfile.is_zipfile(p):
        what = (
            "is empty" if size == 0 else f"is not a PyTorch zip archive ({size} bytes: truncated, or not a checkpoint)"
        )
        raise ArtifactError(f"checkpoint {p} {what}; {FIX}")
    return _weights_only_load(p, f"checkpoint {p}", mmap=mmap)


# ---- sharded checkpoints (torch.distributed.checkpoint: DIR/.metadata + DIR/__{rank}_0.distcp)
# `.metadata` is a plain pickle (protocol 4, which torch's weights-only unpickler cannot read) that
# torch unpickles with pickle.load; non-tensor state ("bytes items": timestamps, RNG, optimizer
# hyperparameters) sits inside the .distcp files as torch.save blobs, loaded with weights_only=False.
# So the metadata is read with a find_class allow-list (Python's documented way to restrict
# unpickling) and every bytes item with `_weights_only_load`; tensors are already loaded weights-only.

_DCP_METADATA_GLOBALS = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "ChunkStorageMetadata",
        "BytesStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},  # and the dtypes, checked by value in find_class
    "pathlib": {"PosixPath", "PurePosixPath"},
    "pathlib._local": {"PosixPath", "PurePosixPath"},  # the same classes, as Python 3.13 pickles them
    "collections": {"OrderedDict"},
}


class _RefusedGlobal(pickle.UnpicklingError):
    """A global outside the allow-list (plain pickle also raises UnpicklingError for truncated data)."""


class _DcpMetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if dtype or name in _DCP_METADATA_GLOBALS.get(module, ()):
            return super().find_class(module, name)
        raise _RefusedGlobal(f"GLOBAL {module}.{name}")


def dcp_metadata(folder: Path) -> Any:
    path = folder / ".metadata"
    if not path.is_file():
        raise ArtifactError(f"{folder} is a directory without .metadata: not a checkpoint; {FIX}")
    try:
        with path.open("rb") as f:
            md = _DcpMetadataUnpickler(f).load()
    except _RefusedGlobal as e:
        raise ArtifactError(
            f"sharded checkpoint {path} refused: it holds {_refused_what(e)}, which a checkpoint written by "
            f"`hbpe train` never contains and whose unpickling could run code; {FIX}"
        ) from None
    except Exception as e:  # a truncated or random pickle raises anything from EOFError to MemoryError
        raise ArtifactError(f"sharded checkpoint {path} is corrupt ({type(e).__name__}: {e!s:.200}); {FIX}") from None
    from torch.distributed.checkpoint.metadata import Metadata

    if not isinstance(md, Metadata):
        raise ArtifactError(f"sharded checkpoint {path} holds a {type(md).__name__}, not checkpoint metadata; {FIX}")
    return md


def _check_dcp_bytes_items(folder: Path, md: Any, *, only_file: str | None = None) -> None:
    """Load every non-tensor item (of `only_file`, or of all the data files) weights-only."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    for index, info in md.storage_data.items():
        if not isinstance(md.state_dict_metadata.get(index.fqn), BytesStorageMetadata):
            continue
        name = info.relative_path
        if not is_plain_file_name(name):
            raise ArtifactError(f"sharded checkpoint {folder}: data file {name!r} is outside the folder; {FIX}")
        if only_file is not None and name != only_file:
            continue
        if getattr(info, "transform_descriptors", None):
            raise ArtifactError(f"sharded checkpoint {folder}: {index.fqn} is stored transformed; {FIX}")
        with (folder / name).open("rb") as f:
            f.seek(info.offset)
            blob = f.read(info.length)
        _weights_only_load(io.BytesIO(blob), f"sharded checkpoint {folder / name}: item {index.fqn}")


def ensure_safe_checkpoint(path: str | os.PathLike) -> None:
    """Refuse (ArtifactError) a local checkpoint that Composer's unsafe unpickling must not open.

    Call it on Composer's `load_path` and on what autoresume would pick (`latest-rank{rank}.pt`
    in the save folder, a symlink to a `.pt` file or, for sharded FSDP checkpoints, to a folder),
    before the Trainer is built. A `.pt` file is unpickled whole with the weights-only unpickler
    (storages memory-mapped, so the weights are not read twice); a sharded folder has its
    `.metadata` and every non-tensor item checked.
    """
    if storage.is_remote(path):
        raise ArtifactError(
            f"{path}: remote checkpoints are not verified before loading; copy it to a local path first, or set "
            "CHECKPOINT_VALIDATION_FUNCTION=hbpe.training.checkpoint.safe_load.composer_checkpoint_validator so Composer checks "
            "the downloaded files"
        )
    p = Path(path).resolve()  # Composer's latest-rank0.pt is a symlink
    if p.is_dir():
        _check_dcp_bytes_items(p, dcp_metadata(p))
        return
    safe_torch_load(p, mmap=True)


def composer_checkpoint_validator(path: str | os.PathLike, specs: list[tuple[int, int]] | None = None) -> bool:
    """`ensure_safe_checkpoint` in the shape of Composer's `CHECKPOINT_VALIDATION_FUNCTION` hook (env var).

    Composer calls it on the local file right before each load of a checkpoint, after any
    download, so it also covers remote `load_path`s and autoresume. It raises our
    ArtifactError instead of returning False, so the user sees which file and why. For a
    sharded checkpoint Composer passes `.metadata`, then each data file with `specs`
    (the byte ranges it will read); a data file may only just have been downloaded, so its
    items are checked when it is named.
    """
    p = Path(path)
    if p.name == ".metadata":
        dcp_metadata(p.parent)
    elif specs is not None:
        _check_dcp_bytes_items(p.parent, dcp_metadata(p.parent), only_file=p.name)
    else:
        ensure_safe_checkpoint(p)
    return True
