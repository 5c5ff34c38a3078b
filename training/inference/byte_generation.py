"""Generation for the byte-level baselines.

`space` and `entropy` models read and write patches of bytes + EOP (V' = 259, no merges), so
they generate through training/inference/generate.py like the paper's model: `ByteSymbols` stands in for
the tokenizer there (the prompt cut by the scheme's rule, a patch closed by EOP, a patch that
reaches S symbols without EOP split into patches that fit). Their patches are self-delimiting:
the local decoder ends each one, so the entropy model is needed only to cut the prompt.

`bytes` models predict one byte per latent position: `generate_bytes` samples a byte at a time
with the latent model's KV cache (or, without it, recomputing the whole context each step).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from hbpe.schemas.symbols import EOD, EOP, NUM_BYTES, PAD, TOKEN_EOD
from hbpe.training.checkpoint.load import load_entropy_model
from hbpe.training.data.byte_patching import BYTE_VOCAB, natural_starts, patch_limit, patch_starts, to_patches
from hbpe.training.model.layers import KVCache


class ByteSymbols:
    """The tokenizer interface generate.py uses, over bytes + EOP/PAD/EOD for space and entropy models."""

    def __init__(self, cfg, entropy=None) -> None:
        self.limit = patch_limit(cfg)
        self.max_patch_size = self.limit + 1  # bytes + EOP
        self.cfg, self.entropy = cfg, entropy
        self.symbol_ends_patch = [s == EOP for s in range(BYTE_VOCAB)]

    def prompt_patches(self, prompt: str) -> list[list[int]]:
        """The prompt's patches (without the leading document marker), cut by the model's scheme."""
        data = prompt.encode("utf-8")
        if not data:
            return []
        units = np.concatenate([[EOD], np.frombuffer(data, dtype=np.uint8)]).astype(np.int32)
        natural = natural_starts(units, self.entropy, self.cfg.entropy_threshold)
        cut = to_patches(units, 1, patch_starts(units, 1, natural, self.limit), self.max_patch_size)
        return [[int(s) for s in row if s != PAD] for row in cut.patches[1:]]

    @staticmethod
    def decode_symbols_bytes(symbols) -> bytes:
        return bytes(int(s) for s in symbols if s < NUM_BYTES)

    def encode_bytes(self, data: bytes) -> list[list[int]]:
        """Bytes of a patch that reached S symbols without EOP -> patches of at most `limit` bytes + EOP."""
        return [[*data[i : i + self.limit], EOP] for i in range(0, len(data), self.limit)]


def byte_symbols_for(model) -> ByteSymbols:
    entropy = None
    if model.cfg.io == "entropy":
        entropy = load_entropy_model(model.cfg.entropy_model)
    return ByteSymbols(model.cfg, entropy)


@torch.inference_mode()
def generate_bytes(model, row, sampling, *, use_cache: bool, choose) -> None:
    """Continue one `_Row` of generate.py a byte at a time; each byte is a patch of one symbol for its bookkeeping."""
    io, device = model.io, next(model.parameters()).device
    t0 = time.perf_counter()
    ids = [TOKEN_EOD, *row.prompt.encode("utf-8")]
    pad_id = io.n_vocab + TOKEN_EOD + 1  # BPEEmbeddingIO's PAD row: never predicted
    eod_id = io.n_vocab  # TOKEN_EOD's row
    cache = KVCache() if use_cache else None

    def latent_last(new: list[int]) -> torch.Tensor:
        x = io.embed(io._ids(torch.tensor([new], dtype=torch.long, device=device)))
        return model.latent_step(x, cache)[:, -1]  # (1, D)

    h = latent_last(ids)
    while True:
        logits = io.head(h)[0].float()
        logits[pad_id] = float("-inf")
        b = choose(logits, sampling, row.gen)
        symbols = [EOD] if b == eod_id else [b]
        if row.finish_patch(symbols, _BYTES, t0) is None:
            return
        ids.append(b)
        h = latent_last([b] if use_cache else ids)


class _ByteLevel:
    """What _Row.finish_patch reads for a byte model: every byte is a whole position, never split."""

    symbol_ends_patch = [True] * BYTE_VOCAB
    decode_symbols_bytes = staticmethod(ByteSymbols.decode_symbols_bytes)


_BYTES = _ByteLevel()
