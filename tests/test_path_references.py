"""Every repository path a comment, a docstring or a Markdown page names exists.

A module that moves into a subfolder leaves its old path in the comments that point readers to it;
this finds them. Paths are recognised by their first folder
(training/, pipeline/, schemas/, hbpe/, infra/, tests/, docs/); in Python files only comments and
docstrings are read, so a test's fixture paths (strings it writes into a temporary tree) are not.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from pathlib import Path

from tests.conftest import REPO

ROOTS = ("training", "pipeline", "schemas", "hbpe", "infra", "tests", "docs")
# a path: a root, then folders and a name; `*` and `{}` make a pattern (hbpe/cli*.py), which is not checked
_PATH = re.compile(r"(?<![\w./*-])((?:" + "|".join(ROOTS) + r")/[\w./*{}-]*[\w*}])")
# a part in capitals stands for any name (training/schemes/NAME.py), unless it is one of these files
_PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*")
_CAPITALISED_FILES = ("README", "LICENSE", "CHANGELOG", "SPEC", "STYLE")
GENERATED = ("docs/api",)  # folders a make target writes (`make api-docs`), not kept in the repository


def _python_prose(source: str) -> list[tuple[int, str]]:
    """The comments and docstrings of a module, each with its first line number."""
    out = [
        (t.start[0], t.string)
        for t in tokenize.generate_tokens(io.StringIO(source).readline)
        if t.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                out.append((first.lineno, first.value.value))
    return out


def _exists(repo: Path, path: str) -> bool:
    """`path`, or a module named with an attribute (schemas/locations.SUPPORTED_SCHEMES), or a stem (.../_merge_core).

    A generated folder, or a path with a placeholder part, counts as there."""
    path = path.rstrip(".")
    if (repo / path).exists() or path.startswith(GENERATED):
        return True
    stems = [part.split(".")[0] for part in path.split("/")]
    if any(_PLACEHOLDER.fullmatch(s) and s not in _CAPITALISED_FILES for s in stems):
        return True
    module = path.rsplit(".", 1)[0]
    return (repo / f"{module}.py").exists() or any((repo / path).parent.glob(Path(path).name + ".*"))


def _files(repo: Path) -> list[Path]:
    """The .py and .md files under the roots and the repository's own .md pages, links not followed (hbpe/training)."""
    found = sorted(repo.glob("*.md"))
    for root in ROOTS:
        for folder, dirs, files in os.walk(repo / root):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
            found += [Path(folder, f) for f in sorted(files) if f.endswith((".py", ".md"))]
    return found


def stale_paths(repo: Path) -> list[str]:
    """`file:line: path` for each named path that is not in the repository."""
    bad = []
    for file in _files(repo):
        text = file.read_text(encoding="utf-8")
        if not _PATH.search(text):
            continue  # most files name no path: not worth tokenizing
        chunks = _python_prose(text) if file.suffix == ".py" else [(1, text)]
        rel = file.relative_to(repo).as_posix()
        for start, chunk in sorted(chunks):
            for offset, line in enumerate(chunk.splitlines()):
                for m in _PATH.finditer(line):
                    if not any(c in m.group(1) for c in "*{}") and not _exists(repo, m.group(1)):
                        bad.append(f"{rel}:{start + offset}: {m.group(1).rstrip('.')}")
    return bad


def test_every_path_named_in_comments_and_docs_exists():
    assert stale_paths(REPO) == []


def test_the_check_can_fail(tmp_path):
    (tmp_path / "training" / "model").mkdir(parents=True)
    (tmp_path / "training" / "model" / "layers.py").write_text(
        '"""Blocks (see training/model/layers.py, and training/layers.py)."""\n'
        "# the sampler: training/sampling.py\n"
        'FIXTURE = "training/absent.py"  # a string in code is not prose\n'
    )
    (tmp_path / "README.md").write_text(
        "Run `infra/dev/missing.py`; commands in hbpe/cli*.py, a scheme in training/schemes/NAME.py, the "
        "API reference in docs/api; see infra/README.md.\n"
    )
    assert stale_paths(tmp_path) == [
        "README.md:1: infra/dev/missing.py",
        "README.md:1: infra/README.md",
        "training/model/layers.py:1: training/layers.py",
        "training/model/layers.py:2: training/sampling.py",
    ]
