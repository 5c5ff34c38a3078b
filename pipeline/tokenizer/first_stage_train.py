"""Train a first-stage byte-level BPE in-house, written as a tiktoken rank file.

The paper's vocabulary ablation needs 50K/200K/500K-token first stages. Words are
the split pattern's pieces (cl100k's pattern by default), weighted by corpus
count; merges use the same incremental engine as the second stage. Ranks are
byte strings (tiktoken's model), so a merge whose bytes already exist reuses that
token instead of adding a duplicate.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

import regex

from hbpe.pipeline.tokenizer.first_stage import DEFAULT_SPECIAL_TOKEN, format_rank_file, resolve_pattern
from hbpe.pipeline.tokenizer.pair_merges import learn_merges
from hbpe.schemas.errors import ConfigError


def count_pretokens(texts: Iterable[str], pattern: str) -> Counter[bytes]:
    """How often each pre-token (a match of the split pattern, as UTF-8) occurs: BPE's training input.

    Not `count_words` (whitespace-separated words, fertility's denominator): the pattern splits
    "hello, world" into "hello", ",", " world".
    """
    pat = regex.compile(resolve_pattern(pattern))
    words: Counter[bytes] = Counter()
    for text in texts:
        words.update(m.encode("utf-8") for m in pat.findall(text))
    return words


def train_ranks(
    words: Counter[bytes], vocab_size: int, *, min_count: int = 2, on_merge: Callable[[int], None] | None = None
) -> dict[bytes, int]:
    """Ranks (token bytes -> id) of a BPE with at most `vocab_size` tokens, 256 single bytes first."""
    if vocab_size < 256:
        raise ConfigError(f"vocab_size must be >= 256 (all single bytes), got {vocab_size}")
    id_bytes = [bytes([b]) for b in range(256)]
    ranks = {b: i for i, b in enumerate(id_bytes)}

    def next_id(pair: tuple[int, int]) -> int:
        merged = id_bytes[pair[0]] + id_bytes[pair[1]]
        if merged not in ranks:
            ranks[merged] = len(id_bytes)
            id_bytes.append(merged)
        return ranks[merged]

    ordered = sorted(words.items())  # deterministic, whatever the Counter's insertion order
    learn_merges(
        [list(w) for w, _ in ordered],
        [c for _, c in ordered],
        next_id=next_id,
        is_active=lambda s: len(s) > 1,
        min_count=min_count,
        stop=lambda: len(id_bytes) >= vocab_size,
        on_merge=on_merge,
    )
    return ranks


def write_encoding(ranks: dict[bytes, int], out_path: str | Path, *, pattern: str, name: str | None = None) -> Path:
    """Write `NAME.tiktoken` plus a sidecar `NAME.json` (pattern, special tokens) that loading reads."""
    out = Path(out_path)
    if out.suffix != ".tiktoken":
        out = out / "encoding.tiktoken" if out.is_dir() or not out.suffix else out.with_suffix(".tiktoken")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(format_rank_file(ranks))
    meta = {
        "name": name or out.stem,
        "pattern": resolve_pattern(pattern),
        "special_tokens": {DEFAULT_SPECIAL_TOKEN: len(ranks)},
        "n_vocab": len(ranks) + 1,
    }
    out.with_suffix(".json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return out
