"""Every `hbpe` command line the README shows names a real command and real options.

The tour's commands run as written after `make demo` (checked by hand when the README changes: they need the
demo's run folder); this test catches the drift that makes them fail, a renamed command or option, in seconds.
The helpers below are shared with tests/test_docs_commands.py, which holds every docs/ page to the same check and
runs the blocks that are cheap.
"""

from __future__ import annotations

import re
import shlex

import click

from hbpe.cli import main
from tests.conftest import REPO

SHELL_FENCES = ("bash", "sh", "shell", "console")
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
_PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*(\.\.\.)?")  # COMMAND, RUN, N: a word the reader replaces
_ELIDED = ("...", "…")
# Beam's pipeline options that `hbpe convert` passes on (ignore_unknown_options) and whose names have no underscore;
# the rest are recognised by it (--temp_location): hbpe's own options are spelt with hyphens
_BEAM_WORDS = {"--project", "--region", "--zone", "--network", "--subnetwork", "--labels", "--streaming"}


def shell_lines(text: str) -> list[str]:
    """The command lines of a page's shell blocks (```bash, sh, shell, console), `\\` continuations joined; in a
    console block only the `$ ` lines, without the prompt (the others are output)."""
    lines = []
    for lang, block in _FENCE.findall(text):
        if lang not in SHELL_FENCES:
            continue
        pending = ""
        for raw in block.splitlines():
            if lang == "console" and not pending:
                if not raw.startswith("$ "):
                    continue
                raw = raw[2:]
            line = pending + raw.strip()
            pending = line[:-1] + " " if line.endswith("\\") else ""
            if not pending and line and not line.startswith("#"):
                lines.append(line)
    return lines


def hbpe_words(line: str) -> list[str] | None:
    """The words after `hbpe` in a shell line: through pipes (`echo x | hbpe ...`), `time` and `VAR=value` prefixes
    and `.venv/bin/hbpe`, comments dropped; None when the line runs no hbpe."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words, segment = list(lexer), []
    for word in [*words, ";"]:
        if word not in ("|", "||", "&&", ";", "&"):
            segment.append(word)
            continue
        while segment and (segment[0] == "time" or re.fullmatch(r"\w+=\S*", segment[0])):
            segment = segment[1:]
        if segment and (segment[0] == "hbpe" or segment[0].endswith("/bin/hbpe")):
            return segment[1:]
        segment = []
    return None


def _context(cmd: click.Command, name: str, parent: click.Context | None) -> click.Context:
    return click.Context(cmd, info_name=name, parent=parent, **cmd.context_settings)


def _parse(cmd: click.Command, ctx: click.Context, words: list[str], where: str) -> tuple[dict, list[str]]:
    """click's own parser over `words`: an unknown option or an option without its value fails."""
    try:
        opts, rest, _ = cmd.make_parser(ctx).parse_args(list(words))
    except click.UsageError as e:
        raise AssertionError(f"{where}: {ctx.command_path}: {e.format_message()}") from None
    return opts, rest


def _resolve(words: list[str], where: str) -> tuple[click.Command | None, click.Context, list[str]]:
    """The click command the words name (None: a placeholder such as COMMAND), its context, the words left for it.
    A group's own options (`hbpe -q ...`) are parsed on the way."""
    cmd: click.Command = main
    ctx = _context(main, "hbpe", None)
    while isinstance(cmd, click.Group):
        _, words = _parse(cmd, ctx, words, where)  # a group stops at its first positional word: the command
        if not words:
            return cmd, ctx, []
        if _PLACEHOLDER.fullmatch(words[0]):
            return None, ctx, words
        sub = cmd.get_command(ctx, words[0])
        assert sub is not None, f"{where}: no command {words[0]!r} under {ctx.command_path!r}"
        cmd, ctx, words = sub, _context(sub, words[0], ctx), words[1:]
    return cmd, ctx, words


def _check_choices(param: click.Parameter, given: str | list[str], where: str) -> None:
    """Each value given to a choice (each alternative of `a|b`) is one of its choices; placeholders pass."""
    written = given if isinstance(given, list) else [given]
    for value in (alt for each in written for alt in each.split("|")):
        if value not in _ELIDED and not _PLACEHOLDER.fullmatch(value):
            assert value in param.type.choices, f"{where} {param.opts[0]} takes {param.type.choices}, not {value!r}"


def check_command(words: list[str], where: str) -> click.Context | None:
    """`words` (after `hbpe`) name a command and parse under click's parser for it: each option is one it has, with
    its value, a value of a choice is one of the choices (each of `a|b`), and positional words fit its arguments.
    Placeholders (DIR, N) pass as values. Returns the command's context (None for `hbpe COMMAND ...`)."""
    words = [w for w in words if w not in _ELIDED]
    cmd, ctx, rest = _resolve(words, where)
    if cmd is None or isinstance(cmd, click.Group):
        return None if cmd is None else ctx
    opts, extra = _parse(cmd, ctx, rest, where)
    for param in cmd.params:
        if isinstance(param.type, click.Choice) and param.name in opts:
            _check_choices(param, opts[param.name], f"{where}: {cmd.name}")
    unknown = [w for w in extra if w.startswith("-")]  # left over only where the command passes options on
    for word in unknown:
        name = word.split("=", 1)[0]
        assert "_" in name or name in _BEAM_WORDS, f"{where}: {cmd.name} has no option {word}"
    positional = [w for w in extra if not w.startswith("-")]
    assert ctx.allow_extra_args or not positional, f"{where}: {cmd.name} takes no argument {positional}"
    return ctx


def test_the_readme_tour_names_real_commands_and_options():
    lines = [line for line in shell_lines((REPO / "README.md").read_text()) if hbpe_words(line) is not None]
    assert len(lines) >= 8  # the tour: tokenizer, encode, convert, verify, train, eval, generate, export
    for line in lines:
        check_command(hbpe_words(line), f"README.md: {line}")


def test_the_check_catches_drift():
    # the ways a shown command goes stale, each caught with the line in the message
    for words, error in [
        (["tokenizer", "trian", "--out", "x"], "no command 'trian'"),
        (["convert", "--tokenizer", "t", "--output", "o"], "has no option --output"),
        (["export", "--checkpoint", "c", "--format", "onnx"], "takes .*'hf'.*not 'onnx'"),
        (["shards", "verify", "--data"], "--data.*requires an argument"),
        (["-x", "shards", "verify"], "hbpe: No such option '-x'"),
        (["eval", "--checkpoint", "c", "extra"], "takes no argument"),
    ]:
        try:
            check_command(words, "page: line")
        except AssertionError as e:
            assert re.search(error, str(e)) and str(e).startswith("page: line"), (words, str(e))
        else:
            raise AssertionError(f"{words} passed")
    # and what is right passes: group options, placeholders, choices written as alternatives, Beam's options
    for words in (
        ["-q", "convert", "--tokenizer", "DIR", "--input", "F", "--out", "s3://b/x", "--tail", "drop|pad"],
        ["convert", "--tokenizer", "t", "--input", "i", "--out", "o", "--temp_location", "gs://b/tmp"],
        ["COMMAND", "--help"],
        ["--version"],
    ):
        check_command(words, "page: line")


def test_shell_lines_and_hbpe_words():
    page = "\n".join(
        [
            "```bash",
            "make demo   # sets up .venv",
            'echo "a | b" | OMP_NUM_THREADS=1 time .venv/bin/hbpe tokenizer encode --tokenizer t  # comment',
            "hbpe convert --tokenizer t \\",
            "  --out o",
            "```",
            "```console",
            "$ hbpe shards verify --data d",
            "OK d: hashes check out",
            "```",
            "```python",
            "hbpe.train('tiny')",
            "```",
        ]
    )
    lines = shell_lines(page)
    assert [hbpe_words(line) for line in lines] == [
        None,
        ["tokenizer", "encode", "--tokenizer", "t"],
        ["convert", "--tokenizer", "t", "--out", "o"],
        ["shards", "verify", "--data", "d"],
    ]
