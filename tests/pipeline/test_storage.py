"""pipeline/storage.py: local paths and object-store URIs read alike, and without Beam.

The remote tests talk real HTTP to a stand-in S3 (a few lines of http.server serving GET and
HEAD from a folder) through streaming's S3 downloader and botocore, and to endpoints that
refuse the connection or never answer.
"""

from __future__ import annotations

import http.server
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hbpe.pipeline import storage
from hbpe.pipeline.shards import reader
from hbpe.pipeline.shards.reader import ShardDir, read_manifest
from hbpe.pipeline.tokenizer import artifact
from hbpe.schemas.errors import ArtifactError
from hbpe.training import data

REFUSED = "http://127.0.0.1:9"  # the discard port: nothing listens there, the connection is refused at once


def _s3_env(monkeypatch, endpoint: str) -> None:
    # S3_ENDPOINT_URL is what streaming reads, AWS_ENDPOINT_URL what plain botocore reads
    for k, v in {
        "S3_ENDPOINT_URL": endpoint,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_MAX_ATTEMPTS": "2",
    }.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(k, raising=False)


class _S3Handler(http.server.BaseHTTPRequestHandler):
    """GET and HEAD of /bucket/key from `root`/bucket/key; 404 NoSuchKey otherwise (what S3 answers)."""

    root: Path

    def _object(self) -> Path | None:
        p = self.root / self.path.split("?", 1)[0].lstrip("/")
        return p if p.is_file() else None

    def _answer(self, body: bytes | None) -> None:
        if body is None:
            err = b"<Error><Code>NoSuchKey</Code><Message>not found</Message></Error>"
            self.send_response(404)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(err)))
            self.end_headers()
            if self.command == "GET":
                self.wfile.write(err)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", '"0"')
        self.send_header("Last-Modified", "Mon, 01 Jan 2024 00:00:00 GMT")
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)

    def do_HEAD(self) -> None:  # noqa: N802 (http.server's naming)
        p = self._object()
        self._answer(None if p is None else p.read_bytes())

    do_GET = do_HEAD  # noqa: N815

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def s3(tmp_path, monkeypatch):
    """A local folder served as S3: returns the folder; `s3://bucket/k` is `folder/bucket/k`."""
    root = tmp_path / "s3"
    (root / "bucket").mkdir(parents=True)
    handler = type("Handler", (_S3Handler,), {"root": root})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _s3_env(monkeypatch, f"http://127.0.0.1:{server.server_address[1]}")
    yield root / "bucket"
    server.shutdown()
    server.server_close()


# ---- local paths ---------------------------------------------------------------------------


def test_local_paths(tmp_path):
    f = tmp_path / "a.bin"
    f.write_bytes(b"\x00hbpe")
    assert storage.read_bytes(f) == b"\x00hbpe" == storage.read_if_exists(str(f))
    assert storage.read_if_exists(tmp_path / "missing") is None
    assert storage.read_if_exists(f / "below-a-file") is None
    assert storage.read_if_exists(tmp_path) is None  # a directory is not a file
    with pytest.raises(ArtifactError, match=f"{tmp_path}/missing not found; check the path"):
        storage.read_bytes(tmp_path / "missing")
    assert storage.localize_dir(tmp_path, ["a.bin"]) == str(tmp_path)  # no copy
    assert not storage.is_remote(tmp_path) and storage.is_remote("gs://b/x")
    assert storage.join("s3://b/dir/", "x") == "s3://b/dir/x" and storage.join("d", "x") == "d/x"


# ---- a stand-in S3 -------------------------------------------------------------------------


def test_remote_files_read_missing_and_localized(s3, tmp_path):
    (s3 / "dir").mkdir()
    (s3 / "dir" / "a.bin").write_bytes(b"\x00\xffbytes")
    assert storage.read_bytes("s3://bucket/dir/a.bin") == b"\x00\xffbytes"
    assert storage.read_if_exists("s3://bucket/dir/nothing") is None
    with pytest.raises(ArtifactError, match="s3://bucket/dir/nothing not found"):
        storage.read_bytes("s3://bucket/dir/nothing")
    local = storage.localize_dir("s3://bucket/dir", ["a.bin", "nothing"], into=str(tmp_path / "copy"))
    assert sorted(p.name for p in Path(local).iterdir()) == ["a.bin"]  # a missing name is left out


def test_tokenizer_loads_from_a_bucket_and_errors_name_the_uri(s3, gpt2_tokenizer, gpt2_tokenizer_dir):
    shutil.copytree(gpt2_tokenizer_dir, s3 / "tok")
    assert artifact.load("s3://bucket/tok").fingerprint == gpt2_tokenizer.fingerprint
    assert artifact.load("s3://bucket/tok/").fingerprint == gpt2_tokenizer.fingerprint
    (s3 / "tok" / "first_stage.tiktoken").write_bytes(b"")
    with pytest.raises(ArtifactError, match=r"^s3://bucket/tok/first_stage.tiktoken was altered: its sha256"):
        artifact.load("s3://bucket/tok")
    (s3 / "tok" / "first_stage.tiktoken").unlink()
    with pytest.raises(ArtifactError, match=r"^s3://bucket/tok/first_stage.tiktoken is missing"):
        artifact.load("s3://bucket/tok")
    with pytest.raises(ArtifactError, match=r"^s3://bucket/none/tokenizer.json not found: s3://bucket/none is not a"):
        artifact.load("s3://bucket/none")


def test_one_manifest_reader_for_local_and_remote_shards(s3, sample_shards, gpt2_tokenizer):
    local = sample_shards[1]
    shutil.copytree(local, s3 / "eval")
    uri = "s3://bucket/eval"
    manifest = read_manifest(uri)
    assert manifest == read_manifest(local) == ShardDir(local).manifest == data.read_manifest(uri)
    assert data.read_index(uri)[0] == (local / "index.json").read_bytes()
    assert reader.load_shard_tokenizer(uri).fingerprint == gpt2_tokenizer.fingerprint
    # the COMPLETED check holds for a bucket too: streaming would otherwise train on a failed conversion
    (s3 / "eval" / "COMPLETED").unlink()
    with pytest.raises(ArtifactError, match=f"^{uri} has no COMPLETED marker: the conversion did not finish"):
        read_manifest(uri)
    with pytest.raises(ArtifactError, match=f"^{uri} has no COMPLETED marker"):
        data.build_dataloader(uri, gpt2_tokenizer, batch_size=2, cache_dir=None, shuffle=False, shuffle_seed=0)
    (s3 / "eval" / "COMPLETED").write_bytes(b"")
    (s3 / "eval" / "manifest.json").write_text(json.dumps({"format": "hbpe-shards", "version": 1}))
    with pytest.raises(ArtifactError, match=f"^{uri}/manifest.json: malformed manifest.*restore the file"):
        read_manifest(uri)
    (s3 / "eval" / "manifest.json").unlink()
    with pytest.raises(ArtifactError, match=f"^{uri}/manifest.json: missing from a completed shard directory"):
        read_manifest(uri)
    with pytest.raises(ArtifactError, match="^s3://bucket/nothing is not a shard directory.*run `hbpe convert`"):
        read_manifest("s3://bucket/nothing")


def test_local_shard_dir_messages(sample_shards, tmp_path):
    copy = tmp_path / "eval"
    shutil.copytree(sample_shards[1], copy)
    (copy / "index.json").unlink()
    with pytest.raises(ArtifactError, match=f"{copy}/index.json: missing from a completed shard directory"):
        ShardDir(copy)
    (copy / "COMPLETED").unlink()
    with pytest.raises(ArtifactError, match=f"{copy} has no COMPLETED marker"):
        data.read_manifest(str(copy))
    with pytest.raises(ArtifactError, match=f"{tmp_path}/none is not a shard directory"):
        ShardDir(tmp_path / "none")


# ---- stores that cannot be reached ---------------------------------------------------------


def test_unreachable_store_is_one_quick_artifact_error(monkeypatch):
    _s3_env(monkeypatch, REFUSED)
    t = time.perf_counter()
    with pytest.raises(ArtifactError, match=r"^cannot read s3://bucket/x \(EndpointConnectionError: .*credentials"):
        storage.read_bytes("s3://bucket/x", timeout=10)
    with pytest.raises(ArtifactError, match=r"^cannot read s3://bucket/tok/tokenizer.json \(EndpointConnectionError"):
        artifact.load("s3://bucket/tok")
    with pytest.raises(ArtifactError, match=r"^cannot read s3://bucket/shards/COMPLETED \(EndpointConnectionError"):
        read_manifest("s3://bucket/shards")
    assert time.perf_counter() - t < 30


def test_a_store_that_never_answers_hits_the_deadline(monkeypatch):
    silent = socket.socket()  # accepts connections into its backlog, never replies
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        _s3_env(monkeypatch, f"http://127.0.0.1:{silent.getsockname()[1]}")
        t = time.perf_counter()
        with pytest.raises(ArtifactError, match=r"^cannot read s3://bucket/x: no answer within 1 s; check the network"):
            storage.read_bytes("s3://bucket/x", timeout=1)
        assert time.perf_counter() - t < 5
    finally:
        silent.close()


def test_unknown_scheme_is_refused():
    with pytest.raises(ArtifactError, match=r"^cannot read nope://b/x \(ValueError: Unsupported remote path"):
        storage.read_bytes("nope://b/x")


# ---- import layering -----------------------------------------------------------------------

_LAYERING = """
import importlib, pkgutil, sys
import hbpe.schemas
for m in pkgutil.iter_modules(hbpe.schemas.__path__):
    importlib.import_module("hbpe.schemas." + m.name)
heavy = sorted(n for n in ("torch", "apache_beam", "streaming") if n in sys.modules)
assert not heavy, f"hbpe.schemas imports {heavy}"

from hbpe.pipeline.shards import reader
from hbpe.pipeline.shards.reader import ShardDir, read_manifest
from hbpe.pipeline.tokenizer import artifact
heavy = sorted(n for n in ("torch", "apache_beam", "streaming") if n in sys.modules)
assert not heavy, f"the tokenizer and the shard reader import {heavy}"

from hbpe.schemas.errors import ArtifactError
from hbpe.training import data
for read in (artifact.load, read_manifest, data.read_manifest, reader.load_shard_tokenizer):
    try:  # the remote code paths too: they once went through Beam's filesystems
        read("s3://bucket/x")
    except ArtifactError:
        pass
    else:
        raise AssertionError(read)
assert "streaming" in sys.modules  # the remote paths did run
assert "apache_beam" not in sys.modules, "the tokenizer or the trainer's data side imports Beam"
"""


def test_tokenizer_reader_and_trainer_data_do_not_import_beam(monkeypatch):
    _s3_env(monkeypatch, REFUSED)
    r = subprocess.run([sys.executable, "-c", _LAYERING], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
