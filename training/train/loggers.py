"""A config's `loggers:` and `callbacks:` blocks -> Composer's loggers and callbacks, by llm-foundry's names.

    loggers:
      tensorboard: {log_dir: runs/tb}      # composer.loggers.TensorboardLogger
      wandb: {project: hbpe}               # WandBLogger (WANDB_MODE=offline writes locally)
      mlflow: {tracking_uri: file:///tmp/mlruns}
    callbacks:
      memory_monitor: {}                   # composer.callbacks.MemoryMonitor

Each block's arguments are checked against the class's own signature before anything is
built, so `loggers.tensorboard.logdir` is one ConfigError naming the arguments it takes, and a
tracker whose package is not installed names the pip extra that brings it.
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any

from hbpe.schemas.errors import ConfigError, one_line
from hbpe.schemas.train_config import CALLBACK_CLASSES, LOGGER_CLASSES

# what every run logs (SpeedMonitor gives MFU with the model's flops_per_batch); a callbacks block may set their arguments
DEFAULT_CALLBACKS: dict[str, dict[str, Any]] = {"speed_monitor": {"window_size": 10}, "lr_monitor": {}}


def _build(key: str, cls: type, args: dict[str, Any]) -> Any:
    """`cls(**args)` after checking the names against its signature; its own refusals become a ConfigError."""
    params = inspect.signature(cls.__init__).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    known = [n for n, p in params.items() if n != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD]
    for name in args:
        if name not in known and not takes_any:
            near = difflib.get_close_matches(str(name), known, n=1)
            hint = f" (did you mean {key}.{near[0]}?)" if near else ""
            raise ConfigError(
                f"{key}.{name} is not an argument of Composer's {cls.__name__}{hint}; it takes: {', '.join(known)}"
            )
    required = [
        n
        for n, p in params.items()
        if n != "self" and p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    missing = [n for n in required if n not in args]
    if missing:
        raise ConfigError(
            f"{key} needs {', '.join(missing)} (Composer's {cls.__name__} has no default for them); "
            f"e.g. {key}.{missing[0]}=VALUE"
        )
    try:
        return cls(**args)
    except ImportError as e:  # Composer's MissingConditionalImportError names the pip extra
        raise ConfigError(f"{key} needs a package that is not installed: {one_line(str(e))} (or drop {key})") from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{key}: Composer's {cls.__name__} refused {args}: {one_line(str(e))}") from None


def build_loggers(block: dict[str, Any], *, log_root: str) -> list[Any]:
    """The experiment trackers of a `loggers:` block (names checked by TrainConfig); TensorBoard defaults
    to `log_root/tensorboard`, beside the run's checkpoints, rather than Composer's ./tensorboard_logs."""
    import composer.loggers

    out = []
    for name, args in block.items():
        args = dict(args or {})
        if name == "tensorboard":
            args.setdefault("log_dir", f"{log_root}/tensorboard")
        out.append(_build(f"loggers.{name}", getattr(composer.loggers, LOGGER_CLASSES[name]), args))
    return out


def build_callbacks(block: dict[str, Any]) -> list[Any]:
    """speed_monitor and lr_monitor (with the block's arguments, if any), then the block's others in order."""
    import composer.callbacks

    merged = {name: dict(args) for name, args in DEFAULT_CALLBACKS.items()}
    for name, args in block.items():
        merged[name] = {**merged.get(name, {}), **(args or {})}
    return [
        _build(f"callbacks.{name}", getattr(composer.callbacks, CALLBACK_CLASSES[name]), args)
        for name, args in merged.items()
    ]
