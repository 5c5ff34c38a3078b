"""Bits per byte, exactly as SPEC section 1: NLL in bits over every predicted symbol (EOP and
EOD included, PAD excluded) divided by the UTF-8 bytes of the text those patches cover."""

from __future__ import annotations

import math

import torch
from torchmetrics import Metric


class BitsPerByte(Metric):
    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("nll_nats", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("num_bytes", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, nll_nats: torch.Tensor, num_bytes: torch.Tensor) -> None:
        self.nll_nats += nll_nats.detach().to(torch.float64)
        self.num_bytes += num_bytes.detach().sum().to(torch.long)

    def compute(self) -> torch.Tensor:
        return self.nll_nats / math.log(2) / self.num_bytes.clamp_min(1)


class LossPerSymbol(Metric):
    """Mean NLL (nats) per predicted symbol, the training loss."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("nll_nats", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, nll_nats: torch.Tensor, count: torch.Tensor) -> None:
        self.nll_nats += nll_nats.detach().to(torch.float64)
        self.count += count.detach().to(torch.long)

    def compute(self) -> torch.Tensor:
        return self.nll_nats / self.count.clamp_min(1)
