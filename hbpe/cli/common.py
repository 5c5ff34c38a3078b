"""What every `hbpe` command shares: the group that turns failures into one `error:` line, the output helper
(`emit`), the options several commands take (`tokenizer_option`, `inputs_option`, ...), the global
--verbose/--quiet state, and the check of a local path before the library reads it.

Every command module of this package imports this one and none imports another: hbpe/cli/__init__.py
attaches the commands they define to `main`.

Verbosity lives in two places, both readable without importing the CLI: the level of the `hbpe`
logger (every library module logs under it, so -v shows their INFO and DEBUG lines and -q hides
all but warnings), and the `progress=` arguments the commands pass to the library (progress bars
are explicit library arguments, never a hidden global, so the library behaves the same when
called from Python). Inside a command, `is_quiet()` reads the flag from click's context.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

import click

from hbpe.pipeline.library_chatter import quiet_libraries
from hbpe.schemas.errors import ConfigError, HbpeError, debug_traceback, internal_error_line, os_problem, user_message
from hbpe.schemas.locations import check_location, check_output_prefix, is_uri

log = logging.getLogger("hbpe.cli")

_QUIET, _VERBOSE = "hbpe.quiet", "hbpe.verbose"  # keys in click's ctx.meta, shared by every context of one invocation
# every option shows its default in --help; contexts inherit this from the group's
CONTEXT_SETTINGS = {"show_default": True}


# options renamed when the CLI got one name per concept: no aliases, but the error names the new one
# (click suggests close spellings itself, e.g. --output -> --out; these are too far apart for that)
RENAMED = {"--corpus": "--input", "--train-corpus": "--train-input", "--eval-corpus": "--eval-input"}


class Command(click.Command):
    """A command that logs its resolved parameters at DEBUG (seen with `hbpe -v`), and whose "no such
    option" error names the new name of a renamed option."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as e:
            own = {o for p in self.params for o in p.opts}
            if RENAMED.get(e.option_name) in own:
                e.possibilities = [RENAMED[e.option_name]]
            elif e.option_name == "--config" and any(p.name == "config" for p in self.params):
                e.message = f"No such option '--config': CONFIG is the first argument (`{ctx.command_path} tiny ...`)"
            raise

    def invoke(self, ctx: click.Context) -> Any:
        log.debug("%s %s", ctx.command_path, " ".join(f"{k}={v!r}" for k, v in ctx.params.items()))
        check_locations(ctx)
        return super().invoke(ctx)


class Group(click.Group):
    """Every failure ends in one `error: ...` line, never a bare traceback.

    HbpeError (a user mistake whose message names the fix): exit 2. An OS error on a named
    file (missing, unreadable, a directory where a file goes) is also the user's to fix: exit 2.
    Anything else is a bug: one line, exit 1, and the traceback with HBPE_DEBUG=1.
    Ctrl-C: exit 130, the shell's convention for SIGINT. Click's own usage errors pass through.
    """

    command_class = Command
    group_class = type  # subgroups made with @group.group are Group too

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except HbpeError as e:
            debug_traceback(e)
            click.echo(f"error: {user_message(e)}", err=True)
            sys.exit(2)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise  # usage errors, --help, --version: click prints them itself
        except KeyboardInterrupt:
            click.echo("error: interrupted", err=True)
            sys.exit(130)
        except OSError as e:
            if e.filename is None:  # a socket, a pipe, a full disk: not a path the user gave
                _internal_error(e)
            debug_traceback(e)
            click.echo(f"error: {e.filename}: {os_problem(e)}", err=True)
            sys.exit(2)
        except Exception as e:
            _internal_error(e)


def _internal_error(e: BaseException) -> NoReturn:
    debug_traceback(e)
    click.echo(internal_error_line(e), err=True)
    sys.exit(1)


def emit(obj: Any, as_json: bool, render: Callable[[Any], str], *, ensure_ascii: bool = True) -> None:
    """The one output path of every command with `--json`: indented, sorted JSON, or the human rendering."""
    click.echo(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=ensure_ascii) if as_json else render(obj))


def json_option(what: str = "the result") -> Callable[[Callable], Callable]:
    """`--json`, the same flag with the same wording on every command that reports something."""
    return click.option("--json", "as_json", is_flag=True, help=f"Print {what} as JSON on stdout.")


# --------------------------------------------------------------------------- options several commands take
# one declaration each, so the same flag has the same name, type, default and wording on every command

Decorator = Callable[[Callable], Callable]

TOKENIZER_HELP = "Tokenizer directory from `hbpe tokenizer train`."
DATA_HELP = "Shard directory from `hbpe convert`."
# what `convert --input` takes, read the same way (pipeline/corpus/inputs.py's resolve_inputs)
INPUT_FILES_HELP = (
    "Corpus file, directory, glob (quoted: 'DIR/*.jsonl') or URI (repeatable): jsonl, txt, parquet, "
    "optionally .gz/.zst/.bz2."
)
CHECKPOINT_HELP = (
    "A checkpoint file, a sharded (FSDP2) checkpoint folder, a save folder (its latest-rank0.pt) or an "
    "`hbpe export` directory."
)
DEVICE_HELP = "auto (CUDA when a GPU is visible, else CPU), cpu, cuda or cuda:N."


def options(*decorators: Decorator) -> Decorator:
    """Several options as one decorator, shown in --help in the order given."""

    def apply(f: Callable) -> Callable:
        for decorator in reversed(decorators):  # click lists the last applied first
            f = decorator(f)
        return f

    return apply


def tokenizer_option(f: Callable) -> Callable:
    """`--tokenizer DIR` (required), as the parameter `tokenizer_dir`."""
    return click.option("--tokenizer", "tokenizer_dir", required=True, help=TOKENIZER_HELP)(f)


def inputs_option(help: str = INPUT_FILES_HELP) -> Decorator:
    """`--input` (required, repeatable), as the parameter `inputs`."""
    return click.option("--input", "inputs", multiple=True, required=True, help=help)


def data_option(f: Callable) -> Callable:
    """`--data SHARDS` (required)."""
    return click.option("--data", required=True, help=DATA_HELP)(f)


def checkpoint_option(help: str = CHECKPOINT_HELP) -> Decorator:
    """`--checkpoint PATH` (required)."""
    return click.option("--checkpoint", required=True, help=help)


def device_option(f: Callable) -> Callable:
    """`--device` (default auto)."""
    return click.option("--device", default="auto", help=DEVICE_HELP)(f)


def seq_len_option(f: Callable) -> Callable:
    """`--seq-len N`: patches per sample."""
    return click.option("--seq-len", type=click.IntRange(min=1), default=1024, help="Patches per sample (N).")(f)


def text_field_option(f: Callable) -> Callable:
    """`--text-field`: where a record keeps its text."""
    return click.option("--text-field", default="text", help="Dotted path of the text in each record.")(f)


# a first-stage BPE to learn: `tokenizer train-bpe` trains it, `bench first-stage` times it
first_stage_bpe_options = options(
    click.option(
        "--vocab-size", type=click.IntRange(min=256), required=True, help="Tokens of the first stage to learn."
    ),
    click.option("--pattern", default="cl100k_base", help="Split pattern: a name or a regex."),
    click.option("--min-count", type=click.IntRange(min=1), default=2, help="Stop when no pair occurs this often."),
)


def check_pattern(pattern: str | None) -> None:
    """--pattern: a known name or a regex that compiles, checked before any work starts."""
    import regex

    from hbpe.pipeline.tokenizer.first_stage import NAMED_PATTERNS, resolve_pattern

    if pattern is None:
        return
    try:
        regex.compile(resolve_pattern(pattern))
    except regex.error as e:
        raise HbpeError(
            f"--pattern {pattern!r} is neither a pattern name ({', '.join(sorted(NAMED_PATTERNS))}) "
            f"nor a valid regex ({e}); pass one of the names or fix the regex"
        ) from e


def check_beam_args(ctx: click.Context) -> None:
    """The arguments hbpe does not know are Beam options: one Beam does not know either is an error, whose hint
    uses hbpe's own names (--seq_len 64 -> --seq-len)."""
    if ctx.args:
        from hbpe.pipeline.beam.options import check_pipeline_args

        check_pipeline_args(ctx.args, hbpe_options=[o for p in ctx.command.params for o in p.opts])


# --------------------------------------------------------------------------- --verbose / --quiet


class _EchoHandler(logging.Handler):
    """Log records on click's stderr (resolved per record, so click's test runner captures them too)."""

    def emit(self, record: logging.LogRecord) -> None:
        click.echo(self.format(record), err=True)


_HANDLER = _EchoHandler()
_HANDLER.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))


def set_verbosity(ctx: click.Context, *, verbose: bool, quiet: bool) -> None:
    """Apply `hbpe -v` / `hbpe -q` for this invocation (each one starts from the default again).

    default: the `hbpe` logger as Python leaves it (warnings only); -v: DEBUG and up on stderr;
    -q: hbpe's warnings only, no progress bars, no progress lines, the libraries' errors only.
    """
    if verbose and quiet:
        raise click.UsageError("--verbose and --quiet exclude each other: pass one")
    root = logging.getLogger("hbpe")
    root.removeHandler(_HANDLER)
    root.setLevel(logging.DEBUG if verbose else logging.WARNING if quiet else logging.NOTSET)
    # with -v the records go to our handler only: Beam configures the root logger (basicConfig) when
    # imported, and a propagated record would be printed twice
    root.propagate = not verbose
    if verbose:
        root.addHandler(_HANDLER)
    ctx.meta[_QUIET], ctx.meta[_VERBOSE] = quiet, verbose
    quiet_libraries(quiet)  # -q: MLflow's INFO lines, torch's and Composer's warnings too


def is_quiet() -> bool:
    """Whether `hbpe -q` was given (False for a command run without the group, e.g. in a test)."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.meta.get(_QUIET))


def is_verbose() -> bool:
    """Whether `hbpe -v` was given: the library's INFO lines are then on stderr already."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.meta.get(_VERBOSE))


def say(line: str) -> None:
    """A progress or status line on stderr, unless `hbpe -q`: stdout stays the result alone."""
    if not is_quiet():
        click.echo(line, err=True)


def quiet_console(overrides: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """A training config's overrides; with `hbpe -q`, training's progress line is off too (the last override
    wins)."""
    return (*overrides, "console=false") if is_quiet() else tuple(overrides)


# --------------------------------------------------------------------------- paths


# the options that name a place to read or write: each value is checked for a misspelt URI (gs:/b, S3://b, gcs://b)
LOCATION_FLAGS = ("--out", "--data", "--tokenizer", "--checkpoint", "--input", "--train-input", "--eval-input")


def check_locations(ctx: click.Context) -> None:
    """A misspelt or unsupported URI in any location option is one `error:` line before the command runs."""
    for param in ctx.command.params:
        flag = next((o for o in param.opts if o in LOCATION_FLAGS), None)
        value = ctx.params.get(param.name)
        if flag is None or value is None:
            continue
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, str) and v:  # encode/decode's --input is an open file
                check_location(v, where=f"{flag} {v}")
                if flag == "--out":
                    check_output_prefix(v, where=f"{flag} {v}")


def check_local_paths(flag: str, values: str | Iterable[str]) -> None:
    """A clear `error:` for a local path that does not exist, before the library reads it.

    URIs and globs are left to the library (they may exist only remotely, or match many files).
    """
    for value in [values] if isinstance(values, str) else values:
        if not value:
            raise ConfigError(f"{flag} is empty: pass a path")
        if is_uri(value) or any(c in value for c in "*?["):
            continue
        if not os.path.exists(value):
            raise ConfigError(f"{flag} {value} does not exist; check the path")
