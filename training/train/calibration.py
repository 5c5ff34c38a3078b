"""What a run decides from its data before it trains: a derived tokenizer, the entropy threshold.

The run's S is decided once, by `resolve_tokenizer`: the shards' tokenizer, or another second stage
over the same first stage (`data.max_patch_size` / `data.mode`, or a `data.tokenizer` of another S),
said in a warning and recorded; `model.patching.entropy_target_bytes` chooses the entropy threshold on the
first training samples, so the mean patch length reaches the target. Both are recorded in
hbpe_run.json, so eval, generation and autoresume cut the same patches.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from hbpe.pipeline.shards.reader import load_shard_tokenizer, read_manifest
from hbpe.pipeline.tokenizer import artifact
from hbpe.pipeline.tokenizer.hierarchical import HierarchicalTokenizer
from hbpe.schemas.errors import ConfigError
from hbpe.schemas.manifest import Manifest
from hbpe.schemas.symbols import EOD
from hbpe.schemas.train_config import TrainConfig
from hbpe.training.checkpoint.load import load_entropy_model, resolve_entropy_model
from hbpe.training.data.byte_patching import entropy_starts, patch_starts, sample_units
from hbpe.training.data.loader import check_compatible
from hbpe.training.data.schemes import vocabulary_bytes
from hbpe.training.data.token_rows import read_token_rows
from hbpe.training.model.entropy_model import EntropyModel
from hbpe.training.schemes.registry import scheme_spec

log = logging.getLogger(__name__)


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
            f"model.patching.entropy_target_bytes={target_bytes}: the longest mean patch these samples allow is "
            f"{reach:.2f} bytes "
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
    """The threshold reaching `model_cfg.patching.entropy_target_bytes` on the first `samples` samples of `shards`.

    Stored order, not shuffled: every rerun (and autoresume) chooses the same value.
    """

    rows = read_token_rows(shards, tok, samples=samples)
    vocab = vocabulary_bytes(tok)
    cut = [sample_units(r, vocab) for r in rows]
    units = [s.units for s in cut]
    ents = [e for i in range(0, len(units), 16) for e in entropy.entropies(units[i : i + 16])]
    limit = scheme_spec(model_cfg).max_patch_bytes(model_cfg)
    contexts = [s.context for s in cut]
    threshold = choose_threshold(
        units, contexts, ents, target_bytes=model_cfg.patching.entropy_target_bytes, max_bytes=limit
    )
    log.info(
        "entropy threshold %.4f nats: mean patch %.2f bytes (asked %.2f) on %d samples of %s",
        threshold,
        mean_patch_bytes(units, contexts, ents, threshold, limit),
        model_cfg.patching.entropy_target_bytes,
        len(cut),
        shards,
    )
    return threshold


def resolve_tokenizer(
    cfg: TrainConfig, manifests: Sequence[Manifest] | None = None
) -> tuple[HierarchicalTokenizer, dict[str, Any] | None]:
    """The run's tokenizer, hence its S: the one decision of S after conversion, and what was derived.

    The shards' own tokenizer (`data.tokenizer` may name a copy of it), unless the run asks for
    another second stage: `data.max_patch_size` / `data.mode` (retrained here from the base, same
    first stage) or a `data.tokenizer` of another S, mode or merges. The loader then re-patches the
    shards' `tokens` as they stream. That is a different V' and a different model, so it is never
    silent: one log line, and `derived_tokenizer` {from_max_patch_size, from_mode (the shards'),
    max_patch_size, mode, merges, vocab_size, seconds (0 when nothing was retrained)} in the run
    info and hbpe_run.json; None exactly when every training source's stored patches are used.
    `manifests`: the training sources' (read here when not given).
    """

    sources = cfg.data.train_sources
    manifests = list(manifests) if manifests is not None else [read_manifest(s) for s in sources]
    first = manifests[0]  # with data.streams, the first stream's tokenizer is the base; every stream is compared
    base = artifact.load(cfg.data.tokenizer) if cfg.data.tokenizer else load_shard_tokenizer(sources[0], first)
    S, mode = cfg.data.max_patch_size or base.max_patch_size, cfg.data.mode or base.mode
    t = time.perf_counter()
    retrain = (S, mode) != (base.max_patch_size, base.mode)
    tok = artifact.with_patch_size(base, max_patch_size=S, mode=mode) if retrain else base
    for src, m in zip(sources, manifests):
        check_compatible(m, tok, where=src)  # another first stage is refused here, before any patch is cut
    repatched = [src for src, m in zip(sources, manifests) if m.tokenizer_fingerprint != tok.fingerprint]
    if not repatched:
        return tok, None
    derived = {
        "from_max_patch_size": first.max_patch_size,
        "from_mode": first.mode,
        "max_patch_size": tok.max_patch_size,
        "mode": tok.mode,
        "merges": len(tok.merges),
        "vocab_size": tok.vocab_size,
        "seconds": round(time.perf_counter() - t, 3) if retrain else 0.0,
    }
    asked = "data.max_patch_size/data.mode" if retrain else f"data.tokenizer={cfg.data.tokenizer}"
    # WARNING, not INFO: Python's default handler shows it, and another second stage than the shards' is
    # what a user comparing runs must not miss
    log.warning(
        "derived tokenizer: S=%d %s -> S=%d %s (%d second-stage merges, V'=%d, trained in %.1f s) from "
        "%s; the patches of %s are cut again from its tokens; its copy is saved with the run",
        first.max_patch_size,
        first.mode,
        tok.max_patch_size,
        tok.mode,
        len(tok.merges),
        tok.vocab_size,
        derived["seconds"],
        asked,
        ", ".join(repatched),
    )
    return tok, derived


def resolve_entropy_threshold(cfg: TrainConfig, tok: HierarchicalTokenizer) -> tuple[TrainConfig, Any | None]:
    """(cfg with model.patching.entropy_threshold set, the loaded EntropyModel) for io=entropy; (cfg, None) otherwise.

    A threshold asked for as a mean patch length is chosen on the training shards and written
    into the config: hbpe_run.json records it for eval and generation, and autoresume, which
    chooses it again from the same samples, finds the same value. So are the entropy model's
    resolved path and fingerprint (entropy_files.py: the run keeps a checked copy of it).
    """

    model_cfg = cfg.model
    if not scheme_spec(model_cfg).uses_entropy_model:
        return cfg, None

    entropy = load_entropy_model(model_cfg.patching.entropy_model)
    resolved = resolve_entropy_model(model_cfg, entropy)
    cfg = dataclasses.replace(cfg, model=resolved)
    if model_cfg.patching.entropy_threshold is not None:
        return cfg, entropy
    threshold = threshold_on_shards(model_cfg, tok, cfg.data.train_sources[0], entropy)
    return dataclasses.replace(cfg, model=cfg.model.with_patching(entropy_threshold=threshold)), entropy
