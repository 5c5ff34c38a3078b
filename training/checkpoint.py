"""Load a trained model for eval and generation, safely, from whatever hbpe writes.

`load_model` reads a monolithic Composer `.pt`, a sharded FSDP2 checkpoint folder
(training/consolidate.py reads its model weights in one process), a save folder, or a
`hbpe export` directory (training/export.py: safetensors, no pickle at all).

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
from hbpe.schemas.errors import ArtifactError
from hbpe.schemas.train_config import ModelConfig
from hbpe.training.load_checks import check_tokenizer_shape, check_weight_shapes
from hbpe.training.model import PatchLM, VocabSpec, build_model
from hbpe.training.run_files import RUN_FILE, TOKENIZER_DIR, find_run_dir, read_run_files

_FIX = "use a checkpoint written by `hbpe train` (its save folder's latest-rank0.pt)"


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
            f"contains and whose unpickling could run code; {_FIX}"
        ) from None
    except (RuntimeError, OSError, EOFError, KeyError, ValueError, TypeError, AttributeError, IndexError) as e:
        if "TorchScript" in str(e):
            raise ArtifactError(
                f"{label} is a TorchScript archive (code, not weights) and is refused; {_FIX}"
            ) from None
        detail = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ArtifactError(f"{label} is corrupt ({type(e).__name__}: {detail}); {_FIX}") from None


def safe_torch_load(path: str | os.PathLike, *, mmap: bool = False) -> Any:
    """`torch.load` that never runs code from the file: weights only, plus `_safe_globals`.

    Raises ArtifactError (one line: the file, the problem, the fix) for a missing, empty,
    truncated, random or corrupt file, and for one that holds anything but plain weights.
    `mmap=True` maps tensor storages instead of reading them: a check of a large checkpoint
    then costs the pickle, not the weights.
    """
    p = Path(path)
    if not p.is_file():
        raise ArtifactError(f"checkpoint {p} does not exist or is not a file; {_FIX}")
    size = p.stat().st_size
    # torch.load's errors for these (EOFError, a KeyError on a byte, "failed finding central directory")
    # name neither the file nor the cause; every checkpoint `hbpe train` writes is a complete zip archive
    if not zipfile.is_zipfile(p):
        what = (
            "is empty" if size == 0 else f"is not a PyTorch zip archive ({size} bytes: truncated, or not a checkpoint)"
        )
        raise ArtifactError(f"checkpoint {p} {what}; {_FIX}")
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


def _dcp_metadata(folder: Path) -> Any:
    path = folder / ".metadata"
    if not path.is_file():
        raise ArtifactError(f"{folder} is a directory without .metadata: not a checkpoint; {_FIX}")
    try:
        with path.open("rb") as f:
            md = _DcpMetadataUnpickler(f).load()
    except _RefusedGlobal as e:
        raise ArtifactError(
            f"sharded checkpoint {path} refused: it holds {_refused_what(e)}, which a checkpoint written by "
            f"`hbpe train` never contains and whose unpickling could run code; {_FIX}"
        ) from None
    except Exception as e:  # a truncated or random pickle raises anything from EOFError to MemoryError
        raise ArtifactError(f"sharded checkpoint {path} is corrupt ({type(e).__name__}: {e!s:.200}); {_FIX}") from None
    from torch.distributed.checkpoint.metadata import Metadata

    if not isinstance(md, Metadata):
        raise ArtifactError(f"sharded checkpoint {path} holds a {type(md).__name__}, not checkpoint metadata; {_FIX}")
    return md


def _check_dcp_bytes_items(folder: Path, md: Any, *, only_file: str | None = None) -> None:
    """Load every non-tensor item (of `only_file`, or of all the data files) weights-only."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    for index, info in md.storage_data.items():
        if not isinstance(md.state_dict_metadata.get(index.fqn), BytesStorageMetadata):
            continue
        name = info.relative_path
        if not (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name):
            raise ArtifactError(f"sharded checkpoint {folder}: data file {name!r} is outside the folder; {_FIX}")
        if only_file is not None and name != only_file:
            continue
        if getattr(info, "transform_descriptors", None):
            raise ArtifactError(f"sharded checkpoint {folder}: {index.fqn} is stored transformed; {_FIX}")
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
            "CHECKPOINT_VALIDATION_FUNCTION=training.checkpoint.composer_checkpoint_validator so Composer checks "
            "the downloaded files"
        )
    p = Path(path).resolve()  # Composer's latest-rank0.pt is a symlink
    if p.is_dir():
        _check_dcp_bytes_items(p, _dcp_metadata(p))
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
        _dcp_metadata(p.parent)
    elif specs is not None:
        _check_dcp_bytes_items(p.parent, _dcp_metadata(p.parent), only_file=p.name)
    else:
        ensure_safe_checkpoint(p)
    return True


def resolve_checkpoint(path: str) -> Path:
    """A checkpoint file, a sharded checkpoint folder, or a save folder (its `latest-rank0.pt`, either kind)."""
    p = Path(path)
    if p.is_dir():
        if (p / ".metadata").is_file():  # a sharded checkpoint folder itself (ep0-ba4/)
            return p.resolve()
        latest = p / "latest-rank0.pt"
        if not latest.exists():
            raise ArtifactError(
                f"{p} holds no latest-rank0.pt; pass a checkpoint file, a sharded checkpoint folder (with .metadata), "
                "a `hbpe train` save folder or a `hbpe export` directory"
            )
        return latest.resolve()
    if not p.is_file():
        raise ArtifactError(f"checkpoint {p} does not exist")
    return p


def load_weights(model: PatchLM, weights: dict[str, torch.Tensor], source: str, *, config: str = RUN_FILE) -> None:
    """Every weight of `model` from `weights` (state-dict keys), or one ArtifactError naming what does not fit."""
    try:
        missing, unexpected = model.load_state_dict(weights, strict=False)
    except RuntimeError as e:  # a shape mismatch ("size mismatch for ...")
        detail = str(e).strip().splitlines()[-1].strip()[:200]
        raise ArtifactError(f"{source}: weights do not fit the model in {config} ({detail})") from None
    if missing or unexpected:
        raise ArtifactError(
            f"{source}: weights do not fit the model in {config} (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )


def _monolithic_weights(ckpt: Path) -> dict[str, torch.Tensor]:
    obj = safe_torch_load(ckpt)
    try:
        state = obj["state"]["model"]
        return {k.removeprefix("model."): v for k, v in state.items()}
    except (KeyError, TypeError, AttributeError) as e:
        raise ArtifactError(
            f"{ckpt}: not a Composer checkpoint (no state.model: {e!r}); pass one written by `hbpe train` or "
            "`hbpe checkpoint consolidate`"
        ) from None


def load_model(path: str, *, device: str | torch.device = "cpu") -> tuple[PatchLM, Any, dict]:
    """-> (model in eval mode on `device`, tokenizer, run metadata), from anything hbpe writes.

    `path`: a monolithic `.pt`, a sharded (FSDP2, torch.distributed.checkpoint) checkpoint
    folder, a save folder (its latest checkpoint, either kind), or a `hbpe export` directory;
    local, or in a bucket (copied into a temporary folder first: remote_checkpoint.py).
    Checkpoints build the model from `hbpe_run.json` beside them; an export from its own
    `hbpe_model.json`. The model is whatever `build_model` builds from that config, once the
    description has been checked against the tokenizer and the weights (load_checks.py). An
    io=entropy model's `cfg.entropy_model` then names the checked copy of its entropy model kept in
    the run folder or the export (entropy_files.py).
    """
    from hbpe.training.entropy_files import locate_entropy_model
    from hbpe.training.export import MODEL_FILE, load_exported

    if storage.is_remote(path):
        from hbpe.training.remote_checkpoint import localized

        with localized(path) as (local, tmp, root):
            exported = Path(tmp, MODEL_FILE).is_file()
            model, tok, meta = load_exported(local, device=device) if exported else _load_checkpoint(local, device)
            # the entropy model's copy where it stays (the bucket's run folder or export), not in the temporary copy
            source = storage.join(root, MODEL_FILE if exported else RUN_FILE)
            model.cfg = locate_entropy_model(model.cfg, root, source=source)
            return model, tok, meta
    p = Path(path)
    if p.is_dir() and (p / MODEL_FILE).is_file():
        return load_exported(p, device=device)
    model, tok, meta = _load_checkpoint(path, device)
    run = find_run_dir(str(resolve_checkpoint(path)))
    model.cfg = locate_entropy_model(model.cfg, str(run), source=str(run / RUN_FILE))  # io=entropy: its checked copy
    return model, tok, meta


def _load_checkpoint(path: str, device: str | torch.device) -> tuple[PatchLM, Any, dict]:
    """`load_model` of a local checkpoint (any kind but an export), its entropy model not yet located."""
    ckpt = resolve_checkpoint(path)
    meta, tok = read_run_files(str(ckpt))
    run = find_run_dir(str(ckpt))
    source = str(run / RUN_FILE)
    cfg = ModelConfig(**meta["model"])
    check_tokenizer_shape(meta, tok, source=source, tokenizer=str(run / TOKENIZER_DIR))
    spec = VocabSpec.from_run_meta(meta, source=source)
    if ckpt.is_dir():  # latest-rank0.pt of an FSDP run with the sharded state dict (FSDP2's default)
        from hbpe.training.consolidate import read_sharded_model

        weights = read_sharded_model(ckpt)
    else:
        weights = _monolithic_weights(ckpt)
    check_weight_shapes(cfg, spec, {k: v.shape for k, v in weights.items()}, source=str(ckpt), config=RUN_FILE)
    model = build_model(cfg, spec)
    load_weights(model, weights, str(ckpt))
    return model.to(device).eval(), tok, meta
