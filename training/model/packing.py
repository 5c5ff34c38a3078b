"""Packed local positions: the real symbols of M patches as one (N, d) tensor, no PAD.

A batch stores every patch as S symbols, real ones first and PAD after (a patch of a 4K
first stage at S = 10 holds 4.3 real symbols on average: 57% of a padded local model's
positions are PAD). The local models' position-wise work (embeddings, norms, projections,
FFN, the decoder's head and loss) runs on the N real positions only, gathered row-major:

    real (M, S) bool  ->  rows (N,) = the flat indices m * S + s of the True entries

Attention is the one step that mixes positions, and it stays within a patch: the packed
q, k, v are copied into an (M, L, ...) scratch of the batch's longest real patch
(L <= S) and one SDPA call runs there under the same masks as the padded model, then the
real rows are gathered back. Attention is ~3% of a local layer's FLOPs at these widths
(2*2*L*d per position against 2*(4 d^2 + 3 d f)), so its scratch is the only PAD left;
one SDPA call measured faster on CPU than one per patch length (tests/training/
test_packed_local.py holds both layouts equal). `padded_attention_share` counts it.

>>> real = torch.tensor([[True, True, False], [True, False, False]])
>>> p = PatchPacking.from_real(real)
>>> p.rows.tolist(), p.patch.tolist(), p.col.tolist(), p.width
([0, 1, 3], [0, 0, 1], [0, 1, 0], 2)
>>> p.scratch_rows.tolist()  # where each row sits in the (M, L) attention scratch
[0, 1, 2]
>>> p.gather(torch.arange(4.0).view(2, 2, 1)).squeeze(-1).tolist()  # scratch -> the real rows
[0.0, 1.0, 2.0]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hbpe.schemas.errors import HbpeError


@dataclass(frozen=True)
class PatchPacking:
    """Where the N real positions of M patches of S slots sit, and the attention scratch (M, L) they fill."""

    rows: torch.Tensor  # (N,) flat index m * S + s into the (M, S) layout, row-major
    patch: torch.Tensor  # (N,) m: the patch of each real position
    col: torch.Tensor  # (N,) s: its slot within the patch (its RoPE position)
    scratch_rows: torch.Tensor  # (N,) flat index m * L + s into the (M, L) attention scratch
    key_mask: torch.Tensor  # (M, L) True at real positions: the keys a query may attend to
    counts: torch.Tensor  # (M,) real positions per patch
    patches: int  # M
    width: int  # L: the longest patch's real positions (0 when there are none)

    @classmethod
    def from_real(cls, real: torch.Tensor) -> PatchPacking:
        """From a (M, S) mask of real positions; each row's real positions must come first (a prefix)."""
        M, S = real.shape
        if bool((real[:, 1:] & ~real[:, :-1]).any()):
            raise HbpeError("internal: a patch has a real symbol after PAD; the packed local models need PAD last")
        counts = real.sum(1)  # (M,)
        width = int(counts.max()) if M else 0
        patch, col = real.nonzero(as_tuple=True)  # (N,), (N,) row-major
        key_mask = torch.arange(width, device=real.device)[None, :] < counts[:, None]  # (M, L)
        return cls(
            rows=patch * S + col,
            patch=patch,
            col=col,
            scratch_rows=patch * width + col,
            key_mask=key_mask,
            counts=counts,
            patches=M,
            width=width,
        )

    @property
    def size(self) -> int:
        """N: real positions."""
        return int(self.rows.numel())

    def gather(self, grid: torch.Tensor) -> torch.Tensor:
        """(M, L, C) scratch -> (N, C) rows at the real positions."""
        return grid.reshape(self.patches * self.width, -1).index_select(0, self.scratch_rows)  # (N, C)

    def padded_attention_share(self) -> tuple[int, int]:
        """(query-key pairs the scratch attention computes, pairs between real positions)."""
        return self.patches * self.width * self.width, int((self.counts * self.counts).sum())
