"""`hbpe demo`: the whole story on the bundled sample, with embedded defaults.

tokenizer (gpt2 + hierarchical BPE, S=10) -> Beam conversion of a train/held-out split
into MDS shards -> verify -> train the tiny model on CPU -> eval BPB on the held-out
shards -> generate a sample -> summary.

`run_demo` reports each step as one line through `on_step` and returns what it made;
the CLI prints the lines as they come and then `render_summary` of the result.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hbpe.schemas.errors import ConfigError

if TYPE_CHECKING:
    from hbpe.pipeline.tokenizer.hierarchical import HierarchicalTokenizer

# data/sample in a checkout (hbpe/sample links to it), inside the package in a wheel
SAMPLE = Path(__file__).parent / "sample" / "en-sotu-sample.jsonl.zst"
HELD_OUT_DOCS = 4


def _split_sample(corpus_dir: Path) -> tuple[Path, Path]:
    import zstandard

    lines = zstandard.ZstdDecompressor().stream_reader(SAMPLE.read_bytes()).read().decode().splitlines()
    corpus_dir.mkdir(parents=True, exist_ok=True)
    train, held = corpus_dir / "train.jsonl", corpus_dir / "eval.jsonl"
    train.write_text("\n".join(lines[:-HELD_OUT_DOCS]) + "\n")
    held.write_text("\n".join(lines[-HELD_OUT_DOCS:]) + "\n")
    return train, held


def run_demo(
    out: Path,
    *,
    encoding: str = "gpt2",
    max_patch_size: int = 10,
    seq_len: int = 128,
    train_batches: int = 300,
    eval_batches: int | None = None,
    pipeline_args: Sequence[str] = (),
    on_step: Callable[[str], None] = lambda line: None,
    progress: bool = True,
) -> dict[str, Any]:
    """Every stage on the bundled sample; returns the artifacts' paths and each stage's result.

    `eval_batches`: held-out batches the run's final eval and step 5 read (default: all of them);
    `pipeline_args` go to both Beam conversions (default: DirectRunner on all local cores);
    `progress`: progress on stderr for the conversions, the training and the eval (live on a terminal, else a
    line every HBPE_PROGRESS_INTERVAL seconds).
    """
    if eval_batches is not None and (isinstance(eval_batches, bool) or eval_batches < 1):
        raise ConfigError(f"eval_batches={eval_batches!r}: must be >= 1 (held-out batches), or None for all of them")
    from hbpe import api

    out.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    tok = api.train_tokenizer(encoding, max_patch_size=max_patch_size)
    tok_dir = api.save_tokenizer(tok, out / "tokenizer", overwrite=True)
    on_step(
        f"[1/6] tokenizer: {encoding} + hierarchical BPE S={max_patch_size}: {len(tok.merges)} merges, V'={tok.vocab_size} ({time.perf_counter() - t:.1f}s) -> {tok_dir}"
    )
    on_step(_sample_step(tok))
    shards = _convert_split(
        out, tok_dir, seq_len=seq_len, pipeline_args=pipeline_args, progress=progress, on_step=on_step
    )

    train_dir = out / "train"
    on_step(
        f"[4/6] training the tiny model for {train_batches} batches: minutes, how many depends on this machine's "
        f"cores and load{' (the progress line below shows the time left)' if progress else ''} ..."
    )
    overrides = {**_train_overrides(shards, train_dir, train_batches, eval_batches), "console": progress}
    r = api.train("tiny", overrides).as_dict()
    thr = r["throughput"]
    on_step(
        f"[4/6] train tiny ({r['params'] / 1e6:.2f}M params) on {r['device']}: {r['batches']} batches in {r['wall_s']:.0f}s, {thr['bytes_per_sec'] / 1e3:.1f} KB/s, {thr['patches_per_sec']:.0f} patches/s -> {train_dir}"
    )
    ev = api.evaluate(train_dir, shards["eval"], max_batches=eval_batches, device="cpu", progress=progress).as_dict()
    on_step(
        f"[5/6] eval on held-out shards: BPB {ev['bpb']:.3f}, {ev['bytes_per_patch']:.2f} bytes/patch, {ev['symbols_per_patch']:.2f} symbols/patch"
    )
    prompt = "Fellow-Citizens of the Senate"
    (text,) = api.generate(train_dir, prompt, max_bytes=160, temperature=0.8, seed=0, device="cpu")
    on_step(f"[6/6] generate (temperature 0.8, KV caches): {text!r}")
    return {
        "tokenizer": tok_dir,
        "max_patch_size": max_patch_size,
        "shards": shards,
        "train_folder": str(train_dir),
        "train": r,
        "eval": ev,
        "generation": text,
    }


def _train_overrides(
    shards: dict[str, str], train_dir: Path, train_batches: int, eval_batches: int | None
) -> dict[str, Any]:
    """Step 4's changes to the `tiny` config: the demo's shards and folder, one evaluation and one save at the end."""
    return {
        "data.train": shards["train"],
        "data.eval": shards["eval"],
        "save_folder": str(train_dir),
        "max_duration": f"{train_batches}ba",
        "eval_interval": f"{train_batches}ba",
        "save_interval": f"{train_batches}ba",
        "log_interval": "50ba",
        "console": False,  # run_demo turns the progress line on
        "save_overwrite": True,  # a rerun of the demo replaces its previous run
        "eval_subset_num_batches": -1 if eval_batches is None else eval_batches,  # 0: the config says why not
    }


def _sample_step(tok: HierarchicalTokenizer) -> str:
    """Step 2: the sample's round trip and patch statistics."""
    from hbpe.pipeline.tokenizer.stats import corpus_stats, read_texts

    texts, _ = read_texts([str(SAMPLE)])
    exact = all(tok.decode_patches(tok.encode_patches(x)[1]) == x for x in texts)
    st = corpus_stats(tok, texts)
    return f"[2/6] sample: {st.documents} documents, {st.bytes / 1e6:.2f} MB, round trip {'exact' if exact else 'FAILED'}: {st.bytes_per_token:.2f} bytes/patch, {st.symbols_per_patch:.2f} symbols/patch, fertility {st.fertility:.3f}"


def _convert_split(
    out: Path,
    tok_dir: str,
    *,
    seq_len: int,
    pipeline_args: Sequence[str],
    progress: bool,
    on_step: Callable[[str], None],
) -> dict[str, str]:
    """Step 3: the sample's training part and held-out part as shard directories, each verified -> their paths."""
    from hbpe import api
    from hbpe.pipeline.shards.reader import ShardDir
    from hbpe.pipeline.shards.tools import verify

    train_src, held_src = _split_sample(out / "corpus")
    shards = {}
    for split, src in (("train", train_src), ("eval", held_src)):
        t = time.perf_counter()
        dest = str(out / f"shards-{split}")
        m = api.convert(
            src,
            dest,
            tokenizer=tok_dir,
            seq_len=seq_len,
            overwrite=True,
            progress=progress,
            beam_args=list(pipeline_args),
            shard_bytes=1 << 20,
        ).as_dict()
        problems = verify(ShardDir(dest))
        c = m["counts"]
        on_step(
            f"[3/6] convert {split} ({m['timing']['runner']}): {c['documents_written']}/{c['documents_read']} documents -> {c['samples']} samples x {seq_len} patches, {len(m['shards'])} shards, verify {'OK' if not problems else problems[0]} ({time.perf_counter() - t:.1f}s)"
        )
        shards[split] = dest
    return shards


def render_summary(result: dict[str, Any]) -> str:
    """The closing block of `hbpe demo`: held-out BPB, patch sizes, throughput, where everything is."""
    ev, r, shards = result["eval"], result["train"], result["shards"]
    return (
        "\nsummary\n"
        f"  held-out BPB        {ev['bpb']:.3f}\n"
        f"  bytes per patch     {ev['bytes_per_patch']:.2f}  (symbols per patch {ev['symbols_per_patch']:.2f}, S={result['max_patch_size']})\n"
        f"  training throughput {r['throughput']['bytes_per_sec'] / 1e3:.1f} KB/s of text on {r['device']}\n"
        f"  artifacts           {result['tokenizer']}, {shards['train']}, {shards['eval']}, {result['train_folder']}"
    )
