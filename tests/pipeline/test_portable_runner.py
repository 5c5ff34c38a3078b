"""`hbpe convert` through Beam's PortableRunner against Beam's own local job service and an external
worker pool, as separate processes on 127.0.0.1: the Fn API protocol Flink, Spark and Dataflow Runner v2
speak. The shards must be byte-identical to the in-process runner's."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from hbpe.pipeline.beam.convert import run_convert
from hbpe.schemas.convert_config import ConvertConfig
from tests.conftest import SAMPLE_ZH
from tests.helpers import dir_bytes, free_port, without_timing


def _wait_for(port: int, proc: subprocess.Popen, log) -> None:
    for _ in range(300):
        if proc.poll() is not None:
            log.seek(0)
            pytest.fail(f"service on port {port} exited: {log.read()[-2000:]!r}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    pytest.fail(f"nothing listens on port {port} after 30 s")


@pytest.fixture
def job_service_and_worker_pool(tmp_path):
    """(job endpoint, worker pool address): `local_job_service_main` and `worker_pool_main`, each its own process."""
    job_port, pool_port = free_port(), free_port()
    # the pool starts each SDK worker as `python -c ...`: this interpreter's directory first on PATH
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    procs = []
    with open(tmp_path / "job.log", "w+b") as job_log, open(tmp_path / "pool.log", "w+b") as pool_log:
        for module, arg, log in (
            ("apache_beam.runners.portability.local_job_service_main", f"--port={job_port}", job_log),
            ("apache_beam.runners.worker.worker_pool_main", f"--service_port={pool_port}", pool_log),
        ):
            procs.append(
                subprocess.Popen([sys.executable, "-m", module, arg], stdout=log, stderr=subprocess.STDOUT, env=env)
            )
        try:
            _wait_for(job_port, procs[0], job_log)
            _wait_for(pool_port, procs[1], pool_log)
            yield f"localhost:{job_port}", f"localhost:{pool_port}"
        finally:
            for p in procs:
                p.terminate()
                p.wait(timeout=30)


def test_portable_runner_with_external_workers_writes_the_same_shards(
    job_service_and_worker_pool, tmp_path, gpt2_tokenizer_dir
):
    job_endpoint, pool = job_service_and_worker_pool
    lines: list[str] = []
    outs = {}
    for name, runner, args in (
        ("portable", "PortableRunner", [f"--job_endpoint={job_endpoint}", "--environment_type=EXTERNAL",
                                        f"--environment_config={pool}"]),
        ("inprocess", "inprocess", []),
    ):  # fmt: skip
        cfg = ConvertConfig(
            inputs=(str(SAMPLE_ZH),), output=str(tmp_path / name), tokenizer=str(gpt2_tokenizer_dir), seq_len=128
        )
        manifest = run_convert(cfg, args, runner=runner, progress=False, on_message=lines.append)
        assert manifest["counts"]["samples"] > 0
        outs[name] = without_timing(dir_bytes(tmp_path / name))
    assert outs["portable"] == outs["inprocess"]
    assert any(line.startswith("[beam] submitted to PortableRunner: job ") for line in lines)
