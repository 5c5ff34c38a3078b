"""BLT's hash n-gram embeddings for the byte baselines' local encoder (space and entropy patching).

Each byte's embedding gains, for every n in 3..8, a row of table_n chosen by a hash of the n bytes
that end at it (reaching back across patch boundaries into the previous patches of the sequence,
as BLT hashes its byte stream):

    x_i = E[b_i] + sum_n H_n[hash(b_{i-n+1} .. b_i) mod buckets]      # before the local encoder

The hash is a polynomial one over the byte stream of the patches (PAD and EOP are not bytes and
are skipped; a document marker is a unit like a byte), computed on the fly: nothing is stored in
the shards, and the same patches give the same rows in training, eval and generation (which feeds
the whole context through the modules). Bytes before the start of the sequence count as 0.
Parameters: 6 tables x buckets x local_dim (`ngram_parameters`).
"""

from __future__ import annotations

import torch
from torch import nn

from hbpe.schemas.symbols import EOP, PAD

NGRAM_SIZES = tuple(range(3, 9))  # BLT's n = 3..8
_BASE = 1_000_003  # polynomial hash, reduced mod a Mersenne prime: products stay below 2**51 in int64
_MOD = 2_147_483_647


def ngram_parameters(buckets: int, local_dim: int) -> int:
    """Parameters of the tables: one (buckets, local_dim) matrix per n.

    >>> ngram_parameters(82_700, 512) / 1e6  # the paper-setup presets' tables (hbpe/experiments/presets.py)
    254.0544
    """
    return len(NGRAM_SIZES) * buckets * local_dim


def ngram_ids(patches: torch.Tensor, buckets: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T, S) symbols -> rows (B, T, S, 6) of each n's table, and (B, T, S) which positions are units.

    >>> p = torch.tensor([[[97, 98, EOP, PAD], [99, 100, 101, EOP]]])  # "ab" "cde"
    >>> ids, real = ngram_ids(p, 1000)
    >>> real[0].int().tolist()
    [[1, 1, 0, 0], [1, 1, 1, 0]]
    >>> bool((ngram_ids(p[:, 1:], 1000)[0][0, 0, 0] != ids[0, 1, 0]).any())  # "c" after "ab" != "c" at the start
    True
    """
    B, T, S = patches.shape
    flat = patches.reshape(B, T * S)  # (B, L)
    real = (flat != PAD) & (flat != EOP)  # (B, L)
    order = torch.argsort((~real).to(torch.int8), dim=1, stable=True)  # (B, L): units first, in sequence order
    stream = torch.where(torch.gather(real, 1, order), torch.gather(flat, 1, order) + 1, 0)  # (B, L), 0: none
    h = torch.zeros_like(stream)
    ids = []
    for k in range(1, NGRAM_SIZES[-1] + 1):  # h_k(i): hash of stream[i-k+1 .. i]
        back = torch.nn.functional.pad(stream, (k - 1, 0))[:, : stream.shape[1]]  # (B, L): stream[i-k+1]
        h = (h * _BASE + back) % _MOD
        if k in NGRAM_SIZES:
            ids.append(h % buckets)
    ids_stream = torch.stack(ids, dim=-1)  # (B, L, 6) in stream order
    inverse = torch.argsort(order, dim=1)  # (B, L): where each position went
    ids_flat = torch.gather(ids_stream, 1, inverse.unsqueeze(-1).expand(-1, -1, len(NGRAM_SIZES)))  # (B, L, 6)
    return ids_flat.reshape(B, T, S, -1), real.reshape(B, T, S)


class HashNgramEmbedding(nn.Module):
    """sum_n H_n[hash_n]: (B, T, S) symbols -> (B, T, S, d), zero at PAD and EOP."""

    def __init__(self, buckets: int, dim: int) -> None:
        super().__init__()
        self.buckets = buckets
        self.tables = nn.ModuleList(nn.Embedding(buckets, dim) for _ in NGRAM_SIZES)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        ids, real = ngram_ids(patches, self.buckets)  # (B, T, S, 6), (B, T, S)
        out = sum(table(ids[..., j]) for j, table in enumerate(self.tables))  # (B, T, S, d)
        return out * real.unsqueeze(-1).to(out.dtype)

    def rows(self, patches: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """`forward` at the flat positions `rows` (N,) of (B, T, S) only -> (N, d): the packed local encoder's."""
        ids, real = ngram_ids(patches, self.buckets)  # (B, T, S, 6), (B, T, S): hashes read the whole stream
        ids = ids.reshape(-1, len(NGRAM_SIZES)).index_select(0, rows)  # (N, 6)
        out = sum(table(ids[:, j]) for j, table in enumerate(self.tables))  # (N, d)
        return out * real.reshape(-1).index_select(0, rows).unsqueeze(-1).to(out.dtype)
