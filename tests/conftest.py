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
    from pipeline import tokenizer_io

    return tokenizer_io.train_tokenizer("gpt2", max_patch_size=10)


@pytest.fixture(scope="session")
def gpt2_tokenizer_dir(tmp_path_factory, gpt2_tokenizer):
    from pipeline import tokenizer_io

    return tokenizer_io.save(gpt2_tokenizer, tmp_path_factory.mktemp("tok") / "gpt2-s10")


@pytest.fixture(scope="session")
def sample_texts():
    from pipeline.tokenizer_stats import read_texts

    texts, rejects = read_texts([str(SAMPLE_EN)])
    assert not rejects
    return texts
