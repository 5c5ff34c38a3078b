"""hbpe.training's public names: each a static import that tools follow, each resolves, the package light to import."""

from __future__ import annotations

import ast
import subprocess
import sys

import hbpe.training as hbt
from tests.conftest import REPO


def _imported_names() -> tuple[set[str], set[str]]:
    """The names training/__init__.py imports at once, and those under TYPE_CHECKING (imported on first use)."""
    tree = ast.parse((REPO / "training" / "__init__.py").read_text())
    eager, lazy = set(), set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hbpe."):
            eager |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            lazy |= {a.asname or a.name for n in node.body if isinstance(n, ast.ImportFrom) for a in n.names}
    return eager, lazy


def test_every_public_name_is_imported_in_the_source():
    eager, lazy = _imported_names()
    assert not eager & lazy
    assert sorted(eager | lazy) == sorted(hbt.__all__)
    assert len(set(hbt.__all__)) == len(hbt.__all__)


def test_every_public_name_resolves_and_unknown_names_are_refused():
    for name in hbt.__all__:
        assert getattr(hbt, name) is not None, name
    assert hbt.train_model.__module__ == "hbpe.training.train.trainer"  # an alias: trainer.train
    try:
        hbt.no_such_name  # noqa: B018
    except AttributeError as e:
        assert "no attribute 'no_such_name'" in str(e)
    else:
        raise AssertionError("an unknown name resolved")


def test_importing_the_package_loads_neither_torch_nor_composer():
    code = "import sys, hbpe.training; print(sorted(m for m in ('torch', 'composer', 'omegaconf') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO).stdout
    assert out.strip() == "[]"
