"""The entropy model an `io=entropy` run was trained with, kept with the run and checked wherever it loads.

Entropy patching cuts a run's patches with its entropy model, so the run means something only
with that very model. `model.patching.entropy_model` used to be kept as given to `hbpe train` (relative to
the directory it ran in): evaluated from elsewhere, whatever had that name there was used, silently
(BPB 14.34 instead of 10.08). Now:

- `hbpe train` resolves the path (absolute, or a URI), records the model's fingerprint,
  `model.patching.entropy_model_sha256` (the sha256 of its weights as `hbpe export` writes them), and writes
  the model itself into the run folder as an export, `RUN/entropy_model/` (safetensors, no pickle);
- `hbpe export` copies it into the export, `EXPORT/entropy_model/`: an export is self-contained;
- loading a run or an export (eval, generate, export, eval-tasks) points `model.patching.entropy_model` at
  that copy after checking its fingerprint (`locate_entropy_model`). A run from an older hbpe (no
  fingerprint, no copy) falls back to the path it recorded, with a warning; a missing model is an
  error naming the run's `model.patching.entropy_model`, the path looked for and the fix.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from hbpe.pipeline import storage
from hbpe.schemas.errors import ArtifactError
from hbpe.schemas.train_config import ModelConfig
from hbpe.training.checkpoint.names import ENTROPY_DIR, MODEL_FILE
from hbpe.training.schemes.registry import scheme_spec

log = logging.getLogger(__name__)


def locate_entropy_model(cfg: ModelConfig, folder: str, *, source: str) -> ModelConfig:
    """`cfg` with `model.patching.entropy_model` at the checked copy in `folder` (a run folder or an export, local or a
    URI) that description `source` (its hbpe_run.json or hbpe_model.json) was trained with; non-entropy: `cfg`."""
    if not scheme_spec(cfg).uses_entropy_model:
        return cfg
    copy = storage.join(folder, ENTROPY_DIR)
    raw = storage.read_if_exists(storage.join(copy, MODEL_FILE))
    if raw is not None:
        recorded = _copy_fingerprint(raw, storage.join(copy, MODEL_FILE))
        if cfg.patching.entropy_model_sha256 is not None and recorded != cfg.patching.entropy_model_sha256:
            raise ArtifactError(
                f"{copy} is not the entropy model {source} was trained with (its weights' sha256 {recorded[:12]}..., "
                f"the run's model.patching.entropy_model_sha256 {cfg.patching.entropy_model_sha256[:12]}...): the folder "
                "was modified; "
                f"restore {ENTROPY_DIR}/ from a copy of the run, or export the run again"
            )
        return cfg.with_patching(entropy_model=copy)  # its weights are checked against `recorded` on load
    if cfg.patching.entropy_model_sha256 is not None:
        raise ArtifactError(
            f"{source}: the run's entropy model (model.patching.entropy_model={cfg.patching.entropy_model}) was copied "
            f"into {copy} "
            f"when it was trained, and {copy} is missing; restore {ENTROPY_DIR}/ from a copy of the run (or the "
            "bucket), or `hbpe export` the run where it is complete"
        )
    return _legacy(cfg, source=source)


def _copy_fingerprint(raw: bytes, path: str) -> str:
    try:
        sha = json.loads(raw).get("weights_sha256")
    except (ValueError, AttributeError):
        sha = None
    if not isinstance(sha, str):
        raise ArtifactError(f"{path} is not an hbpe export's description with a weights sha256; restore the folder")
    return sha


def _legacy(cfg: ModelConfig, *, source: str) -> ModelConfig:
    """A run trained before hbpe kept its entropy model: the path it recorded, relative to the current directory
    (as that hbpe read it), with a warning: nothing can tell whether it is still the same model."""
    path = cfg.patching.entropy_model
    looked = path if storage.is_remote(path) else str(Path(path).absolute())
    if not storage.is_remote(path) and not Path(looked).exists():
        raise ArtifactError(
            f"{source}: the run's model.patching.entropy_model={path} (its entropy model) is not at {looked}; the run "
            "was trained by an older hbpe, which kept only that path: run from the directory it was trained in, or set "
            f"model.patching.entropy_model in {source} to the byte-level checkpoint it was trained with, then "
            "`hbpe export` the run (the export keeps a checked copy)"
        )
    log.warning(
        "%s: the run's model.patching.entropy_model=%s is read from %s, unchecked: the run was trained by an older "
        "hbpe, "
        "which kept no copy or fingerprint of it; if that is not the model it was trained with, BPB and samples "
        "are wrong. `hbpe export` the run to keep a checked copy",
        source,
        path,
        looked,
    )
    return cfg.with_patching(entropy_model=looked)
