"""Measures of the source tree that say how costly it is to change (issue 26): run before and after a refactor.

    python infra/dev/house_metrics.py            # from the repository root

Prints: Python files and lines outside tests/, the longest functions, pairs of duplicated blocks (the same
BLOCK consecutive non-blank, non-comment lines in two places, overlapping windows merged), the places that
compare a scheme name (`model.io`) to a string, and the median wall time of `import hbpe` in a fresh
interpreter.
"""

from __future__ import annotations

import ast
import hashlib
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOTS = ("hbpe", "pipeline", "training", "schemas", "infra")
SCHEMES = {"hierarchical", "bpe", "bytes", "space", "entropy"}
BLOCK = 6


def sources(root: Path) -> list[Path]:
    files = []
    for top in ROOTS:
        base = root / top
        if base.is_symlink() or not base.is_dir():
            continue
        files += [p for p in sorted(base.rglob("*.py")) if not any(part.startswith(".") for part in p.parts)]
    return files


def longest_functions(files: list[Path], root: Path, top: int = 8) -> list[tuple[int, str]]:
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((node.end_lineno - node.lineno + 1, f"{path.relative_to(root)}:{node.name}"))
    return sorted(found, reverse=True)[:top]


def duplicate_pairs(files: list[Path]) -> int:
    """Pairs of places sharing a BLOCK-line window; a run of overlapping windows between the same two files counts once."""
    where: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for index, path in enumerate(files):
        lines = [(n, line.strip()) for n, line in enumerate(path.read_text().splitlines())]
        code = [(n, text) for n, text in lines if text and not text.startswith("#") and len(text) > 3]
        for i in range(len(code) - BLOCK + 1):
            digest = hashlib.sha1("\n".join(t for _, t in code[i : i + BLOCK]).encode()).hexdigest()
            where[digest].append((index, i))
    pairs: set[tuple[int, int, int, int]] = set()
    for spots in where.values():
        for a in range(len(spots)):
            for b in range(a + 1, len(spots)):
                (fa, ia), (fb, ib) = spots[a], spots[b]
                if fa == fb and abs(ia - ib) < BLOCK:
                    continue
                pairs.add((fa, fb, ia, ib))
    # merge runs: (fa, fb, ia, ib) continues (fa, fb, ia-1, ib-1)
    return sum(1 for fa, fb, ia, ib in pairs if (fa, fb, ia - 1, ib - 1) not in pairs)


def scheme_comparisons(files: list[Path], root: Path) -> tuple[int, int]:
    count, touched = 0, set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            names = [c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
            if any(name in SCHEMES for name in names):
                count += 1
                touched.add(path)
    return count, len(touched)


def import_time(repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import hbpe"], check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    root = Path.cwd()
    files = sources(root)
    lines = sum(len(p.read_text().splitlines()) for p in files)
    print(f"python files (outside tests/): {len(files)}, {lines} lines")
    print("longest functions:")
    for length, name in longest_functions(files, root):
        print(f"  {length:4d}  {name}")
    print(f"pairs of duplicated {BLOCK}-line blocks: {duplicate_pairs(files)}")
    count, spread = scheme_comparisons(files, root)
    print(f"comparisons of a scheme name to a string: {count} in {spread} files")
    print(f"import hbpe (fresh interpreter, median of 5): {import_time():.3f} s")


if __name__ == "__main__":
    main()
