"""hbpe's version, from one source (pyproject.toml, read through the installed package's metadata).

Here rather than in the root package so that the pipeline can record it (shard manifests, tokenizer
artifacts) without importing `hbpe` from below; the root's `hbpe.__version__` is this value.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    HBPE_VERSION = version("hbpe")
except PackageNotFoundError:  # a source tree that was never installed
    HBPE_VERSION = "0+unknown"
