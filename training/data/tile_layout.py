"""The loader's packing: each patch's real symbols in fixed tiles, so that a training step has static shapes.

The layout, in numpy (the collator's side); training/model/tiles.py reads it in the step.

`PatchPacking` (packing.py) packs a batch's real symbols on the device, inside the step: `nonzero` and
`bincount(...).tolist()` there wait for the device twice per step (encoder and decoder), every packed
tensor's size depends on the data, and the length blocks make one attention call per patch length per
layer. Here the loader's collator lays the packing out in numpy, in its worker, before the batch reaches
the device; the step reads it as index tensors of fixed size and runs no data-dependent op.

Layout. Rows come in tiles of W = 8 * ceil(S / 8) rows (16 at S = 10). A tile holds patches of one
length l only, floor(W / l) of them, each on consecutive rows; lengths ascend and, within a length,
patches keep their row-major order (the blocks path's order). At batch 64 x 128 and S = 10, 10-12% of the
rows are empty, bucket rounding included (10.4-11.1% at a 4K first stage, 9.9-12.4% with gpt2: measured on
four batches of the k-along and demo shards). Attention over the rows is then one call
per layer on (tiles, heads, W, head_dim) with a block-diagonal mask (`TileRows.mask`): a row attends to
the rows of its own patch (causal: up to itself), an empty row to itself only, so that nothing is ever
undefined and no empty row reaches a real one.

Static shapes. The tile count is rounded up to a bucket of 2^round(log2(M / 128)) tiles (at least 4) for
M patches: 64 tiles (1,024 rows) at small's 64 x 128 patches, which adds at most 1/40 of the rows there
and leaves a handful of distinct shapes over an epoch (a compiled step recompiles once, then runs
dynamic or stays within them). Empty rows are inert: their targets are IGNORE, their pooling weight 0,
and they attend to themselves only, so no real row's output or gradient changes with them.

Microbatches. Composer splits a batch by samples (dim 0 of each tensor), so the collator lays out each
group of `group` samples (the device microbatch) on its own and stores the rows per sample: (B, r, 4)
with r = rows per group / group. Indices are global over the collated batch; `tile_base` (B, 3) gives
each sample its group's first patch and first rows, so a microbatch subtracts its own base.

>>> lay = tile_layout(np.array([2, 1, 2, 3]), width=8)
>>> lay.starts.tolist(), lay.tiles  # lengths 1, 2, 3 in tiles of their own: 1 | 2 2 | 3
([8, 0, 10, 16], 3)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hbpe.schemas.symbols import PAD

ENC_TILES, DEC_TILES, ENC_LAST, TILE_BASE = "enc_tiles", "dec_tiles", "enc_last", "tile_base"
TILE_KEYS = (ENC_TILES, DEC_TILES, ENC_LAST, TILE_BASE)
# columns of ENC_TILES / DEC_TILES: the flat index m * S + s a row reads, its patch m, its slot s, and its
# segment (m for a real row, -(row + 1) for an empty one: unique, so an empty row attends to itself only)
SRC, PATCH, COL, SEG = range(4)


def tile_width(max_patch_size: int) -> int:
    """W: rows per tile, the smallest multiple of 8 that holds the longest patch."""
    return 8 * math.ceil(max_patch_size / 8)


def tile_bucket(patches: int) -> int:
    """Tiles a layout's count is rounded up to: a power of two near patches / 128, at least 4 (module docstring)."""
    return max(4, 2 ** round(math.log2(max(patches, 1) / 128)))


@dataclass(frozen=True)
class TileLayout:
    """Where each patch's first row sits (M,), and the tiles used (before rounding to a bucket)."""

    starts: np.ndarray
    tiles: int


def tile_layout(lengths: np.ndarray, *, width: int) -> TileLayout:
    """Rows for patches of `lengths` (M,) (0: a patch with no row; its start is 0 and never read)."""
    starts = np.zeros(len(lengths), dtype=np.int64)
    tiles = 0
    for length in range(1, width + 1):  # a loop over lengths, never over patches: numpy does the rest
        idx = np.flatnonzero(lengths == length)
        if not idx.size:
            continue
        per_tile = width // length
        j = np.arange(idx.size, dtype=np.int64)
        starts[idx] = (tiles + j // per_tile) * width + (j % per_tile) * length
        tiles += -(-idx.size // per_tile)
    return TileLayout(starts, tiles)


def _rows(lengths: np.ndarray, starts: np.ndarray, *, S: int, rows: int, patch0: int, row0: int) -> np.ndarray:
    """(rows, 4) columns SRC, PATCH, COL, SEG of one group, global indices (its patches from patch0, rows from row0)."""
    out = np.zeros((rows, 4), dtype=np.int64)
    out[:, PATCH] = patch0  # empty rows read a valid patch (inert: see the module docstring)
    out[:, SRC] = patch0 * S
    out[:, SEG] = -(row0 + np.arange(rows, dtype=np.int64) + 1)
    n = int(lengths.sum())
    patch = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)  # (n,) row-major
    first = np.repeat(np.cumsum(lengths) - lengths, lengths)
    slot = np.arange(n, dtype=np.int64) - first  # (n,)
    row = starts[patch] + slot
    out[row, SRC] = (patch0 + patch) * S + slot
    out[row, PATCH] = patch0 + patch
    out[row, COL] = slot
    out[row, SEG] = patch0 + patch
    return out


def tile_batch(patches: np.ndarray, first_target: np.ndarray, *, group: int | None = None) -> dict[str, np.ndarray]:
    """The loader's packing of a batch's patches (B, T + 1, S): the keys `TILE_KEYS` the step reads.

    The encoder reads patches 1..T with each patch's first position kept (an all-PAD tail patch still
    has one row, as in PatchPacking), the decoder the real symbols of patches 2..T+1. `first_target`
    is not needed for the layout (context targets are masked in the step) but fixes B. Samples are laid
    out in groups of `group` (the device microbatch) and a last, smaller group where `group` does not divide
    B: Composer splits a batch so ([g, g, ..., B % g]), and an eval batch may be any size.
    """
    B, T1, S = patches.shape
    T, group = T1 - 1, min(group or B, B)
    width = tile_width(S)
    enc_len = np.maximum((patches[:, :-1] != PAD).sum(-1), 1).reshape(-1)  # (B*T,)
    dec_len = (patches[:, 1:] != PAD).sum(-1).reshape(-1)  # (B*T,)
    groups = [(start, min(group, B - start)) for start in range(0, B, group)]  # (first sample, samples)
    enc = [tile_layout(enc_len[a * T : (a + n) * T], width=width) for a, n in groups]
    dec = [tile_layout(dec_len[a * T : (a + n) * T], width=width) for a, n in groups]
    # tiles per sample: enough for every group, in whole buckets of a full group (module docstring)
    quantum = -(-tile_bucket(group * T) // group)
    enc_t, dec_t = (max(1, max(-(-x.tiles // n) for x, (_, n) in zip(lay, groups, strict=True))) for lay in (enc, dec))
    enc_t, dec_t = (-(-t // quantum) * quantum for t in (enc_t, dec_t))
    enc_parts, dec_parts, last = [], [], np.zeros(B * T, dtype=np.int64)
    base = np.zeros((B, 3), dtype=np.int64)
    for (a, n), e, d in zip(groups, enc, dec, strict=True):
        sl = slice(a * T, (a + n) * T)
        p0, e0, d0 = a * T, a * enc_t * width, a * dec_t * width
        enc_parts.append(_rows(enc_len[sl], e.starts, S=S, rows=n * enc_t * width, patch0=p0, row0=e0))
        dec_parts.append(_rows(dec_len[sl], d.starts, S=S, rows=n * dec_t * width, patch0=p0, row0=d0))
        last[sl] = e0 + e.starts + enc_len[sl] - 1
        base[a : a + n] = (p0, e0, d0)
    return {
        ENC_TILES: np.concatenate(enc_parts).reshape(B, -1, 4),
        DEC_TILES: np.concatenate(dec_parts).reshape(B, -1, 4),
        ENC_LAST: last.reshape(B, T),
        TILE_BASE: base,
    }
