"""Checks a frozen config dataclass against its annotations: one ConfigError per mistake, naming the key.

A `Section` subclass calls `self._check_fields()` in `__post_init__`: every field is converted to its
annotation (ints are accepted for floats and made floats, lists for tuples, mappings for nested sections;
bools are never ints, floats must be finite) or refused with the key, the value, what was expected and an
example. The annotations drive it, so a new field is checked without new code. Domain rules (ranges,
choices) are the sections' own; `check_range` and `check_choice` word them alike.
Light imports only: the config schemas are read by every process that starts.
"""

from __future__ import annotations

import difflib
import functools
import math
import re
import types
from collections.abc import Mapping
from dataclasses import MISSING, Field, field, fields, is_dataclass
from typing import Any, ClassVar, Self, Union, get_args, get_origin, get_type_hints

from hbpe.schemas.errors import ConfigError

# PyYAML reads `3e-4` (no dot) as a string; a float field takes such text as the number it spells
_FLOAT_TEXT = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?", re.IGNORECASE)


class Mismatch(Exception):
    """A value does not fit a type annotation (turned into a ConfigError that names the key)."""


def convert(value: Any, tp: Any) -> Any:
    """`value` as annotation `tp` (int -> float, list -> tuple, dict -> section), or raise Mismatch."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is not type(None):
                try:
                    return convert(value, a)
                except Mismatch:
                    pass
        raise Mismatch
    if tp is bool or tp is str:
        if isinstance(value, tp):
            return value
        raise Mismatch
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):  # True is an int to Python, not to a config
            return value
        raise Mismatch
    if tp is float:
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not (numeric or (isinstance(value, str) and _FLOAT_TEXT.fullmatch(value.strip()))):
            raise Mismatch
        number = float(value)
        if not math.isfinite(number):  # .inf / nan would poison the optimizer silently
            raise Mismatch
        return number
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:  # tuple[X, ...]: a list of any length
        if not isinstance(value, (list, tuple)):
            raise Mismatch
        return tuple(_convert_item(v, args[0], i) for i, v in enumerate(value))
    if origin is tuple:
        if isinstance(value, (list, tuple)) and len(value) == len(args) and Ellipsis not in args:
            return tuple(convert(v, a) for v, a in zip(value, args))
        raise Mismatch
    if tp is dict or origin is dict:
        if isinstance(value, dict):
            return value
        raise Mismatch
    if isinstance(tp, type) and is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if isinstance(value, dict):
            return tp.from_dict(value)  # type: ignore[attr-defined]  # its own messages name its keys
        raise Mismatch
    raise Mismatch


def _convert_item(value: Any, tp: Any, index: int) -> Any:
    """Item `index` of a list field; a section's own messages then name it `data.streams[1].proportion`."""
    try:
        return convert(value, tp)
    except ConfigError as e:
        section = getattr(tp, "_section", "")
        if not section:
            raise
        raise ConfigError(str(e).replace(f"{section}.", f"{section}[{index}].")) from None


def describe_type(tp: Any) -> str:
    """What annotation `tp` accepts, in words: `a finite number`, `a list of 2 numbers`, `an integer or null`."""
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(describe_type(a) for a in args)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = args[0]
        if isinstance(item, type) and is_dataclass(item):
            return f"a list of sections with keys {', '.join(f.name for f in fields(item))}"
        return f"a list of {describe_type(item)}"
    names = {type(None): "null", bool: "true or false", int: "an integer", float: "a finite number", str: "a string"}
    if tp in names:
        return names[tp]
    if origin is tuple:
        return f"a list of {len(args)} numbers" if set(args) <= {int, float} else f"a list of {len(args)} items"
    if tp is dict or origin is dict:
        return "a mapping"
    if isinstance(tp, type) and is_dataclass(tp):
        return f"a section with keys {', '.join(f.name for f in fields(tp))}"
    return str(tp)


def kind_of(value: Any) -> str:
    """What `value` is, in the words of describe_type: `a string`, `a list of 3`."""
    kinds = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", type(None): "null"}
    if type(value) in kinds:
        return kinds[type(value)]
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}"
    return "a mapping" if isinstance(value, dict) else type(value).__name__


def show(value: Any) -> str:
    """`value` as a message quotes it: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def scalar(value: Any) -> str:
    """A value as it is written on the command line (`key=value`, parsed as YAML)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(scalar(v) for v in value) + "]"
    return str(value)


def example_for(cls: type, f: Field, tp: Any) -> str:
    """A `key=value` that sets field `f` of section `cls`: its example, or its default, or a value of its type."""
    key = cls._key(f.name)  # type: ignore[attr-defined]
    if key in cls._examples:  # type: ignore[attr-defined]
        return cls._examples[key]  # type: ignore[attr-defined]
    if isinstance(tp, type) and is_dataclass(tp):
        first = fields(tp)[0]
        return example_for(tp, first, annotations_of(tp)[first.name])
    default = f.default if f.default is not MISSING else None
    if default is None or default == "":
        inner = [a for a in get_args(tp) if a is not type(None)] or [tp]
        default = {int: 1, float: 0.5, bool: True}.get(inner[0], "TEXT")
    return f"{key}={scalar(default)}"


@functools.cache
def annotations_of(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)  # resolves the string annotations of `from __future__ import annotations`


def fail(key: str, value: Any, expected: str, example: str) -> ConfigError:
    """The error for a value of the wrong kind: `optim.lr: got 'abc' (a string), expected a finite number; e.g. ..."""
    return ConfigError(f"{key}: got {show(value)} ({kind_of(value)}), expected {expected}; e.g. {example}")


def check_choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    """`value` must be one of `choices`; the message lists them."""
    if value not in choices:
        raise ConfigError(f"{key}: got {show(value)}, expected one of {', '.join(choices)}; e.g. {key}={choices[0]}")


def check_range(key: str, ok: bool, value: Any, rule: str, example: str) -> None:
    """Unless `ok`, one ConfigError: `key=value: rule; e.g. example`."""
    if not ok:
        raise ConfigError(f"{key}={scalar(value)}: {rule}; e.g. {example}")


class Section:
    """What the config dataclasses share: built from a mapping, every field checked against its annotation."""

    _section: ClassVar[str] = ""  # prefix of this section's keys in messages: "data" -> "data.train"
    # examples by key (`data.train`) for fields whose default makes none (empty, null, or a whole section)
    _examples: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def _key(cls, name: str) -> str:
        return f"{cls._section}.{name}" if cls._section else name

    @classmethod
    def from_dict(cls, d: Any) -> Self:
        """A mapping (parsed YAML) -> the dataclass; unknown keys and wrong types are one ConfigError each."""
        if not isinstance(d, dict):
            raise ConfigError(f"the config must be a mapping of keys, got {show(d)} ({kind_of(d)})")
        known = [f.name for f in fields(cls)]  # type: ignore[arg-type]
        unknown = [k for k in d if k not in known]
        if unknown:
            where = f" in {cls._section}" if cls._section else ""
            shown = sorted(cls._key(str(k)) for k in unknown)
            near = difflib.get_close_matches(str(unknown[0]), known, n=1)
            hint = f" (did you mean {cls._key(near[0])}?)" if near else ""
            raise ConfigError(f"unknown config keys {shown}{hint}; known{where}: {sorted(known)}")
        return cls(**d)

    def _check_fields(self) -> None:
        """Each field against its annotation; a coerced value (int -> float, list -> tuple) replaces the given one."""
        cls, hints = type(self), annotations_of(type(self))
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            try:
                converted = convert(value, hints[f.name])
            except Mismatch:
                raise fail(
                    cls._key(f.name), value, describe_type(hints[f.name]), example_for(cls, f, hints[f.name])
                ) from None
            if converted is not value:
                object.__setattr__(self, f.name, converted)  # frozen dataclass: set once, while it is being built

    def _example_of(self, name: str) -> str:
        f = next(f for f in fields(self) if f.name == name)  # type: ignore[arg-type]
        return example_for(type(self), f, annotations_of(type(self))[name])


# Path-valued keys. A field made with `path_field` holds a local path or a URI that a run reads ("reads": shards,
# a tokenizer, a checkpoint) or writes ("writes": checkpoints, caches, logs); a relative value is taken in the
# working directory, or in the folder of another key (`under`: log_file in save_folder). What must stay inside a
# folder (an experiment's --out, hbpe/experiments/runner.py) asks `path_values` rather than a list of its own.
PATH = "path"


def path_field(default: Any, *, writes: bool, under: str | None = None) -> Any:
    """A dataclass field that holds a path: `writes` (or reads), relative to key `under` (or the working dir)."""
    return field(default=default, metadata={PATH: "writes" if writes else "reads", "under": under})


def section_in(tp: Any) -> type | None:
    """The section type inside annotation `tp` (`X`, `X | None`, a list `tuple[X, ...]`), else None."""
    args = [a for a in get_args(tp) if a is not type(None)] if get_origin(tp) in (Union, types.UnionType) else [tp]
    for a in args:
        if isinstance(a, type) and is_dataclass(a):
            return a
        inner = get_args(a)
        if get_origin(a) is tuple and len(inner) == 2 and inner[1] is Ellipsis and is_dataclass(inner[0]):
            return inner[0]
    return None


def path_keys(cls: type, prefix: str = "") -> dict[str, Mapping[str, Any]]:
    """Every path-valued key of section `cls` and of the sections inside it -> its metadata.

    A list of sections adds no index: `data.streams.local` stands for every stream's.
    """
    out: dict[str, Mapping[str, Any]] = {}
    for f in fields(cls):
        key = f"{prefix}{f.name}"
        if PATH in f.metadata:
            out[key] = f.metadata
            continue
        inner = section_in(annotations_of(cls)[f.name])
        if inner is not None:
            out.update(path_keys(inner, f"{key}."))
    return out


def path_values(section: Any, prefix: str = "") -> list[tuple[str, str, Mapping[str, Any]]]:
    """(key, value, metadata) of every path-valued key set in a built section (`data.streams[1].local`)."""
    out: list[tuple[str, str, Mapping[str, Any]]] = []
    for f in fields(section):
        key, value = f"{prefix}{f.name}", getattr(section, f.name)
        if PATH in f.metadata:
            if value:
                out.append((key, value, f.metadata))
        elif isinstance(value, tuple) and value and all(is_dataclass(v) for v in value):
            for i, item in enumerate(value):
                out += path_values(item, f"{key}[{i}].")
        elif is_dataclass(value):
            out += path_values(value, f"{key}.")
    return out
