"""`hbpe -q`: the libraries' own chatter silenced in one place (logging levels, Python warnings, and the
environment variables that carry both into child processes), errors kept.

Without it, `hbpe -q train` still printed MLflow's INFO lines about system metrics and Composer's
or torch's UserWarnings. Reversible (`quiet_libraries(False)`), so a second command in the same
process (a test runner's) starts from Python's defaults again. Beam has its own (beam/quiet.py).
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

# the loggers of the libraries hbpe runs (set to ERROR with -q); MLflow and others set their own levels
LIBRARY_LOGGERS = (
    "composer", "torch", "streaming", "mlflow", "alembic", "wandb", "urllib3", "botocore", "boto3", "google",
    "fsspec", "filelock", "huggingface_hub", "datasets", "transformers", "lm_eval", "tensorboard", "absl",
    "py.warnings",
)  # fmt: skip
# read by child processes as they start: MLflow configures its loggers on import, Python its warning filters,
# torch's C++ side its log level; HBPE_QUIET makes a launcher rank (training/train/launch.py) call quiet_libraries
QUIET_ENV = {
    "PYTHONWARNINGS": "ignore",
    "MLFLOW_LOGGING_LEVEL": "ERROR",
    "TORCH_CPP_LOG_LEVEL": "ERROR",
    "HBPE_QUIET": "1",
}

_saved: dict[str, Any] = {}  # what quiet_libraries(True) changed, to put back


def quiet_libraries(quiet: bool = True) -> None:
    """quiet: library loggers at ERROR, Python warnings ignored, here and in child processes. False: as before."""
    if quiet and not _saved:
        _saved["levels"] = {name: logging.getLogger(name).level for name in LIBRARY_LOGGERS}
        _saved["env"] = {key: os.environ.get(key) for key in QUIET_ENV}
        _saved["filters"] = list(warnings.filters)
        for name in LIBRARY_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
        os.environ.update(QUIET_ENV)
        warnings.simplefilter("ignore")
    elif not quiet and _saved:
        for name, level in _saved.pop("levels").items():
            logging.getLogger(name).setLevel(level)
        for key, value in _saved.pop("env").items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        warnings.filters[:] = _saved.pop("filters")


def quiet_if_asked() -> None:
    """In a child process (a launcher rank): quiet when the `hbpe -q` that started it was."""
    if os.environ.get("HBPE_QUIET") == "1":
        quiet_libraries()
