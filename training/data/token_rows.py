"""The `tokens` rows of a shard directory read in stored order: the samples calibration and Table 1 measure."""

from __future__ import annotations

import tempfile

import numpy as np

from hbpe.pipeline import storage
from hbpe.pipeline.shards.reader import ShardDir
from hbpe.schemas.errors import ArtifactError
from hbpe.training.data.loader import build_dataloader, check_compatible, read_manifest, stop_downloads
from hbpe.training.data.shared_memory import release as release_shared_memory


def read_token_rows(shards: str, tok, *, samples: int) -> np.ndarray:
    """The first `samples` rows of the `tokens` column in stored order, (n, N), checked against `tok`'s first stage.

    Local shards are read directly (each shard file hash-checked as it is read); remote ones
    through streaming, whose cache of a partly read epoch is left to the temporary directory.
    """

    check_compatible(read_manifest(shards), tok, where=shards)
    rows: list[np.ndarray] = []
    if not storage.is_remote(shards):
        for _, s in zip(range(samples), ShardDir(shards).samples()):
            rows.append(np.asarray(s["tokens"], dtype=np.int64))
    else:
        with tempfile.TemporaryDirectory(prefix="hbpe-stats-") as cache:
            dl = build_dataloader(
                shards, tok, batch_size=16, cache_dir=cache, shuffle=False, shuffle_seed=0, drop_last=False
            )
            for batch in dl:
                rows.extend(batch["tokens"].numpy())
                if len(rows) >= samples:
                    break
            stop_downloads(dl)  # before the cache is deleted
            release_shared_memory(dl.dataset)  # streaming would keep it until the process exits
            del dl
    if not rows:
        raise ArtifactError(f"{shards} holds no samples to measure; convert a corpus with text")
    return np.stack(rows[:samples])
