"""bytes (the byte-level baseline): one byte per latent position, an embedding matrix and a head over 256 bytes."""

from __future__ import annotations

from typing import Any

from hbpe.schemas.symbols import NUM_BYTES, TOKEN_PAD
from hbpe.schemas.train_config import ModelConfig
from hbpe.training.data.schemes import ByteScheme, vocabulary_bytes
from hbpe.training.inference.zero_shot.pairs import PairScheme, bytes_pair
from hbpe.training.model.patch_io import BPEEmbeddingIO
from hbpe.training.schemes.bpe import pad_row
from hbpe.training.schemes.registry import SchemeSpec, register_scheme


class BytesSpec(SchemeSpec):
    name = "bytes"
    embedding = True
    next_byte = True
    per_position_generation = True

    def build_io(self, cfg: ModelConfig, vocab: Any) -> BPEEmbeddingIO:
        return BPEEmbeddingIO(cfg, n_vocab=NUM_BYTES)

    def batches(self, cfg: ModelConfig, tok: Any, *, derive: bool, entropy: Any = None) -> ByteScheme:
        return ByteScheme(vocabulary_bytes(tok))

    def label(self, cfg: ModelConfig) -> str:
        return "byte level"

    def generation_symbols(self, model: Any, tok: Any) -> None:
        return None  # byte_generation.generate_bytes reads bytes, no symbols

    def prompt_patches(self, symbols: Any, prompt: str) -> list[list[int]]:
        return [[b] for b in prompt.encode("utf-8")]  # one latent position per byte

    def pair_scheme(self, model: Any, tok: Any) -> PairScheme:
        return PairScheme(self.name, bytes_pair(), {"tokens": TOKEN_PAD}, (pad_row(model),))


register_scheme(BytesSpec())
