"""Model-level checks: exact BPB for a known distribution, KV-cache generation parity, shard reuse."""

import math

import numpy as np
import pytest
import torch

from hbpe.pipeline.tokenizer import artifact
from hbpe.schemas.errors import ArtifactError
from hbpe.schemas.train_config import model_config
from hbpe.training.composer_model import HierarchicalComposerModel
from hbpe.training.data import Collator, PatchSource, check_compatible, read_manifest
from hbpe.training.generate import generate
from hbpe.training.model import build_model
from hbpe.training.patch_io import IGNORE


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
    model = build_model(model_config("tiny"), vocab_size=tok.vocab_size, max_patch_size=10, n_vocab=50257)
    torch.nn.init.zeros_(model.io.head.weight)  # logits all zero: every symbol has p = 1/V'
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


def test_forward_shapes_and_ignored_pad(gpt2_tokenizer, sample_texts):
    tok = gpt2_tokenizer
    model = build_model(model_config("tiny"), vocab_size=tok.vocab_size, max_patch_size=10, n_vocab=50257)
    batch = _batch(tok, sample_texts[:1], seq_len=16)
    logits, targets = model(batch)
    B = batch["patches"].shape[0]
    assert logits.shape == (B * 15 * 10, tok.vocab_size)
    assert ((targets == IGNORE) == (batch["patches"][:, 1:].reshape(-1) == 257)).all()


@pytest.mark.parametrize("conditioning,pooling", [("prefix", "mean"), ("add", "eop")])
def test_greedy_generation_with_cache_equals_without(gpt2_tokenizer, conditioning, pooling):
    torch.manual_seed(0)
    tok = gpt2_tokenizer
    model = build_model(
        model_config("tiny", conditioning=conditioning, pooling=pooling),
        vocab_size=tok.vocab_size,
        max_patch_size=10,
        n_vocab=50257,
    ).eval()
    a = generate(model, tok, "Mr. Speaker, the state of", max_bytes=120, use_cache=True)
    b = generate(model, tok, "Mr. Speaker, the state of", max_bytes=120, use_cache=False)
    assert a.text == b.text and a.patches == b.patches and a.symbols == b.symbols
    assert a.text.startswith("Mr. Speaker, the state of")
    a.text.encode("utf-8")  # valid text (undecodable bytes became U+FFFD)


def test_shard_reuse_rules(sample_shards, gpt2_tokenizer):
    manifest = read_manifest(str(sample_shards[0]))
    assert check_compatible(manifest, gpt2_tokenizer, where="x") == PatchSource(derive=False)
    s6 = artifact.with_patch_size(gpt2_tokenizer, max_patch_size=6, mode="minimal")
    assert check_compatible(manifest, s6, where="x") == PatchSource(derive=True)
    other = artifact.train_tokenizer("cl100k_base", max_patch_size=10)
    with pytest.raises(ArtifactError, match="another first-stage BPE.*reconvert"):
        check_compatible(manifest, other, where="shards/")


def test_bpb_over_nothing_is_nan_not_zero():
    from hbpe.training.metrics import BitsPerByte

    assert math.isnan(float(BitsPerByte().compute()))
