"""Buckets end to end: `hbpe convert`, `--resume`, the shard tools and the tokenizer on real stores.

Each test runs once on moto's S3 server and once on the GCS emulator (`object_store`,
tests/object_stores.py), through the CLI and the stores' real clients: Beam's filesystems in the
pipeline, streaming's downloaders and uploaders in the readers. What the tests put in and read
back goes through boto3 and google-cloud-storage directly, never through hbpe. The reference is
the same conversion on local files: every object must hold the same bytes.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
import zstandard

from hbpe.pipeline.beam.convert import run_convert
from hbpe.pipeline.beam.stores import _listing_pattern, filesystem_options, store_args
from hbpe.pipeline.shards.reader import ShardDir, read_manifest
from hbpe.schemas.convert_config import ConvertConfig
from hbpe.schemas.errors import ArtifactError, HbpeError
from tests.conftest import IN_MEMORY_BEAM, SAMPLE_EN
from tests.helpers import comparable, dir_bytes, get_dir, get_object, hbpe_cli

DOCS_PER_FILE, FILES = 3, 3  # three corpus files: three work units, two shards at --shard-mb 1
CONVERT_OPTS = ["--seq-len", "128", "--shard-mb", "1"]


# ---- the stores, through their own clients -------------------------------------------------


def put(server, uri: str, data: bytes) -> None:
    server.put(uri, data)  # the store's own client (boto3 or google-cloud-storage), made once per server


def put_dir(server, local: Path, uri: str) -> None:
    for name, data in dir_bytes(local).items():
        put(server, f"{uri}/{name}", data)


# ---- the data --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The first nine documents of the bundled sample as three .jsonl.zst files."""
    lines = zstandard.ZstdDecompressor().stream_reader(SAMPLE_EN.read_bytes()).read().splitlines(keepends=True)
    d = tmp_path_factory.mktemp("corpus")
    for i in range(FILES):
        part = b"".join(lines[i * DOCS_PER_FILE : (i + 1) * DOCS_PER_FILE])
        (d / f"part-{i}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(part))
    return d


def cfg_for(tokenizer: str, inputs: str, out: str) -> ConvertConfig:
    return ConvertConfig(inputs=(inputs,), output=out, tokenizer=tokenizer, seq_len=128, shard_bytes=1 << 20)


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, corpus, gpt2_tokenizer_dir) -> Path:
    """The reference: the same conversion of local files (in process)."""
    out = tmp_path_factory.mktemp("local") / "shards"
    run_convert(cfg_for(str(gpt2_tokenizer_dir), f"{corpus}/*.jsonl.zst", str(out)), progress=False)
    return out


@pytest.fixture
def bucket_data(object_store, corpus, gpt2_tokenizer_dir) -> dict[str, str]:
    """A new bucket holding the corpus (in/) and the tokenizer (tok/): URIs of the tokenizer, input glob and output."""
    bucket = object_store.new_bucket()
    put_dir(object_store, corpus, f"{bucket}/in")
    put_dir(object_store, gpt2_tokenizer_dir, f"{bucket}/tok")
    return {"tok": f"{bucket}/tok", "in": f"{bucket}/in/*.jsonl.zst", "out": f"{bucket}/out"}


_converted: dict[str, str] = {}  # scheme -> a finished bucket output, for the read-only tests


@pytest.fixture
def bucket_run(object_store, bucket_data) -> str:
    """A finished conversion in a bucket, from a bucket (one per store and test session)."""
    if object_store.scheme not in _converted:
        u = bucket_data
        hbpe_cli(
            "convert", "--tokenizer", u["tok"], "--input", u["in"], "--out", u["out"], *CONVERT_OPTS, *IN_MEMORY_BEAM
        )
        _converted[object_store.scheme] = u["out"]
    return _converted[object_store.scheme]


# ---- Beam's options for the stores ---------------------------------------------------------------


def test_beam_gets_the_s3_endpoint_of_the_environment_unless_given():
    endpoint = "--s3_endpoint_url=http://127.0.0.1:9000"
    assert store_args([], {"S3_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ENDPOINT_URL": "http://x"}) == [endpoint]
    assert store_args([], {"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9000", "AWS_ENDPOINT_URL": "http://x"}) == [
        endpoint
    ]
    assert store_args([], {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"}) == [endpoint]
    assert store_args(["--s3_endpoint_url", "http://y"], {"S3_ENDPOINT_URL": "http://x"}) == []
    assert store_args([], {}) == []
    from apache_beam.options.pipeline_options import S3Options

    given = filesystem_options(["--s3_endpoint_url=http://y", "--direct_num_workers=2"])
    assert given.view_as(S3Options).s3_endpoint_url == "http://y"
    assert [_listing_pattern(u) for u in ("s3://b", "s3://b/out/", "gs://b/in/*.jsonl", "gs://b/x.jsonl")] == [
        "s3://b/*",
        "s3://b/out*",
        "gs://b/in/*",
        "gs://b/x.jsonl*",
    ]


# ---- convert ---------------------------------------------------------------------------------


def test_convert_from_and_into_a_bucket_resumes_to_the_local_bytes(object_store, bucket_data, local_run, tmp_path):
    """An interrupted --resume run keeps its units in the bucket; the CLI's --resume finishes it, on Beam's
    worker processes (which reach the store only through the options hbpe hands them)."""
    from hbpe.pipeline.beam import write_shards as shards

    u = bucket_data
    real = shards._WriteShardFn.process

    def failing(self, task):
        if task.index == 1:
            raise RuntimeError("simulated worker crash")
        yield from real(self, task)

    cfg = cfg_for(u["tok"], u["in"], u["out"])
    kept = rf"(?s)simulated worker crash.*its 3 encoded unit\(s\) are kept in {u['out']}/\.hbpe-staging: rerun with"
    with pytest.MonkeyPatch.context() as patch, pytest.raises(HbpeError, match=kept):
        patch.setattr(shards._WriteShardFn, "process", failing)
        run_convert(cfg, IN_MEMORY_BEAM, resume=True, progress=False)
    staged = object_store.list(u["out"])
    assert [n for n in staged if n.startswith(".hbpe-staging/units/") and n.endswith(".json")] == [
        f".hbpe-staging/units/unit-00000{i}.json" for i in range(3)
    ]
    assert "COMPLETED" not in staged

    args = ["convert", "--tokenizer", u["tok"], "--input", u["in"], "--out", u["out"], *CONVERT_OPTS]
    m = json.loads(hbpe_cli(*args, "--resume", "--json", "--direct_num_workers=1"))
    assert m["timing"]["units_reused"] == 3 and m["timing"]["runner"] == "DirectRunner"
    remote = get_dir(object_store, u["out"], tmp_path / "copy")
    assert sorted(remote) == sorted(dir_bytes(local_run))
    assert any(n.startswith("shard.00001") for n in remote)  # two shards at least
    assert comparable(remote) == comparable(dir_bytes(local_run))
    _converted.setdefault(object_store.scheme, u["out"])  # the same conversion `bucket_run` makes: no second one

    # a finished output: --resume has nothing to continue, as for a local one
    out = hbpe_cli(*args, "--resume", code=2)
    assert f"output {u['out']} exists and is not empty; it holds no interrupted conversion to resume" in out


# ---- the shard tools ---------------------------------------------------------------------------


def test_shard_tools_on_a_bucket_match_the_local_copy(object_store, bucket_run, tmp_path):
    copy = tmp_path / "copy"
    get_dir(object_store, bucket_run, copy)
    for cmd in (["inspect", "--samples", "2"], ["stats"]):
        remote = json.loads(hbpe_cli("shards", *cmd, "--data", bucket_run, "--json"))
        assert remote == json.loads(hbpe_cli("shards", *cmd, "--data", str(copy), "--json"))
    assert json.loads(hbpe_cli("shards", "verify", "--data", bucket_run, "--json")) == {
        "data": bucket_run,
        "ok": True,
        "problems": [],
    }
    hbpe_cli("shards", "export-text", "--data", str(copy), "--out", str(tmp_path / "local.jsonl"))
    expected = (tmp_path / "local.jsonl").read_bytes()
    assert expected.count(b"\n") == DOCS_PER_FILE * FILES
    hbpe_cli("shards", "export-text", "--data", bucket_run, "--out", str(tmp_path / "remote.jsonl"))
    assert (tmp_path / "remote.jsonl").read_bytes() == expected
    target = bucket_run.rsplit("/", 1)[0] + "/export/docs.jsonl"
    hbpe_cli("shards", "export-text", "--data", bucket_run, "--out", target)
    assert get_object(object_store, target) == expected


def test_verify_finds_a_corrupted_shard_in_a_bucket(object_store, local_run):
    uri = object_store.new_bucket() + "/shards"
    put_dir(object_store, local_run, uri)
    name = "shard.00001.mds.zstd"
    data = bytearray((local_run / name).read_bytes())
    data[len(data) // 2] ^= 0xFF
    put(object_store, f"{uri}/{name}", bytes(data))
    out = hbpe_cli("shards", "verify", "--data", uri, code=1)
    assert f"FAIL {name}: xxh64 does not match index.json (corrupted or replaced)" in out
    with pytest.raises(
        ArtifactError, match=rf"^{uri}: shard file is damaged: {name}: .*hbpe shards verify --data {uri}"
    ):
        ShardDir(uri).check_files()
    out = hbpe_cli("shards", "stats", "--data", uri, code=2)
    assert f"error: {uri}: shard file is damaged: {name}" in out


# ---- the tokenizer -------------------------------------------------------------------------------


def test_tokenizer_info_and_encode_from_a_bucket(object_store, bucket_data, gpt2_tokenizer_dir, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("Fellow-Citizens of the Senate and of the House of Representatives:")
    for cmd in (["info", "--json"], ["encode", "--input", str(text)]):
        remote = hbpe_cli("tokenizer", *cmd, "--tokenizer", bucket_data["tok"])
        assert remote == hbpe_cli("tokenizer", *cmd, "--tokenizer", str(gpt2_tokenizer_dir))
    out = hbpe_cli("tokenizer", "info", "--tokenizer", bucket_data["tok"] + "-none", code=2)
    assert f"error: {bucket_data['tok']}-none/hbpe_tokenizer.json not found" in out


# ---- stores that cannot be used: one clear error, in seconds -------------------------------------


@pytest.fixture
def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # closed again: connections are refused


def test_an_unreachable_store_fails_the_preflight_in_seconds(object_store, bucket_data, closed_port, monkeypatch):
    monkeypatch.setenv("HBPE_STORAGE_TIMEOUT", "2")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    monkeypatch.setenv("S3_ENDPOINT_URL" if object_store.scheme == "s3" else "STORAGE_EMULATOR_HOST", closed_port)
    u = bucket_data
    settings = "S3_ENDPOINT_URL" if object_store.scheme == "s3" else "STORAGE_EMULATOR_HOST"
    t = time.perf_counter()
    out = hbpe_cli("convert", "--tokenizer", u["tok"], "--input", u["in"], "--out", u["out"], *CONVERT_OPTS, code=2)
    assert out.startswith(f"error: cannot reach the tokenizer {u['tok']}"), out
    assert settings in out
    assert time.perf_counter() - t < 15


def test_an_explicit_s3_endpoint_wins_over_the_environment(s3_server, closed_port, monkeypatch):
    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    bucket = s3_server.new_bucket()
    out = hbpe_cli("convert", "--tokenizer", f"{bucket}/tok", "--input", f"{bucket}/in/*.jsonl", "--out", f"{bucket}/out",
               *CONVERT_OPTS, f"--s3_endpoint_url={closed_port}", code=2)  # fmt: skip
    assert f'error: cannot reach the tokenizer {bucket}/tok (EndpointConnectionError: Could not connect to the endpoint URL: "{closed_port}/' in out  # fmt: skip


def test_a_missing_bucket_is_named(object_store, bucket_data, local_run):
    u = bucket_data
    missing = f"{object_store.scheme}://hbpe-no-such-bucket"
    out = hbpe_cli(
        "convert", "--tokenizer", u["tok"], "--input", u["in"], "--out", f"{missing}/out", *CONVERT_OPTS, code=2
    )
    assert f"error: the output {missing}/out: bucket 'hbpe-no-such-bucket' does not exist" in out
    out = hbpe_cli("shards", "export-text", "--data", str(local_run), "--out", f"{missing}/x.jsonl", code=2)
    assert f"error: {missing}/x.jsonl: bucket 'hbpe-no-such-bucket' does not exist" in out
    # shards to read from a missing bucket: named as such, not as a prefix without index.json
    with pytest.raises(ArtifactError, match="bucket 'hbpe-no-such-bucket' does not exist"):
        read_manifest(f"{missing}/shards")
