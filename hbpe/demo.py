"""`hbpe demo`: the whole story on the bundled sample, with embedded defaults.

tokenizer (gpt2 + hierarchical BPE, S=10) -> encode/decode check -> Beam conversion
to MDS shards -> verify and inspect the shards.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample" / "en-sotu-sample.jsonl.zst"


def run_demo(out: Path, *, encoding: str = "gpt2", max_patch_size: int = 10, seq_len: int = 256) -> dict:
    from pipeline import tokenizer_io
    from pipeline.tokenizer_stats import corpus_stats, read_texts

    out.mkdir(parents=True, exist_ok=True)
    summary: dict = {}
    t = time.perf_counter()
    tok = tokenizer_io.train_tokenizer(encoding, max_patch_size=max_patch_size)
    tok_dir = tokenizer_io.save(tok, out / "tokenizer", overwrite=True)
    click.echo(
        f"[1] tokenizer: {encoding} + hierarchical BPE S={max_patch_size}: {len(tok.merges)} merges, V'={tok.vocab_size} ({time.perf_counter() - t:.1f}s) -> {tok_dir}"
    )

    texts, _ = read_texts([str(SAMPLE)])
    ok = all(tok.decode_patches(tok.encode_patches(t)[1]) == t for t in texts)
    st = corpus_stats(tok, texts)
    click.echo(
        f"[2] sample: {st.documents} documents, {st.bytes / 1e6:.2f} MB; round trip {'exact' if ok else 'FAILED'}; "
        f"{st.bytes_per_token:.2f} bytes/patch, {st.symbols_per_patch:.2f} symbols/patch, fertility {st.fertility:.3f}"
    )
    summary.update(tokenizer=str(tok_dir), round_trip=ok, stats=st.to_dict())

    from pipeline.beam.convert import run_convert
    from pipeline.shard_reader import ShardDir
    from pipeline.shard_tools import inspect, verify
    from schemas.convert_config import ConvertConfig

    shards = out / "shards"
    t = time.perf_counter()
    cfg = ConvertConfig(
        inputs=(str(SAMPLE),), output=str(shards), tokenizer=str(tok_dir), seq_len=seq_len, shard_bytes=1 << 20
    )
    m = run_convert(cfg, [], overwrite=True)
    c = m["counts"]
    click.echo(
        f"[3] convert (Beam DirectRunner): {c['documents_written']}/{c['documents_read']} documents -> {c['samples']} samples x {seq_len} patches "
        f"in {len(m['shards'])} shards ({time.perf_counter() - t:.1f}s) -> {shards}"
    )
    sd = ShardDir(shards)
    problems = verify(sd)
    info = inspect(sd, samples=1, chars=120)
    click.echo(
        f"[4] verify: {'OK' if not problems else problems[:3]}; first sample: {info['samples_preview'][0]['text']!r}"
    )
    summary.update(shards=str(shards), manifest=m, verified=not problems)
    return summary
