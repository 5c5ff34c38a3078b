import json

import pytest

from pipeline import tokenizer_io
from schemas.errors import ArtifactError


@pytest.fixture
def artifact(tmp_path, gpt2_tokenizer):
    return tokenizer_io.save(gpt2_tokenizer, tmp_path / "tok")


def test_save_load_round_trip(artifact, gpt2_tokenizer):
    loaded = tokenizer_io.load(artifact)
    assert loaded.fingerprint == gpt2_tokenizer.fingerprint
    assert loaded.merges == gpt2_tokenizer.merges
    assert (loaded.table == gpt2_tokenizer.table).all()
    spec = json.loads((artifact / "tokenizer.json").read_text())
    assert spec["format"] == "hbpe-tokenizer" and spec["version"] == 1
    assert spec["second_stage"]["max_patch_size"] == 10 and spec["second_stage"]["mode"] == "full"
    assert spec["second_stage"]["id_layout"]["eop"] == 256


def test_save_is_byte_identical(tmp_path, gpt2_tokenizer):
    a = tokenizer_io.save(gpt2_tokenizer, tmp_path / "a")
    b = tokenizer_io.save(gpt2_tokenizer, tmp_path / "b")
    for name in ("tokenizer.json", "first_stage.tiktoken"):
        assert (a / name).read_bytes() == (b / name).read_bytes()


def test_refuses_to_overwrite(artifact, gpt2_tokenizer):
    with pytest.raises(ArtifactError, match="--overwrite"):
        tokenizer_io.save(gpt2_tokenizer, artifact)


def test_unknown_version(artifact):
    p = artifact / "tokenizer.json"
    d = json.loads(p.read_text())
    d["version"] = 99
    p.write_text(json.dumps(d))
    with pytest.raises(ArtifactError, match=r"tokenizer.json: schema version 99 is not supported"):
        tokenizer_io.load(artifact)


def test_edited_content_fails_fingerprint(artifact):
    p = artifact / "tokenizer.json"
    d = json.loads(p.read_text())
    d["second_stage"]["merges"][0] = [1, 2]
    p.write_text(json.dumps(d))
    with pytest.raises(ArtifactError, match="fingerprint mismatch.*edited"):
        tokenizer_io.load(artifact)


def test_missing_rank_file(artifact):
    (artifact / "first_stage.tiktoken").unlink()
    with pytest.raises(ArtifactError, match="first_stage.tiktoken is missing"):
        tokenizer_io.load(artifact)


def test_altered_rank_file(artifact):
    p = artifact / "first_stage.tiktoken"
    p.write_bytes(p.read_bytes().replace(b"IQ== 0", b"IQ== 7", 1))
    with pytest.raises(ArtifactError, match="first_stage.tiktoken was altered"):
        tokenizer_io.load(artifact)


def test_not_a_tokenizer_dir(tmp_path):
    with pytest.raises(ArtifactError, match="not a tokenizer directory"):
        tokenizer_io.load(tmp_path)
