"""`hbpe convert` when the inputs or the machine misbehave (issue 20): nothing read twice or lost silently.

- a directory with symlink loops is read once per real folder and file, the links left out counted;
- `--resume` re-encodes a unit whose bytes changed under the same size and mtime;
- an empty or cut-short compressed file is a reject, not zero documents;
- a full disk keeps the encoded units for `--resume`;
- an `--overwrite` swap cut short (kill -9 at any point, locally or in a bucket) never shows a mix of
  the two outputs, and `--resume` finishes it.

Kills are simulated where they are deterministic: the launcher's own file operations are wrapped
to stop dead (a BaseException no hbpe code catches, so no cleanup runs, as after SIGKILL) after
a given number of them.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import zstandard

from hbpe.pipeline.beam import convert as convert_module
from hbpe.pipeline.beam import fs
from hbpe.pipeline.beam.convert import run_convert
from hbpe.pipeline.corpus.inputs import resolve_inputs
from hbpe.pipeline.shards.reader import ShardDir, read_manifest
from hbpe.pipeline.shards.tools import verify
from hbpe.schemas.convert_config import ConvertConfig
from hbpe.schemas.errors import ArtifactError, ConfigError, HbpeError
from tests.conftest import IN_MEMORY_BEAM, REPO, SAMPLE_EN, SAMPLE_ZH
from tests.helpers import dir_bytes, exported, without_timing

SPLIT = 1 << 16  # the smallest --split-mb the config takes: a 200 KB file is 4 units


class Killed(BaseException):
    """A simulated kill -9: no `except Exception` (nor hbpe's cleanup) catches it."""


def sample_lines(path: Path = SAMPLE_EN) -> list[bytes]:
    return zstandard.ZstdDecompressor().stream_reader(path.read_bytes()).read().splitlines(keepends=True)


def cfg_for(tok_dir, inputs, out, **kw) -> ConvertConfig:
    inputs = inputs if isinstance(inputs, list | tuple) else [inputs]
    return ConvertConfig(
        inputs=tuple(str(i) for i in inputs),
        output=str(out),
        tokenizer=str(tok_dir),
        **{"seq_len": 128, "split_bytes": SPLIT, **kw},
    )


def inprocess(cfg: ConvertConfig, **kw) -> dict:
    return run_convert(cfg, runner="inprocess", workers=1, progress=False, **kw)


@pytest.fixture
def corpus(tmp_path) -> Path:
    """small.jsonl (3 documents, one unit) and big.jsonl (about 200 KB of the sample: 4 byte-range units)."""
    d = tmp_path / "corpus"
    d.mkdir()
    lines = sample_lines()
    (d / "small.jsonl").write_bytes(b"".join(lines[:3]))
    big, i = [], 3
    while sum(map(len, big)) < 3 * SPLIT + 1000:
        big.append(lines[i % len(lines)])
        i += 1
    (d / "big.jsonl").write_bytes(b"".join(big))
    return d


# ---- symlink loops -------------------------------------------------------------------------------


def test_symlink_loops_are_read_once_through_the_cli(tmp_path, gpt2_tokenizer_dir):
    src = tmp_path / "in"
    (src / "x").mkdir(parents=True)
    (src / "y").mkdir()
    (src / "x" / "a.jsonl").write_text('{"text": "first"}\n{"text": "second"}\n')
    (src / "y" / "b.jsonl").write_text('{"text": "third"}\n')
    (src / "self").symlink_to(".")  # ln -s . self: 41 copies of the corpus before
    (src / "x" / "to-y").symlink_to("../y")  # two folders linking each other: a hang before
    (src / "y" / "to-x").symlink_to("../x")
    (src / "x" / "again.jsonl").symlink_to("a.jsonl")  # a second path to one file
    out = tmp_path / "out"
    cmd = [sys.executable, "-c", "from hbpe.cli import main; main()", "convert", "--tokenizer", str(gpt2_tokenizer_dir)]
    r = subprocess.run(
        [*cmd, "--input", str(src), "--out", str(out), "--seq-len", "16", "--tail", "pad"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,  # the loop used to run without end
    )
    assert r.returncode == 0, r.stderr
    assert exported(out, tmp_path) == ["first", "second", "third"]
    m = json.loads((out / "manifest.json").read_text())
    assert [Path(i["path"]).relative_to(src).as_posix() for i in m["inputs"]] == ["x/a.jsonl", "y/b.jsonl"]
    assert m["skipped_inputs"] == [
        {"path": f"{src}/self", "reason": "directory_already_read", "same_as": str(src)},
        {"path": f"{src}/x/again.jsonl", "reason": "file_already_read", "same_as": f"{src}/x/a.jsonl"},
        {"path": f"{src}/x/to-y", "reason": "directory_already_read", "same_as": f"{src}/y"},
        {"path": f"{src}/y/to-x", "reason": "directory_already_read", "same_as": f"{src}/x"},
    ]
    assert (
        f"skipped 4 input path(s) whose folder or file was read under another path (a symlink loop or a second "
        f"link): {src}/self (same as {src}), {src}/x/again.jsonl (same as {src}/x/a.jsonl), {src}/x/to-y (same as "
        f"{src}/y) and 1 more; the manifest lists them under skipped_inputs"
    ) in r.stderr
    assert "inputs skipped (read once)  4" in r.stdout
    # a ** glob walks the same way (glob's own ** followed the loop too)
    assert resolve_inputs([f"{src}/**/*.jsonl"]) == [f"{src}/x/a.jsonl", f"{src}/y/b.jsonl"]
    assert resolve_inputs([f"{src}/*/*.jsonl"]) == [f"{src}/x/a.jsonl", f"{src}/y/b.jsonl"]


# ---- --resume and changed bytes ------------------------------------------------------------------


def interrupted_run(cfg: ConvertConfig, monkeypatch) -> None:
    """A --resume run that encodes every unit, then fails writing the shards (as a crashed worker would)."""
    from hbpe.pipeline.beam import inprocess as inprocess_module

    def crash(*a, **kw):
        raise RuntimeError("simulated crash")

    with monkeypatch.context() as patch:
        patch.setattr(inprocess_module, "write_shard", crash)
        with pytest.raises(HbpeError, match=r"simulated crash.*encoded unit\(s\) are kept"):
            inprocess(cfg, resume=True)


def rewrite_keeping_size_and_mtime(path: Path, at: int) -> None:
    """Change the letter at or after byte `at` (inside a document's text) as `touch -r` would hide it."""
    data = bytearray(path.read_bytes())
    st = path.stat()
    i = next(j for j in range(at, len(data)) if chr(data[j]).isalpha() and chr(data[j]).islower())
    data[i] = ord("z") if data[i] != ord("z") else ord("y")
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def test_resume_encodes_again_a_unit_whose_bytes_changed_under_the_same_size_and_mtime(
    tmp_path, gpt2_tokenizer_dir, corpus, monkeypatch
):
    out = tmp_path / "out"
    cfg = cfg_for(gpt2_tokenizer_dir, corpus, out)
    interrupted_run(cfg, monkeypatch)
    units = len(list(out.glob(".hbpe-staging/units/unit-*.json")))
    assert units == 5  # big.jsonl's 4 ranges, small.jsonl
    rewrite_keeping_size_and_mtime(corpus / "small.jsonl", 20)
    # a byte after the end of big.jsonl's first range, in the line that range owns (it starts before the end):
    # that range reads it, and so does the second, to find where its first line starts
    data = (corpus / "big.jsonl").read_bytes()
    assert data.index(b"\n", SPLIT - 1) > SPLIT + 100
    rewrite_keeping_size_and_mtime(corpus / "big.jsonl", SPLIT + 50)

    m = inprocess(cfg, resume=True)
    assert m["timing"]["units_reused"] == units - 3
    fresh = tmp_path / "fresh"
    inprocess(cfg_for(gpt2_tokenizer_dir, corpus, fresh))
    assert without_timing(dir_bytes(out)) == without_timing(dir_bytes(fresh))


# ---- empty and cut-short compressed files --------------------------------------------------------


def test_empty_and_truncated_compressed_files_are_rejects(tmp_path, gpt2_tokenizer_dir):
    src = tmp_path / "in"
    src.mkdir()
    good = b'{"text": "kept document"}\n' * 2
    (src / "a.jsonl").write_bytes(good)
    (src / "b-empty.jsonl.zst").write_bytes(b"")  # a download that never got its data
    (src / "c-empty.jsonl.gz").write_bytes(b"")
    frame = zstandard.ZstdCompressor().compress(good * 50)
    (src / "d-cut.jsonl.zst").write_bytes(frame[: len(frame) // 2])  # a truncated zstd frame
    (src / "e-no-text.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(b""))  # empty, but whole
    (src / "f-no-text.jsonl.gz").write_bytes(gzip.compress(b""))
    out = tmp_path / "out"
    m = inprocess(cfg_for(gpt2_tokenizer_dir, src, out, tail="pad"))
    assert m["counts"]["rejected_by_reason"] == {"unreadable_input": 3}
    assert m["counts"]["documents_read"] == 5 and m["counts"]["documents_written"] == 2
    rejects = [json.loads(line) for line in (out / "rejects" / "rejects.jsonl").read_text().splitlines()]
    assert [(Path(r["source"]).name, r["reason"], r["detail"]) for r in rejects] == [
        (
            "b-empty.jsonl.zst",
            "unreadable_input",
            "EOFError: the file is empty (0 bytes), not a zstd stream: a truncated download or copy?",
        ),  # fmt: skip
        (
            "c-empty.jsonl.gz",
            "unreadable_input",
            "EOFError: the file is empty (0 bytes), not a gzip stream: a truncated download or copy?",
        ),  # fmt: skip
        ("d-cut.jsonl.zst", "unreadable_input", "EOFError: truncated zstd stream: the last frame is incomplete"),
    ]
    assert exported(out, tmp_path) == ["kept document"] * 2


# ---- a full disk ---------------------------------------------------------------------------------


def test_a_full_disk_keeps_the_encoded_units_for_resume(tmp_path, gpt2_tokenizer_dir, corpus, monkeypatch):
    out = tmp_path / "out"
    cfg = cfg_for(gpt2_tokenizer_dir, corpus, out)
    real = fs.AtomicWriter.write

    def disk_full_at_the_third_unit(self, data):
        if self.path.endswith("unit-000002.bin"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.tmp)
        real(self, data)

    with monkeypatch.context() as patch:  # without --resume: a full disk used to delete the staging
        patch.setattr(fs.AtomicWriter, "write", disk_full_at_the_third_unit)
        with pytest.raises(
            HbpeError,
            match=rf"nothing was committed to {out}: OSError: \[Errno 28\] No space left on device: .*; the disk is "
            rf"full: its 2 encoded unit\(s\) are kept in {out}/\.hbpe-staging: free space and rerun with --resume",
        ):
            inprocess(cfg)
    staged = sorted(p.name for p in (out / ".hbpe-staging" / "units").iterdir())
    assert staged == [f"unit-00000{i}.{ext}" for i in range(2) for ext in ("bin", "json")]  # no temporary file

    m = inprocess(cfg, resume=True)
    assert m["timing"]["units_reused"] == 2
    fresh = tmp_path / "fresh"
    inprocess(cfg_for(gpt2_tokenizer_dir, corpus, fresh))
    assert without_timing(dir_bytes(out)) == without_timing(dir_bytes(fresh))


# ---- an --overwrite swap cut short ---------------------------------------------------------------


class _DyingOs:
    """The `os` module as fs.py sees it, dead after `budget` renames (the local swap's publishing steps)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget

    def __getattr__(self, name):
        return getattr(os, name)

    def _spend(self) -> None:
        if self.budget == 0:
            raise Killed
        self.budget -= 1

    def rename(self, *a, **kw):
        self._spend()
        return os.rename(*a, **kw)

    def replace(self, *a, **kw):
        self._spend()
        return os.replace(*a, **kw)


class _DyingFileSystems:
    """Beam's FileSystems as fs.py sees them, dead after `budget` object copies or renames (one at a time)."""

    def __init__(self, real, budget: int) -> None:
        self.real, self.budget = real, budget

    def __getattr__(self, name):
        return getattr(self.real, name)

    def _one_by_one(self, op, sources, destinations):
        for src, dst in zip(sources, destinations, strict=True):
            if self.budget == 0:
                raise Killed
            self.budget -= 1
            op([src], [dst])

    def copy(self, sources, destinations):
        self._one_by_one(self.real.copy, sources, destinations)

    def rename(self, sources, destinations):
        self._one_by_one(self.real.rename, sources, destinations)


def kill_the_swap_after(monkeypatch, budget: int | None, *, remote: bool) -> None:
    """The next swap dies after `budget` file operations (None: before it begins)."""
    from hbpe.pipeline.beam.finalize import replace_output as real

    def dying(build: str, output: str) -> None:
        if budget is None:
            raise Killed
        with monkeypatch.context() as patch:
            if remote:
                dying_fs, raw = _DyingFileSystems(fs._beam_fs()[0], budget), fs._beam_fs()[1]
                patch.setattr(fs, "_beam_fs", lambda: (dying_fs, raw))
            else:
                patch.setattr(fs, "os", _DyingOs(budget))
            real(build, output)

    monkeypatch.setattr(convert_module, "replace_output", dying)


def test_a_local_swap_cut_short_is_finished_by_resume(tmp_path, gpt2_tokenizer_dir, monkeypatch):
    out = tmp_path / "out"
    inprocess(cfg_for(gpt2_tokenizer_dir, SAMPLE_EN, out, shard_bytes=1 << 16))
    before = dir_bytes(out)
    assert len(read_manifest(out).shards) > 4
    cfg = cfg_for(gpt2_tokenizer_dir, SAMPLE_ZH, out)

    # killed as the swap begins: the previous output reads and verifies as it was
    kill_the_swap_after(monkeypatch, None, remote=False)
    with pytest.raises(Killed):
        inprocess(cfg, overwrite=True)
    assert {k: v for k, v in dir_bytes(out).items() if not k.startswith(".hbpe-new-")} == before
    assert verify(ShardDir(out)) == []
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="pass --overwrite to replace it, or --resume to continue the interrupted"):
        inprocess(cfg)

    # then killed in the middle of the swap (--resume starts it again): no COMPLETED, so no mix is ever read
    kill_the_swap_after(monkeypatch, 3, remote=False)
    with pytest.raises(Killed):
        inprocess(cfg, resume=True)
    monkeypatch.undo()
    assert not (out / "COMPLETED").exists() and list(out.glob(".hbpe-new-*/COMPLETED"))
    with pytest.raises(ArtifactError, match="has no COMPLETED marker"):
        read_manifest(out)

    m = inprocess(cfg, resume=True)
    fresh = tmp_path / "fresh"
    inprocess(cfg_for(gpt2_tokenizer_dir, SAMPLE_ZH, fresh))
    assert without_timing(dir_bytes(out)) == without_timing(dir_bytes(fresh))
    assert m == json.loads((out / "manifest.json").read_text())
    assert not list(out.glob(".hbpe-*")) and verify(ShardDir(out)) == []


def test_a_bucket_swap_cut_short_is_finished_by_resume(s3_server, tmp_path, gpt2_tokenizer_dir, monkeypatch):
    from tests.helpers import comparable, get_dir
    from tests.helpers import hbpe_cli as hbpe

    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    out = s3_server.new_bucket() + "/shards"
    inprocess(cfg_for(gpt2_tokenizer_dir, SAMPLE_EN, tmp_path / "local", shard_bytes=1 << 16))
    s3_server.upload_dir(tmp_path / "local", out)  # an earlier conversion in the bucket
    old = get_dir(s3_server, out, tmp_path / "old")
    assert len([n for n in old if n.startswith("shard.")]) > 4
    args = ["convert", "--tokenizer", str(gpt2_tokenizer_dir), "--input", str(SAMPLE_ZH), "--out", out,
            "--seq-len", "128", "--split-mb", "1", *IN_MEMORY_BEAM]  # fmt: skip

    # killed as the swap begins: the previous output reads and verifies as it was
    kill_the_swap_after(monkeypatch, None, remote=True)
    with pytest.raises(Killed):
        hbpe(*args, "--overwrite")
    assert {k: v for k, v in get_dir(s3_server, out, tmp_path / "a").items() if not k.startswith(".hbpe-new-")} == old
    assert json.loads(hbpe("shards", "verify", "--data", out, "--json"))["ok"]

    # then killed after 3 object copies of the swap: no COMPLETED, so readers refuse it rather than read a mix
    kill_the_swap_after(monkeypatch, 3, remote=True)
    with pytest.raises(Killed):
        hbpe(*args, "--resume")
    assert "COMPLETED" not in s3_server.list(out)
    with pytest.raises(ArtifactError, match="has no COMPLETED marker"):
        read_manifest(out)
    monkeypatch.undo()
    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)

    m = json.loads(hbpe(*args, "--resume", "--json"))
    new = get_dir(s3_server, out, tmp_path / "new")
    fresh = tmp_path / "fresh"
    inprocess(cfg_for(gpt2_tokenizer_dir, SAMPLE_ZH, fresh, split_bytes=1 << 20))
    assert comparable(new) == comparable(dir_bytes(fresh))
    assert m["shards"] == json.loads(new["manifest.json"])["shards"]
    assert json.loads(hbpe("shards", "verify", "--data", out, "--json"))["ok"]


def test_resume_after_a_kill_between_completed_and_the_staging_removal(tmp_path, gpt2_tokenizer_dir):
    out = tmp_path / "out"
    cfg = cfg_for(gpt2_tokenizer_dir, SAMPLE_ZH, out)
    inprocess(cfg)
    before = dir_bytes(out)
    (out / ".hbpe-staging" / "units").mkdir(parents=True)  # what finalize had not yet removed
    m = inprocess(cfg, resume=True)  # the output is complete: only the staging goes
    assert dir_bytes(out) == before and not (out / ".hbpe-staging").exists()
    assert m == json.loads(before["manifest.json"])
