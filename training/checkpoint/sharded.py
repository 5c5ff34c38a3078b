"""Sharded checkpoints (FSDP2's default, torch.distributed.checkpoint folders): their model weights read in one
process, as plain full tensors, without a process group and without unpickling anything unsafely
(consolidate.py writes them as one `.pt`)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import torch

from hbpe.schemas.errors import ArtifactError
from hbpe.schemas.names import is_plain_file_name
from hbpe.training.checkpoint.safe_load import FIX, dcp_metadata

MODEL_PREFIX = "state.model."  # Composer's state dict: state.model.<ComposerModel attribute `model`>.<fqn>


def _check_data_files(folder: Path, md: Any) -> None:
    for info in md.storage_data.values():
        name = info.relative_path
        if not is_plain_file_name(name):
            raise ArtifactError(f"sharded checkpoint {folder}: data file {name!r} is outside the folder; {FIX}")


def _safe_reader(folder: Path):
    """torch's FileSystemReader with hbpe's `.metadata` unpickler, reading tensors only."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta
    from torch.distributed.checkpoint.planner import LoadItemType

    class SafeReader(FileSystemReader):
        def read_metadata(self):  # torch's: pickle.load
            md = dcp_metadata(folder)
            if getattr(md, "storage_meta", None) is None:
                md.storage_meta = StorageMeta()
            md.storage_meta.load_id = self.load_id
            return md

        def read_data(self, plan, planner):
            for item in plan.items:  # a non-tensor item is a torch.save blob torch loads with weights_only=False
                if item.type == LoadItemType.BYTE_IO:
                    raise ArtifactError(f"sharded checkpoint {folder}: refusing to read non-tensor item {item}")
            return super().read_data(plan, planner)

    return SafeReader(str(folder))


def read_sharded_model(folder: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The model's weights from a DCP checkpoint folder -> {fqn: full tensor}, keys as `PatchLM.state_dict()`."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    folder = Path(folder)
    md = dcp_metadata(folder)
    _check_data_files(folder, md)
    prefix = MODEL_PREFIX + "model."
    state = {
        fqn: torch.empty(item.size, dtype=item.properties.dtype)
        for fqn, item in md.state_dict_metadata.items()
        if fqn.startswith(prefix) and isinstance(item, TensorStorageMetadata)
    }
    if not state:
        raise ArtifactError(f"sharded checkpoint {folder} holds no model weights (no {prefix}* tensors); {FIX}")
    with warnings.catch_warnings():  # "torch.distributed is ... uninitialized, assuming ... a single process": yes
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.distributed")
        try:
            dcp.load(state, storage_reader=_safe_reader(folder), no_dist=True)
        except CheckpointException as e:  # a BaseException around what the reader raised (a missing, short file)
            exc = next(iter(e.failures.values()))[0]
            if isinstance(exc, ArtifactError):
                raise exc from None
            detail = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:200]
            raise ArtifactError(
                f"sharded checkpoint {folder} is damaged ({type(exc).__name__}: {detail}); {FIX}"
            ) from None
    return {k.removeprefix(prefix): v for k, v in state.items()}
