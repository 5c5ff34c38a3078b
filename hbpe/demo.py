"""`hbpe demo`: the whole story on the bundled sample, with embedded defaults.

tokenizer (gpt2 + hierarchical BPE, S=10) -> encode/decode check -> corpus statistics.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample" / "en-sotu-sample.jsonl.zst"


def run_demo(out: Path, *, encoding: str = "gpt2", max_patch_size: int = 10) -> dict:
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
    return summary
