"""Applying second-stage merges: to one patch, or replayed over a whole vocabulary.

Two modes (SPEC section 1):
- `full`: apply every merge in rank order (standard BPE application).
- `minimal`: apply merges in rank order but stop as soon as the patch is <= S,
  which reproduces exactly the forms the training loop produced.

Applying "every merge in rank order" equals repeatedly merging the lowest-ranked
pair present: a merge can only create pairs that contain its new id, which is
newer than every earlier merge, so a skipped earlier merge never becomes
applicable later.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from hbpe.pipeline.tokenizer.pair_merges import merge_pair
from hbpe.schemas.symbols import EOP, FIRST_MERGE_ID


def apply_merges(
    symbols: Sequence[int], ranks: dict[tuple[int, int], int], *, max_patch_size: int, mode: str
) -> list[int]:
    """Apply merges (pair -> rank) to one symbol sequence, e.g. a patch `bytes + [EOP]`.

    Merge k gives id 259 + k; the lowest-ranked pair present is merged first, left to right.
    With merges aa -> 259, (259, a) -> 260, (260, b) -> 261 and (b, EOP) -> 262, the patch of
    b"aaab" is [97, 97, 97, 98, EOP]:

    >>> ranks = {(97, 97): 0, (259, 97): 1, (260, 98): 2, (98, 256): 3}
    >>> apply_merges([97, 97, 97, 98, 256], ranks, max_patch_size=3, mode="full")
    [261, 256]
    >>> apply_merges([97, 97, 97, 98, 256], ranks, max_patch_size=3, mode="minimal")  # stops at <= S
    [260, 98, 256]
    """
    seq = list(symbols)
    while len(seq) > 1:
        if mode == "minimal" and len(seq) <= max_patch_size:
            break
        best = min(zip(seq, seq[1:]), key=lambda p: ranks.get(p, 1 << 62))
        rank = ranks.get(best)
        if rank is None:
            break
        seq = merge_pair(seq, best, FIRST_MERGE_ID + rank)
    return seq


def replay_merges(
    seqs: list[list[int]], merges: Sequence[tuple[int, int]], *, max_patch_size: int, mode: str
) -> list[list[int]]:
    """Apply all merges to many sequences at once, touching only those that hold each pair.

    Equivalent to `apply_merges` on each sequence, but costs about as much as training.
    """
    ranks = {pair: k for k, pair in enumerate(merges)}
    out = [list(s) for s in seqs]

    def active(s: list[int]) -> bool:
        return len(s) > 1 and (mode == "full" or len(s) > max_patch_size)

    where: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, s in enumerate(out):
        if active(s):
            for p in set(zip(s, s[1:])):
                if p in ranks:
                    where[p].append(i)
    for k, pair in enumerate(merges):
        new = FIRST_MERGE_ID + k
        for i in sorted(set(where.pop(pair, ()))):
            s = out[i]
            if not active(s):
                continue
            merged = merge_pair(s, pair, new)
            if len(merged) == len(s):
                continue
            out[i] = merged
            if active(merged):
                for p in zip(merged, merged[1:]):
                    if new in p and p in ranks:
                        where[p].append(i)
    return out


def patch_of(token: bytes) -> list[int]:
    """A first-stage token as a raw patch: its bytes followed by EOP (length counts the EOP)."""
    return [*token, EOP]
