"""The hierarchical patch language model: PatchIO (local side) around a latent transformer.

    e_t = g_phi(patch_t)                       # LocalEncoder, all patches in parallel
    h_t = f_theta(e_1..e_t)                    # PatchLM.latent, causal over patches
    p(x_{t+1}^s | x_{t+1}^{<s}, x_{<=t}) = softmax(m_psi(x_{t+1}^{<s}, h_t))   # LocalDecoder

This module never imports distributed code (training/train/parallelize.py wraps it), nor the scheme
registry (training/model/build.py builds the model a config names): `hbpe export --format hf` ships it,
with the modules it imports, in the export folder (training/checkpoint/hf_library.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hbpe.schemas.errors import ArtifactError, ConfigError
from hbpe.schemas.train_config import ModelConfig
from hbpe.training.model.layers import KVCache, Transformer
from hbpe.training.model.patch_io import PatchIO


@dataclass(frozen=True)
class VocabSpec:
    """What the model's shape takes from the tokenizer: V' and S (hierarchical), the first stage's vocabulary (BPE).

    >>> VocabSpec(vocab_size=470, max_patch_size=10, n_vocab=50257)
    VocabSpec(vocab_size=470, max_patch_size=10, n_vocab=50257)
    """

    vocab_size: int  # V': symbols of the second stage, the hierarchical model's output
    max_patch_size: int  # S: symbols per patch
    n_vocab: int  # the first stage's tokens, the BPE baseline's output

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_patch_size", "n_vocab"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"VocabSpec.{name}={value!r}: must be an integer >= 1 (take it from a tokenizer)")

    @classmethod
    def from_tokenizer(cls, tok: Any) -> VocabSpec:
        """From a HierarchicalTokenizer (what a training run builds from)."""
        return cls(tok.vocab_size, tok.max_patch_size, tok.encoding.max_token_value + 1)

    @classmethod
    def from_run_meta(cls, meta: dict[str, Any], *, source: str = "hbpe_run.json") -> VocabSpec:
        """From the fields `hbpe train` writes into hbpe_run.json (what eval and generate build from)."""
        fields = ("vocab_size", "max_patch_size", "n_vocab")
        missing = [f for f in fields if f not in meta]
        if missing:
            raise ArtifactError(
                f"{source} lacks {missing}: the run folder was modified; use one written by `hbpe train`"
            )
        try:
            return cls(*(meta[f] for f in fields))
        except ConfigError as e:
            raise ArtifactError(
                f"{source}: {e}; the run folder was modified, use one written by `hbpe train`"
            ) from None


def long_ids(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The batch with its id columns as int64, what embeddings and cross_entropy index with.

    The loader keeps them narrow (patches int16, tokens int32: a quarter and a half of the bytes to
    pin and copy to the device) and they widen here, on the device.
    """
    # a float is one of the loader's host counts (training/data/schemes.py HostCounts), not a column
    return {
        k: v.long() if isinstance(v, torch.Tensor) and v.dtype in (torch.int16, torch.int32) else v
        for k, v in batch.items()
    }


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
        for m in self.modules():  # each module once: E sits in both local models (apply() would visit it twice)
            _init_weights(m)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (logits (M, V), targets (M,)) for every prediction in the batch."""
        batch = long_ids(batch)
        self._check_batch(batch)
        e = self.io.encode(batch)  # (B, T, D): e_t = g_phi(patch_t)
        h = self.latent(e, causal=True)  # (B, T, D): h_t = f_theta(e_<=t)
        return self.io.decode(h, batch)  # (M, V), (M,): m_psi's logits for patch t+1 from h_t

    def _check_batch(self, batch: dict[str, torch.Tensor]) -> None:
        """Refuse a batch with nothing to predict here, not as a reshape error deep in the local models.

        Position t predicts position t + 1, so a row needs T >= 2 positions, and a batch >= 1 row.
        The check reads static shapes only (no data-dependent op: the compiled step keeps its graph).
        """
        x = batch[self.io.latent_column]  # (B, T) tokens or (B, T, S) patches
        if x.dim() < 2 or x.shape[0] < 1 or x.shape[1] < 2:
            raise ValueError(
                f"PatchLM: a batch of shape {tuple(x.shape)} has nothing to predict: it needs B >= 1 rows "
                "of T >= 2 positions (position t predicts t + 1); drop empty batches and give each row "
                "at least two positions"
            )

    def latent_step(self, e: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        """f_theta on new positions e (B, L, D) after those in `cache` -> h (B, L, D)."""
        return self.latent(e, causal=True, cache=cache)


def parameter_counts(model: PatchLM) -> dict[str, int]:
    """{latent, io, total} as the paper counts them: a tied matrix once.

    `io` is the local encoder and decoder for the hierarchical, space and entropy models (with
    their symbol embedding and head), the embedding matrix (and untied head) for BPE and bytes.
    """

    def count(m: nn.Module) -> int:
        return sum(p.numel() for p in m.parameters())  # parameters() lists a shared tensor once

    return {"latent": count(model.latent), "io": count(model.io), "total": count(model)}


def _init_weights(m: nn.Module) -> None:
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, std=0.02)
