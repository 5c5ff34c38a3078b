import os
import subprocess
import sys

import numpy as np
import pytest
import tiktoken

from hbpe.pipeline.tokenizer import artifact
from hbpe.pipeline.tokenizer.first_stage import vocabulary_tokens
from hbpe.pipeline.tokenizer.second_stage import kernels
from hbpe.pipeline.tokenizer.second_stage.apply import apply_merges, patch_of


@pytest.fixture(scope="module")
def gpt2_entries():
    enc = tiktoken.get_encoding("gpt2")
    return [patch_of(tok) for _, tok in vocabulary_tokens(enc)]


@pytest.mark.parametrize("S", [6, 10])
def test_native_kernel_equals_python_reference(gpt2_entries, S):
    native = kernels.train_merges(gpt2_entries, S)
    reference = kernels.train_merges(gpt2_entries, S, native=False)
    assert native == reference
    assert len(native) > 100
    for mode in ("full", "minimal"):
        fast = kernels.apply_merges_many(gpt2_entries, native, max_patch_size=S, mode=mode)
        slow = kernels.apply_merges_many(gpt2_entries, native, max_patch_size=S, mode=mode, native=False)
        assert fast == slow


@pytest.mark.parametrize("mode", ["full", "minimal"])
def test_every_vocabulary_patch_fits_and_matches_single_application(gpt2_tokenizer, mode):
    tok = artifact.train_tokenizer(gpt2_tokenizer.encoding, max_patch_size=8, mode=mode)
    before, after = tok.vocabulary_patch_lengths()
    assert after.max() <= 8 and before.max() > 8
    ranks = {p: k for k, p in enumerate(tok.merges)}
    rng = np.random.default_rng(0)
    for tid in rng.choice(50000, size=300, replace=False):
        tok_bytes = tok.encoding.decode_single_token_bytes(int(tid))
        expect = apply_merges(patch_of(tok_bytes), ranks, max_patch_size=8, mode=mode)
        row = tok.table[tid]
        assert row[: len(expect)].tolist() == expect
        assert (row[len(expect) :] == 257).all()


def test_minimal_forms_are_the_training_loop_forms(gpt2_entries):
    # Replaying minimal mode must give exactly what training left in each entry.
    from hbpe.pipeline.tokenizer.pair_merges import learn_merges

    seqs = [list(e) for e in gpt2_entries]
    counter = iter(range(259, 10**6))
    learned = learn_merges(seqs, [1] * len(seqs), next_id=lambda p: next(counter), is_active=lambda s: len(s) > 6)
    merges = [p for p, _ in learned]
    replayed = kernels.apply_merges_many(gpt2_entries, merges, max_patch_size=6, mode="minimal")
    assert replayed == seqs


def test_full_mode_is_never_longer_than_minimal(gpt2_tokenizer):
    full = gpt2_tokenizer
    minimal = artifact.train_tokenizer(full.encoding, max_patch_size=10, mode="minimal")
    assert (full.patch_lengths <= minimal.patch_lengths).all()
    assert full.merges == minimal.merges  # training does not depend on the mode


def test_training_is_deterministic_across_hash_seeds(tmp_path):
    code = (
        "from hbpe.pipeline.tokenizer import artifact; t = artifact.train_tokenizer('gpt2', max_patch_size=8); "
        "print(t.fingerprint)"
    )
    outs = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        outs.add(r.stdout.strip())
    assert len(outs) == 1


def test_rejects_patch_size_below_two():
    from hbpe.schemas.errors import ArtifactError, ConfigError

    with pytest.raises(ConfigError, match="must be >= 2"):
        kernels.train_merges([[1, 2, 256]], 1)
    with pytest.raises(ArtifactError, match="max_patch_size must be >= 2"):
        from hbpe.schemas.tokenizer_artifact import SecondStageSpec

        SecondStageSpec(max_patch_size=1, mode="full", merges=())
