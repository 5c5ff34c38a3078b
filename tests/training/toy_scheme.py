"""A sixth scheme in one file, as a user would add one: fixed-width byte patching (`model.io=fixed`).

Every patch holds `model.patching.max_bytes` bytes (+ EOP), wherever it falls in the text: space.py's
byte patches with a patcher that never starts a patch, so only the maximum length cuts. Importing
this module registers it (tests/training/test_scheme_registry.py trains it through the real trainer).
Its generation and zero-shot hooks are space.py's, which cut a prompt by space patching: a real scheme
would give them its own patcher as well.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hbpe.schemas.train_config import ModelConfig
from hbpe.training.data.schemes import BytePatchScheme, vocabulary_bytes
from hbpe.training.schemes.registry import register_scheme
from hbpe.training.schemes.space import SpaceSpec, eop


class NoBoundaries:
    """A patcher (BytePatchScheme's `entropy` hook) under every threshold: no patch starts but the forced ones."""

    def entropies(self, units: list[np.ndarray]) -> list[np.ndarray]:
        return [np.zeros(len(u), dtype=np.float32) for u in units]


class FixedSpec(SpaceSpec):
    name = "fixed"

    def batches(self, cfg: ModelConfig, tok: Any, *, derive: bool, entropy: Any = None) -> BytePatchScheme:
        width = self.symbols_per_patch(cfg)
        return BytePatchScheme(
            vocabulary_bytes(tok), cfg.patching.max_bytes, NoBoundaries(), 1.0, width=width, eop=eop(cfg)
        )

    def label(self, cfg: ModelConfig) -> str:
        return f"fixed patch, {cfg.patching.max_bytes} bytes"


register_scheme(FixedSpec())
