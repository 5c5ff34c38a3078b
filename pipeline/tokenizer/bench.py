"""`hbpe bench tokenizer` and `hbpe bench sweep`: second-stage cost next to raw tiktoken.

Everything is timed in one process on the same text, so ratios are meaningful on
any machine. Wall-clock best-of-N for each measurement.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from hbpe.pipeline.tokenizer import artifact
from hbpe.pipeline.tokenizer.first_stage import load_encoding, vocabulary_tokens
from hbpe.pipeline.tokenizer.hierarchical import HierarchicalTokenizer
from hbpe.pipeline.tokenizer.second_stage import kernels
from hbpe.pipeline.tokenizer.second_stage.apply import patch_of


def _best_of(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _interleaved(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Best-of-N per function, alternating them each round so machine noise hits all alike."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)
    return best


def bench_tokenizer(tok: HierarchicalTokenizer, texts: list[str], *, repeat: int = 3, threads: int = 2) -> dict:
    enc = tok.encoding
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    entries = [patch_of(b) for _, b in vocabulary_tokens(enc)]

    def hbpe_single() -> None:
        for t in texts:
            tok.patches(tok.encode(t))

    def hbpe_batch() -> None:
        tok.encode_patches_batch(texts, num_threads=threads)

    times = _interleaved(
        {
            "second_stage_train_s": lambda: kernels.train_merges(entries, tok.max_patch_size),
            "tiktoken_encode_ordinary": lambda: [enc.encode_ordinary(t) for t in texts],
            "hbpe_encode": hbpe_single,
            "tiktoken_encode_ordinary_batch": lambda: enc.encode_ordinary_batch(texts, num_threads=threads),
            "hbpe_encode_batch": hbpe_batch,
        },
        repeat,
    )
    mbps = {k: mb / v for k, v in times.items() if k != "second_stage_train_s"}
    return {
        "encoding": enc.name,
        "max_patch_size": tok.max_patch_size,
        "mode": tok.mode,
        "merges": len(tok.merges),
        "vocab_size": tok.vocab_size,
        "corpus_mb": mb,
        "threads": threads,
        "second_stage_train_s": times["second_stage_train_s"],
        "mb_per_s": mbps,
        "ratio_single": mbps["hbpe_encode"] / mbps["tiktoken_encode_ordinary"],
        "ratio_batch": mbps["hbpe_encode_batch"] / mbps["tiktoken_encode_ordinary_batch"],
    }


def bench_sweep(encodings: list[str], sizes: list[int], texts: list[str], *, repeat: int = 3) -> list[dict]:
    """Merges, V', training time and symbols/patch (both modes) per encoding and S."""
    rows = []
    for name in encodings:
        enc = load_encoding(name)
        entries = [patch_of(b) for _, b in vocabulary_tokens(enc)]
        ids = np.concatenate([np.asarray(x, dtype=np.int64) for x in enc.encode_ordinary_batch(texts, num_threads=2)])
        nbytes = sum(len(t.encode("utf-8")) for t in texts)
        for S in sizes:
            train_s = _best_of(lambda S=S, entries=entries: kernels.train_merges(entries, S), repeat)
            row = {"encoding": name, "S": S, "train_s": train_s, "bytes_per_patch": nbytes / len(ids)}
            for mode in ("full", "minimal"):
                tok = artifact.train_tokenizer(enc, max_patch_size=S, mode=mode)
                row["merges"], row["vocab_size"] = len(tok.merges), tok.vocab_size
                row[f"symbols_per_patch_{mode}"] = float(tok.patch_lengths[ids].mean())
            rows.append(row)
    return rows
