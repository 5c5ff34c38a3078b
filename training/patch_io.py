"""The input/output side of the model: how a sequence becomes latent inputs, and how
latent states become predictions. The latent transformer is shared; each scheme
(the paper's BPE-patch, and baselines) is one `PatchIO` subclass.

Contract (B batch, T context positions):
    encode(batch)       -> e (B, T, D_latent)     from the first T positions
    decode(h, batch)    -> (logits (M, V), targets (M,))  predictions of positions 2..T+1,
                           flattened, targets == IGNORE where nothing is predicted
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hbpe.schemas.symbols import PAD
from hbpe.schemas.train_config import ModelConfig
from hbpe.training.layers import KVCache, Transformer

IGNORE = -100


class PatchIO(nn.Module):
    vocab_size: int

    def encode(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def decode(
        self, h: torch.Tensor, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:  # pragma: no cover
        raise NotImplementedError


def _local_transformer(cfg: ModelConfig, layers: int) -> Transformer:
    return Transformer(
        layers=layers,
        dim=cfg.local_dim,
        ffn=cfg.local_ffn,
        heads=cfg.local_heads,
        theta=cfg.rope_theta,
        dropout=cfg.dropout,
    )


class HierarchicalPatchIO(PatchIO):
    """BPE-patch (the paper): a local encoder pools each patch of S symbols into e_t, and a
    local decoder predicts the next patch's symbols autoregressively from h_t.

    Design choices (alternatives are a config switch away):
    - pooling "mean": masked mean of the encoder states over real symbols, then a linear map
      to the latent width ("eop": the state at the patch's last real symbol instead);
    - conditioning "prefix": h_t, projected to the local width, is the decoder's first input
      position, so symbol s attends to it like to any earlier symbol ("add": h_t is added to
      every input position after a learned start vector).
    """

    def __init__(self, cfg: ModelConfig, *, vocab_size: int, max_patch_size: int) -> None:
        super().__init__()
        self.cfg, self.vocab_size, self.S = cfg, vocab_size, max_patch_size
        d = cfg.local_dim
        self.embed = nn.Embedding(vocab_size, d)
        self.encoder = _local_transformer(cfg, cfg.encoder_layers)
        self.to_latent = nn.Linear(d, cfg.latent_dim, bias=False)
        self.from_latent = nn.Linear(cfg.latent_dim, d, bias=False)
        # only "add" conditioning uses a start vector; an unused parameter would have no optimizer
        # state and break checkpoint resumption
        self.start = nn.Parameter(torch.zeros(d)) if cfg.conditioning == "add" else None
        self.decoder = _local_transformer(cfg, cfg.decoder_layers)
        self.head = nn.Linear(d, vocab_size, bias=False)

    # ---- local encoder g_phi -------------------------------------------------------------

    def encode_patches(self, patches: torch.Tensor) -> torch.Tensor:
        """(B, T, S) symbols -> (B, T, D_latent)."""
        B, T, S = patches.shape
        flat = patches.reshape(B * T, S)
        real = flat != PAD  # (BT, S)
        key_mask = real.clone()
        key_mask[:, 0] = True  # an all-PAD (tail) patch still attends somewhere: no NaN rows
        x = self.encoder(self.embed(flat), causal=False, key_mask=key_mask)  # (BT, S, d)
        if self.cfg.pooling == "mean":
            w = real.unsqueeze(-1).to(x.dtype)
            pooled = (x * w).sum(1) / w.sum(1).clamp_min(1.0)
        else:  # "eop": the last real symbol carries the whole patch under bidirectional attention
            last = real.sum(1).clamp_min(1) - 1
            pooled = x[torch.arange(B * T, device=x.device), last]
        return self.to_latent(pooled).view(B, T, -1)

    def encode(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.encode_patches(batch["patches"][:, :-1])

    # ---- local decoder m_psi -------------------------------------------------------------

    def decoder_inputs(self, h: torch.Tensor, prefix: torch.Tensor) -> torch.Tensor:
        """h (M, D_latent), prefix symbols (M, k) with k < S -> decoder inputs (M, k+1, d)."""
        c = self.from_latent(h).unsqueeze(1)  # (M, 1, d)
        emb = self.embed(prefix)  # (M, k, d)
        if self.cfg.conditioning == "prefix":
            return torch.cat([c, emb], dim=1)
        start = self.start.expand(emb.shape[0], 1, -1)
        return torch.cat([start, emb], dim=1) + c

    def decode(self, h: torch.Tensor, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        targets = batch["patches"][:, 1:]  # (B, T, S): patch t+1 predicted from h_t
        B, T, S = targets.shape
        tgt = targets.reshape(B * T, S)
        x = self.decoder_inputs(h.reshape(B * T, -1), tgt[:, :-1])  # (BT, S, d)
        logits = self.head(self.decoder(x, causal=True))  # (BT, S, V)
        return logits.reshape(-1, self.vocab_size), tgt.masked_fill(tgt == PAD, IGNORE).reshape(-1)

    def symbol_logits(self, h: torch.Tensor, prefix: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        """Logits of the next symbol of the patch after h (M, D), given its first k symbols."""
        if cache is None:
            x = self.decoder_inputs(h, prefix)
        elif cache.length == 0:
            x = self.decoder_inputs(h, prefix[:, :0])
        else:
            x = self.embed(prefix[:, -1:])
            if self.cfg.conditioning == "add":
                x = x + self.from_latent(h).unsqueeze(1)
        out = self.decoder(x, causal=True, cache=cache)
        return self.head(out[:, -1])  # (M, V)


class BPEEmbeddingIO(PatchIO):
    """The BPE baseline: an embedding matrix and an output head over the first-stage vocabulary.

    Reads the `tokens` column; EOD (-1) and PAD (-2) map to two extra ids. With
    `tie_embeddings` (the default, as in the paper, whose 123M / 359M BPE models are the
    latent plus one matrix) the head reuses the embedding matrix.
    """

    def __init__(self, cfg: ModelConfig, *, n_vocab: int) -> None:
        super().__init__()
        self.n_vocab, self.vocab_size = n_vocab, n_vocab + 2
        self.embed = nn.Embedding(self.vocab_size, cfg.latent_dim)
        self.head = nn.Linear(cfg.latent_dim, self.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight

    def _ids(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.where(tokens < 0, self.n_vocab - 1 - tokens, tokens)  # -1 -> n, -2 -> n+1

    def encode(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.embed(self._ids(batch["tokens"][:, :-1]))

    def decode(self, h: torch.Tensor, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        tgt = self._ids(batch["tokens"][:, 1:])
        tgt = tgt.masked_fill(batch["tokens"][:, 1:] == -2, IGNORE)
        return self.head(h).reshape(-1, self.vocab_size), tgt.reshape(-1)


def cross_entropy_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum of NLL (nats) over predicted positions, in fp32."""
    return F.cross_entropy(logits.float(), targets, ignore_index=IGNORE, reduction="sum")
