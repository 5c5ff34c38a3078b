"""model.patching.boundaries for the space and entropy baselines: `eop` (each patch ends with an EOP the
decoder predicts) and `given` (BLT's setup: the patcher gives the boundaries, only bytes are predicted)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hbpe.pipeline.shards.reader import ShardDir
from hbpe.schemas.errors import ConfigError
from hbpe.schemas.symbols import EOD, EOP, PAD
from hbpe.schemas.train_config import model_config
from hbpe.training.data.byte_patching import entropy_starts, patch_starts, space_starts, to_patches
from hbpe.training.data.schemes import BytePatchScheme, build_scheme, vocabulary_bytes
from hbpe.training.inference.byte_generation import ByteSymbols
from hbpe.training.model.build import build_model
from hbpe.training.model.patch_io import IGNORE, cross_entropy_sum
from hbpe.training.model.patch_lm import VocabSpec


class _CausalEntropy:
    """A stand-in entropy model that, like a byte LM, reads only the bytes before each position."""

    def entropies(self, units):
        out = []
        for u in units:
            e = np.zeros(len(u), dtype=np.float32)
            e[1:] = (u[:-1] * 7919) % 97 / 20.0
            out.append(e)
        return out


@pytest.fixture(scope="module")
def shard_rows(sample_shards):
    d = ShardDir(sample_shards[0])
    rows = [np.asarray(s["tokens"], dtype=np.int32) for _, s in zip(range(16), d.samples())]
    return d.tokenizer, np.stack(rows)


def _scheme(tok, io: str, boundaries: str):
    if io == "space":
        return build_scheme(model_config(io="space", patch_boundaries=boundaries), tok, derive=True)
    eop = boundaries == "eop"
    return BytePatchScheme(vocabulary_bytes(tok), 6, _CausalEntropy(), 2.5, eop=eop, width=6 + eop)


def test_given_boundaries_drop_eop_and_keep_every_byte():
    u = np.frombuffer(b"ab cd", dtype=np.uint8).astype(np.int32)
    starts = patch_starts(u, 1, space_starts(u), 6)
    eop, given = to_patches(u, 1, starts, 7), to_patches(u, 1, starts, 6, eop=False)
    assert given.patches[:, :3].tolist() == [[97, PAD, PAD], [98, 32, PAD], [99, 100, PAD]]
    assert (eop.patches == EOP).sum() == 3 and not (given.patches == EOP).any()
    assert (given.context, given.text_bytes) == (eop.context, eop.text_bytes) == (1, 4)
    with pytest.raises(ValueError, match="a patch of 4 bytes does not fit 3 symbols$"):  # "b cd", no EOP to fit
        to_patches(u, 1, patch_starts(u, 1, np.zeros(5, bool), 6), 3, eop=False)


@pytest.mark.parametrize("io", ["space", "entropy"])
@pytest.mark.parametrize("boundaries", ["eop", "given"])
def test_uniform_model_bpb_is_exact_with_either_boundary_mode(shard_rows, io, boundaries):
    """Zero head: every predicted symbol costs ln V; `given` predicts exactly the bytes and markers, `eop` an EOP more
    per text patch, over the same denominator (test_schemes.py runs the other schemes)."""
    tok, tokens = shard_rows
    scheme = _scheme(tok, io, boundaries)
    cfg = model_config("tiny", io=io, entropy_model="x.pt", entropy_threshold=2.5, patch_boundaries=boundaries)
    torch.manual_seed(0)
    model = build_model(cfg, VocabSpec.from_tokenizer(tok))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(30.0)
        model.io.decoder.head.weight.zero_()
    raw = scheme.batch(tokens, None)
    batch = {k: torch.from_numpy(np.asarray(v).astype(np.int64)) for k, v in raw.items()}
    logits, targets = model(batch)
    n = int((targets != IGNORE).sum())
    nbytes = int(batch["target_bytes"].sum())
    expected = np.take(tok.token_nbytes, tokens[:, 1:], axis=0).sum()
    assert nbytes == expected  # the one BPB denominator of every scheme
    bpb = float(cross_entropy_sum(logits, targets)) / math.log(2) / nbytes
    assert bpb == pytest.approx(n * math.log2(model.io.vocab_size) / nbytes, rel=1e-6)
    markers = int((tokens[:, 1:] == -1).sum())
    patches = int(raw["text_positions"].sum())
    assert n == nbytes + markers + (patches if boundaries == "eop" else 0)
    assert raw["patches"].shape[2] == 6 + (boundaries == "eop")


def test_patch_boundaries_is_checked():
    with pytest.raises(ConfigError, match=r"model.patching.boundaries.*given"):
        model_config(io="space", patch_boundaries="predicted")


@pytest.mark.parametrize("io", ["space", "entropy"])
def test_generation_cuts_patches_where_training_does(io):
    """Given boundaries: byte by byte, ByteSymbols.closes_patch ends each patch where the training cut does."""
    cfg = model_config(io=io, entropy_model="x.pt", entropy_threshold=2.5, patch_boundaries="given")
    syms = ByteSymbols(cfg, _CausalEntropy() if io == "entropy" else None)
    prompt, text = b"The Union", "Hello,  world: naïve 日本 1234567890abc; the state of it!".encode()
    units = np.array([EOD, *prompt, *text], dtype=np.int32)
    natural = space_starts(units) if io == "space" else entropy_starts(_CausalEntropy().entropies([units])[0], 2.5)
    cut = to_patches(units, 1 + len(prompt), patch_starts(units, 1 + len(prompt), natural, 6), 6, eop=False)
    expected = [[int(s) for s in row if s != PAD] for row in cut.patches[cut.context :]]
    got, patch, before = [], [], bytes(prompt)
    for b in text:
        patch.append(b)
        if syms.closes_patch(before, patch):
            got.append(patch)
            before += bytes(patch)
            patch = []
    got += [patch] if patch else []
    assert got == expected and len(got) > 5
    assert syms.max_patch_size == 6 and syms.never_symbols == [EOP]


def test_given_boundary_model_generates_the_same_with_and_without_the_kv_cache():
    """The cached path (kv_decode, EOP masked) and the modules' path end patches at the same bytes."""
    from hbpe.training import generate

    torch.manual_seed(0)
    model = build_model(model_config("tiny", io="space", patch_boundaries="given"), VocabSpec(470, 10, 1000))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(20.0)  # far from uniform: sampled bytes vary, delimiters included
    runs = [generate(model, None, "The Union, ", max_bytes=60, temperature=1.0, seed=3, use_cache=c) for c in (1, 0)]
    assert runs[0].text == runs[1].text and runs[0].patches == runs[1].patches
    assert runs[0].patches >= 2 and runs[0].new_bytes > 6  # more than one patch: the patcher closed one
