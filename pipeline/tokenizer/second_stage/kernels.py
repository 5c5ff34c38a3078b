"""Fast paths for the two hot loops, with the pure-Python reference as a fallback.

`_merge_core.c` (C, built by `pip install`) and the Python functions in
`pair_merges` / `hbpe_merges` implement the same semantics; tests check that they
agree merge for merge and symbol for symbol.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Sequence

import numpy as np

from hbpe.pipeline.tokenizer import pair_merges
from hbpe.pipeline.tokenizer.second_stage import apply
from hbpe.schemas.errors import ConfigError
from hbpe.schemas.symbols import FIRST_MERGE_ID

try:
    from hbpe.pipeline.tokenizer.second_stage import _merge_core
except ImportError:  # a source checkout that was never `pip install`ed
    _merge_core = None


def _flatten(seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int32, count=int(offsets[-1]))
    return flat, offsets


def _warn_slow() -> None:
    warnings.warn(
        "hbpe's C kernels are not built (_merge_core.c); using the pure-Python reference, "
        "which is ~50x slower. Fix: `pip install -e .` (needs a C compiler).",
        RuntimeWarning,
        stacklevel=3,
    )


def train_merges(
    entries: Sequence[Sequence[int]], max_patch_size: int, *, native: bool = True
) -> list[tuple[int, int]]:
    """Algorithm 1: merges in learned order over raw patches (each entry counted once)."""
    if max_patch_size < 2:
        raise ConfigError(f"max patch size S must be >= 2 (one byte plus EOP), got {max_patch_size}")
    if native and _merge_core is not None:
        flat, offsets = _flatten(entries)
        pairs = np.frombuffer(_merge_core.train_merges(flat, offsets, max_patch_size, FIRST_MERGE_ID), dtype=np.int32)
        return [(int(a), int(b)) for a, b in pairs.reshape(-1, 2)]
    if native:
        _warn_slow()
    counter = itertools.count(FIRST_MERGE_ID)
    learned = pair_merges.learn_merges(
        [list(e) for e in entries],
        [1] * len(entries),
        next_id=lambda _pair: next(counter),
        is_active=lambda s: len(s) > max_patch_size,
    )
    return [pair for pair, _ in learned]


def apply_merges_flat(
    seqs: Sequence[Sequence[int]], merges: Sequence[tuple[int, int]], *, max_patch_size: int, mode: str
) -> tuple[np.ndarray, np.ndarray]:
    """Like apply_merges_many, but returns (flat int32 symbols, int64 offsets) for vectorized use."""
    if _merge_core is None:
        return _flatten(apply_merges_many(seqs, merges, max_patch_size=max_patch_size, mode=mode))
    flat, offsets = _flatten(seqs)
    mrg = np.asarray(merges, dtype=np.int32).reshape(-1, 2)
    out, out_off = _merge_core.apply_merges(flat, offsets, mrg, max_patch_size, mode == "minimal", FIRST_MERGE_ID)
    return np.frombuffer(out, dtype=np.int32), np.frombuffer(out_off, dtype=np.int64)


def apply_merges_many(
    seqs: Sequence[Sequence[int]],
    merges: Sequence[tuple[int, int]],
    *,
    max_patch_size: int,
    mode: str,
    native: bool = True,
) -> list[list[int]]:
    """Apply merges (in rank order; `minimal` stops at <= S) to every sequence."""
    if native and _merge_core is not None:
        flat, offsets = _flatten(seqs)
        mrg = np.asarray(merges, dtype=np.int32).reshape(-1, 2)
        out, out_off = _merge_core.apply_merges(flat, offsets, mrg, max_patch_size, mode == "minimal", FIRST_MERGE_ID)
        out_a = np.frombuffer(out, dtype=np.int32).tolist()
        bounds = np.frombuffer(out_off, dtype=np.int64).tolist()
        return [out_a[bounds[i] : bounds[i + 1]] for i in range(len(seqs))]
    if native:
        _warn_slow()
    return apply.replay_merges(list(seqs), merges, max_patch_size=max_patch_size, mode=mode)
