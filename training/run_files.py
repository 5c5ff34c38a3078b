"""What a training run leaves beside its checkpoints, so eval/generate need nothing else:
`hbpe_run.json` (model config, tokenizer identity, shard geometry) and `tokenizer/`."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hbpe.pipeline.tokenizer import artifact
from hbpe.pipeline.tokenizer.hierarchical import HierarchicalTokenizer
from hbpe.schemas.errors import ArtifactError
from hbpe.schemas.train_config import ModelConfig

RUN_FILE = "hbpe_run.json"


def write_run_files(
    folder: str,
    *,
    model_cfg: ModelConfig,
    tok: HierarchicalTokenizer,
    seq_len: int,
    train_config: dict[str, Any],
    derived_tokenizer: dict[str, Any] | None = None,
) -> None:
    os.makedirs(folder, exist_ok=True)
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
    Path(folder, RUN_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    artifact.save(tok, Path(folder, "tokenizer"), overwrite=True)


def find_run_dir(checkpoint: str) -> Path:
    p = Path(checkpoint).resolve()
    for d in [p, *p.parents][:4]:
        if (d / RUN_FILE).is_file():
            return d
    raise ArtifactError(f"no {RUN_FILE} found beside {checkpoint}: pass a checkpoint inside a `hbpe train` save folder")


def read_run_files(checkpoint: str) -> tuple[dict[str, Any], HierarchicalTokenizer]:
    d = find_run_dir(checkpoint)
    meta = json.loads((d / RUN_FILE).read_text())
    tok = artifact.load(d / "tokenizer")
    if tok.fingerprint != meta["tokenizer_fingerprint"]:
        raise ArtifactError(f"{d}/tokenizer does not match {RUN_FILE}: the run folder was modified")
    return meta, tok
