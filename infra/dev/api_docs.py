"""The Python API's reference, generated from its docstrings with the standard library's pydoc (no other tool).

    python infra/dev/api_docs.py [OUT]        # `make api-docs`; OUT defaults to docs/api

Writes OUT/hbpe.html (the names `import hbpe` gives), OUT/hbpe.api.html (each function with its signature and
docstring) and OUT/hbpe.results.html (the dataclasses they return). The pages are built, not kept in git: they
name the files of the checkout they were made from.
"""

from __future__ import annotations

import os
import pydoc
import sys
from contextlib import redirect_stdout
from pathlib import Path

MODULES = ("hbpe", "hbpe.api", "hbpe.results")


def write_api_docs(out: str | os.PathLike) -> list[Path]:
    """One HTML page per module of MODULES in `out` (created) -> their paths."""
    folder = Path(out).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    here = Path.cwd()
    os.chdir(folder)  # pydoc.writedoc writes NAME.html into the current directory
    try:
        with redirect_stdout(sys.stderr):  # its "wrote NAME.html" lines
            for name in MODULES:
                pydoc.writedoc(name)
    finally:
        os.chdir(here)
    pages = [folder / f"{name}.html" for name in MODULES]
    missing = [str(p) for p in pages if not p.is_file()]
    if missing:  # pydoc prints an import error instead of raising it
        raise SystemExit(f"api_docs: pydoc wrote no {', '.join(missing)}; run `python -c 'import hbpe.api'` to see why")
    return pages


if __name__ == "__main__":
    for page in write_api_docs(sys.argv[1] if len(sys.argv) > 1 else "docs/api"):
        print(page)
