"""Load a trained model for eval and generation, safely, from whatever hbpe writes.

`load_model` reads a monolithic Composer `.pt` (safe_load.py: no pickled code runs), a sharded
FSDP2 checkpoint folder (sharded.py reads its model weights in one process), a save folder,
a `hbpe export` directory (export_format.py: safetensors, no pickle at all), or a transformers
`save_pretrained` folder of one (hf_load.py), local or in a bucket (remote.py). An io=entropy model's entropy model is loaded on demand
(`load_entropy_model`, `scheme_for`): the batch builders never load checkpoints themselves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from hbpe.pipeline import storage
from hbpe.schemas.errors import ArtifactError, ConfigError, file_problem
from hbpe.schemas.train_config import ModelConfig
from hbpe.training.checkpoint.entropy_files import locate_entropy_model
from hbpe.training.checkpoint.export_format import load_exported, weights_sha256
from hbpe.training.checkpoint.hf_export import CONFIG_FILE
from hbpe.training.checkpoint.hf_load import is_saved_pretrained, load_saved_pretrained
from hbpe.training.checkpoint.load_checks import check_tokenizer_shape, check_weight_shapes, load_weights
from hbpe.training.checkpoint.names import MODEL_FILE, TOKENIZER_DIR, WEIGHTS_FILE
from hbpe.training.checkpoint.remote import localized
from hbpe.training.checkpoint.run_files import RUN_FILE, find_run_dir, read_run_files
from hbpe.training.checkpoint.safe_load import safe_torch_load
from hbpe.training.checkpoint.sharded import read_sharded_model
from hbpe.training.data.schemes import Scheme, build_scheme
from hbpe.training.model.build import build_model
from hbpe.training.model.entropy_model import EntropyModel
from hbpe.training.model.patch_lm import PatchLM, VocabSpec
from hbpe.training.schemes.registry import scheme_spec


def resolve_checkpoint(path: str) -> Path:
    """A checkpoint file, a sharded checkpoint folder, or a save folder (its `latest-rank0.pt`, either kind)."""
    p = Path(path)
    if p.is_dir():
        if (p / ".metadata").is_file():  # a sharded checkpoint folder itself (ep0-ba4/)
            return p.resolve()
        latest = p / "latest-rank0.pt"
        if not latest.exists():
            raise ArtifactError(
                f"{p} is not a model folder hbpe reads: it is none of an `hbpe export` directory ({MODEL_FILE}), "
                f"a transformers save_pretrained folder ({CONFIG_FILE} and {WEIGHTS_FILE}), an `hbpe train` save "
                "folder (its latest checkpoint, latest-rank0.pt) or a sharded checkpoint folder (.metadata); pass "
                "one of those, or a checkpoint file"
            )
        return latest.resolve()
    problem = file_problem(p)
    if problem is not None:
        raise ArtifactError(
            f"checkpoint {p} {problem}; pass a checkpoint file, a sharded checkpoint folder, a `hbpe train` save "
            "folder or a `hbpe export` directory"
        )
    return p


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
    io=entropy model's `cfg.patching.entropy_model` then names the checked copy of its entropy model kept in
    the run folder or the export (entropy_files.py).
    """
    if storage.is_remote(path):
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
    if p.is_dir() and is_saved_pretrained(p):
        return load_saved_pretrained(p, device=device)
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
    cfg = ModelConfig.from_dict(meta["model"])  # a run of an older hbpe: flat patching keys read too
    check_tokenizer_shape(meta, tok, source=source, tokenizer=str(run / TOKENIZER_DIR))
    spec = VocabSpec.from_run_meta(meta, source=source)
    # a folder: latest-rank0.pt of an FSDP run with the sharded state dict (FSDP2's default)
    weights = read_sharded_model(ckpt) if ckpt.is_dir() else _monolithic_weights(ckpt)
    check_weight_shapes(cfg, spec, {k: v.shape for k, v in weights.items()}, source=str(ckpt), config=RUN_FILE)
    model = build_model(cfg, spec)
    load_weights(model, weights, str(ckpt))
    return model.to(device).eval(), tok, meta


def resolve_entropy_model(cfg: ModelConfig, entropy: Any) -> ModelConfig:
    """`cfg` (io=entropy) with `model.patching.entropy_model` resolved and its fingerprint recorded, at train time.

    `entropy` is the loaded EntropyModel. A fingerprint given in the config pins the model: another one
    is refused (and autoresume compares the recorded one with the model found now).
    """
    pinned = cfg.patching.entropy_model_sha256
    if pinned is not None and pinned != entropy_sha256(entropy):
        raise ConfigError(
            f"model.patching.entropy_model={cfg.patching.entropy_model} has the fingerprint {entropy_sha256(entropy)}, "
            "not the "
            f"model.patching.entropy_model_sha256={pinned} the config asks for: it is another entropy model; name the "
            "checkpoint with that fingerprint, or drop model.patching.entropy_model_sha256 to use this one"
        )
    return cfg.with_patching(entropy_model=entropy.source, entropy_model_sha256=entropy_sha256(entropy))


def entropy_of(cfg: ModelConfig) -> Any:
    """The EntropyModel an io=entropy `cfg` names (located and checked when its model was loaded): `hbpe export`
    reads it before it writes anything, so an export over its own folder still finds it."""
    entropy = load_entropy_model(cfg.patching.entropy_model)
    if cfg.patching.entropy_model_sha256 not in (None, entropy_sha256(entropy)):
        raise ArtifactError(
            f"the entropy model {cfg.patching.entropy_model} changed after it was checked "
            f"(fingerprint {entropy_sha256(entropy)[:12]}"
            f"..., recorded {cfg.patching.entropy_model_sha256[:12]}...); export again"
        )
    return entropy


def entropy_sha256(entropy: EntropyModel) -> str:
    """An entropy model's fingerprint: the sha256 of its weights as `hbpe export` writes them
    (model.patching.entropy_model_sha256); computed once per loaded model."""
    if not hasattr(entropy, "_sha256"):
        entropy._sha256 = weights_sha256(entropy.model)
    return entropy._sha256


def load_entropy_model(checkpoint: str, *, device: str | torch.device = "cpu") -> EntropyModel:
    """The byte-level model `model.patching.entropy_model` names, as an EntropyModel (any form `load_model` reads)."""
    # resolved once: relative to the directory `hbpe train` runs in, never to where the run is read later
    where = checkpoint if storage.is_remote(checkpoint) else str(Path(checkpoint).resolve())
    if not storage.is_remote(checkpoint) and not Path(where).exists():
        raise ArtifactError(
            f"model.patching.entropy_model={checkpoint}: no such checkpoint (looked for {where}); train the byte-level "
            "entropy model first (hbpe train ... model.io=bytes) and name its save folder or .pt file"
        )
    model, tok, _ = load_model(where, device=device)
    return EntropyModel(model, source=where, tok=tok)


def scheme_for(
    cfg: ModelConfig, tok: Any, *, derive: bool, device: str | torch.device = "cpu", entropy: EntropyModel | None = None
) -> Scheme:
    """`build_scheme` for a model config, its entropy model (io=entropy) loaded here unless `entropy` is given."""
    if scheme_spec(cfg).uses_entropy_model and entropy is None and cfg.patching.entropy_threshold is not None:
        entropy = load_entropy_model(cfg.patching.entropy_model, device=device)
    return build_scheme(cfg, tok, derive=derive, entropy_model=entropy)
