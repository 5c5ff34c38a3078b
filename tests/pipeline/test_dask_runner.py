"""`--runner DaskRunner` on a real Dask LocalCluster (2 worker processes on 127.0.0.1): the same bytes as the
in-process runner (shards, rejects, accounting), a worker killed with SIGKILL mid-run survived, and a clean exit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import zstandard

from hbpe.pipeline.beam.convert import run_convert
from hbpe.schemas.convert_config import ConvertConfig
from tests.conftest import SAMPLE_EN
from tests.helpers import bad_inputs, dir_bytes, without_timing


@pytest.fixture(scope="module")
def cluster():
    """(scheduler address, client): one LocalCluster for the module, as `--dask-address` would name it."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None) as c,
        Client(c) as client,
    ):
        yield c.scheduler_address, client


UNITS = 18  # the corpus's: e.jsonl's 14 ranges and the 4 files of bad_inputs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Bad records of every kind beside a plain file of 14 byte-range units (split_bytes 64 KiB)."""
    d = tmp_path_factory.mktemp("dask-in")
    bad_inputs(d)
    text = zstandard.ZstdDecompressor().stream_reader(SAMPLE_EN.read_bytes()).read().decode()
    (d / "e.jsonl").write_text(text[:900_000].rsplit("\n", 1)[0] + "\n")
    return d


def cfg_for(tok_dir, src, out) -> ConvertConfig:
    return ConvertConfig(
        inputs=(str(src),), output=str(out), tokenizer=str(tok_dir), seq_len=128, split_bytes=65536,
        shard_bytes=1 << 20, tail="pad",
    )  # fmt: skip


@pytest.fixture(scope="module")
def reference(tmp_path_factory, gpt2_tokenizer_dir, corpus) -> tuple[dict, dict[str, bytes]]:
    out = tmp_path_factory.mktemp("dask-ref") / "out"
    m = run_convert(cfg_for(gpt2_tokenizer_dir, corpus, out), runner="inprocess", workers=2, progress=False)
    return m, without_timing(dir_bytes(out))


def test_dask_output_is_byte_identical_to_inprocess(cluster, tmp_path, gpt2_tokenizer_dir, corpus, reference):
    lines: list[str] = []
    out = tmp_path / "out"
    cfg = cfg_for(gpt2_tokenizer_dir, corpus, out)
    m = run_convert(cfg, runner="DaskRunner", dask_address=cluster[0], progress=False, on_message=lines.append)
    ref_manifest, ref_files = reference
    assert m["timing"]["runner"] == "DaskRunner" and len(m["shards"]) > 2
    assert m["counts"] == ref_manifest["counts"] and m["counts"]["documents_rejected"] == 10
    assert without_timing(dir_bytes(out)) == ref_files  # shards, rejects, index, manifest
    assert f"dask: scheduler {cluster[0]}, 2 worker(s) now (more may join)" in lines


def test_a_worker_killed_mid_run_is_survived(cluster, tmp_path, gpt2_tokenizer_dir, corpus, reference):
    """SIGKILL one worker once the first unit is committed: Dask runs its tasks again on the other (and on the
    worker its nanny restarts), and the output is the same bytes."""
    address, client = cluster
    victim = next(iter(client.run(os.getpid).values()))
    out = tmp_path / "out"
    box: dict = {}
    run = threading.Thread(
        target=lambda: box.update(m=run_convert(cfg_for(gpt2_tokenizer_dir, corpus, out), runner="DaskRunner",
                                                dask_address=address, progress=False)),
    )  # fmt: skip
    run.start()
    units = out / ".hbpe-staging" / "units"
    deadline = time.monotonic() + 120
    while not (done_at_kill := len(list(units.glob("*.json"))) if units.is_dir() else 0):
        assert run.is_alive() and time.monotonic() < deadline, "the conversion ended before a unit was committed"
        time.sleep(0.005)
    os.kill(victim, signal.SIGKILL)
    run.join(timeout=300)
    assert "m" in box, "the conversion did not finish"
    assert done_at_kill < UNITS, "every unit was done before the kill"
    assert without_timing(dir_bytes(out)) == reference[1]


def test_cli_local_cluster_exits_cleanly(tmp_path, gpt2_tokenizer_dir, corpus, reference):
    """The CLI's own LocalCluster: its size said, progress from staging, and no traceback or restart on close."""
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "hbpe.cli", "convert", "--tokenizer", str(gpt2_tokenizer_dir), "--input", str(corpus),
         "--out", str(out), "--seq-len", "128", "--split-mb", "1", "--runner", "DaskRunner", "--workers", "2"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    both = r.stdout + r.stderr
    assert r.returncode == 0, both
    assert "dask: LocalCluster of 2 worker process(es) on 127.0.0.1" in both
    assert "read = written + rejected: OK" in both and "[convert]: 100%" in both
    for noise in ("Traceback", "CommClosedError", "Restarting worker", "distributed."):
        assert noise not in both, both
    assert json.loads((out / "manifest.json").read_bytes())["counts"]["documents_rejected"] == 10


def test_beam_dask_runner_options_are_known():
    """Beam's own DaskRunner (by its path) registers its options only once imported: hbpe's check imports it."""
    from hbpe.pipeline.beam.options import check_pipeline_args

    check_pipeline_args(["--runner=apache_beam.runners.dask.dask_runner.DaskRunner", "--dask_client_address=tcp://h:1"])
