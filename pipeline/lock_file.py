"""Lock files: one process at a time on a folder, taken without ever writing through a link.

Every lock hbpe takes (an experiment's OUT/.lock, a conversion's output, a run's stream cache,
the streaming setup lock in the temporary folder) goes through `acquire`. The file is opened
with O_NOFOLLOW and must be a regular file: a symbolic link planted in its place used to
have its target (anywhere the user may write) truncated and given a pid, and a FIFO or a
folder ended in an internal error. The lock is an flock, which the kernel releases however the
process ends (kill -9 included), so a crash never leaves a stale lock. The holder writes who it
is into the file, for the message of the one refused.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from hbpe.schemas.errors import ConfigError

try:
    import fcntl
except ImportError:  # Windows: no flock; nothing guards against a second process there
    fcntl = None  # type: ignore[assignment]

# what flock fails with on a file system that has no locks (some NFS): a caller may go on unguarded
NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)
_HOLDER_BYTES = 4096  # what is read back of a holder's record (written by another process: shown, never trusted)
_TRIES = 100  # a lock file removed and made again by other processes while this one opens it (see acquire)


class LockHeld(Exception):
    """Another live process holds the lock; `holder` is what it wrote into the file ('' if nothing yet)."""

    def __init__(self, path: str, holder: str) -> None:
        super().__init__(f"{path} is locked by another process")
        self.holder = holder


def acquire(path: str, *, wait: bool = False) -> int:
    """Lock `path` exclusively (created if missing, its folder too); returns the open file, whose closing releases it.

    Raises LockHeld when another process holds it (`wait`: block until it is free instead),
    ConfigError when `path` is a link, a folder or anything but a regular file, OSError when
    the file system cannot lock (some NFS). A lock whose file was removed and made again
    while this process waited for it (`release(fd, path)` by its holder) is taken again on
    the new file, so two processes never hold "the same" lock on two files.
    """
    for _ in range(_TRIES):
        try:
            fd = _open(path)
        except FileNotFoundError:  # its folder is missing, or was just removed by the run that made it
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            continue
        try:
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
                except BlockingIOError:
                    raise LockHeld(path, _read(fd)) from None
            if _same_file(fd, path):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # locked a file its holder removed on release: take the one now at `path`
    raise OSError(errno.EAGAIN, f"the lock file {path} keeps being removed and made again by other processes")


def write_holder(fd: int, text: str) -> None:
    """Record who holds the lock (read back by `LockHeld.holder` in the processes refused)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode(), 0)


def release(fd: int, path: str | None = None) -> None:
    """Give the lock up; with `path`, remove its file first, while still held (acquire copes with that)."""
    try:
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    finally:
        os.close(fd)


def _open(path: str) -> int:
    """`path` opened for reading and writing, never through a link, and only if it is (or becomes) a regular file."""
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    # O_NONBLOCK: a FIFO in its place is opened (then refused below) instead of waiting for a writer
    flags = os.O_RDWR | os.O_CREAT | nofollow | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.EMLINK) or os.path.islink(path):
            raise _not_a_file(path) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _not_a_file(path)
    return fd


def _not_a_file(path: str) -> ConfigError:
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        mode = 0
    kinds = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"))
    kind = next((name for test, name in kinds if test(mode)), "something other than a regular file")
    return ConfigError(
        f"{path} is {kind}, where hbpe keeps a lock file; hbpe never writes through a link or into a special "
        "file: remove it and run again"
    )


def _same_file(fd: int, path: str) -> bool:
    """Whether `fd` is still the file at `path` (its holder may have removed it on release)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def _read(fd: int) -> str:
    try:
        return os.pread(fd, _HOLDER_BYTES, 0).decode("utf-8", "replace").strip()
    except OSError:
        return ""
