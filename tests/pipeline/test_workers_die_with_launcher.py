"""kill -9 of `hbpe convert` takes its worker processes along (in-process pool and DirectRunner workers).

Nothing runs the launcher's cleanup after kill -9: before, a pool worker sat on its task pipe for good,
and a DirectRunner worker still starting up waited on its dead gRPC channels for minutes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import zstandard

from tests.conftest import REPO, SAMPLE_EN, SHARED_DATA

GONE_WITHIN_S = 10.0


@pytest.fixture(scope="module")
def long_units(tmp_path_factory) -> Path:
    """Two .jsonl.zst files of about 100 MB of text each: a compressed file is one work unit, and each takes
    seconds to encode, so the job still runs when it is killed. Long-distance matching keeps each at a few MB."""
    src = SHARED_DATA / "en-sotu.jsonl.zst"
    text = zstandard.ZstdDecompressor().stream_reader((src if src.exists() else SAMPLE_EN).read_bytes()).read()
    params = zstandard.ZstdCompressionParameters.from_level(1, window_log=24, enable_ldm=True)
    folder = tmp_path_factory.mktemp("long-units")
    for name in ("a", "b"):
        with open(folder / f"{name}.jsonl.zst", "wb") as f, zstandard.ZstdCompressor(compression_params=params).stream_writer(f) as w:  # fmt: skip
            for _ in range(-(-100_000_000 // len(text))):
                w.write(text)
    return folder


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _is_worker(p: psutil.Process, runner: str) -> bool:
    """A forked pool worker (the launcher's command line) or a Beam SDK worker (not the shell that starts it)."""
    try:
        argv = p.cmdline()
    except psutil.Error:
        return False
    return (
        "convert" in argv
        if runner == "inprocess"
        else argv[1:3] == ["-m", "apache_beam.runners.worker.sdk_worker_main"]
    )


def _gone(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE  # exited; only its (new) parent has yet to collect it
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("runner", ["inprocess", "DirectRunner"])
def test_kill_9_of_convert_takes_its_workers_along(runner, long_units, gpt2_tokenizer_dir, tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "hbpe.cli", "-q", "convert", "--tokenizer", str(gpt2_tokenizer_dir)]
    cmd += ["--input", str(long_units), "--out", str(out), "--runner", runner, "--workers", "2"]
    err = tmp_path / "err.txt"
    with open(err, "w") as e:
        launcher = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=e)
    workers: list[psutil.Process] = []
    try:
        while sum(_is_worker(p, runner) for p in workers) < (2 if runner == "inprocess" else 1):  # kill it at once
            assert launcher.poll() is None, err.read_text()[-3000:]
            time.sleep(0.02)
            workers = _descendants(launcher.pid)
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + GONE_WITHIN_S
        while (alive := [p for p in workers if not _gone(p)]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [(p.pid, p.cmdline()) for p in alive] == []
    finally:  # on a failure, leave no worker behind
        launcher.kill()
        for p in workers:
            if not _gone(p):
                p.kill()
