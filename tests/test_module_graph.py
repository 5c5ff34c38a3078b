"""The module graph, checked on the source with `ast`: rooms in data order, no cycles, imports at the top.

- training/'s rooms import only earlier rooms: data -> model -> checkpoint -> train -> inference
  (the package's top-level modules, its public API and bench, may use them all);
- no cycle between hbpe modules, counting imports inside functions too (they hid two);
- the library imports hbpe modules at module level: a function-level import is kept only where
  the module imported pulls in a heavy package (apache_beam, streaming, composer,
  torch.distributed.checkpoint, lm_eval), so that light commands do not pay for it. The CLI
  (hbpe/cli*.py, hbpe/demo.py) imports lazily on purpose: `hbpe --help` starts in a moment.

Each rule has a case showing it can fail.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO

ROOMS = ("data", "model", "checkpoint", "train", "inference")
LIBRARY = ("schemas", "pipeline", "training", "hbpe/experiments")
HEAVY = ("apache_beam", "streaming", "composer", "torch.distributed.checkpoint", "lm_eval")
LAZY_OK = ("hbpe/cli", "hbpe/demo.py")  # path prefixes that may import hbpe modules inside functions


@dataclass(frozen=True)
class Import:
    source: str  # importing module, e.g. hbpe.training.data.schemes
    target: str  # imported hbpe module (or third-party name)
    in_function: bool
    where: str  # path:line


def module_name(path: Path, repo: Path) -> str:
    parts = list(path.relative_to(repo).with_suffix("").parts)
    if parts[0] != "hbpe":
        parts.insert(0, "hbpe")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _files(repo: Path) -> list[Path]:
    roots = [repo / "schemas", repo / "pipeline", repo / "training", repo / "hbpe"]
    return sorted(p for r in roots if r.is_dir() for p in r.rglob("*.py") if not any(x.is_symlink() for x in p.parents))


def imports(repo: Path) -> list[Import]:
    """Every import in the source tree; `from hbpe.x import y` names hbpe.x.y when that is a module."""
    files = _files(repo)
    modules = {module_name(p, repo) for p in files}
    out = []
    for path in files:
        source = module_name(path, repo)
        rel = path.relative_to(repo).as_posix()

        def visit(node: ast.AST, in_function: bool, source: str = source, rel: str = rel) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and getattr(child.test, "id", "") == "TYPE_CHECKING":
                    continue  # annotations only: never executed
                inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                names = []
                if isinstance(child, ast.Import):
                    names = [a.name for a in child.names]
                elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                    names = [
                        f"{child.module}.{a.name}" if f"{child.module}.{a.name}" in modules else child.module
                        for a in child.names
                    ]
                for name in dict.fromkeys(names):
                    out.append(Import(source, name, in_function, f"{rel}:{child.lineno}"))
                visit(child, inner)

        visit(ast.parse(path.read_text(), rel), False)
    return out


def room_of(module: str) -> int | None:
    parts = module.split(".")
    return ROOMS.index(parts[2]) if len(parts) > 3 and parts[1] == "training" and parts[2] in ROOMS else None


def room_violations(found: list[Import]) -> list[str]:
    bad = []
    for i in found:
        here, there = room_of(i.source), room_of(i.target)
        if here is not None and there is not None and there > here:
            bad.append(f"{i.where}: the {ROOMS[here]} room imports {i.target} (a later room)")
        elif here is not None and i.target.startswith("hbpe.") and i.target.split(".")[1] in ("cli", "experiments"):
            bad.append(f"{i.where}: the library imports the application {i.target}")
    return bad


def cycles(found: list[Import]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each as its sorted modules."""
    graph: dict[str, set[str]] = {}
    for i in found:
        if i.target.startswith("hbpe.") and i.target != i.source:
            graph.setdefault(i.source, set()).add(i.target)
            graph.setdefault(i.target, set())
    # a package imports its own submodules when `from hbpe.x import y` names one: not an edge back
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found_sccs: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                found_sccs.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found_sccs


def heavy_modules(found: list[Import]) -> set[str]:
    """hbpe modules that import a heavy package at module level, directly or through other hbpe modules."""
    top = [i for i in found if not i.in_function]
    heavy = {i.source for i in top if any(i.target == h or i.target.startswith(h + ".") for h in HEAVY)}
    while True:
        more = {i.source for i in top if i.target in heavy} - heavy
        if not more:
            return heavy
        heavy |= more


def lazy_violations(found: list[Import]) -> list[str]:
    heavy = heavy_modules(found)
    return [
        f"{i.where}: imports {i.target} inside a function; import it at the top of the module"
        for i in found
        if i.in_function
        and i.target.startswith("hbpe.")
        and i.target not in heavy
        and any(i.where.startswith(p) for p in LIBRARY)
        and not any(i.where.startswith(p) for p in LAZY_OK)
    ]


def test_rooms_import_only_earlier_rooms():
    assert room_violations(imports(REPO)) == []


def test_no_cycles_between_hbpe_modules():
    assert cycles(imports(REPO)) == []


def test_the_library_imports_hbpe_modules_at_the_top():
    assert lazy_violations(imports(REPO)) == []


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_each_rule_can_fail(tmp_path):
    repo = _tree(
        tmp_path,
        {
            "training/data/schemes.py": "from hbpe.training.checkpoint.load import load_model\n",
            "training/checkpoint/load.py": (
                "def f():\n    from hbpe.training.checkpoint.export import x\n"
                "def g():\n    from hbpe.pipeline.beam.enc import y\n"
            ),
            "training/checkpoint/export.py": "from hbpe.training.checkpoint.load import load_model\n",
            "pipeline/beam/enc.py": "import apache_beam\n",
            "hbpe/cli/train.py": "def main():\n    from hbpe.training.checkpoint.load import load_model\n",
        },
    )
    found = imports(repo)
    assert room_violations(found) == [
        "training/data/schemes.py:1: the data room imports hbpe.training.checkpoint.load (a later room)"
    ]
    assert cycles(found) == [["hbpe.training.checkpoint.export", "hbpe.training.checkpoint.load"]]
    # the Beam module may be imported lazily (it imports apache_beam), the CLI may import anything lazily
    assert lazy_violations(found) == [
        "training/checkpoint/load.py:2: imports hbpe.training.checkpoint.export inside a function; "
        "import it at the top of the module"
    ]
