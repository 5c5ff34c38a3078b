"""The names `model.io` may take: the built-in schemes, and any registered since.

A config is checked without torch and schemas/ imports nothing of training/, so the scheme registry
(training/schemes/registry.py) tells this module each name it registers (`add_scheme_name`). Each
built-in scheme is the module of its name, training/schemes/NAME.py, which the registry loads on
its first lookup.
"""

from __future__ import annotations

# the paper's model and its baselines, all trained from the same shards
BUILTIN_SCHEMES = ("hierarchical", "bpe", "bytes", "space", "entropy")
_names = dict.fromkeys(BUILTIN_SCHEMES)


def scheme_names() -> tuple[str, ...]:
    """Every name `model.io` may take, the built-in ones first.

    >>> scheme_names()[:2]
    ('hierarchical', 'bpe')
    """
    return tuple(_names)


def add_scheme_name(name: str) -> None:
    """Let configs name a scheme registered outside hbpe (training/schemes/registry.py's register_scheme)."""
    _names[name] = None
