"""space (BLT's space patching): patches of bytes (+ EOP) through the paper's local models, no merges.

The byte-patch schemes share this spec's hooks: entropy.py changes only where the patches are cut
(and so their longest patch), and a new patcher subclasses SpaceSpec the same way.
"""

from __future__ import annotations

from typing import Any

from hbpe.schemas.symbols import EOP, PAD
from hbpe.schemas.train_config import ModelConfig
from hbpe.training.data.byte_patching import BYTE_VOCAB
from hbpe.training.data.schemes import BytePatchScheme, vocabulary_bytes
from hbpe.training.inference.byte_generation import ByteSymbols
from hbpe.training.inference.zero_shot.pairs import PairScheme, byte_patch_pair
from hbpe.training.model.patch_io import HierarchicalPatchIO
from hbpe.training.schemes.registry import SchemeSpec, register_scheme


class SpaceSpec(SchemeSpec):
    name = "space"
    byte_patches = True

    def max_patch_bytes(self, cfg: ModelConfig) -> int:
        """The longest patch in bytes the patcher cuts (a longer run of bytes is split)."""
        return cfg.patching.max_bytes

    def symbols_per_patch(self, cfg: ModelConfig) -> int:
        """S: the longest patch's bytes, + EOP with model.patching.boundaries=eop (the one place it is computed)."""
        return self.max_patch_bytes(cfg) + eop(cfg)

    def patcher_model(self, cfg: ModelConfig) -> Any:
        """What the patcher reads besides the bytes (entropy: the byte LM); space patching needs nothing."""
        return None

    def build_io(self, cfg: ModelConfig, vocab: Any) -> HierarchicalPatchIO:
        return HierarchicalPatchIO(
            cfg, vocab_size=BYTE_VOCAB, max_patch_size=self.symbols_per_patch(cfg), byte_patches=True
        )

    def batches(self, cfg: ModelConfig, tok: Any, *, derive: bool, entropy: Any = None) -> BytePatchScheme:
        vocab = vocabulary_bytes(tok)
        return BytePatchScheme(vocab, cfg.patching.max_bytes, width=self.symbols_per_patch(cfg), eop=eop(cfg))

    def label(self, cfg: ModelConfig) -> str:
        return f"space patch, max {cfg.patching.max_bytes}"

    def generation_symbols(self, model: Any, tok: Any) -> ByteSymbols:
        return ByteSymbols(model.cfg, self.patcher_model(model.cfg))  # bytes (+ EOP), cut by the model's patcher

    def prompt_patches(self, symbols: Any, prompt: str) -> list[list[int]]:
        return symbols.prompt_patches(prompt)

    def cached_generation(self, cfg: ModelConfig) -> bool:
        return (
            not cfg.patching.hash_ngram_buckets
        )  # kv_decode's encoder has no hash n-gram tables: the modules' path has

    def never_generated(self, cfg: ModelConfig) -> tuple[int, ...]:
        return () if eop(cfg) else (EOP,)  # given boundaries: EOP is never a target, the patcher ends a patch

    def pair_scheme(self, model: Any, tok: Any) -> PairScheme:
        encode = byte_patch_pair(model.cfg, self.patcher_model(model.cfg))
        return PairScheme(self.name, encode, {"patches": PAD}, (PAD, *self.never_generated(model.cfg)))


def eop(cfg: ModelConfig) -> bool:
    """model.patching.boundaries=eop: each text patch ends with an EOP symbol the decoder predicts."""
    return cfg.patching.boundaries == "eop"


register_scheme(SpaceSpec())
