"""One `hbpe convert` at a time on a local output (issue 28).

Before: nothing stopped a second conversion on the same --out. On a new folder both could fail on a shared
staging unit (FileNotFoundError), or the second was told to pass --resume or --overwrite, which would
collide with the live run; two --overwrite runs on a finished output ended with an internal
FileNotFoundError and the false claim "OUT is as it was". The second is now refused, naming the first.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.pipeline.beam.outputs import LOCK_FILENAME
from hbpe.schemas.errors import ConfigError
from tests.helpers import cli_fails, convert, dir_bytes, exported


class OutputHolder:
    """Another process holding a conversion's output, as a live `hbpe convert` does (the real lock), until `end`."""

    def __init__(self, out: Path) -> None:
        code = (
            "import sys; from hbpe.pipeline.beam.outputs import locked; held = locked(sys.argv[1], sys.argv[1]); "
            "held.__enter__(); print('held', flush=True); sys.stdin.read(); held.__exit__(None, None, None)"
        )
        argv = [sys.executable, "-c", code, str(out)]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "held"

    def end(self, sig: int | None = None) -> None:
        """Ends as a run does (the lock file removed, a folder it created too), or killed with `sig`."""
        if sig is None:
            self.proc.stdin.close()
        else:
            self.proc.send_signal(sig)
        assert self.proc.wait(timeout=30) == (-sig if sig else 0)


@pytest.fixture
def small(tmp_path) -> Path:
    """A corpus that converts in a moment."""
    path = tmp_path / "small.jsonl"
    path.write_text("".join(f'{{"text": "document {i} of a small corpus, converted quickly"}}\n' for i in range(40)))
    return path


def _convert_cli(tok_dir, src: Path, out: Path):
    args = ["convert", "--tokenizer", str(tok_dir), "--input", str(src), "--seq-len", "16"]
    return CliRunner().invoke(main, [*args, "--out", str(out)])


def test_a_second_convert_on_a_new_output_is_refused_naming_the_first(tmp_path, gpt2_tokenizer_dir, small):
    out = tmp_path / "new"
    holder = OutputHolder(out)
    try:
        r = _convert_cli(gpt2_tokenizer_dir, small, out)
        cli_fails(
            r,
            2,
            f"{out} is being written by another hbpe convert (pid {holder.proc.pid}); "
            "wait for it or choose another --out",
        )
        assert sorted(p.name for p in out.iterdir()) == [LOCK_FILENAME]  # the holder's, nothing of this run
    finally:
        holder.end()
    assert not out.exists()  # the holder created it and wrote nothing: its lock and folder went as it ended
    r = _convert_cli(gpt2_tokenizer_dir, small, out)
    assert r.exit_code == 0, r.output
    assert not (out / LOCK_FILENAME).exists() and exported(out, tmp_path)


def test_an_overwrite_of_a_held_output_is_refused_and_the_output_kept(tmp_path, gpt2_tokenizer_dir, small):
    out = tmp_path / "out"
    convert(gpt2_tokenizer_dir, [small], out, args=[], seq_len=16)
    before = dir_bytes(out)
    holder = OutputHolder(out)
    try:
        with pytest.raises(ConfigError, match=r"is being written by another hbpe convert \(pid \d+\)"):
            convert(gpt2_tokenizer_dir, [small], out, args=[], overwrite=True, seq_len=8)
        assert {k: v for k, v in dir_bytes(out).items() if k != LOCK_FILENAME} == before
    finally:
        holder.end(signal.SIGKILL)  # kill -9: the kernel drops its lock; the file it leaves holds no lock
    assert (out / LOCK_FILENAME).is_file()
    convert(
        gpt2_tokenizer_dir, [small], out, args=[], overwrite=True, seq_len=8
    )  # a stale lock file is no foreign file
    assert not (out / LOCK_FILENAME).exists() and dir_bytes(out) != before


def test_a_link_in_place_of_the_lock_file_is_refused(tmp_path, gpt2_tokenizer_dir, small):
    out, victim = tmp_path / "out", tmp_path / "victim.txt"
    out.mkdir()
    victim.write_text("precious\n")
    (out / LOCK_FILENAME).symlink_to(victim)
    with pytest.raises(ConfigError, match=f"{out / LOCK_FILENAME} is a symbolic link, where hbpe keeps a lock file"):
        convert(gpt2_tokenizer_dir, [small], out, args=[])
    assert victim.read_text() == "precious\n" and [p.name for p in out.iterdir()] == [LOCK_FILENAME]
