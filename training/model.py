"""The hierarchical patch language model: PatchIO (local side) around a latent transformer.

    e_t = g_phi(patch_t)                       # local encoder, all patches in parallel
    h_t = f_theta(e_1..e_t)                    # latent causal transformer
    p(x_{t+1}^s | x_{t+1}^{<s}, x_{<=t}) = softmax(m_psi(x_{t+1}^{<s}, h_t))   # local decoder

This module never imports distributed code (training/parallelize.py wraps it).
"""

from __future__ import annotations

import torch
from torch import nn

from hbpe.schemas.train_config import ModelConfig
from hbpe.training.layers import KVCache, Transformer
from hbpe.training.patch_io import BPEEmbeddingIO, HierarchicalPatchIO, PatchIO


class PatchLM(nn.Module):
    def __init__(self, cfg: ModelConfig, io: PatchIO) -> None:
        super().__init__()
        self.cfg, self.io = cfg, io
        self.latent = Transformer(
            layers=cfg.latent_layers,
            dim=cfg.latent_dim,
            ffn=cfg.latent_ffn,
            heads=cfg.latent_heads,
            theta=cfg.rope_theta,
            dropout=cfg.dropout,
        )
        self.apply(_init_weights)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (logits (M, V), targets (M,)) for every prediction in the batch."""
        e = self.io.encode(batch)  # (B, T, D)
        h = self.latent(e, causal=True)  # (B, T, D)
        return self.io.decode(h, batch)

    def latent_step(self, e: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        return self.latent(e, causal=True, cache=cache)


def parameter_counts(model: PatchLM) -> dict[str, int]:
    """{latent, io, total} as the paper counts them: a tied matrix once.

    `io` is the local encoder and decoder for the hierarchical model (with their symbol
    embedding and head), the embedding matrix (and untied head) for the BPE baseline.
    """

    def count(m: nn.Module) -> int:
        return sum(p.numel() for p in m.parameters())  # parameters() lists a shared tensor once

    return {"latent": count(model.latent), "io": count(model.io), "total": count(model)}


def _init_weights(m: nn.Module) -> None:
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, std=0.02)


def build_model(cfg: ModelConfig, *, vocab_size: int, max_patch_size: int, n_vocab: int) -> PatchLM:
    """`vocab_size` = V' of the hierarchical tokenizer; `n_vocab` = the first stage's (BPE baseline)."""
    if cfg.io == "hierarchical":
        io: PatchIO = HierarchicalPatchIO(cfg, vocab_size=vocab_size, max_patch_size=max_patch_size)
    else:
        io = BPEEmbeddingIO(cfg, n_vocab=n_vocab)
    return PatchLM(cfg, io)
