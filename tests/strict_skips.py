"""HBPE_STRICT_SKIPS=1 (`make test`, and so .ci/run): a skip the suite does not expect fails the run.

A test that skips where an extra, a tool or the shared data is missing passes in a thinner
environment without testing anything. `make install` sets up all the suite needs, so there a
skip is an error unless its reason is in EXPECTED_SKIPS, with why. The session runs to the
end; then the unexpected skips are listed and the exit status is 1 (registered by conftest.py).
"""

from __future__ import annotations

import os

import pytest

ENV = "HBPE_STRICT_SKIPS"

# reason (as pytest gives it, less "Skipped: ") -> why a machine set up by `make install` may skip it.
# Empty: there nothing skips. Checked on the development machine: the eval and loggers extras
# (lm_eval, mlflow, wandb), transformers and Beam's Dataflow runner import, the shared data folder
# is there, /proc too, `unshare -m` may mount /dev/shm, and no test needs a GPU to run.
EXPECTED_SKIPS: dict[str, str] = {}


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str | None:
    """The reason of a skipped test or test file; None for any other outcome (an xfail included)."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return None
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


class StrictSkips:
    """Collects the skips whose reason is not expected; fails the session at its end if there are any."""

    def __init__(self, expected: dict[str, str]) -> None:
        self.expected = expected
        self.unexpected: list[str] = []

    def _check(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        reason = skip_reason(report)
        if reason is not None and reason not in self.expected:
            self.unexpected.append(f"{report.nodeid or report.fspath}: {reason}")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._check(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._check(report)  # a module-level importorskip skips the whole file here

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.unexpected and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.unexpected:
            terminalreporter.section(f"unexpected skips ({ENV}=1)", red=True)
            for line in self.unexpected:
                terminalreporter.line(line, red=True)
            terminalreporter.line(
                "these fail the run: install what they need (`make install`), or, when the skip is right on every "
                "machine `make test` runs on, add its reason to EXPECTED_SKIPS in tests/strict_skips.py with why"
            )


def register(config: pytest.Config) -> None:
    """Under HBPE_STRICT_SKIPS=1, on the controlling process (xdist's workers send it their reports)."""
    if os.environ.get(ENV) == "1" and not hasattr(config, "workerinput"):
        config.pluginmanager.register(StrictSkips(EXPECTED_SKIPS), "hbpe-strict-skips")
