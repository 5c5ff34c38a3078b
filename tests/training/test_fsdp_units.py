"""FSDP units (training/train/parallelize.py): each latent block, and each local stack whole."""

from __future__ import annotations

from hbpe.schemas.train_config import model_config
from hbpe.training.model.build import build_model
from hbpe.training.model.layers import Block
from hbpe.training.model.patch_lm import VocabSpec
from hbpe.training.train.parallelize import attach_fsdp_hooks

SPEC = VocabSpec(vocab_size=470, max_patch_size=10, n_vocab=50257)


def test_small_shards_in_14_units_every_block_inside_exactly_one():
    model = attach_fsdp_hooks(build_model(model_config("small"), SPEC))
    units = [m for m in model.modules() if model.fsdp_wrap_fn(m)]
    assert len(units) == 14  # 12 latent blocks + the encoder's and the decoder's stacks
    for block in (m for m in model.modules() if isinstance(m, Block)):
        owners = [u for u in units if any(b is block for b in u.modules())]
        assert len(owners) == 1
    assert sum(model.activation_checkpointing_fn(m) for m in model.modules()) == 18  # every block recomputed


def test_the_bpe_baseline_shards_its_latent_blocks():
    model = attach_fsdp_hooks(build_model(model_config("small", io="bpe"), SPEC))
    assert sum(model.fsdp_wrap_fn(m) for m in model.modules()) == 12
