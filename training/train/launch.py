"""Entry point for Composer's launcher: `composer -n 8 -m hbpe.training.train.launch CONFIG [key=value ...]`."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from hbpe.pipeline.library_chatter import quiet_if_asked
from hbpe.pipeline.parent_watch import exit_with_parent
from hbpe.schemas.errors import HbpeError, debug_traceback, internal_error_line, os_problem, user_message
from hbpe.training.train.config_io import load_config
from hbpe.training.train.launch_command import RESULT_FILE_ENV
from hbpe.training.train.trainer import train


def _internal_error(e: BaseException) -> None:
    debug_traceback(e)
    print(internal_error_line(e), file=sys.stderr, flush=True)
    raise SystemExit(1) from None


def _fail(e: Exception) -> None:
    """One line per rank, in the words and exit statuses of `hbpe train` (schemas/errors.py), never a traceback."""
    if isinstance(e, HbpeError):
        print(f"error: {user_message(e)}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    if isinstance(e, OSError) and e.filename is not None:  # else a socket, a pipe, a full disk: not a user's path
        print(f"error: {e.filename}: {os_problem(e)}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    _internal_error(e)  # a bug: one line per rank in the CLI's words (traceback with HBPE_DEBUG=1), exit 1


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        raise SystemExit("usage: python -m hbpe.training.train.launch CONFIG [key=value ...]")
    stop_with_launcher()
    quiet_if_asked()  # `hbpe -q train --nproc N`: this rank's libraries are quiet too
    try:
        result = train(load_config(argv[0], argv[1:]))
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    except Exception as e:
        _exit_if_stopping()  # a peer stopped first and this rank's collective failed: the stop, not an error
        _fail(e)
    from composer.utils import dist

    result_file = os.environ.get(RESULT_FILE_ENV)
    if result_file:  # `hbpe train --nproc N` prints the summary itself, as for one process (and --json)
        # every node's `hbpe train` reads it (the result is the whole run's), so each node's first rank writes it
        if dist.get_local_rank() == 0:
            Path(result_file).write_text(json.dumps(result, sort_keys=True))
    elif dist.get_global_rank() == 0:
        print("HBPE_RESULT " + json.dumps(result, sort_keys=True), flush=True)


_stopping: list[int] = []  # the stop signal this rank got


def stop_with_launcher() -> None:
    """SIGTERM stops this rank as Composer has it, and also comes when the launcher dies (kill -9 included).

    Composer's handler (installed as composer is imported) turns SIGTERM into `sys.exit(143)`: its
    atexit close waits for checkpoint uploads in flight. `hbpe train` stops a run by signalling its
    process group and says so itself, so a rank whose collective failed because a peer stopped first
    exits the same way, without an error line of its own (_exit_if_stopping).
    """
    composer = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: Any) -> None:
        if _stopping:  # the group's SIGTERM and the launcher's death both send one: stop once, let close() finish
            return
        _stopping.append(signum)
        if callable(composer):
            composer(signum, frame)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    exit_with_parent(signal.SIGTERM)


def _exit_if_stopping() -> None:
    """SystemExit(128+N) when a stop signal came (this call, a Python frame, also runs a handler still pending)."""
    if _stopping:
        raise SystemExit(128 + _stopping[0])


if __name__ == "__main__":
    main()
