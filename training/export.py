"""`hbpe export`: a trained model as a self-contained directory that loads without Composer state or pickle.

    DIR/model.safetensors   every weight once (safetensors stores no shared tensors, runs no code)
    DIR/hbpe_model.json     format and version, the model config, the tokenizer's shape
                            (vocab_size, max_patch_size, n_vocab) and fingerprint, the tied
                            weights, where it came from; written last: its presence marks a
                            complete export
    DIR/tokenizer/          the tokenizer artifact the model was trained with

Tied weights: the BPE baseline's head is its embedding matrix, and the hierarchical model's
encoder and decoder read one symbol table. `state_dict()` lists such a tensor under each
name; the export stores it under the first and records `{alias: stored name}` in
`tied`; loading hands the stored tensor to both names, so they come back as one parameter.
`load_model` (checkpoint.py) reads an export directory like any checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hbpe.pipeline import storage
from hbpe.schemas.errors import ArtifactError, ConfigError
from hbpe.schemas.train_config import ModelConfig
from hbpe.training.model import PatchLM, VocabSpec, build_model

EXPORT_FORMAT = "hbpe-model"
EXPORT_VERSION = 1
MODEL_FILE = "hbpe_model.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_DIR = "tokenizer"
_OURS = (MODEL_FILE, WEIGHTS_FILE, TOKENIZER_DIR)


def tied_weights(model: torch.nn.Module) -> dict[str, str]:
    """{state-dict key: the earlier key holding the same tensor} for every weight shared under two names.

    >>> lin = torch.nn.Linear(2, 3, bias=False); emb = torch.nn.Embedding(3, 2); lin.weight = emb.weight
    >>> tied_weights(torch.nn.ModuleDict({"embed": emb, "head": lin}))
    {'head.weight': 'embed.weight'}
    """
    first: dict[tuple, str] = {}
    tied = {}
    for name, t in model.state_dict(keep_vars=True).items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if key in first:
            tied[name] = first[key]
        else:
            first[key] = name
    return tied


def _check_out(out: Path, *, overwrite: bool) -> None:
    """An export goes into a new or empty folder; --overwrite replaces an earlier export and nothing else."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; pass a directory for the export")
    if not out.is_dir() or not any(out.iterdir()):
        return
    others = sorted(p.name for p in out.iterdir() if p.name not in _OURS)
    if not (out / MODEL_FILE).is_file() or others:
        what = f"files hbpe export did not write ({', '.join(others[:3])})" if others else "an incomplete export"
        raise ConfigError(f"--out {out} holds {what}; choose an empty or new directory")
    if not overwrite:
        raise ConfigError(f"--out {out} already holds an export; pass --overwrite to replace it")


def write_file_atomic(path: Path, write: Callable[[str], None]) -> None:
    """`write(tmp)` into a temporary file beside `path`, then rename it: `path` is complete or absent."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would hide a shared model from its readers
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def export_model(checkpoint: str, out: str, *, overwrite: bool = False) -> dict[str, Any]:
    """Any checkpoint `load_model` reads (local or in a bucket) -> a self-contained model directory `out`
    (local, or a bucket prefix); returns a summary."""
    from hbpe.training.checkpoint import load_model

    t0 = time.perf_counter()
    remote_out = storage.is_remote(out)
    if remote_out:  # before the (possibly large) model is read
        _check_remote_out(out, overwrite=overwrite)
    else:
        _check_out(Path(out), overwrite=overwrite)
    model, tok, meta = load_model(checkpoint)
    where = checkpoint if storage.is_remote(checkpoint) else str(Path(checkpoint).resolve())
    source = meta.get("source") or {"checkpoint": where}
    if not remote_out:
        summary = write_export(model, tok, out, source=source, overwrite=overwrite)
    else:
        with tempfile.TemporaryDirectory(prefix="hbpe-export-") as tmp:
            summary = {**write_export(model, tok, tmp, source=source), "out": out}
            _upload_export(tmp, out)
    return {"checkpoint": checkpoint, **summary, "seconds": round(time.perf_counter() - t0, 3)}


def _check_remote_out(out: str, *, overwrite: bool) -> None:
    """`_check_out` for a bucket prefix: new or empty, or an earlier export with --overwrite."""
    names = {name.split("/", 1)[0] for name in storage.list_dir(out)}
    if not names:
        return
    others = sorted(names - set(_OURS))
    if MODEL_FILE not in names or others:
        what = f"objects hbpe export did not write ({', '.join(others[:3])})" if others else "an incomplete export"
        raise ConfigError(f"--out {out} holds {what}; choose an empty or new prefix")
    if not overwrite:
        raise ConfigError(f"--out {out} already holds an export; pass --overwrite to replace it")


def _upload_export(local: str, out: str) -> None:
    """The export in `local` to bucket prefix `out`, hbpe_model.json last (as locally: its presence marks a
    complete export). A bucket cannot rename: an interrupted --overwrite leaves the old description beside
    some new files, which `load_exported` refuses (fingerprint or weights mismatch) rather than misreads."""
    description = Path(local, MODEL_FILE)
    text = description.read_bytes()
    description.unlink()
    storage.upload_dir(local, out)
    storage.write_bytes(storage.join(out, MODEL_FILE), text)


def write_export(model: PatchLM, tok: Any, out: str, *, source: dict[str, Any], overwrite: bool = False) -> dict:
    """A built model and its tokenizer -> the export directory `out` (weights, then tokenizer, then description)."""
    from safetensors.torch import save_file

    from hbpe.pipeline.tokenizer import artifact

    dest = Path(out)
    _check_out(dest, overwrite=overwrite)
    tied = tied_weights(model)
    weights = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items() if k not in tied}
    spec = {
        "vocab_size": tok.vocab_size,
        "max_patch_size": tok.max_patch_size,
        "n_vocab": tok.encoding.max_token_value + 1,
    }
    info = {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "model": dataclasses.asdict(model.cfg),
        **spec,
        "tokenizer_fingerprint": tok.fingerprint,
        "tied": tied,
        "parameters": sum(p.numel() for p in model.parameters()),
        "source": source,
    }
    dest.mkdir(parents=True, exist_ok=True)
    (dest / MODEL_FILE).unlink(missing_ok=True)  # an interrupted overwrite leaves no complete-looking export
    write_file_atomic(dest / WEIGHTS_FILE, lambda p: save_file(weights, p, metadata={"format": EXPORT_FORMAT}))
    if (dest / TOKENIZER_DIR).exists():
        shutil.rmtree(dest / TOKENIZER_DIR)
    artifact.save(tok, dest / TOKENIZER_DIR)
    text = json.dumps(info, indent=2, sort_keys=True) + "\n"
    write_file_atomic(dest / MODEL_FILE, lambda p: Path(p).write_text(text))
    return {
        "out": str(dest),
        "tensors": len(weights),
        "tied": tied,
        "parameters": info["parameters"],
        "bytes": (dest / WEIGHTS_FILE).stat().st_size,
    }


def _read_info(folder: Path) -> dict[str, Any]:
    path = folder / MODEL_FILE
    try:
        info = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ArtifactError(f"{path} is not readable JSON ({e}); re-export the model with `hbpe export`") from None
    if not isinstance(info, dict) or info.get("format") != EXPORT_FORMAT:
        raise ArtifactError(f"{path} is not an hbpe model description (format {EXPORT_FORMAT!r}); use `hbpe export`")
    if info.get("version") != EXPORT_VERSION:
        raise ArtifactError(
            f"{path} has version {info.get('version')!r}; this hbpe reads version {EXPORT_VERSION}: export it again "
            "with this hbpe"
        )
    for key, kind in (("model", dict), ("tied", dict), ("tokenizer_fingerprint", str)):
        if not isinstance(info.get(key), kind):
            raise ArtifactError(f"{path}: field {key!r} is missing or not a {kind.__name__}; re-export the model")
    return info


def load_exported(folder: str | os.PathLike, *, device: str | torch.device = "cpu") -> tuple[PatchLM, Any, dict]:
    """An `hbpe export` directory -> (model in eval mode on `device`, tokenizer, its hbpe_model.json)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from hbpe.pipeline.tokenizer import artifact
    from hbpe.training.checkpoint import load_weights

    folder = Path(folder)
    info = _read_info(folder)
    tok = artifact.load(folder / TOKENIZER_DIR)
    if tok.fingerprint != info["tokenizer_fingerprint"]:
        raise ArtifactError(f"{folder}/{TOKENIZER_DIR} does not match {MODEL_FILE}: the export was modified")
    source = str(folder / MODEL_FILE)
    try:
        cfg = ModelConfig(**info["model"])
    except (TypeError, ConfigError) as e:
        raise ArtifactError(f"{source}: model config does not fit this hbpe ({e}); re-export the model") from None
    model = build_model(cfg, VocabSpec.from_run_meta(info, source=source))
    weights_path = folder / WEIGHTS_FILE
    try:
        weights = load_file(weights_path)
    except (SafetensorError, OSError) as e:
        raise ArtifactError(f"{weights_path} is missing or corrupt ({e}); re-export the model") from None
    for alias, name in info["tied"].items():
        if name not in weights or alias in weights:
            raise ArtifactError(f"{source}: tied weight {alias!r} -> {name!r} does not match {WEIGHTS_FILE}")
        weights[alias] = weights[name]
    load_weights(model, weights, str(weights_path), config=MODEL_FILE)
    if tied_weights(model) != info["tied"]:  # e.g. tie_embeddings edited in the config
        raise ArtifactError(
            f"{source}: the model it describes ties {tied_weights(model)}, the export {info['tied']}; re-export the model"
        )
    return model.to(device).eval(), tok, info
