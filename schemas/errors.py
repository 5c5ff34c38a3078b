"""The small error family every user-facing failure in hbpe raises.

The CLI catches `HbpeError` and prints its message without a traceback, so each
message names the problem, the offending value or file, and the fix.
"""

import os
import stat


class HbpeError(Exception):
    """Base class: a user-facing error whose message says what to do."""


class ArtifactError(HbpeError, ValueError):
    """A tokenizer artifact, manifest or shard directory is missing, edited or inconsistent."""


class EncodingUnavailableError(HbpeError, RuntimeError):
    """A first-stage encoding cannot be loaded (no network, unknown name, bad file)."""


class ConfigError(HbpeError, ValueError):
    """A configuration value is out of range or inconsistent with another."""


# ---- how an error becomes one line (the CLI and every rank of `hbpe train --nproc N` print the same)


def one_line(text: str) -> str:
    return " ".join(text.split())


def os_problem(e: OSError) -> str:
    """What an OS error on a path the user gave means, and what to do."""
    if isinstance(e, FileNotFoundError):
        return "no such file or directory; check the path"
    if isinstance(e, IsADirectoryError):
        return "is a directory where a file is needed; pass a file path"
    if isinstance(e, (NotADirectoryError, FileExistsError)):
        return f"{one_line(e.strerror or str(e))} (a file where a directory is needed?); pass another path"
    if isinstance(e, PermissionError):
        return "permission denied; check its permissions or pass another path"
    return f"{one_line(e.strerror or str(e))}; check the path"


def file_problem(path: str | os.PathLike, *, missing: str = "does not exist") -> str | None:
    """Why `path` is not a regular file to read (a link to one is), as the end of "PATH ...", or None if it is.

    A FIFO hangs a reader, /dev/zero never ends: such a path is "not a regular file", not `missing`.
    """
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return missing
    except OSError as e:  # no permission on a folder above it, a loop of links, a name too long
        return f"cannot be read ({one_line(e.strerror or str(e))})"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a directory, not a file"
    kinds = {stat.S_ISFIFO: "a FIFO", stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device"}
    kind = next((name for test, name in kinds.items() if test(mode)), "a socket or other special file")
    return f"is not a regular file ({kind})"


def internal_error_line(e: BaseException) -> str:
    return (
        f"error: internal error: {type(e).__name__}: {one_line(str(e)) or repr(e)} "
        "(rerun with HBPE_DEBUG=1 for the traceback; please report it)"
    )


def debug_traceback(e: BaseException) -> None:
    """The traceback on stderr when HBPE_DEBUG is set (and not 0)."""
    import sys
    import traceback

    if os.environ.get("HBPE_DEBUG", "") not in ("", "0"):
        traceback.print_exception(e, file=sys.stderr)
