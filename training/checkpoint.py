"""Load a trained model from a Composer checkpoint (monolithic `.pt`) for eval and generation."""

from __future__ import annotations

from pathlib import Path

import torch

from schemas.errors import ArtifactError
from schemas.train_config import ModelConfig
from training.model import PatchLM, build_model
from training.run_files import read_run_files


def resolve_checkpoint(path: str) -> Path:
    """A checkpoint file, or a save folder (its `latest-rank0.pt`)."""
    p = Path(path)
    if p.is_dir():
        latest = p / "latest-rank0.pt"
        if not latest.exists():
            raise ArtifactError(f"{p} holds no latest-rank0.pt; pass a checkpoint file")
        return latest.resolve()
    if not p.is_file():
        raise ArtifactError(f"checkpoint {p} does not exist")
    return p


def load_model(path: str, *, device: str = "cpu") -> tuple[PatchLM, object, dict]:
    """-> (model in eval mode, tokenizer, run metadata)."""
    ckpt = resolve_checkpoint(path)
    meta, tok = read_run_files(str(ckpt))
    cfg = ModelConfig(**meta["model"])
    model = build_model(
        cfg, vocab_size=meta["vocab_size"], max_patch_size=meta["max_patch_size"], n_vocab=meta["n_vocab"]
    )
    try:
        state = torch.load(ckpt, map_location="cpu", weights_only=False)["state"]["model"]
    except (KeyError, RuntimeError, OSError) as e:
        raise ArtifactError(
            f"{ckpt}: not a monolithic Composer checkpoint ({e}); sharded FSDP checkpoints need `composer` to consolidate"
        ) from e
    weights = {k.removeprefix("model."): v for k, v in state.items()}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise ArtifactError(
            f"{ckpt}: weights do not fit the model in hbpe_run.json (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    return model.to(device).eval(), tok, meta
