"""The two first-stage trainers (in-house `hbpe`, HF `tokenizers`) learn the same ranks, and either's file works in tiktoken."""

import json
from collections import Counter

import pytest
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.pipeline.tokenizer import first_stage
from hbpe.pipeline.tokenizer.bench import bench_first_stage, compare_ranks
from hbpe.pipeline.tokenizer.first_stage_train import (
    count_pretokens,
    train_first_stage,
    train_ranks,
    train_ranks_hf,
    write_encoding,
)
from hbpe.pipeline.tokenizer.stats import read_texts
from hbpe.schemas.errors import ConfigError
from tests.conftest import SAMPLE_EN, SAMPLE_ZH


@pytest.fixture(scope="module")
def zh_texts():
    texts, _ = read_texts([str(SAMPLE_ZH)])
    return texts


@pytest.mark.parametrize(("corpus", "pattern", "vocab_size"), [("en", "cl100k_base", 1500), ("zh", "gpt2", 1200)])
def test_hf_learns_the_in_house_ranks(corpus, pattern, vocab_size, sample_texts, zh_texts):
    """Byte-identical rank files: same merges, same ties, same reuse of a token rebuilt from another pair."""
    words = count_pretokens(sample_texts if corpus == "en" else zh_texts, pattern)
    ours = train_ranks(words, vocab_size)
    theirs = train_ranks_hf(words, vocab_size)
    assert len(ours) == vocab_size
    assert first_stage.format_rank_file(theirs) == first_stage.format_rank_file(ours)


def test_both_stop_at_the_same_min_count(sample_texts):
    words = count_pretokens(sample_texts[:2], "cl100k_base")
    ours, theirs = train_ranks(words, 50_000, min_count=3), train_ranks_hf(words, 50_000, min_count=3)
    assert 256 < len(ours) < 50_000  # stopped by min_count, not the size
    assert theirs == ours


@pytest.mark.parametrize("trainer", ["hbpe", "hf"])
def test_rank_file_loads_in_tiktoken_and_round_trips(trainer, tmp_path, sample_texts, zh_texts):
    words = count_pretokens(sample_texts[:12] + zh_texts[:20], "cl100k_base")
    ranks = train_first_stage(words, 2000, trainer=trainer)
    enc = first_stage.load_encoding(str(write_encoding(ranks, tmp_path / f"{trainer}.tiktoken", pattern="cl100k_base")))
    assert enc.n_vocab == 2001  # the ranks plus <|endoftext|>
    held_out = [sample_texts[20][:3000], zh_texts[-1][:1000], "emoji 🦀, tabs\t\tand\r\nCRLF, 1947年, <|endoftext|>"]
    for text in held_out:
        ids = enc.encode_ordinary(text)
        assert enc.decode(ids) == text
        assert b"".join(enc.decode_single_token_bytes(i) for i in ids) == text.encode("utf-8")
    assert len(enc.encode_ordinary(held_out[0])) < len(held_out[0].encode()) * 0.5  # it really compresses


def test_bench_compares_in_fresh_processes_and_finds_identical_ranks():
    """Each trainer twice, each run in its own process: deterministic across processes, identical files."""
    r = bench_first_stage([str(SAMPLE_ZH)], 900, repeat=2)
    assert r["deterministic"] == {"hbpe": True, "hf": True}
    assert r["rank_files_identical"] and r["ranks"]["identical"]
    assert r["ranks"]["agree"] == r["ranks"]["agree_prefix"] == r["ranks"]["compared"] == 900 - 256
    assert r["ranks"]["first_divergence"] is None
    assert all(len(r["seconds"][n]) == 2 and min(r["peak_rss_mb"][n]) > 10 for n in ("hbpe", "hf"))


def test_bench_command_json(tmp_path):
    r = CliRunner().invoke(
        main,
        ["bench", "first-stage", "--input", str(SAMPLE_EN), "--vocab-size", "700", "--repeat", "1", "--json"],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["rank_files_identical"] and out["ranks"]["learned"] == [444, 444]
    assert out["distinct_words"] == len(count_pretokens(read_texts([str(SAMPLE_EN)])[0], "cl100k_base"))


def test_divergence_is_explained_as_a_tie_or_not():
    words = Counter({b"ab": 5, b"cd": 5, b"ef": 3})
    ours = train_ranks(words, 259, min_count=1)
    assert sorted(ours, key=ours.get)[256:] == [b"ab", b"cd", b"ef"]  # the tie goes to the smaller pair
    swapped = {**ours, b"ab": 257, b"cd": 256}
    d = compare_ranks(words, ours, swapped, min_count=1)["first_divergence"]
    assert d["rank"] == 256 and d["tokens"] == ["ab", "cd"] and d["counts"] == [5, 5]
    assert d["reason"] == "tie at count 5: the trainers break it differently"
    later = {**ours, b"cd": 258, b"ef": 257}
    c = compare_ranks(words, ours, later, min_count=1)
    assert c["agree_prefix"] == 1 and c["agree"] == 1
    assert c["first_divergence"]["reason"] == "different counts (5 vs 3): not a tie-break difference"


def test_cli_trainers_write_the_same_file(tmp_path):
    files = []
    for trainer in ("hf", "hbpe"):
        out = tmp_path / f"{trainer}.tiktoken"
        args = ["tokenizer", "train-bpe", "--input", str(SAMPLE_ZH), "--vocab-size", "800", "--out", str(out)]
        r = CliRunner().invoke(main, [*args, "--first-stage-trainer", trainer])
        assert r.exit_code == 0, r.output
        assert f"trained a 800-token first stage ({trainer})" in r.output
        files.append(out.read_bytes())
    assert files[0] == files[1]


def test_hf_split_regex_is_not_tiktokens():
    """Why HF is fed our counts: Oniguruma reads cl100k's possessive `\\p{N}{1,3}+` as a repeated group."""
    from tokenizers import Regex, pre_tokenizers

    split = pre_tokenizers.Split(Regex(first_stage.resolve_pattern("cl100k_base")), "isolated")
    text = "in 1947 we"
    assert [p for p, _ in split.pre_tokenize_str(text)] == ["in", " ", "1947", " we"]
    assert list(count_pretokens([text], "cl100k_base")) == [b"in", b" ", b"194", b"7", b" we"]


def test_trainer_errors():
    words = Counter({b"ab": 3})
    with pytest.raises(ConfigError, match="unknown first-stage trainer 'sp'; use one of hbpe, hf"):
        train_first_stage(words, 300, trainer="sp")
    with pytest.raises(ConfigError, match="vocab_size must be >= 256"):
        train_ranks_hf(words, 100)
    with pytest.raises(ConfigError, match="past the i32 pair counts of HF's trainer; use --first-stage-trainer hbpe"):
        train_ranks_hf(Counter({b"abc": 2**30}), 300)
