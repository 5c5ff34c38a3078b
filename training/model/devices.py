"""Which device: `--device` for eval and generation, and `device` for training (Composer's names).

`auto` is CUDA when a GPU is visible, else the CPU, everywhere.
"""

from __future__ import annotations

import re

import torch

from hbpe.schemas.errors import ConfigError

DEVICE_CHOICES = "auto, cpu, cuda, cuda:N"


def resolve_device(name: str | None = "auto") -> torch.device:
    """'auto' (or None) -> cuda when present, else cpu; 'cpu', 'cuda', 'cuda:N' as asked, checked to exist.

    >>> resolve_device("cpu")
    device(type='cpu')
    """
    name = (name or "auto").strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    m = re.fullmatch(r"cuda(?::(\d+))?", name)
    if not m:
        raise ConfigError(f"--device {name!r}: expected one of {DEVICE_CHOICES}; e.g. --device cpu")
    if not torch.cuda.is_available():
        raise ConfigError(
            f"--device {name}: no CUDA device is visible here (torch.cuda.is_available() is False); "
            "use --device cpu, or --device auto to take a GPU only when there is one"
        )
    index = int(m.group(1) or 0)
    if index >= torch.cuda.device_count():
        raise ConfigError(
            f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) are visible (cuda:0.."
            f"cuda:{torch.cuda.device_count() - 1}); pass one of those"
        )
    return torch.device("cuda", index)


def composer_device(name: str) -> str:
    """A training config's `device` as Composer names it: `auto` -> `gpu` when CUDA is visible, else `cpu`.

    >>> composer_device("cpu")
    'cpu'
    """
    if name != "auto":
        return name
    return "gpu" if resolve_device("auto").type == "cuda" else "cpu"
