"""YAML configs with dotted `key=value` overrides -> a validated TrainConfig."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from schemas.errors import ConfigError
from schemas.train_config import TrainConfig

CONFIG_DIR = Path(__file__).resolve().parent / "configs"


def resolve_config_path(path: str) -> Path:
    """A file path, or the name of a shipped config (`tiny`, `small`, `medium`)."""
    p = Path(path)
    if p.is_file():
        return p
    shipped = CONFIG_DIR / f"{path.removesuffix('.yaml')}.yaml"
    if shipped.is_file():
        return shipped
    names = ", ".join(sorted(q.stem for q in CONFIG_DIR.glob("*.yaml")))
    raise ConfigError(f"config {path} not found; pass a YAML file or one of the shipped configs: {names}")


def apply_overrides(d: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`data.train=runs/x` `optim.lr=3e-4` -> nested updates; values parse as YAML scalars."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value (e.g. optim.lr=3e-4)")
        key, raw = item.split("=", 1)
        cur = d
        parts = key.split(".")
        for p in parts[:-1]:
            cur = cur.setdefault(p, {})
            if not isinstance(cur, dict):
                raise ConfigError(f"override {key}: {p} is not a section")
        cur[parts[-1]] = yaml.safe_load(raw)
    return d


def load_config(path: str, overrides: list[str] | None = None) -> TrainConfig:
    p = resolve_config_path(path)
    try:
        d = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: invalid YAML ({e})") from e
    return TrainConfig.from_dict(apply_overrides(d, list(overrides or [])))
