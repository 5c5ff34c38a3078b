"""A bucket's object names never write outside the local folder they are copied into (issue 20 §1).

Object stores allow any string as a key: `exports/evil/../../../../x/.ssh/authorized_keys` is a
valid S3 key, and `latest-rank0.pt.symlink` may hold `run/../pwned.txt`. Before, `hbpe eval` of such
an export created the file outside its temporary folder (rc 0), and such a pointer wrote
`/tmp/pwned.txt` before failing. Now every name is checked before the first byte is written.
GCS's emulator refuses such names itself, so S3 (moto) carries the end-to-end cases and the
function both stores go through is tested directly.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.pipeline import storage
from hbpe.schemas.errors import ArtifactError
from hbpe.schemas.names import is_relative_object_name


@pytest.mark.parametrize(
    "name",
    ["../x", "a/../../x", "/etc/passwd", "a//b", "./a", "a/.", "", "a\\..\\x", "a\0b", "a/.."],
)
def test_names_that_would_leave_the_folder_are_refused(tmp_path, name):
    # by the name rule itself, before any path is made: not by the second layer (a resolved path outside the
    # folder), which would let `a/..` (the folder itself) through and says "resolves outside" instead
    assert not is_relative_object_name(name)
    with pytest.raises(
        ArtifactError, match=rf"refusing object name {re.escape(repr(name))} under s3://b/p: it would be"
    ):
        storage.local_path_inside(tmp_path, name, source="s3://b/p")


def test_plain_names_map_below_the_folder_and_a_link_inside_it_is_not_followed_out(tmp_path):
    assert storage.local_path_inside(tmp_path, "ckpt/ep0-ba4/.metadata") == str(tmp_path / "ckpt/ep0-ba4/.metadata")
    assert storage.local_path_inside(tmp_path, "..a/b..") == str(tmp_path / "..a/b..")  # dots inside a name are fine
    (tmp_path / "into").mkdir()
    (tmp_path / "into" / "up").symlink_to(tmp_path)
    with pytest.raises(ArtifactError, match="resolves outside"):
        storage.local_path_inside(tmp_path / "into", "up/x")


@pytest.fixture
def s3(s3_server, monkeypatch, tmp_path):
    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    return s3_server


def _cli(*args: str):
    return CliRunner().invoke(main, list(args))


def _nothing_written_below(root: Path, before: set[str]) -> None:
    assert {str(p) for p in root.rglob("*")} == before


def test_an_export_with_an_escaping_object_name_is_refused_before_anything_is_written(
    s3, tiny_run, sample_shards, tmp_path
):
    export = tmp_path / "export"
    r = _cli("export", "--checkpoint", str(tiny_run), "--out", str(export))
    assert r.exit_code == 0, r.output
    remote = f"{s3.new_bucket()}/exports/evil"
    s3.upload_dir(export, remote)
    # the object lands, as named, in the bucket (S3 keeps `..` literally) ...
    victim = tmp_path / "victim"
    victim.mkdir()
    depth = "../" * 12
    s3.put(f"{remote}/{depth}{str(victim).lstrip('/')}/.ssh/authorized_keys", b"ssh-ed25519 AAAA attacker")
    before = {str(p) for p in victim.rglob("*")}
    r = _cli("eval", "--checkpoint", remote, "--data", str(sample_shards[1]), "--max-batches", "1")
    assert r.exit_code != 0
    assert "refusing object name" in r.output and "Traceback" not in r.output
    _nothing_written_below(victim, before)
    assert not (victim / ".ssh").exists()


def test_a_pointer_naming_a_path_out_of_the_run_is_refused(s3, tiny_run, sample_shards, tmp_path, monkeypatch):
    # the checkpoint's local copy goes to a temporary folder: put those in a folder of the test's own,
    # so `evil/run/../pwned.txt` (one level above the copy's folder) lands where the test can look
    temp_root = tmp_path / "tmp"
    temp_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp_root))
    bucket = s3.new_bucket()
    run = f"{bucket}/evil/run"
    s3.upload_dir(tiny_run, run)  # hbpe_run.json, tokenizer/, the checkpoint (latest-rank0.pt followed)
    s3.put(f"{bucket}/evil/run/../pwned.txt", b"pwned")
    s3.put(f"{run}/latest-rank0.pt.symlink", b"evil/run/../pwned.txt")
    r = _cli("eval", "--checkpoint", run, "--data", str(sample_shards[1]), "--max-batches", "1")
    assert r.exit_code != 0
    assert "latest-rank0.pt.symlink names 'evil/run/../pwned.txt'" in r.output and "Traceback" not in r.output
    assert list(temp_root.rglob("pwned.txt")) == []
