"""hierarchical (the paper's model): BPE patches of the second-stage tokenizer, S symbols over V' each."""

from __future__ import annotations

from typing import Any

from hbpe.schemas.symbols import PAD
from hbpe.schemas.train_config import ModelConfig
from hbpe.training.data.schemes import TokenScheme
from hbpe.training.inference.zero_shot.pairs import PairScheme, hierarchical_pair
from hbpe.training.model.patch_io import HierarchicalPatchIO
from hbpe.training.schemes.registry import SchemeSpec, register_scheme


class HierarchicalSpec(SchemeSpec):
    name = "hierarchical"
    tokenizer_patches = True

    def build_io(self, cfg: ModelConfig, vocab: Any) -> HierarchicalPatchIO:
        return HierarchicalPatchIO(cfg, vocab_size=vocab.vocab_size, max_patch_size=vocab.max_patch_size)

    def batches(self, cfg: ModelConfig, tok: Any, *, derive: bool, entropy: Any = None) -> TokenScheme:
        return TokenScheme(tok, derive)

    def label(self, cfg: ModelConfig) -> str:
        return "BPE-patch"

    def prompt_patches(self, symbols: Any, prompt: str) -> list[list[int]]:
        return [row[row != PAD].tolist() for row in symbols.patches(symbols.encode(prompt))]

    def pair_scheme(self, model: Any, tok: Any) -> PairScheme:
        return PairScheme(self.name, hierarchical_pair(tok), {"patches": PAD}, (PAD,))


register_scheme(HierarchicalSpec())
