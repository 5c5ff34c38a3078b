"""How each scheme (`model.io`) turns rows of the `tokens` column into the model's batch.

    hierarchical  patches (B, N, S) over V' symbols: stored, or derived with the run's tokenizer
    bpe           tokens (B, N): first-stage ids, EOD -1, PAD -2
    bytes         tokens (B, L): byte ids, EOD -1, PAD -2; L = the longest sample's bytes + markers
    space         patches (B, T, W) over bytes + EOP/PAD/EOD, cut by space patching
    entropy       patches (B, T, W), cut where a byte LM's next-byte entropy exceeds a threshold

Every batch also carries `target_bytes` (B,): UTF-8 bytes of the text the sample predicts,
the same for every scheme (tokens 2..N: training/data/byte_patching.py), so BPB compares them;
`first_target` (B,): positions before it are context (the latent predicts position j + 1 from
position j; a prediction of a position < first_target is not scored); and `text_positions`
(B,): the predicted latent positions that hold text, for bytes per patch.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from typing import Protocol

import numpy as np

from hbpe.schemas.symbols import EOD, PAD, TOKEN_EOD, TOKEN_PAD
from hbpe.schemas.train_config import ModelConfig
from hbpe.training.data.byte_patching import (
    UNBOUNDED_SAFETY_LIMIT,
    VocabularyBytes,
    entropy_starts,
    patch_starts,
    sample_units,
    space_starts,
    to_patches,
)
from hbpe.training.data.tile_layout import tile_batch, tile_width
from hbpe.training.schemes.registry import scheme_spec


class Scheme(Protocol):
    def batch(self, tokens: np.ndarray, stored_patches: np.ndarray | None) -> dict[str, np.ndarray]: ...


def vocabulary_bytes(tok) -> VocabularyBytes:
    enc = tok.encoding
    return VocabularyBytes.from_token_bytes([enc.decode_single_token_bytes(t) for t in range(enc.max_token_value + 1)])


@dataclass
class TokenScheme:
    """hierarchical and bpe: one latent position per first-stage token."""

    tok: object
    derive: bool  # hierarchical: patches = run tokenizer applied to `tokens` (another S or mode)

    def batch(self, tokens: np.ndarray, stored_patches: np.ndarray | None) -> dict[str, np.ndarray]:
        patches = self.tok.patches(tokens) if self.derive or stored_patches is None else stored_patches
        B = len(tokens)
        return {
            "patches": patches,
            "tokens": tokens,
            "target_bytes": np.take(self.tok.token_nbytes, tokens[:, 1:], axis=0).sum(axis=1),
            "first_target": np.ones(B, dtype=np.int64),
            "text_positions": (tokens[:, 1:] >= 0).sum(axis=1),
        }


@dataclass
class ByteScheme:
    """bytes: one latent position per byte (embedding and head over 256 bytes + markers)."""

    vocab: VocabularyBytes

    def batch(self, tokens: np.ndarray, stored_patches: np.ndarray | None = None) -> dict[str, np.ndarray]:
        samples = [sample_units(row, self.vocab) for row in tokens]
        L = max(len(s.units) for s in samples)
        ids = np.full((len(samples), L), TOKEN_PAD, dtype=np.int64)
        for i, s in enumerate(samples):
            ids[i, : len(s.units)] = np.where(s.units == EOD, TOKEN_EOD, s.units)
        text = [(s.units[s.context :] != EOD).sum() for s in samples]
        return {
            "tokens": ids,
            "target_bytes": np.array(text, dtype=np.int64),
            "first_target": np.array([max(s.context, 1) for s in samples], dtype=np.int64),
            "text_positions": np.array(text, dtype=np.int64),
        }


@dataclass
class BytePatchScheme:
    """space and entropy: patches of bytes + EOP, read by the paper's local encoder and decoder."""

    vocab: VocabularyBytes
    max_bytes: int | None  # None: unbounded (entropy), split only at UNBOUNDED_SAFETY_LIMIT
    entropy: object | None = None  # io=entropy: anything with `entropies(units) -> list[array]` (EntropyModel)
    threshold: float | None = None
    forced_splits: int = 0  # unbounded patches split at the safety limit (reported, not hidden)
    eop: bool = True  # model.patching.boundaries=eop: each text patch ends with EOP; given: bytes only
    _: KW_ONLY
    width: int  # symbols of a patch row: the scheme's symbols_per_patch (training/schemes/space.py)

    def batch(self, tokens: np.ndarray, stored_patches: np.ndarray | None = None) -> dict[str, np.ndarray]:
        samples = [sample_units(row, self.vocab) for row in tokens]
        if self.entropy is not None:
            ents = self.entropy.entropies([s.units for s in samples])
            natural = [entropy_starts(e, self.threshold) for e in ents]
        else:
            natural = [space_starts(s.units) for s in samples]
        limit = self.max_bytes or UNBOUNDED_SAFETY_LIMIT
        cut = []
        for s, st in zip(samples, natural, strict=True):
            starts = patch_starts(s.units, s.context, st, limit)
            if self.max_bytes is None:
                self.forced_splits += int((starts & ~patch_starts(s.units, s.context, st, 1 << 30)).sum())
            cut.append(to_patches(s.units, s.context, starts, self.width, eop=self.eop))
        T = max(len(p.patches) for p in cut)
        W = self.width if self.max_bytes else max(int((p.patches != PAD).sum(1).max()) for p in cut)
        patches = np.full((len(cut), T, W), PAD, dtype=np.int64)
        text_positions = []
        for i, p in enumerate(cut):
            patches[i, : len(p.patches)] = p.patches[:, :W]
            text_positions.append(int((p.patches[p.context :, 0] != EOD).sum()))
        return {
            "patches": patches,
            "target_bytes": np.array([p.text_bytes for p in cut], dtype=np.int64),
            "first_target": np.array([max(p.context, 1) for p in cut], dtype=np.int64),
            "text_positions": np.array(text_positions, dtype=np.int64),
        }


def build_scheme(cfg: ModelConfig, tok, *, derive: bool, entropy_model: object | None = None) -> Scheme:
    """The batch builder of `cfg.io`'s scheme (`entropy_model`: an EntropyModel already loaded, e.g. by the trainer)."""
    return scheme_spec(cfg).batches(cfg, tok, derive=derive, entropy=entropy_model)


# the longest tile (training/data/tile_layout.py) `auto` lays out: a tile's W x W attention scores per row grow with W,
# and byte patches of up to 1,025 bytes would make every tile that wide; longer patches keep the blocks path
AUTO_TILE_WIDTH = 64


def tiles_apply(cfg: ModelConfig, *, device: str, symbols_per_patch: int | None = None) -> bool:
    """Whether the loader lays out the packing (training/data/tile_layout.py) for a model of `cfg` on `device`.

    `packed_attention: tiles` always; `auto` on an accelerator (on CPU the native kernel is faster and has no
    device to wait for) with patches of at most AUTO_TILE_WIDTH symbols; never for padded local models or the
    schemes without them.
    """
    if scheme_spec(cfg).embedding or cfg.local_layout != "packed":
        return False
    if cfg.packed_attention == "tiles":
        return True
    narrow = symbols_per_patch is None or tile_width(symbols_per_patch) <= AUTO_TILE_WIDTH
    return cfg.packed_attention == "auto" and device not in ("cpu", "auto") and narrow


def symbols_per_patch(cfg: ModelConfig, tok) -> int | None:
    """S of the patches a model of `cfg` reads (the tokenizer's, or a byte scheme's longest), None without patches."""
    spec = scheme_spec(cfg)
    if spec.embedding:
        return None
    return spec.symbols_per_patch(cfg) if spec.byte_patches else tok.max_patch_size


@dataclass
class TiledScheme:
    """A scheme's batches plus the loader's packing of their patches (training/data/tile_layout.py), computed here in
    the loader's worker so that the step reads fixed-size indices and never waits for the device.

    `group`: samples per layout, the device microbatch (Composer splits a batch by samples); None: the batch.
    """

    inner: Scheme
    group: int | None = None

    def batch(self, tokens: np.ndarray, stored_patches: np.ndarray | None) -> dict[str, np.ndarray]:
        out = self.inner.batch(tokens, stored_patches)
        return {**out, **tile_batch(out["patches"], out["first_target"], group=self.group)}

    def __getattr__(self, name: str) -> object:  # the inner scheme's counters (forced_splits) and settings
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
