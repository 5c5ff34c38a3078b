"""hbpe's version, from one source (pyproject.toml, read through the installed package's metadata).

Here, below the pipeline, so that it records the version (shard manifests, tokenizer artifacts)
without importing the root package `hbpe` (the application) from below; `hbpe.__version__` reads the
same metadata.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    HBPE_VERSION = version("hbpe")
except PackageNotFoundError:  # a source tree that was never installed
    HBPE_VERSION = "0+unknown"
