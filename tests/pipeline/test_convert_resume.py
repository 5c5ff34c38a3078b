"""`hbpe convert --resume`: a killed or failed conversion continues from the units it encoded, to the same bytes.

The kill test SIGKILLs the real CLI (its whole process group: no cleanup runs) once a few
units are committed, then resumes it; the others fail a real run midway (a shard writer
that raises, as in test_convert) and check what a resume reuses and what it refuses.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zstandard

from hbpe.pipeline.beam.convert import run_convert
from hbpe.schemas.convert_config import ConvertConfig
from hbpe.schemas.errors import ConfigError, HbpeError
from tests.conftest import IN_MEMORY_BEAM, REPO, SAMPLE_EN, SAMPLE_ZH, SHARED_DATA
from tests.helpers import dir_bytes, without_timing


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """One plain jsonl of about 10 MB (en-sotu, or the bundled sample repeated): 10+ units at --split-mb 1."""
    src = SHARED_DATA / "en-sotu.jsonl.zst"
    data = zstandard.ZstdDecompressor().stream_reader((src if src.exists() else SAMPLE_EN).read_bytes()).read()
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_bytes(data * (1 if src.exists() else 40))
    return path


def cfg_for(tok_dir, src, out, **kw) -> ConvertConfig:
    return ConvertConfig(
        inputs=(str(src),),
        output=str(out),
        tokenizer=str(tok_dir),
        **{"seq_len": 256, "split_bytes": 1 << 20, "shard_bytes": 4 << 20, **kw},
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory, gpt2_tokenizer_dir, corpus) -> dict[str, bytes]:
    """The bytes of an uninterrupted run: what every resumed run must produce."""
    out = tmp_path_factory.mktemp("ref") / "out"
    run_convert(cfg_for(gpt2_tokenizer_dir, corpus, out), runner="inprocess", progress=False)
    return without_timing(dir_bytes(out))


def cli(tok_dir, src, out, *extra: str) -> list[str]:
    cmd = [sys.executable, "-c", "from hbpe.cli import main; main()", "convert", "--tokenizer", str(tok_dir)]
    return [
        *cmd,
        "--input",
        str(src),
        "--out",
        str(out),
        "--seq-len",
        "256",
        "--split-mb",
        "1",
        "--shard-mb",
        "4",
        *extra,
    ]


def units_done(out: Path) -> int:
    return units_in(out)


def units_in(build: Path) -> int:
    """Units committed in a build folder's staging (their summary files)."""
    return len(list(build.glob(".hbpe-staging/units/unit-*.json")))


@pytest.mark.parametrize(
    "first",
    [
        ("--runner", "inprocess", "--workers", "1"),
        ("--runner", "DirectRunner", *IN_MEMORY_BEAM),
    ],
    ids=["inprocess", "beam"],
)
def test_sigkilled_conversion_resumes_to_the_same_bytes(tmp_path, gpt2_tokenizer_dir, corpus, reference, first):
    out = tmp_path / "out"
    proc = subprocess.Popen(
        cli(gpt2_tokenizer_dir, corpus, out, *first), cwd=REPO, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        while units_done(out) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, "the conversion ended before the kill"
            time.sleep(0.005)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # like `kill -9` on the job: nothing of hbpe runs after it
        proc.wait()
    done = units_done(out)
    assert not (out / "COMPLETED").exists() and done >= 3

    r = subprocess.run(cli(gpt2_tokenizer_dir, corpus, out), cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2
    assert (
        "an unfinished conversion: no COMPLETED); pass --overwrite to replace it, or --resume to continue" in r.stderr
    )

    r = subprocess.run(cli(gpt2_tokenizer_dir, corpus, out, "--resume"), cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    total = int(r.stderr.split("converting ", 1)[1].split(" work units", 1)[0])
    assert done < total, "every unit was done before the kill: nothing was resumed"
    assert f"resuming the interrupted conversion: {done} of {total} units already encoded" in r.stderr
    m = json.loads((out / "manifest.json").read_text())
    assert m["timing"]["units_reused"] == done and m["timing"]["runner"] == "inprocess"
    assert without_timing(dir_bytes(out)) == reference
    assert not list(out.glob(".hbpe-*"))


@pytest.fixture
def failing_shard_writer(monkeypatch):
    """Shard 1's writer raises, as a crashed worker would, after every unit is encoded (Beam in memory)."""
    from hbpe.pipeline.beam import write_shards as shards

    real = shards._WriteShardFn.process

    def failing(self, task):
        if task.index == 1:
            raise RuntimeError("simulated worker crash")
        yield from real(self, task)

    monkeypatch.setattr(shards._WriteShardFn, "process", failing)
    return monkeypatch


def test_failed_resumable_run_keeps_its_units_and_resume_checks_them(
    tmp_path, gpt2_tokenizer_dir, corpus, reference, failing_shard_writer
):
    out = tmp_path / "out"
    cfg = cfg_for(gpt2_tokenizer_dir, corpus, out)
    with pytest.raises(HbpeError, match=r"(?s)simulated worker crash.*; its \d+ encoded unit\(s\) are kept in .*\.hbpe-staging: rerun with --resume"):  # fmt: skip
        run_convert(cfg, IN_MEMORY_BEAM, resume=True, progress=False)
    failing_shard_writer.undo()
    n = units_done(out)
    assert n >= 10 and not (out / "COMPLETED").exists()

    # another tokenizer, other options, a changed input: refused, the staging untouched
    from hbpe.pipeline.tokenizer import artifact

    other = artifact.save(artifact.train_tokenizer("gpt2", max_patch_size=8), tmp_path / "s8")
    with pytest.raises(ConfigError, match=r"cannot resume the conversion in .*out: it used the tokenizer with fingerprint \w{12}, this run \w{12}: rerun with the same --tokenizer; or pass --overwrite instead of --resume"):  # fmt: skip
        run_convert(cfg_for(other, corpus, out), resume=True, progress=False)
    with pytest.raises(ConfigError, match=r"its options differ from this run's: seq_len 256 -> 512, tail 'drop' -> 'pad'; rerun with the options it had"):  # fmt: skip
        run_convert(cfg_for(gpt2_tokenizer_dir, corpus, out, seq_len=512, tail="pad"), resume=True, progress=False)
    st = corpus.stat()
    os.utime(corpus, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    try:
        with pytest.raises(ConfigError, match=r"input .*corpus.jsonl changed since \(size or modification time\)"):
            run_convert(cfg, resume=True, progress=False)
    finally:
        os.utime(corpus, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert units_done(out) == n

    # a unit whose key does not match (made under other settings), and one whose stream is not what its summary
    # hashed (a machine crash before the page cache reached the disk) are encoded again, the others reused
    units = out / ".hbpe-staging" / "units"
    summary = units / "unit-000002.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "key": "0" * 64}))
    stream = bytearray((units / "unit-000003.bin").read_bytes())
    stream[100:104] = bytes(4)
    (units / "unit-000003.bin").write_bytes(stream)
    m = run_convert(cfg, resume=True, progress=False)
    assert m["timing"] == {**m["timing"], "runner": "inprocess", "units_reused": n - 2}
    assert without_timing(dir_bytes(out)) == reference


def test_interrupted_overwrite_resumes_and_then_replaces(tmp_path, gpt2_tokenizer_dir, corpus, reference, failing_shard_writer):  # fmt: skip
    out = tmp_path / "out"
    run_convert(cfg_for(gpt2_tokenizer_dir, SAMPLE_ZH, out), runner="inprocess", progress=False)
    before = dir_bytes(out)
    cfg = cfg_for(gpt2_tokenizer_dir, corpus, out)
    with pytest.raises(
        HbpeError, match=f"nothing was committed to {out}; {out} is as it was: .*simulated worker crash"
    ):
        run_convert(cfg, IN_MEMORY_BEAM, overwrite=True, resume=True, progress=False)
    failing_shard_writer.undo()
    assert {k: v for k, v in dir_bytes(out).items() if not k.startswith(".hbpe-new-")} == before
    (build,) = out.glob(".hbpe-new-*")
    n = units_in(build)
    with pytest.raises(ConfigError, match=r"exists and is not empty; pass --overwrite to replace it, or --resume"):
        run_convert(cfg, progress=False)
    # on Beam this time: every unit is reused (an empty CreateUnits), and the --overwrite it continues needs no
    # second --overwrite
    m = run_convert(cfg, IN_MEMORY_BEAM, resume=True, progress=False)
    assert m["timing"]["units_reused"] == n >= 10 and not build.exists()
    assert without_timing(dir_bytes(out)) == reference


def test_resume_with_nothing_to_resume(tmp_path, gpt2_tokenizer_dir):
    out = tmp_path / "out"
    cfg = cfg_for(gpt2_tokenizer_dir, SAMPLE_ZH, out)
    m = run_convert(cfg, resume=True, progress=False)  # a new output: a fresh run
    assert m["timing"]["units_reused"] == 0 and (out / "COMPLETED").exists()
    with pytest.raises(ConfigError, match=r"exists and is not empty; it holds no interrupted conversion to resume: pass --overwrite to replace it"):  # fmt: skip
        run_convert(cfg, resume=True, progress=False)
    legacy = tmp_path / "legacy"
    (legacy / ".hbpe-staging" / "units").mkdir(parents=True)  # an unfinished run of an hbpe without resume records
    with pytest.raises(ConfigError, match=r"cannot resume .*legacy: its staging has no resume record .*; or pass --overwrite instead of --resume to start over"):  # fmt: skip
        run_convert(cfg_for(gpt2_tokenizer_dir, SAMPLE_ZH, legacy), resume=True, progress=False)
