"""Entry point for Composer's launcher: `composer -n 8 -m hbpe.training.launch CONFIG [key=value ...]`."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from hbpe.schemas.errors import HbpeError, debug_traceback, internal_error_line, one_line, os_problem
from hbpe.training.config_io import load_config
from hbpe.training.trainer import train

# where rank 0 writes the result as JSON (set by `hbpe train --nproc N`); unset: an `HBPE_RESULT {json}` line
RESULT_FILE_ENV = "HBPE_RESULT_FILE"


def _internal_error(e: BaseException) -> None:
    debug_traceback(e)
    print(internal_error_line(e), file=sys.stderr, flush=True)
    raise SystemExit(1) from None


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        raise SystemExit("usage: python -m hbpe.training.launch CONFIG [key=value ...]")
    try:
        result = train(load_config(argv[0], argv[1:]))
    # one line per rank, in the words and exit statuses of `hbpe train` (schemas/errors.py), never a traceback
    except HbpeError as e:
        print(f"error: {one_line(str(e))}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    except OSError as e:
        if e.filename is None:  # a socket, a pipe, a full disk: not a path the user gave
            _internal_error(e)
        print(f"error: {e.filename}: {os_problem(e)}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    except Exception as e:  # a bug: one line per rank in the CLI's words (traceback with HBPE_DEBUG=1), exit 1
        _internal_error(e)
    from composer.utils import dist

    result_file = os.environ.get(RESULT_FILE_ENV)
    if result_file:  # `hbpe train --nproc N` prints the summary itself, as for one process (and --json)
        # every node's `hbpe train` reads it (the result is the whole run's), so each node's first rank writes it
        if dist.get_local_rank() == 0:
            Path(result_file).write_text(json.dumps(result, sort_keys=True))
    elif dist.get_global_rank() == 0:
        print("HBPE_RESULT " + json.dumps(result, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
