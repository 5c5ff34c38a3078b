"""Training compute as spent (issue 18, section 1): the paper's count at a run's own context, and executed FLOPs.

Before: every experiment charged its runs the paper's count at 8,192 bytes of context, whatever
they trained on: at mini size BPE / BPE-patch cost 2.53x, where the paper's count at the
real 658-byte context gives 3.76x and the step executes 1.58x.
"""

from __future__ import annotations

import pytest
import torch

from hbpe.experiments.compute import context_row, paper_train_flops_per_byte
from hbpe.experiments.presets import MINI
from hbpe.schemas.train_config import ModelConfig
from hbpe.training.inference.scheme_stats import PatchingStats, table1_row
from hbpe.training.model.flops import train_flops_per_sample

# table1-mini's measured patching (docs/experiments/table1-mini/results.json): 256 samples of the en-sotu
# training shards, gpt2 first stage, S=10; 200 batches of 8 samples trained on 1,052,454 bytes of text
WORDS, TEXT = 28573, 171859
STATS = {
    "bpe": PatchingStats(256, TEXT, WORDS, 32500, 32500),
    "hierarchical": PatchingStats(256, TEXT, WORDS, 32500, 135485),
    "bytes": PatchingStats(256, TEXT, WORDS, TEXT, TEXT),
}
TRAIN_BYTES, SAMPLES = 1_052_454, 200 * 8


def _cfg(io: str) -> ModelConfig:
    return ModelConfig.from_dict({**MINI, "io": io})


def test_the_issue_ratios_at_mini_size(gpt2_tokenizer):
    at_8k = {io: table1_row(_cfg(io), gpt2_tokenizer, s, input_bytes=8192) for io, s in STATS.items()}
    own = {
        io: context_row(_cfg(io), gpt2_tokenizer, s, train_bytes=TRAIN_BYTES, samples=SAMPLES)
        for io, s in STATS.items()
    }
    assert own["bpe"]["input_bytes"] == pytest.approx(657.8, abs=0.1)  # the bytes of one 128-token sample
    ratio = lambda rows: rows["bpe"]["gflops"]["total"] / rows["hierarchical"]["gflops"]["total"]  # noqa: E731
    assert ratio(at_8k) == pytest.approx(2.53, abs=0.01)  # the table's convention
    assert ratio(own) == pytest.approx(3.76, abs=0.01)  # the paper's count at the run's context
    # the byte-level row: 112 GFLOPs per 8 KB by convention, about 15 per 8 KB of text at its real context
    assert at_8k["bytes"]["gflops"]["total"] == pytest.approx(112.34, abs=0.01)
    assert paper_train_flops_per_byte(own["bytes"]) * 8192 / 3 / 1e9 == pytest.approx(14.58, abs=0.01)
    # per byte of training text: 3 x forward / the context's bytes
    assert paper_train_flops_per_byte(own["bpe"]) == pytest.approx(
        3 * own["bpe"]["gflops"]["total"] * 1e9 / (TRAIN_BYTES / SAMPLES)
    )

    executed = {
        io: train_flops_per_sample(_cfg(io), seq_len=128, max_patch_size=S, vocab_size=V)
        for io, S, V in (("bpe", 1, 50257 + 2), ("hierarchical", 10, gpt2_tokenizer.vocab_size))
    }
    assert gpt2_tokenizer.vocab_size == 470
    assert executed["bpe"] / executed["hierarchical"] == pytest.approx(1.58, abs=0.01)  # what the step executes


def _chinchilla(n: float, d: int, f: int, heads: int, layers: int, vocab: int = 0) -> float:
    """Forward FLOPs of a transformer on n positions as SPEC.md "Metrics" counts them (Chinchilla, appendix F),
    written out here rather than taken from flops.py: per layer 2n*4d^2 (the Q, K, V and output projections),
    2*2n^2 d (q.k and a.v), 3 heads n^2 (softmax) and 2n*2df (the two MLP matrices); embeddings cost
    nothing, the logits 2ndV."""
    return layers * (8 * n * d * d + 4 * n * n * d + 3 * heads * n * n + 4 * n * d * f) + 2 * n * d * vocab


@pytest.mark.parametrize("input_bytes,ratio", [(8192, 2.53), (TRAIN_BYTES / SAMPLES, 3.76)])
def test_the_issue_ratios_by_hand(gpt2_tokenizer, input_bytes, ratio):
    """The paper's count of each Table 1 row from the mini sizes and the measured patching, by hand."""
    mini = dict(latent_layers=4, latent_dim=96, latent_ffn=256, latent_heads=4, local_dim=64, local_ffn=128,
                local_heads=4, encoder_layers=3, decoder_layers=3)  # fmt: skip
    assert mini == MINI
    latent = dict(d=96, f=256, heads=4, layers=4)
    local = dict(d=64, f=128, heads=4, layers=3)  # the encoder and the decoder alike
    T = input_bytes * 32500 / TEXT  # BPE and BPE-patch: one latent position per first-stage token
    p = 135485 / 32500  # BPE-patch: symbols per patch, each run through the local models
    hand = {
        "bpe": _chinchilla(T, **latent, vocab=50257 + 2),  # the head over gpt2's tokens + EOD, PAD
        "bytes": _chinchilla(input_bytes, **latent, vocab=256 + 2),  # one position per byte; 256 bytes + EOD, PAD
        "hierarchical": _chinchilla(T, **latent) + T * (_chinchilla(p, **local) + _chinchilla(p, **local, vocab=470)),
    }
    got = {io: table1_row(_cfg(io), gpt2_tokenizer, s, input_bytes=input_bytes)["gflops"] for io, s in STATS.items()}
    for io in STATS:
        assert got[io]["total"] * 1e9 == pytest.approx(hand[io], rel=1e-12), io
    local_decoder = T * _chinchilla(p, **local, vocab=470)
    assert got["hierarchical"]["local_decoder"] * 1e9 == pytest.approx(local_decoder, rel=1e-12)
    assert hand["bpe"] / hand["hierarchical"] == pytest.approx(ratio, abs=0.01)
    if input_bytes == 8192:  # 4 layers of 8,192 positions: 4 x 27,984,396,288, and the head 2 x 8192 x 96 x 258
        assert hand["bytes"] == 4 * 27_984_396_288 + 405_798_912 == 112_343_384_064


def _attention(transformers: list[tuple[int, int, int, int, int]]) -> float:
    """Forward attention FLOPs torch's counter misses on CPU (its SDPA kernel is not registered there), by hand:
    per layer and sequence, scores q.k and values a.v (2 x 2 n^2 d) and the softmax (3 heads n^2)."""
    return sum(layers * seqs * (4 * n * n * d + 3 * heads * n * n) for layers, seqs, n, d, heads in transformers)


@pytest.mark.parametrize("io", ["hierarchical", "bpe", "space"])
def test_executed_flops_are_what_a_training_step_computes(io):
    """The count against torch's FlopCounterMode on a real forward + backward of the mini model."""
    from torch.utils.flop_counter import FlopCounterMode

    from hbpe.training.model.patch_lm import VocabSpec, build_model
    from hbpe.training.train.composer_model import HierarchicalComposerModel

    torch.manual_seed(0)
    cfg = _cfg(io)
    model = build_model(cfg, VocabSpec(vocab_size=300, max_patch_size=10, n_vocab=1000))
    B, N = 2, 33  # T = 32 latent positions
    S = {"hierarchical": 10, "bpe": 1, "space": cfg.patching.max_bytes + 1}[io]
    # every position a real symbol: PAD positions cost the same
    key, shape = ("tokens", (B, N)) if io == "bpe" else ("patches", (B, N, S))
    batch = {key: torch.randint(0, 250, shape)}
    with FlopCounterMode(display=False) as counter:
        logits, _ = model(batch)
        logits.float().sum().backward()
    matmuls = counter.get_total_flops()  # every linear layer, forward and backward (aten.mm only on CPU)
    T = N - 1
    attn = [(cfg.latent_layers, B, T, cfg.latent_dim, cfg.latent_heads)]
    if io != "bpe":  # both local models over all S positions of every patch
        attn.append((cfg.encoder_layers + cfg.decoder_layers, B * T, S, cfg.local_dim, cfg.local_heads))
    # what the experiment runner sums batch by batch (experiments/compute.py executed_batch_flops)
    counted = HierarchicalComposerModel(model, max_patch_size=10).flops_per_batch(batch)
    assert counted == pytest.approx(matmuls + 3 * _attention(attn), rel=1e-12)
