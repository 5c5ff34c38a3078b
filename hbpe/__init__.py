"""hbpe: hierarchical BPE tokenization, sharding and training."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("hbpe")  # one source: pyproject.toml
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
