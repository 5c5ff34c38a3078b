"""hbpe: hierarchical BPE tokenization, sharding and training.

From Python (hbpe/api.py; each function is the one its CLI command calls):

    import hbpe
    tok = hbpe.train_tokenizer("gpt2", max_patch_size=10)
    hbpe.convert(["corpus.jsonl"], "shards", tokenizer=hbpe.save_tokenizer(tok, "tok"), seq_len=128)
    run = hbpe.train("tiny", {"data.train": "shards", "max_duration": "20ba", "save_folder": "run"})
    print(hbpe.evaluate("run", "shards").bpb, hbpe.generate("run", "The state of the union")[0])

Reports come back as frozen dataclasses (hbpe/results.py) whose `as_dict()` is the command's `--json`.
The names are imported on first use, and `__version__` read on first use, so `import hbpe` stays light
(the CLI starts at once).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a fifth of this import); checkers read it

__all__ = [
    "convert",
    "evaluate",
    "export",
    "generate",
    "load_model",
    "load_tokenizer",
    "plot",
    "save_tokenizer",
    "score_tasks",
    "train",
    "train_config",
    "train_tokenizer",
]

if TYPE_CHECKING:  # what type checkers and editors see; at run time __getattr__ imports them
    from hbpe.api import (
        convert,
        evaluate,
        export,
        generate,
        load_model,
        load_tokenizer,
        plot,
        save_tokenizer,
        score_tasks,
        train,
        train_config,
        train_tokenizer,
    )

    __version__: str


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hbpe")  # one source: pyproject.toml
    except PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"


def __getattr__(name: str) -> object:
    if name == "__version__":
        value: object = _version()
    elif name in __all__:
        from importlib import import_module

        value = getattr(import_module("hbpe.api"), name)
    else:
        raise AttributeError(f"module 'hbpe' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names only: the API's functions and `__version__` (not this module's own helpers)."""
    return sorted([*__all__, "__version__"])
