"""Transformer building blocks shared by the latent and local models (plain PyTorch + SDPA).

Attention takes an optional KV cache so generation advances one position at a
time; without a cache it is ordinary (masked) self-attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hbpe.training.model.packing import PatchPacking
from hbpe.training.model.patch_attention import native_applies, patch_attention
from hbpe.training.model.tiles import TileRows


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def _rope_precision(x: torch.Tensor) -> torch.Tensor:
    """RoPE's products run in fp32 at least: bf16/fp16 rise to fp32, fp64 stays fp64 (the native packed kernel
    and kv_decode's tables rotate fp64 rows in fp64 too; the factors are fp32 values in every case)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of x (B, H, L, Dh) at integer positions (L,).

    Each channel pair (x1, x2) turns by its angle: (x1 cos - x2 sin, x1 sin + x2 cos), computed as one
    complex product in fp32 (3.4x faster forward + backward on CPU than strided halves and a stack,
    measured on the mini's packed rows; equal to 5e-7).
    """
    dh = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, dh, 2, device=x.device, dtype=torch.float32) / dh))
    ang = positions.to(torch.float32)[:, None] * inv[None, :]  # (L, Dh/2)
    turn = torch.polar(torch.ones_like(ang), ang)  # (L, Dh/2) complex: cos + i sin
    pairs = torch.view_as_complex(_rope_precision(x).reshape(*x.shape[:-1], dh // 2, 2))  # (B, H, L, Dh/2): x1 + i x2
    return torch.view_as_real(pairs * turn).flatten(-2).type_as(x)  # (B, H, L, Dh)


def rotate_rows(x: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """`rope` of packed rows x (N, H, Dh) by their factors (N, 1, Dh/2) (PatchPacking.rotation): the same products."""
    # Dh // 2, not -1: with no rows (no real decoder target in the batch) -1 is ambiguous and reshape refuses
    pairs = torch.view_as_complex(_rope_precision(x).reshape(*x.shape[:-1], x.shape[-1] // 2, 2))  # (N, H, Dh/2)
    return torch.view_as_real(pairs * rotation).flatten(-2).type_as(x)  # (N, H, Dh)


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`rope` of rows x (..., Dh) by tables cos, sin (..., Dh/2) in x's dtype: real products, no complex temporary
    and no fp32 copy of x (the tiles path: bf16 stays bf16 under autocast)."""
    a, b = x.unflatten(-1, (-1, 2)).unbind(-1)  # (..., Dh/2) each: the channel pairs (x1, x2)
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


# tiles per SDPA call: CUDA's memory-efficient kernel puts the batch (here the tiles) on its grid's z axis, which
# holds 65,535 blocks (torch 2.7 fails beyond: pytorch/pytorch#146704); a batch of small with byte patches, or
# seq_len 1024, passes it
SDPA_BATCH_LIMIT = 65_535


class TileAttention:
    """What every layer of one local stack shares over the loader's tiles: the mask and RoPE's tables, once."""

    def __init__(self, rows: TileRows, *, causal: bool, head_dim: int, theta: float, dtype: torch.dtype) -> None:
        self.width = rows.width
        self.mask = rows.mask(causal=causal)  # (tiles, 1, W, W)
        self.cos, self.sin = rows.rope_tables(head_dim, theta, dtype)  # (R, 1, Dh/2) each


class KVCache:
    """Keys and values of past positions for each layer of one transformer.

    `length` counts the positions of *completed* forward passes: `Transformer.forward`
    advances it once, after every layer has appended its keys. Reading the length off a
    layer's tensors instead would give layers 1.. a start position already moved by
    layer 0 of the same step, and their RoPE angles would be off by L.
    """

    def __init__(self) -> None:
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}
        self.length = 0


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, theta: float, dropout: float) -> None:
        super().__init__()
        self.heads, self.theta, self.dropout = heads, theta, dropout
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        *,
        causal: bool,
        key_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
        layer: int = 0,
        packing: PatchPacking | None = None,
        native: bool = False,
        tiles: TileAttention | None = None,
    ) -> torch.Tensor:
        if tiles is not None:
            return self._tiles(x, tiles)
        if packing is not None and native:  # rows in row-major order, one kernel call (patch_attention.py)
            y = patch_attention(self.qkv(x), packing, heads=self.heads, theta=self.theta, causal=causal)
            return self.out(y)
        if packing is not None:
            return self._packed(x, packing, causal=causal)
        B, L, D = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)  # 3 x (B, H, L, Dh)
        start = cache.length if cache is not None else 0
        pos = torch.arange(start, start + L, device=x.device)
        q, k = rope(q, pos, self.theta), rope(k, pos, self.theta)
        if cache is not None:
            if layer in cache.k:
                k = torch.cat([cache.k[layer], k], dim=2)
                v = torch.cat([cache.v[layer], v], dim=2)
            cache.k[layer], cache.v[layer] = k, v
        mask = None
        if key_mask is not None:  # (B, Lk) True = attend
            mask = key_mask[:, None, None, :]
        # SDPA's own causal kernel, no mask: decided without shapes, so that under a compiled block with dynamic
        # shapes it stays a Python bool (SDPA refuses a SymBool: a graph break in every latent block). Without a
        # cache the keys are the queries (k.shape[2] == L), and for L == 1 causal attention is the one key anyway
        plain_causal = causal and mask is None and cache is None
        if causal and L > 1 and not plain_causal:
            tri = torch.ones(L, k.shape[2], dtype=torch.bool, device=x.device).tril(diagonal=k.shape[2] - L)
            mask = tri if mask is None else (mask & tri)
        drop = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop, is_causal=plain_causal)
        return self.out(y.transpose(1, 2).reshape(B, L, D))

    def _packed(self, x: torch.Tensor, packing: PatchPacking, *, causal: bool) -> torch.Tensor:
        """Packed rows x (N, D) in length order (packing.py) -> (N, D); each patch attends within itself.

        The projections run on the N rows. The patches of one length are one contiguous block of rows, so
        q, k, v of a block are views (c, H, l, Dh) of the projection and one SDPA call per length needs no
        mask: every key in a block is real, and a causal model's queries see their own patch's earlier
        symbols through SDPA's causal kernel. A 1-symbol patch attends only to itself: its output is its v
        (in training with dropout its one weight is dropped as any other, so it goes through SDPA too).
        """
        N, D = x.shape
        H, Dh = self.heads, D // self.heads
        qk, v = self.qkv(x).view(N, 3, H, Dh).split([2, 1], dim=1)  # (N, 2, H, Dh), (N, 1, H, Dh)
        qk = rotate_rows(qk.reshape(N, 2 * H, Dh), packing.rotation(Dh, self.theta)).view(N, 2, H, Dh)
        v = v.squeeze(1)  # (N, H, Dh)
        drop = self.dropout if self.training else 0.0
        # split, not slices: a slice's backward fills a zero tensor of all N rows per block, split's is one cat
        sizes = [c * length for _, c, length in packing.buckets]
        blocks = []
        for (_, c, length), qk_b, v_b in zip(packing.buckets, qk.split(sizes), v.split(sizes), strict=True):
            if length == 1 and not drop:  # softmax over one key: the output is that key's value (dropout drops it)
                blocks.append(v_b.reshape(c, D))
                continue
            q, k = qk_b.view(c, length, 2, H, Dh).permute(2, 0, 3, 1, 4)  # 2 x (c, H, l, Dh)
            vb = v_b.view(c, length, H, Dh).transpose(1, 2)  # (c, H, l, Dh)
            y = F.scaled_dot_product_attention(q, k, vb, dropout_p=drop, is_causal=causal)  # (c, H, l, Dh)
            blocks.append(y.transpose(1, 2).reshape(c * length, D))
        y = torch.cat(blocks) if blocks else v.reshape(N, D)  # (N, D); no rows: an empty batch of them
        return self.out(y)

    def _tiles(self, x: torch.Tensor, tiles: TileAttention) -> torch.Tensor:
        """Rows x (R, D) in the loader's tiles (training/model/tiles.py) -> (R, D): one masked SDPA call over
        (tiles, H, W, Dh), each row attending within its own patch (the mask: causal or not, empty rows to
        themselves). Static shapes, no host sync: the same call for every batch of a bucket's size."""
        R, D = x.shape
        H, Dh, W = self.heads, D // self.heads, tiles.width
        qk, v = self.qkv(x).view(R, 3, H, Dh).split([2, 1], dim=1)  # (R, 2, H, Dh), (R, 1, H, Dh)
        qk = rotate_pairs(qk.reshape(R, 2 * H, Dh), tiles.cos, tiles.sin)  # (R, 2H, Dh)
        q, k = qk.view(-1, W, 2, H, Dh).permute(2, 0, 3, 1, 4)  # 2 x (tiles, H, W, Dh)
        v = v.view(-1, W, H, Dh).transpose(1, 2)  # (tiles, H, W, Dh)
        drop = self.dropout if self.training else 0.0
        n, step = q.shape[0], SDPA_BATCH_LIMIT
        if n <= step:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=tiles.mask, dropout_p=drop)  # (tiles, H, W, Dh)
        else:  # more tiles than one CUDA grid holds: a few calls (a static count: the shapes are static)
            parts = (
                F.scaled_dot_product_attention(q[i : i + step], k[i : i + step], v[i : i + step],
                                               attn_mask=tiles.mask[i : i + step], dropout_p=drop)
                for i in range(0, n, step)
            )  # fmt: skip
            y = torch.cat(list(parts))
        return self.out(y.transpose(1, 2).reshape(R, D))


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    """Pre-norm transformer block: the unit FSDP wraps and activation checkpointing recomputes."""

    def __init__(self, dim: int, ffn: int, heads: int, theta: float, dropout: float) -> None:
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.attn = Attention(dim, heads, theta, dropout)
        self.mlp = SwiGLU(dim, ffn)

    def forward(
        self,
        x: torch.Tensor,
        *,
        causal: bool,
        key_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
        layer: int = 0,
        packing: PatchPacking | None = None,
        native: bool = False,
        tiles: TileAttention | None = None,
    ) -> torch.Tensor:
        h = self.norm1(x)
        attn = self.attn(
            h, causal=causal, key_mask=key_mask, cache=cache, layer=layer, packing=packing, native=native, tiles=tiles
        )
        x = x + attn
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    def __init__(
        self,
        *,
        layers: int,
        dim: int,
        ffn: int,
        heads: int,
        theta: float = 10000.0,
        dropout: float = 0.0,
        packed_attention: str = "auto",
    ) -> None:
        super().__init__()
        self.heads, self.dropout, self.packed_attention, self.theta = heads, dropout, packed_attention, theta
        self.blocks = nn.ModuleList(Block(dim, ffn, heads, theta, dropout) for _ in range(layers))
        self.norm = RMSNorm(dim)

    def forward(
        self,
        x: torch.Tensor,
        *,
        causal: bool,
        key_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
        packing: PatchPacking | None = None,
        tiles: TileRows | None = None,
    ) -> torch.Tensor:
        """x (B, L, D), or with `packing` the real positions of M patches as rows (N, D) (training/model/packing.py),
        or with `tiles` the rows of the loader's tiles (R, D) (training/model/tiles.py)."""
        if tiles is not None:
            return self._tiled(x, tiles, causal=causal)
        native = packing is not None and native_applies(
            x,
            packing,
            heads=self.heads,
            choice=self.packed_attention,
            dropout=self.dropout if self.training else 0.0,
        )
        blocks = packing is not None and not native
        if blocks:  # the torch path's blocks run on length-ordered rows; row-major order in and out
            x = x.index_select(0, packing.order)
        for i, block in enumerate(self.blocks):
            x = block(x, causal=causal, key_mask=key_mask, cache=cache, layer=i, packing=packing, native=native)
        if cache is not None:
            cache.length += x.shape[1]  # every layer of this pass used the same start position
        if blocks:
            x = x.index_select(0, packing.inverse)
        return self.norm(x)

    def _tiled(self, x: torch.Tensor, rows: TileRows, *, causal: bool) -> torch.Tensor:
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        shared = TileAttention(rows, causal=causal, head_dim=x.shape[-1] // self.heads, theta=self.theta, dtype=dtype)
        for block in self.blocks:
            x = block(x, causal=causal, tiles=shared)
        return self.norm(x)
