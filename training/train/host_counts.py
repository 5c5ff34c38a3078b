"""What the training loop reads of each batch on the host, counted in the loader: no device read per batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hbpe.schemas.train_config import ModelConfig
from hbpe.training.data.schemes import Scheme
from hbpe.training.data.tile_layout import DEC_TILES, ENC_TILES, tile_width
from hbpe.training.model.flops import batch_train_flops
from hbpe.training.schemes.registry import scheme_spec

# what HostCounts adds to a batch: plain floats, which Composer leaves on the host (it moves tensors only)
HOST_FLOPS = {"executed": "host_flops_executed", "pad": "host_flops_pad", "paper": "host_flops_paper"}
HOST_BYTES, HOST_TEXT_POSITIONS = "host_target_bytes", "host_text_positions"


@dataclass
class HostCounts:
    """A scheme's batches plus what the training loop reads of each batch on the host, counted in the loader: the
    step's FLOPs (training/model/flops.py: {executed, pad, paper}), its target bytes and text positions. Read from
    the batch's device tensors instead, each is a host sync per batch (the CPU waits for the GPU's queue to
    drain before it may launch the next step)."""

    inner: Scheme
    cfg: ModelConfig
    vocab_size: int

    def batch(self, tokens: np.ndarray, stored_patches: np.ndarray | None) -> dict[str, np.ndarray]:
        out = self.inner.batch(tokens, stored_patches)
        x = torch.from_numpy(np.asarray(scheme_spec(self.cfg).latent_input(out)))
        flops = batch_train_flops(self.cfg, x, vocab_size=self.vocab_size, tiles=laid_out(out))
        counts = {key: float(flops[part]) for part, key in HOST_FLOPS.items()}
        counts[HOST_BYTES] = float(np.asarray(out["target_bytes"]).sum())
        counts[HOST_TEXT_POSITIONS] = float(np.asarray(out["text_positions"]).sum())
        return {**out, **counts}

    def __getattr__(self, name: str) -> object:  # the inner scheme's counters and settings
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def count_on_host(loader: Any, cfg: ModelConfig, *, vocab_size: int) -> None:
    """Make `loader`'s batches carry the loop's host counts (HostCounts): the step's FLOPs and bytes, counted in
    the loader's workers, so that the training loop never reads a device tensor per batch. Set before the loader
    is iterated (its workers take the collator as it is then)."""
    collate = loader.collate_fn
    collate.scheme = HostCounts(collate.scheme, cfg, vocab_size)


def laid_out(batch: dict) -> tuple[int, int, int] | None:
    """(encoder rows, decoder rows, W) of the batch's tiles (training/data/tile_layout.py), None without them."""
    if ENC_TILES not in batch:
        return None
    enc, dec = batch[ENC_TILES], batch[DEC_TILES]
    return enc.shape[0] * enc.shape[1], dec.shape[0] * dec.shape[1], tile_width(batch["patches"].shape[-1])
