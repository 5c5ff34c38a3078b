"""hbpe: hierarchical BPE tokenization, sharding and training.

From Python (hbpe/api.py; each function is the one its CLI command calls):

    import hbpe
    tok = hbpe.train_tokenizer("gpt2", max_patch_size=10)
    hbpe.convert(["corpus.jsonl"], "shards", tokenizer=hbpe.save_tokenizer(tok, "tok"), seq_len=128)
    run = hbpe.train("tiny", {"data.train": "shards", "max_duration": "20ba", "save_folder": "run"})
    print(hbpe.evaluate("run", "shards")["bpb"], hbpe.generate("run", "The state of the union")[0])

The names are imported on first use, so `import hbpe` stays light (the CLI starts at once).
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("hbpe")  # one source: pyproject.toml
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "convert",
    "evaluate",
    "generate",
    "load_model",
    "load_tokenizer",
    "save_tokenizer",
    "score_tasks",
    "train",
    "train_config",
    "train_tokenizer",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'hbpe' has no attribute {name!r}")
    value = getattr(import_module("hbpe.api"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
