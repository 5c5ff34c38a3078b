"""Model-level checks: exact BPB for a known distribution, KV-cache generation parity, shard reuse."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from hbpe.pipeline.tokenizer import artifact
from hbpe.schemas.errors import ArtifactError, ConfigError
from hbpe.schemas.train_config import model_config
from hbpe.training.data.loader import Collator, PatchSource, check_compatible, read_manifest
from hbpe.training.inference.generate import generate
from hbpe.training.model.build import build_model
from hbpe.training.model.local_models import LocalDecoder, LocalEncoder
from hbpe.training.model.patch_io import IGNORE
from hbpe.training.model.patch_lm import VocabSpec, parameter_counts
from hbpe.training.train.composer_model import HierarchicalComposerModel


def _batch(tok, texts, seq_len=32):
    from hbpe.schemas.symbols import TOKEN_EOD

    stream = np.concatenate([np.concatenate([tok.encode(t), [TOKEN_EOD]]) for t in texts]).astype(np.int32)
    n = len(stream) // seq_len
    samples = [{"tokens": stream[i * seq_len : (i + 1) * seq_len]} for i in range(n)]
    for s in samples:
        s["patches"] = tok.patches(s["tokens"])
    return Collator(tok, PatchSource(derive=False))(samples)


def test_bpb_of_a_uniform_model_is_exact(gpt2_tokenizer, sample_texts):
    tok = gpt2_tokenizer
    model = build_model(model_config("tiny"), VocabSpec.from_tokenizer(tok))
    torch.nn.init.zeros_(model.io.decoder.head.weight)  # logits all zero: every symbol has p = 1/V'
    cm = HierarchicalComposerModel(model, max_patch_size=10)
    batch = _batch(tok, sample_texts[:1])
    out = cm(batch)
    metric = cm.get_metrics(is_train=False)["BitsPerByte"]
    cm.update_metric(batch, out, metric)
    targets = batch["patches"][:, 1:]
    symbols = int((targets != 257).sum())  # EOP and EOD count, PAD does not
    nbytes = sum(tok.nbytes(t[1:].numpy()) for t in batch["tokens"])
    assert int(batch["target_bytes"].sum()) == nbytes
    expected = symbols * math.log2(tok.vocab_size) / nbytes
    assert float(metric.compute()) == pytest.approx(expected, rel=1e-6)  # fp32 NLL sums
    assert float(cm.loss(out, batch)) == pytest.approx(math.log(tok.vocab_size), rel=1e-6)


def _scaled(model):
    """Weights far from the 0.02 init, so a dependence that should not exist shows up as a large change."""
    torch.manual_seed(2)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (0.1 if p.ndim > 1 else 0.3) + (1.0 if p.ndim == 1 else 0.0))
    return model.eval()


@pytest.mark.parametrize("conditioning,pooling", [("prefix", "mean"), ("add", "eop")])
@torch.no_grad()
def test_the_local_side_is_the_papers_g_phi_and_m_psi(gpt2_tokenizer, conditioning, pooling):
    """e_t = g_phi(patch_t) sees patch t only; m_psi's logits for symbol s see h_t and symbols < s only."""
    tok = gpt2_tokenizer
    cfg = model_config("tiny", encoder_layers=2, decoder_layers=2, conditioning=conditioning, pooling=pooling)
    model = _scaled(build_model(cfg, VocabSpec.from_tokenizer(tok)))
    enc, dec = model.io.encoder, model.io.decoder
    assert isinstance(enc, LocalEncoder) and isinstance(dec, LocalDecoder)
    assert enc.embed is dec.embed  # one symbol table E, counted once
    counts = parameter_counts(model)
    assert counts["io"] == sum(p.numel() for p in [*enc.parameters(), *dec.parameters()]) - enc.embed.weight.numel()
    assert counts["io"] == sum(p.numel() for name, p in model.named_parameters() if name.startswith("io."))

    patches = torch.from_numpy(tok.patches(tok.encode("Mr. Speaker, the state of our Union is strong")))[None]
    patches = patches.long()  # (1, T, S)
    other = patches.clone()
    other[0, 3] = patches[0, 5]  # another patch at position 3 only
    e, e2 = model.io.encode_patches(patches), model.io.encode_patches(other)  # (1, T, D)
    changed = (e - e2).abs().amax(-1)[0]  # (T,)
    assert changed[3] > 1e-2 and torch.cat([changed[:3], changed[4:]]).max() < 1e-6

    h = torch.randn(1, cfg.latent_dim)  # (1, D)
    target = torch.arange(1, tok.max_patch_size + 1)[None] + 100  # (1, S): symbols, no PAD
    later = target.clone()
    later[0, 4] = 7  # symbol 4 (0-based) differs: logits of symbols 0..4 must not move
    a, b = dec(h, target), dec(h, later)  # (1, S, V)
    moved = (a - b).abs().amax(-1)[0]  # (S,)
    assert moved[:5].max() < 1e-6 and moved[5:].min() > 1e-3
    assert (dec(h + 1.0, target) - a).abs().amax(-1).min() > 1e-3  # every symbol is conditioned on h_t


def test_vocab_spec_from_a_tokenizer_and_from_run_metadata(gpt2_tokenizer):
    spec = VocabSpec.from_tokenizer(gpt2_tokenizer)
    assert spec == VocabSpec(vocab_size=gpt2_tokenizer.vocab_size, max_patch_size=10, n_vocab=50257)
    meta = {"vocab_size": spec.vocab_size, "max_patch_size": 10, "n_vocab": 50257, "seq_len": 64}
    assert VocabSpec.from_run_meta(meta) == spec
    with pytest.raises(ArtifactError, match=r"run/hbpe_run.json lacks \['n_vocab'\].*written by `hbpe train`"):
        VocabSpec.from_run_meta({"vocab_size": 470, "max_patch_size": 10}, source="run/hbpe_run.json")
    with pytest.raises(ArtifactError, match=r"hbpe_run.json: VocabSpec.max_patch_size='10': must be an integer >= 1"):
        VocabSpec.from_run_meta({**meta, "max_patch_size": "10"})
    with pytest.raises(ConfigError, match=r"VocabSpec.vocab_size=0: must be an integer >= 1"):
        VocabSpec(0, 10, 50257)


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_forward_shapes_and_ignored_pad(gpt2_tokenizer, sample_texts, layout):
    tok = gpt2_tokenizer
    model = build_model(model_config("tiny", local_layout=layout), VocabSpec.from_tokenizer(tok))
    batch = _batch(tok, sample_texts[:1], seq_len=16)
    logits, targets = model(batch)
    B = batch["patches"].shape[0]
    slots = batch["patches"][:, 1:].reshape(-1)  # (B * 15 * 10,) every target slot, PAD included
    if layout == "padded":  # a row per slot, PAD's ignored
        assert logits.shape == (B * 15 * 10, tok.vocab_size)
        assert ((targets == IGNORE) == (slots == 257)).all()
    else:  # a row per real symbol only, in the padded rows' order
        assert logits.shape == (int((slots != 257).sum()), tok.vocab_size)
        assert torch.equal(targets, slots[slots != 257])


@pytest.mark.parametrize("conditioning,pooling", [("prefix", "mean"), ("add", "eop")])
def test_greedy_generation_with_cache_equals_without(gpt2_tokenizer, conditioning, pooling):
    torch.manual_seed(0)
    tok = gpt2_tokenizer
    model = build_model(
        model_config("tiny", conditioning=conditioning, pooling=pooling), VocabSpec.from_tokenizer(tok)
    ).eval()
    a = generate(model, tok, "Mr. Speaker, the state of", max_bytes=120, use_cache=True)
    b = generate(model, tok, "Mr. Speaker, the state of", max_bytes=120, use_cache=False)
    assert a.text == b.text and a.patches == b.patches and a.symbols == b.symbols
    assert a.text.startswith("Mr. Speaker, the state of")
    a.text.encode("utf-8")  # valid text (undecodable bytes became U+FFFD)


def test_shard_reuse_rules(sample_shards, gpt2_tokenizer):
    manifest = read_manifest(str(sample_shards[0]))
    assert check_compatible(manifest, gpt2_tokenizer, where="x") == PatchSource(derive=True)  # lean: no patches
    stored = dataclasses.replace(manifest, columns=["num_bytes", "patches", "tokens"])  # --store-patches
    assert check_compatible(stored, gpt2_tokenizer, where="x") == PatchSource(derive=False)
    s6 = artifact.with_patch_size(gpt2_tokenizer, max_patch_size=6, mode="minimal")
    assert check_compatible(manifest, s6, where="x") == PatchSource(derive=True)
    other = artifact.train_tokenizer("cl100k_base", max_patch_size=10)
    with pytest.raises(ArtifactError, match="another first-stage BPE.*reconvert"):
        check_compatible(manifest, other, where="shards/")


def test_bpb_over_nothing_is_nan_not_zero():
    from hbpe.training.train.metrics import BitsPerByte

    assert math.isnan(float(BitsPerByte().compute()))
