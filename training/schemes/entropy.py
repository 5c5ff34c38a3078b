"""entropy (BLT's entropy patching): space.py's byte patches, cut where a byte LM's next-byte entropy exceeds a
threshold. The byte LM (a `bytes` run, model.patching.entropy_model) is loaded by the caller (checkpoint/load.py)."""

from __future__ import annotations

from typing import Any

from hbpe.schemas.errors import ConfigError
from hbpe.schemas.train_config import ModelConfig
from hbpe.training.checkpoint.load import load_entropy_model
from hbpe.training.data.byte_patching import UNBOUNDED_SAFETY_LIMIT
from hbpe.training.data.schemes import BytePatchScheme, vocabulary_bytes
from hbpe.training.schemes.registry import register_scheme
from hbpe.training.schemes.space import SpaceSpec, eop


class EntropySpec(SpaceSpec):
    name = "entropy"
    uses_entropy_model = True

    def max_patch_bytes(self, cfg: ModelConfig) -> int:
        # unbounded (model.patching.entropy_bounded=false): split only at the safety limit, padded to the batch's longest
        return cfg.patching.max_bytes if cfg.patching.entropy_bounded else UNBOUNDED_SAFETY_LIMIT

    def patcher_model(self, cfg: ModelConfig) -> Any:
        return load_entropy_model(cfg.patching.entropy_model)

    def batches(self, cfg: ModelConfig, tok: Any, *, derive: bool, entropy: Any = None) -> BytePatchScheme:
        if cfg.patching.entropy_threshold is None:
            raise ConfigError(
                "model.io=entropy needs model.patching.entropy_threshold, or model.patching.entropy_target_bytes to "
                "choose one on the training shards (hbpe train does); e.g. model.patching.entropy_target_bytes=4.5"
            )
        if entropy is None:  # loading it is checkpoint/load.py's (scheme_for): the batch builders read no checkpoints
            raise ConfigError(
                f"internal: model.io=entropy needs its entropy model ({cfg.patching.entropy_model}) loaded by the caller"
            )
        bound = (
            cfg.patching.max_bytes if cfg.patching.entropy_bounded else None
        )  # None: padded to each batch's longest patch
        width = self.symbols_per_patch(cfg)
        return BytePatchScheme(
            vocabulary_bytes(tok), bound, entropy, cfg.patching.entropy_threshold, width=width, eop=eop(cfg)
        )

    def label(self, cfg: ModelConfig) -> str:
        return (
            f"entropy patch, max {cfg.patching.max_bytes}"
            if cfg.patching.entropy_bounded
            else "entropy patch, unbounded"
        )


register_scheme(EntropySpec())
