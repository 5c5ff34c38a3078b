"""Damaged shard directories: one clear ArtifactError naming the file, and `verify` checks the manifest.

Every test works on a copy of the session's `sample_shards` (4 train shards, no tail
dropped; 1 eval shard whose dropped tail holds 44 tokens and one EOD).
"""

from __future__ import annotations

import io
import json
import re

import pytest
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.pipeline.shards import mds_format
from hbpe.pipeline.shards.reader import ShardDir
from hbpe.pipeline.shards.tools import export_text, export_text_to, inspect, stats, verify
from hbpe.schemas.errors import ArtifactError
from tests.helpers import DAMAGE, SHARD, damage


def edit_json(path, fn) -> None:
    d = json.loads(path.read_text())
    fn(d)
    path.write_text(json.dumps(d))


def cli(*args: str):
    return CliRunner().invoke(main, list(args))


def assert_cli_error(r, pattern: str) -> None:
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error:") and "Traceback" not in r.output, r.output
    assert pattern in r.output, r.output


# ---- damaged shard files -------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damaged_shard_is_one_clear_error_in_every_reader(train_copy, tmp_path, kind):
    damage(train_copy, kind)
    sd = ShardDir(train_copy)
    expected = f"{SHARD}: {DAMAGE[kind]}.*restore the file from a copy or reconvert"
    with pytest.raises(ArtifactError, match=expected):
        stats(sd)
    with pytest.raises(ArtifactError, match=expected):
        inspect(sd)
    with pytest.raises(ArtifactError, match=expected):
        export_text(sd, io.StringIO())  # reads shard 0 fine, then refuses shard 1 before decoding it
    out = tmp_path / "docs.jsonl"
    with pytest.raises(ArtifactError, match=expected):
        export_text_to(out, sd)
    assert not out.exists() and not list(tmp_path.glob(".docs.jsonl*"))  # no half-written export
    assert [p for p in verify(sd) if p.startswith(SHARD)] == [p for p in verify(sd) if f"{SHARD}: {DAMAGE[kind]}" in p]
    assert any(p.startswith(f"{SHARD}: {DAMAGE[kind]}") for p in verify(sd))


@pytest.mark.parametrize("kind", sorted(DAMAGE))
@pytest.mark.parametrize("command", ["inspect", "stats", "export-text"])
def test_damaged_shard_cli_prints_one_error_line(train_copy, tmp_path, kind, command):
    damage(train_copy, kind)
    extra = ["--out", str(tmp_path / "x.jsonl")] if command == "export-text" else []
    assert_cli_error(cli("shards", command, "--data", str(train_copy), *extra), f"{SHARD}: {DAMAGE[kind]}")
    r = cli("shards", "verify", "--data", str(train_copy))
    assert r.exit_code == 1 and f"FAIL {SHARD}: {DAMAGE[kind]}" in r.output and "Traceback" not in r.output


def test_shard_decompressing_to_wrong_data_is_named(train_copy):
    """A replaced shard with matching zip hashes but other raw content (index edited to match) is caught."""
    other = (train_copy / "shard.00000.mds.zstd").read_bytes()
    (train_copy / SHARD).write_bytes(other)

    def point_zip_at_shard0(d):
        d["shards"][1]["zip_data"].update(bytes=len(other), hashes=d["shards"][0]["zip_data"]["hashes"])

    edit_json(train_copy / "index.json", point_zip_at_shard0)
    with pytest.raises(ArtifactError, match=f"{SHARD}: decompressed data xxh64 does not match"):
        export_text(ShardDir(train_copy), io.StringIO())


def test_not_zstd_is_an_artifact_error():
    with pytest.raises(ArtifactError, match="x.zstd: cannot be decompressed.*restore the file or reconvert"):
        mds_format.decompress(b"definitely not zstd", name="x.zstd")


def test_index_sample_count_disagreeing_with_the_shard_is_named(train_copy):
    edit_json(train_copy / "index.json", lambda d: d["shards"][0].update(samples=d["shards"][0]["samples"] + 1))
    with pytest.raises(ArtifactError, match="shard.00000.mds.zstd: holds 340 samples.*index.json says 341"):
        inspect(ShardDir(train_copy))


# ---- manifest.json / index.json not JSON or with wrong types --------------------------------

BAD_FILES = [
    ("manifest.json", "{not json", "not valid JSON"),
    ("manifest.json", "[1, 2]", "a JSON list, not an hbpe shard manifest"),
    ("manifest.json", {"counts": {"documents_written": "20"}}, "counts.documents_written='20'"),
    ("manifest.json", {"seq_len": "128"}, "seq_len='128'"),
    ("manifest.json", {"counts": "lots"}, "malformed manifest"),
    ("manifest.json", {"shards": "shard.00000.mds.zstd"}, "shards is not a list of file names"),
    ("index.json", "\x00\x01", "not valid JSON"),
    ("index.json", {"shards": {}}, "not an MDS version 2 index"),
    ("index.json", {"shards": [1]}, "shard 0: int, not an object"),
    ("index.json", {"samples": "340"}, "samples is '340', not a count"),
    ("index.json", {"zip_data": {"basename": 5}}, "shard basename 5 is not a plain file name"),
    ("index.json", {"zip_data": {"bytes": -1}}, "zip_data.bytes is -1"),
    ("index.json", {"zip_data": {"hashes": {}}}, "no hash to verify the shard against"),
    ("index.json", {"column_sizes": [8, "512"]}, "column 'tokens' has encoding"),
    ("index.json", {"column_encodings": ["pickle", "ndarray:int32:128"]}, "column 'num_bytes'"),
]


def _apply(path, edit) -> None:
    if isinstance(edit, str):
        path.write_text(edit)
        return
    d = json.loads(path.read_text())
    target = d["shards"][0] if path.name == "index.json" and "shards" not in edit else d
    for k, v in edit.items():
        if isinstance(v, dict) and isinstance(target.get(k), dict):
            target[k].update(v)
        else:
            target[k] = v
    path.write_text(json.dumps(d))


@pytest.mark.parametrize(("name", "edit", "message"), BAD_FILES, ids=[m for _, _, m in BAD_FILES])
def test_bad_manifest_or_index_is_one_clear_error(train_copy, name, edit, message):
    _apply(train_copy / name, edit)
    with pytest.raises(ArtifactError, match=f"train/{name}.*{re.escape(message)}.*(reconvert|restore)"):
        ShardDir(train_copy)
    for command in ("inspect", "stats", "verify"):
        assert_cli_error(cli("shards", command, "--data", str(train_copy)), message)


@pytest.mark.parametrize(
    "basename", ["../x.mds.zstd", "/abs/path/shard.00000.mds.zstd", "sub/shard.00000.mds.zstd", "..", "a\\b"]
)
def test_index_basenames_must_stay_inside_the_directory(train_copy, basename):
    edit_json(train_copy / "index.json", lambda d: d["shards"][0]["zip_data"].update(basename=basename))
    with pytest.raises(ArtifactError, match="is not a plain file name inside the shard directory"):
        ShardDir(train_copy)
    # the raw (decompressed) name is where streaming writes in its cache: refused the same way
    edit_json(train_copy / "index.json", lambda d: d["shards"][0]["zip_data"].update(basename="shard.00000.mds.zstd"))
    edit_json(train_copy / "index.json", lambda d: d["shards"][0]["raw_data"].update(basename=basename))
    with pytest.raises(ArtifactError, match="is not a plain file name inside the shard directory"):
        ShardDir(train_copy)


def test_index_listing_a_file_twice_is_refused(train_copy):
    edit_json(train_copy / "index.json", lambda d: d["shards"][1]["zip_data"].update(basename="shard.00000.mds.zstd"))
    with pytest.raises(ArtifactError, match="file shard.00000.mds.zstd is listed twice"):
        ShardDir(train_copy)


# ---- verify: the manifest against the shards -----------------------------------------------


def test_verify_accepts_both_tail_cases(sample_shards):
    train, held = (ShardDir(d) for d in sample_shards)
    assert train.manifest.counts.tail_patches_dropped == 0
    c = held.manifest.counts
    assert (c.tail_patches_dropped, c.tail_tokens_dropped) == (45, 44)  # one EOD in the dropped tail
    assert verify(train) == [] and verify(held) == []


MANIFEST_EDITS = [
    ("documents_written", lambda c: c.update(documents_written=c["documents_written"] + 1, documents_read=c["documents_read"] + 1), "document ends"),
    ("bytes", lambda c: c.update(bytes=c["bytes"] + 1), "samples cover"),
    ("samples", lambda c: c.update(samples=c["samples"] - 1), "samples, manifest counts"),
    ("tokens", lambda c: c.update(tokens=c["tokens"] + 3), "tokens + 0 dropped != manifest tokens"),
    ("patches", lambda c: c.update(patches=c["patches"] + 128), "does not equal the stream length"),
    ("padded", lambda c: c.update(tail_patches_padded=5, patches=c["patches"] - 5), "tail PAD patches"),
]  # fmt: skip


@pytest.mark.parametrize(("field", "edit", "message"), MANIFEST_EDITS, ids=[f for f, _, _ in MANIFEST_EDITS])
def test_verify_lists_each_manifest_count_mismatch(train_copy, field, edit, message):
    edit_json(train_copy / "manifest.json", lambda d: edit(d["counts"]))
    problems = verify(ShardDir(train_copy))
    assert any(message in p for p in problems), problems
    r = cli("shards", "verify", "--data", str(train_copy))
    assert r.exit_code == 1 and "FAIL " in r.output and message in r.output


def test_verify_bounds_the_bytes_of_a_dropped_tail(eval_copy):
    """The manifest records the dropped tail's tokens, not its bytes: 44 tokens hold 44..44*128 bytes."""
    in_samples = sum(int(s["num_bytes"]) for s in ShardDir(eval_copy).samples())
    edit_json(eval_copy / "manifest.json", lambda d: d["counts"].update(bytes=in_samples + 4))
    assert any(
        "the 44 dropped tail tokens would hold 4 bytes, expected 44..5632" in p for p in verify(ShardDir(eval_copy))
    )
    edit_json(eval_copy / "manifest.json", lambda d: d["counts"].update(bytes=in_samples + 44 * 128 + 1))
    assert any("would hold 5633 bytes, expected 44..5632" in p for p in verify(ShardDir(eval_copy)))


def test_verify_documents_rule_counts_the_eod_in_the_dropped_tail(eval_copy):
    edit_json(
        eval_copy / "manifest.json",
        lambda d: d["counts"].update(tail_tokens_dropped=45, tokens=d["counts"]["tokens"] + 1),
    )
    problems = verify(ShardDir(eval_copy))
    assert any("document ends + 0 in the dropped tail != manifest documents_written 4" in p for p in problems)


def test_verify_checks_the_tokenizer_fingerprint(train_copy):
    edit_json(train_copy / "manifest.json", lambda d: d.update(tokenizer_fingerprint="0" * 64))
    problems = verify(ShardDir(train_copy))
    assert any(
        p.startswith("tokenizer/ cannot be used")
        and "does not match the manifest" in p
        and "!= manifest 000000000000" in p
        for p in problems
    )
    (train_copy / "tokenizer" / "hbpe_tokenizer.json").write_text("{}")
    assert any(p.startswith("tokenizer/ cannot be used") for p in verify(ShardDir(train_copy)))


def test_verify_lists_missing_shards_and_keeps_going(train_copy):
    damage(train_copy, "missing")
    damage(train_copy, "flip", "shard.00003.mds.zstd")
    problems = verify(ShardDir(train_copy))
    assert f"{SHARD}: missing" in problems
    assert any(p.startswith("shard.00003.mds.zstd: xxh64 does not match") for p in problems)
