"""Generation, patch by patch: the local decoder emits symbols until EOP (or S of them), the
patch is encoded by the local encoder, and the latent model advances one position.

With `use_cache` the latent model and the local decoder keep KV caches; without it both
recompute from scratch at every step (the reference the cache must match exactly).

A patch that reaches S symbols without EOP is closed by the tokenizer's out-of-vocabulary
rule: its bytes are re-encoded with `encode_bytes` (greedy split into patches that fit S),
and each resulting patch advances the latent model. EOD ends generation.

Bounds: the output never holds more than `max_bytes` new bytes. A patch carries several
bytes (5 on average for gpt2), so the last one usually overshoots; it is cut at the last
whole UTF-8 character that fits, not at the patch boundary, which would lose up to a whole
token and leave `max_bytes=3` with nothing. Generation also stops when the latent context
(`model.max_patches` positions, prompt included) is full, so an absurd `max_bytes` (1e12)
ends there instead of growing the KV cache without end.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from hbpe.schemas.errors import ConfigError, HbpeError
from hbpe.schemas.symbols import EOD, PAD
from hbpe.training.layers import KVCache
from hbpe.training.model import PatchLM


@dataclass
class Generation:
    text: str
    new_bytes: int  # <= max_bytes
    patches: int  # generated patches (the last one may be cut to fit max_bytes)
    symbols: int
    seconds: float
    stopped: str  # "max_bytes", "eod", "max_patches" (the caller's limit), "context" (model.max_patches is full)


MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-4, 1e4
MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed takes a signed 64-bit seed


def check_generate_args(prompt: str, *, max_bytes: int, temperature: float, seed: int | None = None) -> None:
    """The caller's arguments, checked before a model is loaded; one ConfigError each."""
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        # click hands undecodable argv bytes over as lone surrogates (U+DC80..U+DCFF = bytes 0x80..0xFF)
        c = ord(prompt[e.start])
        what = f"byte 0x{c - 0xDC00:02x}" if 0xDC80 <= c <= 0xDCFF else f"lone surrogate U+{c:04X}"
        raise ConfigError(
            f"the prompt is not valid UTF-8 ({what} at character {e.start}); pass UTF-8 text "
            "(a terminal or file in another encoding: convert it, e.g. with iconv -t UTF-8)"
        ) from None
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ConfigError(f"max_bytes={max_bytes!r}: must be an integer >= 1; e.g. --max-bytes 200")
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
        raise ConfigError(
            f"temperature={temperature!r}: must be a finite number >= 0 (0 = greedy); e.g. --temperature 0.8"
        )
    if temperature != 0 and not MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE:
        # logits / 1e-40 overflows float32 to inf (softmax: nan), / 1e308 underflows to a uniform draw
        raise ConfigError(
            f"temperature={temperature!r}: must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}]; "
            "e.g. --temperature 0.8 (use 0 for the most likely symbol)"
        )
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED):
        raise ConfigError(f"seed={seed!r}: must be an integer in 0..{MAX_SEED} (torch's generator); e.g. --seed 0")


def cut_utf8(data: bytes, limit: int) -> bytes:
    r"""`data[:limit]`, moved back to the start of a UTF-8 character it would split.

    b"caf\xc3\xa9", limit 4 -> b"caf" (not b"caf\xc3"). Bytes that are not UTF-8 (a model can emit
    any) are cut at `limit`.
    """
    if len(data) <= limit:
        return data
    cut = limit
    while cut > max(limit - 3, 0) and data[cut] & 0xC0 == 0x80:  # a continuation byte: the character began earlier
        cut -= 1
    return data[:cut] if data[cut] & 0xC0 != 0x80 else data[:limit]


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
    check_generate_args(prompt, max_bytes=max_bytes, temperature=temperature, seed=seed)
    io, S, device = model.io, tok.max_patch_size, next(model.parameters()).device
    gen = torch.Generator(device="cpu").manual_seed(seed)
    t0 = time.perf_counter()
    context = [[EOD]] + [row[row != PAD].tolist() for row in tok.patches(tok.encode(prompt))]
    room = model.cfg.max_patches - len(context)  # latent positions left for generated patches
    if room < 1:
        raise ConfigError(
            f"the prompt is {len(context) - 1} patches and the model's latent context holds {model.cfg.max_patches} "
            "(model.max_patches) with the document marker; shorten the prompt"
        )
    lat_cache = KVCache() if use_cache else None

    def patches_tensor(ps: list[list[int]]) -> torch.Tensor:
        return torch.tensor([[_pad(p, S) for p in ps]], dtype=torch.long, device=device)  # (1, T, S)

    h = model.latent_step(io.encode_patches(patches_tensor(context)), lat_cache)[:, -1]  # (1, D)
    out_bytes, n_symbols, n_patches = b"", 0, 0
    limit = max_patches or max(4 * max_bytes, 16)
    while True:
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
        # stop before advancing the latent model: the next patch would not be used
        if len(out_bytes) >= max_bytes:
            stopped = "max_bytes"
            break
        if n_patches >= limit:
            stopped = "max_patches"
            break
        if n_patches > room:
            stopped = "context"
            break
        if use_cache:
            h = model.latent_step(io.encode_patches(patches_tensor(new)), lat_cache)[:, -1]
        else:
            context += new
            h = model.latent_step(io.encode_patches(patches_tensor(context)), None)[:, -1]
    out_bytes = cut_utf8(out_bytes, max_bytes)
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
