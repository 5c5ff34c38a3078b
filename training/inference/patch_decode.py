"""The next patch of each row from the KV-cached model, and the patches the latent model reads after it.

`hbpe generate` (generate.py) and the generate() of `hbpe export --format hf` folders (which ship a copy of
this module and of kv_decode.py, training/checkpoint/hf_library.py) both decode with this code: a patch is
the local decoder's symbols, chosen one at a time (sampling.py), until a symbol that closes the patch (EOP,
or a merge holding it), EOD, or S of them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from hbpe.schemas.symbols import EOD, PAD
from hbpe.training.inference.kv_decode import CachedPatchLM
from hbpe.training.inference.sampling import Sampling, check_finite_top


def decode_patches(
    m: CachedPatchLM,
    h: torch.Tensor,
    *,
    ends: Sequence[bool],
    max_patch_size: int,
    sampling: Sampling,
    gens: Sequence[torch.Generator | None],
    closes: Callable[[int, list[int]], bool] | None = None,
) -> list[list[int]]:
    """One patch per row after h (B, D): symbols until a symbol that `ends` a patch, EOD, max_patch_size of them,
    or `closes(row, symbols)` (a byte scheme's patcher). Row i draws from `gens[i]` (None: torch's global generator).

    Rows advance in lockstep; a row whose patch is closed keeps a place in the batch (its
    further symbols are not read) until every row's patch is.
    """
    out: list[list[int]] = [[] for _ in gens]
    open_rows = list(range(len(gens)))
    logits = m.decoder_start(h)  # (B, V)
    while True:  # logits (B, V) in fp32 with PAD at -inf (kv_decode)
        if sampling.greedy:
            top, chosen = logits.max(-1)  # (B,) each: argmax, and its logit (NaN or inf when the row has one)
            picked = chosen.tolist()
            check_finite_top(top.tolist())
        else:
            picked = [PAD] * len(gens)
            for i in open_rows:
                picked[i] = sampling.choose(logits[i], gens[i])
            chosen = torch.tensor(picked, dtype=torch.long, device=logits.device)
        still = []
        for i in open_rows:
            s = picked[i]
            out[i].append(s)
            closed = s == EOD or ends[s] or len(out[i]) >= max_patch_size or (closes is not None and closes(i, out[i]))
            if not closed:
                still.append(i)
        if not still:
            return out
        open_rows = still
        logits = m.decoder_next(chosen)


def next_patches(symbols: list[int], data: bytes, tok: Any) -> list[list[int]]:
    """What the latent model reads after a decoded patch (not ended by EOD) whose bytes are `data`: the patch as it
    is when its last symbol closes it (`tok.symbol_ends_patch`), else (S symbols without EOP, or a patcher's cut)
    the bytes re-encoded by the tokenizer's out-of-vocabulary rule (`tok.encode_bytes`: greedy patches that fit S;
    read only then, as byte symbols, whose every patch closes, have none)."""
    return [symbols] if tok.symbol_ends_patch[symbols[-1]] else tok.encode_bytes(data)


# intra-op threads pay off above about a million multiply-adds per matmul; below, a step's ops
# are microseconds long and a second thread only adds synchronisation. Measured on 2 busy cores:
# F.linear (3, 64) x (64, 192) takes 4 us on one thread and 3.9 ms on two (OpenMP waiting for a
# descheduled thread), which made a cached step of the tiny model 100x slower.
_MIN_MACS_FOR_THREADS = 1 << 20


@contextlib.contextmanager
def op_threads(cfg: Any, device: torch.device, rows: int) -> Iterator[None]:
    """One intra-op thread on CPU while a cached step's largest matmul is small (`cfg`: the model's ModelConfig);
    torch's setting restored after."""
    macs = rows * max(cfg.latent_dim * max(3 * cfg.latent_dim, cfg.latent_ffn), cfg.local_dim * 3 * cfg.local_dim)
    before = torch.get_num_threads()
    if device.type != "cpu" or macs >= _MIN_MACS_FOR_THREADS or before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
