"""What every `hbpe` command shares: the group that turns failures into one `error:` line, and the output helper.

A module of its own so that cli.py, cli_data.py and cli_train.py all import it and none imports another:
cli.py attaches the commands the other two define.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import click

from hbpe.schemas.errors import HbpeError, debug_traceback, internal_error_line, one_line, os_problem


class _Group(click.Group):
    """Every failure ends in one `error: ...` line, never a bare traceback.

    HbpeError (a user mistake whose message names the fix): exit 2. An OS error on a named
    file (missing, unreadable, a directory where a file goes) is also the user's to fix: exit 2.
    Anything else is a bug: one line, exit 1, and the traceback with HBPE_DEBUG=1.
    Ctrl-C: exit 130, the shell's convention for SIGINT. Click's own usage errors pass through.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except HbpeError as e:
            debug_traceback(e)
            click.echo(f"error: {one_line(str(e))}", err=True)
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


def _emit(obj: Any, as_json: bool, render: Callable[[Any], str], *, ensure_ascii: bool = True) -> None:
    """The one output path of every command with `--json`: indented, sorted JSON, or the human rendering."""
    click.echo(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=ensure_ascii) if as_json else render(obj))
