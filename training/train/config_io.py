"""YAML configs with dotted `key=value` overrides -> a validated TrainConfig, as llm-foundry does it.

OmegaConf merges the YAML and the overrides and resolves interpolations (`${run_name}`,
`${oc.env:HOME}`, `???` for a value that must be given); the plain result is then validated
by the typed dataclasses of schemas/train_config.py, so a wrong type, an unknown key or an
interpolation that does not resolve is one ConfigError line naming the key.

A config may start from others: `base: tiny` or `base: [../common.yaml, gpu.yaml]` (shipped names, or
paths relative to the file that names them), merged in order, each section deeply, the file's own keys
last (later wins; a list is replaced whole). A config can come from anyone, so a base must stay inside
the folder of the config named on the command line or the shipped configs (never `/etc/...`, a URI or
`../../` out of it), and bases may not loop or nest deeper than MAX_BASE_DEPTH.

`load_config` is the entry every caller uses (the CLI, the demo, Composer's launcher ranks):
after the types it checks what only this machine can tell, that the local paths exist and
the device is there, so `hbpe train tiny` run before `make demo` or from another directory
says which path is missing and how to set it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import GrammarParseError, MissingMandatoryValue, OmegaConfBaseException

from hbpe.pipeline import storage
from hbpe.schemas.config_check import path_values
from hbpe.schemas.errors import ConfigError, one_line
from hbpe.schemas.locations import is_uri
from hbpe.schemas.train_config import TrainConfig
from hbpe.training.data.streams import local_root
from hbpe.training.train.loggers import local_outputs

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"  # training/configs
MAX_CONFIG_BYTES = 1 << 20  # the shipped configs are under 4 KB
# values once every alias is expanded, as OmegaConf copies them: an anchor "bomb" of 7 levels of 9 aliases
# holds 4.8M and took minutes and gigabytes (the shipped configs: about 100)
MAX_YAML_NODES = 100_000
MAX_BASE_DEPTH = 8  # base: chains (a base of a base ...); the shipped configs use none
MAX_BASE_FILES = 64  # files one config may read through its bases, diamonds counted each time


def resolve_config_path(path: str) -> Path:
    """A file path, or the name of a shipped config (`tiny`, `small`, `medium`)."""
    p = Path(path)
    if p.is_file():
        return p
    shipped = CONFIG_DIR / f"{path.removesuffix('.yaml')}.yaml"
    if path and shipped.is_file():
        return shipped
    names = ", ".join(sorted(q.stem for q in CONFIG_DIR.glob("*.yaml")))
    what = not_a_file(p) if path else "not found"
    raise ConfigError(f"config {path!r} {what}; pass a YAML file or one of the shipped configs: {names}")


def not_a_file(p: Path) -> str:
    """Why `p` is no config file: `not found`, `is a directory`, or `is not a regular file (a FIFO)`.

    Asked of the file's mode (symlinks followed), never by opening it: a FIFO's open waits for a writer.
    """
    try:
        mode = p.stat().st_mode
    except OSError:
        return "not found"
    if stat.S_ISDIR(mode):
        return "is a directory"
    if stat.S_ISREG(mode):
        return "is a file"  # not a reason: asked only of what is no config file
    kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
    return f"is not a regular file ({kind})"


_INTERPOLATION_HINT = (
    "an interpolation names a key from the top (e.g. ${run_name}, ${data.train}) or an environment variable "
    "(${oc.env:NAME}); write \\${ for a literal ${"
)


def _omega_problem(e: OmegaConfBaseException) -> str:
    """OmegaConf's message without its `full_key: ... object_type=...` trailer lines."""
    return one_line(str(e).split("\n    full_key:", 1)[0])


_ALIAS_FIX = "write the values out, or use ${...} interpolation for a value used in several places"


def load_yaml(text: str, source: str, *, fix: str = "write the values out") -> Any:
    """yaml.safe_load, refusing a document that expands to more than MAX_YAML_NODES values or refers to itself.

    PyYAML builds an alias as a second reference to one object (cheap), but everything after it copies
    (OmegaConf, dataclasses, JSON): the bound is on the expanded size, counted on the composed node graph.
    """
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        n = _expanded_size(node, source)
        if n > MAX_YAML_NODES:
            raise ConfigError(f"{source}: its YAML aliases (*name) expand to over {MAX_YAML_NODES:,} values; {fix}")
        return loader.construct_document(node)
    except RecursionError:
        raise ConfigError(f"{source}: YAML nested too deeply; a config is a few levels of sections") from None
    finally:
        loader.dispose()


def _expanded_size(root: yaml.Node, source: str) -> int:
    """Values in the document once every alias is copied (memoized on the shared nodes; ConfigError on a cycle)."""
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        kids = _children(node)
        if children_done:
            on_path.discard(key)
            size[key] = min(1 + sum(size[id(k)] for k in kids), MAX_YAML_NODES + 1)
            continue
        if key in size:
            continue
        if key in on_path:
            raise ConfigError(
                f"{source}: a YAML alias (*name) inside the value it names (a loop); write the values out"
            )
        on_path.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in kids if id(k) not in size)
    return size[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _parse_value(raw: str, item: str) -> Any:
    try:
        return load_yaml(raw, f"override {item!r}", fix=_ALIAS_FIX)
    except yaml.YAMLError:
        # text that is not a YAML scalar (`[0.9`, `a: b: c`) stays the text: the type check then says what fits
        return raw


def apply_overrides(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """`data.train=runs/x` `optim.lr=3e-4` onto the config (OmegaConf's dotlist); values parse as YAML.

    `key=VALUE` sets the whole value, a mapping or list included (`fsdp={version: 2}` replaces the fsdp block);
    dotted keys reach into sections and lists (`data.streams.1.proportion=0.3`).
    """
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value (e.g. optim.lr=3e-4)")
        key, raw = item.split("=", 1)
        parts = key.split(".")
        if not all(parts):
            raise ConfigError(f"override {item!r} has an empty key part; write dotted keys like optim.lr=3e-4")
        for i in range(1, len(parts)):  # OmegaConf would silently turn a value into a section
            section = ".".join(parts[:i])
            cur = OmegaConf.select(cfg, section, default=None, throw_on_resolution_failure=False)
            if cur is not None and not isinstance(cur, (DictConfig, ListConfig)):
                raise ConfigError(f"override {key}: {section} is {cur!r}, not a section; set {section}.KEY=VALUE only")
        try:
            OmegaConf.update(cfg, key, _parse_value(raw, item), merge=False)
        except GrammarParseError as e:  # OmegaConf parses an interpolation as it is set
            raise ConfigError(f"override {item!r}: {_omega_problem(e)}; {_INTERPOLATION_HINT}") from None
        except OmegaConfBaseException as e:
            raise ConfigError(f"override {item!r}: {_omega_problem(e)}") from None
    return cfg


def resolve(cfg: DictConfig) -> dict[str, Any]:
    """Every `${...}` interpolation resolved and every `???` filled, as a plain dict for the dataclasses."""
    try:
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)  # type: ignore[return-value]
    except MissingMandatoryValue as e:
        raise ConfigError(f"{e.full_key} is ??? (a value the config leaves to you); set {e.full_key}=VALUE") from None
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "the config"
        raise ConfigError(f"{key}: {_omega_problem(e)}; {_INTERPOLATION_HINT}") from None


def check_local(cfg: TrainConfig) -> None:
    """What only this machine can tell: local paths exist, the device and precision are available.

    Remote URIs (`gs://`, `s3://`) are left to their readers (streaming, Composer).
    """
    hints = {
        "data.train": ("a directory", "DIR", "a shard directory from `hbpe convert`"),
        "data.eval": ("a directory", "DIR", "held-out shards from `hbpe convert`, or data.eval=null for no eval"),
        "data.tokenizer": (
            "a directory",
            "DIR",
            "a `hbpe tokenizer train` output, or data.tokenizer=null for the shards' own tokenizer",
        ),
        "load_path": ("a file", "FILE", "a checkpoint .pt of `hbpe train`, or load_path=null"),
    }
    values = {"data.train": cfg.data.train, "data.eval": cfg.data.eval, "data.tokenizer": cfg.data.tokenizer}
    values["load_path"] = cfg.load_path
    for i, stream in enumerate(cfg.data.streams or ()):
        values[f"data.streams[{i}].remote"] = stream.remote
    for key, value in values.items():
        if not value or storage.is_remote(value):
            continue
        kind, placeholder, fix = hints.get(key, hints["data.train"])
        p = Path(value)
        where = "" if p.is_absolute() else f" (relative to the current directory {Path.cwd()})"
        if not p.exists():
            demo = " (`make demo` in the repo root writes runs/demo/)" if value.startswith("runs/demo/") else ""
            raise ConfigError(f"{key} path {value} does not exist{where}; set {key}={placeholder} to {fix}{demo}")
        if (kind == "a directory") != p.is_dir():
            raise ConfigError(f"{key} path {value} is not {kind}{where}; set {key}={placeholder} to {fix}")
    _check_device(cfg)


def local_places(cfg: TrainConfig) -> list[tuple[str, str, Path | None]]:
    """(key, value, resolved path) of every path `cfg` reads or writes; None for a URI (a bucket).

    Its path-valued keys (the schema marks them: path_field) and the files of its loggers and callbacks as
    they are built (training/train/loggers.py: local_outputs), a relative one taken where the run takes it
    (the working directory, or the save folder for log_file), symlinks followed: what a folder that must hold a
    run's files (an experiment's --out) checks.
    """
    bases = {"save_folder": local_root(cfg)}  # the keys a relative value may be under (path_field's `under`)
    found = [(key, value, bases[m["under"]] if m["under"] else "") for key, value, m in path_values(cfg)]
    for kind in ("loggers", "callbacks"):
        outputs = local_outputs(kind, getattr(cfg, kind), log_root=bases["save_folder"], run_name=cfg.run_name)
        found += [(key, value, "") for key, value in outputs]
    return [(key, value, None if is_uri(value) else Path(base, value).resolve()) for key, value, base in found]


def _check_device(cfg: TrainConfig) -> None:
    """device=gpu on a machine without CUDA, or a GPU precision where training will run on CPU."""
    if cfg.device == "cpu" or (cfg.device == "auto" and cfg.precision in ("auto", "fp32")):
        return  # nothing to ask torch (and no torch import for the common case)
    import torch

    if cfg.device == "gpu" and not torch.cuda.is_available():
        raise ConfigError("device=gpu but torch sees no CUDA GPU here; use device=auto (or cpu)")
    if cfg.device == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("device=mps but torch sees no Apple MPS device here; use device=auto (or cpu)")
    on_cpu = cfg.device == "auto" and not torch.cuda.is_available()
    if on_cpu and cfg.precision not in ("auto", "fp32"):
        raise ConfigError(
            f"precision={cfg.precision} needs a GPU and this machine has none (training runs on CPU in fp32); "
            "use precision=auto (or fp32)"
        )


def read_config_file(p: Path) -> dict[str, Any]:
    """One YAML file's top-level mapping (bounded in size and aliases), or one ConfigError naming the file."""
    try:
        # without blocking, and refused unless a regular file: a FIFO named here after the checks above (a race)
        # would otherwise wait for a writer, and /dev/zero fill the size limit with zeros
        with os.fdopen(os.open(p, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ConfigError(f"{p} {not_a_file(p)}; pass a YAML config file")
            data = f.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{p}: over {MAX_CONFIG_BYTES >> 20} MB, not a training config; pass a YAML config file")
        d = load_yaml(data.decode("utf-8"), str(p), fix=_ALIAS_FIX)
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: invalid YAML ({one_line(str(e))}); fix the file or pass a shipped config") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not UTF-8 text (byte {e.start}); pass a YAML config file") from e
    if d is None:
        d = {}
    if not isinstance(d, dict):
        raise ConfigError(
            f"{p}: the top level is {type(d).__name__}, not a mapping of config keys; write it like `max_duration: 100ba`"
        )
    return d


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """`top` over `base`: sections (mappings) merge key by key, any other value (a list included) is replaced."""
    out = dict(base)
    for key, value in top.items():
        below = out.get(key)
        out[key] = deep_merge(below, value) if isinstance(below, dict) and isinstance(value, dict) else value
    return out


def _base_names(d: dict[str, Any], p: Path) -> list[str]:
    names = d.pop("base", None)
    names = [] if names is None else [names] if isinstance(names, str) else names
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(f"{p}: base is {names!r}; write one config (base: tiny, base: common.yaml) or a list of them")
    return names


def _resolve_base(name: str, including: Path, allowed: tuple[Path, ...]) -> Path:
    """A base's file: a shipped name, or a path relative to the including file, inside an allowed folder."""
    if is_uri(name) or name.startswith("file:"):
        raise ConfigError(f"{including}: base {name!r} is a URI; a base is a local YAML file beside the config")
    relative = (including.parent / name).resolve()
    shipped = CONFIG_DIR / f"{name.removesuffix('.yaml')}.yaml"
    if not relative.exists() and "/" not in name and shipped.is_file():
        return shipped.resolve()
    if not any(relative.is_relative_to(folder) for folder in allowed):
        raise ConfigError(
            f"{including}: base {name!r} resolves to {relative}, outside {' and '.join(map(str, allowed))}; a config "
            "may only build on files in its own folder (or below) and the shipped configs"
        )
    if not relative.is_file():
        names = ", ".join(sorted(q.stem for q in CONFIG_DIR.glob("*.yaml")))
        what = not_a_file(relative)
        raise ConfigError(
            f"{including}: base {name!r} {what} (looked for {relative}); name a YAML file relative to "
            f"{including.parent} or a shipped config: {names}"
        )
    return relative


def read_with_bases(p: Path, *, allowed: tuple[Path, ...] | None = None, chain: tuple[Path, ...] = (),
                    budget: list[int] | None = None) -> dict[str, Any]:  # fmt: skip
    """A config file merged over its `base:` files (recursively): the plain mapping it stands for."""
    real = p.resolve()  # messages name the file as given; loops and places are checked on the real path
    allowed = allowed or (real.parent, CONFIG_DIR.resolve())
    budget = budget if budget is not None else [MAX_BASE_FILES]
    if real in chain:
        loop = " -> ".join(str(q) for q in (*chain[chain.index(real) :], real))
        raise ConfigError(f"config bases loop: {loop}; remove one of these base: entries")
    if len(chain) > MAX_BASE_DEPTH:
        raise ConfigError(
            f"{chain[0]}: bases nested over {MAX_BASE_DEPTH} deep (down to {p}); flatten the chain into fewer files"
        )
    budget[0] -= 1
    if budget[0] < 0:
        raise ConfigError(f"{chain[0]}: its bases read over {MAX_BASE_FILES} files; build on fewer configs")
    d = read_config_file(p)
    merged: dict[str, Any] = {}
    for name in _base_names(d, p):
        base = read_with_bases(_resolve_base(name, real, allowed), allowed=allowed, chain=(*chain, real), budget=budget)
        merged = deep_merge(merged, base)
    return deep_merge(merged, d)


def load_config(path: str, overrides: list[str] | None = None, *, check_paths: bool = True) -> TrainConfig:
    """Read a YAML config (a path or a shipped name) over its bases, apply overrides, validate.

    `check_paths=False` skips `check_local` (a config built on one machine for another).
    """
    if any(item.split("=", 1)[0].split(".", 1)[0] == "base" for item in overrides or ()):
        raise ConfigError("base is not an override: write `base: FILE` in the YAML file (bases merge under the file)")
    p = resolve_config_path(path)
    d = read_with_bases(p)
    try:
        merged = OmegaConf.create(d)
    except OmegaConfBaseException as e:  # a bad ${...}, or a YAML value OmegaConf cannot hold (a date)
        fix = _INTERPOLATION_HINT if isinstance(e, GrammarParseError) else "quote it to make it text"
        raise ConfigError(f"{p}: {getattr(e, 'full_key', None) or 'a value'}: {_omega_problem(e)}; {fix}") from None
    cfg = TrainConfig.from_dict(resolve(apply_overrides(merged, list(overrides or []))))
    if check_paths:
        check_local(cfg)
    return cfg
