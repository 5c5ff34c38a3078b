"""The worked examples in the docstrings run, so they cannot drift from the code.

Every module of the package whose source holds a `>>>` is collected (a new example is run without
being listed here), and each must have at least one example that doctest finds.
"""

from __future__ import annotations

import doctest
import importlib
import os

import numpy as np
import pytest

from tests.conftest import REPO


def _modules_with_examples() -> list[str]:
    """hbpe.* modules whose source has `>>>`: walked from hbpe/, through its links to pipeline/, training/, schemas/."""
    found = []
    for folder, dirs, files in os.walk(REPO / "hbpe", followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
        package = os.path.relpath(folder, REPO).replace(os.sep, ".")
        for name in sorted(f for f in files if f.endswith(".py")):
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                if ">>>" in f.read():
                    found.append(package if name == "__init__.py" else f"{package}.{name.removesuffix('.py')}")
    return found


MODULES = _modules_with_examples()


def test_the_walk_finds_the_examples():
    # a few known ones, from each folder, so a walk that stops following the links is noticed
    assert {"hbpe.api", "hbpe.training", "hbpe.schemas.names", "hbpe.pipeline.storage"} <= set(MODULES)
    assert {"hbpe.training.model.hash_ngrams", "hbpe.experiments.compute", "hbpe.pipeline.beam.options"} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples(module, gpt2_tokenizer):
    mod = importlib.import_module(module)
    result = doctest.testmod(mod, extraglobs={"tok": gpt2_tokenizer, "np": np}, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted > 0, f"{module} has no worked example"
