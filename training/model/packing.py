"""Packed local positions: the real symbols of M patches as one (N, d) tensor, no PAD.

A batch stores every patch as S symbols, real ones first and PAD after (a patch of a 4K
first stage at S = 10 holds 4.3 real symbols on average: 57% of a padded local model's
positions are PAD). The local models' position-wise work (embeddings, norms, projections,
FFN, the decoder's head and loss) runs on the N real positions only, gathered row-major:

    real (M, S) bool  ->  rows (N,) = the flat indices m * S + s of the True entries

Attention is the one step that mixes positions, and it stays within a patch. Inside a local
transformer the rows are put in length order (`order`): the patches of one length l are then
one contiguous block of rows, a view (c, l, d) with no PAD at all, and each block is one SDPA
call with no mask (bidirectional: every key is real; causal: SDPA's own causal kernel). The
transformer puts its rows back in row-major order at the end (`inverse`), so that everything
outside it sees `rows`' order. Against one SDPA call over an (M, L) scratch of the longest
patch, which the first packed version used, this drops the scratch's zero fill, the two
copies in and the gather out of every layer (and their backward), and the scratch's PAD
(2.3x the real query-key pairs at a 4K first stage, S = 10); `hbpe bench train` measures it.

>>> real = torch.tensor([[True, True, False], [True, False, False], [True, True, False]])
>>> p = PatchPacking.from_real(real)
>>> p.rows.tolist(), p.patch.tolist(), p.col.tolist()
([0, 1, 3, 6, 7], [0, 0, 1, 2, 2], [0, 1, 0, 0, 1])
>>> p.order.tolist(), p.buckets  # length order: the 1-symbol patch, then the two 2-symbol ones
([2, 0, 1, 3, 4], ((0, 1, 1), (1, 2, 2)))
>>> p.inverse[p.order].tolist()
[0, 1, 2, 3, 4]
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hbpe.schemas.errors import HbpeError


@dataclass(frozen=True)
class PatchPacking:
    """Where the N real positions of M patches of S slots sit, and their length-ordered blocks for attention."""

    rows: torch.Tensor  # (N,) flat index m * S + s into the (M, S) layout, row-major
    patch: torch.Tensor  # (N,) m: the patch of each real position
    col: torch.Tensor  # (N,) s: its slot within the patch (its RoPE position)
    counts: torch.Tensor  # (M,) real positions per patch
    order: torch.Tensor  # (N,) the row-major row at each place of the length order
    inverse: torch.Tensor  # (N,) the place in the length order of each row-major row
    buckets: tuple[tuple[int, int, int], ...]  # (first place, patches, length) of each length present, ascending
    patches: int  # M
    _rotations: dict = field(default_factory=dict, compare=False, repr=False)  # (Dh, theta) -> RoPE factors

    @classmethod
    def from_real(cls, real: torch.Tensor) -> PatchPacking:
        """From a (M, S) mask of real positions; each row's real positions must come first (a prefix)."""
        M, S = real.shape
        if bool((real[:, 1:] & ~real[:, :-1]).any()):
            raise HbpeError("internal: a patch has a real symbol after PAD; the packed local models need PAD last")
        counts = real.sum(1)  # (M,)
        patch, col = real.nonzero(as_tuple=True)  # (N,), (N,) row-major
        # a stable sort by patch length keeps row-major order within a length: patch by patch, slot by slot
        order = torch.argsort(counts.index_select(0, patch), stable=True)  # (N,)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device)
        per_length = torch.bincount(counts, minlength=S + 1).tolist()  # patches of each length 0..S
        buckets, start = [], 0
        for length in range(1, S + 1):
            if per_length[length]:
                buckets.append((start, per_length[length], length))
                start += per_length[length] * length
        return cls(
            rows=patch * S + col,
            patch=patch,
            col=col,
            counts=counts,
            order=order,
            inverse=inverse,
            buckets=tuple(buckets),
            patches=M,
        )

    @property
    def size(self) -> int:
        """N: real positions."""
        return int(self.rows.numel())

    def rotation(self, head_dim: int, theta: float) -> torch.Tensor:
        """RoPE's unit complex factors (N, 1, Dh/2) at each length-ordered row's slot: computed once per
        packing and shared by every layer of the stack (layers.rotate_rows)."""
        key = (head_dim, theta)
        if key not in self._rotations:
            inv = self._frequencies(head_dim, theta)
            ang = self.col.index_select(0, self.order).to(torch.float32)[:, None] * inv[None, :]  # (N, Dh/2)
            self._rotations[key] = torch.polar(torch.ones_like(ang), ang).unsqueeze(1)  # (N, 1, Dh/2)
        return self._rotations[key]

    def rotation_table(self, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE's factors as two tables (L, Dh/2), cos and sin at slots 0..L-1 (L: the longest patch), for the
        native kernel (patch_attention.py): the values of `rotation`, computed once per packing."""
        key = ("table", head_dim, theta, dtype)
        if key not in self._rotations:
            longest = int(self.counts.max()) if self.counts.numel() else 0
            inv = self._frequencies(head_dim, theta)
            ang = torch.arange(longest, device=self.col.device).to(torch.float32)[:, None] * inv[None, :]
            turn = torch.polar(torch.ones_like(ang), ang)  # (L, Dh/2)
            self._rotations[key] = (turn.real.to(dtype).contiguous(), turn.imag.to(dtype).contiguous())
        return self._rotations[key]

    def _frequencies(self, head_dim: int, theta: float) -> torch.Tensor:
        """RoPE's angle per slot of each channel pair (Dh/2,), fp32, as layers.rope computes them."""
        pairs = torch.arange(0, head_dim, 2, device=self.col.device, dtype=torch.float32)
        return 1.0 / (theta ** (pairs / head_dim))

    def attention_pairs(self) -> int:
        """Query-key pairs the packed attention computes: sum over patches of length^2 (no PAD)."""
        return int((self.counts * self.counts).sum())
