"""Second-stage training: the paper's Algorithm 1 (hierarchical BPE).

    active = entries longer than S
    while active:
        count adjacent pairs over the active entries
        pick the most frequent pair; ties -> the smallest (left, right)
        give it the next id; replace its occurrences left to right in every active entry
        drop entries whose length is now <= S

Entries are the first-stage vocabulary's non-special tokens as `bytes + [EOP]`,
each counted once (a vocabulary, not a corpus); within an entry every adjacent
position counts, overlapping ones included (as in minbpe's get_stats).
"""

from __future__ import annotations

import tiktoken

from hbpe.pipeline.tokenizer.first_stage import vocabulary_tokens
from hbpe.pipeline.tokenizer.second_stage import kernels
from hbpe.pipeline.tokenizer.second_stage.apply import patch_of


def train_for_encoding(enc: tiktoken.Encoding, max_patch_size: int) -> list[tuple[int, int]]:
    """Train the second stage on every non-special token of a first-stage encoding."""
    return kernels.train_merges([patch_of(tok) for _, tok in vocabulary_tokens(enc)], max_patch_size)
