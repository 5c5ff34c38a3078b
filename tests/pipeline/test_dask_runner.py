"""`--runner dask` on a real Dask LocalCluster (2 worker processes on 127.0.0.1): the same bytes as the
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
from hbpe.schemas.errors import ConfigError
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


DEPRECATED_LINE = "--runner {} is deprecated (Beam has a runner of that name): use --runner dask"


def test_dask_output_is_byte_identical_to_inprocess(cluster, tmp_path, gpt2_tokenizer_dir, corpus, reference):
    lines: list[str] = []
    out = tmp_path / "out"
    cfg = cfg_for(gpt2_tokenizer_dir, corpus, out)
    m = run_convert(cfg, runner="dask", dask_address=cluster[0], progress=False, on_message=lines.append)
    ref_manifest, ref_files = reference
    assert "runner: dask (--runner dask; the in-process runner's steps as Dask tasks)" in lines
    assert not [ln for ln in lines if "deprecated" in ln]
    assert m["timing"]["runner"] == "dask" and len(m["shards"]) > 2
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
        target=lambda: box.update(m=run_convert(cfg_for(gpt2_tokenizer_dir, corpus, out), runner="dask",
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
    """The CLI's own LocalCluster: its size said, progress from staging, and no traceback or restart on close.
    Asked for by the runner's earlier name, DaskRunner: it still runs, saying once to use `dask`."""
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "hbpe.cli", "convert", "--tokenizer", str(gpt2_tokenizer_dir), "--input", str(corpus),
         "--out", str(out), "--seq-len", "128", "--split-mb", "1", "--runner", "DaskRunner", "--workers", "2"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    both = r.stdout + r.stderr
    assert r.returncode == 0, both
    assert [ln for ln in both.splitlines() if "deprecated" in ln] == [DEPRECATED_LINE.format("DaskRunner")]
    assert "runner: dask (--runner dask; the in-process runner's steps as Dask tasks)" in both
    assert "dask: LocalCluster of 2 worker process(es) on 127.0.0.1" in both
    assert "read = written + rejected: OK" in both and "[convert]: 100%" in both
    for noise in ("Traceback", "CommClosedError", "Restarting worker", "distributed."):
        assert noise not in both, both
    assert json.loads((out / "manifest.json").read_bytes())["counts"]["documents_rejected"] == 10


@pytest.mark.parametrize("given", ["DaskRunner", "dask_runner", "--runner=DaskRunner"])
def test_the_earlier_name_dask_runner_chooses_hbpe_dask_with_a_deprecation_line(given):
    from hbpe.pipeline.beam.options import choose_runner

    runner, args = ("auto", [given]) if given.startswith("--") else (given, [])
    choice = choose_runner(runner, args, output="/o", files=[], workers=2)
    named = given.split("=")[-1]
    assert (choice.name, choice.beam, choice.workers, choice.beam_args) == ("dask", False, 2, ())
    assert choice.deprecation == DEPRECATED_LINE.format(named)


@pytest.mark.parametrize("given", ["dask", "Dask", "inprocess", "auto", "DirectRunner"])
def test_current_runner_names_say_nothing_deprecated(given):
    from hbpe.pipeline.beam.options import choose_runner

    assert choose_runner(given, [], output="/o", files=[]).deprecation is None


def test_beam_dask_runner_options_are_known():
    """Beam's own DaskRunner (by its path) registers its options only once imported: hbpe's check imports it."""
    from hbpe.pipeline.beam.options import check_pipeline_args

    check_pipeline_args(["--runner=apache_beam.runners.dask.dask_runner.DaskRunner", "--dask_client_address=tcp://h:1"])


# ---- --dask-address naming something that is not a Dask scheduler (issue 35) ----------------------------------


@pytest.fixture
def http_server():
    """A real HTTP server on 127.0.0.1: it accepts the connection and waits for a request line that never comes."""
    import http.server

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:  # its "400 Bad request" lines would land in the CLI's captured stderr
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"tcp://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def garbage_server():
    """A raw TCP server on 127.0.0.1 that answers every connection with 4 KiB of garbage and keeps it open."""
    import random
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed at teardown
                return
            held.append(conn)
            conn.sendall(random.Random(0).randbytes(4096))

    threading.Thread(target=serve, daemon=True).start()
    yield f"tcp://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()
    for conn in held:
        conn.close()


def open_executor(address: str, timeout_s: float) -> tuple[BaseException | None, float]:
    """(what dask_executor raised, seconds it took), run in a thread so that a hang fails the test instead of
    blocking it."""
    from hbpe.pipeline.beam.dask_cluster import dask_executor

    box: dict = {}

    def run() -> None:
        try:
            with dask_executor(address, 1, print, timeout_s=timeout_s):
                box["error"] = None
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            box["error"] = e

    t0 = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=timeout_s + 20)
    assert "error" in box, f"dask_executor({address}) still hangs after {timeout_s + 20:g} s"
    return box["error"], time.monotonic() - t0


def test_an_http_server_as_dask_address_is_refused_within_the_timeout(http_server):
    """Before: "runner: DaskRunner" and nothing more for 7+ minutes (distributed waits for the handshake forever)."""
    error, took = open_executor(http_server, timeout_s=1)
    assert isinstance(error, ConfigError) and took < 10, (error, took)
    assert str(error) == (
        f"--dask-address {http_server} is not a Dask scheduler: it accepted the connection but gave no Dask "
        "handshake within 2 s; pass the address `dask scheduler` prints (tcp://HOST:8786 by default) or drop "
        "--dask-address for a local cluster"
    )


def test_a_server_answering_garbage_as_dask_address_is_refused(garbage_server):
    """Before: "MemoryError: Unable to allocate 3.07 EiB" (a frame length read from the garbage)."""
    error, took = open_executor(garbage_server, timeout_s=1)
    assert isinstance(error, ConfigError) and took < 10, (error, took)
    assert f"--dask-address {garbage_server} is not a Dask scheduler: it answered in bytes that are not Dask's" in str(error)  # fmt: skip


def test_a_dask_worker_as_dask_address_is_refused_naming_it(cluster):
    _, client = cluster
    worker = next(iter(client.scheduler_info()["workers"]))
    error, _ = open_executor(worker, timeout_s=5)
    assert isinstance(error, ConfigError)
    assert "speaks Dask's protocol but is a Dask Worker, not the scheduler" in str(error)


def test_a_closed_port_as_dask_address_says_nothing_listens():
    import socket

    with socket.create_server(("127.0.0.1", 0)) as s:
        address = f"tcp://127.0.0.1:{s.getsockname()[1]}"  # closed on leaving: nothing listens there
    error, took = open_executor(address, timeout_s=1)
    assert isinstance(error, ConfigError) and took < 10, (error, took)
    assert str(error).startswith(f"cannot reach the Dask scheduler at --dask-address {address} (Timed out trying")


def test_a_malformed_dask_address_is_refused_before_connecting():
    error, _ = open_executor("tcp://h:notaport", timeout_s=1)
    assert isinstance(error, ConfigError)
    assert str(error).startswith("--dask-address 'tcp://h:notaport' is not an address of a Dask scheduler (invalid")


def test_cli_refuses_an_http_server_as_dask_address_within_hbpe_dask_timeout(
    http_server, tmp_path, gpt2_tokenizer_dir, corpus, monkeypatch
):
    """`hbpe convert --runner dask --dask-address` at an HTTP server: one line within HBPE_DASK_TIMEOUT (here 1 s)
    and its grace, before anything is written (before: "runner: DaskRunner" and nothing more for 7+ minutes)."""
    from click.testing import CliRunner

    from hbpe.cli import main
    from tests.helpers import cli_fails

    monkeypatch.setenv("HBPE_DASK_TIMEOUT", "1")
    out = tmp_path / "out"
    args = ["convert", "--tokenizer", str(gpt2_tokenizer_dir), "--input", str(corpus), "--out", str(out)]
    t0 = time.monotonic()
    r = CliRunner().invoke(main, [*args, "--runner", "dask", "--dask-address", http_server])
    assert time.monotonic() - t0 < 30
    cli_fails(r, 2, f"error: --dask-address {http_server} is not a Dask scheduler: it accepted the connection but "
                    "gave no Dask handshake within 2 s")  # fmt: skip
    assert not out.exists()


@pytest.mark.parametrize("raw", ["0", "-1", "soon", "inf", "nan"])
def test_hbpe_dask_timeout_must_be_seconds(monkeypatch, raw):
    from hbpe.pipeline.beam.dask_cluster import connect_timeout

    monkeypatch.setenv("HBPE_DASK_TIMEOUT", raw)
    with pytest.raises(ConfigError, match=rf"^HBPE_DASK_TIMEOUT='{raw}': must be a number of seconds > 0"):
        connect_timeout()
    monkeypatch.setenv("HBPE_DASK_TIMEOUT", "2.5")
    assert connect_timeout() == 2.5
