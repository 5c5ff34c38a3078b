"""The step's side of the loader's tiles (training/data/tile_layout.py): the rows of one local stack, local to
a (micro)batch, its attention mask and RoPE tables. Static shapes, no data-dependent op."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hbpe.training.data.tile_layout import (  # the layout's names, re-exported: the model reads them from here
    COL,
    DEC_TILES,
    ENC_LAST,
    ENC_TILES,
    PATCH,
    SEG,
    SRC,
    TILE_BASE,
    TILE_KEYS,
    tile_width,
)

__all__ = ["COL", "DEC_TILES", "ENC_LAST", "ENC_TILES", "PATCH", "SEG", "SRC", "TILE_BASE", "TILE_KEYS", "TileRows"]


def has_tiles(batch: dict[str, torch.Tensor]) -> bool:
    return ENC_TILES in batch


@dataclass(frozen=True)
class TileRows:
    """One side's rows in the step: local indices (this forward's patches and rows), the tile width."""

    src: torch.Tensor  # (R,) flat index m * S + s into this forward's (M, S) patches
    patch: torch.Tensor  # (R,) m
    col: torch.Tensor  # (R,) s: the RoPE position
    seg: torch.Tensor  # (R,) the segment: rows attend within one
    width: int

    @classmethod
    def from_batch(cls, batch: dict[str, torch.Tensor], key: str, *, max_patch_size: int) -> TileRows:
        cols = batch[key].reshape(-1, 4)  # (R, 4): a microbatch's samples' rows are its group's
        base = batch[TILE_BASE][0, 0]  # the group's first patch (a tensor: no host read)
        patch = cols[:, PATCH] - base
        return cls(
            src=cols[:, SRC] - base * max_patch_size,
            patch=patch,
            col=cols[:, COL],
            seg=cols[:, SEG],
            width=tile_width(max_patch_size),
        )

    @property
    def real(self) -> torch.Tensor:
        """(R,) bool: rows that hold a symbol of a patch (the rest are empty)."""
        return self.seg >= 0

    def mask(self, *, causal: bool) -> torch.Tensor:
        """(tiles, 1, W, W) bool, True = attend: the same segment (causal: and not a later row)."""
        seg = self.seg.view(-1, self.width)
        same = seg.unsqueeze(2) == seg.unsqueeze(1)  # (tiles, W, W)
        if causal:  # a patch's rows are consecutive in slot order, so "not later" is the lower triangle
            same = same & torch.ones(self.width, self.width, dtype=torch.bool, device=seg.device).tril()
        return same.unsqueeze(1)

    def rope_tables(self, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (R, 1, Dh/2) of each row's slot, in `dtype`: the angles `layers.rope` computes, in fp32."""
        pairs = torch.arange(0, head_dim, 2, device=self.col.device, dtype=torch.float32)
        inv = 1.0 / (theta ** (pairs / head_dim))
        ang = self.col.to(torch.float32)[:, None] * inv[None, :]  # (R, Dh/2)
        # polar, not cos() and sin(): the same fp32 values as layers.rope's factors (they differ by an ulp)
        turn = torch.polar(torch.ones_like(ang), ang)
        return turn.real.to(dtype).unsqueeze(1), turn.imag.to(dtype).unsqueeze(1)


def local_tile_index(batch: dict[str, torch.Tensor], key: str) -> torch.Tensor:
    """A per-patch row index (ENC_LAST) made local to this forward's rows."""
    side = 1 if key == ENC_LAST else 2
    return batch[key].reshape(-1) - batch[TILE_BASE][0, side]
