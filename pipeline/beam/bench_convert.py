"""`hbpe bench convert`: the pipeline's throughput next to raw tiktoken, same text, same cores, both shard layouts.

Each round times tiktoken alone, a `--store-patches` conversion and a lean one (the default) on the
same text, the two conversions in alternating order; `repeat` rounds give medians and their spread.
A ratio is measured within one run on this machine; absolute numbers move with its load, which is
reported (/proc/loadavg before and after).
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import tempfile
import time
from typing import Any

from hbpe.pipeline.beam.convert import run_convert
from hbpe.pipeline.beam.options import local_cores
from hbpe.pipeline.tokenizer import artifact
from hbpe.pipeline.tokenizer.stats import read_texts
from hbpe.schemas.convert_config import ConvertConfig

LAYOUTS = {"stored": True, "lean": False}  # name -> store_patches; "stored" is the layout of hbpe before lean shards


def _write_scaled(texts: list[str], scale: int, path: str) -> None:
    import json

    with open(path, "w", encoding="utf-8") as f:
        for k in range(scale):
            for i, t in enumerate(texts):
                f.write(json.dumps({"id": f"{k}-{i}", "text": t}, ensure_ascii=False) + "\n")


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _spread(seconds: list[float]) -> dict[str, Any]:
    """Median, min, max and (max - min) / median of one variant's rounds."""
    med = statistics.median(seconds)
    return {
        "median_s": med,
        "min_s": min(seconds),
        "max_s": max(seconds),
        "spread_pct": 100 * (max(seconds) - min(seconds)) / med,
        "all_s": seconds,
    }


def _disk(manifest: dict, output: str, text_bytes: int) -> dict[str, Any]:
    """Bytes of the shard files on disk (zstd) and raw, per byte of the text the shards hold."""
    zipped = sum(os.path.getsize(os.path.join(output, name)) for name in manifest["shards"])
    return {
        "shards": len(manifest["shards"]),
        "bytes_on_disk": zipped,
        "disk_bytes_per_text_byte": zipped / max(text_bytes, 1),
        "columns": manifest["columns"],
    }


def bench_convert(
    tokenizer_dir: str,
    corpus: str,
    *,
    scale: int = 1,
    seq_len: int = 1024,
    split_bytes: int = 16 << 20,
    pipeline_args: list[str] | None = None,
    runner: str = "auto",
    workers: int | None = None,
    repeat: int = 1,
) -> dict[str, Any]:
    """Time `run_convert` in both layouts on `corpus` repeated `scale` times, next to tiktoken alone.

    The input is written uncompressed first, so the conversion can split it into byte ranges
    (`split_bytes`); the manifest says which runner converted it. Per layout: the median seconds
    of `repeat` rounds and their spread, MB/s, the ratio to tiktoken (of the medians, and the median
    of each round's ratio), and the shards' bytes on disk per byte of text.
    """
    texts, _ = read_texts([corpus])
    tok = artifact.load(tokenizer_dir)
    threads = workers or local_cores()
    load_before = _load()
    work = tempfile.mkdtemp(prefix="hbpe-bench-")
    try:
        src = os.path.join(work, "corpus.jsonl")  # uncompressed, so the pipeline can split it by byte ranges
        _write_scaled(texts, scale, src)
        mb = sum(len(t.encode("utf-8")) for t in texts) * scale / 1e6

        def time_tiktoken() -> float:
            t = time.perf_counter()
            for _ in range(scale):
                tok.encoding.encode_ordinary_batch(texts, num_threads=threads)
            return time.perf_counter() - t

        units = [0]  # work units of the conversion, as its on_start reports them

        def time_convert(name: str) -> tuple[float, dict[str, Any]]:
            out = os.path.join(work, name)
            shutil.rmtree(out, ignore_errors=True)  # a fresh output every round: no --overwrite swap timed
            cfg = ConvertConfig(inputs=(src,), output=out, tokenizer=tokenizer_dir, seq_len=seq_len,
                                split_bytes=split_bytes, store_patches=LAYOUTS[name])  # fmt: skip
            t = time.perf_counter()
            m = run_convert(cfg, pipeline_args, runner=runner, workers=workers, progress=False,
                            on_start=lambda us: units.__setitem__(0, len(us)))  # fmt: skip
            seconds = time.perf_counter() - t
            return seconds, {**_disk(m, out, m["counts"]["bytes"]), "samples": m["counts"]["samples"],
                             "runner": m["timing"]["runner"]}  # fmt: skip

        rounds: dict[str, list[float]] = {"tiktoken": [], **{name: [] for name in LAYOUTS}}
        disk: dict[str, dict[str, Any]] = {}
        for r in range(repeat):
            rounds["tiktoken"].append(time_tiktoken())
            for name in LAYOUTS if r % 2 == 0 else reversed(LAYOUTS):  # alternate which layout goes first
                seconds, disk[name] = time_convert(name)
                rounds[name].append(seconds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _report(rounds, disk, mb=mb, documents=len(texts) * scale, units=units[0], threads=threads,
                   repeat=repeat, load=[load_before, _load()])  # fmt: skip


def _report(
    rounds: dict[str, list[float]], disk: dict[str, dict[str, Any]], *, mb: float, load: list, **run: Any
) -> dict[str, Any]:
    """Medians, spreads and ratios of the rounds: each layout to tiktoken, and lean to stored."""
    tiktoken = rounds["tiktoken"]
    layouts = {}
    for name in LAYOUTS:
        s = _spread(rounds[name])
        layouts[name] = {
            **s,
            **disk[name],
            "mb_per_s": mb / s["median_s"],
            "ratio": statistics.median(tiktoken) / s["median_s"],  # of the medians
            # each round's ratio to tiktoken in the same round: a drift of the load between rounds moves it less
            "round_ratio": statistics.median(t / x for t, x in zip(tiktoken, rounds[name], strict=True)),
        }
    lean, stored = layouts["lean"], layouts["stored"]
    return {
        "corpus_mb": mb,
        **run,
        "workers": run["threads"],
        "load": load,  # 1, 5, 15-minute load averages before and after the rounds
        "tiktoken": {**_spread(tiktoken), "mb_per_s": mb / statistics.median(tiktoken)},
        "layouts": layouts,
        "lean_vs_stored": {
            "disk_ratio": lean["bytes_on_disk"] / max(stored["bytes_on_disk"], 1),
            "speed_ratio": stored["median_s"] / lean["median_s"],
            "round_speed_ratio": statistics.median(
                s / x for s, x in zip(rounds["stored"], rounds["lean"], strict=True)
            ),
        },
        "peak_rss_mb_self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_rss_mb_workers": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        "runner": lean["runner"],
        "samples": lean["samples"],
    }


def render(r: dict[str, Any], *, scale: int = 1) -> str:
    """The report as the lines `hbpe bench convert` prints."""
    t = r["tiktoken"]
    lines = [
        f"corpus {r['corpus_mb']:.1f} MB ({r['documents']} documents, x{scale}), {r['units']} units, "
        f"{r['workers']} workers, {r['repeat']} rounds (medians; spread = (max - min) / median)",
        f"load average before {r['load'][0]}, after {r['load'][1]}",
        f"{'tiktoken encode_ordinary_batch (' + str(r['threads']) + ' threads)':<43}{t['mb_per_s']:8.2f} MB/s   "
        f"{t['median_s']:.3f} s  spread {t['spread_pct']:.0f}%",
    ]
    for name, x in r["layouts"].items():
        label = f"hbpe convert {name} ({x['runner']})"
        lines.append(
            f"{label:<43}{x['mb_per_s']:8.2f} MB/s   {x['median_s']:.3f} s  spread {x['spread_pct']:.0f}%   "
            f"ratio {x['ratio']:.3f} (/round {x['round_ratio']:.3f})   "
            f"disk {x['bytes_on_disk'] / 1e6:.2f} MB = {x['disk_bytes_per_text_byte']:.3f} B per text byte"
        )
    v = r["lean_vs_stored"]
    lines += [
        f"lean / stored: bytes on disk x{v['disk_ratio']:.3f}, conversion {v['speed_ratio']:.3f}x as fast "
        f"(/round {v['round_speed_ratio']:.3f})",
        f"peak RSS: launcher {r['peak_rss_mb_self']:.0f} MB, largest worker {r['peak_rss_mb_workers']:.0f} MB",
    ]
    return "\n".join(lines)
