"""Packed local models (model.local_layout=packed) compute the padded model's function on real symbols only.

Every scheme with local models (hierarchical, space, entropy) and every option that changes the local
side (pooling, conditioning, patch boundaries, hash n-grams), on a 3-layer-per-stack model with wide
weights: in float64 logits, loss and every gradient equal at 1e-9; in fp32 loss and BPB equal at 1e-5
and logits within the padded model's own rounding; the weights of one layout load in the other, and
greedy generation gives the same text.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hbpe.pipeline.shards.reader import ShardDir
from hbpe.schemas.errors import ConfigError
from hbpe.schemas.symbols import PAD
from hbpe.schemas.train_config import model_config
from hbpe.training.data.byte_patching import UNBOUNDED_SAFETY_LIMIT
from hbpe.training.data.schemes import BytePatchScheme, build_scheme, vocabulary_bytes
from hbpe.training.inference.generate import generate_batch
from hbpe.training.model import layers, patch_attention
from hbpe.training.model.build import build_model
from hbpe.training.model.layers import Attention
from hbpe.training.model.packing import PatchPacking
from hbpe.training.model.patch_io import IGNORE, cross_entropy_sum
from hbpe.training.model.patch_lm import VocabSpec

DEEP = dict(encoder_layers=3, decoder_layers=3, latent_layers=3)


class _FixedEntropy:
    """Entropies from a deterministic function of the bytes: entropy patching's cuts without a trained model."""

    def entropies(self, units):
        return [((u * 7919) % 97 / 20.0).astype(np.float32) for u in units]


CASES = {
    "hierarchical-mean-prefix": dict(io="hierarchical"),
    "hierarchical-eop-add": dict(io="hierarchical", pooling="eop", conditioning="add"),
    "space-eop-boundaries": dict(io="space"),
    "space-given-hash-ngrams": dict(io="space", patch_boundaries="given", hash_ngram_buckets=97),
    "entropy-unbounded-eop-pooling": dict(io="entropy", pooling="eop", entropy_bounded=False),
}


@pytest.fixture(scope="module")
def shard_rows(sample_shards):
    d = ShardDir(sample_shards[0])
    rows = [np.asarray(s["tokens"], dtype=np.int32) for _, s in zip(range(6), d.samples())]
    return d.tokenizer, np.stack(rows)


def _cfg(case: str, layout: str, attention: str = "auto"):
    extra = dict(CASES[case])
    if extra["io"] == "entropy":
        extra.update(entropy_model="unused.pt", entropy_threshold=2.0)
    return model_config("tiny", **DEEP, **extra, local_layout=layout, packed_attention=attention)


def _batch(cfg, tok, rows) -> dict[str, torch.Tensor]:
    if cfg.io == "entropy":
        vocab = vocabulary_bytes(tok)
        eop = cfg.patching.boundaries == "eop"  # unbounded: patches as long as the entropies make them
        width = UNBOUNDED_SAFETY_LIMIT + eop
        scheme = BytePatchScheme(vocab, None, _FixedEntropy(), cfg.patching.entropy_threshold, eop=eop, width=width)
    else:
        scheme = build_scheme(cfg, tok, derive=True)
    return {k: torch.from_numpy(np.asarray(v, dtype=np.int64)) for k, v in scheme.batch(rows, None).items()}


def _wide(model, seed: int = 3):
    """Weights far from the 0.02 init (logits far from uniform), norms' gains away from 1."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 2.0 / math.sqrt(p.shape[1]))
            else:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
    return model


def _pair(case: str, tok, attention: str = "auto"):
    spec = VocabSpec.from_tokenizer(tok)
    padded = _wide(build_model(_cfg(case, "padded"), spec))
    packed = build_model(_cfg(case, "packed", attention), spec)
    packed.load_state_dict(padded.state_dict())  # one layout's weights load in the other
    return padded, packed


def _forward_backward(model, batch):
    logits, targets = model(batch)
    exact = logits.dtype == torch.float64  # cross_entropy_sum sums in fp32, as training does
    nll = (
        F.cross_entropy(logits, targets, ignore_index=IGNORE, reduction="sum")
        if exact
        else cross_entropy_sum(logits, targets)
    )
    count = int((targets != IGNORE).sum())
    (nll / count).backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), targets, float(nll) / count, grads


@pytest.mark.parametrize("attention", ["auto", "blocks"])
@pytest.mark.parametrize("case", list(CASES))
def test_packed_equals_padded_loss_logits_bpb_and_gradients(shard_rows, case, attention, monkeypatch):
    """The same function: in float64 the two layouts agree to 1e-9 (logits, loss, every gradient); in fp32
    the loss and BPB agree to 1e-5 and each position's logits are as close to the float64 values as the
    padded model's own are (the packed model attends over each patch's exact length, so its fp32 sums
    round differently: both are ~1e-3 from exact at these wide weights, where logits reach ~10).
    Both packed attentions: the native kernel (auto, on CPU) and the torch path's length blocks (GPU's)."""
    native_calls = []
    real_kernel = layers.patch_attention
    monkeypatch.setattr(layers, "patch_attention", lambda *a, **k: native_calls.append(1) or real_kernel(*a, **k))
    tok, rows = shard_rows
    padded, packed = _pair(case, tok, attention)
    batch = _batch(padded.cfg, tok, rows)
    assert (batch["patches"] == PAD).float().mean() > 0.2  # the case has PAD to skip
    slots = packed.io.decoded_slots(batch)

    exact_p = _forward_backward(copy.deepcopy(padded).double(), batch)
    exact_k = _forward_backward(copy.deepcopy(packed).double(), batch)
    assert exact_k[0].shape[0] == int(slots.sum()) < exact_p[0].shape[0]  # packed: no row for a PAD target
    assert torch.equal(exact_p[1][slots], exact_k[1])
    assert (exact_p[1][~slots] == IGNORE).all()  # what packing leaves out was never scored
    torch.testing.assert_close(exact_k[0], exact_p[0][slots], rtol=1e-9, atol=1e-9)  # every real position
    assert exact_k[2] == pytest.approx(exact_p[2], rel=1e-12)
    assert exact_k[3].keys() == exact_p[3].keys() == {n for n, _ in padded.named_parameters()}
    for name, gp in exact_p[3].items():
        scale = gp.abs().max().clamp_min(1e-12)
        assert float((gp - exact_k[3][name]).abs().max() / scale) < 1e-9, name

    (lp, _, loss_p, grads_p), (lk, tk, loss_k, grads_k) = (
        _forward_backward(padded, batch),
        _forward_backward(packed, batch),
    )
    assert loss_k == pytest.approx(loss_p, rel=1e-5)  # the training loss
    nbytes = int(batch["target_bytes"].sum())
    count = int((tk != IGNORE).sum())
    assert loss_k * count / math.log(2) / nbytes == pytest.approx(loss_p * count / math.log(2) / nbytes, rel=1e-5)
    truth = exact_p[0][slots]
    err_p, err_k = float((lp[slots].double() - truth).abs().max()), float((lk.double() - truth).abs().max())
    assert err_k <= 2 * err_p + 1e-5, (err_k, err_p)  # fp32 rounding, not another function
    for name, gp in grads_p.items():  # fp32 sums over thousands of positions in another order
        scale = gp.abs().max().clamp_min(1e-12)
        assert float((gp - grads_k[name]).abs().max() / scale) < 1e-3, name
    native_built = patch_attention._patch_attention is not None
    assert bool(native_calls) == (attention == "auto" and native_built)  # the path named is the one tested


@pytest.mark.parametrize("case", ["hierarchical-mean-prefix", "hierarchical-eop-add"])
def test_greedy_generation_is_the_same_text(shard_rows, case):
    tok, _ = shard_rows
    padded, packed = _pair(case, tok)
    prompts = ["The state of the Union", "We"]
    for use_cache in (False, True):
        a = generate_batch(padded.eval(), tok, prompts, max_bytes=40, use_cache=use_cache)
        b = generate_batch(packed.eval(), tok, prompts, max_bytes=40, use_cache=use_cache)
        assert [r.text for r in a] == [r.text for r in b]


def test_packing_rows_and_length_blocks():
    real = torch.tensor([[True, True, True], [False, False, False], [True, False, False], [True, True, True]])
    p = PatchPacking.from_real(real)
    assert p.rows.tolist() == [0, 1, 2, 6, 9, 10, 11] and p.size == 7
    assert p.order.tolist() == [3, 0, 1, 2, 4, 5, 6]  # the 1-symbol patch first, then the 3-symbol ones in order
    assert p.buckets == ((0, 1, 1), (1, 2, 3)) and p.attention_pairs() == 19  # no PAD pairs: 1 + 9 + 9
    assert torch.equal(p.order.index_select(0, p.inverse), torch.arange(7))
    x = torch.arange(7.0)
    assert torch.equal(x.index_select(0, p.order).index_select(0, p.inverse), x)


def test_a_real_symbol_after_pad_is_refused():
    with pytest.raises(Exception, match="real symbol after PAD"):
        PatchPacking.from_real(torch.tensor([[True, False, True]]))


def test_the_layout_is_a_checked_choice():
    with pytest.raises(ConfigError, match="model.local_layout"):
        model_config("tiny", local_layout="sparse")


def test_bf16_autocast_gives_the_padded_loss_to_bf16_precision(shard_rows):
    """Under bf16 autocast (training on a GPU) the packed model computes what the padded one does, to bf16's
    ~3 significant digits: the same casts at the same ops, only on fewer rows."""
    tok, rows = shard_rows
    padded, packed = _pair("hierarchical-eop-add", tok)
    batch = _batch(padded.cfg, tok, rows)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (lp, tp), (lk, tk) = padded(batch), packed(batch)
    assert lk.dtype == torch.bfloat16
    loss_p = float(cross_entropy_sum(lp, tp)) / int((tp != IGNORE).sum())
    loss_k = float(cross_entropy_sum(lk, tk)) / int((tk != IGNORE).sum())
    assert loss_k == pytest.approx(loss_p, rel=1e-2)


def test_a_batch_with_no_real_target_gives_no_rows_as_the_padded_model_scores_none():
    """Every predicted patch all PAD (N = 0 decoder rows): the padded model scores nothing (all IGNORE), the
    packed one returns no rows; both train on it (loss 0) without an error."""
    spec = VocabSpec(vocab_size=300, max_patch_size=6, n_vocab=1000)
    patches = torch.full((2, 4, 6), PAD)
    patches[:, 0, :3] = 5  # one real patch, read by the encoder; the three targets are all PAD
    batch = {"patches": patches, "first_target": torch.ones(2, dtype=torch.long)}
    for layout, rows in (("padded", 2 * 3 * 6), ("packed", 0)):
        model = build_model(model_config("tiny", local_layout=layout), spec)
        logits, targets = model(batch)
        assert logits.shape == (rows, 300) and (targets == IGNORE).all(), layout
        cross_entropy_sum(logits, targets).backward()


@pytest.mark.parametrize("causal", [False, True])
def test_attention_dropout_reaches_one_symbol_patches_as_in_the_padded_model(causal):
    """model.dropout drops attention weights; a 1-symbol patch's one weight too (the padded model's SDPA does):
    in training each (patch, head) output is 0 or 1 / (1 - p) times its eval value, in both layouts."""
    torch.manual_seed(0)
    D, H, M = 8, 2, 64
    real = torch.zeros(M, 3, dtype=torch.bool)
    real[:, 0] = True  # every patch one symbol long
    x = torch.randn(M, 3, D)
    packing = PatchPacking.from_real(real)
    runs = {
        "padded": lambda a: a(x, causal=causal, key_mask=None if causal else real)[:, 0],
        "packed": lambda a: a(x[:, 0], causal=causal, packing=packing),
    }
    for layout, run in runs.items():
        attn = Attention(D, H, 10000.0, dropout=0.5)
        with torch.no_grad():
            attn.out.weight.copy_(torch.eye(D))  # the heads' outputs as they are
        ratio = (run(attn.train()) / run(attn.eval())).view(M, H, D // H)
        per_head = ratio[..., 0]  # (M, H): one attention weight per patch and head, kept or dropped
        assert torch.allclose(ratio, per_head.unsqueeze(-1).expand_as(ratio)), layout
        assert set(per_head.round(decimals=4).unique().tolist()) == {0.0, 2.0}, layout


@pytest.mark.parametrize("layout,attention", [("padded", "auto"), ("packed", "auto"), ("packed", "blocks")])
@pytest.mark.parametrize("shape", [(0, 5), (2, 1), (2, 0)])
def test_a_batch_with_nothing_to_predict_is_refused_at_the_models_door(layout, attention, shape):
    """B = 0 rows, or rows of T < 2 positions (nothing to predict): one ValueError naming the shape, not a
    reshape error from inside the local models; a (1, 2) batch, the least there is, still runs."""
    spec = VocabSpec(vocab_size=300, max_patch_size=6, n_vocab=1000)
    model = build_model(model_config("tiny", local_layout=layout, packed_attention=attention), spec)
    B, T = shape
    with pytest.raises(
        ValueError, match=rf"shape \({B}, {T}, 6\) has nothing to predict: it needs B >= 1 rows of T >= 2"
    ):
        model({"patches": torch.full((B, T, 6), 5), "first_target": torch.ones(B, dtype=torch.long)})
    logits, targets = model({"patches": torch.full((1, 2, 6), 5), "first_target": torch.zeros(1, dtype=torch.long)})
    assert logits.shape == (6, 300) and (targets == 5).all()


def test_the_embedding_schemes_refuse_an_empty_batch_too():
    model = build_model(model_config("tiny", io="bpe"), VocabSpec(vocab_size=300, max_patch_size=6, n_vocab=1000))
    with pytest.raises(ValueError, match=r"shape \(0, 5\) has nothing to predict"):
        model({"tokens": torch.zeros(0, 5, dtype=torch.long)})
