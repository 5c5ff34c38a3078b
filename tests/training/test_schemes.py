"""The baselines over the same shards: segmentation rules, the shared BPB denominator, exact BPB
of a uniform model through every scheme, and real training of each scheme."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hbpe.pipeline.shards.reader import ShardDir
from hbpe.schemas.errors import ConfigError
from hbpe.schemas.schemes import BUILTIN_SCHEMES
from hbpe.schemas.symbols import EOD, EOP, PAD
from hbpe.schemas.train_config import model_config
from hbpe.training.data.byte_patching import (
    UNBOUNDED_SAFETY_LIMIT,
    VocabularyBytes,
    patch_starts,
    sample_units,
    space_starts,
    to_patches,
)
from hbpe.training.data.schemes import BytePatchScheme, build_scheme, vocabulary_bytes
from hbpe.training.model.build import build_model
from hbpe.training.model.patch_io import IGNORE, cross_entropy_sum
from hbpe.training.model.patch_lm import VocabSpec
from hbpe.training.train.calibration import choose_threshold, mean_patch_bytes


def _units(text: bytes) -> np.ndarray:
    return np.frombuffer(text, dtype=np.uint8).astype(np.int32)


def _patch_bytes(p: np.ndarray) -> list[bytes]:
    return [bytes(int(s) for s in row if s < 256) for row in p if row[0] != EOD]


def test_space_patching_follows_the_rule():
    text = "Hello,  world: naïve 日本 1234567890abc".encode()
    u = _units(text)
    starts = patch_starts(u, 1, space_starts(u), 6)
    p = to_patches(u, 1, starts, 7)
    pieces = _patch_bytes(p.patches)
    assert b"".join(pieces) == text  # lossless
    assert max(len(x) for x in pieces) <= 6
    # a new patch starts after the first delimiter of a run: ", " -> "Hello," | " " ...
    assert pieces[:4] == [b"H", b"ello,", b"  worl", b"d:"]
    # a UTF-8 lead byte is a delimiter, a continuation byte is not: "ï" = c3 af splits after c3
    assert pieces[4:6] == [b" na\xc3", b"\xafve "]
    # a run of 13 alphanumerics is split into 6 + 6 + 1
    assert pieces[-3:] == [b"123456", b"7890ab", b"c"]


def test_markers_and_context_are_patch_boundaries():
    vb = VocabularyBytes.from_token_bytes([b"ab", b" cd", b"e"])
    s = sample_units(np.array([1, 0, -1, 2, 1, -2, -2]), vb)
    assert s.units.tolist() == [32, 99, 100, 97, 98, EOD, 101, 32, 99, 100] and s.context == 3
    p = to_patches(s.units, s.context, patch_starts(s.units, s.context, space_starts(s.units), 6), 7)
    rows = p.patches.tolist()
    # the first token " cd" is context only, cut by the rule itself: " " | "cd"
    assert rows[0][:2] == [32, EOP] and rows[1][:3] == [99, 100, EOP] and p.context == 2
    assert rows[2][:3] == [97, 98, EOP]  # "ab" starts at the end of the context even without a delimiter
    assert rows[3][:2] == [EOD, PAD]  # a marker is a patch of its own, without EOP
    assert rows[4][:3] == [101, 32, EOP] and rows[5][:3] == [99, 100, EOP]
    assert p.text_bytes == 2 + 1 + 3  # "ab", "e", " cd": tokens 2..N


@pytest.fixture(scope="module")
def shard_rows(sample_shards):
    d = ShardDir(sample_shards[0])
    rows = [np.asarray(s["tokens"], dtype=np.int32) for _, s in zip(range(16), d.samples())]
    return d.tokenizer, np.stack(rows)


class _FixedEntropy:
    """Entropies from a deterministic function of the bytes (the real model is tested in training below)."""

    def entropies(self, units):
        return [((u * 7919) % 97 / 20.0).astype(np.float32) for u in units]


def _schemes(tok):
    vocab = vocabulary_bytes(tok)
    return {
        "hierarchical": build_scheme(model_config(io="hierarchical"), tok, derive=True),
        "bpe": build_scheme(model_config(io="bpe"), tok, derive=True),
        "bytes": build_scheme(model_config(io="bytes"), tok, derive=True),
        "space": build_scheme(model_config(io="space"), tok, derive=True),
        "entropy": BytePatchScheme(vocab, 6, _FixedEntropy(), 2.5, width=7),
        "entropy-unbounded": BytePatchScheme(vocab, None, _FixedEntropy(), 4.0, width=UNBOUNDED_SAFETY_LIMIT + 1),
    }


def test_every_scheme_predicts_the_same_bytes_and_loses_none(shard_rows):
    tok, tokens = shard_rows
    expected = np.take(tok.token_nbytes, tokens[:, 1:], axis=0).sum(axis=1)
    vocab = vocabulary_bytes(tok)
    for name, scheme in _schemes(tok).items():
        b = scheme.batch(tokens, None)
        assert b["target_bytes"].tolist() == expected.tolist(), name
        if name.startswith(("space", "entropy")):
            for row, patches, first in zip(tokens, b["patches"], b["first_target"], strict=True):
                s = sample_units(row, vocab)
                text = s.units[s.units != EOD].astype(np.uint8).tobytes()
                assert b"".join(_patch_bytes(patches)) == text, name  # the patches hold exactly the sample
                assert b"".join(_patch_bytes(patches[first:])) == text[s.context :], name
    unbounded = _schemes(tok)["entropy-unbounded"].batch(tokens, None)["patches"]
    assert unbounded.shape[2] > 7  # longer than the bounded variant's 6 bytes + EOP


@pytest.mark.parametrize("io", BUILTIN_SCHEMES)
def test_uniform_model_bpb_is_exact_through_every_scheme(shard_rows, io):
    """Zero output weights: every symbol costs ln V, so BPB = symbols * log2 V / the shared bytes."""
    tok, tokens = shard_rows
    schemes = _schemes(tok)
    scheme = schemes[io] if io != "entropy" else schemes["entropy"]
    cfg = model_config("tiny", io=io, entropy_model="x.pt", entropy_threshold=2.5)
    torch.manual_seed(0)
    model = build_model(cfg, VocabSpec.from_tokenizer(tok))
    head = model.io.decoder.head if hasattr(model.io, "decoder") else model.io.head
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(30.0)  # large weights everywhere: the states are far from uniform ...
        head.weight.zero_()  # ... but the head maps every state to equal logits
        if getattr(head, "bias", None) is not None:
            head.bias.zero_()
    batch = {k: torch.from_numpy(np.asarray(v).astype(np.int64)) for k, v in scheme.batch(tokens, None).items()}
    logits, targets = model(batch)
    n = int((targets != IGNORE).sum())
    V = model.io.vocab_size
    bpb = float(cross_entropy_sum(logits, targets)) / math.log(2) / int(batch["target_bytes"].sum())
    assert bpb == pytest.approx(n * math.log2(V) / int(batch["target_bytes"].sum()), rel=1e-6)
    # the symbols counted: every predicted text symbol (EOP included) and marker, nothing of the context
    if io == "bytes":
        assert n == int(batch["target_bytes"].sum()) + int((tokens[:, 1:] == -1).sum())
    if io == "bpe":
        assert n == int((tokens[:, 1:] != -2).sum())


def test_entropy_threshold_reaches_the_target_mean_patch_length(shard_rows):
    tok, tokens = shard_rows
    vocab = vocabulary_bytes(tok)
    samples = [sample_units(r, vocab) for r in tokens]
    units, contexts = [s.units for s in samples], [s.context for s in samples]
    ents = _FixedEntropy().entropies(units)
    for target in (2.0, 3.5, 5.0):
        theta = choose_threshold(units, contexts, ents, target_bytes=target, max_bytes=6)
        assert mean_patch_bytes(units, contexts, ents, theta, 6) == pytest.approx(target, rel=0.15)
    with pytest.raises(ConfigError, match="longest mean patch"):
        choose_threshold(units, contexts, ents, target_bytes=7.0, max_bytes=6)


def test_entropy_needs_its_model_and_a_threshold():
    with pytest.raises(ConfigError, match="model.patching.entropy_model"):
        model_config(io="entropy", entropy_target_bytes=4.0)
    with pytest.raises(ConfigError, match="entropy_target_bytes"):
        model_config(io="entropy", entropy_model="x.pt")
    with pytest.raises(ConfigError, match="model.io"):
        model_config(io="chars")


def test_every_scheme_trains_from_the_same_shards(sample_shards, tmp_path):
    """bytes first (it is the entropy model), then space and entropy: each learns in 12 real Composer batches of 4
    (BPB / uniform measured 0.70, 0.73, 0.74; 0.70, 0.73, 0.74 at batches of 8)."""
    import json

    from hbpe.training.train.config_io import load_config
    from hbpe.training.train.trainer import train

    train_dir, eval_dir = sample_shards
    base = [f"data.train={train_dir}", f"data.eval={eval_dir}", "console=false", "max_duration=12ba"]
    base += ["global_batch_size=4", "eval_interval=12ba"]
    base += ["save_interval=12ba", "optim.warmup=2ba", "eval_subset_num_batches=2"]
    results = {}
    for io, extra in (
        ("bytes", []),
        ("space", []),
        (
            "entropy",
            [
                f"model.patching.entropy_model={tmp_path / 'bytes' / 'latest-rank0.pt'}",
                "model.patching.entropy_target_bytes=3",
            ],
        ),
    ):
        out = train(load_config("tiny", [*base, f"save_folder={tmp_path / io}", f"model.io={io}", *extra]))
        results[io] = out["eval"]["BitsPerByte"]
    meta = json.loads((tmp_path / "entropy" / "hbpe_run.json").read_text())
    assert meta["model"]["patching"]["entropy_threshold"] > 0  # chosen on the shards and recorded for eval

    from hbpe.training.checkpoint.load import load_model
    from hbpe.training.inference.evaluate import evaluate
    from hbpe.training.inference.generate import generate

    for io in results:
        # `hbpe eval` cuts the same patches (the recorded threshold) and scores the same samples as training did
        again = evaluate(str(tmp_path / io), str(eval_dir), batch_size=4, max_batches=2)
        assert again["bpb"] == pytest.approx(results[io], rel=1e-5), io
        model, tok, _ = load_model(str(tmp_path / io))
        uniform = math.log2(model.io.vocab_size) * again["symbols"] / again["bytes"]  # a uniform guess, in BPB
        assert 0 < again["bpb"] < 0.95 * uniform, (io, again["bpb"], uniform)  # 12 batches learn something
        # the byte schemes generate, with KV caches exactly as without
        fast = generate(model, tok, "The Union", max_bytes=40, use_cache=True)
        slow = generate(model, tok, "The Union", max_bytes=40, use_cache=False)
        assert fast.text == slow.text and fast.new_bytes > 0, io


def test_flops_table_measures_every_scheme_on_the_shards(sample_shards, gpt2_tokenizer):
    from hbpe.training.inference.scheme_stats import flops_table, render_table1
    from hbpe.training.model.flops import paper_forward_flops

    rows = {r["io"]: r for r in flops_table(model_config("small"), gpt2_tokenizer, str(sample_shards[0]), samples=32)}
    assert set(rows) == {"hierarchical", "bpe", "bytes", "space"}  # entropy rows need an entropy model
    h, bpe, by, sp = rows["hierarchical"], rows["bpe"], rows["bytes"], rows["space"]
    assert h["bytes"] == bpe["bytes"] == by["bytes"] == sp["bytes"]  # one text, one denominator
    assert h["positions"] == bpe["positions"] and h["fertility"] == bpe["fertility"]  # a patch per token
    assert by["bytes_per_patch"] == 1.0 and by["fertility"] == pytest.approx(by["bytes"] / by["words"])
    assert 1.0 < sp["bytes_per_patch"] <= 6.0 and sp["symbols_per_patch"] == pytest.approx(sp["bytes_per_patch"] + 1)
    assert by["params"]["total"] / 1e6 == pytest.approx(85, rel=0.01)  # the paper's byte-level model: 85M
    expect = paper_forward_flops(
        model_config("small", io="bpe"), input_bytes=8192, bytes_per_patch=bpe["bytes_per_patch"],
        symbols_per_patch=1.0, vocab_size=gpt2_tokenizer.encoding.max_token_value + 3,
    )["total"]  # fmt: skip
    assert bpe["gflops"]["total"] == pytest.approx(expect / 1e9)
    assert by["gflops"]["total"] > 5 * bpe["gflops"]["total"]  # a latent position per byte
    assert "| BPE-patch |" in render_table1(list(rows.values()))
