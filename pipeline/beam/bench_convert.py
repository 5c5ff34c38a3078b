"""`hbpe bench convert`: the pipeline's throughput next to raw tiktoken, same text, same cores."""

from __future__ import annotations

import os
import resource
import shutil
import tempfile
import time

from hbpe.pipeline.beam.convert import run_convert
from hbpe.pipeline.beam.options import local_cores
from hbpe.pipeline.tokenizer import artifact
from hbpe.pipeline.tokenizer.stats import read_texts
from hbpe.schemas.convert_config import ConvertConfig


def _write_scaled(texts: list[str], scale: int, path: str) -> None:
    import json

    with open(path, "w", encoding="utf-8") as f:
        for k in range(scale):
            for i, t in enumerate(texts):
                f.write(json.dumps({"id": f"{k}-{i}", "text": t}, ensure_ascii=False) + "\n")


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
) -> dict:
    """Time `run_convert` on `corpus` repeated `scale` times next to tiktoken alone on the same text and cores.

    The input is written uncompressed first, so the conversion can split it into byte ranges
    (`split_bytes`); the manifest says which runner converted it.
    """
    texts, _ = read_texts([corpus])
    tok = artifact.load(tokenizer_dir)
    threads = workers or local_cores()
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

        tiktoken_s = time_tiktoken()

        cfg = ConvertConfig(
            inputs=(src,),
            output=os.path.join(work, "out"),
            tokenizer=tokenizer_dir,
            seq_len=seq_len,
            split_bytes=split_bytes,
        )
        units: list = []
        t = time.perf_counter()
        m = run_convert(cfg, pipeline_args, runner=runner, workers=workers, progress=False, on_start=units.extend)
        pipeline_s = time.perf_counter() - t
        tiktoken_s = min(tiktoken_s, time_tiktoken())  # best of before and after: this machine is noisy
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "corpus_mb": mb,
        "documents": len(texts) * scale,
        "units": len(units),
        "workers": threads,
        "threads": threads,
        "tiktoken_s": tiktoken_s,
        "pipeline_s": pipeline_s,
        "tiktoken_mb_per_s": mb / tiktoken_s,
        "pipeline_mb_per_s": mb / pipeline_s,
        "ratio": tiktoken_s / pipeline_s,
        "peak_rss_mb_self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_rss_mb_workers": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        "samples": m["counts"]["samples"],
        "runner": m["timing"]["runner"],
    }
