"""The in-process runner: the same bytes as the Beam pipeline, chosen for small local jobs, overridable.

Real conversions on small real files (the bundled samples, bad inputs from test_convert),
compared byte for byte with Beam's DirectRunner; the interruption test signals the real CLI.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zstandard
from click.testing import CliRunner

from hbpe.pipeline.beam.convert import run_convert
from hbpe.pipeline.beam.options import INPROCESS, choose_runner
from hbpe.pipeline.corpus.files import FileInfo
from hbpe.pipeline.shards.reader import ShardDir
from hbpe.pipeline.shards.tools import verify
from hbpe.schemas.convert_config import ConvertConfig
from hbpe.schemas.errors import ConfigError
from tests.conftest import IN_MEMORY_BEAM, REPO, SAMPLE_EN, SAMPLE_ZH, SHARED_DATA
from tests.helpers import bad_inputs as _bad_inputs
from tests.helpers import dir_bytes, exported, without_timing


def mixed_inputs(d: Path) -> Path:
    """Bad records of every kind (test_convert) beside a plain file big enough for several byte-range units."""
    d.mkdir(parents=True)
    _bad_inputs(d)
    texts = [json.loads(x)["text"] for x in zstandard.ZstdDecompressor().stream_reader(SAMPLE_EN.read_bytes()).read().decode().splitlines()]  # fmt: skip
    (d / "e.jsonl").write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts[:12])))
    shutil.copy(SAMPLE_ZH, d / "f.jsonl.zst")
    return d


def convert(tok_dir, src, out, *, args=(), runner="auto", workers=None):
    cfg = ConvertConfig(
        inputs=(str(src),),
        output=str(out),
        tokenizer=str(tok_dir),
        seq_len=128,
        split_bytes=65536,  # e.jsonl (~330 KB) is 6 units
        shard_bytes=1 << 20,  # several shards
        tail="pad",
    )
    return run_convert(cfg, list(args), runner=runner, workers=workers, progress=False)


def test_inprocess_output_is_byte_identical_to_beam(tmp_path, gpt2_tokenizer_dir):
    src = mixed_inputs(tmp_path / "in")
    runs = {
        "beam": convert(gpt2_tokenizer_dir, src, tmp_path / "beam", args=IN_MEMORY_BEAM),
        "pool": convert(gpt2_tokenizer_dir, src, tmp_path / "pool", runner="inprocess", workers=2),
        "inline": convert(gpt2_tokenizer_dir, src, tmp_path / "inline", runner="inprocess", workers=1),
    }
    assert {k: m["timing"]["runner"] for k, m in runs.items()} == {
        "beam": "DirectRunner",
        "pool": INPROCESS,
        "inline": INPROCESS,
    }
    m = runs["beam"]
    assert len(m["shards"]) > 2 and m["counts"]["documents_rejected"] == 10  # every bad record but the long one
    beam = without_timing(dir_bytes(tmp_path / "beam"))
    assert without_timing(dir_bytes(tmp_path / "pool")) == beam
    assert without_timing(dir_bytes(tmp_path / "inline")) == beam
    assert verify(ShardDir(tmp_path / "pool")) == []
    assert exported(tmp_path / "pool", tmp_path)[:3] == ["first good document", "y" * 500, "second good document"]


def files_of(size: int, *, compression: str | None = None, path: str = "/data/a.jsonl") -> list[FileInfo]:
    return [FileInfo(path, size, 0.0, "jsonl", compression)]


def test_auto_runner_choice_and_overrides():
    small, big = files_of(18 << 20), files_of(5 << 30)
    c = choose_runner("auto", [], output="/out", files=small, workers=2)
    assert (c.name, c.workers, c.beam_args) == (INPROCESS, 2, ())
    assert "auto: local job, about 18.9 MB of text" in c.describe()
    # no size threshold: in process is ahead of the DirectRunner at every size measured (README)
    assert choose_runner("auto", [], output="/out", files=big).name == INPROCESS
    # a compressed file counts as about 4x its size of text, for the message
    c = choose_runner("auto", [], output="/o", files=files_of(200 << 20, compression="zstd"))
    assert "about 838.9 MB of text" in c.why
    # any Beam option asks for Beam; so does an object store
    c = choose_runner("auto", ["--direct_num_workers=1"], output="/out", files=small)
    assert (c.name, c.beam_args) == ("DirectRunner", ("--runner=DirectRunner", "--direct_num_workers=1"))
    assert choose_runner("auto", [], output="gs://b/out", files=small).name == "DirectRunner"
    # --runner, as hbpe's option or among the Beam options (library callers)
    assert choose_runner("DataflowRunner", ["--project=p"], output="gs://b/o", files=small).beam_args == (
        "--runner=DataflowRunner",
        "--project=p",
    )
    assert choose_runner("auto", ["--runner=FlinkRunner"], output="/o", files=small).name == "FlinkRunner"
    assert choose_runner("inprocess", [], output="/o", files=big).name == INPROCESS
    with pytest.raises(ConfigError, match=r"Beam pipeline options \(--direct_num_workers=2\) have no effect with --runner inprocess"):  # fmt: skip
        choose_runner("inprocess", ["--direct_num_workers=2"], output="/o", files=small)
    with pytest.raises(ConfigError, match="two runners given: --runner inprocess and --runner=DirectRunner; give one"):
        choose_runner("inprocess", ["--runner=DirectRunner"], output="/o", files=small)


def test_cli_prints_the_runner_and_accepts_an_override(tmp_path, gpt2_tokenizer_dir):
    from hbpe.cli import main

    args = ["convert", "--tokenizer", str(gpt2_tokenizer_dir), "--input", str(SAMPLE_ZH), "--seq-len", "64"]
    r = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    assert "runner: inprocess" in r.output and "(auto: local job, about 0.3 MB of text;" in r.output
    assert "read = written + rejected: OK" in r.output
    assert "[convert]: 100% 0.1/0.1 MB" in r.output and "40 docs, 0.2 MB text at" in r.output  # the final line
    r = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "b"), "--runner", "DirectRunner", *IN_MEMORY_BEAM])
    assert r.exit_code == 0, r.output
    assert "runner: DirectRunner (--runner)" in r.output
    assert without_timing(dir_bytes(tmp_path / "a")) == without_timing(dir_bytes(tmp_path / "b"))


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                out.append(int(entry))
    return out


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for p in pids:
        try:
            if Path(f"/proc/{p}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z":
                alive.append(p)
        except OSError:
            continue
    return alive


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads the process tree from /proc")
def test_sigterm_stops_the_inprocess_workers_and_commits_nothing(tmp_path, gpt2_tokenizer_dir):
    corpus = SHARED_DATA / "en-sotu.jsonl.zst"
    corpus = corpus if corpus.exists() else SAMPLE_EN
    src = tmp_path / "in"
    src.mkdir()
    for i in range(6):  # six units on two worker processes: still encoding a moment after the first is done
        shutil.copy(corpus, src / f"part{i}.jsonl.zst")
    out = tmp_path / "out"
    cmd = [sys.executable, "-c", "from hbpe.cli import main; main()", "convert", "--tokenizer", str(gpt2_tokenizer_dir)]
    cmd += ["--input", str(src), "--out", str(out), "--runner", "inprocess", "--workers", "2"]
    proc = subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not list(out.glob(".hbpe-staging/units/*.json")):
            assert proc.poll() is None and time.monotonic() < deadline, "the conversion never got going"
            time.sleep(0.01)
        workers = _children(proc.pid)
        reaper = [p for p in workers if b"hbpe.pipeline.beam.reaper" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(workers) - len(reaper) == 2  # the pool's two forked processes (and progress.py's reaper)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "error: interrupted by SIGTERM: the workers were stopped and nothing was committed" in err
    assert "Traceback" not in err
    deadline = time.monotonic() + 5
    while _alive(workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _alive(workers) == [], "worker processes outlived the launcher"
    assert not out.exists()
