"""The paper's two local models, on the symbols of one patch at a time (S positions, V' symbols).

    e_t = g_phi(patch_t)                                           # LocalEncoder
    p(x_{t+1}^s | x_{t+1}^{<s}, h_t) = softmax(m_psi(x_{t+1}^{<s}, h_t))   # LocalDecoder

Both read symbols through one embedding table E (V', d) that HierarchicalPatchIO creates and
hands to each (see there why it is shared); phi and psi are otherwise disjoint. Shapes:
M patches (B*T when a batch is flattened), S symbols per patch, d = local_dim,
D = latent_dim, V = V'.
"""

from __future__ import annotations

import torch
from torch import nn

from hbpe.schemas.symbols import PAD
from hbpe.schemas.train_config import ModelConfig
from hbpe.training.model.hash_ngrams import HashNgramEmbedding
from hbpe.training.model.layers import KVCache, Transformer
from hbpe.training.model.packing import PatchPacking
from hbpe.training.model.tiles import TileRows


def _local_transformer(cfg: ModelConfig, layers: int) -> Transformer:
    return Transformer(
        layers=layers,
        dim=cfg.local_dim,
        ffn=cfg.local_ffn,
        heads=cfg.local_heads,
        theta=cfg.rope_theta,
        dropout=cfg.dropout,
        packed_attention=cfg.packed_attention,
    )


class LocalEncoder(nn.Module):
    """g_phi: a patch of S symbols -> one latent input e_t.

    Symbol embedding, bidirectional transformer over the patch (PAD keys masked), pooling,
    projection to the latent width. Pooling "mean": masked mean over the real symbols;
    "eop": the state at the patch's last real symbol, which under bidirectional attention
    has seen the whole patch.
    """

    def __init__(self, cfg: ModelConfig, embed: nn.Embedding, *, byte_patches: bool = False) -> None:
        super().__init__()
        self.pooling, self.packed = cfg.pooling, cfg.local_layout == "packed"
        self.embed = embed
        self.transformer = _local_transformer(cfg, cfg.encoder_layers)
        self.to_latent = nn.Linear(cfg.local_dim, cfg.latent_dim, bias=False)
        # the byte baselines' hash n-gram embeddings (BLT); registered last and only when on, so that every
        # other model initialises (and loads) as before
        self.hash_ngrams = None
        if cfg.patching.hash_ngram_buckets and byte_patches:
            self.hash_ngrams = HashNgramEmbedding(cfg.patching.hash_ngram_buckets, cfg.local_dim)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """(B, T, S) symbols -> e (B, T, D); every patch is encoded on its own (hash n-grams read back across)."""
        if self.packed:
            return self._forward_packed(patches)
        B, T, S = patches.shape
        flat = patches.reshape(B * T, S)  # (M, S)
        real = flat != PAD  # (M, S)
        key_mask = real.clone()
        key_mask[:, 0] = True  # an all-PAD (tail) patch still attends somewhere: no NaN rows
        x = self.embed(flat)  # (M, S, d)
        if self.hash_ngrams is not None:
            x = x + self.hash_ngrams(patches).reshape(B * T, S, -1)  # (M, S, d): + sum_n H_n[hash_n]
        x = self.transformer(x, causal=False, key_mask=key_mask)  # (M, S, d)
        if self.pooling == "mean":
            w = real.unsqueeze(-1).to(x.dtype)  # (M, S, 1)
            pooled = (x * w).sum(1) / w.sum(1).clamp_min(1.0)  # (M, d)
        else:
            last = real.sum(1).clamp_min(1) - 1  # (M,) index of the last real symbol
            pooled = x[torch.arange(B * T, device=x.device), last]  # (M, d)
        return self.to_latent(pooled).view(B, T, -1)  # (B, T, D)

    def forward_tiles(self, patches: torch.Tensor, rows: TileRows, last: torch.Tensor) -> torch.Tensor:
        """`forward` on the loader's tiles (training/model/tiles.py): rows (R,) hold each patch's kept positions
        (its real symbols, at least its first), `last` (M,) the row of each patch's last one. The same e as
        `_forward_packed`, with static shapes: empty rows pool with weight 0 and are never anyone's last."""
        B, T, S = patches.shape
        flat = patches.reshape(-1)  # (M * S,)
        symbols = flat.index_select(0, rows.src)  # (R,)
        x = self.embed(symbols)  # (R, d)
        if self.hash_ngrams is not None:
            x = x + self.hash_ngrams.rows(patches, rows.src)  # (R, d): + sum_n H_n[hash_n]
        x = self.transformer(x, causal=False, tiles=rows)  # (R, d)
        M = B * T
        if self.pooling == "mean":
            w = ((symbols != PAD) & rows.real).unsqueeze(-1).to(x.dtype)  # (R, 1): real symbols only
            sums = x.new_zeros(M, x.shape[-1]).index_add_(0, rows.patch, x * w)  # (M, d)
            counts = (patches.reshape(M, S) != PAD).sum(1, keepdim=True)  # (M, 1)
            pooled = sums / counts.to(x.dtype).clamp_min(1.0)  # (M, d)
        else:
            pooled = x.index_select(0, last)  # (M, d)
        return self.to_latent(pooled).view(B, T, -1)  # (B, T, D)

    def _forward_packed(self, patches: torch.Tensor) -> torch.Tensor:
        """`forward` on the real symbols only (training/model/packing.py): the same e, PAD never computed.

        An all-PAD (tail) patch keeps its first position, as the padded path lets it attend there:
        its e is the same (0 under mean pooling; that position's state under eop pooling).
        """
        B, T, S = patches.shape
        flat = patches.reshape(B * T, S)  # (M, S)
        real = flat != PAD  # (M, S)
        kept = real.clone()
        kept[:, 0] = True  # (M, S)
        packing = PatchPacking.from_real(kept)
        x = self.embed(flat.reshape(-1).index_select(0, packing.rows))  # (N, d)
        if self.hash_ngrams is not None:
            x = x + self.hash_ngrams.rows(patches, packing.rows)  # (N, d): + sum_n H_n[hash_n]
        x = self.transformer(x, causal=False, packing=packing)  # (N, d)
        M = packing.patches
        if self.pooling == "mean":
            w = real.reshape(-1).index_select(0, packing.rows).unsqueeze(-1).to(x.dtype)  # (N, 1)
            sums = x.new_zeros(M, x.shape[-1]).index_add_(0, packing.patch, x * w)  # (M, d)
            pooled = sums / real.sum(1, keepdim=True).to(x.dtype).clamp_min(1.0)  # (M, d)
        else:
            last = packing.counts.cumsum(0) - 1  # (M,) the row of each patch's last kept position
            pooled = x.index_select(0, last)  # (M, d)
        return self.to_latent(pooled).view(B, T, -1)  # (B, T, D)


class LocalDecoder(nn.Module):
    """m_psi: h_t and the first s-1 symbols of patch t+1 -> logits of its symbol s.

    Conditioning "prefix": h_t, projected to the local width, is the first input position,
    so symbol s attends to it like to any earlier symbol. "add": a learned start vector is
    the first position and h_t is added to every position.
    """

    def __init__(self, cfg: ModelConfig, embed: nn.Embedding, *, vocab_size: int) -> None:
        super().__init__()
        self.conditioning, self.vocab_size = cfg.conditioning, vocab_size
        self.packed = cfg.local_layout == "packed"
        self.from_latent = nn.Linear(cfg.latent_dim, cfg.local_dim, bias=False)
        # only "add" conditioning uses a start vector; an unused parameter would have no optimizer
        # state and break checkpoint resumption
        self.start = nn.Parameter(torch.zeros(cfg.local_dim)) if cfg.conditioning == "add" else None
        self.transformer = _local_transformer(cfg, cfg.decoder_layers)
        self.head = nn.Linear(cfg.local_dim, vocab_size, bias=False)
        # registered last: PatchLM initialises modules in registration order, and the table was
        # already met (and initialised) in the encoder
        self.embed = embed

    def inputs(self, h: torch.Tensor, prefix: torch.Tensor) -> torch.Tensor:
        """h (M, D), prefix symbols (M, k) with k < S -> decoder inputs (M, k+1, d)."""
        c = self.from_latent(h).unsqueeze(1)  # (M, 1, d)
        emb = self.embed(prefix)  # (M, k, d)
        if self.conditioning == "prefix":
            return torch.cat([c, emb], dim=1)  # (M, k+1, d)
        start = self.start.expand(emb.shape[0], 1, -1)  # (M, 1, d)
        return torch.cat([start, emb], dim=1) + c  # (M, k+1, d)

    def forward(self, h: torch.Tensor, patches: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: h (M, D), the patches it predicts (M, S) -> logits (M, S, V) of all S symbols."""
        x = self.inputs(h, patches[:, :-1])  # (M, S, d): position s sees h and symbols < s
        return self.head(self.transformer(x, causal=True))  # (M, S, V)

    def forward_packed(self, h: torch.Tensor, patches: torch.Tensor, packing: PatchPacking) -> torch.Tensor:
        """Teacher forcing on the real targets only: h (M, D), patches (M, S), `packing` of their real symbols
        -> logits (N, V), row i predicting symbol packing.col[i] of patch packing.patch[i] (`forward`'s rows).

        Position s reads h and symbols < s, so position 0 is the conditioning input and position s > 0
        the embedding of symbol s - 1 of the same patch.
        """
        x = self._row_inputs(h, patches, packing.patch, packing.rows, packing.col)  # (N, d)
        return self.head(self.transformer(x, causal=True, packing=packing))  # (N, V)

    def _row_inputs(
        self, h: torch.Tensor, patches: torch.Tensor, patch: torch.Tensor, flat: torch.Tensor, col: torch.Tensor
    ) -> torch.Tensor:
        """The decoder's input at rows predicting symbol col of patch `patch` (flat index `flat` = patch * S + col
        into `patches` (M, S)): position 0 is h_t (prefix; add: the start vector + h_t), position s > 0 the
        embedding of symbol s - 1 of the same patch (+ h_t under add) -> (rows, d)."""
        c = self.from_latent(h).index_select(0, patch)  # (rows, d): h_t of each row's patch
        prev = patches.reshape(-1).index_select(0, (flat - 1).clamp_min(0))  # (rows,) symbol s - 1
        first = (col == 0).unsqueeze(-1)  # (rows, 1)
        emb = self.embed(prev)  # (rows, d)
        if self.conditioning == "prefix":
            return torch.where(first, c, emb)
        return torch.where(first, self.start.expand_as(emb), emb) + c

    def forward_tiles(self, h: torch.Tensor, patches: torch.Tensor, rows: TileRows) -> torch.Tensor:
        """`forward_packed` on the loader's tiles (training/model/tiles.py): logits (R, V), row i predicting symbol
        rows.col[i] of patch rows.patch[i]; an empty row's logits are computed and never scored."""
        x = self._row_inputs(h, patches, rows.patch, rows.src, rows.col)  # (R, d)
        return self.head(self.transformer(x, causal=True, tiles=rows))  # (R, V)

    def symbol_logits(self, h: torch.Tensor, prefix: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        """Logits (M, V) of the next symbol of the patch after h (M, D), given its first k symbols (M, k).

        With a cache, the first call (k = 0) feeds the conditioning position and each later call
        only the newest symbol; the cache holds the keys of the positions before it.
        """
        if cache is None:
            x = self.inputs(h, prefix)  # (M, k+1, d)
        elif cache.length == 0:
            x = self.inputs(h, prefix[:, :0])  # (M, 1, d)
        else:
            x = self.embed(prefix[:, -1:])  # (M, 1, d)
            if self.conditioning == "add":
                x = x + self.from_latent(h).unsqueeze(1)  # (M, 1, d)
        out = self.transformer(x, causal=True, cache=cache)  # (M, L, d)
        return self.head(out[:, -1])  # (M, V)
