"""HBPE_STRICT_SKIPS=1 turns a skip it does not expect into a failed run (tests/strict_skips.py; `make test` sets it).

Run on a small suite of its own in a subprocess, registered by a conftest the way tests/conftest.py does it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

CONFTEST = (
    "from tests import strict_skips\n\n\ndef pytest_configure(config):\n{allow}    strict_skips.register(config)\n"
)
SUITE = {
    "test_a.py": (
        "import pytest\n\n\ndef test_runs():\n    pass\n\n\n"
        "@pytest.mark.skipif(True, reason='needs a tool')\ndef test_needs_a_tool():\n    pass\n\n\n"
        "@pytest.mark.xfail(reason='known', strict=True)\ndef test_known_bug():\n    assert False\n"
    ),
    "test_b.py": "import pytest\n\npytest.importorskip('no_such_module_hbpe', reason='the x extra')\n",
}


def _run(folder, strict: str | None, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HBPE_STRICT_SKIPS"}
    env |= {"PYTHONPATH": str(REPO), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # not hypothesis's: 1-4 s to import
    if strict is not None:
        env["HBPE_STRICT_SKIPS"] = strict
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    return subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=120)


def _suite(folder, allowed: tuple[str, ...] = ()):
    allow = "".join(f"    strict_skips.EXPECTED_SKIPS[{r!r}] = 'allowed in this test'\n" for r in allowed)
    for name, text in {**SUITE, "conftest.py": CONFTEST.format(allow=allow)}.items():
        (folder / name).write_text(text)
    return folder


@pytest.fixture
def suite(tmp_path):
    return _suite(tmp_path)


def test_without_the_variable_a_skip_passes(suite):
    r = _run(suite, None)
    assert r.returncode == 0, r.stdout
    assert "2 skipped" in r.stdout and "unexpected skips" not in r.stdout


@pytest.mark.parametrize("workers", [[], ["-p", "xdist", "-n", "2"]])
def test_an_unexpected_skip_fails_the_run_at_its_end(suite, workers):
    r = _run(suite, "1", *workers)
    assert r.returncode == 1, r.stdout
    assert "1 passed, 2 skipped, 1 xfailed" in r.stdout  # the whole suite ran
    lines = r.stdout.splitlines()
    section = lines[next(i for i, ln in enumerate(lines) if "unexpected skips (HBPE_STRICT_SKIPS=1)" in ln) :]
    assert "test_a.py::test_needs_a_tool: needs a tool" in section  # a skipped test
    assert "test_b.py: the x extra" in section  # a skipped file: a module-level importorskip
    assert not any("known" in ln for ln in section)  # an xfail is no skip
    assert any("add its reason to EXPECTED_SKIPS in tests/strict_skips.py" in ln for ln in section)


def test_a_skip_in_the_allow_list_passes(tmp_path):
    r = _run(_suite(tmp_path, ("needs a tool", "the x extra")), "1")
    assert r.returncode == 0, r.stdout
    assert "unexpected skips" not in r.stdout
    r = _run(_suite(tmp_path, ("needs a tool",)), "1")
    assert r.returncode == 1 and "test_b.py: the x extra" in r.stdout and "test_needs_a_tool:" not in r.stdout
