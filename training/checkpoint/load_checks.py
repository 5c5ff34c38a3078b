"""What a model description must agree with before the model is built from it.

`hbpe_run.json` and `hbpe_model.json` are untrusted (edited, damaged, swapped files). Their sizes
are bounded by ModelConfig (schemas/train_config.py); these checks tie them to what is really
beside them, before a tensor is allocated:

- the tokenizer has the V', S and first-stage vocabulary the description names: a fingerprint can
  be copied along with a swapped tokenizer, and an S=6 tokenizer under a model built for S=10
  indexed out of range deep inside the model;
- the weights hold the tensors, of the shapes, that the described model has: the model is built on
  PyTorch's `meta` device (shapes only, no memory) and compared with the weights file's header or
  the loaded checkpoint, so a config within every bound but not its weights allocates nothing;
- every weight is finite: a diverged run writes NaN or inf into a checkpoint (and into an export,
  whose sha256 then matches), which generated NUL bytes or crashed sampling.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from hbpe.schemas.errors import ArtifactError
from hbpe.schemas.train_config import ModelConfig
from hbpe.training.checkpoint.run_files import RUN_FILE
from hbpe.training.model.build import build_model
from hbpe.training.model.patch_lm import PatchLM, VocabSpec


def tokenizer_shape(tok: Any) -> dict[str, int]:
    """What a model's shape takes from its tokenizer, as hbpe_run.json and hbpe_model.json record it."""
    return {
        "vocab_size": tok.vocab_size,
        "max_patch_size": tok.max_patch_size,
        "n_vocab": tok.encoding.max_token_value + 1,
    }


def check_tokenizer_shape(meta: Mapping[str, Any], tok: Any, *, source: str, tokenizer: str) -> None:
    """The tokenizer in folder `tokenizer` has the sizes description `source` records, or one ArtifactError."""
    wrong = {name: value for name, value in tokenizer_shape(tok).items() if meta.get(name) != value}
    if wrong:
        has = ", ".join(f"{name}={value}" for name, value in wrong.items())
        described = ", ".join(f"{name}={meta.get(name)!r}" for name in wrong)
        raise ArtifactError(
            f"{tokenizer} does not fit {source}: the tokenizer has {has}, the model in {source} was built for "
            f"{described}; the folder was modified: restore the tokenizer the model was trained with (a copy of the "
            "run or of the export)"
        )


def check_weight_shapes(
    cfg: ModelConfig, spec: VocabSpec, shapes: Mapping[str, Sequence[int]], *, source: str, config: str
) -> None:
    """The model `cfg` describes has exactly the tensors `shapes` names ({state-dict key: shape}), or ArtifactError.

    Built on the meta device: no memory, whatever the config asks for.
    """
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in build_model(cfg, spec).state_dict().items()}
    missing = [k for k in expected if k not in shapes]
    unexpected = [k for k in shapes if k not in expected]
    if missing or unexpected:
        raise ArtifactError(
            f"{source}: weights do not fit the model in {config} (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    for name, shape in expected.items():
        if tuple(shapes[name]) != shape:
            raise ArtifactError(
                f"{source}: weights do not fit the model in {config} (size mismatch for {name}: the weights hold "
                f"{list(shapes[name])}, the model {list(shape)})"
            )


def check_finite_weights(weights: Mapping[str, torch.Tensor], source: str) -> None:
    """Every floating-point tensor of `weights` is finite, or one ArtifactError naming the first that is not.

    By each tensor's minimum and maximum, which are NaN if any value is and +-inf if any is: 8x faster than
    `torch.isfinite(t).all()` on CPU (75 ms against 600 ms of one core for the 97M weights of the `small` config).
    """
    for name, t in weights.items():
        if not t.is_floating_point() or t.numel() == 0:
            continue
        lo, hi = torch.aminmax(t)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            bad = t.numel() - int(torch.isfinite(t).sum())
            raise ArtifactError(
                f"{source}: weight {name} holds {bad} non-finite values (NaN or inf) of {t.numel()}: the training run "
                "diverged (or the file was damaged) before this checkpoint was written; load an earlier checkpoint "
                "of the run (for an export: `hbpe export` an earlier checkpoint)"
            )


def load_weights(model: PatchLM, weights: dict[str, torch.Tensor], source: str, *, config: str = RUN_FILE) -> None:
    """Every weight of `model` from `weights` (state-dict keys), or one ArtifactError naming what does not fit
    or is not finite."""
    check_finite_weights(weights, source)
    try:
        missing, unexpected = model.load_state_dict(weights, strict=False)
    except RuntimeError as e:  # a shape mismatch ("size mismatch for ...")
        detail = str(e).strip().splitlines()[-1].strip()[:200]
        raise ArtifactError(f"{source}: weights do not fit the model in {config} ({detail})") from None
    if missing or unexpected:
        raise ArtifactError(
            f"{source}: weights do not fit the model in {config} (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
