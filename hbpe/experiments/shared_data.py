"""Where the presets' default corpora and rank files live: the shared data folder, found from anywhere.

A preset names them as `${HBPE_SHARED_DATA}/en-sotu.jsonl.zst`: the folder is `$HBPE_SHARED_DATA`
when set, else `shared/data` beside the hbpe checkout (where `make` and the tests find it), else
`../shared/data` from the current directory. The presets used to say `../shared/data/...`, which
only resolved from the checkout's root: `hbpe experiment table1-mini` anywhere else said the
corpus did not exist, without saying where it had looked.
"""

from __future__ import annotations

import os
from pathlib import Path

from hbpe.schemas.errors import ConfigError

SHARED_DATA_ENV = "HBPE_SHARED_DATA"
PREFIX = "${" + SHARED_DATA_ENV + "}/"
# this file is REPO/hbpe/experiments/shared_data.py in a checkout
BESIDE_CHECKOUT = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def shared(name: str) -> str:
    """How a spec names a file of the shared data folder, e.g. `${HBPE_SHARED_DATA}/en-sotu.jsonl.zst`."""
    return PREFIX + name


def candidates() -> list[Path]:
    """The folders tried, in order."""
    env = os.environ.get(SHARED_DATA_ENV)
    if env:
        return [Path(env).expanduser()]
    return [BESIDE_CHECKOUT, Path("..", "shared", "data").resolve()]


def resolve_shared(path: str, *, what: str = "the preset's default corpus") -> str:
    """A spec's path with `${HBPE_SHARED_DATA}/` replaced by the folder that holds the file; others unchanged.

    Raises ConfigError naming every folder tried, and how to point at the right one.
    """
    if not path.startswith(PREFIX):
        return path
    name = path[len(PREFIX) :]
    tried = candidates()
    for folder in tried:
        if (folder / name).exists():
            return str(folder / name)
    env = os.environ.get(SHARED_DATA_ENV)
    looked = " and ".join(map(str, dict.fromkeys(tried)))
    where = f"${SHARED_DATA_ENV}={env}" if env else f"{looked} (${SHARED_DATA_ENV} is not set)"
    fix = "--train-input FILE (and --eval-input FILE)" if "corpus" in what else "a first stage of your own"
    raise ConfigError(
        f"{name}, {what}, is not in {where}; set {SHARED_DATA_ENV} to the folder that holds it, or pass {fix}"
    )
