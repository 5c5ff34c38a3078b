"""The commands the documentation shows work: every page's, not only the README's (tests/test_readme_commands.py).

Three checks. Every `hbpe` line of a shell block, and every `hbpe ...` code span of the prose (usage lines such as
`hbpe shards inspect|verify|stats --data DIR [--json]` included), names a real command and parses under click's
parser for it. Every command the pages name answers `--help`. And the shell blocks run as written where that is cheap
(the bundled sample, a tokenizer trained in seconds), in a scratch copy of the repository's layout, with their output
checked; each line that does not run matches one reason of NOT_RUN. The site's link rules (docs/site_hooks.py,
which `make docs` runs under `mkdocs build --strict`) are tested here too, without MkDocs.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hbpe.cli import main
from tests.conftest import REPO
from tests.test_readme_commands import check_command, hbpe_words, shell_lines

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
_SPAN = re.compile(r"(?<![`\w])`([^`\n]+)`(?![`\w])")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)

# The shell lines that do not run here, each with why (first match wins); everything else in a shell block runs.
NOT_RUN = [
    (r"^make ", "builds the venv and runs for minutes (CI runs `make test`; `make demo` by hand)"),
    (r"^\. \S*/activate$", "the lines run with the venv's bin/ first on PATH already"),
    (r"\$B\b|^B=|s3://|gs://", "a bucket and its credentials (tests/*/test_object_stores.py runs these on 127.0.0.1)"),
    (r"runs/demo\b", "reads `make demo`'s run folder, which takes minutes to build"),
    (r"^hbpe (train|experiment|demo|eval-tasks)\b", "trains or evaluates models: minutes"),
]

# what the lines that run print, checked beyond their exit status (a check whose line is gone fails the test)
GPT2_S10_SYMBOLS = 470  # the README: "470 symbols for gpt2 at S = 10"
OUTPUT_CHECKS = {
    r"^hbpe tokenizer train --encoding gpt2 ": lambda out, _: re.search(rf"gpt2 S=10 .*V'={GPT2_S10_SYMBOLS} ", out),
    r'^echo "(.*)" \| hbpe tokenizer encode': lambda out, m: _encodes_as_gpt2(out, m.group(1) + "\n"),
    r"^hbpe convert .*--input data/sample/en-sotu-sample": lambda out, _: re.search(r"documents written\s+24\n", out),
    r"^hbpe shards verify --data ": lambda out, _: out.startswith("OK "),
}


def _encodes_as_gpt2(out: str, text: str) -> bool:
    """`hbpe tokenizer encode`'s JSON: tiktoken's gpt2 tokens for the text, one patch of at most S=10 symbols each."""
    import tiktoken

    encoded = json.loads(out)
    tokens = tiktoken.get_encoding("gpt2").encode(text)
    return encoded["tokens"] == tokens and [len(p) <= 10 for p in encoded["patches"]] == [True] * len(tokens)


def _code_spans(text: str) -> list[str]:
    """The prose's `...` spans (code blocks left out), a table's `\\|` read as `|`."""
    return [span.replace("\\|", "|") for span in _SPAN.findall(_FENCE.sub("", text))]


def _usage_forms(span: str) -> list[list[str]]:
    """A `hbpe ...` span as the word lists it stands for ([] when it is no hbpe command): brackets dropped
    (`[--json]` -> `--json`), `a|b` in the command's name expanded (`shards inspect|verify`), an option written
    `-v|--verbose` as both; a value's `full|minimal` stays for the choice check."""
    try:
        words = shlex.split(span)
    except ValueError:  # an unbalanced quote: prose, not a command
        return []
    while words and (words[0] == "time" or re.fullmatch(r"\w+=\S*", words[0])):
        words = words[1:]
    if not words or not (words[0] == "hbpe" or words[0].endswith("/bin/hbpe")):
        return []
    forms: list[list[str]] = [[]]
    for word in (w.strip("[]") for w in words[1:]):
        if "|" in word and word.startswith("-"):
            forms = [[*form, *word.split("|")] for form in forms]
        elif "|" in word and not any(w.startswith("-") for w in forms[0]):
            forms = [[*form, alt] for form in forms for alt in word.split("|") if alt not in ("...", "")]
        elif word:
            forms = [[*form, word] for form in forms]
    return forms


def test_usage_lines_stand_for_their_forms():
    assert _usage_forms("hbpe shards inspect|verify --data DIR [--json]") == [
        ["shards", "inspect", "--data", "DIR", "--json"],
        ["shards", "verify", "--data", "DIR", "--json"],
    ]
    assert _usage_forms("OMP_NUM_THREADS=1 hbpe -v|--verbose export [--format hbpe|hf] ...") == [
        ["-v", "--verbose", "export", "--format", "hbpe|hf", "..."]
    ]
    assert _usage_forms("src/hbpe") == _usage_forms('hbpe "unbalanced') == []


def _page_commands() -> list[tuple[str, list[str]]]:
    """(where, words after `hbpe`) for every command the pages show, in blocks and in the prose."""
    found = []
    for page in PAGES:
        name, text = page.relative_to(REPO).as_posix(), page.read_text(encoding="utf-8")
        found += [(f"{name}: {line}", words) for line in shell_lines(text) if (words := hbpe_words(line)) is not None]
        found += [(f"{name}: `{span}`", form) for span in _code_spans(text) for form in _usage_forms(span)]
    return found


def test_every_command_the_docs_show_is_real():
    commands = _page_commands()
    assert len(commands) > 100  # README.md, commands.md's table, performance.md's, experiments.md's...
    failures = []
    for where, words in commands:
        try:
            check_command(words, where)
        except AssertionError as e:
            failures.append(str(e))
    assert not failures, "commands in the docs that the CLI does not have:\n" + "\n".join(failures)


def test_every_command_the_docs_name_answers_help():
    paths = set()
    for where, words in _page_commands():
        ctx = check_command(words, where)
        if ctx is not None:
            paths.add(ctx.command_path)
    assert {"hbpe", "hbpe convert", "hbpe shards verify", "hbpe bench sweep", "hbpe experiment"} <= paths
    for path in sorted(paths):
        result = CliRunner().invoke(main, [*path.split()[1:], "--help"], prog_name="hbpe")
        assert result.exit_code == 0 and f"Usage: {path} " in result.output, (path, result.output)


def _why_not_run(line: str) -> str | None:
    return next((why for pattern, why in NOT_RUN if re.search(pattern, line)), None)


def _scratch_repo(root: Path) -> Path:
    """A folder laid out as the pages expect (data/ and ../shared/ at hand) where their `runs/...` outputs go."""
    repo = root / "main"
    repo.mkdir(parents=True)
    (repo / "data").symlink_to(REPO / "data")
    if (REPO.parent / "shared").is_dir():
        (root / "shared").symlink_to(REPO.parent / "shared")
    return repo


def _run_line(line: str, cwd: Path) -> str:
    """The shell line run by bash as written, the venv's `hbpe` first on PATH -> its stdout; a failure names it."""
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "error:" not in done.stderr, f"{line}\nexit {done.returncode}\n{done.stderr}"
    return done.stdout


@pytest.mark.parametrize("page", [p for p in PAGES if shell_lines(p.read_text(encoding="utf-8"))], ids=lambda p: p.name)
def test_the_cheap_shell_blocks_run_as_written(page, tmp_path):
    cwd = _scratch_repo(tmp_path)
    for line in shell_lines(page.read_text(encoding="utf-8")):
        if _why_not_run(line) is None:
            out = _run_line(line, cwd)
            for pattern, check in OUTPUT_CHECKS.items():
                if m := re.search(pattern, line):
                    assert check(out, m), f"{page.name}: {line}\nprinted:\n{out}"


def test_every_shell_line_runs_or_says_why_not():
    lines = [line for page in PAGES for line in shell_lines(page.read_text(encoding="utf-8"))]
    run = [line for line in lines if _why_not_run(line) is None]
    assert len(run) >= 4  # the README tour's tokenizer, encode, convert, verify
    stale = [why for pattern, why in NOT_RUN if not any(re.search(pattern, line) for line in lines)]
    assert not stale, f"NOT_RUN reasons no line needs any more: {stale}"
    unchecked = [pattern for pattern in OUTPUT_CHECKS if not any(re.search(pattern, line) for line in run)]
    assert not unchecked, f"OUTPUT_CHECKS for lines no page runs any more: {unchecked}"


def _site_hooks():
    spec = importlib.util.spec_from_file_location("site_hooks", REPO / "docs" / "site_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_site_maps_repository_links_to_its_pages(caplog):
    rewrite = _site_hooks().rewrite_links
    readme = (
        "![plot](docs/experiments/k-along-training/k_along.png) [why](docs/experiments.md#k-along-training) "
        "[infra/README.md](infra/README.md) [the runbooks](infra/README.md) [web](https://example.org/a.md)"
    )
    assert rewrite(readme, "README.md", "docs", REPO) == (
        "![plot](experiments/k-along-training/k_along.png) [why](experiments.md#k-along-training) "
        "`infra/README.md` the runbooks (`infra/README.md`) [web](https://example.org/a.md)"
    )
    page = '[home](../../README.md#help) [python](../python.md "title") [here](#a)\n```\n[code](../x.md)\n```\n'
    assert rewrite(page, "docs/reference/index.md", "docs", REPO) == (
        '[home](../index.md#help) [python](../python.md "title") [here](#a)\n```\n[code](../x.md)\n```\n'
    )
    with caplog.at_level(logging.WARNING):  # a warning: `mkdocs build --strict` fails on it
        assert rewrite("[gone](../infra/gone.md)", "docs/design.md", "docs", REPO) == "[gone](../infra/gone.md)"
    assert "docs/design.md links to ../infra/gone.md, which is not in the repository (infra/gone.md)" in caplog.text
