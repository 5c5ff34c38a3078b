"""The ComposerModel: loss, BPB metric, and FLOPs for SpeedMonitor's MFU."""

from __future__ import annotations

from typing import Any

import torch
from composer.models import ComposerModel

from hbpe.schemas.train_config import LOSS_NORMALIZATIONS
from hbpe.training.model.flops import batch_train_flops
from hbpe.training.model.patch_io import IGNORE, cross_entropy_sum
from hbpe.training.model.patch_lm import PatchLM
from hbpe.training.schemes.registry import scheme_spec
from hbpe.training.train.host_counts import HOST_FLOPS
from hbpe.training.train.metrics import BitsPerByte, LossPerSymbol


class HierarchicalComposerModel(ComposerModel):
    """`loss_normalization` (optim.loss_normalization): the summed NLL over the batch's predicted symbols
    ("symbol") or over its UTF-8 target bytes ("byte", BPB's denominator: the same unit for every scheme)."""

    def __init__(self, model: PatchLM, *, max_patch_size: int, loss_normalization: str = "symbol") -> None:
        super().__init__()
        if loss_normalization not in LOSS_NORMALIZATIONS:
            raise ValueError(f"loss_normalization={loss_normalization!r}: expected one of {LOSS_NORMALIZATIONS}")
        self.model = model
        self.max_patch_size = max_patch_size
        self.loss_normalization = loss_normalization
        # the summed NLL of the logits (compile: true compiles it, training/train/compile_blocks.py)
        self.nll_sum = cross_entropy_sum
        self.train_metrics = {"BitsPerByte": BitsPerByte(), "LossPerSymbol": LossPerSymbol()}
        self.eval_metrics = {"BitsPerByte": BitsPerByte(), "LossPerSymbol": LossPerSymbol()}

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        logits, targets = self.model(batch)
        nll = self.nll_sum(logits, targets)
        return {"nll_sum": nll, "count": (targets != IGNORE).sum()}

    def loss(self, outputs: dict[str, torch.Tensor], batch: Any) -> torch.Tensor:
        # over the local (micro)batch: Composer weighs microbatches by their samples, DDP/FSDP average the ranks
        if self.loss_normalization == "byte":
            return outputs["nll_sum"] / batch["target_bytes"].sum().clamp_min(1)
        return outputs["nll_sum"] / outputs["count"].clamp_min(1)

    def eval_forward(self, batch: dict[str, torch.Tensor], outputs: Any | None = None) -> dict[str, torch.Tensor]:
        return outputs if outputs is not None else self.forward(batch)

    def get_metrics(self, is_train: bool = False) -> dict[str, Any]:
        return self.train_metrics if is_train else self.eval_metrics

    def update_metric(self, batch: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor], metric: Any) -> None:
        if isinstance(metric, BitsPerByte):
            metric.update(outputs["nll_sum"], batch["target_bytes"])
        else:
            metric.update(outputs["nll_sum"], outputs["count"])

    def flops_per_batch(self, batch: dict[str, torch.Tensor]) -> float:
        return self.batch_flops(batch)["executed"]

    def batch_flops(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        """{executed, pad, paper}: what the batch's training step computes, the part of it spent on PAD, and
        the paper's count for the same text.

        From the batch itself: the byte schemes' latent length and patch width vary by batch, and the
        packed local models' work by the real symbols of its patches (training/model/flops.py).
        """
        if HOST_FLOPS["executed"] in batch:  # counted by the loader (HostCounts): no host sync
            return {part: batch[key] for part, key in HOST_FLOPS.items()}
        x = scheme_spec(self.model.cfg).latent_input(batch)
        # asked up to three times per batch (SpeedMonitor, the throughput meter, an experiment's curve): counted once,
        # since counting the real symbols reads the whole batch (and syncs with a GPU)
        cached = getattr(self, "_flops_of", None)
        if cached is None or cached[0] is not x:
            cached = self._flops_of = (x, batch_train_flops(self.model.cfg, x, vocab_size=self.model.io.vocab_size))
        return cached[1]
