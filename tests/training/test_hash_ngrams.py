"""BLT's hash n-gram embeddings in the byte baselines' local encoder: deterministic, read back across
patches, counted in the parameters, and a short run with them (and given boundaries) learns and generates."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hbpe.schemas.symbols import EOD, EOP, PAD
from hbpe.schemas.train_config import model_config
from hbpe.training.model.build import build_model
from hbpe.training.model.hash_ngrams import NGRAM_SIZES, HashNgramEmbedding, ngram_ids, ngram_parameters
from hbpe.training.model.patch_lm import VocabSpec, parameter_counts

SPEC = VocabSpec(470, 10, 1000)


def _patches(*pieces: bytes, width: int = 7) -> torch.Tensor:
    rows = [[*p, EOP] + [PAD] * (width - len(p) - 1) for p in pieces]
    return torch.tensor([rows])  # (1, T, width)


def test_ngram_ids_hash_the_bytes_ending_at_each_position_across_patches():
    ids, real = ngram_ids(_patches(b"the ", b"cat"), 1 << 20)
    again, _ = ngram_ids(_patches(b"the ", b"cat"), 1 << 20)
    assert torch.equal(ids, again)  # deterministic
    # the same byte stream cut into other patches: the same rows at the same bytes
    other, other_real = ngram_ids(_patches(b"th", b"e c", b"at"), 1 << 20)
    assert torch.equal(ids[real], other[other_real])
    # "cat" after "the " and "cat" at the start of the sequence: at "c" every n reaches back and differs; at
    # "t" the 3-gram is "cat" in both, the longer ones reach back
    alone, _ = ngram_ids(_patches(b"cat"), 1 << 20)
    assert (ids[0, 1, 0] != alone[0, 0, 0]).all()
    assert ids[0, 1, 2, 0] == alone[0, 0, 2, 0] and (ids[0, 1, 2, 1:] != alone[0, 0, 2, 1:]).all()
    # a shared suffix of n bytes gives the same row for that n: "e cat" and "a cat" share n <= 4
    a, ra = ngram_ids(_patches(b"e cat"), 1 << 20)
    b, rb = ngram_ids(_patches(b"a cat"), 1 << 20)
    last_a, last_b = a[ra][-1], b[rb][-1]
    assert last_a[0] == last_b[0] and last_a[1] == last_b[1]  # n = 3, 4: "cat", " cat"
    assert (last_a[2:] != last_b[2:]).all()  # n >= 5 reach the differing byte (or before the start)
    assert ids.max() < 1 << 20 and ids.min() >= 0 and len(NGRAM_SIZES) == 6


# the hash's constants, pinned: a trained checkpoint's tables are indexed by them (nothing is stored in the shards)
BASE, MOD = 1_000_003, 2**31 - 1


def _reference_ids(patches: list[list[list[int]]], buckets: int) -> list[list[list[list[int] | None]]]:
    """ngram_ids by brute force, position by position: the units of the sequence (PAD and EOP skipped) in
    order, each as its value + 1 and 0 before the start; the n-gram ending at a unit, g_1 .. g_n read left to
    right, hashes to sum_k g_k * BASE^(k-1) mod MOD (exact Python integers), its row that mod buckets.
    None at PAD and EOP."""
    out, stream = [], []
    for row in patches:
        out.append([])
        for patch in row:
            out[-1].append([])
            for symbol in patch:
                if symbol in (PAD, EOP):
                    out[-1][-1].append(None)
                    continue
                stream.append(symbol + 1)
                grams = [([0] * n + stream)[-n:] for n in NGRAM_SIZES]
                out[-1][-1].append([sum(g * BASE**k for k, g in enumerate(gram)) % MOD % buckets for gram in grams])
        stream.clear()  # the next sequence of the batch starts afresh
    return out


@st.composite
def _batches(draw) -> list[list[list[int]]]:
    """(B, T, S) symbols of any layout (PAD and EOP anywhere, EOD, bytes 0 and 255), few values so n-grams repeat."""
    B, T, S = draw(st.integers(1, 3)), draw(st.integers(1, 5)), draw(st.integers(1, 9))
    symbol = st.sampled_from([0, 1, 97, 98, 255, EOP, PAD, EOD])
    return draw(
        st.lists(st.lists(st.lists(symbol, min_size=S, max_size=S), min_size=T, max_size=T), min_size=B, max_size=B)
    )


@settings(max_examples=200, deadline=None)
@given(_batches(), st.sampled_from([1, 2, 97, 1 << 20, MOD + 12]))  # MOD + 12: the hash itself, unreduced
def test_ngram_ids_equal_a_brute_force_hash_of_the_byte_stream(patches, buckets):
    ids, real = ngram_ids(torch.tensor(patches), buckets)
    want = _reference_ids(patches, buckets)
    got = ids.tolist()
    for b, row in enumerate(want):
        for t, patch in enumerate(row):
            for s, rows in enumerate(patch):
                assert bool(real[b, t, s]) == (rows is not None)
                if rows is not None:
                    assert got[b][t][s] == rows, (b, t, s)


def test_the_embedding_is_exactly_zero_at_pad_and_eop():
    torch.manual_seed(0)
    emb = HashNgramEmbedding(97, 8)  # N(0, 1) tables: no row is zero
    patches = _patches(b"the ", b"cat", b"", width=6)  # an empty patch: EOP first
    out = emb(patches)
    ids, real = ngram_ids(patches, 97)
    assert (~real).sum() > 4 and torch.equal(out[~real], torch.zeros_like(out[~real]))
    # at the bytes: the sum of each n's row
    want = sum(table.weight[ids[..., j]] for j, table in enumerate(emb.tables))
    torch.testing.assert_close(out[real], want[real], rtol=0, atol=0)


@pytest.mark.parametrize("buckets", [97, 5000])
def test_parameters_are_counted_by_the_formula(buckets):
    base = parameter_counts(build_model(model_config("tiny", io="space", patch_boundaries="given"), SPEC))
    cfg = model_config("tiny", io="space", patch_boundaries="given", hash_ngram_buckets=buckets)
    with_hash = parameter_counts(build_model(cfg, SPEC))
    assert with_hash["total"] - base["total"] == ngram_parameters(buckets, cfg.local_dim) == 6 * buckets * 64
    assert with_hash["io"] - base["io"] == 6 * buckets * 64
    # only the byte baselines carry them: the paper's model is unchanged by the option
    h = model_config("tiny", io="hierarchical", hash_ngram_buckets=buckets)
    assert parameter_counts(build_model(h, SPEC)) == parameter_counts(build_model(model_config("tiny"), SPEC))


@pytest.mark.parametrize("size,paper_m", [("small", 351), ("medium", 575)])
def test_paper_setup_parameters_match_the_papers_byte_baselines(size, paper_m):
    from hbpe.experiments.presets import PAPER_HASH_BUCKETS

    cfg = model_config(size, io="space", patch_boundaries="given", hash_ngram_buckets=PAPER_HASH_BUCKETS)
    with torch.device("meta"):
        total = parameter_counts(build_model(cfg, VocabSpec(470, 10, 50257)))["total"]
    assert total / 1e6 == pytest.approx(paper_m, rel=0.005)


def test_hash_embeddings_change_the_encoders_output():
    torch.manual_seed(0)
    cfg = model_config("tiny", io="space", patch_boundaries="given", hash_ngram_buckets=101)
    model = build_model(cfg, SPEC)
    patches = _patches(b"the ", b"cat", b" sat", width=6)
    batch = {"patches": patches, "first_target": torch.tensor([1])}
    logits, _ = model(batch)
    again, _ = model(batch)
    assert torch.equal(logits, again)
    with torch.no_grad():
        for t in model.io.encoder.hash_ngrams.tables:
            t.weight.zero_()
    without, _ = model(batch)
    assert (logits - without).abs().max() > 1e-3  # the tables reach the logits


def test_short_run_with_given_boundaries_and_hash_ngrams_learns_and_generates(sample_shards, tmp_path):
    from hbpe.training import load_model
    from hbpe.training.inference.evaluate import evaluate
    from hbpe.training.inference.generate import generate
    from hbpe.training.train.config_io import load_config
    from hbpe.training.train.trainer import train

    train_dir, eval_dir = sample_shards
    args = [f"data.train={train_dir}", f"data.eval={eval_dir}", "console=false", "max_duration=12ba"]
    args += ["global_batch_size=4"]
    args += ["eval_interval=12ba", "save_interval=12ba", "optim.warmup=2ba", "eval_subset_num_batches=2"]
    args += [f"save_folder={tmp_path / 'run'}", "model.io=space", "model.patching.boundaries=given"]
    train(load_config("tiny", [*args, "model.patching.hash_ngram_buckets=512"]))
    model, tok, _ = load_model(str(tmp_path / "run"))
    assert (
        model.cfg.patching.boundaries == "given" and model.cfg.patching.hash_ngram_buckets == 512
    )  # recorded in the run
    again = evaluate(str(tmp_path / "run"), str(eval_dir), batch_size=4, max_batches=2)
    uniform = math.log2(model.io.vocab_size) * again["symbols"] / again["bytes"]
    assert 0 < again["bpb"] < 0.95 * uniform, (again["bpb"], uniform)  # 0.74 measured (0.74 at batches of 8)
    g = generate(model, tok, "The Union", max_bytes=40, temperature=1.0, seed=1)  # uncached: hash tables
    assert g.new_bytes > 0 and g.patches > 0
