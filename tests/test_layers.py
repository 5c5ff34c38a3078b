"""The import graph reads in data order: schemas <- pipeline <- training <- the CLI.

None of the three imports the root package `hbpe` (it is the application: its API and CLI);
even the version they record comes from below (schemas/version.py).

Checked on the source with `ast`, so a new module that imports upward or sideways fails here
before anyone has to notice it in review.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

# folder -> the hbpe packages its modules may import (never the root `hbpe`)
ALLOWED = {
    "schemas": {"hbpe.schemas"},
    "pipeline": {"hbpe.schemas", "hbpe.pipeline"},
    "training": {"hbpe.schemas", "hbpe.pipeline", "hbpe.training"},
}
HEAVY = {"torch", "composer", "streaming", "apache_beam", "click"}
# third-party packages each layer may import: schemas stays light, Beam stays in pipeline/beam
FORBIDDEN = {
    "schemas": HEAVY,
    "pipeline": {"torch", "composer", "click"},
    "training": {"apache_beam", "click"},
}


def _imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out += [f"{node.module}.{a.name}" if node.module == "hbpe" else node.module for a in node.names]
    return out


def violations(folder: str) -> list[str]:
    bad = []
    for path in sorted((REPO / folder).rglob("*.py")):
        rel = path.relative_to(REPO)
        for name in _imports(path):
            top = name.split(".")[0]
            if name.startswith("hbpe.") or name == "hbpe":
                pkg = ".".join(name.split(".")[:2])
                if pkg not in ALLOWED[folder]:
                    bad.append(f"{rel} imports {name}")
            elif top in FORBIDDEN[folder] and not (top == "apache_beam" and rel.parts[:2] == ("pipeline", "beam")):
                bad.append(f"{rel} imports {top}")
            elif top in ("pipeline", "training", "schemas"):
                bad.append(f"{rel} imports the top-level name {name}: use hbpe.{name}")
    return bad


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_layers_import_only_downward(folder):
    assert violations(folder) == []


def test_the_check_can_fail(tmp_path, monkeypatch):
    fake = tmp_path / "schemas"
    fake.mkdir()
    (fake / "bad.py").write_text(
        "import torch\nfrom hbpe.training.model.patch_lm import PatchLM\nfrom pipeline import x\n"
        "import hbpe\nfrom hbpe import __version__\n"
    )
    monkeypatch.setattr("tests.test_layers.REPO", tmp_path)
    assert violations("schemas") == [
        "schemas/bad.py imports torch",
        "schemas/bad.py imports hbpe.training.model.patch_lm",
        "schemas/bad.py imports the top-level name pipeline: use hbpe.pipeline",
        "schemas/bad.py imports hbpe",
        "schemas/bad.py imports hbpe.__version__",
    ]
