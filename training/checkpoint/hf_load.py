"""`hbpe eval` / `hbpe generate` on a transformers `save_pretrained` folder of an HbpeForCausalLM.

Such a folder holds config.json (with hbpe's model config under `hbpe_model`, which `hbpe export
--format hf` writes and save_pretrained keeps), model.safetensors (a tensor shared under two names
stored once) and, when the tokenizer was saved beside it, tokenizer/; no hbpe_model.json. It is
read as `load_exported` reads an export: the tokenizer's shape and the weights' names and shapes are
checked before anything is built (load_checks.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from hbpe.pipeline.tokenizer import artifact
from hbpe.schemas.errors import ArtifactError, ConfigError, file_problem
from hbpe.schemas.train_config import ModelConfig
from hbpe.training.checkpoint.export_format import tied_weights
from hbpe.training.checkpoint.hf_export import CONFIG_FILE, HBPE_MODEL_KEY
from hbpe.training.checkpoint.load_checks import (
    check_tokenizer_shape,
    check_weight_shapes,
    load_weights,
    tokenizer_shape,
)
from hbpe.training.checkpoint.names import TOKENIZER_DIR, WEIGHTS_FILE
from hbpe.training.model.build import build_model
from hbpe.training.model.patch_lm import PatchLM, VocabSpec

MAX_CONFIG_BYTES = 16 << 20  # a config.json is a few KB; hbpe_model inside it is a few hundred bytes


def is_saved_pretrained(folder: Path) -> bool:
    """A transformers folder (`save_pretrained`, or an `hbpe export --format hf` without its hbpe_model.json)."""
    return (folder / CONFIG_FILE).is_file() and (folder / WEIGHTS_FILE).is_file()


def load_saved_pretrained(folder: Path, *, device: str | torch.device = "cpu") -> tuple[PatchLM, Any, dict]:
    """A `save_pretrained` folder of an HbpeForCausalLM (config.json, model.safetensors, the tokenizer's tokenizer/)
    -> (hbpe's model in eval mode on `device`, tokenizer, its description), as `load_exported` reads an export."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = folder / CONFIG_FILE
    for file in (path, folder / WEIGHTS_FILE):  # a FIFO or /dev/zero in their place would hang or fill memory
        if (problem := file_problem(file)) is not None:
            raise ArtifactError(f"{file} {problem}; save the model again with save_pretrained")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ArtifactError(f"{path} is over {MAX_CONFIG_BYTES >> 20} MiB, no config.json is; save the model again")
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ArtifactError(f"{path} is not readable JSON ({e}); save the model again with save_pretrained") from None
    described = config.get(HBPE_MODEL_KEY) if isinstance(config, dict) else None
    if not isinstance(described, dict) or config.get("model_type") != "hbpe":
        raise ArtifactError(
            f"{path} does not describe an hbpe model (model_type 'hbpe' and {HBPE_MODEL_KEY!r}, as `hbpe export "
            "--format hf` writes them); pass an hbpe model's folder"
        )
    if not (folder / TOKENIZER_DIR).is_dir():
        raise ArtifactError(
            f"{folder} holds the model but not its tokenizer ({TOKENIZER_DIR}/); save the tokenizer into the same "
            "folder (tokenizer.save_pretrained(DIR))"
        )
    tok = artifact.load(folder / TOKENIZER_DIR)
    try:
        cfg = ModelConfig.from_dict(described)  # every size bounded, as an export's description is read
    except (TypeError, ConfigError) as e:
        raise ArtifactError(f"{path}: {HBPE_MODEL_KEY} does not fit this hbpe ({e}); export the model again") from None
    check_tokenizer_shape(
        {**tokenizer_shape(tok), "vocab_size": config.get("symbol_vocab_size"), "max_patch_size": config.get("max_patch_size")},
        tok, source=str(path), tokenizer=str(folder / TOKENIZER_DIR),
    )  # fmt: skip
    spec = VocabSpec.from_run_meta(tokenizer_shape(tok), source=str(path))
    try:
        weights = load_file(folder / WEIGHTS_FILE)
    except (SafetensorError, OSError) as e:
        raise ArtifactError(f"{folder / WEIGHTS_FILE} is missing or corrupt ({e}); save the model again") from None
    model = build_model(cfg, spec)
    for alias, name in tied_weights(model).items():  # save_pretrained stores a shared tensor once
        if alias not in weights and name in weights:
            weights[alias] = weights[name]
    check_weight_shapes(
        cfg, spec, {k: v.shape for k, v in weights.items()}, source=str(folder / WEIGHTS_FILE), config=CONFIG_FILE
    )
    load_weights(model, {k: v.float() for k, v in weights.items()}, str(folder / WEIGHTS_FILE), config=CONFIG_FILE)
    meta = {
        "model": described, **tokenizer_shape(tok), "tokenizer_fingerprint": tok.fingerprint,
        "source": {"save_pretrained": str(folder.absolute())},
    }  # fmt: skip
    return model.to(device).eval(), tok, meta
