import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hbpe.schemas.errors import ConfigError
from hbpe.schemas.symbols import EOD, EOP, PAD, TOKEN_EOD, TOKEN_PAD

TRICKY = [
    "",
    "Hello, world!",
    "国家的发展，需要我们共同努力。",
    "emoji 🎉👩‍👩‍👧 and flags 🇺🇸",
    "combining: e\u0301 a\u0308 \u0915\u094d\u0937",
    "control \x00\x01\x1b[31m\r\n\t",
    "x" * 5000,
    "<|endoftext|> is plain text here",
    "\ufeffBOM and \u200b zero width",
]


def test_tricky_texts_round_trip(gpt2_tokenizer):
    for text in TRICKY:
        tokens, patches = gpt2_tokenizer.encode_patches(text)
        assert patches.shape == (len(tokens), 10)
        assert gpt2_tokenizer.decode_patches(patches) == text
        assert gpt2_tokenizer.decode_tokens(tokens) == text


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=300))
def test_decode_encode_round_trip(gpt2_tokenizer, text):
    tokens, patches = gpt2_tokenizer.encode_patches(text)
    assert gpt2_tokenizer.decode_symbols(patches.reshape(-1), errors="strict") == text
    # every patch ends with EOP (or is a merged symbol that swallowed it), PAD only after it
    lengths = gpt2_tokenizer.patch_lengths[tokens.astype(np.int64)]
    assert (lengths >= 1).all() and (lengths <= 10).all()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=80))
def test_out_of_vocabulary_bytes_split_into_fitting_patches(gpt2_tokenizer, data):
    patches = gpt2_tokenizer.encode_bytes(data)
    assert all(1 <= len(p) <= gpt2_tokenizer.max_patch_size for p in patches)
    assert gpt2_tokenizer.decode_symbols_bytes(s for p in patches for s in p) == data


def test_long_run_without_spaces_splits(gpt2_tokenizer):
    word = "antidisestablishmentarianism" * 3
    patches = gpt2_tokenizer.encode_bytes(word.encode())
    assert len(patches) > 1
    assert all(len(p) <= 10 for p in patches)
    assert all(p[-1] == EOP or p[-1] >= 259 for p in patches)


def test_marker_tokens_gather_marker_patches(gpt2_tokenizer):
    rows = gpt2_tokenizer.patches(np.array([TOKEN_EOD, TOKEN_PAD], dtype=np.int32))
    assert rows[0].tolist() == [EOD] + [PAD] * 9
    assert rows[1].tolist() == [PAD] * 10


@pytest.mark.parametrize(
    "tokens, message",
    [
        ([464, 2**40], r"token id 1099511627776 is out of range"),  # before: OverflowError (int32)
        ([464, 2**70], r"token id 1180591620717411303424 is out of range"),  # before: OverflowError
        (np.array([2**33], dtype=np.int64), r"token id 8589934592 is out of range"),  # before: row 0, silently
        ([50257], r"token id 50257 is out of range"),  # before: IndexError
        ([TOKEN_PAD - 1], r"token id -3 is out of range"),  # before: the row of token 50256, silently
        ([1.5], r"token 1\.5 \(float\) is not an integer id"),  # before: token 1, silently
        ([True], r"token True \(bool\) is not an integer id"),
    ],
)
def test_patches_of_an_id_the_tokenizer_has_no_row_for_is_a_clear_error(gpt2_tokenizer, tokens, message):
    """(issue 35) ids are the first stage's 0..50256, or the markers TOKEN_EOD and TOKEN_PAD."""
    tail = (
        r"; encode text with tok\.encode$"
        if "range" in message
        else r": pass first-stage ids, e\.g\. tok\.patches\(tok\.encode\('Hello world'\)\)$"
    )
    ranges = r" for this tokenizer: ids are 0\.\.50256 \(its first stage's\), or -1 \(EOD\) and -2 \(PAD\)"
    with pytest.raises(ConfigError, match="^" + message + (ranges if "range" in message else "") + tail):
        gpt2_tokenizer.patches(tokens)
    assert gpt2_tokenizer.patches([]).shape == (0, 10)
    assert gpt2_tokenizer.patches([[464, TOKEN_EOD], [TOKEN_PAD, 50256]]).shape == (2, 2, 10)


def test_split_documents_at_eod(gpt2_tokenizer):
    a, b = gpt2_tokenizer.encode("first doc"), gpt2_tokenizer.encode("second")
    stream = np.concatenate([a, [TOKEN_EOD], b, [TOKEN_EOD]]).astype(np.int32)
    p = gpt2_tokenizer.patches(stream)
    docs = gpt2_tokenizer.split_documents(p[p != PAD])
    assert docs == [b"first doc", b"second"]


def test_nbytes_counts_text_bytes_only(gpt2_tokenizer):
    text = "naïve café"
    tokens = np.concatenate([gpt2_tokenizer.encode(text), [TOKEN_EOD, TOKEN_PAD]]).astype(np.int32)
    assert gpt2_tokenizer.nbytes(tokens) == len(text.encode())


def test_encode_matches_encode_ordinary(gpt2_tokenizer, sample_texts):
    for text in [*TRICKY, sample_texts[0][:5000]]:
        assert gpt2_tokenizer.encode(text).tolist() == gpt2_tokenizer.encoding.encode_ordinary(text)
