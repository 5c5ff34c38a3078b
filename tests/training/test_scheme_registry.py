"""The scheme registry (training/schemes/registry.py): a new scheme is one file and its registration."""

from __future__ import annotations

import pytest

from hbpe.schemas.errors import ConfigError
from hbpe.schemas.symbols import EOD, EOP, PAD
from hbpe.schemas.train_config import model_config
from hbpe.training.data.schemes import build_scheme
from hbpe.training.data.token_rows import read_token_rows
from hbpe.training.model.build import build_model
from hbpe.training.model.patch_lm import VocabSpec
from hbpe.training.schemes.registry import scheme_spec
from tests.helpers import train_cfg
from tests.training.toy_scheme import FixedSpec


def test_a_scheme_registered_in_one_file_builds_its_batches_and_model(gpt2_tokenizer, sample_shards):
    cfg = model_config("tiny", io="fixed", patch_max_bytes=4)  # configs take the registered name
    assert isinstance(scheme_spec(cfg), FixedSpec) and scheme_spec(cfg).label(cfg) == "fixed patch, 4 bytes"
    rows = read_token_rows(str(sample_shards[0]), gpt2_tokenizer, samples=3)
    batch = build_scheme(cfg, gpt2_tokenizer, derive=True).batch(rows, None)
    patches = batch["patches"]  # (B, T, 5): 4 bytes + EOP
    assert patches.shape[2] == 5
    for sample, first in zip(patches, batch["first_target"], strict=True):
        text = [p for p in sample[first:] if p[0] not in (EOD, PAD)]
        lengths = [int((p < EOP).sum()) for p in text]  # bytes per predicted patch
        assert set(lengths[:-1]) == {4} and 1 <= lengths[-1] <= 4  # fixed width; the text's last patch what is left
    model = build_model(cfg, VocabSpec.from_tokenizer(gpt2_tokenizer))
    assert model.io.S == 5  # the spec's symbols_per_patch, the batches' width


def test_the_toy_scheme_trains_a_batch_through_the_trainer(sample_shards, tmp_path):
    from hbpe.training.train.trainer import train

    extra = ["model.io=fixed", "model.patching.max_bytes=4", "console=false", "global_batch_size=4"]
    extra += ["max_duration=1ba", "eval_interval=1ba", "save_interval=1ba", "eval_subset_num_batches=1"]
    out = train(train_cfg(sample_shards, tmp_path / "run", *extra))
    assert out["eval"]["BitsPerByte"] > 0
    assert (tmp_path / "run" / "latest-rank0.pt").exists()


def test_an_unknown_scheme_is_named_with_the_known_ones():
    with pytest.raises(ConfigError, match=r"model.io: got 'chars', expected one of hierarchical, bpe, bytes, space"):
        model_config(io="chars")
    with pytest.raises(ConfigError, match=r"model.io=chars is not a scheme hbpe knows \(known: hierarchical, .*fixed"):
        scheme_spec("chars")


def test_a_byte_patch_width_is_computed_once():
    """The unbounded entropy model's PatchIO was `patch_max_bytes + EOP` wide (7) while its batches and generation
    cut patches of up to 24 bytes (+ EOP): KV-cached generation had rotary tables for 8 positions only."""
    from hbpe.training.inference.byte_generation import ByteSymbols

    spec = VocabSpec(vocab_size=470, max_patch_size=10, n_vocab=50257)
    for boundaries, width in (("eop", 25), ("given", 24)):
        cfg = model_config(
            io="entropy",
            entropy_model="x.pt",
            entropy_threshold=2.0,
            entropy_bounded=False,
            patch_boundaries=boundaries,
        )
        assert scheme_spec(cfg).symbols_per_patch(cfg) == width
        assert build_model(cfg, spec).io.S == width == ByteSymbols(cfg).max_patch_size


def test_zero_shot_pairs_of_given_boundaries_are_cut_as_training_cuts():
    """Given boundaries (BLT's setup): patches of bytes only, as the model trained on; they were cut 7 wide with
    an EOP closing each patch (scored with the continuation) that training never showed the model."""
    from hbpe.training.inference.zero_shot.pairs import byte_patch_pair

    enc = byte_patch_pair(model_config(io="space", patch_boundaries="given"))("Question: a b", " yes no")
    patches = enc.inputs["patches"]
    assert patches.shape[1] == 6 and not (patches == EOP).any()
    assert int(enc.scored.sum()) == len(" yes no")  # the continuation's bytes, nothing else
