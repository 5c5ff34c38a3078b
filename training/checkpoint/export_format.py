"""The `hbpe export` format: a trained model as a self-contained directory that loads without Composer or pickle.

    DIR/model.safetensors   every weight once (safetensors stores no shared tensors, runs no code)
    DIR/hbpe_model.json     format and version, the model config, the tokenizer's shape
                            (vocab_size, max_patch_size, n_vocab) and fingerprint, the sha256 of
                            model.safetensors, the tied weights, where it came from; written
                            last: its presence marks a complete export
    DIR/tokenizer/          the tokenizer artifact the model was trained with
    DIR/entropy_model/      io=entropy only: the byte-level model that cuts its patches, an export
                            itself (entropy_files.py), checked against model.patching.entropy_model_sha256

Loading checks everything before it builds anything (an export is untrusted): the sizes are
bounded (ModelConfig), the tokenizer must have the shape the description names, the weights file
its sha256 (a flipped bit gave a NaN or a silently wrong BPB), and its header the shapes of the
described model (load_checks.py). An export written before the sha256 was recorded loads with a
warning.

Tied weights: the BPE baseline's head is its embedding matrix, and the hierarchical model's
encoder and decoder read one symbol table. `state_dict()` lists such a tensor under each
name; the export stores it under the first and records `{alias: stored name}` in
`tied`; loading hands the stored tensor to both names, so they come back as one parameter.
`load_model` (load.py) reads an export directory like any checkpoint; `hbpe export` is export.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hbpe.pipeline import storage
from hbpe.pipeline.tokenizer import artifact
from hbpe.schemas.errors import ArtifactError, ConfigError, file_problem
from hbpe.schemas.train_config import ModelConfig
from hbpe.training.checkpoint.entropy_files import locate_entropy_model
from hbpe.training.checkpoint.hf_export import HF_FILES, remove_hf_files, write_hf_files
from hbpe.training.checkpoint.hf_library import is_library_copy
from hbpe.training.checkpoint.load_checks import (
    check_tokenizer_shape,
    check_weight_shapes,
    load_weights,
    tokenizer_shape,
)
from hbpe.training.checkpoint.names import (
    ENTROPY_DIR,
    EXPORT_FORMAT,
    EXPORT_VERSION,
    MODEL_FILE,
    TOKENIZER_DIR,
    WEIGHTS_FILE,
)
from hbpe.training.model.build import build_model
from hbpe.training.model.patch_lm import PatchLM, VocabSpec
from hbpe.training.schemes.registry import scheme_spec

log = logging.getLogger(__name__)

_OURS = (MODEL_FILE, WEIGHTS_FILE, TOKENIZER_DIR, ENTROPY_DIR, *HF_FILES)  # HF_FILES: --format hf (hf_export.py)
FORMATS = ("hbpe", "hf")  # hf: the same folder plus the files transformers loads (hf_export.py)


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


def export_weights(model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(the tensors an export stores: each once, on the CPU, {alias: stored name} of the tied ones)."""
    tied = tied_weights(model)
    weights = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items() if k not in tied}
    return weights, tied


def weights_sha256(model: torch.nn.Module) -> str:
    """The sha256 of the model.safetensors `write_export` writes for `model`, computed in memory.

    safetensors writes the same bytes for the same tensors (its header lists them in a fixed order),
    so this is a fingerprint of the weights themselves: entropy_files.py records it for a run's
    entropy model, which its export copy must then match.
    """
    from safetensors.torch import save

    return hashlib.sha256(save(export_weights(model)[0], metadata={"format": EXPORT_FORMAT})).hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _refuse_out(out: str, names: set[str], has_description: bool, *, overwrite: bool, kind: str) -> None:
    """`--out` (a folder or a bucket prefix holding `names`) takes an export only when it is empty, or, with
    --overwrite, holds an earlier export, complete or cut short (no hbpe_model.json: an interrupted export),
    and nothing else."""
    if not names:
        return
    others = sorted(n for n in names - set(_OURS) if not is_library_copy(n))  # any hbpe's module copies are ours
    if others:
        raise ConfigError(
            f"--out {out} holds {kind} hbpe export did not write ({', '.join(others[:3])}); choose an empty or new "
            f"{'prefix' if kind == 'objects' else 'directory'}"
        )
    if overwrite:
        return
    if not has_description:
        raise ConfigError(
            f"--out {out} holds an incomplete export (no {MODEL_FILE}: an export was interrupted); pass --overwrite "
            "to replace it"
        )
    raise ConfigError(f"--out {out} already holds an export; pass --overwrite to replace it")


def _check_out(out: Path, *, overwrite: bool) -> None:
    """An export goes into a new or empty folder; --overwrite replaces an earlier export and nothing else."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; pass a directory for the export")
    names = {p.name for p in out.iterdir()} if out.is_dir() else set()
    _refuse_out(str(out), names, (out / MODEL_FILE).is_file(), overwrite=overwrite, kind="files")


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


def _check_remote_out(out: str, *, overwrite: bool) -> None:
    """`_check_out` for a bucket prefix: new or empty, or an earlier (or interrupted) export with --overwrite."""
    listed = storage.list_dir(out)
    names = {name.split("/", 1)[0] for name in listed}
    _refuse_out(out, names, MODEL_FILE in listed, overwrite=overwrite, kind="objects")


def upload_export(local: str, out: str) -> None:
    """The export in `local` to bucket prefix `out`, hbpe_model.json last (as locally: its presence marks a
    complete export). A bucket cannot rename: an interrupted --overwrite leaves the old description beside
    some new files, which `load_exported` refuses (the weights' sha256, the tokenizer's fingerprint) rather
    than misreads, and which --overwrite then replaces."""
    description = Path(local, MODEL_FILE)
    text = description.read_bytes()
    description.unlink()
    storage.upload_dir(local, out)
    storage.write_bytes(storage.join(out, MODEL_FILE), text)


def write_export(
    model: PatchLM,
    tok: Any,
    out: str,
    *,
    source: dict[str, Any],
    overwrite: bool = False,
    entropy: Any = None,
    hf: bool = False,
) -> dict:
    """A built model and its tokenizer -> the export directory `out` (weights, then tokenizer, an io=entropy
    model's entropy model `entropy` (an EntropyModel, loaded by the caller before `out` changes), `hf`: transformers' files
    (hf_export.py), then the description)."""
    from safetensors.torch import save_file

    if scheme_spec(model.cfg).uses_entropy_model and entropy is None:
        raise ConfigError("internal: an io=entropy model is exported with its entropy model (load.entropy_of)")
    dest = Path(out)
    _check_out(dest, overwrite=overwrite)
    weights, tied = export_weights(model)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / MODEL_FILE).unlink(missing_ok=True)  # an interrupted overwrite leaves no complete-looking export
    remove_hf_files(dest)  # an earlier --format hf export's: rewritten below when hf
    # transformers refuses a safetensors file whose format is not "pt"; hbpe reads either (by sha256)
    weights_format = "pt" if hf else EXPORT_FORMAT
    write_file_atomic(dest / WEIGHTS_FILE, lambda p: save_file(weights, p, metadata={"format": weights_format}))
    if (dest / TOKENIZER_DIR).exists():
        shutil.rmtree(dest / TOKENIZER_DIR)
    artifact.save(tok, dest / TOKENIZER_DIR)
    cfg = model.cfg
    if (dest / ENTROPY_DIR).exists():
        shutil.rmtree(dest / ENTROPY_DIR)  # an earlier export's (--overwrite checked the folder holds only ours)
    if entropy is not None:  # self-contained: the model that cuts its patches comes along, fingerprinted
        cfg = copy_entropy_model(cfg, entropy, str(dest / ENTROPY_DIR))
    if hf:
        write_hf_files(dest, cfg, tok)
    info = {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "model": dataclasses.asdict(cfg),
        **tokenizer_shape(tok),
        "tokenizer_fingerprint": tok.fingerprint,
        "weights_sha256": file_sha256(dest / WEIGHTS_FILE),
        "tied": tied,
        "parameters": sum(p.numel() for p in model.parameters()),
        "source": source,
    }
    text = json.dumps(info, indent=2, sort_keys=True) + "\n"
    write_file_atomic(dest / MODEL_FILE, lambda p: Path(p).write_text(text))
    return {
        "out": str(dest),
        "tensors": len(weights),
        "tied": tied,
        "parameters": info["parameters"],
        "bytes": (dest / WEIGHTS_FILE).stat().st_size,
        "weights_sha256": info["weights_sha256"],
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
    sha = info.get("weights_sha256")
    if sha is not None and not (isinstance(sha, str) and len(sha) == 64):
        raise ArtifactError(f"{path}: field 'weights_sha256' is not a sha256 ({sha!r:.80}); re-export the model")
    return info


def _check_weights_file(folder: Path, info: dict[str, Any]) -> None:
    """model.safetensors has the sha256 hbpe_model.json records (flipped bits gave a NaN or a wrong BPB, rc 0)."""
    path = folder / WEIGHTS_FILE
    problem = file_problem(path, missing="is missing")
    if problem is not None:
        raise ArtifactError(f"{path} {problem}; re-export the model with `hbpe export`")
    expected = info.get("weights_sha256")
    if expected is None:
        log.warning(
            "%s records no sha256 of %s (written by an older hbpe): its weights are loaded unverified; export the "
            "model again to record it",
            folder / MODEL_FILE,
            WEIGHTS_FILE,
        )
        return
    actual = file_sha256(path)
    if actual != expected:
        raise ArtifactError(
            f"{path} does not match the sha256 recorded in {MODEL_FILE} ({actual[:12]}... instead of "
            f"{expected[:12]}...): the weights were changed or damaged after the export; re-export the model with "
            "`hbpe export` (or restore the folder from a copy)"
        )


def _header_shapes(path: Path) -> dict[str, list[int]]:
    """{name: shape} from a safetensors file's header, without reading a tensor."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), "pt") as f:
            names = f.keys()  # safe_open is not iterable
            return {k: f.get_slice(k).get_shape() for k in names}
    except (SafetensorError, OSError) as e:
        raise ArtifactError(f"{path} is missing or corrupt ({e}); re-export the model") from None


def load_exported(folder: str | os.PathLike, *, device: str | torch.device = "cpu") -> tuple[PatchLM, Any, dict]:
    """An `hbpe export` directory -> (model in eval mode on `device`, tokenizer, its hbpe_model.json)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    info = _read_info(folder)
    tok = artifact.load(folder / TOKENIZER_DIR)
    if tok.fingerprint != info["tokenizer_fingerprint"]:
        raise ArtifactError(f"{folder}/{TOKENIZER_DIR} does not match {MODEL_FILE}: the export was modified")
    source = str(folder / MODEL_FILE)
    try:
        cfg = ModelConfig.from_dict(info["model"])  # every size bounded; an older export's flat keys read too
    except (TypeError, ConfigError) as e:
        raise ArtifactError(f"{source}: model config does not fit this hbpe ({e}); re-export the model") from None
    check_tokenizer_shape(info, tok, source=source, tokenizer=str(folder / TOKENIZER_DIR))
    spec = VocabSpec.from_run_meta(info, source=source)
    weights_path = folder / WEIGHTS_FILE
    _check_weights_file(folder, info)
    shapes = _header_shapes(weights_path)
    for alias, name in info["tied"].items():
        if not isinstance(name, str) or name not in shapes or alias in shapes:
            raise ArtifactError(f"{source}: tied weight {alias!r} -> {name!r} does not match {WEIGHTS_FILE}")
        shapes[alias] = shapes[name]
    check_weight_shapes(cfg, spec, shapes, source=str(weights_path), config=MODEL_FILE)  # before any allocation
    try:
        weights = load_file(weights_path)
    except (SafetensorError, OSError) as e:
        raise ArtifactError(f"{weights_path} is missing or corrupt ({e}); re-export the model") from None
    for alias, name in info["tied"].items():
        weights[alias] = weights[name]
    model = build_model(cfg, spec)
    load_weights(model, weights, str(weights_path), config=MODEL_FILE)
    if tied_weights(model) != info["tied"]:  # e.g. tie_embeddings edited in the config
        raise ArtifactError(
            f"{source}: the model it describes ties {tied_weights(model)}, the export {info['tied']}; re-export the model"
        )
    model.cfg = locate_entropy_model(cfg, str(folder.absolute()), source=source)  # io=entropy: its checked copy
    return model.to(device).eval(), tok, info


def save_entropy_copy(entropy: Any, folder: str) -> str:
    """The run's entropy model as an export in `folder`/entropy_model (a local folder or a bucket prefix)."""
    if not storage.is_remote(folder):
        target = os.path.join(folder, ENTROPY_DIR)
        _write_copy(entropy, target, overwrite=True)  # autoresume: the same model (check_resume_matches)
        return target
    target = storage.join(folder, ENTROPY_DIR)
    with tempfile.TemporaryDirectory(prefix="hbpe-entropy-") as tmp:
        _write_copy(entropy, tmp, overwrite=True)
        upload_export(tmp, target)
    return target


def copy_entropy_model(cfg: ModelConfig, entropy: Any, into: str) -> ModelConfig:
    """An export's copy of its entropy model (`load.entropy_of(cfg)`) in local folder `into` -> `cfg` with the copy's
    fingerprint (a run from an older hbpe recorded none)."""
    _write_copy(entropy, into)
    return cfg.with_patching(entropy_model_sha256=weights_sha256(entropy.model))


def _write_copy(entropy: Any, into: str, *, overwrite: bool = False) -> None:
    summary = write_export(
        entropy.model, entropy.tok, into, source={"entropy_model": entropy.source}, overwrite=overwrite
    )
    if summary["weights_sha256"] != weights_sha256(
        entropy.model
    ):  # safetensors wrote other bytes than it hashed: never seen
        raise ArtifactError(f"{into}: the copy of the entropy model {entropy.source} does not have its fingerprint")
