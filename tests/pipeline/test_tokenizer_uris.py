"""The tokenizer commands with object-store URIs (moto and gcp-storage-emulator on 127.0.0.1).

Each test reproduces a red-team finding: `--out s3://b/tok` wrote a local folder `./s3:/b/tok`,
`--encoding s3://b/x.tiktoken` collapsed to `s3:/b/x.tiktoken`, and `tokenizer stats --input`
read one file only, reporting "documents 0" (rc 0) for a glob, a directory or a bucket.
"""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.pipeline import storage
from hbpe.pipeline.tokenizer import artifact
from hbpe.schemas.errors import HbpeError
from tests.conftest import SAMPLE_EN, split_sample


def _hbpe(*args) -> tuple[int, str]:
    r = CliRunner().invoke(main, [str(a) for a in args])
    return r.exit_code, r.output


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run from an empty folder, so a URI mistaken for a local path shows up as files in it."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_train_out_uri_uploads_the_artifact_and_refuses_a_second_without_overwrite(object_store, in_tmp):
    out = f"{object_store.new_bucket()}/tok"
    rc, output = _hbpe("tokenizer", "train", "--encoding", "gpt2", "-S", "8", "--out", out)
    assert rc == 0, output
    assert f"-> {out}" in output
    assert os.listdir(in_tmp) == []  # nothing local (was ./s3:/BUCKET/tok)
    assert object_store.list(out) == [
        "first_stage.tiktoken",
        "hbpe_tokenizer.json",
        "hbpe_tokenizer_tables.bin",
        "hbpe_tokenizer_tables.json",
    ]
    assert artifact.load(out).max_patch_size == 8

    rc, output = _hbpe("tokenizer", "train", "--encoding", "gpt2", "-S", "6", "--out", out)
    assert rc == 2 and f"error: {out} already holds a tokenizer; pass --overwrite" in output
    assert artifact.load(out).max_patch_size == 8
    rc, output = _hbpe("tokenizer", "train", "--encoding", "gpt2", "-S", "6", "--out", out, "--overwrite")
    assert rc == 0, output
    assert artifact.load(out).max_patch_size == 6


def test_train_out_uri_refuses_foreign_objects_and_a_missing_bucket(object_store, in_tmp, gpt2_tokenizer):
    bucket = object_store.new_bucket()
    storage.write_bytes(f"{bucket}/data/notes.txt", b"mine")
    with pytest.raises(HbpeError, match=r"/data holds files hbpe did not write: notes\.txt; overwriting only"):
        artifact.save(gpt2_tokenizer, f"{bucket}/data", overwrite=True)
    assert object_store.list(f"{bucket}/data") == ["notes.txt"]

    missing = f"{object_store.scheme}://hbpe-no-such-bucket/tok"
    rc, output = _hbpe("tokenizer", "train", "--encoding", "gpt2", "-S", "8", "--out", missing)
    assert rc == 2 and "bucket 'hbpe-no-such-bucket' does not exist" in output
    assert "trained" not in output and os.listdir(in_tmp) == []


def test_train_bpe_out_uri_then_train_with_encoding_uri(object_store, in_tmp):
    bucket = object_store.new_bucket()
    train, _ = split_sample(in_tmp / "corpus")
    rank_file = f"{bucket}/first/bpe.tiktoken"
    rc, output = _hbpe("tokenizer", "train-bpe", "--input", train, "--vocab-size", 300, "--out", rank_file)
    assert rc == 0, output
    assert f"-> {rank_file}" in output and not os.path.exists(in_tmp / f"{object_store.scheme}:")
    assert object_store.list(f"{bucket}/first") == ["bpe.json", "bpe.tiktoken"]

    # the pattern comes from the sidecar bpe.json downloaded beside the rank file
    out = f"{bucket}/tok"
    rc, output = _hbpe("tokenizer", "train", "--encoding", rank_file, "-S", "6", "--out", out, "--json")
    assert rc == 0, output
    tok = artifact.load(out)
    assert (tok.encoding.name, tok.encoding.n_vocab) == ("bpe", 301)
    assert "\\p{N}{1,3}+" in tok.encoding._pat_str  # train-bpe's default pattern, cl100k_base's

    rc, output = _hbpe("tokenizer", "train", "--encoding", f"{bucket}/first/nope.tiktoken", "-S", "6", "--out", "t")
    assert rc == 2 and f"rank file {bucket}/first/nope.tiktoken does not exist" in output


def test_stats_input_expands_globs_directories_and_uris_like_convert(object_store, in_tmp, gpt2_tokenizer_dir):
    train, held = split_sample(in_tmp / "corpus")
    bucket = object_store.new_bucket()
    for path in (train, held):
        storage.upload_file(path, f"{bucket}/corpus/{path.name}")

    def stats(*inputs) -> dict:
        args = ["tokenizer", "stats", "--tokenizer", gpt2_tokenizer_dir, "--json"]
        rc, output = _hbpe(*args, *[a for i in inputs for a in ("--input", i)])
        assert rc == 0, output
        return json.loads(output)

    whole = stats(SAMPLE_EN)
    assert whole["documents"] == 24
    for inputs in ([in_tmp / "corpus"], [f"{in_tmp}/corpus/*.jsonl"], [f"{bucket}/corpus/*.jsonl"], [train, held]):
        assert stats(*inputs) == whole, inputs


def test_stats_with_no_readable_document_is_an_error(object_store, in_tmp, gpt2_tokenizer_dir):
    (in_tmp / "bad.jsonl").write_text('{"body": "no text field"}\n{"body": "nor here"}\n')
    base = ["tokenizer", "stats", "--tokenizer", gpt2_tokenizer_dir]
    rc, output = _hbpe(*base, "--input", in_tmp / "bad.jsonl")
    assert rc == 2
    assert f"error: no document could be read from --input {in_tmp / 'bad.jsonl'}: 2 records rejected" in output
    assert "missing_text_field: 2" in output and "--text-field" in output

    rc, output = _hbpe(*base, "--input", f"{in_tmp}/nothing/*.jsonl")
    assert rc == 2 and "matches no file" in output
    missing = f"{object_store.new_bucket()}/nope.jsonl"
    rc, output = _hbpe(*base, "--input", missing)
    assert rc == 2 and f"--input '{missing}' matches no file" in output and "internal error" not in output


def test_tables_command_adds_the_tables_to_a_bucket_artifact_and_loading_reads_them(
    object_store, in_tmp, gpt2_tokenizer, caplog
):
    out = f"{object_store.new_bucket()}/tok"
    artifact.save(gpt2_tokenizer, out, with_tables=False)
    assert object_store.list(out) == ["first_stage.tiktoken", "hbpe_tokenizer.json"]
    rc, output = _hbpe("tokenizer", "tables", "--tokenizer", out)
    assert rc == 0 and output.endswith(f"into {out}\n"), output
    tables = ["hbpe_tokenizer_tables.bin", "hbpe_tokenizer_tables.json"]
    assert object_store.list(out) == ["first_stage.tiktoken", "hbpe_tokenizer.json", *tables]
    local = artifact.save(gpt2_tokenizer, in_tmp / "local")  # the same bytes as a local save's tables
    assert [storage.read_bytes(f"{out}/{n}") for n in tables] == [(local / n).read_bytes() for n in tables]
    with caplog.at_level("WARNING", logger="hbpe.pipeline.tokenizer.artifact"):
        tok = artifact.load(out)
    assert not [r for r in caplog.records if "no built tables" in r.getMessage()]  # read, not built
    assert tok.fingerprint == gpt2_tokenizer.fingerprint and (tok.table == gpt2_tokenizer.table).all()
