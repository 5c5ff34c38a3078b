"""Every `hbpe` command line the README shows names a real command and real options.

The tour's commands run as written after `make demo` (checked by hand when the README changes: they need the
demo's run folder); this test catches the drift that makes them fail, a renamed command or option, in seconds.
"""

from __future__ import annotations

import re
import shlex

import click

from hbpe.cli import main
from tests.conftest import REPO


def _command_lines(text: str) -> list[str]:
    """The `hbpe ...` lines of the ```bash blocks, without comments, pipes or a leading `echo ... |`."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = line.split(" #", 1)[0].strip()
            if "|" in line:
                line = next((part.strip() for part in line.split("|") if part.strip().startswith("hbpe ")), "")
            if line.startswith("hbpe "):
                lines.append(line)
    return lines


def _resolve(args: list[str]) -> tuple[click.Command, list[str]]:
    """The click command the words name, and the words left for it."""
    cmd: click.Command = main
    ctx = click.Context(main)
    while isinstance(cmd, click.Group) and args and not args[0].startswith("-"):
        sub = cmd.get_command(ctx, args[0])
        assert sub is not None, f"no command {args[0]!r} under {cmd.name!r}"
        cmd, args = sub, args[1:]
    return cmd, args


def test_the_readme_tour_names_real_commands_and_options():
    lines = _command_lines((REPO / "README.md").read_text())
    assert len(lines) >= 8  # the tour: tokenizer, encode, convert, verify, train, eval, generate, export
    for line in lines:
        words = shlex.split(line)[1:]
        words = [w for w in words if w not in ("-q", "-v", "--quiet", "--verbose")]
        cmd, rest = _resolve(words)
        known = {opt for p in cmd.params for opt in (*p.opts, *p.secondary_opts)}
        for word in rest:
            if word.startswith("-"):
                assert word.split("=", 1)[0] in known, f"{line}: {cmd.name} has no option {word}"
