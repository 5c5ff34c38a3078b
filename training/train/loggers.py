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
import os
from collections import defaultdict
from typing import Any

from hbpe.schemas.errors import ConfigError, one_line
from hbpe.schemas.train_config import ARGUMENT_PATHS, CALLBACK_CLASSES, LOGGER_CLASSES

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
        args = _with_defaults("loggers", name, dict(args or {}), log_root=log_root)
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


# where a tracker writes when its path argument is not given and its class has no default of its own: the
# environment variable it reads first, else its folder in the working directory
_LIBRARY_PLACES: dict[str, tuple[str, str]] = {
    "loggers.wandb.init_kwargs.dir": ("WANDB_DIR", "."),  # ./wandb
    "loggers.mlflow.tracking_uri": ("MLFLOW_TRACKING_URI", "mlruns"),  # ./mlruns
}
# MLflow's arguments that may name a server rather than a local store, and the schemes (or names) of servers
SERVER_ARGUMENTS = ("loggers.mlflow.tracking_uri", "loggers.mlflow.model_registry_uri")
SERVER_SCHEMES = ("http", "https", "databricks", "databricks-uc")


def local_outputs(kind: str, block: dict[str, Any], *, log_root: str, run_name: str) -> list[tuple[str, str]]:
    """(key, local path) of every file or folder the `loggers` or `callbacks` (`kind`) of `block` write, as built
    here: a given argument, else hbpe's default, the class's own, or the library's (an environment variable, else
    the working directory). Composer's `{run_name}`-style fields are filled as it fills them (rank 0)."""
    import composer.callbacks
    import composer.loggers

    module, classes = (
        (composer.loggers, LOGGER_CLASSES) if kind == "loggers" else (composer.callbacks, CALLBACK_CLASSES)
    )
    out = []
    for name, args in block.items():
        args = _with_defaults(kind, name, dict(args or {}), log_root=log_root)
        own = inspect.signature(getattr(module, classes[name]).__init__).parameters
        folder = None
        for arg in ARGUMENT_PATHS.get(f"{kind}.{name}", ()):
            key = f"{kind}.{name}.{arg}"
            value = _lookup(args, arg)
            if value is None and arg in own and own[arg].default is not inspect.Parameter.empty:
                value = own[arg].default  # Composer's: {run_name}/torch_traces, in the working directory
            if value is None and key in _LIBRARY_PLACES:
                env, default = _LIBRARY_PLACES[key]
                value = os.environ.get(env, default)
            if value is None:
                continue  # nothing written of its own (mlflow's registry: in its tracking store)
            value = _filled(str(value), run_name)
            if arg == "folder":
                folder = value
            elif arg == "filename" and folder is not None:
                value = os.path.join(folder, value)
            if key in SERVER_ARGUMENTS and value.partition("://")[0].lower() in SERVER_SCHEMES:
                continue  # a tracking server, not a local path
            out.append((key, value.removeprefix("file://")))
    return out


def _with_defaults(kind: str, name: str, args: dict[str, Any], *, log_root: str) -> dict[str, Any]:
    """A block's arguments with hbpe's defaults (TensorBoard beside the run's checkpoints)."""
    if (kind, name) == ("loggers", "tensorboard"):
        args.setdefault("log_dir", f"{log_root}/tensorboard")
    return args


def _lookup(args: dict[str, Any], dotted: str) -> Any:
    """args["init_kwargs"]["dir"] for `init_kwargs.dir`; None where a level is missing."""
    value: Any = args
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _filled(template: str, run_name: str) -> str:
    """Composer's format fields of a folder or file name (`{run_name}/torch_traces`), for rank 0."""
    values: defaultdict[str, Any] = defaultdict(int, run_name=run_name)  # rank, batch, ...: 0
    try:
        return template.format_map(values)
    except (ValueError, LookupError, AttributeError):
        return template  # not a format Composer could fill either: the text as written
