"""The BPE merge loop with incremental pair counts, shared by both training stages.

Recounting every pair after each merge costs O(corpus) per merge (about 5 s for
o200k_base at S=6). Here each merge only touches the sequences that contain the
pair, via an inverted index, and the most frequent pair comes from a lazy heap:

- only pairs that contain the newly merged symbol can gain occurrences (merging
  replaces two neighbours by one; every other adjacency existed before), so only
  those are pushed after a merge;
- every other pair can only lose occurrences, so a heap entry whose stored count
  is stale is simply re-pushed with its current (smaller) count when popped.

Ties go to the smallest (left, right) pair because heap entries are
(-count, pair) tuples.

Worked micro-example (one sequence, weight 1, merging until none repeats):
    [1, 2, 3, 1, 2]  -> pair (1, 2) occurs twice -> new id 4 -> [4, 3, 4]
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Sequence


def merge_pair(seq: Sequence[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """Replace occurrences of `pair` left to right, non-overlapping.

    >>> merge_pair([1, 2, 3, 1, 2], (1, 2), 4)
    [4, 3, 4]
    >>> merge_pair([7, 7, 7], (7, 7), 9)  # "aaa": the first two merge, the third stays
    [9, 7]
    """
    a, b = pair
    out: list[int] = []
    i, n = 0, len(seq)
    while i < n:
        if i + 1 < n and seq[i] == a and seq[i + 1] == b:
            out.append(new_id)
            i += 2
        else:
            out.append(seq[i])
            i += 1
    return out


def learn_merges(
    seqs: list[list[int]],
    weights: Sequence[int],
    *,
    next_id: Callable[[tuple[int, int]], int],
    is_active: Callable[[list[int]], bool],
    max_merges: int | None = None,
    min_count: int = 1,
    on_merge: Callable[[int], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> list[tuple[tuple[int, int], int]]:
    """Learn merges over `seqs` (modified in place) until no active pair is left.

    Args:
        seqs: symbol sequences; each is rewritten as merges are applied.
        weights: how many times each sequence counts (1 for a vocabulary, word counts for a corpus).
        next_id: the id given to a merged pair (usually a counter; the first stage may reuse an id).
        is_active: whether a sequence still takes part (is counted and rewritten).
        max_merges: stop after this many merges.
        min_count: stop when the most frequent pair occurs fewer times than this.
        on_merge: called with the number of merges so far (progress reporting).
        stop: checked before each merge; True ends training (e.g. a vocabulary size reached).

    Returns:
        [(pair, new_id)] in the order learned.
    """
    active = [is_active(s) for s in seqs]
    counts: dict[tuple[int, int], int] = defaultdict(int)
    where: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, s in enumerate(seqs):
        if not active[i]:
            continue
        w = weights[i]
        for p in set(zip(s, s[1:])):
            where[p].append(i)
        for p in zip(s, s[1:]):
            counts[p] += w
    heap = [(-c, p) for p, c in counts.items()]
    heapq.heapify(heap)

    merges: list[tuple[tuple[int, int], int]] = []
    while heap and (max_merges is None or len(merges) < max_merges) and not (stop and stop()):
        neg, pair = heapq.heappop(heap)
        current = counts.get(pair, 0)
        if current != -neg:
            if current > 0:
                heapq.heappush(heap, (-current, pair))
            continue
        if current < min_count:
            break
        new = next_id(pair)
        merges.append((pair, new))
        a, b = pair
        fresh: set[tuple[int, int]] = set()
        # The index is lazy: it may list a sequence twice or one that lost the pair.
        for i in sorted(set(where.pop(pair, ()))):
            if not active[i]:
                continue
            s = seqs[i]
            out = merge_pair(s, pair, new)
            if len(out) == len(s):
                continue
            w = weights[i]
            for p in zip(s, s[1:]):
                counts[p] -= w
            seqs[i] = out
            if not is_active(out):
                active[i] = False
                continue
            for p in zip(out, out[1:]):
                counts[p] += w
                if new in p:
                    fresh.add(p)
                    where[p].append(i)
        counts.pop(pair, None)
        for p in sorted(fresh):
            if counts[p] > 0:
                heapq.heappush(heap, (-counts[p], p))
        if on_merge is not None:
            on_merge(len(merges))
    return merges
