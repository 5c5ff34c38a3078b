import os
import subprocess
import sys

import pytest
import tiktoken

from hbpe.pipeline.tokenizer import artifact, first_stage
from hbpe.pipeline.tokenizer.first_stage_train import count_pretokens, train_ranks, write_encoding
from hbpe.schemas.errors import EncodingUnavailableError


@pytest.mark.parametrize("name", ["gpt2", "r50k_base", "p50k_base", "cl100k_base", "o200k_base"])
def test_named_encodings_load_offline(name):
    enc = first_stage.load_named(name)
    assert enc.decode(enc.encode_ordinary("hello world")) == "hello world"
    if name != "gpt2":  # named patterns for rank files are tiktoken's own
        assert first_stage.NAMED_PATTERNS[name] == enc._pat_str


def test_unknown_name_lists_choices():
    with pytest.raises(EncodingUnavailableError, match="unknown encoding 'gpt5'.*cl100k_base"):
        first_stage.load_encoding("gpt5")


def test_no_network_error_mentions_the_fixes(tmp_path):
    code = "from hbpe.pipeline.tokenizer.first_stage import load_named; load_named('cl100k_base')"
    env = {
        **os.environ,
        "TIKTOKEN_CACHE_DIR": str(tmp_path),
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "HTTP_PROXY": "http://127.0.0.1:9",
    }
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "TIKTOKEN_CACHE_DIR" in r.stderr and "--encoding PATH" in r.stderr


def test_rank_file_round_trip_with_named_pattern(tmp_path):
    enc = tiktoken.get_encoding("cl100k_base")
    path = tmp_path / "cl100k.tiktoken"
    path.write_bytes(first_stage.format_rank_file(enc._mergeable_ranks))
    with pytest.raises(EncodingUnavailableError, match="has no split pattern: pass --pattern"):
        first_stage.load_encoding(str(path))
    loaded = first_stage.load_encoding(str(path), pattern="llama3")
    text = "LLaMA-3 style: it's 2024, ok?"
    assert loaded.decode(loaded.encode_ordinary(text)) == text


def test_bad_rank_file_line(tmp_path):
    path = tmp_path / "bad.tiktoken"
    path.write_bytes(b"IQ== 0\nnot-base64!! x\n")
    with pytest.raises(EncodingUnavailableError, match=r"bad.tiktoken:2: not a tiktoken rank line"):
        first_stage.parse_rank_file(path.read_bytes(), source=str(path))


def test_in_house_first_stage_is_tiktoken_compatible(tmp_path, sample_texts):
    words = count_pretokens(sample_texts[:6], "cl100k_base")
    ranks = train_ranks(words, 1200)
    assert len(ranks) == 1200
    again = train_ranks(count_pretokens(sample_texts[:6], "cl100k_base"), 1200)
    assert again == ranks
    path = write_encoding(ranks, tmp_path / "house.tiktoken", pattern="cl100k_base")
    enc = first_stage.load_encoding(str(path))  # pattern from the sidecar json
    text = sample_texts[7][:2000]
    ids = enc.encode_ordinary(text)
    assert enc.decode(ids) == text
    assert len(ids) < len(text.encode()) * 0.6  # it really compresses
    tok = artifact.train_tokenizer(str(path), max_patch_size=6)
    assert tok.decode_patches(tok.patches(tok.encode(text))) == text
