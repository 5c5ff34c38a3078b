"""KV caches reproduce full recomputation numerically (fp32), not only under greedy argmax.

The model has 3 layers everywhere and weights scaled well beyond the 0.02 init, so a
wrong RoPE position or a stale key shows up as a large difference in the states.
"""

from __future__ import annotations

import pytest
import torch

from hbpe.schemas.symbols import EOD, PAD
from hbpe.schemas.train_config import model_config
from hbpe.training.model.build import build_model
from hbpe.training.model.layers import KVCache
from hbpe.training.model.patch_lm import VocabSpec

VARIANTS = [("prefix", "mean"), ("prefix", "eop"), ("add", "mean"), ("add", "eop")]
TOL = 1e-5


def _scaled_model(tok, conditioning: str, pooling: str):
    torch.manual_seed(1)
    cfg = model_config(
        "tiny", latent_layers=3, encoder_layers=3, decoder_layers=3, conditioning=conditioning, pooling=pooling
    )
    model = build_model(cfg, VocabSpec.from_tokenizer(tok))
    with torch.no_grad():
        for p in model.parameters():  # far from the init: every layer changes its input noticeably
            p.copy_(torch.randn_like(p) * (0.1 if p.ndim > 1 else 0.3) + (1.0 if p.ndim == 1 else 0.0))
    return model.eval()


def _context(tok, text: str) -> torch.Tensor:
    patches = tok.patches(tok.encode(text))
    eod = torch.full((1, tok.max_patch_size), PAD)
    eod[0, 0] = EOD
    return torch.cat([eod, torch.from_numpy(patches.astype("int64"))])[None]  # (1, T, S)


@pytest.mark.parametrize("conditioning,pooling", VARIANTS)
@torch.no_grad()
def test_latent_prefill_and_steps_equal_recomputation(gpt2_tokenizer, conditioning, pooling):
    model = _scaled_model(gpt2_tokenizer, conditioning, pooling)
    patches = _context(gpt2_tokenizer, "Mr. Speaker, the state of our Union is strong, and growing stronger.")
    T = patches.shape[1]
    e = model.io.encode_patches(patches)  # (1, T, D)
    full = model.latent_step(e, None)  # (1, T, D)
    assert full.abs().max() > 0.5  # non-trivial states, so a tolerance of 1e-5 means something

    cache = KVCache()
    prefill = 5
    parts = [model.latent_step(e[:, :prefill], cache)]
    for t in range(prefill, T):
        parts.append(model.latent_step(e[:, t : t + 1], cache))
    cached = torch.cat(parts, dim=1)
    assert cache.length == T
    assert (cached - full).abs().max().item() < TOL


@pytest.mark.parametrize("conditioning,pooling", VARIANTS)
@torch.no_grad()
def test_decoder_cached_logits_equal_the_training_forward(gpt2_tokenizer, conditioning, pooling):
    """Symbol by symbol with a cache == without a cache == the logits `forward` trains on."""
    tok = gpt2_tokenizer
    model = _scaled_model(tok, conditioning, pooling)
    patches = _context(tok, "We the People of the United States, in Order to form a more perfect Union")
    batch = {"patches": patches, "tokens": torch.zeros(patches.shape[:2], dtype=torch.long)}
    logits, _ = model(batch)  # (real target symbols, V): the packed local decoder has no PAD rows
    T, S = patches.shape[1] - 1, tok.max_patch_size
    train_logits = logits.new_full((T * S, logits.shape[-1]), float("nan"))
    train_logits[model.io.decoded_slots(batch)] = logits
    train_logits = train_logits.view(T, S, -1)  # patch t+1 predicted from h_t

    h = model.latent_step(model.io.encode_patches(patches[:, :-1]), None)[0]  # (T, D)
    for t in (0, T // 2, T - 1):
        target = patches[0, t + 1]
        n = int((target != PAD).sum())
        cache = KVCache()
        for k in range(n):
            prefix = target[:k][None]  # (1, k)
            with_cache = model.io.symbol_logits(h[t : t + 1], prefix, cache)[0]
            without = model.io.symbol_logits(h[t : t + 1], prefix, None)[0]
            assert (with_cache - without).abs().max().item() < TOL, (t, k)
            assert (without - train_logits[t, k]).abs().max().item() < TOL, (t, k)
        assert cache.length == n
