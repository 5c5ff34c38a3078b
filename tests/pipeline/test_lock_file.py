"""Lock files (issue 28): never opened through a link, only as a regular file, and a lock whose file its
holder removed is taken again on the new file. Before: a symbolic link planted as OUT/.lock had its
target (outside --out) truncated and given a pid, and a FIFO there ended in `internal error: UnsupportedOperation`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from hbpe.pipeline import lock_file
from hbpe.schemas.errors import ConfigError


def _plant(path, kind: str, target) -> None:
    if kind == "symlink":
        target.write_text("precious\n")
        path.symlink_to(target)
    elif kind == "dangling symlink":
        path.symlink_to(target)  # O_CREAT alone would create the target
    elif kind == "FIFO":
        os.mkfifo(path)
    else:
        path.mkdir()


@pytest.mark.parametrize(
    "kind,said",
    [("symlink", "a symbolic link"), ("dangling symlink", "a symbolic link"), ("FIFO", "a FIFO"), ("dir", "a folder")],
)
def test_a_link_or_special_file_in_the_locks_place_is_refused(tmp_path, kind, said):
    path, target = tmp_path / "x.lock", tmp_path / "victim.txt"
    _plant(path, kind, target)
    with pytest.raises(
        ConfigError, match=f"^{path} is {said}, where hbpe keeps a lock file; .* remove it and run again"
    ):
        lock_file.acquire(str(path))
    if kind == "symlink":
        assert target.read_text() == "precious\n"
    if kind == "dangling symlink":
        assert not target.exists()


def test_a_held_lock_is_refused_with_what_its_holder_wrote(tmp_path):
    path = str(tmp_path / "x.lock")
    code = (
        "import sys; from hbpe.pipeline import lock_file; fd = lock_file.acquire(sys.argv[1]); "
        "lock_file.write_holder(fd, 'pid 42'); print('held', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(lock_file.LockHeld) as e:
            lock_file.acquire(path)
        assert e.value.holder == "pid 42"
    finally:
        holder.kill()
        holder.wait(timeout=30)
    lock_file.release(lock_file.acquire(path))  # the kernel dropped the dead holder's lock


def test_a_waiter_on_a_removed_lock_file_takes_the_new_one(tmp_path):
    """The holder removes the file as it releases it; the process that waited on the old file must not think
    it holds the lock while a third takes the file now at the path."""
    path = str(tmp_path / "x.lock")
    first = lock_file.acquire(path)
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(lock_file.acquire(path, wait=True)))
    waiter.start()
    waiter.join(timeout=0.5)
    assert waiter.is_alive()  # waiting on the first's file
    lock_file.release(first, path)
    waiter.join(timeout=30)
    (fd,) = got
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(path))  # the file at the path, not the removed one
        with pytest.raises(lock_file.LockHeld):
            lock_file.acquire(path)
    finally:
        lock_file.release(fd, path)
    assert not os.path.exists(path)
