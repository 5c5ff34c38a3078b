"""Bits per byte, exactly as SPEC section 1: NLL in bits over every predicted symbol (EOP and
EOD included, PAD excluded) divided by the UTF-8 bytes of the text those patches cover."""

from __future__ import annotations

import math

import torch
from torchmetrics import Metric


class _NllRatio(Metric):
    """scale * (summed NLL in nats) / (summed denominator), reduced across ranks by summing."""

    full_state_update = False
    scale = 1.0

    def __init__(self) -> None:
        super().__init__()
        self.add_state("nll_nats", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("denominator", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, nll_nats: torch.Tensor, denominator: torch.Tensor) -> None:
        self.nll_nats += nll_nats.detach().to(torch.float64)
        self.denominator += denominator.detach().sum().to(torch.long)

    def compute(self) -> torch.Tensor:
        # nothing predicted: NaN, not 0. Chosen on the device, not with an `if` on the count: Composer computes
        # the train metrics after every batch, and reading the count would make the host wait for the step
        ratio = self.scale * self.nll_nats / self.denominator.clamp_min(1)
        return torch.where(self.denominator > 0, ratio, torch.full_like(ratio, float("nan")))


class BitsPerByte(_NllRatio):
    """update(nll_nats, target_bytes): bits per UTF-8 byte of the predicted text."""

    scale = 1.0 / math.log(2)


class LossPerSymbol(_NllRatio):
    """update(nll_nats, symbol_count): mean NLL (nats) per predicted symbol, the training loss."""
