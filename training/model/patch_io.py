"""The input/output side of the model: how a sequence becomes latent inputs, and how
latent states become predictions. The latent transformer is shared; each scheme
(the paper's BPE-patch, and baselines) is one `PatchIO` subclass.

Contract (B batch, T context positions):
    encode(batch)       -> e (B, T, D_latent)     from the first T positions
    decode(h, batch)    -> (logits (M, V), targets (M,))  predictions of positions 2..T+1,
                           flattened, targets == IGNORE where nothing is predicted; with packed
                           local models (model.local_layout) PAD targets have no row at all
    decoded_slots(batch) -> (B*T*P,) bool: which target slots decode's rows stand for
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hbpe.schemas.symbols import PAD, TOKEN_EOD, TOKEN_PAD
from hbpe.schemas.train_config import ModelConfig
from hbpe.training.model.layers import KVCache
from hbpe.training.model.local_models import LocalDecoder, LocalEncoder
from hbpe.training.model.packing import PatchPacking
from hbpe.training.model.tiles import DEC_TILES, ENC_LAST, ENC_TILES, TileRows, has_tiles, local_tile_index

IGNORE = -100


class PatchIO(nn.Module):
    vocab_size: int
    latent_column = "patches"  # the batch column with one row per latent position: (B, T, S) patches

    def encode(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def decode(
        self, h: torch.Tensor, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:  # pragma: no cover
        raise NotImplementedError

    def decoded_slots(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B*T*P,) bool over P targets per position: the slots `decode` returns rows for (all, unless packed)."""
        tokens = batch["tokens"][:, 1:].reshape(-1)
        return torch.ones_like(tokens, dtype=torch.bool)


class HierarchicalPatchIO(PatchIO):
    """BPE-patch (the paper): the local encoder g_phi pools each patch of S symbols into e_t,
    and the local decoder m_psi predicts the next patch's symbols autoregressively from h_t.

    One symbol embedding table E (V', d) serves both: the decoder reads the symbols of the
    patch it predicts from the same V' alphabet the encoder reads, the parameter counts stay
    the ones compared with the paper (README), and at V' = 470 a second table would add
    little but a second copy to keep in step. E is registered under both models (one tensor,
    listed once by `parameters()`, two state-dict keys like the BPE baseline's tied head).
    """

    def __init__(self, cfg: ModelConfig, *, vocab_size: int, max_patch_size: int, byte_patches: bool = False) -> None:
        super().__init__()
        self.cfg, self.vocab_size, self.S = cfg, vocab_size, max_patch_size
        embed = nn.Embedding(vocab_size, cfg.local_dim)  # E: shared by g_phi and m_psi
        self.encoder = LocalEncoder(cfg, embed, byte_patches=byte_patches)  # g_phi (byte patches: BLT's hash n-grams)
        self.decoder = LocalDecoder(cfg, embed, vocab_size=vocab_size)  # m_psi

    def encode_patches(self, patches: torch.Tensor) -> torch.Tensor:
        """e_t = g_phi(patch_t): (B, T, S) symbols -> (B, T, D_latent)."""
        return self.encoder(patches)

    def tiled(self, batch: dict[str, torch.Tensor]) -> bool:
        """Whether this batch runs on the loader's tiles (training/model/tiles.py): the loader laid them out and
        `model.packed_attention` is not `blocks` (generation and scoring build batches without them)."""
        return self.decoder.packed and self.cfg.packed_attention != "blocks" and has_tiles(batch)

    def encode(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        patches = batch["patches"][:, :-1]  # (B, T, S): patches 1..T
        if self.tiled(batch):
            rows = TileRows.from_batch(batch, ENC_TILES, max_patch_size=patches.shape[-1])
            return self.encoder.forward_tiles(patches, rows, local_tile_index(batch, ENC_LAST))
        return self.encoder(patches)  # (B, T, D)

    def decode(self, h: torch.Tensor, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        targets = batch["patches"][:, 1:]  # (B, T, S): patch t+1 predicted from h_t
        B, T, S = targets.shape
        tgt = targets.reshape(B * T, S)  # (BT, S)
        context = context_targets(batch, B, T).reshape(B * T, 1)  # (BT, 1)
        if self.tiled(batch):  # rows in the loader's tiles: (R, V) logits, IGNORE at empty rows and context
            rows = TileRows.from_batch(batch, DEC_TILES, max_patch_size=S)
            logits = self.decoder.forward_tiles(h.reshape(B * T, -1), tgt, rows)  # (R, V)
            scored = rows.real & ~context.reshape(-1).index_select(0, rows.patch)  # (R,)
            return logits, tgt.reshape(-1).index_select(0, rows.src).masked_fill(~scored, IGNORE)
        if self.decoder.packed:  # only the real symbols: N rows, the padded rows' order with PAD left out
            packing = PatchPacking.from_real(tgt != PAD)
            logits = self.decoder.forward_packed(h.reshape(B * T, -1), tgt, packing)  # (N, V)
            scored = tgt.reshape(-1).index_select(0, packing.rows)  # (N,)
            return logits, scored.masked_fill(context.reshape(-1).index_select(0, packing.patch), IGNORE)
        logits = self.decoder(h.reshape(B * T, -1), tgt)  # (BT, S, V)
        ignore = (tgt == PAD) | context
        return logits.reshape(-1, self.vocab_size), tgt.masked_fill(ignore, IGNORE).reshape(-1)  # (BTS, V), (BTS,)

    def decoded_slots(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B*T*S,) bool: which of the padded layout's target slots `decode` returns a row for, in order."""
        targets = batch["patches"][:, 1:].reshape(-1)  # (BTS,)
        return targets != PAD if self.decoder.packed else torch.ones_like(targets, dtype=torch.bool)

    def symbol_logits(self, h: torch.Tensor, prefix: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        """m_psi for generation: logits (M, V) of the next symbol after h (M, D) and prefix (M, k)."""
        return self.decoder.symbol_logits(h, prefix, cache)


class BPEEmbeddingIO(PatchIO):
    """The BPE baseline: an embedding matrix and an output head over the first-stage vocabulary;
    with n_vocab=256 over bytes, the byte-level baseline (training/data/schemes.py builds its `tokens`).

    Reads the `tokens` column; EOD (-1) and PAD (-2) map to two extra ids. With
    `tie_embeddings` (the default, as in the paper, whose 123M / 359M BPE models are the
    latent plus one matrix) the head reuses the embedding matrix.
    """

    latent_column = "tokens"  # one id per latent position: (B, T)

    def __init__(self, cfg: ModelConfig, *, n_vocab: int) -> None:
        super().__init__()
        self.n_vocab, self.vocab_size = n_vocab, n_vocab + 2
        self.embed = nn.Embedding(self.vocab_size, cfg.latent_dim)
        self.head = nn.Linear(cfg.latent_dim, self.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight

    def _ids(self, tokens: torch.Tensor) -> torch.Tensor:
        # the two markers after the vocabulary: TOKEN_EOD (-1) -> n_vocab, TOKEN_PAD (-2) -> n_vocab + 1
        return torch.where(tokens < 0, self.n_vocab + TOKEN_EOD - tokens, tokens)

    def encode(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.embed(self._ids(batch["tokens"][:, :-1]))

    def decode(self, h: torch.Tensor, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        tgt = self._ids(batch["tokens"][:, 1:])
        ignore = (batch["tokens"][:, 1:] == TOKEN_PAD) | context_targets(batch, *tgt.shape)
        tgt = tgt.masked_fill(ignore, IGNORE)
        return self.head(h).reshape(-1, self.vocab_size), tgt.reshape(-1)


def context_targets(batch: dict[str, torch.Tensor], B: int, T: int) -> torch.Tensor:
    """(B, T) bool: predictions of positions 1..T that are context, not scored.

    Position j (0-based) is context when j < batch["first_target"]: the byte schemes spread the
    sample's first token (context in every scheme) over several positions (training/data/schemes.py).
    """
    first = batch.get("first_target")
    if first is None:
        return torch.zeros(B, T, dtype=torch.bool, device=next(iter(batch.values())).device)
    return torch.arange(1, T + 1, device=first.device).unsqueeze(0) < first.unsqueeze(1)


def cross_entropy_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum of NLL (nats) over predicted positions, in fp32."""
    return F.cross_entropy(logits.float(), targets, ignore_index=IGNORE, reduction="sum")
