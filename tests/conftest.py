"""Shared fixtures: small real data and tiny trained tokenizers, built once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SAMPLE_EN = REPO / "data" / "sample" / "en-sotu-sample.jsonl.zst"
SAMPLE_ZH = REPO / "data" / "sample" / "zh-kernel-docs-sample.jsonl.zst"
SHARED_DATA = REPO.parent / "shared" / "data"

if "TIKTOKEN_CACHE_DIR" not in os.environ and (SHARED_DATA / "tiktoken-cache").is_dir():
    os.environ["TIKTOKEN_CACHE_DIR"] = str(SHARED_DATA / "tiktoken-cache")


@pytest.fixture(scope="session")
def gpt2_tokenizer():
    from hbpe.pipeline.tokenizer import artifact

    return artifact.train_tokenizer("gpt2", max_patch_size=10)


@pytest.fixture(scope="session")
def gpt2_tokenizer_dir(tmp_path_factory, gpt2_tokenizer):
    from hbpe.pipeline.tokenizer import artifact

    return artifact.save(gpt2_tokenizer, tmp_path_factory.mktemp("tok") / "gpt2-s10")


@pytest.fixture(scope="session")
def sample_texts():
    from hbpe.pipeline.tokenizer.stats import read_texts

    texts, rejects = read_texts([str(SAMPLE_EN)])
    assert not rejects
    return texts


IN_MEMORY_BEAM = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def split_sample(out_dir: Path, n_train: int = 20) -> tuple[Path, Path]:
    """The bundled English sample as two jsonl files: train (first n docs) and held-out eval."""
    import zstandard

    lines = zstandard.ZstdDecompressor().stream_reader(SAMPLE_EN.read_bytes()).read().decode().splitlines()
    out_dir.mkdir(parents=True, exist_ok=True)
    train, held = out_dir / "train.jsonl", out_dir / "eval.jsonl"
    train.write_text("\n".join(lines[:n_train]) + "\n")
    held.write_text("\n".join(lines[n_train:]) + "\n")
    return train, held


@pytest.fixture(scope="session")
def sample_shards(tmp_path_factory, gpt2_tokenizer_dir):
    """(train, eval) shard directories of the bundled sample, seq_len 128."""
    from hbpe.pipeline.beam.convert import run_convert
    from hbpe.schemas.convert_config import ConvertConfig

    root = tmp_path_factory.mktemp("shards")
    train, held = split_sample(root / "corpus")
    outs = []
    for name, src in (("train", train), ("eval", held)):
        cfg = ConvertConfig(
            inputs=(str(src),),
            output=str(root / name),
            tokenizer=str(gpt2_tokenizer_dir),
            seq_len=128,
            shard_bytes=1 << 20,
        )
        run_convert(cfg, IN_MEMORY_BEAM, progress=False)
        outs.append(root / name)
    return tuple(outs)
