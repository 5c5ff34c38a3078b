"""pipeline/storage.py: local paths and object-store URIs read alike, and without Beam.

The remote tests talk real HTTP to moto's S3 server (the `s3_server` fixture) through
streaming's S3 downloader and uploader and botocore, and to endpoints that refuse the
connection or never answer. What a test puts in the bucket, or removes, goes through boto3.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from hbpe.pipeline import storage
from hbpe.pipeline.shards import reader
from hbpe.pipeline.shards.reader import ShardDir, read_manifest
from hbpe.pipeline.tokenizer import artifact
from hbpe.schemas.errors import ArtifactError
from hbpe.training.data import loader as data
from tests.helpers import free_port

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


@dataclass
class Bucket:
    """A new bucket on moto's server: `uri` is s3://NAME; objects are put and deleted with boto3."""

    uri: str
    client: object

    @property
    def name(self) -> str:
        return self.uri.removeprefix("s3://")

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.name, Key=key, Body=data)

    def put_dir(self, local: Path, prefix: str) -> None:
        for p in sorted(local.rglob("*")):
            if p.is_file():
                self.put(f"{prefix}/{p.relative_to(local).as_posix()}", p.read_bytes())

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.name, Key=key)

    def get(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.name, Key=key)["Body"].read()


@pytest.fixture
def s3(s3_server, monkeypatch) -> Bucket:
    import boto3

    _s3_env(monkeypatch, s3_server.endpoint)
    client = boto3.client("s3", endpoint_url=s3_server.endpoint, region_name="us-east-1")
    return Bucket(s3_server.new_bucket(), client)


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


# ---- moto's S3 ---------------------------------------------------------------------------


def test_remote_files_read_missing_and_localized(s3, tmp_path):
    s3.put("dir/a.bin", b"\x00\xffbytes")
    assert storage.read_bytes(f"{s3.uri}/dir/a.bin") == b"\x00\xffbytes"
    assert storage.read_if_exists(f"{s3.uri}/dir/nothing") is None
    with pytest.raises(ArtifactError, match=f"{s3.uri}/dir/nothing not found"):
        storage.read_bytes(f"{s3.uri}/dir/nothing")
    local = storage.localize_dir(f"{s3.uri}/dir", ["a.bin", "nothing"], into=str(tmp_path / "copy"))
    assert sorted(p.name for p in Path(local).iterdir()) == ["a.bin"]  # a missing name is left out


def test_reads_reuse_one_client_per_store_environment_and_process(s3, tmp_path, monkeypatch):
    """A new boto3 client per object cost ~0.15 s each (`hbpe shards verify` on a bucket paid it per shard)."""
    for i in range(3):
        s3.put(f"many/{i}.bin", bytes([i]) * 10)
    assert [storage.read_bytes(f"{s3.uri}/many/{i}.bin") for i in range(3)] == [bytes([i]) * 10 for i in range(3)]
    first = storage._downloader(f"{s3.uri}/many/0.bin", storage.default_timeout())
    assert storage._downloader(f"{s3.uri}/other", storage.default_timeout()) is first  # the same store: reused
    # another endpoint or credentials (the environment) and another read timeout get their own client
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "another-secret")
    assert storage._downloader(f"{s3.uri}/x", storage.default_timeout()) is not first
    assert storage._downloader(f"{s3.uri}/x", 5.0) is not storage._downloader(f"{s3.uri}/x", 6.0)
    assert storage.read_bytes(f"{s3.uri}/many/2.bin") == bytes([2]) * 10  # moto takes any secret
    # streaming switches a client to anonymous reads after a 400 and keeps it so: such a client is not kept
    s3.client.put_object(Bucket=s3.name, Key="public.bin", Body=b"open", ACL="public-read")
    unsigned = storage._downloader(f"{s3.uri}/x", storage.default_timeout())
    unsigned._create_s3_client(unsigned=True)  # what streaming does on a 400 (a public object, say)
    assert storage.read_bytes(f"{s3.uri}/public.bin") == b"open"
    assert storage._downloader(f"{s3.uri}/x", storage.default_timeout()) is not unsigned
    assert storage.read_bytes(f"{s3.uri}/many/1.bin") == bytes([1]) * 10  # a private object: signed again
    # a failed read (here: an endpoint that refuses) forgets the clients: the next read starts from new ones
    kept = storage._downloader(f"{s3.uri}/x", storage.default_timeout())
    with monkeypatch.context() as m:
        m.setenv("S3_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
        with pytest.raises(ArtifactError, match="Could not connect to the endpoint"):
            storage.read_bytes(f"{s3.uri}/many/1.bin")
    assert storage._downloader(f"{s3.uri}/x", storage.default_timeout()) is not kept


def test_remote_writes_are_whole_and_a_missing_bucket_is_named(s3, tmp_path):
    storage.write_bytes(f"{s3.uri}/w/x.bin", b"\x01" * 10)
    local = tmp_path / "other-name.txt"
    local.write_bytes(b"export")
    storage.upload_file(local, f"{s3.uri}/w/y.jsonl")
    assert (s3.get("w/x.bin"), s3.get("w/y.jsonl")) == (b"\x01" * 10, b"export")
    storage.check_bucket(f"{s3.uri}/w/z")
    with pytest.raises(ArtifactError, match=r"^s3://hbpe-none/x: bucket 'hbpe-none' does not exist .*S3_ENDPOINT_URL"):
        storage.check_bucket("s3://hbpe-none/x")


def test_the_deadline_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(storage.TIMEOUT_ENV, raising=False)
    assert storage.default_timeout() == 60.0
    monkeypatch.setenv(storage.TIMEOUT_ENV, "2.5")
    assert storage.default_timeout() == 2.5
    monkeypatch.setenv(storage.TIMEOUT_ENV, "soon")
    with pytest.raises(ArtifactError, match="^HBPE_STORAGE_TIMEOUT='soon' is not a number of seconds"):
        storage.default_timeout()


def test_tokenizer_loads_from_a_bucket_and_errors_name_the_uri(s3, gpt2_tokenizer, gpt2_tokenizer_dir):
    s3.put_dir(gpt2_tokenizer_dir, "tok")
    tok = f"{s3.uri}/tok"
    assert artifact.load(tok).fingerprint == gpt2_tokenizer.fingerprint
    assert artifact.load(tok + "/").fingerprint == gpt2_tokenizer.fingerprint
    s3.put("tok/first_stage.tiktoken", b"")
    with pytest.raises(ArtifactError, match=rf"^{tok}/first_stage.tiktoken was altered: its sha256"):
        artifact.load(tok)
    s3.delete("tok/first_stage.tiktoken")
    with pytest.raises(ArtifactError, match=rf"^{tok}/first_stage.tiktoken is missing"):
        artifact.load(tok)
    with pytest.raises(ArtifactError, match=rf"^{s3.uri}/none/hbpe_tokenizer.json not found: {s3.uri}/none is not a"):
        artifact.load(f"{s3.uri}/none")


def test_one_manifest_reader_for_local_and_remote_shards(s3, sample_shards, gpt2_tokenizer):
    local = sample_shards[1]
    s3.put_dir(local, "eval")
    uri = f"{s3.uri}/eval"
    manifest = read_manifest(uri)
    assert manifest == read_manifest(local) == ShardDir(local).manifest == data.read_manifest(uri)
    assert manifest == ShardDir(uri).manifest and ShardDir(uri).index == ShardDir(local).index
    assert data.read_index(uri)[0] == (local / "index.json").read_bytes()
    assert reader.load_shard_tokenizer(uri).fingerprint == gpt2_tokenizer.fingerprint
    # the COMPLETED check holds for a bucket too: streaming would otherwise train on a failed conversion
    s3.delete("eval/COMPLETED")
    with pytest.raises(ArtifactError, match=f"^{uri} has no COMPLETED marker: the conversion did not finish"):
        read_manifest(uri)
    with pytest.raises(ArtifactError, match=f"^{uri} has no COMPLETED marker"):
        data.build_dataloader(uri, gpt2_tokenizer, batch_size=2, cache_dir=None, shuffle=False, shuffle_seed=0)
    s3.put("eval/COMPLETED", b"")
    s3.put("eval/manifest.json", json.dumps({"format": "hbpe-shards", "version": 1}).encode())
    with pytest.raises(ArtifactError, match=f"^{uri}/manifest.json: malformed manifest.*restore the file"):
        read_manifest(uri)
    s3.delete("eval/manifest.json")
    with pytest.raises(ArtifactError, match=f"^{uri}/manifest.json: missing from a completed shard directory"):
        read_manifest(uri)
    with pytest.raises(ArtifactError, match=f"^{s3.uri}/nothing is not a shard directory.*run `hbpe convert`"):
        read_manifest(f"{s3.uri}/nothing")


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
    with pytest.raises(
        ArtifactError, match=r"^cannot read s3://bucket/tok/hbpe_tokenizer.json \(EndpointConnectionError"
    ):
        artifact.load("s3://bucket/tok")
    with pytest.raises(ArtifactError, match=r"^cannot read s3://bucket/shards/COMPLETED \(EndpointConnectionError"):
        read_manifest("s3://bucket/shards")
    assert time.perf_counter() - t < 30


def test_a_refused_gcs_endpoint_is_said_at_once(monkeypatch, tmp_path):
    """Issue 20: google-cloud-storage retried a refused connection until the 60 s deadline said "no answer"."""
    adc = tmp_path / "adc.json"
    adc.write_text(
        json.dumps({"type": "authorized_user", "client_id": "x", "client_secret": "x", "refresh_token": "x"})
    )
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "p")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", REFUSED)
    monkeypatch.delenv("HTTPS_PROXY", raising=False)
    t = time.perf_counter()
    with pytest.raises(ArtifactError, match=r"^cannot read gs://bucket/x: connection refused by 127.0.0.1:\d+; check"):
        storage.read_bytes("gs://bucket/x", timeout=30)
    with pytest.raises(ArtifactError, match=r"^cannot list gs://bucket/run: connection refused by 127.0.0.1"):
        storage.list_dir("gs://bucket/run", timeout=30)
    assert time.perf_counter() - t < 5


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

from hbpe.pipeline.shards import reader, tools
from hbpe.pipeline.shards.reader import ShardDir, read_manifest
from hbpe.pipeline.tokenizer import artifact
heavy = sorted(n for n in ("torch", "apache_beam", "streaming") if n in sys.modules)
assert not heavy, f"the tokenizer, the shard reader and the shard tools import {heavy}"

from hbpe.schemas.errors import ArtifactError
from hbpe.training.data import loader as data
for read in (artifact.load, read_manifest, data.read_manifest, reader.load_shard_tokenizer, ShardDir):
    try:  # the remote code paths too: they once went through Beam's filesystems
        read("s3://bucket/x")
    except ArtifactError:
        pass
    else:
        raise AssertionError(read)
assert "streaming" in sys.modules  # the remote paths did run
assert "apache_beam" not in sys.modules, "the tokenizer, the shard tools or the trainer's data side import Beam"
"""


def test_tokenizer_reader_and_trainer_data_do_not_import_beam(monkeypatch):
    _s3_env(monkeypatch, REFUSED)
    r = subprocess.run([sys.executable, "-c", _LAYERING], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
