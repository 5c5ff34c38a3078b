"""The model a config names: `model.io`'s PatchIO (its scheme's, training/schemes/) around the latent transformer.

Apart from patch_lm.py so that the model's modules never import the scheme registry: `hbpe export --format hf`
ships them in the export folder (training/checkpoint/hf_library.py), where only the hierarchical model is built.
"""

from __future__ import annotations

from hbpe.schemas.train_config import ModelConfig
from hbpe.training.model.patch_lm import PatchLM, VocabSpec
from hbpe.training.schemes.registry import scheme_spec


def build_model(cfg: ModelConfig, spec: VocabSpec) -> PatchLM:
    """The model `cfg.io` names, shaped by the tokenizer's `spec` (VocabSpec.from_tokenizer / from_run_meta)."""
    return PatchLM(cfg, scheme_spec(cfg).build_io(cfg, spec))
