"""Streaming shards from `hbpe convert` into batches for the model.

The run's tokenizer is checked against the shards' manifest:
- same fingerprint                      -> read the stored `patches`;
- same first stage, another S or mode   -> derive patches from `tokens` with the run's
  tokenizer (how one set of shards serves many experiments);
- another first stage                   -> a clear error.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.tokenizer import HierarchicalTokenizer
from schemas import shard_columns
from schemas.errors import ArtifactError
from schemas.manifest import Manifest


def read_manifest(shards: str) -> Manifest:
    """The manifest of a local or remote shard directory (remote via Beam's filesystems)."""
    path = os.path.join(shards, shard_columns.MANIFEST_FILENAME)
    if "://" in shards:
        from pipeline.beam import fs

        raw = fs.read_bytes(path)
    else:
        if not os.path.isfile(os.path.join(shards, shard_columns.COMPLETED_FILENAME)):
            raise ArtifactError(f"{shards} has no COMPLETED marker: not a finished `hbpe convert` output")
        with open(path, "rb") as f:
            raw = f.read()
    return Manifest.from_dict(json.loads(raw), source=path)


def load_shard_tokenizer(shards: str) -> HierarchicalTokenizer:
    from pipeline import tokenizer_io

    return tokenizer_io.load(os.path.join(shards, shard_columns.TOKENIZER_DIRNAME))


@dataclass(frozen=True)
class PatchSource:
    """How a run turns shard samples into patches."""

    derive: bool  # True: patches = run tokenizer applied to `tokens`


def check_compatible(manifest: Manifest, tok: HierarchicalTokenizer, *, where: str) -> PatchSource:
    if manifest.tokenizer_fingerprint == tok.fingerprint:
        return PatchSource(derive=False)
    if manifest.first_stage_fingerprint == tok.spec.first_stage.fingerprint:
        return PatchSource(derive=True)
    raise ArtifactError(
        f"{where} was tokenized with another first-stage BPE (fingerprint {manifest.first_stage_fingerprint[:12]}) than "
        f"this run's tokenizer ({tok.spec.first_stage.name}, {tok.spec.first_stage.fingerprint[:12]}); "
        "reconvert the corpus with this tokenizer or train with the shards' own tokenizer"
    )


class Collator:
    """Samples -> {patches (B,N,S) long, tokens (B,N) long, target_bytes (B,) long}.

    target_bytes counts the UTF-8 bytes of the patches the model predicts (positions
    1..N-1: the first patch is context only), so BPB = bits / target_bytes exactly.
    """

    def __init__(self, tok: HierarchicalTokenizer, source: PatchSource) -> None:
        self.tok, self.source = tok, source

    def __call__(self, samples: list[dict]) -> dict[str, torch.Tensor]:
        tokens = np.stack([np.asarray(s["tokens"], dtype=np.int32) for s in samples])  # (B, N)
        if self.source.derive:
            patches = self.tok.patches(tokens)  # (B, N, S)
        else:
            patches = np.stack([np.asarray(s["patches"]) for s in samples])
        target_bytes = np.take(self.tok.token_nbytes, tokens[:, 1:], axis=0).sum(axis=1)
        return {
            "patches": torch.from_numpy(patches.astype(np.int64)),
            "tokens": torch.from_numpy(tokens.astype(np.int64)),
            "target_bytes": torch.from_numpy(target_bytes.astype(np.int64)),
        }


def build_dataloader(
    shards: str,
    tok: HierarchicalTokenizer,
    *,
    batch_size: int,
    cache_dir: str | None,
    shuffle: bool,
    shuffle_seed: int,
    num_workers: int = 0,
    drop_last: bool = True,
) -> torch.utils.data.DataLoader:
    """A StreamingDataset over the shards (local dir or URI) with its resumable state.

    Local shard directories are treated as the remote too, so streaming's decompressed
    copies go to `cache_dir` and the shard directory stays exactly as written.
    """
    from streaming import StreamingDataset

    manifest = read_manifest(shards)
    source = check_compatible(manifest, tok, where=shards)
    local = cache_dir or tempfile.mkdtemp(prefix="hbpe-stream-")
    ds = StreamingDataset(
        remote=shards,
        local=local,
        batch_size=batch_size,
        shuffle=shuffle,
        shuffle_seed=shuffle_seed,
        num_canonical_nodes=1,  # deterministic sample order whatever the number of devices
    )
    return torch.utils.data.DataLoader(
        ds, batch_size=batch_size, collate_fn=Collator(tok, source), num_workers=num_workers, drop_last=drop_last
    )
