"""The optimizer and its schedule, from the `optim` block of a training config.

Weight decay follows torch's AdamW (and the paper's, GPT-2's, llm-foundry's `adamw`):
every step multiplies a decayed weight by `1 - lr_t * weight_decay`, so `weight_decay: 0.1`
at `lr: 4e-4` shrinks it by 4e-5 per step. Composer's `DecoupledAdamW` reads the same
number as the per-step shrink itself (`1 - weight_decay * lr_t / lr`): 0.1 there removes
10% of every weight per step and a model never learns (a held-out BPB of 7.4, a uniform
guess, on a narrow copy of the `small` config). Hence plain `torch.optim.AdamW`.

Which tensors decay (`optim.decay_embeddings`):
- false (the default): the matrices of linear layers. Embeddings (also when tied to the output
  head) do not: an embedding row is only updated when its symbol occurs, so uniform decay
  erodes rare symbols. But the rule then differs by scheme: BPE's tied table (about half of a
  mini BPE model) is never decayed while BPE-patch's untied Linear head is.
- true (what the experiments use, one policy for every scheme): every matrix decays, embedding
  tables and output heads included, tied or not (GPT-2's and nanoGPT's rule).
Norm gains, biases and vectors (the decoder's start vector) never decay: decaying a gain
toward 0 fights the normalisation.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hbpe.schemas.errors import ConfigError
from hbpe.schemas.train_config import OptimConfig


def param_groups(model: nn.Module, weight_decay: float, *, decay_embeddings: bool = False) -> list[dict[str, Any]]:
    """[{decayed params, weight_decay}, {the rest, 0}]; a tied tensor is listed once."""
    exempt = set() if decay_embeddings else {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay, no_decay = [], []
    for p in model.parameters():  # yields a shared (tied) tensor once
        if p.requires_grad:
            (decay if p.ndim >= 2 and id(p) not in exempt else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, o: OptimConfig, *, device: str = "cpu") -> torch.optim.Optimizer:
    """AdamW over `param_groups`; on a GPU the fused kernel (one launch for every parameter, not a few per tensor).
    On CPU torch's default (foreach) stays: the fused CPU kernel rounds differently, and CPU runs keep their bits."""
    groups = param_groups(model, o.weight_decay, decay_embeddings=o.decay_embeddings)
    return torch.optim.AdamW(groups, lr=o.lr, betas=o.betas, eps=o.eps, fused=True if device == "gpu" else None)


def build_scheduler(o: OptimConfig) -> Any:
    from composer.optim import ConstantWithWarmupScheduler, CosineAnnealingWithWarmupScheduler

    if o.schedule == "cosine":
        return CosineAnnealingWithWarmupScheduler(t_warmup=o.warmup, alpha_f=o.alpha_f)
    if o.schedule == "constant":
        return ConstantWithWarmupScheduler(t_warmup=o.warmup)
    raise ConfigError(f"optim.schedule must be 'cosine' or 'constant', got {o.schedule!r}")
