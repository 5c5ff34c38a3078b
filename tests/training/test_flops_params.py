"""Parameter counts and forward FLOPs against the paper's Table 1 (models built on the meta device)."""

from __future__ import annotations

import pytest
import torch

from hbpe.schemas.train_config import model_config
from hbpe.training.model.build import build_model
from hbpe.training.model.flops import paper_forward_flops, train_flops_per_sample, transformer_flops
from hbpe.training.model.patch_lm import VocabSpec, parameter_counts

GPT2_VOCAB = 50257
PAPER_BYTES_PER_TOKEN = 4.12  # SlimPajama, gpt2 (SPEC section 1)


def _model(size: str, **overrides):
    with torch.device("meta"):  # counts and shapes only: no 400M-parameter allocation
        return build_model(model_config(size, **overrides), VocabSpec(470, 10, GPT2_VOCAB))


@pytest.mark.parametrize(
    "size,tied,paper_m,untied_m",
    [("small", True, 123, 162), ("medium", True, 359, 411)],
)
def test_bpe_baseline_parameters_match_the_paper_when_tied(size, tied, paper_m, untied_m):
    tied_total = parameter_counts(_model(size, io="bpe"))["total"]  # tie_embeddings defaults to True
    untied_total = parameter_counts(_model(size, io="bpe", tie_embeddings=False))["total"]
    assert tied_total / 1e6 == pytest.approx(paper_m, rel=0.01)
    assert untied_total / 1e6 == pytest.approx(untied_m, rel=0.01)
    counts = parameter_counts(_model(size, io="bpe"))
    assert counts["io"] == (GPT2_VOCAB + 2) * model_config(size).latent_dim  # one matrix, counted once


def test_tied_head_is_the_embedding():
    m = build_model(model_config("tiny", io="bpe"), VocabSpec(470, 10, 1000))
    assert m.io.head.weight is m.io.embed.weight
    untied = build_model(model_config("tiny", io="bpe", tie_embeddings=False), VocabSpec(470, 10, 1000))
    assert untied.io.head.weight is not untied.io.embed.weight


def test_paper_forward_flops_of_the_small_bpe_model_on_8192_bytes():
    cfg = model_config("small", io="bpe")
    f = paper_forward_flops(
        cfg, input_bytes=8192, bytes_per_patch=PAPER_BYTES_PER_TOKEN, symbols_per_patch=1, vocab_size=GPT2_VOCAB
    )
    assert f["total"] / 1e9 == pytest.approx(562, rel=0.01)  # the paper's Table 1
    assert f["local_encoder"] == f["local_decoder"] == 0


def test_hierarchical_forward_flops_follow_the_spec_formula():
    cfg = model_config("small")
    T, p, V = 8192 / 4.12, 4.13, 470
    f = paper_forward_flops(cfg, input_bytes=8192, bytes_per_patch=4.12, symbols_per_patch=p, vocab_size=V)
    local = dict(ffn=512, heads=8, mlp_mats=2)
    assert f["local_encoder"] == pytest.approx(T * transformer_flops(p, 512, 3, 0, **local))
    assert f["local_decoder"] == pytest.approx(T * transformer_flops(p, 512, 3, V, **local))
    assert f["latent"] == pytest.approx(transformer_flops(T, 768, 12, 0, ffn=2048, heads=12, mlp_mats=2))
    assert f["total"] / 1e9 == pytest.approx(554, rel=0.05)  # the paper's BPE-patch row (ours: 569)


def test_training_flops_count_swiglu_and_every_symbol_position():
    cfg = model_config("small")
    swiglu = train_flops_per_sample(cfg, seq_len=1025, max_patch_size=10, vocab_size=470)
    chinchilla = (
        3 * paper_forward_flops(cfg, input_bytes=1024, bytes_per_patch=1, symbols_per_patch=10, vocab_size=470)["total"]
    )
    assert swiglu > chinchilla  # three MLP matrices and the projections, not two
