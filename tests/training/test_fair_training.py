"""One training objective and one weight-decay rule for every scheme (issue 29, section 3).

Before: BPE-patch's loss was a mean per symbol and BPE's a mean per token (each scheme's own unit,
so gradient clipping at 1.0 acted on different scales), and embeddings were exempt from weight
decay, so BPE's tied table (about half of a mini BPE model) was never decayed while BPE-patch's
untied head was. `optim.loss_normalization=byte` and `optim.decay_embeddings=true` make both the
same for every scheme; the defaults stay as they were.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hbpe.schemas.errors import ConfigError
from hbpe.schemas.train_config import OptimConfig, model_config
from hbpe.training.model.build import build_model
from hbpe.training.model.patch_lm import VocabSpec
from hbpe.training.train.composer_model import HierarchicalComposerModel
from hbpe.training.train.optimizer import build_optimizer, param_groups
from tests.training.test_model import _batch


@pytest.mark.parametrize("io", ["hierarchical", "bpe"])
def test_the_byte_loss_is_the_batchs_nll_over_its_target_bytes(gpt2_tokenizer, sample_texts, io):
    tok = gpt2_tokenizer
    torch.manual_seed(0)
    model = build_model(model_config("tiny", io=io), VocabSpec.from_tokenizer(tok))
    batch = _batch(tok, sample_texts[:2])
    per_symbol = HierarchicalComposerModel(model, max_patch_size=10)  # the default, as before
    per_byte = HierarchicalComposerModel(model, max_patch_size=10, loss_normalization="byte")
    out = per_byte(batch)
    nll, count, nbytes = float(out["nll_sum"]), int(out["count"]), int(batch["target_bytes"].sum())
    assert nbytes > count > 0  # a symbol or a token covers more than a byte: the two losses differ
    assert float(per_byte.loss(out, batch)) == pytest.approx(nll / nbytes, rel=1e-6)
    assert float(per_symbol.loss(out, batch)) == pytest.approx(nll / count, rel=1e-6)


def test_the_loss_normalization_is_checked_and_reaches_the_model(gpt2_tokenizer):
    from hbpe.schemas.train_config import TrainConfig
    from hbpe.training.train.trainer import _model

    assert OptimConfig().loss_normalization == "symbol" and OptimConfig().decay_embeddings is False
    _, cmodel = _model(
        TrainConfig.from_dict({"data": {"train": "shards"}, "optim": {"loss_normalization": "byte"}}), gpt2_tokenizer
    )
    assert cmodel.loss_normalization == "byte"
    with pytest.raises(ConfigError, match="optim.loss_normalization: got 'bits', expected one of symbol, byte"):
        OptimConfig.from_dict({"loss_normalization": "bits"})


@pytest.mark.parametrize("io", ["hierarchical", "bpe"])
def test_decay_embeddings_decays_every_matrix_heads_and_tables_included(io):
    model = build_model(model_config("tiny", io=io), VocabSpec(470, 10, 1000))
    embedding = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    matrices = {id(p) for p in model.parameters() if p.ndim >= 2}
    assert embedding and embedding <= matrices
    default, _ = param_groups(model, 0.1)
    assert {id(p) for p in default["params"]} == matrices - embedding  # as before: tables exempt
    decay, no_decay = param_groups(model, 0.1, decay_embeddings=True)
    assert {id(p) for p in decay["params"]} == matrices  # BPE's tied table and BPE-patch's head alike
    assert all(p.ndim == 1 for p in no_decay["params"]) and no_decay["params"]  # gains and vectors only
    opt = build_optimizer(model, OptimConfig(decay_embeddings=True))
    assert {id(p) for p in opt.param_groups[0]["params"]} == matrices and opt.param_groups[0]["weight_decay"] == 0.1
    if io == "bpe":  # the tied table is BPE's output head: decayed, once
        assert model.io.head.weight is model.io.embed.weight and id(model.io.embed.weight) in embedding


def test_adamw_is_fused_on_a_gpu_and_torchs_default_on_cpu():
    model = torch.nn.Linear(4, 4)
    assert build_optimizer(model, OptimConfig(), device="gpu").defaults["fused"] is True  # stepped after the move
    assert build_optimizer(model, OptimConfig(), device="cpu").defaults["fused"] is None
