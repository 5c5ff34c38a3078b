"""Next-byte entropies from a small byte-level LM, for entropy patching (as in BLT).

No pretrained entropy model is reachable offline, so ours is an hbpe model trained with
`model.io=bytes` on the same shards; `model.entropy_model` names its checkpoint (kept with the
run and its exports, and checked, by entropy_files.py). Entropies
are computed in the loader, batch by batch, where the byte model is a few percent of a
training step at the mini sizes (README: `hbpe bench train` per scheme); a shard column
would fix the entropy model and threshold at conversion time, which an experiment sweeps.

The global threshold is given (`model.entropy_threshold`) or chosen on a sample of the
training shards so the mean patch length reaches `model.entropy_target_bytes`; the chosen
value is written into the run's model config, so eval and generation cut the same patches.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hbpe.schemas.errors import ArtifactError, ConfigError
from hbpe.schemas.symbols import EOD, TOKEN_EOD, TOKEN_PAD
from hbpe.training.byte_patching import entropy_starts, patch_starts

log = logging.getLogger(__name__)


class EntropyModel:
    """A `bytes`-scheme PatchLM used read-only to score next-byte entropies.

    `source` is where it was loaded from (resolved: absolute, or a URI) and `tok` its tokenizer, which
    entropy_files.py writes with it into a run folder or an export.
    """

    def __init__(self, model: torch.nn.Module, *, source: str, tok: Any = None) -> None:
        if getattr(model.cfg, "io", None) != "bytes":
            raise ConfigError(
                f"model.entropy_model={source} is a model.io={model.cfg.io} checkpoint; entropy patching needs a "
                "byte-level model: train one with model.io=bytes on the same shards and name its checkpoint"
            )
        self.model, self.source, self.tok = model.eval(), source, tok
        self.device = next(model.parameters()).device

    @functools.cached_property
    def sha256(self) -> str:
        """Its fingerprint: the sha256 of its weights as `hbpe export` writes them (model.entropy_model_sha256)."""
        from hbpe.training.export import weights_sha256

        return weights_sha256(self.model)

    @classmethod
    def load(cls, checkpoint: str, *, device: str = "cpu") -> EntropyModel:
        from hbpe.pipeline import storage
        from hbpe.training.checkpoint import load_model

        # resolved once: relative to the directory `hbpe train` runs in, never to where the run is read later
        where = checkpoint if storage.is_remote(checkpoint) else str(Path(checkpoint).resolve())
        if not storage.is_remote(checkpoint) and not Path(where).exists():
            raise ArtifactError(
                f"model.entropy_model={checkpoint}: no such checkpoint (looked for {where}); train the byte-level "
                "entropy model first (hbpe train ... model.io=bytes) and name its save folder or .pt file"
            )
        model, tok, _ = load_model(where, device=device)
        return cls(model, source=where, tok=tok)

    @torch.no_grad()
    def entropies(self, units: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Per sample (L,) float32: entropy in nats of p(unit_i | units_<i) (0 at i = 0, where a patch starts anyway)."""
        if not units:
            return []
        ids = np.full((len(units), max(len(u) for u in units)), TOKEN_PAD, dtype=np.int64)
        for i, u in enumerate(units):
            ids[i, : len(u)] = np.where(u == EOD, TOKEN_EOD, u)
        io = self.model.io
        x = io.embed(io._ids(torch.from_numpy(ids).to(self.device)))
        h = self.model.latent(x, causal=True)  # (B, L, D)
        logp = torch.log_softmax(io.head(h).float(), dim=-1)  # (B, L, V): position i predicts unit i + 1
        ent = -(logp.exp() * logp).sum(-1)  # (B, L)
        out = torch.zeros_like(ent)
        out[:, 1:] = ent[:, :-1]
        arr = out.cpu().numpy()
        return [arr[i, : len(u)].astype(np.float32) for i, u in enumerate(units)]


def mean_patch_bytes(
    units: Sequence[np.ndarray],
    contexts: Sequence[int],
    entropies: Sequence[np.ndarray],
    threshold: float,
    max_bytes: int,
) -> float:
    """Mean bytes per text patch that entropy patching at `threshold` cuts from these samples."""
    nbytes = patches = 0
    for u, c, e in zip(units, contexts, entropies, strict=True):
        starts = patch_starts(u, c, entropy_starts(e, threshold), max_bytes)
        text = u != EOD
        nbytes += int(text.sum())
        patches += int((starts & text).sum())
    return nbytes / max(patches, 1)


def choose_threshold(
    units: Sequence[np.ndarray],
    contexts: Sequence[int],
    entropies: Sequence[np.ndarray],
    *,
    target_bytes: float,
    max_bytes: int,
) -> float:
    """The global threshold whose mean patch length is closest to `target_bytes` on these samples.

    Mean patch length grows with the threshold (fewer starts), so a bisection over the sorted
    entropy values finds it; ties in the entropies make some targets unreachable exactly.
    """
    values = np.unique(np.concatenate([e[1:] for e in entropies if len(e) > 1]))
    if len(values) == 0:
        raise ConfigError("the sample for the entropy threshold holds no text; check data.train")
    reach = mean_patch_bytes(units, contexts, entropies, float(values[-1]), max_bytes)
    if target_bytes > reach:
        raise ConfigError(
            f"model.entropy_target_bytes={target_bytes}: the longest mean patch these samples allow is {reach:.2f} bytes "
            f"(limit {max_bytes} bytes per patch); ask for less or raise the limit"
        )
    lo, hi = 0, len(values) - 1
    while lo < hi:  # the smallest threshold whose mean patch length reaches the target
        mid = (lo + hi) // 2
        if mean_patch_bytes(units, contexts, entropies, float(values[mid]), max_bytes) >= target_bytes:
            hi = mid
        else:
            lo = mid + 1
    return float(values[lo])


CALIBRATION_SAMPLES = 64  # ~36 KB of text at seq_len 128: the threshold moves < 1% beyond it (README)


def threshold_on_shards(
    model_cfg, tok, shards: str, entropy: EntropyModel, *, samples: int = CALIBRATION_SAMPLES
) -> float:
    """The threshold reaching `model_cfg.entropy_target_bytes` on the first `samples` samples of `shards`.

    Stored order, not shuffled: every rerun (and autoresume) chooses the same value.
    """
    from hbpe.training.byte_patching import patch_limit, sample_units
    from hbpe.training.scheme_stats import read_token_rows
    from hbpe.training.schemes import vocabulary_bytes

    rows = read_token_rows(shards, tok, samples=samples)
    vocab = vocabulary_bytes(tok)
    cut = [sample_units(r, vocab) for r in rows]
    units = [s.units for s in cut]
    ents = [e for i in range(0, len(units), 16) for e in entropy.entropies(units[i : i + 16])]
    limit = patch_limit(model_cfg)
    contexts = [s.context for s in cut]
    threshold = choose_threshold(units, contexts, ents, target_bytes=model_cfg.entropy_target_bytes, max_bytes=limit)
    log.info(
        "entropy threshold %.4f nats: mean patch %.2f bytes (asked %.2f) on %d samples of %s",
        threshold,
        mean_patch_bytes(units, contexts, ents, threshold, limit),
        model_cfg.entropy_target_bytes,
        len(cut),
        shards,
    )
    return threshold
