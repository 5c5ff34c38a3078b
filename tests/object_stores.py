"""Real object-store servers on 127.0.0.1 for the bucket tests.

S3 is moto's standalone server (`moto_server`), GCS is `gcp-storage-emulator`: both speak the
stores' HTTP APIs, so every client under test (boto3 inside Beam, streaming and Composer;
google-cloud-storage inside the same three) runs its real code against them.

The environment is what a user sets for a private endpoint:
- S3: `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` and `S3_ENDPOINT_URL` (the variable streaming and
  Composer read; hbpe hands it to Beam's S3 filesystem too).
- GCS: `STORAGE_EMULATOR_HOST` (read by google-cloud-storage) and `GOOGLE_APPLICATION_CREDENTIALS`
  naming an application-default-credentials file of type `authorized_user` that carries a token
  valid until 2099, so google-auth never refreshes it (there is no OAuth server offline); the
  emulator accepts any token.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

_BIN = Path(sys.executable).parent
_bucket_ids = itertools.count()


@dataclass
class ObjectStoreServer:
    """One running server: its URI scheme, the environment its clients need, and a bucket maker."""

    scheme: str  # "s3" or "gs"
    endpoint: str
    env: dict[str, str] = field(default_factory=dict)
    _clients: dict = field(default_factory=dict, repr=False)  # the stores' own clients, made once

    def new_bucket(self) -> str:
        """A new empty bucket, as `scheme://name` (names are unique within the test process)."""
        name = f"hbpe-{os.getpid()}-{next(_bucket_ids)}"
        if self.scheme == "s3":
            self._s3_client().create_bucket(Bucket=name)
        else:
            with self.environment():
                self._gcs_client().create_bucket(name)
        return f"{self.scheme}://{name}"

    @contextlib.contextmanager
    def environment(self) -> Iterator[None]:
        """This server's client environment, set for the block and restored after."""
        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def _s3_client(self):
        """One boto3 client per server, made in its environment (a new one per call cost ~0.15 s each)."""
        if "s3" not in self._clients:
            import boto3

            with self.environment():
                self._clients["s3"] = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")
        return self._clients["s3"]

    def _gcs_client(self):
        """One google-cloud-storage client per server (it reads STORAGE_EMULATOR_HOST when made)."""
        if "gs" not in self._clients:
            from google.auth.credentials import AnonymousCredentials
            from google.cloud import storage

            with self.environment():
                self._clients["gs"] = storage.Client(project="hbpe-test", credentials=AnonymousCredentials())
        return self._clients["gs"]

    def list(self, uri: str) -> list[str]:
        """Object names under `uri` (`scheme://bucket/prefix`), relative to the prefix, sorted."""
        bucket, _, prefix = uri.split("://", 1)[1].partition("/")
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        if self.scheme == "s3":
            client = self._s3_client()
            pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            names = [o["Key"] for page in pages for o in page.get("Contents", [])]
        else:
            with self.environment():
                names = [b.name for b in self._gcs_client().list_blobs(bucket, prefix=prefix)]
        return sorted(n[len(prefix) :] for n in names)

    def put(self, uri: str, data: bytes) -> None:
        """Write one object (a test's direct write, e.g. to corrupt a shard behind hbpe's back)."""
        bucket, _, key = uri.split("://", 1)[1].partition("/")
        if self.scheme == "s3":
            self._s3_client().put_object(Bucket=bucket, Key=key, Body=data)
        else:
            with self.environment():
                self._gcs_client().bucket(bucket).blob(key).upload_from_string(data)

    def delete(self, uri: str) -> None:
        """Delete one object (a test's direct delete, e.g. the pointer a killed run never uploaded)."""
        bucket, _, key = uri.split("://", 1)[1].partition("/")
        if self.scheme == "s3":
            self._s3_client().delete_object(Bucket=bucket, Key=key)
        else:
            with self.environment():
                self._gcs_client().bucket(bucket).blob(key).delete()

    def get(self, uri: str) -> bytes:
        """One object's bytes."""
        bucket, _, key = uri.split("://", 1)[1].partition("/")
        if self.scheme == "s3":
            client = self._s3_client()
            return client.get_object(Bucket=bucket, Key=key)["Body"].read()
        with self.environment():
            return self._gcs_client().bucket(bucket).blob(key).download_as_bytes()

    def upload_dir(self, local: Path, uri: str) -> None:
        """Every file under `local` to the same relative names under `uri` (symlinks followed)."""
        for path in sorted(Path(local).rglob("*")):
            if path.is_file():
                self.put(f"{uri.rstrip('/')}/{path.relative_to(local).as_posix()}", path.read_bytes())

    def download_dir(self, uri: str, local: Path) -> Path:
        """Every object under `uri` to the same relative names under `local`."""
        for name in self.list(uri):
            dest = Path(local, name)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(self.get(f"{uri.rstrip('/')}/{name}"))
        return Path(local)


def free_port() -> int:
    """A TCP port nobody listens on now, so parallel or repeated servers and launches never collide."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"object-store server exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.1)
    raise RuntimeError(f"object-store server did not listen on {port} within {timeout:g} s:\n{log.read_text()[-2000:]}")


@contextlib.contextmanager
def _serve(argv: list[str], port: int, log: Path) -> Iterator[None]:
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        _wait_for_port(port, proc, log)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def s3_server(workdir: Path) -> Iterator[ObjectStoreServer]:
    """moto's S3 server on a free port of 127.0.0.1."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    argv = [str(_BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)]
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "S3_ENDPOINT_URL": endpoint,
    }
    with _serve(argv, port, workdir / "moto.log"):
        yield ObjectStoreServer("s3", endpoint, env)


@contextlib.contextmanager
def gcs_server(workdir: Path) -> Iterator[ObjectStoreServer]:
    """gcp-storage-emulator on a free port of 127.0.0.1, keeping its objects in memory."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    adc = workdir / "application_default_credentials.json"
    adc.write_text(
        json.dumps(
            {
                "type": "authorized_user",
                "client_id": "hbpe-test",
                "client_secret": "hbpe-test",
                "refresh_token": "hbpe-test",
                "token": "hbpe-test-token",
                "expiry": "2099-01-01T00:00:00Z",
                "quota_project_id": "hbpe-test",
            }
        )
    )
    exe = shutil.which("gcp-storage-emulator", path=str(_BIN)) or "gcp-storage-emulator"
    argv = [exe, "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"]
    env = {
        "STORAGE_EMULATOR_HOST": endpoint,
        "GOOGLE_APPLICATION_CREDENTIALS": str(adc),
        "GOOGLE_CLOUD_PROJECT": "hbpe-test",
    }
    with _serve(argv, port, workdir / "gcs-emulator.log"):
        yield ObjectStoreServer("gs", endpoint, env)
