"""Next-byte entropies from a small byte-level LM, for entropy patching (as in BLT).

No pretrained entropy model is reachable offline, so ours is an hbpe model trained with
`model.io=bytes` on the same shards; `model.patching.entropy_model` names its checkpoint (kept with the
run and its exports, and checked, by entropy_files.py). Entropies
are computed in the loader, batch by batch, where the byte model is a few percent of a
training step at the mini sizes (README: `hbpe bench train` per scheme); a shard column
would fix the entropy model and threshold at conversion time, which an experiment sweeps.

The global threshold is given (`model.patching.entropy_threshold`) or chosen on a sample of the
training shards so the mean patch length reaches `model.patching.entropy_target_bytes`; the chosen
value is written into the run's model config, so eval and generation cut the same patches.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hbpe.schemas.errors import ConfigError
from hbpe.schemas.symbols import EOD, TOKEN_EOD, TOKEN_PAD
from hbpe.training.schemes.registry import scheme_spec

log = logging.getLogger(__name__)


class EntropyModel:
    """A `bytes`-scheme PatchLM used read-only to score next-byte entropies.

    `source` is where it was loaded from (resolved: absolute, or a URI) and `tok` its tokenizer, which
    entropy_files.py writes with it into a run folder or an export.
    """

    def __init__(self, model: torch.nn.Module, *, source: str, tok: Any = None) -> None:
        if not scheme_spec(model.cfg).next_byte:
            raise ConfigError(
                f"model.patching.entropy_model={source} is a model.io={model.cfg.io} checkpoint; entropy patching needs a "
                "byte-level model: train one with model.io=bytes on the same shards and name its checkpoint"
            )
        self.model, self.source, self.tok = model.eval(), source, tok
        self.device = next(model.parameters()).device

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
