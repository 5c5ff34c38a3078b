"""What a training run leaves beside its checkpoints, so eval/generate need nothing else:
`hbpe_run.json` (model config, tokenizer identity, shard geometry) and `tokenizer/`.

The save folder may be a bucket prefix (`s3://b/run`): the files are then written locally and
uploaded, and read back through hbpe.pipeline.storage. A checkpoint's run folder is the
nearest of the checkpoint itself (a save folder), its folder or prefix, and two more above it
that holds `hbpe_run.json`.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hbpe.pipeline import storage
from hbpe.pipeline.tokenizer import artifact
from hbpe.pipeline.tokenizer.hierarchical import HierarchicalTokenizer
from hbpe.schemas.errors import ArtifactError, ConfigError
from hbpe.schemas.train_config import ModelConfig

RUN_FILE = "hbpe_run.json"
TOKENIZER_DIR = "tokenizer"
_LEVELS = 4  # the checkpoint, its folder, and two above: run/ep0-ba4/ (sharded) sits one below its run folder


def write_run_files(
    folder: str,
    *,
    model_cfg: ModelConfig,
    tok: HierarchicalTokenizer,
    seq_len: int,
    train_config: dict[str, Any],
    derived_tokenizer: dict[str, Any] | None = None,
) -> None:
    meta = {
        "model": asdict(model_cfg),
        "tokenizer_fingerprint": tok.fingerprint,
        "vocab_size": tok.vocab_size,
        "max_patch_size": tok.max_patch_size,
        "n_vocab": tok.encoding.max_token_value + 1,
        "seq_len": seq_len,
        "train_config": train_config,
        "derived_tokenizer": derived_tokenizer,  # another S or mode than the shards' tokenizer, or None
    }
    if not storage.is_remote(folder):
        _write_local(folder, meta, tok)
        return
    with tempfile.TemporaryDirectory(prefix="hbpe-run-files-") as tmp:
        _write_local(tmp, meta, tok)
        storage.upload_dir(tmp, folder)  # the same names replace an earlier run's (autoresume, save_overwrite)


def _write_local(folder: str, meta: dict[str, Any], tok: HierarchicalTokenizer) -> None:
    os.makedirs(folder, exist_ok=True)
    Path(folder, RUN_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    artifact.save(tok, Path(folder, TOKENIZER_DIR), overwrite=True)


def find_run_dir(checkpoint: str) -> Path:
    """The local run folder of a local checkpoint (see the module docstring)."""
    p = Path(checkpoint).resolve()
    for d in [p, *p.parents][:_LEVELS]:
        if (d / RUN_FILE).is_file():
            return d
    raise ArtifactError(f"no {RUN_FILE} found beside {checkpoint}: pass a checkpoint inside a `hbpe train` save folder")


def find_remote_run_dir(checkpoint: str) -> str:
    """The run folder (a URI) of a checkpoint in a bucket: s3://b/run/ep0-ba4-rank0.pt -> s3://b/run."""
    scheme, bucket, key = storage.split_uri(checkpoint)
    parts = [bucket, *key.split("/")] if key else [bucket]
    for n in range(len(parts), max(len(parts) - _LEVELS, 0), -1):
        d = f"{scheme}://{'/'.join(parts[:n])}"
        if storage.read_if_exists(storage.join(d, RUN_FILE)) is not None:
            return d
    raise ArtifactError(
        f"no {RUN_FILE} found beside {checkpoint}: pass a checkpoint inside a `hbpe train` save folder (a bucket "
        "prefix holding hbpe_run.json and tokenizer/)"
    )


def download_run_files(run_dir: str, into: str | os.PathLike) -> None:
    """A bucket run folder's `hbpe_run.json` and `tokenizer/` into local folder `into`."""
    storage.localize_dir(run_dir, [RUN_FILE], into=str(into))
    artifact.fetch(storage.join(run_dir, TOKENIZER_DIR), Path(into, TOKENIZER_DIR))


def read_run_files(checkpoint: str) -> tuple[dict[str, Any], HierarchicalTokenizer]:
    """(hbpe_run.json, the run's tokenizer) of a local or bucket checkpoint, checked against each other."""
    if storage.is_remote(checkpoint):
        d = find_remote_run_dir(checkpoint)
        meta = parse_run_file(storage.read_bytes(storage.join(d, RUN_FILE)), storage.join(d, RUN_FILE))
        tok = artifact.load(storage.join(d, TOKENIZER_DIR))
    else:
        d = find_run_dir(checkpoint)
        meta = parse_run_file((d / RUN_FILE).read_bytes(), str(d / RUN_FILE))
        tok = artifact.load(d / TOKENIZER_DIR)
    if tok.fingerprint != meta["tokenizer_fingerprint"]:
        raise ArtifactError(f"{d}/{TOKENIZER_DIR} does not match {RUN_FILE}: the run folder was modified")
    return meta, tok


# what eval, generate and export read from hbpe_run.json (VocabSpec.from_run_meta range-checks the three sizes)
_REQUIRED = {"model": dict, "tokenizer_fingerprint": str, "vocab_size": int, "max_patch_size": int, "n_vocab": int}
_KIND = {dict: "an object", str: "a string", int: "an integer"}


def parse_run_file(raw: bytes, source: str) -> dict[str, Any]:
    """The contents of an `hbpe_run.json` (untrusted: edited, cut short, replaced), or one ArtifactError naming it.

    Invalid JSON, `[]`, `{}`, a missing or mistyped key and a model config this hbpe cannot build
    each say so, instead of a JSONDecodeError, TypeError or KeyError from the first reader.
    """

    def damaged(why: str) -> ArtifactError:
        return ArtifactError(
            f"{source} is not a readable {RUN_FILE} ({why}); `hbpe train` writes it beside the checkpoints: restore "
            "it from a copy of the run, or pass the checkpoint of an intact run or an `hbpe export` directory"
        )

    try:
        meta = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise damaged(f"invalid JSON: {e}") from None
    if not isinstance(meta, dict):
        kind = {list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(meta), "number")
        raise damaged(f"a JSON {kind}, not an object")
    missing = [k for k in _REQUIRED if k not in meta]
    if missing:
        raise damaged(f"no {', '.join(missing)}")
    wrong = [k for k, kind in _REQUIRED.items() if not isinstance(meta[k], kind) or isinstance(meta[k], bool)]
    if wrong:
        raise damaged("; ".join(f"{k} is {json.dumps(meta[k])[:40]}, expected {_KIND[_REQUIRED[k]]}" for k in wrong))
    try:
        ModelConfig.from_dict(meta["model"])
    except ConfigError as e:
        raise damaged(f"its model config does not fit this hbpe: {e}") from None
    return meta
