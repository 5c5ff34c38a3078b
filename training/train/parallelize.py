"""The one place that prepares a built model for FSDP: which modules to wrap and to checkpoint.

Composer reads `fsdp_wrap_fn` / `activation_checkpointing_fn` from the module it shards,
so they are attached here rather than defined in model code.
"""

from __future__ import annotations

from typing import Any

from hbpe.schemas.errors import ConfigError
from hbpe.training.model.layers import Block
from hbpe.training.model.patch_lm import PatchLM


def fsdp_units(model: PatchLM) -> set[int]:
    """The modules (by id) that are FSDP units: each latent block, and each local stack whole.

    A unit costs an all-gather forward, one backward and a reduce-scatter. The latent blocks hold most of the
    parameters and run on few positions, so they shard one by one; a local stack's blocks are small (at small,
    1.8M parameters each against a latent block's 7.1M) and run one after another on every packed row, so one unit
    per stack gathers them together: at small 14 units instead of 18 (12 latent blocks, 3 + 3 local ones)."""
    local = [getattr(model.io, side).transformer for side in ("encoder", "decoder") if hasattr(model.io, side)]
    return {id(m) for m in model.latent.blocks} | {id(m) for m in local}


def attach_fsdp_hooks(model: PatchLM) -> PatchLM:
    """Shard each latent block and each local stack as its own FSDP unit (fsdp_units); checkpoint every block."""
    units = fsdp_units(model)
    model.fsdp_wrap_fn = lambda m: id(m) in units  # type: ignore[attr-defined]
    model.activation_checkpointing_fn = lambda m: isinstance(m, Block)  # type: ignore[attr-defined]
    return model


def parallelism_config(
    fsdp: dict[str, Any] | None, *, activation_checkpointing: bool, on_gpu: bool
) -> dict[str, Any] | None:
    """Trainer `parallelism_config` from the YAML `fsdp` block.

    `{version: 2, ...}` -> FSDP2 (runs on CPU with gloo too); any other dict -> FSDP1,
    which Composer supports on GPUs only (e.g. FULL_SHARD with PURE mixed precision on A100s).
    """
    if not fsdp:
        return None
    opts = dict(fsdp)
    version = opts.pop("version", 1)
    if isinstance(version, bool) or version not in (1, 2):  # Composer 0.32 has FSDP1 and FSDP2, nothing else
        raise ConfigError(
            f"fsdp.version={version!r}: must be 1 (FSDP1, GPUs only) or 2 (FSDP2, also on CPU over gloo); "
            "e.g. 'fsdp={version: 2}'"
        )
    if version == 2:
        from composer.utils.parallelism import FSDP2Config

        allowed = FSDP2Config.settable_attrs()
        unknown = set(opts) - allowed
        if unknown:
            raise ConfigError(f"fsdp (version 2) does not take {sorted(unknown)}; allowed: {sorted(allowed)}")
        return {"fsdp": FSDP2Config(activation_checkpointing=activation_checkpointing, **opts)}
    if not on_gpu:
        raise ConfigError("FSDP1 needs GPUs in Composer; on CPU use `fsdp: {version: 2}` (gloo)")
    opts.setdefault("sharding_strategy", "FULL_SHARD")
    opts.setdefault("mixed_precision", "PURE")
    opts.setdefault("activation_checkpointing", activation_checkpointing)
    return {"fsdp": opts}
