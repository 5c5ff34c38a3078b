"""bpe (the embedding baseline): one first-stage token per latent position, an embedding matrix and a head."""

from __future__ import annotations

from typing import Any

from hbpe.schemas.errors import HbpeError
from hbpe.schemas.symbols import TOKEN_EOD, TOKEN_PAD
from hbpe.schemas.train_config import ModelConfig
from hbpe.training.data.schemes import TokenScheme
from hbpe.training.inference.zero_shot.pairs import PairScheme, bpe_pair
from hbpe.training.model.patch_io import BPEEmbeddingIO
from hbpe.training.schemes.registry import SchemeSpec, register_scheme


class BPESpec(SchemeSpec):
    name = "bpe"
    embedding = True

    def build_io(self, cfg: ModelConfig, vocab: Any) -> BPEEmbeddingIO:
        return BPEEmbeddingIO(cfg, n_vocab=vocab.n_vocab)

    def batches(self, cfg: ModelConfig, tok: Any, *, derive: bool, entropy: Any = None) -> TokenScheme:
        return TokenScheme(tok, derive)

    def label(self, cfg: ModelConfig) -> str:
        return "BPE"

    def generation_symbols(self, model: Any, tok: Any) -> Any:
        raise HbpeError(
            "generation is implemented for the patch models (hierarchical, space, entropy) and bytes; "
            "this checkpoint has model.io=bpe (the embedding baseline), whose samples hbpe does not decode"
        )

    def pair_scheme(self, model: Any, tok: Any) -> PairScheme:
        return PairScheme(self.name, bpe_pair(tok), {"tokens": TOKEN_PAD}, (pad_row(model),))


def pad_row(model: Any) -> int:
    """BPEEmbeddingIO maps TOKEN_PAD to the id n_vocab + 1: a row of the head that text never holds."""
    return model.io.n_vocab + TOKEN_EOD - TOKEN_PAD


register_scheme(BPESpec())
