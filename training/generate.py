"""Generation, patch by patch: the local decoder emits symbols until EOP (or S of them), the
patch is encoded by the local encoder, and the latent model advances one position.

With `use_cache` the latent model and the local decoder keep KV caches; without it both
recompute from scratch at every step (the reference the cache must match exactly).

A patch that reaches S symbols without EOP is closed by the tokenizer's out-of-vocabulary
rule: its bytes are re-encoded with `encode_bytes` (greedy split into patches that fit S),
and each resulting patch advances the latent model. EOD ends generation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from schemas.errors import HbpeError
from schemas.symbols import EOD, PAD
from training.layers import KVCache
from training.model import PatchLM


@dataclass
class Generation:
    text: str
    new_bytes: int
    patches: int
    symbols: int
    seconds: float
    stopped: str  # "max_bytes", "eod", "max_patches"


def _pad(patch: list[int], S: int) -> list[int]:
    return patch + [PAD] * (S - len(patch))


@torch.no_grad()
def generate(
    model: PatchLM,
    tok,
    prompt: str,
    *,
    max_bytes: int = 200,
    temperature: float = 0.0,
    use_cache: bool = True,
    seed: int = 0,
    max_patches: int | None = None,
) -> Generation:
    if model.cfg.io != "hierarchical":
        raise HbpeError(
            "generation is implemented for the hierarchical (BPE-patch) model; this checkpoint has model.io=bpe"
        )
    io, S, device = model.io, tok.max_patch_size, next(model.parameters()).device
    gen = torch.Generator(device="cpu").manual_seed(seed)
    t0 = time.perf_counter()
    context = [[EOD]] + [row[row != PAD].tolist() for row in tok.patches(tok.encode(prompt))]
    lat_cache = KVCache() if use_cache else None

    def patches_tensor(ps: list[list[int]]) -> torch.Tensor:
        return torch.tensor([[_pad(p, S) for p in ps]], dtype=torch.long, device=device)  # (1, T, S)

    h = model.latent_step(io.encode_patches(patches_tensor(context)), lat_cache)[:, -1]  # (1, D)
    out_bytes, n_symbols, n_patches, stopped = b"", 0, 0, "max_bytes"
    limit = max_patches or max(4 * max_bytes, 16)
    while len(out_bytes) < max_bytes:
        if n_patches >= limit:
            stopped = "max_patches"
            break
        symbols: list[int] = []
        dec_cache = KVCache() if use_cache else None
        while len(symbols) < S:
            prefix = torch.tensor([symbols], dtype=torch.long, device=device).reshape(1, len(symbols))
            logits = io.symbol_logits(h, prefix, dec_cache)[0].float()
            logits[PAD] = float("-inf")
            if temperature <= 0:
                s = int(logits.argmax())
            else:
                s = int(torch.multinomial(torch.softmax(logits / temperature, -1).cpu(), 1, generator=gen))
            symbols.append(s)
            if s == EOD or _ends_patch(tok, s):
                break
        n_symbols += len(symbols)
        if symbols[-1] == EOD:  # the model ends the document
            out_bytes += tok.decode_symbols_bytes(symbols[:-1])
            stopped = "eod"
            break
        data = tok.decode_symbols_bytes(symbols)
        new = [symbols] if _ends_patch(tok, symbols[-1]) else tok.encode_bytes(data)
        out_bytes += data
        n_patches += len(new)
        if use_cache:
            h = model.latent_step(io.encode_patches(patches_tensor(new)), lat_cache)[:, -1]
        else:
            context += new
            h = model.latent_step(io.encode_patches(patches_tensor(context)), None)[:, -1]
    return Generation(
        prompt + out_bytes.decode("utf-8", errors="replace"),
        len(out_bytes),
        n_patches,
        n_symbols,
        time.perf_counter() - t0,
        stopped,
    )


def _ends_patch(tok, s: int) -> bool:
    """EOP itself, or a merged symbol that contains EOP (full mode merges across it)."""
    return bool(tok.symbol_ends_patch[s])
