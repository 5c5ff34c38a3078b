"""The small error family every user-facing failure in hbpe raises.

The CLI catches `HbpeError` and prints its message without a traceback, so each
message names the problem, the offending value or file, and the fix.
"""

import os
import re
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


# torch re-raises a DataLoader worker's exception in the main process with the worker's whole traceback as its
# message (torch/_utils.py ExceptionWrapper.reraise): "Caught T in DataLoader worker process N.\nOriginal Traceback
# (most recent call last): ...", the exception's own `module.T: message` last
_WORKER = re.compile(r"Caught (?P<type>\w+) (?P<where>in DataLoader worker process \d+)\.\nOriginal Traceback")


def unwrap_worker(text: str) -> str:
    """A worker's exception message as raised, and where, from torch's re-raise of it; other text as it is.

    >>> unwrap_worker("Caught ValueError in DataLoader worker process 1.\\nOriginal Traceback (most recent call last):\\n"
    ...               '  File "x.py", line 1\\nValueError: bad shard\\n')
    'bad shard (raised in DataLoader worker process 1)'
    """
    m = _WORKER.match(text)
    if m is None:
        return text
    # the last `T: ` (or a bare `T` line: an exception without a message) at the start of a line or after a module
    # path: the outermost exception of the chain
    found = list(re.finditer(rf"(?:^|\.){re.escape(m['type'])}(?:: |$)", text, flags=re.MULTILINE))
    if not found:
        return text
    return f"{text[found[-1].end() :].strip()} (raised {m['where']})".lstrip()


def user_message(e: BaseException) -> str:
    """What the user reads of an error: its message on one line (a DataLoader worker's unwrapped, unwrap_worker)."""
    return one_line(unwrap_worker(str(e)))


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
        f"error: internal error: {type(e).__name__}: {user_message(e) or repr(e)} "
        "(rerun with HBPE_DEBUG=1 for the traceback; please report it)"
    )


def debug_traceback(e: BaseException) -> None:
    """The traceback on stderr when HBPE_DEBUG is set (and not 0)."""
    import sys
    import traceback

    if os.environ.get("HBPE_DEBUG", "") not in ("", "0"):
        traceback.print_exception(e, file=sys.stderr)
