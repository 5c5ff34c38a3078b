import itertools

from hbpe.pipeline.tokenizer.pair_merges import learn_merges, merge_pair
from hbpe.pipeline.tokenizer.second_stage import kernels
from hbpe.pipeline.tokenizer.second_stage.apply import apply_merges
from hbpe.schemas.symbols import EOP

T_, H_, I_, S_ = ord("t"), ord("h"), ord("i"), ord("s")


def raw(word: str) -> list[int]:
    return [*word.encode(), EOP]


def test_merge_pair_minbpe_example():
    assert merge_pair([1, 2, 3, 1, 2], (1, 2), 4) == [4, 3, 4]
    assert merge_pair([1, 1, 1], (1, 1), 9) == [9, 1]  # left to right, non-overlapping


# The paper's worked example in miniature: "is" is the most frequent pair.
#   active at S=3: this, isis, hiss, his   ("is" has 3 symbols and never takes part)
#   counts: (i,s)=5 (s,EOP)=4 (h,i)=3 ...  -> merge 1: (i,s) -> 259
#   this=[t,h,259,EOP] hiss=[h,259,s,EOP] stay; isis=[259,259,EOP], his=[h,259,EOP] drop
#   counts: (h,259)=2, the rest 1          -> merge 2: (h,259) -> 260; all drop
WORDS = ["this", "is", "isis", "hiss", "his"]


def test_hand_example_merges_symbol_by_symbol():
    for native in (True, False):
        merges = kernels.train_merges([raw(w) for w in WORDS], 3, native=native)
        assert merges == [(I_, S_), (H_, 259)]


def test_hand_example_minimal_and_full_forms():
    merges = [(I_, S_), (H_, 259)]
    ranks = {p: k for k, p in enumerate(merges)}
    minimal = {w: apply_merges(raw(w), ranks, max_patch_size=3, mode="minimal") for w in WORDS}
    full = {w: apply_merges(raw(w), ranks, max_patch_size=3, mode="full") for w in WORDS}
    assert minimal == {
        "this": [T_, 260, EOP],
        "is": [I_, S_, EOP],
        "isis": [259, 259, EOP],
        "hiss": [260, S_, EOP],
        "his": [H_, 259, EOP],
    }
    assert full == {
        "this": [T_, 260, EOP],
        "is": [259, EOP],
        "isis": [259, 259, EOP],
        "hiss": [260, S_, EOP],
        "his": [260, EOP],
    }
    for native in (True, False):
        seqs = [raw(w) for w in WORDS]
        assert kernels.apply_merges_many(seqs, merges, max_patch_size=3, mode="minimal", native=native) == list(
            minimal.values()
        )
        assert kernels.apply_merges_many(seqs, merges, max_patch_size=3, mode="full", native=native) == list(
            full.values()
        )


def test_ties_go_to_the_smallest_pair():
    entries = [[ord("c"), ord("d"), EOP], [ord("a"), ord("b"), EOP]]
    for native in (True, False):
        assert kernels.train_merges(entries, 2, native=native) == [(ord("a"), ord("b")), (ord("c"), ord("d"))]


def test_weighted_learning_respects_weights_and_min_count():
    seqs = [[1, 2], [3, 4]]
    counter = itertools.count(10)
    learned = learn_merges(seqs, [1, 5], next_id=lambda p: next(counter), is_active=lambda s: len(s) > 1, min_count=2)
    assert learned == [((3, 4), 10)]  # (1, 2) occurs once, below min_count
