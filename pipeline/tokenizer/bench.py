"""`hbpe bench tokenizer`, `sweep` and `first-stage`: tokenizer costs next to a reference.

`tokenizer` and `sweep` time the second stage next to raw tiktoken in one process on the
same text, so ratios are meaningful on any machine (wall-clock best-of-N); `tokenizer` also
times loading the artifact with its built tables and without them (medians). `first-stage`
runs the in-house and HF first-stage trainers on the same word counts, each in a fresh
process so that peak memory is its own.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hbpe.pipeline import storage
from hbpe.pipeline.tokenizer import artifact, tables
from hbpe.pipeline.tokenizer.first_stage import load_encoding, parse_rank_file, vocabulary_tokens
from hbpe.pipeline.tokenizer.first_stage_train import FIRST_STAGE_TRAINERS, count_pretokens
from hbpe.pipeline.tokenizer.hierarchical import HierarchicalTokenizer
from hbpe.pipeline.tokenizer.pair_merges import learn_merges
from hbpe.pipeline.tokenizer.second_stage import kernels
from hbpe.pipeline.tokenizer.second_stage.apply import patch_of
from hbpe.pipeline.tokenizer.stats import read_texts
from hbpe.schemas.errors import HbpeError
from hbpe.schemas.tokenizer_tables import TABLES_MANIFEST_FILENAME


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


def bench_load(tokenizer_dir: str | os.PathLike, *, repeat: int = 7) -> dict:
    """Seconds to load the artifact from its built tables and without them (rank file parsed, patch table built).

    Rounds alternate the two loads so the machine's load hits both alike; medians are reported with
    the load average. An artifact without tables (or in a bucket) is timed as a temporary local copy
    with tables added. Both ways must give the same tokenizer, or this raises instead of timing.
    """
    with tempfile.TemporaryDirectory(prefix="hbpe-bench-load-") as tmp:
        path, own = _local_with_tables(str(tokenizer_dir), tmp)
        _check_same(artifact.load(path), artifact.load(path, use_tables=False), shown=str(tokenizer_dir))
        runs: dict[str, list[float]] = {"with_tables": [], "without_tables": []}
        for _ in range(repeat):
            for name, use in (("with_tables", True), ("without_tables", False)):
                t = time.perf_counter()
                artifact.load(path, use_tables=use)
                runs[name].append(time.perf_counter() - t)
    median = {name: statistics.median(ts) for name, ts in runs.items()}
    return {
        "repeat": repeat,
        "tables": "the artifact's" if own else "added to a temporary copy",
        "seconds": median,
        "runs": runs,
        "speedup": median["without_tables"] / median["with_tables"],
        "load_average": _load_average(),
    }


def _local_with_tables(tokenizer_dir: str, tmp: str) -> tuple[str, bool]:
    """(a local artifact with tables, whether they are the artifact's own) for `bench_load`."""
    if not storage.is_remote(tokenizer_dir) and Path(tokenizer_dir, TABLES_MANIFEST_FILENAME).is_file():
        return tokenizer_dir, True
    local = str(Path(tmp, "tokenizer"))
    if storage.is_remote(tokenizer_dir):
        artifact.fetch(tokenizer_dir, local)
    else:
        spec = artifact.spec_path(tokenizer_dir)
        Path(local).mkdir()
        shutil.copy(spec, Path(local, spec.name))
        rank_file = artifact.load_spec(tokenizer_dir).first_stage.rank_file
        shutil.copy(Path(tokenizer_dir, rank_file), Path(local, rank_file))
    artifact.add_tables(local)
    return local, False


def _check_same(a: HierarchicalTokenizer, b: HierarchicalTokenizer, *, shown: str) -> None:
    """Loaded from tables and built: the same ranks and arrays, or the timing would compare different work."""
    arrays = ("table", "patch_lengths", "token_nbytes")
    same = a.encoding._mergeable_ranks == b.encoding._mergeable_ranks and all(
        getattr(a, k).dtype == getattr(b, k).dtype and np.array_equal(getattr(a, k), getattr(b, k)) for k in arrays
    )
    if not same:
        raise HbpeError(
            f"{shown}: the tokenizer loaded from its tables differs from the one built; rebuild them with "
            f"{tables.rebuild_hint(shown)}"
        )


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not every platform has one
        return None


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


# --------------------------------------------------------------------------- first stage: hbpe vs HF tokenizers

# Each trainer runs in a fresh interpreter, so its peak RSS (getrusage ru_maxrss) is its own; both
# import `tokenizers` first, so the baseline (interpreter, imports, the word counts) is the same.
_FIRST_STAGE_CHILD = """
import base64, collections, json, resource, sys, time
import tokenizers  # same baseline for both trainers
from hbpe.pipeline.tokenizer.first_stage import format_rank_file
from hbpe.pipeline.tokenizer.first_stage_train import train_first_stage

words_path, trainer, vocab_size, min_count, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
words = collections.Counter()
for line in open(words_path, "rb").read().splitlines():  # base64(word) count, as _write_word_counts writes
    w, c = line.split()
    words[base64.b64decode(w)] = int(c)
unit = 1 / 2**20 if sys.platform == "darwin" else 1 / 1024  # ru_maxrss: bytes on macOS, KiB on Linux
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * unit
t = time.perf_counter()
ranks = train_first_stage(words, vocab_size, min_count=min_count, trainer=trainer)
seconds = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * unit
open(out, "wb").write(format_rank_file(ranks))
print(json.dumps({"seconds": seconds, "peak_rss_mb": peak, "baseline_rss_mb": before}))
"""


def _write_word_counts(words: Counter[bytes], path: Path) -> None:
    """`base64(word) count` lines: the pre-tokenized counts both trainers read."""
    path.write_bytes(b"".join(base64.b64encode(w) + b" %d\n" % c for w, c in sorted(words.items())))


def _run_trainer(words_path: Path, trainer: str, vocab_size: int, min_count: int, out: Path) -> dict:
    args = [str(words_path), trainer, str(vocab_size), str(min_count), str(out)]
    r = subprocess.run([sys.executable, "-c", _FIRST_STAGE_CHILD, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"the {trainer} trainer failed: {r.stderr.strip().splitlines()[-1:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def compare_ranks(words: Counter[bytes], a: dict[bytes, int], b: dict[bytes, int], *, min_count: int = 2) -> dict:
    """How far two rank tables agree: learned tokens (rank >= 256) compared in rank order.

    At the first divergence, the in-house trainer is replayed up to that point and the two
    candidate tokens' counts are taken there (weighted occurrences of the adjacent pairs that
    form them): equal counts mean a tie broken differently; unequal ones, a real difference.
    """
    la, lb = sorted(a, key=a.get)[256:], sorted(b, key=b.get)[256:]
    k = min(len(la), len(lb))
    same = [x == y for x, y in zip(la, lb)]
    first = next((i for i, s in enumerate(same) if not s), None)
    out = {
        "identical": a == b,
        "learned": [len(la), len(lb)],
        "compared": k,
        "agree": sum(same),
        "agree_prefix": k if first is None else first,
        "first_divergence": None,
    }
    if first is not None:
        counts = _candidate_counts(words, 256 + first, [la[first], lb[first]], min_count=min_count)
        ca, cb = counts[la[first]], counts[lb[first]]
        out["first_divergence"] = {
            "rank": 256 + first,
            "tokens": [la[first].decode("utf-8", "backslashreplace"), lb[first].decode("utf-8", "backslashreplace")],
            "counts": [ca, cb],
            "reason": f"tie at count {ca}: the trainers break it differently"
            if ca == cb
            else f"different counts ({ca} vs {cb}): not a tie-break difference",
        }
    return out


def _candidate_counts(words: Counter[bytes], n_tokens: int, targets: list[bytes], *, min_count: int) -> dict:
    """Weighted count of adjacent pairs forming each target once the in-house trainer holds `n_tokens` tokens."""
    id_bytes = [bytes([x]) for x in range(256)]
    ranks = {t: i for i, t in enumerate(id_bytes)}

    def next_id(pair: tuple[int, int]) -> int:
        merged = id_bytes[pair[0]] + id_bytes[pair[1]]
        if merged not in ranks:
            ranks[merged] = len(id_bytes)
            id_bytes.append(merged)
        return ranks[merged]

    ordered = sorted(words.items())
    seqs = [list(w) for w, _ in ordered]
    learn_merges(
        seqs,
        [c for _, c in ordered],
        next_id=next_id,
        is_active=lambda s: len(s) > 1,
        min_count=min_count,
        stop=lambda: len(id_bytes) >= n_tokens,
    )
    counts = dict.fromkeys(targets, 0)
    for s, (_, c) in zip(seqs, ordered):
        for x, y in zip(s, s[1:]):
            merged = id_bytes[x] + id_bytes[y]
            if merged in counts:
                counts[merged] += c
    return counts


def bench_first_stage(
    corpus: list[str], vocab_size: int, *, pattern: str = "cl100k_base", min_count: int = 2, repeat: int = 2
) -> dict:
    """Both first-stage trainers on the same pre-token counts: seconds, peak RSS, and rank agreement.

    Rounds alternate the trainers (hbpe, hf, hbpe, hf, ...) so machine noise hits both alike;
    every run's rank file is kept, so determinism across processes is checked too.
    """
    texts, _ = read_texts(corpus)
    t = time.perf_counter()
    words = count_pretokens(texts, pattern)
    count_s = time.perf_counter() - t
    runs: dict[str, list[dict]] = {name: [] for name in FIRST_STAGE_TRAINERS}
    files: dict[str, list[bytes]] = {name: [] for name in FIRST_STAGE_TRAINERS}
    with tempfile.TemporaryDirectory(prefix="hbpe-bench-first-stage-") as tmp:
        words_path = Path(tmp) / "words.txt"
        _write_word_counts(words, words_path)
        for i in range(repeat):
            for name in FIRST_STAGE_TRAINERS:
                out = Path(tmp) / f"{name}-{i}.tiktoken"
                runs[name].append(_run_trainer(words_path, name, vocab_size, min_count, out))
                files[name].append(out.read_bytes())
    ranks = {name: parse_rank_file(files[name][0]) for name in FIRST_STAGE_TRAINERS}
    return {
        "corpus": list(corpus),
        "corpus_mb": sum(len(x.encode("utf-8")) for x in texts) / 1e6,
        "pattern": pattern,
        "vocab_size": vocab_size,
        "min_count": min_count,
        "distinct_words": len(words),
        "pretokens": sum(words.values()),
        "count_s": count_s,
        "runs": runs,
        "seconds": {n: [r["seconds"] for r in rs] for n, rs in runs.items()},
        "peak_rss_mb": {n: [r["peak_rss_mb"] for r in rs] for n, rs in runs.items()},
        "deterministic": {n: len(set(fs)) == 1 for n, fs in files.items()},
        "rank_files_identical": files["hbpe"][0] == files["hf"][0],
        "ranks": compare_ranks(words, ranks["hbpe"], ranks["hf"], min_count=min_count),
    }


def render_first_stage(r: dict) -> str:
    """The human view of `bench_first_stage`: one line per trainer, then the rank agreement."""
    c = r["ranks"]
    lines = [
        f"{', '.join(r['corpus'])}: {r['corpus_mb']:.2f} MB, {r['pretokens']} pre-tokens, "
        f"{r['distinct_words']} distinct ({r['pattern']}), counted in {r['count_s']:.2f}s; "
        f"vocab {r['vocab_size']}, min count {r['min_count']}",
        f"{'trainer':<8} {'seconds (each run)':<28} {'peak RSS MB (each run)':<28} deterministic",
    ]
    for name in r["runs"]:
        secs = " ".join(f"{s:.2f}" for s in r["seconds"][name])
        rss = " ".join(f"{m:.0f}" for m in r["peak_rss_mb"][name])
        lines.append(f"{name:<8} {secs:<28} {rss:<28} {r['deterministic'][name]}")
    base = " / ".join(f"{rs[0]['baseline_rss_mb']:.0f}" for rs in r["runs"].values())
    lines.append(f"(peak RSS: getrusage ru_maxrss of a fresh process per run; baseline before training {base} MB)")
    lines.append(
        f"ranks: {c['agree']}/{c['compared']} learned tokens agree, first {c['agree_prefix']} in a row; "
        f"learned {c['learned'][0]} (hbpe) vs {c['learned'][1]} (hf); rank files identical: {r['rank_files_identical']}"
    )
    d = c["first_divergence"]
    if d:
        lines.append(
            f"first divergence at rank {d['rank']}: hbpe {d['tokens'][0]!r} vs hf {d['tokens'][1]!r}: {d['reason']}"
        )
    return "\n".join(lines)
