"""Every key of a config with its value, type and one line of help, read from the dataclasses at run time
(`hbpe config show tiny`).

The keys are the dataclasses' fields, walked through their sections (a new or moved field shows
up without an edit here); the help is a field's `metadata["help"]`, else its comment in the
source: the one on its line, else the comment lines right above it.
"""

from __future__ import annotations

import ast
import functools
import inspect
import io
import json
import textwrap
import tokenize
import types
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Union, get_args, get_origin, get_type_hints

# comments that speak to tools, not to readers
_TOOL_COMMENTS = ("type:", "fmt:", "noqa", "pragma")


@dataclass(frozen=True)
class KeyDoc:
    key: str  # dotted, as an override names it: optim.lr, data.streams.0.remote
    value: Any
    type: str
    help: str


def describe(cfg: Any, prefix: str = "") -> list[KeyDoc]:
    """Every leaf key of the config dataclass `cfg`, in field order, sections walked into."""
    out: list[KeyDoc] = []
    hints = get_type_hints(type(cfg))
    helps = field_help(type(cfg))
    for f in fields(cfg):
        key, value = f"{prefix}{f.name}", getattr(cfg, f.name)
        if is_dataclass(value):
            out += describe(value, f"{key}.")
        elif isinstance(value, tuple) and value and all(is_dataclass(v) for v in value):
            for i, item in enumerate(value):  # a list of sections (data.streams): each item's keys
                out += describe(item, f"{key}.{i}.")
        else:
            out.append(KeyDoc(key, value, type_name(hints[f.name]), helps.get(f.name, "")))
    return out


def type_name(tp: Any) -> str:
    """An annotation in a config's words: `int`, `str | null`, `list of float`, `[float, float]`, `mapping`."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is type(None):
        return "null"
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return f"list of {type_name(args[0])}"
    if origin is tuple:
        return f"[{', '.join(type_name(a) for a in args)}]"
    if tp is dict or origin is dict:
        return "mapping"
    if isinstance(tp, type) and is_dataclass(tp):
        return "section"
    return getattr(tp, "__name__", str(tp))


@functools.cache
def field_help(cls: type) -> dict[str, str]:
    """{field: one line of help} for a dataclass: metadata["help"], else its comment in the source."""
    comments = _source_comments(cls)
    return {f.name: f.metadata.get("help") or comments.get(f.name, "") for f in fields(cls)}


def _source_comments(cls: type) -> dict[str, str]:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # no source (a frozen build): the metadata alone
        return {}
    lines = source.splitlines()
    notes: dict[int, tuple[str, bool]] = {}  # line -> (text, alone on its line)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        text = tok.string.lstrip("#").strip()
        if tok.type == tokenize.COMMENT and not text.startswith(_TOOL_COMMENTS):
            notes[tok.start[0]] = (text, not lines[tok.start[0] - 1][: tok.start[1]].strip())
    out = {}
    [node] = ast.parse(source).body
    for stmt in node.body:  # type: ignore[attr-defined]
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        span = range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)
        inline = [notes[r][0] for r in span if r in notes and not notes[r][1]]
        above, r = [], stmt.lineno - 1
        while r in notes and notes[r][1]:
            above.insert(0, notes[r][0])
            r -= 1
        out[stmt.target.id] = " ".join(inline or above)
    return out


def show_value(value: Any) -> str:
    """A value as it would be written in YAML's flow style: null, true, 3e-3, [0.9, 0.95], {a: 1}, text."""
    if isinstance(value, str):
        return value if value else "''"
    return json.dumps(value, default=str).replace('"', "") if not isinstance(value, float) else repr(value)


def render(docs: list[KeyDoc]) -> str:
    """Aligned columns: key, value, type, help."""
    rows = [(d.key, show_value(d.value), d.type, d.help) for d in docs]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    widths[1] = min(widths[1], 32)  # a long path or mapping overflows its column rather than push every help right
    return "\n".join(f"{k:<{widths[0]}}  {v:<{widths[1]}}  {t:<{widths[2]}}  {h}".rstrip() for k, v, t, h in rows)
