"""Entry point for Composer's launcher: `composer -n 8 -m hbpe.training.launch CONFIG [key=value ...]`."""

from __future__ import annotations

import json
import sys

from hbpe.schemas.errors import HbpeError
from hbpe.training.config_io import load_config
from hbpe.training.trainer import train


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        raise SystemExit("usage: python -m hbpe.training.launch CONFIG [key=value ...]")
    try:
        result = train(load_config(argv[0], argv[1:]))
    except HbpeError as e:  # one line per rank, as `hbpe train` prints it, not a traceback
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    from composer.utils import dist

    if dist.get_global_rank() == 0:
        print("HBPE_RESULT " + json.dumps(result, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
