"""`hbpe export` stopped by a file size limit (`ulimit -f`, SIGXFSZ ignored) or a full disk (issue 35): one line
that says what ran out and that nothing of the export is left, and nothing is. Before: "internal error:
SafetensorError: Error while serializing: I/O error: File too large (os error 27)", the new --out left behind."""

from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import sys

import pytest

from hbpe.training.checkpoint.export import no_space_reason
from hbpe.training.checkpoint.export_format import write_export
from tests.conftest import REPO
from tests.helpers import scaled_model

LIMIT = 100_000  # bytes: the tiny model's weights (~0.9 MB) pass it, Python's own start writes nothing


def _limited() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # then a write past the limit fails with EFBIG, as under a shell
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def _export_limited(checkpoint, out, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "hbpe.cli", "export", "--checkpoint", str(checkpoint), "--out", str(out), *extra]
    return subprocess.run(cmd, cwd=REPO, preexec_fn=_limited, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def model_dir(gpt2_tokenizer, tmp_path_factory):
    """An export of a built model: what the CLI exports again (any checkpoint hbpe reads), without training."""
    out = tmp_path_factory.mktemp("no-space") / "source"
    write_export(scaled_model("hierarchical", gpt2_tokenizer, 0), gpt2_tokenizer, str(out), source={"test": 1})
    return out


def _one_line(r: subprocess.CompletedProcess, out) -> None:
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert r.stderr.splitlines() == [
        f"error: export to {out} stopped: a file would pass the file size limit (ulimit -f) (SafetensorError); "
        "nothing of it is left; free space or raise the limit, or pass another --out, and rerun"
    ]


def test_a_file_size_limit_leaves_no_new_folder(model_dir, tmp_path):
    out = tmp_path / "new" / "model"
    _one_line(_export_limited(model_dir, out), out)
    assert os.listdir(tmp_path) == []  # neither the export nor the folders made for it


def test_an_overwrite_stopped_by_the_limit_leaves_the_folder_empty(model_dir, tmp_path):
    out = tmp_path / "model"
    r = subprocess.run(
        [sys.executable, "-m", "hbpe.cli", "export", "--checkpoint", str(model_dir), "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    _one_line(_export_limited(model_dir, out, "--overwrite"), out)
    assert os.listdir(out) == []  # not an earlier export less its description


@pytest.mark.parametrize(
    "error,reason",
    [
        (OSError(errno.ENOSPC, "No space left on device"), "the disk is full"),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), "the disk quota is used up"),
        (RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"), "the disk is full"),
        (PermissionError(errno.EACCES, "Permission denied"), None),
    ],
)
def test_what_ran_out_is_read_from_the_error_or_its_cause(error, reason):
    assert no_space_reason(error) == reason
    try:
        try:
            raise error
        except Exception as inner:
            raise ValueError("while writing") from inner
    except ValueError as outer:
        assert no_space_reason(outer) == reason
